//! Hostile footers: planning a read of a file whose footer lies (negative
//! offsets and sizes, row counts that overflow, an embedded Arrow schema the
//! arrow crate panics on, collections and schemas built to exhaust memory or
//! time, random corruption) returns an error and never panics, aborts or
//! hangs. Planning runs on the CPU only; nothing here touches a GPU.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use gpq::{Error, ReadOptions, ReadPlan, read_footer_with_page_index};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::Compression;
use parquet::file::metadata::{
    ColumnChunkMetaDataBuilder, KeyValue, ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter,
    RowGroupMetaData,
};
use parquet::file::properties::WriterProperties;

/// Plans `path` both ways a caller can (`ReadPlan::new`, and the page-index
/// footer then `from_footer`, as `gpq inspect` does), failing the test if
/// either panics. Returns `ReadPlan::new`'s result.
fn plan(path: &Path) -> gpq::Result<ReadPlan> {
    let direct = catch_unwind(AssertUnwindSafe(|| ReadPlan::new(path, &ReadOptions::default())))
        .unwrap_or_else(|_| panic!("ReadPlan::new panicked on {}", path.display()));
    let _ = catch_unwind(AssertUnwindSafe(|| {
        read_footer_with_page_index(path).and_then(|f| ReadPlan::from_footer(path, f, &ReadOptions::default()))
    }))
    .unwrap_or_else(|_| panic!("read_footer_with_page_index + from_footer panicked on {}", path.display()));
    direct
}

/// Expects an `Error::Metadata` whose message contains `needle` (and names the file).
fn expect_metadata(path: &Path, needle: &str) {
    match plan(path) {
        Err(e @ Error::Metadata { .. }) => {
            let text = e.to_string();
            assert!(text.contains(needle), "{}: expected {needle:?} in {text}", path.display());
            assert!(text.contains(&*path.to_string_lossy()), "{text}");
        }
        other => panic!("{}: expected Error::Metadata ({needle}), got {other:?}", path.display()),
    }
}

/// Offset where the footer's Thrift starts.
fn footer_start(bytes: &[u8]) -> usize {
    let n = bytes.len();
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    n - 8 - len
}

fn read_metadata(path: &Path) -> ParquetMetaData {
    ParquetMetaDataReader::new().parse_and_finish(&std::fs::File::open(path).unwrap()).unwrap()
}

/// `original`'s pages with `metadata` written as its new footer.
fn with_footer(original: &[u8], metadata: &ParquetMetaData) -> Vec<u8> {
    let mut out = original[..footer_start(original)].to_vec();
    ParquetMetaDataWriter::new(&mut out, metadata).finish().unwrap();
    out
}

/// `metadata` with `f` applied to its row groups.
fn edit_row_groups(metadata: &ParquetMetaData, f: impl FnOnce(&mut Vec<RowGroupMetaData>)) -> ParquetMetaData {
    let mut builder = metadata.clone().into_builder();
    let mut row_groups = builder.take_row_groups();
    f(&mut row_groups);
    builder.set_row_groups(row_groups).build()
}

/// `metadata` with `f` applied to one column chunk.
fn edit_chunk(
    metadata: &ParquetMetaData,
    rg: usize,
    column: usize,
    f: impl FnOnce(ColumnChunkMetaDataBuilder) -> ColumnChunkMetaDataBuilder,
) -> ParquetMetaData {
    edit_row_groups(metadata, |rgs| {
        let mut builder = rgs[rg].clone().into_builder();
        let mut columns = builder.take_columns();
        columns[column] = f(columns[column].clone().into_builder()).build().unwrap();
        rgs[rg] = builder.set_column_metadata(columns).build().unwrap();
    })
}

struct Sample {
    dir: tempfile::TempDir,
    bytes: Vec<u8>,
    metadata: ParquetMetaData,
}

impl Sample {
    fn new() -> Sample {
        let dir = tempfile::tempdir().unwrap();
        let path = common::write_sample(&dir.path().join("sample.parquet"), 2_000, 600, Compression::SNAPPY);
        let bytes = std::fs::read(&path).unwrap();
        let metadata = read_metadata(&path);
        assert!(metadata.num_row_groups() >= 3);
        Sample { dir, bytes, metadata }
    }

    /// Writes the sample with `metadata` as its footer to `name`.
    fn write(&self, name: &str, metadata: &ParquetMetaData) -> PathBuf {
        self.write_patched(name, metadata, &[])
    }

