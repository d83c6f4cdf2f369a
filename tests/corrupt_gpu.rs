//! Bad input must give an `Error` naming file, row group, column and page,
//! never a panic, a hang or an out-of-bounds access, and the process must
//! stay healthy (the next read succeeds and is right). Runs on a GPU or the
//! emulator; reported as ignored without either.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use common::{gpu_trial, probe_device, run_trials};
use gpq::cuda::GpuContext;
use gpq::{CorruptKind, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "page_header_with_a_stop_byte", page_header_with_a_stop_byte),
        gpu_trial(&device, "page_larger_than_its_chunk", page_larger_than_its_chunk),
        gpu_trial(&device, "dictionary_index_out_of_range", dictionary_index_out_of_range),
        gpu_trial(&device, "value_count_larger_than_the_page", value_count_larger_than_the_page),
        gpu_trial(&device, "level_stream_shorter_than_the_page", level_stream_shorter_than_the_page),
        gpu_trial(&device, "v2_null_count_disagrees_with_the_levels", v2_null_count_disagrees_with_the_levels),
        gpu_trial(&device, "random_byte_flips_are_errors_or_right_answers", random_byte_flips_are_errors_or_right_answers),
        gpu_trial(&device, "delta_header_runs_past_the_page", delta_header_runs_past_the_page),
        gpu_trial(&device, "delta_bit_width_wider_than_the_type", delta_bit_width_wider_than_the_type),
        gpu_trial(&device, "delta_headers_out_of_bounds", delta_headers_out_of_bounds),
        gpu_trial(&device, "delta_byte_array_lengths_out_of_bounds", delta_byte_array_lengths_out_of_bounds),
        gpu_trial(&device, "random_byte_flips_in_delta_and_split_pages", random_byte_flips_in_delta_and_split_pages),
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

/// A v2 page whose header counts one null more than its definition levels
/// hold (the fuzzer's most frequent "gpq reads what arrow-rs rejects" case):
/// the count is redundant with the levels, so the page is corrupt.
fn v2_null_count_disagrees_with_the_levels(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let values: ArrayRef = Arc::new(Int64Array::from_iter((0..1000).map(|i| (i % 10 != 0).then_some(i))));
    let batch = RecordBatch::try_from_iter_with_nullable(vec![("v", values, true)]).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_writer_version(parquet::file::properties::WriterVersion::PARQUET_2_0)
        .build();
    let path = dir.path().join("v2_nulls.parquet");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    // The unpatched file reads (the check does not reject valid v2 pages).
    let t = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    assert_eq!(t.num_rows(), 1000);
    // DataPageHeaderV2: num_values 1000, num_nulls 100, num_rows 1000 (zigzag varints).
    let mut bytes = std::fs::read(&path).unwrap();
    let fields = [0x15u8, 0xD0, 0x0F, 0x15, 0xC8, 0x01, 0x15, 0xD0, 0x0F];
    let at = bytes.windows(fields.len()).position(|w| w == fields).expect("the v2 header's counts");
    bytes[at + 4] = 0xCA; // 101 nulls
    std::fs::write(&path, &bytes).unwrap();
    let (page, _) = expect_corrupt(&path, "v", &[CorruptKind::BadHeader]);
    assert_eq!(page, 0);
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
    let mut rng = common::Rng::new(77);
    let trials = if ctx.is_emulated() { 40 } else { 300 };
    flips_are_errors_or_right_answers(dir.path(), &clean, &mut rng, trials, 4, false);
    healthy_afterwards(dir.path());
}

/// An uncompressed file of v1 pages, no dictionary, no statistics, each
/// column in the given encoding (required columns: a page's body is its
/// value stream).
fn write_encoded(dir: &Path, name: &str, columns: Vec<(&str, ArrayRef, Encoding)>) -> PathBuf {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None);
    for (n, _, e) in &columns {
        b = b.set_column_encoding(ColumnPath::from(*n), *e);
    }
    let batch = RecordBatch::try_from_iter(columns.into_iter().map(|(n, a, _)| (n, a))).unwrap();
    let path = dir.join(name);
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(b.build())).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

