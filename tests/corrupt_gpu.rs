//! Bad input must give an `Error` naming file, row group, column and page,
//! never a panic, a hang or an out-of-bounds access, and the process must
//! stay healthy (the next read succeeds). Runs on a GPU or the emulator.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use gpq::gpu::test_device;
use gpq::{Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

/// An uncompressed, dictionary-encoded, single-row-group file with two
/// required columns; the first column's chunk starts with its dictionary page.
fn write_file(dir: &Path, name: &str, distinct: i64) -> PathBuf {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values((0..5000).map(|i| i % distinct)));
    let names: ArrayRef = Arc::new(StringArray::from_iter_values((0..5000).map(|i| format!("n{}", i % 3))));
    let batch = RecordBatch::try_from_iter(vec![("id", ids), ("name", names)]).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .build();
    let path = dir.join(name);
    let schema = batch.schema();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

fn chunk_start(path: &Path, column: usize) -> usize {
    let plan = gpq::ReadPlan::new(path, &ReadOptions::new()).unwrap();
    plan.chunks.iter().find(|c| c.column == column).unwrap().file_offset as usize
}

/// Positions of the first three varints after `0x15` field headers (type,
/// uncompressed size, compressed size) of the page header at `at`.
fn header_fields(bytes: &[u8], at: usize) -> (Vec<(usize, usize)>, usize) {
    let mut p = at;
    let mut fields = Vec::new();
    for _ in 0..3 {
        assert_eq!(bytes[p], 0x15, "unexpected header layout");
        p += 1;
        let start = p;
        while bytes[p] & 0x80 != 0 {
            p += 1;
        }
        p += 1;
        fields.push((start, p));
    }
    (fields, p)
}

fn expect_corrupt(path: &Path, want_column: &str) -> String {
    match read_parquet_to_device(path, &ReadOptions::new()) {
        Err(Error::CorruptPage { file, row_group, column, page, kind }) => {
            assert_eq!(file, path);
            assert_eq!(row_group, 0);
            assert_eq!(column, want_column);
            let msg = format!("page {page}: {kind}");
            eprintln!("{}: {msg}", path.display());
            msg
        }
        Err(e) => panic!("{}: expected CorruptPage, got {e}", path.display()),
        Ok(_) => panic!("{}: a corrupt file decoded", path.display()),
    }
}

fn healthy_afterwards(dir: &Path) {
    let good = write_file(dir, "good.parquet", 10);
    let t = read_parquet_to_device(&good, &ReadOptions::new()).unwrap();
    assert_eq!(t.to_record_batch().unwrap().num_rows(), 5000);
}

#[test]
fn page_header_with_a_stop_byte() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "stop.parquet", 10);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = chunk_start(&path, 0);
    bytes[at] = 0x00;
    std::fs::write(&path, &bytes).unwrap();
    expect_corrupt(&path, "id");
    healthy_afterwards(dir.path());
}

#[test]
fn page_larger_than_its_chunk() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "big.parquet", 10);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = chunk_start(&path, 1);
    let (fields, _) = header_fields(&bytes, at);
    let (start, end) = fields[2];
    // Raise the compressed size without changing the varint's length.
    for b in &mut bytes[start..end - 1] {
        *b = 0xff;
    }
    bytes[end - 1] = 0x7f;
    std::fs::write(&path, &bytes).unwrap();
    let msg = expect_corrupt(&path, "name");
    assert!(msg.contains("past the end") || msg.contains("negative"), "{msg}");
    healthy_afterwards(dir.path());
}

#[test]
fn dictionary_index_out_of_range() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "dict.parquet", 2);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = chunk_start(&path, 0);
    let (_, mut p) = header_fields(&bytes, at);
    // Field 7 (dictionary_page_header), then its field 1 (num_values = 2, zigzag 4).
    assert_eq!(bytes[p], 0x4c, "expected a dictionary page header");
    p += 1;
    assert_eq!(bytes[p], 0x15);
    p += 1;
    assert_eq!(bytes[p], 0x04, "dictionary of two values");
    bytes[p] = 0x02; // one value: index 1 is now out of range
    std::fs::write(&path, &bytes).unwrap();
    let msg = expect_corrupt(&path, "id");
    assert!(msg.contains("dictionary index"), "{msg}");
    healthy_afterwards(dir.path());
}

#[test]
fn value_count_larger_than_the_page() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "short.parquet", 10);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = chunk_start(&path, 0);
    // Cut the dictionary page's body by claiming a smaller compressed size: the
    // rest of the chunk no longer parses as pages.
    let (fields, _) = header_fields(&bytes, at);
    let (start, end) = fields[2];
    if end - start == 1 {
        bytes[start] = bytes[start].saturating_sub(8);
    } else {
        bytes[start] = 0x80 | (bytes[start] & 0x7f).saturating_sub(8);
    }
    std::fs::write(&path, &bytes).unwrap();
    expect_corrupt(&path, "id");
    healthy_afterwards(dir.path());
}

#[test]
fn random_byte_flips_never_panic() {
    let Some(ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let clean = write_file(dir.path(), "clean.parquet", 50);
    let original = std::fs::read(&clean).unwrap();
    let plan = gpq::ReadPlan::new(&clean, &ReadOptions::new()).unwrap();
    let (lo, hi) = (4usize, plan.chunks.iter().map(|c| c.file_offset + c.len).max().unwrap() as usize);
    let mut rng = common::Rng::new(77);
    let trials = if ctx.is_emulated() { 40 } else { 300 };
    let (mut errors, mut ok) = (0, 0);
    for t in 0..trials {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(4) {
            let i = lo + rng.below((hi - lo) as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        }
        let path = dir.path().join(format!("flip{t}.parquet"));
        std::fs::write(&path, &bytes).unwrap();
        match read_parquet_to_device(&path, &ReadOptions::new()) {
            Ok(t) => {
                // A flip inside values can still be a valid file; conversion must still work.
                t.to_record_batch().unwrap();
                ok += 1;
            }
            Err(_) => errors += 1,
        }
    }
    eprintln!("{trials} corrupted files: {errors} errors, {ok} decoded");
    assert!(errors > 0);
    healthy_afterwards(dir.path());
}