    /// Like [`Sample::write`], then replaces each i64 `(sentinel, value)`
    /// with `value` in the footer's Thrift: the parquet crate's footer writer
    /// sums row counts and sizes and would overflow on the values themselves.
    fn write_patched(&self, name: &str, metadata: &ParquetMetaData, patches: &[(i64, i64, usize)]) -> PathBuf {
        let mut bytes = with_footer(&self.bytes, metadata);
        let start = footer_start(&bytes);
        let mut footer = bytes[start..bytes.len() - 8].to_vec();
        for &(sentinel, value, count) in patches {
            let (from, to) = (zigzag_varint(sentinel), zigzag_varint(value));
            let mut found = 0;
            let mut at = 0;
            while let Some(i) = footer[at..].windows(from.len()).position(|w| w == from.as_slice()) {
                footer.splice(at + i..at + i + from.len(), to.iter().copied());
                at += i + to.len();
                found += 1;
            }
            assert_eq!(found, count, "occurrences of sentinel {sentinel}");
        }
        bytes.truncate(start);
        bytes.extend_from_slice(&footer);
        bytes.extend_from_slice(&(footer.len() as u32).to_le_bytes());
        bytes.extend_from_slice(b"PAR1");
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

/// An i64 as the Thrift compact protocol writes it.
fn zigzag_varint(v: i64) -> Vec<u8> {
    let mut z = (v.wrapping_shl(1) ^ (v >> 63)) as u64;
    let mut out = Vec::new();
    while z >= 0x80 {
        out.push(z as u8 | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
    out
}

/// Stand-ins the footer writer can sum, patched afterwards.
const SENTINEL_ROWS: i64 = 2_222_222_222_222;
const SENTINEL_SIZE: i64 = 1_111_111_111_111;

#[test]
fn rewritten_footer_round_trips() {
    // The harness itself: a footer re-encoded without changes plans like the original.
    let s = Sample::new();
    let path = s.write("same.parquet", &s.metadata);
    let plan = plan(&path).unwrap();
    assert_eq!(plan.num_rows(), 2_000);
    assert_eq!(plan.chunks().len(), 4 * s.metadata.num_row_groups());
}

#[test]
fn negative_offsets_and_sizes_are_metadata_errors() {
    let s = Sample::new();
    let m = &s.metadata;
    let cases: Vec<(&str, ParquetMetaData, &str)> = vec![
        ("data_offset", edit_chunk(m, 0, 0, |b| b.set_data_page_offset(-5)), "negative data_page_offset"),
        ("dict_offset", edit_chunk(m, 1, 2, |b| b.set_dictionary_page_offset(Some(-7))), "negative dictionary_page_offset"),
        ("no_dict_offset", edit_chunk(m, 0, 1, |b| b.set_dictionary_page_offset(None).set_data_page_offset(-1)), "negative data_page_offset"),
        ("compressed", edit_chunk(m, 2, 3, |b| b.set_total_compressed_size(-1)), "negative total_compressed_size"),
        ("uncompressed", edit_chunk(m, 0, 3, |b| b.set_total_uncompressed_size(-1)), "negative total_uncompressed_size"),
        ("values", edit_chunk(m, 1, 0, |b| b.set_num_values(-3)), "negative num_values"),
        ("min_offset", edit_chunk(m, 0, 0, |b| b.set_dictionary_page_offset(Some(i64::MIN))), "negative dictionary_page_offset"),
        ("magic", edit_chunk(m, 0, 0, |b| b.set_dictionary_page_offset(Some(0))), "inside the leading PAR1"),
        ("data_past_end", edit_chunk(m, 0, 1, |b| b.set_data_page_offset(i64::MAX)), "past the end of the file"),
    ];
    for (name, metadata, needle) in cases {
        let path = s.write(&format!("{name}.parquet"), &metadata);
        expect_metadata(&path, needle);
        assert!(ReadPlan::new(&path, &ReadOptions::default()).unwrap_err().is_bad_input());
    }
}

#[test]
fn chunks_past_the_end_are_truncated_errors() {
    let s = Sample::new();
    let huge = edit_chunk(&s.metadata, 0, 0, |b| {
        b.set_dictionary_page_offset(Some(i64::MAX - 10)).set_total_compressed_size(SENTINEL_SIZE)
    });
    let long = edit_chunk(&s.metadata, 2, 1, |b| b.set_total_compressed_size(SENTINEL_SIZE));
    for (name, metadata, rg, column) in [("huge", huge, 0, "id"), ("long", long, 2, "small")] {
        let path = s.write_patched(&format!("{name}.parquet"), &metadata, &[(SENTINEL_SIZE, i64::MAX, 1)]);
        match plan(&path) {
            Err(Error::Truncated { row_group, column: c, file_size, .. }) => {
                assert_eq!((row_group, c.as_str()), (rg, column));
                assert_eq!(file_size, std::fs::metadata(&path).unwrap().len());
            }
            other => panic!("{name}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn row_and_value_counts_are_checked() {
    let s = Sample::new();
    let rows = |n: usize| {
        edit_row_groups(&s.metadata, |rgs| {
            for rg in &mut rgs[..n] {
                *rg = rg.clone().into_builder().set_num_rows(SENTINEL_ROWS).build().unwrap();
            }
        })
    };
    // Two row groups of i64::MAX rows: the total does not fit Parquet's i64 counts.
    let path = s.write_patched("two_max.parquet", &rows(2), &[(SENTINEL_ROWS, i64::MAX, 2)]);
    expect_metadata(&path, "row counts add up");
    // Every row group at i64::MAX would also wrap a u64.
    let n = s.metadata.num_row_groups();
    let path = s.write_patched("all_max.parquet", &rows(n), &[(SENTINEL_ROWS, i64::MAX, n)]);
    expect_metadata(&path, "row counts add up");
    let negative = edit_row_groups(&s.metadata, |rgs| {
        rgs[1] = rgs[1].clone().into_builder().set_num_rows(-1).build().unwrap();
    });
    expect_metadata(&s.write("negative_rows.parquet", &negative), "negative row count");
    let values = edit_chunk(&edit_chunk(&s.metadata, 0, 2, |b| b.set_num_values(i64::MAX)), 1, 2, |b| b.set_num_values(i64::MAX));
    expect_metadata(&s.write("values.parquet", &values), "value counts add up");
    // One row group of i64::MAX rows is representable: planning may succeed (decoding then finds the values missing).
    let _ = plan(&s.write_patched("one_max.parquet", &rows(1), &[(SENTINEL_ROWS, i64::MAX, 1)]));
}

#[test]
fn row_counts_that_disagree_are_metadata_errors() {
    let s = Sample::new();
    // A row group of "0 rows" whose chunks hold values: reading nothing would lose them.
    let zero = edit_row_groups(&s.metadata, |rgs| {
        rgs[0] = rgs[0].clone().into_builder().set_num_rows(0).build().unwrap();
    });
    expect_metadata(&s.write("zero_rows.parquet", &zero), "says it has 0 rows, but column");
    // (The footer's own total is not checked against the row groups': real
    // files disagree, e.g. parquet-testing's repeated_no_annotation.parquet
    // says 0 rows over row groups of 6; gpq reads what the row groups hold.)
}

/// Standard base64 (the encoding of the `ARROW:schema` value).
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &b)| acc | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(text: &str) -> Vec<u8> {
    let digits: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| B64.iter().position(|&d| d == c).unwrap() as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &d)| acc | d << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[test]
fn arrow_schema_with_an_int_of_bit_width_zero_is_an_error() {
    // arrow-ipc panics ("Int type with bit width of 0 and signed of true not
    // supported") converting such an embedded schema; found by fuzzing.
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int32Array::from(vec![1, 2, 3])) as ArrayRef]).unwrap();
    let good = dir.path().join("good.parquet");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&good).unwrap(), schema.clone(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let kv = read_metadata(&good).file_metadata().key_value_metadata().cloned().unwrap();
    let encoded = kv.iter().find(|k| k.key == "ARROW:schema").and_then(|k| k.value.clone()).unwrap();
    let ipc = b64_decode(&encoded);
    assert_eq!(b64_encode(&ipc), encoded, "base64 helpers");

    // The Int's bitWidth is a little-endian 32 somewhere in the flatbuffer:
    // zero each candidate in turn, and expect at least one to hit it.
    let mut caught = 0;
    for at in (0..ipc.len().saturating_sub(3)).filter(|&i| ipc[i..i + 4] == [32, 0, 0, 0]) {
        let mut patched = ipc.clone();
        patched[at] = 0;
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new("ARROW:schema".to_string(), b64_encode(&patched))]))
            .build();
        let options = ArrowWriterOptions::new().with_properties(props).with_skip_arrow_metadata(true);
        let path = dir.path().join(format!("bitwidth0-{at}.parquet"));
        let mut w = ArrowWriter::try_new_with_options(std::fs::File::create(&path).unwrap(), schema.clone(), options).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        if let Err(e) = plan(&path)
            && e.to_string().contains("bit width of 0")
        {
            assert!(matches!(e, Error::Metadata { .. }), "{e:?}");
            assert!(e.to_string().contains("panicked"), "{e}");
            caught += 1;
        }
    }
    assert!(caught > 0, "no candidate produced the bit-width-0 panic");
}

