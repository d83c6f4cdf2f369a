//! Helpers shared by the integration tests: small Parquet files written with
//! the parquet crate, and the location of the shared parquet-testing corpus.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{WriterProperties, WriterVersion};

/// Which rows of a generated column are null.
#[derive(Clone, Copy, PartialEq)]
pub enum Nulls {
    /// A required column.
    Required,
    /// A nullable column with some nulls.
    Some,
    /// A nullable column of nulls only.
    All,
}

impl Nulls {
    /// The suffix of the column names.
    pub fn tag(self) -> &'static str {
        match self {
            Nulls::Required => "req",
            Nulls::Some => "opt",
            Nulls::All => "null",
        }
    }
}

/// A deterministic pseudo-random sequence (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A four-column table (`id` INT64, `small` nullable INT32, `price` DOUBLE, `name` UTF8).
pub fn sample_batch(rows: usize, seed: u64) -> RecordBatch {
    let mut r = Rng::new(seed);
    let ids: Int64Array = (0..rows as i64).map(|i| i * 7 + seed as i64).collect();
    let small: Int32Array = (0..rows).map(|_| if r.below(10) == 0 { None } else { Some(r.below(1000) as i32) }).collect();
    let price: Float64Array = (0..rows).map(|_| r.below(1_000_000) as f64 / 100.0).collect();
    let name: StringArray = (0..rows).map(|i| Some(format!("name-{}-{}", i, "x".repeat(r.below(40) as usize)))).collect();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("small", DataType::Int32, true),
        Field::new("price", DataType::Float64, false),
        Field::new("name", DataType::Utf8, false),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(ids) as ArrayRef, Arc::new(small), Arc::new(price), Arc::new(name)],
    )
    .unwrap()
}

/// Writes `rows` rows of [`sample_batch`] to `path` in row groups of `rg_rows`.
pub fn write_sample(path: &Path, rows: usize, rg_rows: usize, compression: Compression) -> PathBuf {
    let batch = sample_batch(rows, 42);
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(rg_rows))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path.to_path_buf()
}

/// Writes `rows` rows of [`sample_batch`] (seed 9) to `path` in row groups
/// of `rg_rows` and data pages of at most `page_rows` rows, SNAPPY, in the
/// page format of `version` (with arrow-rs's offset index). Only `small` is
/// dictionary-encoded (the other columns' values are nearly all distinct,
/// so their dictionaries would be most of the file and their data pages
/// mere indexes).
pub fn write_paged_sample(path: &Path, rows: usize, rg_rows: usize, page_rows: usize, version: WriterVersion) -> PathBuf {
    let batch = sample_batch(rows, 9);
    let props = WriterProperties::builder()
        .set_writer_version(version)
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(parquet::schema::types::ColumnPath::from("small"), true)
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(rg_rows))
        .set_data_page_row_count_limit(page_rows)
        .set_write_batch_size(10)
        .build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path.to_path_buf()
}

/// The shared parquet-testing `data` folder, if present (override with GPQ_PARQUET_TESTING).
pub fn parquet_testing_dir() -> Option<PathBuf> {
    let candidates = [
        std::env::var("GPQ_PARQUET_TESTING").ok().map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/parquet-testing/data")),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shared/parquet-testing/data")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_dir());
    if found.is_none() {
        eprintln!("SKIPPED (parquet-testing corpus not found; set GPQ_PARQUET_TESTING)");
    }
    found
}

/// A committed file of `testdata/` (its README says how each was made):
/// under the crate root at build time, else the working directory;
/// `GPQ_TESTDATA` (set by the device script) overrides.
pub fn testdata(name: &str) -> PathBuf {
    let candidates = [
        std::env::var("GPQ_TESTDATA").ok().map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata")),
        Some(PathBuf::from("testdata")),
    ];
    let dir = candidates.into_iter().flatten().find(|p| p.join(name).is_file());
    dir.unwrap_or_else(|| panic!("testdata/{name} not found")).join(name)
}

/// Where the GPU tests of this process run.
pub enum Device {
    /// A CUDA device.
    Gpu(std::sync::Arc<gpq::cuda::GpuContext>),
    /// gpq's CPU emulator of the kernels (builds with the `emulator` feature).
    Emulator(std::sync::Arc<gpq::cuda::GpuContext>),
    /// Neither; the reason.
    Missing(String),
}

/// Finds the device GPU tests run on: a CUDA device, else the emulator where
/// it is compiled in, else none.
pub fn probe_device() -> Device {
    match gpq::cuda::GpuContext::get(0) {
        Ok(ctx) => Device::Gpu(ctx),
        Err(e) if gpq::cuda::emulator_compiled() => {
            gpq::cuda::use_emulator().expect("the emulator is compiled in");
            match gpq::cuda::GpuContext::get(0) {
                Ok(ctx) => {
                    eprintln!("NOTE: no GPU ({e}); GPU tests run on the CPU emulator");
                    Device::Emulator(ctx)
                }
                Err(e) => Device::Missing(e.to_string()),
            }
        }
        Err(e) => Device::Missing(e.to_string()),
    }
}

