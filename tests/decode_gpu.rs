//! Differential tests of the decode stage: gpq's device columns, copied back,
//! must equal what arrow-rs reads from the same file, value for value and
//! type for type. Runs on a GPU, or on the CPU emulator in builds with the
//! `emulator` feature (smaller sizes there); skips with a notice otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::*;
use arrow::compute::concat_batches;
use arrow::datatypes::*;
use gpq::arrow::PinnedHostPool;
use gpq::gpu::test_device;
use gpq::{DecompressMode, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, Encoding, GzipLevel, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use common::Rng;

/// Reads `path` with arrow-rs into one batch.
fn arrow_rs(path: &Path) -> parquet::errors::Result<RecordBatch> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?)?.build()?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok(concat_batches(&schema, &batches)?)
}

/// Reads `path` with gpq and asserts it equals arrow-rs.
fn assert_same(path: &Path, options: &ReadOptions) -> gpq::DeviceTable {
    let expected = arrow_rs(path).unwrap_or_else(|e| panic!("arrow-rs cannot read {}: {e}", path.display()));
    let table = read_parquet_to_device(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let got = table.to_record_batch().unwrap();
    assert_batches_equal(path, &expected, &got);
    let (pinned, _) = table.to_record_batch_staged().unwrap();
    assert_batches_equal(path, &expected, &pinned);
    table
}

fn assert_batches_equal(path: &Path, expected: &RecordBatch, got: &RecordBatch) {
    assert_eq!(got.num_rows(), expected.num_rows(), "{}: row count", path.display());
    assert_eq!(got.num_columns(), expected.num_columns(), "{}: column count", path.display());
    for (i, field) in expected.schema().fields().iter().enumerate() {
        let (e, g) = (expected.column(i), got.column(i));
        assert_eq!(g.data_type(), e.data_type(), "{}: column {} type", path.display(), field.name());
        if e != g {
            let first = (0..e.len()).find(|&r| e.slice(r, 1) != g.slice(r, 1)).unwrap_or(0);
            panic!(
                "{}: column {} differs first at row {first}: expected {:?}, got {:?} (nulls {} vs {})",
                path.display(),
                field.name(),
                e.slice(first, 1),
                g.slice(first, 1),
                e.null_count(),
                g.null_count()
            );
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Nulls {
    Required,
    Some,
    All,
}

fn valid(r: &mut Rng, n: Nulls) -> bool {
    match n {
        Nulls::Required => true,
        Nulls::Some => r.below(10) != 0,
        Nulls::All => false,
    }
}

/// One column of every type under test, for one nullability.
fn columns(rows: usize, nulls: Nulls, seed: u64) -> Vec<(Field, ArrayRef)> {
    let mut r = Rng::new(seed);
    let nullable = nulls != Nulls::Required;
    let tag = match nulls {
        Nulls::Required => "req",
        Nulls::Some => "opt",
        Nulls::All => "null",
    };
    macro_rules! prim {
        ($name:expr, $arr:ty, $gen:expr) => {{
            let a: $arr = (0..rows).map(|_| if valid(&mut r, nulls) { Some($gen(&mut r)) } else { None }).collect();
            (Field::new(format!("{}_{tag}", $name), a.data_type().clone(), nullable), Arc::new(a) as ArrayRef)
        }};
    }
    let mut v = vec![
        prim!("bool", BooleanArray, |r: &mut Rng| r.below(3) == 0),
        prim!("i8", Int8Array, |r: &mut Rng| r.next() as i8),
        prim!("i16", Int16Array, |r: &mut Rng| r.next() as i16),
        prim!("i32", Int32Array, |r: &mut Rng| r.next() as i32),
        prim!("i32_lowcard", Int32Array, |r: &mut Rng| r.below(7) as i32 - 3),
        prim!("i64", Int64Array, |r: &mut Rng| r.next() as i64),
        prim!("u8", UInt8Array, |r: &mut Rng| r.next() as u8),
        prim!("u16", UInt16Array, |r: &mut Rng| r.next() as u16),
        prim!("u32", UInt32Array, |r: &mut Rng| r.next() as u32),
        prim!("u64", UInt64Array, |r: &mut Rng| r.next()),
        prim!("f32", Float32Array, |r: &mut Rng| (r.next() as i32) as f32 / 7.0),
        prim!("f64", Float64Array, |r: &mut Rng| (r.next() as i64) as f64 / 13.0),
        prim!("date32", Date32Array, |r: &mut Rng| r.below(40_000) as i32 - 10_000),
        prim!("date64", Date64Array, |r: &mut Rng| (r.below(40_000) as i64 - 10_000) * 86_400_000),
        prim!("time32ms", Time32MillisecondArray, |r: &mut Rng| r.below(86_400_000) as i32),
        prim!("time64us", Time64MicrosecondArray, |r: &mut Rng| r.below(86_400_000_000) as i64),
        prim!("ts_s", TimestampSecondArray, |r: &mut Rng| r.below(4_000_000_000) as i64),
        prim!("ts_ms", TimestampMillisecondArray, |r: &mut Rng| r.below(1 << 42) as i64),
        prim!("ts_ns", TimestampNanosecondArray, |r: &mut Rng| r.next() as i64 >> 2),
    ];
    let tz: TimestampMicrosecondArray = (0..rows)
        .map(|_| if valid(&mut r, nulls) { Some(r.below(1 << 50) as i64) } else { None })
        .collect::<TimestampMicrosecondArray>()
        .with_timezone("+02:00");
    v.push((Field::new(format!("ts_us_tz_{tag}"), tz.data_type().clone(), nullable), Arc::new(tz)));
    for (name, p, s, bits) in [("dec_i32", 9u8, 2i8, 28u32), ("dec_i64", 18, 3, 58), ("dec_flba", 38, 5, 120)] {
        let a: Decimal128Array = (0..rows)
            .map(|_| {
                if !valid(&mut r, nulls) {
                    return None;
                }
                let mag = ((r.next() as u128) << 64 | r.next() as u128) >> (128 - bits);
                Some(if r.below(2) == 0 { mag as i128 } else { -(mag as i128) })
            })
            .collect::<Decimal128Array>()
            .with_precision_and_scale(p, s)
            .unwrap();
        v.push((Field::new(format!("{name}_{tag}"), a.data_type().clone(), nullable), Arc::new(a)));
    }
    let words = ["", "a", "tiny", "lorem ipsum dolor", "furiously regular deposits", "ünïcödé ✓"];
    let s: StringArray = (0..rows)
        .map(|i| if valid(&mut r, nulls) { Some(format!("{}{}", words[r.below(6) as usize], if r.below(4) == 0 { i.to_string() } else { String::new() })) } else { None })
        .collect();
    v.push((Field::new(format!("utf8_{tag}"), DataType::Utf8, nullable), Arc::new(s)));
    let low: StringArray = (0..rows).map(|_| if valid(&mut r, nulls) { Some(words[r.below(3) as usize + 1]) } else { None }).collect();
    v.push((Field::new(format!("utf8_lowcard_{tag}"), DataType::Utf8, nullable), Arc::new(low)));
    let ls: LargeStringArray = (0..rows).map(|i| if valid(&mut r, nulls) { Some(format!("large-{}", i * 31)) } else { None }).collect();
    v.push((Field::new(format!("large_utf8_{tag}"), DataType::LargeUtf8, nullable), Arc::new(ls)));
    let bin: BinaryArray = (0..rows)
        .map(|_| if valid(&mut r, nulls) { Some((0..r.below(20)).map(|_| r.next() as u8).collect::<Vec<u8>>()) } else { None })
        .collect();
    v.push((Field::new(format!("binary_{tag}"), DataType::Binary, nullable), Arc::new(bin)));
    let fsb = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
        (0..rows).map(|_| if valid(&mut r, nulls) { Some((0..7).map(|_| r.next() as u8).collect::<Vec<u8>>()) } else { None }),
        7,
    )
    .unwrap();
    v.push((Field::new(format!("fsb7_{tag}"), DataType::FixedSizeBinary(7), nullable), Arc::new(fsb)));
    let view: StringViewArray = (0..rows).map(|i| if valid(&mut r, nulls) { Some(format!("view string number {i}")) } else { None }).collect();
    v.push((Field::new(format!("utf8view_{tag}"), DataType::Utf8View, nullable), Arc::new(view)));
    let keys: Int32Array = (0..rows).map(|_| if valid(&mut r, nulls) { Some(r.below(4) as i32) } else { None }).collect();
    let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(StringArray::from(vec!["AIR", "RAIL", "SHIP", "TRUCK"]))).unwrap();
    v.push((Field::new(format!("dict_{tag}"), dict.data_type().clone(), nullable), Arc::new(dict)));
    let f16: Float16Array = (0..rows).map(|_| if valid(&mut r, nulls) { Some(half::f16::from_f32(r.below(1000) as f32 / 8.0)) } else { None }).collect();
    v.push((Field::new(format!("f16_{tag}"), DataType::Float16, nullable), Arc::new(f16)));
    v
}

struct Variant {
    codec: Compression,
    v2: bool,
    dictionary: bool,
    tiny_pages: bool,
}

fn write_variant(dir: &Path, rows: usize, var: &Variant) -> PathBuf {
    let mut cols = columns(rows, Nulls::Required, 1);
    cols.extend(columns(rows, Nulls::Some, 2));
    cols.extend(columns(rows, Nulls::All, 3));
    let schema = Arc::new(Schema::new(cols.iter().map(|c| c.0.clone()).collect::<Vec<_>>()));
    let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
    let mut b = WriterProperties::builder()
        .set_compression(var.codec)
        .set_writer_version(if var.v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        .set_max_row_group_row_count(Some(rows / 2 + 1))
        .set_dictionary_enabled(var.dictionary);
    if var.tiny_pages {
        b = b.set_data_page_row_count_limit(97).set_write_batch_size(61).set_dictionary_page_size_limit(512);
    }
    for f in schema.fields() {
        // PLAIN, also as the fallback of dictionary pages that outgrow their
        // limit; v2 writes booleans as RLE by default: keep that.
        let enc = if var.v2 && f.data_type() == &DataType::Boolean { Encoding::RLE } else { Encoding::PLAIN };
        b = b.set_column_encoding(ColumnPath::from(f.name().as_str()), enc);
    }
    let name = format!(
        "m_{:?}_{}_{}_{}.parquet",
        var.codec,
        if var.v2 { "v2" } else { "v1" },
        if var.dictionary { "dict" } else { "plain" },
        if var.tiny_pages { "tiny" } else { "default" }
    )
    .replace(['(', ')', ' ', '{', '}', ':'], "");
    let path = dir.join(name);
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(b.build())).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

fn matrix_rows(ctx: &gpq::gpu::GpuContext) -> usize {
    // Not a multiple of 32; smaller on the emulator, which runs blocks one at a
    // time, and under compute-sanitizer (GPQ_TEST_SMALL=1).
    if ctx.is_emulated() || std::env::var("GPQ_TEST_SMALL").is_ok_and(|v| v == "1") { 613 } else { 10_007 }
}

#[test]
fn matrix_matches_arrow_rs() {
    let Some(ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(&ctx);
    let codecs = [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::ZSTD(ZstdLevel::try_new(1).unwrap()),
        Compression::LZ4_RAW,
        Compression::GZIP(GzipLevel::try_new(1).unwrap()),
    ];
    let mut checked = 0;
    for codec in codecs {
        for v2 in [false, true] {
            for dictionary in [false, true] {
                for tiny_pages in [false, true] {
                    let path = write_variant(dir.path(), rows, &Variant { codec, v2, dictionary, tiny_pages });
                    let t = assert_same(&path, &ReadOptions::new());
                    if codec != Compression::UNCOMPRESSED && !ctx.is_emulated() {
                        assert!(t.stats.decompression.gpu_pages + t.stats.decompression.cpu_pages > 0);
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 40);
}

#[test]
fn cpu_decompression_fallback_matches() {
    let Some(ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(&ctx);
    for codec in [Compression::SNAPPY, Compression::BROTLI(Default::default()), Compression::LZ4, Compression::ZSTD(Default::default())] {
        let path = write_variant(dir.path(), rows, &Variant { codec, v2: true, dictionary: true, tiny_pages: false });
        let t = assert_same(&path, &ReadOptions::new().with_decompress(DecompressMode::Cpu));
        assert!(t.stats.decompression.cpu_pages > 0);
        assert_eq!(t.stats.decompression.gpu_pages, 0);
        assert!(t.stats.decompression.fallback.is_some());
        // Auto: BROTLI and Hadoop LZ4 must fall back, the rest go to nvCOMP when present.
        let t = assert_same(&path, &ReadOptions::new());
        if matches!(codec, Compression::BROTLI(_) | Compression::LZ4) {
            assert!(t.stats.decompression.cpu_pages > 0);
        }
    }
}

#[test]
fn projections_and_row_groups() {
    let Some(ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(&ctx);
    let path = write_variant(dir.path(), rows, &Variant { codec: Compression::SNAPPY, v2: false, dictionary: true, tiny_pages: true });
    let expected = arrow_rs(&path).unwrap();
    let got = read_parquet_to_device(&path, &ReadOptions::new().with_columns(["utf8_opt", "i64_req"]).with_row_groups([1]))
        .unwrap()
        .to_record_batch()
        .unwrap();
    let start = rows / 2 + 1;
    let want = RecordBatch::try_new(
        got.schema(),
        vec![
            expected.column_by_name("utf8_opt").unwrap().slice(start, rows - start),
            expected.column_by_name("i64_req").unwrap().slice(start, rows - start),
        ],
    )
    .unwrap();
    assert_batches_equal(&path, &want, &got);
}

#[test]
fn pinned_copies_return_and_reuse_their_slab() {
    let Some(ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(&ctx);
    let path = write_variant(dir.path(), rows, &Variant { codec: Compression::SNAPPY, v2: true, dictionary: true, tiny_pages: false });
    let expected = arrow_rs(&path).unwrap();
    let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let pool = PinnedHostPool::with_capacity(&ctx, 1 << 30);

    let (first, pinned) = table.to_record_batch_in(&pool).unwrap();
    assert!(pinned, "a 1 GiB pool must take a {rows}-row table");
    let held = pool.allocated();
    assert!(held > 0);
    assert_eq!(pool.idle(), 0, "the slab is in use while the batch lives");
    // The host arrays outlive the device table, and a slice keeps the slab.
    drop(table);
    assert_batches_equal(&path, &expected, &first);
    let slice = first.slice(1, 2);
    drop(first);
    assert_eq!(pool.idle(), 0);
    drop(slice);
    assert_eq!(pool.idle(), held, "the slab goes back when its last array is dropped");

    let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let (second, pinned) = table.to_record_batch_in(&pool).unwrap();
    assert!(pinned);
    assert_eq!(pool.allocated(), held, "the idle slab is reused, not a new one allocated");
    assert_batches_equal(&path, &expected, &second);

    // A pool with no room copies to pageable memory instead.
    let full = PinnedHostPool::with_capacity(&ctx, 0);
    let (third, pinned) = table.to_record_batch_in(&full).unwrap();
    assert!(!pinned);
    assert_eq!(full.allocated(), 0);
    assert_batches_equal(&path, &expected, &third);
}

#[test]
fn empty_and_single_row_files() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    for rows in [0usize, 1] {
        let cols = columns(rows, Nulls::Some, 9);
        let schema = Arc::new(Schema::new(cols.iter().map(|c| c.0.clone()).collect::<Vec<_>>()));
        let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
        let path = dir.path().join(format!("rows{rows}.parquet"));
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let t = assert_same(&path, &ReadOptions::new());
        assert_eq!(t.num_rows, rows);
    }
}

#[test]
fn tpch_tables_match() {
    let Some(ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sf = std::env::var("GPQ_TEST_TPCH_SF").ok().and_then(|s| s.parse().ok()).unwrap_or(if ctx.is_emulated() { 0.002 } else { 1.0 });
    let options = gpq::tpch::GenOptions { scale_factor: sf, ..Default::default() };
    for table in gpq::tpch::Table::ALL {
        let path = gpq::tpch::generate_table(table, dir.path(), &options, &|_| {}).unwrap();
        let t = assert_same(&path, &ReadOptions::new());
        eprintln!("{} sf{sf}: {} rows, {}", table.name(), t.num_rows, t.stats.summary());
    }
}

#[test]
fn parquet_testing_files() {
    let Some(_ctx) = test_device() else { return };
    let Some(dir) = common::parquet_testing_dir() else { return };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "parquet")).collect();
    files.sort();
    let (mut same, mut unsupported, mut both_fail) = (0, 0, 0);
    for path in &files {
        let expected = arrow_rs(path);
        match (read_parquet_to_device(path, &ReadOptions::new()), expected) {
            (Ok(t), Ok(e)) => {
                let got = t.to_record_batch().unwrap_or_else(|err| panic!("{}: {err}", path.display()));
                assert_batches_equal(path, &e, &got);
                same += 1;
            }
            (Err(Error::Unsupported { what, .. }), _) => {
                eprintln!("unsupported {}: {what}", path.display());
                unsupported += 1;
            }
            (Err(e), Err(ae)) => {
                eprintln!("both fail {}: gpq {e}; arrow-rs {ae}", path.display());
                both_fail += 1;
            }
            (Err(e), Ok(_)) => panic!("{}: gpq fails where arrow-rs reads: {e}", path.display()),
            (Ok(_), Err(ae)) => eprintln!("{}: gpq reads what arrow-rs rejects ({ae})", path.display()),
        }
    }
    eprintln!("parquet-testing: {same} equal, {unsupported} unsupported, {both_fail} rejected by both, of {}", files.len());
    assert!(same >= 20, "only {same} files decoded");
}