/// A minimal Thrift compact-protocol writer, for footers no writer would produce.
#[derive(Default)]
struct Thrift(Vec<u8>);

impl Thrift {
    fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }
    fn header(&mut self, delta: u8, ty: u8) -> &mut Self {
        self.0.push(delta << 4 | ty);
        self
    }
    fn i32(&mut self, delta: u8, v: i32) -> &mut Self {
        self.header(delta, 5).varint(u64::from((v.wrapping_shl(1) ^ (v >> 31)) as u32))
    }
    fn i64(&mut self, delta: u8, v: i64) -> &mut Self {
        self.header(delta, 6).varint((v.wrapping_shl(1) ^ (v >> 63)) as u64)
    }
    fn string(&mut self, delta: u8, s: &str) -> &mut Self {
        self.header(delta, 8).varint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// A list field header with `n` elements of type `elem`.
    fn list(&mut self, delta: u8, elem: u8, n: u64) -> &mut Self {
        self.header(delta, 9).list_header(elem, n)
    }
    fn list_header(&mut self, elem: u8, n: u64) -> &mut Self {
        if n < 15 {
            self.0.push((n as u8) << 4 | elem);
            self
        } else {
            self.0.push(0xf0 | elem);
            self.varint(n)
        }
    }
    fn stop(&mut self) -> &mut Self {
        self.0.push(0);
        self
    }
    /// A schema element (struct body): `name`, and `num_children` or an INT32 leaf.
    fn element(&mut self, name: &str, children: Option<i32>, root: bool) -> &mut Self {
        match children {
            Some(n) => {
                if !root {
                    self.i32(3, 0); // repetition REQUIRED
                    self.string(1, name).i32(1, n)
                } else {
                    self.string(4, name).i32(1, n)
                }
            }
            None => self.i32(1, 1).i32(2, 0).string(1, name), // type INT32, REQUIRED
        }
        .stop()
    }
}

