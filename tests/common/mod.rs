//! Helpers shared by the integration tests: small Parquet files written with
//! the parquet crate, and the location of the shared parquet-testing corpus.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

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