/// The offset of the only occurrence of `pattern` in column `column`'s chunk.
fn find_in_chunk(path: &Path, column: usize, pattern: &[u8]) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let plan = gpq::ReadPlan::new(path, &ReadOptions::new()).unwrap();
    let c = plan.chunks().iter().find(|c| c.column == column).unwrap();
    let (lo, hi) = (c.file_offset as usize, (c.file_offset + c.len) as usize);
    let hits: Vec<usize> = bytes[lo..hi].windows(pattern.len()).enumerate().filter(|(_, w)| *w == pattern).map(|(i, _)| lo + i).collect();
    assert_eq!(hits.len(), 1, "{}: expected one {pattern:02x?} in column {column}'s chunk: {:02x?}", path.display(), &bytes[lo..hi.min(lo + 96)]);
    hits[0]
}

fn patch(path: &Path, at: usize, bytes: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, &b).unwrap();
}

/// A one-value page whose first value's varint runs past the page's end.
fn delta_header_runs_past_the_page(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_encoded(dir.path(), "first.parquet", vec![("v", Arc::new(Int64Array::from(vec![1000])), Encoding::DELTA_BINARY_PACKED)]);
    // Header (INT64: blocks of 256): 4 miniblocks, 1 value, first value zigzag(1000) = 2000 = 0xd0 0x0f.
    let at = find_in_chunk(&path, 0, &[0x80, 0x02, 0x04, 0x01, 0xd0, 0x0f]);
    patch(&path, at + 5, &[0x8f]);
    let (page, _) = expect_corrupt(&path, "v", &[CorruptKind::TruncatedPage]);
    assert_eq!(page, 0);
    healthy_afterwards(dir.path());
}

/// A miniblock of 33-bit INT32 deltas, and one of 65-bit INT64 deltas.
fn delta_bit_width_wider_than_the_type(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for (name, width, block, array) in [
        ("i32", 33u8, 0x01u8, Arc::new(Int32Array::from_iter_values((0..1000).map(|i| i * 5 + 1))) as ArrayRef),
        ("i64", 65, 0x02, Arc::new(Int64Array::from_iter_values((0..1000).map(|i| i * 5 + 1)))),
    ] {
        let path = write_encoded(dir.path(), &format!("{name}.parquet"), vec![(name, array, Encoding::DELTA_BINARY_PACKED)]);
        // Blocks of 128 (INT32) or 256 (INT64) values in 4 miniblocks, 1000 values (0xe8 0x07), first
        // value 1 (0x02); the first block's min delta 5 (0x0a), then four widths of 0.
        let at = find_in_chunk(&path, 0, &[0x80, block, 0x04, 0xe8, 0x07, 0x02, 0x0a, 0, 0, 0, 0]);
        patch(&path, at + 7, &[width]);
        let (page, _) = expect_corrupt(&path, name, &[CorruptKind::BitWidth]);
        assert_eq!(page, 0);
    }
    healthy_afterwards(dir.path());
}