/// Whether `GPQ_REQUIRE_GPU=1` asks that GPU tests run on a real GPU.
pub fn gpu_required() -> bool {
    std::env::var("GPQ_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// A test that needs a device. Without one it is reported as ignored (with
/// `GPQ_REQUIRE_GPU=1` as failed, as it is when only the emulator is there).
pub fn gpu_trial(
    device: &Device,
    name: &str,
    test: fn(&std::sync::Arc<gpq::cuda::GpuContext>),
) -> libtest_mimic::Trial {
    let ctx = match device {
        Device::Gpu(ctx) => Ok(ctx.clone()),
        Device::Emulator(_) if gpu_required() => Err("GPQ_REQUIRE_GPU=1 but only the CPU emulator is available".to_string()),
        Device::Emulator(ctx) => Ok(ctx.clone()),
        Device::Missing(why) if gpu_required() => Err(format!("GPQ_REQUIRE_GPU=1 but there is no GPU: {why}")),
        Device::Missing(why) => Err(why.clone()),
    };
    let ignored = matches!(device, Device::Missing(_)) && !gpu_required();
    libtest_mimic::Trial::test(name, move || {
        let ctx = ctx?;
        test(&ctx);
        Ok(())
    })
    .with_ignored_flag(ignored)
}

/// Runs `trials` as the test binary's main function, parsing libtest's arguments.
pub fn run_trials(trials: Vec<libtest_mimic::Trial>) -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Reads `path` with arrow-rs into one batch.
pub fn arrow_rs(path: &Path) -> parquet::errors::Result<RecordBatch> {
    use arrow::array::RecordBatchReader;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?)?.build()?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// Asserts two batches hold the same columns (types and values), naming the first difference.
pub fn assert_batches_equal(what: &str, expected: &RecordBatch, got: &RecordBatch) {
    assert_eq!(got.num_rows(), expected.num_rows(), "{what}: row count");
    assert_eq!(got.num_columns(), expected.num_columns(), "{what}: column count");
    for (i, field) in expected.schema().fields().iter().enumerate() {
        let (e, g) = (expected.column(i), got.column(i));
        assert_eq!(g.data_type(), e.data_type(), "{what}: column {} type", field.name());
        if e != g {
            let first = (0..e.len()).find(|&r| e.slice(r, 1) != g.slice(r, 1)).unwrap_or(0);
            panic!(
                "{what}: column {} differs first at row {first}: expected {:?}, got {:?} (nulls {} vs {})",
                field.name(),
                e.slice(first, 1),
                g.slice(first, 1),
                e.null_count(),
                g.null_count()
            );
        }
    }
}

/// TPC-H `table` at `sf`, generated into `dir`.
pub fn tpch_table(dir: &Path, table: gpq_bench::tpch::Table, sf: f64) -> PathBuf {
    let options = gpq_bench::tpch::GenOptions { scale_factor: sf, ..Default::default() };
    gpq_bench::tpch::generate_table(table, dir, &options, &|_| {}).unwrap()
}

/// The shard `GPQ_TEST_SHARD=k/n` asks for (`k` counted from 0), if any.
/// scripts/device-sanitize.sh runs a long test under compute-sanitizer as
/// `n` processes, each of which takes the items (files, trials) whose index
/// is `k` modulo `n`; unset, a test takes every item.
pub fn test_shard() -> Option<(usize, usize)> {
    let v = std::env::var("GPQ_TEST_SHARD").ok()?;
    let (k, n) = v.split_once('/').unwrap_or_else(|| panic!("GPQ_TEST_SHARD={v}: expected k/n"));
    let (k, n): (usize, usize) = (k.parse().expect("GPQ_TEST_SHARD: k"), n.parse().expect("GPQ_TEST_SHARD: n"));
    assert!(n > 0 && k < n, "GPQ_TEST_SHARD={v}: expected 0 <= k < n");
    Some((k, n))
}

/// Whether item `index` of a shardable test belongs to this process's shard.
pub fn in_shard(index: usize) -> bool {
    test_shard().is_none_or(|(k, n)| index % n == k)
}

/// With `GPQ_TEST_PROGRESS` set, prints `what` and the seconds since the
/// first call to stderr: a sanitized run cut off at its deadline then shows
/// which items it finished.
pub fn progress(what: std::fmt::Arguments) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    if std::env::var_os("GPQ_TEST_PROGRESS").is_some() {
        let t = START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64();
        eprintln!("[{t:8.2} s] {what}");
    }
}