/// A file of just the magic and `footer`.
fn write_footer_only(dir: &Path, name: &str, footer: &[u8]) -> PathBuf {
    let mut bytes = b"PAR1".to_vec();
    bytes.extend_from_slice(footer);
    bytes.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    bytes.extend_from_slice(b"PAR1");
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// FileMetaData fields 1 (version) and 2 (schema: a root over one INT32 leaf).
fn head_with_one_leaf(t: &mut Thrift) -> &mut Thrift {
    t.i32(1, 1).list(1, 12, 2);
    t.element("schema", Some(1), true).element("v", None, false)
}

#[test]
fn footers_built_to_exhaust_memory_or_time_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();

    // Sanity: the hand-built footer itself is fine.
    let mut t = Thrift::default();
    head_with_one_leaf(&mut t).i64(1, 0).list(1, 12, 0).stop();
    let ok = write_footer_only(dir.path(), "ok.parquet", &t.0);
    assert_eq!(plan(&ok).unwrap().num_rows(), 0);

    // 2^31 - 1 row groups declared in a few bytes (the crate reserves room for all of them first).
    let mut t = Thrift::default();
    head_with_one_leaf(&mut t).i64(1, 0).list(1, 12, i32::MAX as u64).stop().stop();
    expect_metadata(&write_footer_only(dir.path(), "row_groups.parquet", &t.0), "claims");

    // A root claiming i32::MAX children (the crate reserves room for them first).
    let mut t = Thrift::default();
    t.i32(1, 1).list(1, 12, 1).element("schema", Some(i32::MAX), true).i64(1, 0).list(1, 12, 0).stop();
    expect_metadata(&write_footer_only(dir.path(), "children.parquet", &t.0), "claims");

    // An unknown field: a list of lists of bools, each claiming 2^31 - 1
    // elements. The crate skips bools without consuming input: hours of looping.
    let mut t = Thrift::default();
    head_with_one_leaf(&mut t).i64(1, 0).list(1, 12, 0);
    t.list(10, 9, 100);
    for _ in 0..100 {
        t.list_header(1, i32::MAX as u64);
    }
    t.stop();
    expect_metadata(&write_footer_only(dir.path(), "bools.parquet", &t.0), "footer rejected");

    // The same, with each inner list small enough to fit the bytes left: still quadratic.
    let mut t = Thrift::default();
    head_with_one_leaf(&mut t).i64(1, 0).list(1, 12, 0);
    t.list(10, 9, 2000);
    for _ in 0..2000 {
        t.list_header(2, 2000);
    }
    t.stop();
    expect_metadata(&write_footer_only(dir.path(), "bools_fit.parquet", &t.0), "more values than bytes");

    // An integer logical type of bit width 0 in the Parquet schema itself.
    let mut t = Thrift::default();
    t.i32(1, 1).list(1, 12, 2).element("schema", Some(1), true);
    // INT32 leaf with 10: LogicalType { 10: IntType { 1: bitWidth 0, 2: signed } }
    t.i32(1, 1).i32(2, 0).string(1, "v").header(6, 12).header(10, 12).header(1, 3);
    t.0.push(0);
    t.header(1, 1).stop().stop().stop();
    t.i64(1, 0).list(1, 12, 0).stop();
    assert!(matches!(plan(&write_footer_only(dir.path(), "int0.parquet", &t.0)), Err(Error::Metadata { .. })));

    // A known field with the wrong wire type (version as a string).
    let mut t = Thrift::default();
    t.string(1, "one").stop();
    expect_metadata(&write_footer_only(dir.path(), "wire_type.parquet", &t.0), "expected");

    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

/// A footer whose schema nests `depth` groups (the root counts) over one INT32 leaf.
fn nested_schema_footer(depth: usize) -> Vec<u8> {
    let mut t = Thrift::default();
    t.i32(1, 1).list(1, 12, depth as u64 + 1).element("schema", Some(1), true);
    for _ in 1..depth {
        t.element("g", Some(1), false);
    }
    t.element("v", None, false).i64(1, 0).list(1, 12, 0).stop();
    t.0
}

#[test]
fn deep_schemas_are_rejected_before_they_exhaust_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    // Deep enough to overflow a test thread's stack in the parquet and arrow crates' recursion.
    expect_metadata(&write_footer_only(dir.path(), "deep.parquet", &nested_schema_footer(100_000)), "deeper than");
    expect_metadata(&write_footer_only(dir.path(), "deep257.parquet", &nested_schema_footer(257)), "deeper than");
    // At the limit the schema is accepted and planned, on a test thread's stack.
    let plan = plan(&write_footer_only(dir.path(), "deep256.parquet", &nested_schema_footer(256))).unwrap();
    assert_eq!(plan.columns().len(), 1);
    assert_eq!(plan.columns()[0].leaves[0].max_def_level, 0);
}