/// Crafted DELTA_BINARY_PACKED headers written over an INT32 page's stream.
fn delta_headers_out_of_bounds(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let values: ArrayRef = Arc::new(Int32Array::from_iter_values((0..1000).map(|i| (i * 7919) % 1009)));
    let cases: &[(&str, &[u8], CorruptKind)] = &[
        // 2^26 miniblocks of 32 values in a block of 2^31: the widths run past the page.
        ("miniblocks past the page", &[0x80, 0x80, 0x80, 0x80, 0x08, 0x80, 0x80, 0x80, 0x20, 0xe8, 0x07, 0x00, 0x00], CorruptKind::TruncatedPage),
        // A block of 2^35 values: more than a page can hold.
        ("block size over 2^32", &[0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0x04, 0xe8, 0x07, 0x00], CorruptKind::BadDeltaHeader),
        ("no miniblocks", &[0x80, 0x01, 0x00, 0xe8, 0x07, 0x00], CorruptKind::BadDeltaHeader),
        ("block size not a multiple of 128", &[0x64, 0x04, 0xe8, 0x07, 0x00], CorruptKind::BadDeltaHeader),
        ("miniblocks of 16 values", &[0x80, 0x01, 0x08, 0xe8, 0x07, 0x00], CorruptKind::BadDeltaHeader),
        ("blocks of no values", &[0x00, 0x04, 0xe8, 0x07, 0x00], CorruptKind::BadDeltaHeader),
        ("value count over 2^63", &[0x80, 0x01, 0x04, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00], CorruptKind::BadDeltaHeader),
        ("an eleven-byte varint", &[0x80, 0x01, 0x04, 0xe8, 0x87, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], CorruptKind::BadDeltaHeader),
        ("first value beyond INT32", &[0x80, 0x01, 0x04, 0xe8, 0x07, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], CorruptKind::BadDeltaHeader),
        ("min delta beyond INT32", &[0x80, 0x01, 0x04, 0xe8, 0x07, 0x00, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], CorruptKind::BadDeltaHeader),
        ("fewer values than the page", &[0x80, 0x01, 0x04, 0x0a, 0x00], CorruptKind::TooFewValues),
    ];
    for (i, (what, header, kind)) in cases.iter().enumerate() {
        let path = write_encoded(dir.path(), &format!("h{i}.parquet"), vec![("v", values.clone(), Encoding::DELTA_BINARY_PACKED)]);
        let at = find_in_chunk(&path, 0, &[0x80, 0x01, 0x04, 0xe8, 0x07, 0x00]);
        patch(&path, at, header);
        eprintln!("{what}");
        let (page, _) = expect_corrupt(&path, "v", &[*kind]);
        assert_eq!(page, 0, "{what}");
    }
    healthy_afterwards(dir.path());
}

/// A negative DELTA_LENGTH_BYTE_ARRAY length, and a DELTA_BYTE_ARRAY prefix
/// longer than the value before it.
fn delta_byte_array_lengths_out_of_bounds(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let two = || Arc::new(BinaryArray::from_iter_values([b"abc".as_slice(), b"abd"])) as ArrayRef;
    // Lengths 3, 3: two values, first value zigzag(3) = 6, min delta 0, widths 0.
    let path = write_encoded(dir.path(), "dlba.parquet", vec![("s", two(), Encoding::DELTA_LENGTH_BYTE_ARRAY)]);
    let at = find_in_chunk(&path, 0, &[0x80, 0x01, 0x04, 0x02, 0x06, 0x00, 0, 0, 0, 0]);
    patch(&path, at + 4, &[0x05]); // first length -3
    expect_corrupt(&path, "s", &[CorruptKind::BadDeltaLength]);
    // Prefixes 0, 2: first value 0, min delta zigzag(2) = 4; then suffix lengths 3, 1.
    let path = write_encoded(dir.path(), "dba.parquet", vec![("s", two(), Encoding::DELTA_BYTE_ARRAY)]);
    let at = find_in_chunk(&path, 0, &[0x80, 0x01, 0x04, 0x02, 0x00, 0x04, 0, 0, 0, 0]);
    patch(&path, at + 5, &[0x08]); // second prefix 4 > 3
    expect_corrupt(&path, "s", &[CorruptKind::BadDeltaLength]);
    // Prefix counts that differ from the suffix counts.
    let path = write_encoded(dir.path(), "dba_count.parquet", vec![("s", two(), Encoding::DELTA_BYTE_ARRAY)]);
    let at = find_in_chunk(&path, 0, &[0x80, 0x01, 0x04, 0x02, 0x00, 0x04, 0, 0, 0, 0]);
    patch(&path, at + 3, &[0x01]);
    // One prefix needs no block: what follows the header is read as the suffix lengths' header.
    expect_corrupt(&path, "s", &[CorruptKind::BadDeltaLength, CorruptKind::BadDeltaHeader]);
    healthy_afterwards(dir.path());
}

