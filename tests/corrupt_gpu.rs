//! Bad input must give an `Error` naming file, row group, column and page,
//! never a panic, a hang or an out-of-bounds access, and the process must
//! stay healthy (the next read succeeds and is right). Runs on a GPU or the
//! emulator; reported as ignored without either.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use common::{gpu_trial, probe_device, run_trials};
use gpq::cuda::GpuContext;
use gpq::{CorruptKind, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "page_header_with_a_stop_byte", page_header_with_a_stop_byte),
        gpu_trial(&device, "page_larger_than_its_chunk", page_larger_than_its_chunk),
        gpu_trial(&device, "dictionary_index_out_of_range", dictionary_index_out_of_range),
        gpu_trial(&device, "value_count_larger_than_the_page", value_count_larger_than_the_page),
        gpu_trial(&device, "level_stream_shorter_than_the_page", level_stream_shorter_than_the_page),
        gpu_trial(&device, "random_byte_flips_are_errors_or_right_answers", random_byte_flips_are_errors_or_right_answers),
    ])
}

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
    plan.chunks().iter().find(|c| c.column == column).unwrap().file_offset as usize
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

/// Reads `path`, which must fail with a corrupt page of `want_column` in
/// row group 0 whose kind is one of `kinds`; returns the page and kind.
fn expect_corrupt(path: &Path, want_column: &str, kinds: &[CorruptKind]) -> (usize, CorruptKind) {
    match read_parquet_to_device(path, &ReadOptions::new()) {
        Err(e @ Error::CorruptPage { .. }) => {
            eprintln!("{e}");
            let Error::CorruptPage { file, row_group, column, page, kind, .. } = e else { unreachable!() };
            assert_eq!(file, path);
            assert_eq!(row_group, 0);
            assert_eq!(column, want_column);
            assert!(kinds.contains(&kind), "{}: expected one of {kinds:?}, got {kind:?}", path.display());
            (page, kind)
        }
        Err(e) => panic!("{}: expected CorruptPage, got {e}", path.display()),
        Ok(_) => panic!("{}: a corrupt file decoded", path.display()),
    }
}

/// The next read of a good file succeeds and equals arrow-rs.
fn healthy_afterwards(dir: &Path) {
    let good = write_file(dir, "good.parquet", 10);
    let t = read_parquet_to_device(&good, &ReadOptions::new()).unwrap();
    let expected = common::arrow_rs(&good).unwrap();
    common::assert_batches_equal("read after a corrupt file", &expected, &t.to_record_batch().unwrap());
}

/// A nullable v1 page of 2048 values whose definition levels cover only
/// 1024: the second batch of the decode kernel finds the level stream
/// exhausted (the case where the kernels' loop exits must stay uniform
/// across the block; compute-sanitizer's synccheck watches it on the device).
fn level_stream_shorter_than_the_page(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let values: ArrayRef = Arc::new(Int64Array::from_iter((0..2048).map(Some)));
    let batch = RecordBatch::try_from_iter_with_nullable(vec![("v", values, true)]).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_writer_version(parquet::file::properties::WriterVersion::PARQUET_1_0)
        .build();
    let path = dir.path().join("levels.parquet");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let at = chunk_start(&path, 0);
    // The levels: a 4-byte length (3), then one RLE run of 2048 ones (varint 4096 = 0x80 0x20, value 0x01).
    let run = [3u8, 0, 0, 0, 0x80, 0x20, 0x01];
    let found = bytes[at..].windows(run.len()).position(|w| w == run).expect("a single RLE run of definition levels") + at;
    bytes[found + 5] = 0x10; // a run of 1024
    std::fs::write(&path, &bytes).unwrap();
    let (page, _) = expect_corrupt(&path, "v", &[CorruptKind::TooFewValues, CorruptKind::BadRleRun]);
    assert_eq!(page, 0);
    healthy_afterwards(dir.path());
}

fn page_header_with_a_stop_byte(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "stop.parquet", 10);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = chunk_start(&path, 0);
    bytes[at] = 0x00;
    std::fs::write(&path, &bytes).unwrap();
    // A struct that ends at once: no page type, no sizes.
    let (page, _) = expect_corrupt(&path, "id", &[CorruptKind::UnknownPageType, CorruptKind::NegativeCount, CorruptKind::BadHeader]);
    assert_eq!(page, 0);
    healthy_afterwards(dir.path());
}

fn page_larger_than_its_chunk(_ctx: &Arc<GpuContext>) {
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
    let (page, _) = expect_corrupt(&path, "name", &[CorruptKind::PageOutOfChunk, CorruptKind::NegativeCount]);
    assert_eq!(page, 0);
    healthy_afterwards(dir.path());
}

fn dictionary_index_out_of_range(_ctx: &Arc<GpuContext>) {
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
    let (page, _) = expect_corrupt(&path, "id", &[CorruptKind::DictionaryIndex]);
    assert!(page >= 1, "the data page after the dictionary, got page {page}");
    healthy_afterwards(dir.path());
}

fn value_count_larger_than_the_page(_ctx: &Arc<GpuContext>) {
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
    // The next "header" starts inside the dictionary's values.
    expect_corrupt(
        &path,
        "id",
        &[CorruptKind::BadHeader, CorruptKind::TruncatedHeader, CorruptKind::UnknownPageType, CorruptKind::NegativeCount, CorruptKind::PageOutOfChunk],
    );
    healthy_afterwards(dir.path());
}


fn random_byte_flips_are_errors_or_right_answers(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let clean = write_file(dir.path(), "clean.parquet", 50);
    let original = std::fs::read(&clean).unwrap();
    let plan = gpq::ReadPlan::new(&clean, &ReadOptions::new()).unwrap();
    let (lo, hi) = (4usize, plan.chunks().iter().map(|c| c.file_offset + c.len).max().unwrap() as usize);
    let mut rng = common::Rng::new(77);
    let trials = if ctx.is_emulated() { 40 } else { 300 };
    let (mut errors, mut equal) = (0, 0);
    let mut bad = Vec::new();
    for t in 0..trials {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(4) {
            let i = lo + rng.below((hi - lo) as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        }
        let path = dir.path().join(format!("flip{t}.parquet"));
        std::fs::write(&path, &bytes).unwrap();
        let expected = common::arrow_rs(&path);
        match (read_parquet_to_device(&path, &ReadOptions::new()), expected) {
            // Blamed on the file, or a feature gpq lacks (a flipped encoding field).
            (Err(e), _) if e.is_bad_input() || matches!(e, Error::Unsupported { .. }) => errors += 1,
            // A CUDA error, an emulator deadlock (a hang on a GPU), a panic in a
            // worker, an internal error: never acceptable.
            (Err(e), _) => bad.push(format!("flip{t}: {} error: {e}", e.kind())),
            (Ok(table), Ok(expected)) => match table.to_record_batch() {
                Ok(got) if got == expected => equal += 1,
                Ok(_) => bad.push(format!("flip{t}: decoded, but differs from arrow-rs")),
                Err(e) => bad.push(format!("flip{t}: decoded, but conversion failed: {e}")),
            },
            (Ok(_), Err(e)) => bad.push(format!("flip{t}: decoded what arrow-rs rejects ({e})")),
        }
        std::fs::remove_file(&path).unwrap();
    }
    eprintln!("{trials} corrupted files: {errors} typed errors, {equal} equal to arrow-rs");
    assert!(bad.is_empty(), "{} of {trials} corrupted files went wrong:\n{}", bad.len(), bad.join("\n"));
    healthy_afterwards(dir.path());
}