#[test]
fn random_footer_corruption_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.parquet");
    // A small file with a page index, so that the footer is short and the page index is exercised too.
    common::write_sample(&path, 300, 100, Compression::SNAPPY);
    let original = std::fs::read(&path).unwrap();
    let metadata = read_metadata(&path);
    let start = footer_start(&original);
    // The page index, when written, lies between the last page and the footer.
    let index_start = metadata
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns())
        .filter_map(|c| c.column_index_offset().into_iter().chain(c.offset_index_offset()).min())
        .min()
        .map_or(start, |o| o as usize);
    assert!(index_start < start, "the sample should have a page index");

    let mutated = dir.path().join("mutated.parquet");
    let mut rng = common::Rng::new(0xf00d);
    let (mut planned, mut failed) = (0, 0);
    let started = Instant::now();
    for i in 0..3000 {
        let mut bytes = original.clone();
        // Mostly the footer; a quarter of the time the page index; now and then the footer length.
        let (lo, hi) = match i % 8 {
            0 | 1 => (index_start, start),
            7 => (bytes.len() - 8, bytes.len() - 4),
            _ => (start, bytes.len() - 8),
        };
        for _ in 0..1 + rng.below(4) {
            let at = lo + rng.below((hi - lo) as u64) as usize;
            bytes[at] = match rng.below(3) {
                0 => bytes[at] ^ (1 << rng.below(8)),
                1 => rng.next() as u8,
                _ => [0x00, 0xff, 0x7f, 0x80, 0x0f, 0xf0][rng.below(6) as usize],
            };
        }
        std::fs::write(&mutated, &bytes).unwrap();
        match plan(&mutated) {
            Ok(_) => planned += 1,
            Err(e) => {
                assert!(e.is_bad_input(), "iteration {i}: {e:?}");
                failed += 1;
            }
        }
    }
    eprintln!("{planned} planned, {failed} rejected in {:?}", started.elapsed());
    assert!(failed > 0 && planned > 0, "{planned} planned, {failed} rejected");
}