/// Byte flips anywhere in the chunks of DELTA and BYTE_STREAM_SPLIT
/// columns: each read is a typed error or equals arrow-rs.
fn random_byte_flips_in_delta_and_split_pages(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let n = 700;
    let mut rng = common::Rng::new(5);
    let ints: ArrayRef = Arc::new(Int64Array::from_iter((0..n).map(|i| (i % 9 != 0).then_some(i * 1_000_003 % 77_777))));
    let words: Vec<Vec<u8>> = (0..n).map(|i| format!("key-{:06}-{}", i / 4, rng.below(50)).into_bytes()).collect();
    let dba: ArrayRef = Arc::new(BinaryArray::from_iter(words.iter().enumerate().map(|(i, w)| (i % 7 != 0).then_some(w.as_slice()))));
    let dlba: ArrayRef = Arc::new(BinaryArray::from_iter_values(words.iter().rev().map(|w| w.as_slice())));
    let floats: ArrayRef = Arc::new(Float64Array::from_iter((0..n).map(|i| (i % 5 != 0).then_some(i as f64 / 3.0))));
    let clean = write_encoded(
        dir.path(),
        "clean.parquet",
        vec![
            ("i", ints, Encoding::DELTA_BINARY_PACKED),
            ("p", dba, Encoding::DELTA_BYTE_ARRAY),
            ("l", dlba, Encoding::DELTA_LENGTH_BYTE_ARRAY),
            ("f", floats, Encoding::BYTE_STREAM_SPLIT),
        ],
    );
    common::assert_batches_equal("clean", &common::arrow_rs(&clean).unwrap(), &read_parquet_to_device(&clean, &ReadOptions::new()).unwrap().to_record_batch().unwrap());
    let trials = if ctx.is_emulated() { 400 } else { 1000 };
    // arrow-rs panics on some corrupt DELTA pages (an overflowing add in a debug build): a rejection.
    flips_are_errors_or_right_answers(dir.path(), &clean, &mut rng, trials, 3, true);
    healthy_afterwards(dir.path());
}

/// Reads `trials` copies of `clean` with 1 to `max_flips` bits flipped
/// between the first page and the end of the last chunk: each must be a
/// typed bad-input (or unsupported) error or equal to arrow-rs. With
/// `arrow_may_panic`, an arrow-rs panic counts as arrow-rs rejecting the file.
fn flips_are_errors_or_right_answers(dir: &Path, clean: &Path, rng: &mut common::Rng, trials: usize, max_flips: u64, arrow_may_panic: bool) {
    let original = std::fs::read(clean).unwrap();
    let plan = gpq::ReadPlan::new(clean, &ReadOptions::new()).unwrap();
    let (lo, hi) = (4usize, plan.chunks().iter().map(|c| c.file_offset + c.len).max().unwrap() as usize);
    let (mut errors, mut equal) = (0, 0);
    let mut bad = Vec::new();
    for t in 0..trials {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(max_flips) {
            let i = lo + rng.below((hi - lo) as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        }
        // The flips above are drawn for every trial, so a shard corrupts its
        // trials exactly as the whole run does.
        if !common::in_shard(t) {
            continue;
        }
        common::progress(format_args!("flip{t}"));
        let path = dir.join(format!("flip{t}.parquet"));
        std::fs::write(&path, &bytes).unwrap();
        let expected = if arrow_may_panic {
            std::panic::catch_unwind(|| common::arrow_rs(&path))
                .unwrap_or_else(|_| Err(parquet::errors::ParquetError::General("arrow-rs panicked".into())))
        } else {
            common::arrow_rs(&path)
        };
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
    let shard = common::test_shard().map_or(String::new(), |(k, n)| format!(" (shard {k}/{n} of the trials)"));
    eprintln!("{trials} corrupted files{shard}: {errors} typed errors, {equal} equal to arrow-rs");
    assert!(bad.is_empty(), "{} of {trials} corrupted files went wrong:\n{}", bad.len(), bad.join("\n"));
}
