//! Valid files at the edges of the format that gpq once read differently
//! from arrow-rs, or refused (issue 11): INT96 timestamps that do not fit a
//! nanosecond timestamp, RLE-encoded BOOLEAN pages (v1 and v2), empty tables
//! and zero-row row groups as pyarrow writes them. Each read is compared
//! with arrow-rs reading the same file. Runs on a GPU, or on the CPU
//! emulator in builds with the `emulator` feature; reported as ignored
//! otherwise.

mod common;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use common::{Rng, arrow_rs, gpu_trial, probe_device, run_trials, testdata};
use gpq::cuda::GpuContext;
use gpq::{ReadOptions, read_parquet_to_device};
use parquet::arrow::encode_arrow_schema;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{CompressedPage, Page, PageWriteSpec, PageWriter};
use parquet::column::writer::{ColumnWriter, get_column_writer};
use parquet::data_type::{ByteArray, Int96};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "int96_matches_arrow_rs_bit_for_bit", int96_matches_arrow_rs_bit_for_bit),
        gpu_trial(&device, "rle_booleans_v1_and_v2", rle_booleans_v1_and_v2),
        gpu_trial(&device, "files_from_other_writers", files_from_other_writers),
        gpu_trial(&device, "pyarrow_empty_table", pyarrow_empty_table),
        gpu_trial(&device, "zero_row_row_groups", zero_row_row_groups),
        gpu_trial(&device, "page_checksums_verified_on_request", page_checksums_verified_on_request),
        gpu_trial(&device, "intervals_match_arrow_rs", intervals_match_arrow_rs),
        gpu_trial(&device, "string_views_built_on_the_device", string_views_built_on_the_device),
        gpu_trial(&device, "bit_packed_levels_match_arrow_rs", bit_packed_levels_match_arrow_rs),
        gpu_trial(&device, "plain_strings_of_every_length", plain_strings_of_every_length),
    ])
}

/// Reads `path` with gpq (with `options`) and asserts it equals arrow-rs.
fn assert_same(path: &Path, options: &ReadOptions) -> RecordBatch {
    let expected = arrow_rs(path).unwrap_or_else(|e| panic!("arrow-rs cannot read {}: {e}", path.display()));
    let table = read_parquet_to_device(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let got = table.to_record_batch().unwrap();
    common::assert_batches_equal(&path.display().to_string(), &expected, &got);
    assert_eq!(got.schema().fields(), expected.schema().fields(), "{}: fields", path.display());
    got
}

/// INT96 values chosen to hit every corner of arrow-rs's conversion: Julian
/// days that are negative as an i32, 0, around the epoch and up to
/// `u32::MAX`; nanoseconds of the day that are negative as an i64, past a
/// day, or huge; plus random words.
fn int96_values(rows: usize) -> Vec<Int96> {
    let days: [u32; 12] = [0, 1, 2_440_587, 2_440_588, 2_440_589, 2_299_160, 2_784_600, 0x7fff_ffff, 0x8000_0000, 0xffff_fffe, 0xffff_ffff, 0x1234_5678];
    let nanos: [u64; 12] = [
        0,
        1,
        999_999_999,
        1_000_000_000,
        86_399_999_999_999,
        86_400_000_000_000,
        i64::MAX as u64,
        1 << 63,
        (1 << 63) + 1_000_000_001,
        u64::MAX,
        u64::MAX - 999_999_999,
        0x0123_4567_89ab_cdef,
    ];
    let mut out = Vec::with_capacity(rows);
    for &d in &days {
        for &n in &nanos {
            let mut v = Int96::new();
            v.set_data(n as u32, (n >> 32) as u32, d);
            out.push(v);
        }
    }
    let mut r = Rng::new(96);
    while out.len() < rows {
        let mut v = Int96::new();
        v.set_data(r.next() as u32, r.next() as u32, r.next() as u32);
        out.push(v);
    }
    out
}

/// A file of INT96 columns written with the parquet crate's column writer:
/// one required and one nullable column per time unit, the unit given by an
/// embedded Arrow schema (as Spark files read with a microsecond hint are).
fn write_int96(path: &Path, rows: usize, v2: bool) {
    let units = [("s", TimeUnit::Second), ("ms", TimeUnit::Millisecond), ("us", TimeUnit::Microsecond), ("ns", TimeUnit::Nanosecond)];
    let mut message = String::from("message int96 {");
    let mut fields = Vec::new();
    for (name, unit) in &units {
        message += &format!(" required int96 req_{name}; optional int96 opt_{name};");
        fields.push(Field::new(format!("req_{name}"), DataType::Timestamp(*unit, None), false));
        fields.push(Field::new(format!("opt_{name}"), DataType::Timestamp(*unit, None), true));
    }
    message += " }";
    let schema = Arc::new(parse_message_type(&message).unwrap());
    let arrow_schema = Schema::new(fields);
    let props = WriterProperties::builder()
        .set_writer_version(if v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        .set_dictionary_enabled(!v2)
        .set_data_page_row_count_limit(50)
        .set_write_batch_size(25)
        .set_key_value_metadata(Some(vec![KeyValue::new("ARROW:schema".into(), encode_arrow_schema(&arrow_schema))]))
        .build();
    let values = int96_values(rows);
    let defs: Vec<i16> = (0..rows).map(|i| i16::from(i % 5 != 3)).collect();
    let present: Vec<Int96> = values.iter().zip(&defs).filter(|(_, d)| **d == 1).map(|(v, _)| *v).collect();
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    let mut rg = w.next_row_group().unwrap();
    for k in 0..2 * units.len() {
        let mut col = rg.next_column().unwrap().unwrap();
        match col.untyped() {
            ColumnWriter::Int96ColumnWriter(cw) => {
                if k % 2 == 0 {
                    cw.write_batch(&values, None, None).unwrap();
                } else {
                    cw.write_batch(&present, Some(&defs), None).unwrap();
                }
            }
            _ => unreachable!("every column is INT96"),
        }
        col.close().unwrap();
    }
    rg.close().unwrap();
    w.close().unwrap();
}

fn int96_matches_arrow_rs_bit_for_bit(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for v2 in [false, true] {
        let path = dir.path().join(format!("int96_v{}.parquet", if v2 { 2 } else { 1 }));
        write_int96(&path, 400, v2);
        let got = assert_same(&path, &ReadOptions::new());
        assert_eq!(got.num_rows(), 400);
        // The corners are there: arrow-rs wraps, so some nanosecond values are negative.
        let ns = got.column_by_name("req_ns").unwrap().as_any().downcast_ref::<arrow::array::TimestampNanosecondArray>().unwrap();
        assert!(ns.values().iter().any(|&v| v < 0) && ns.values().iter().any(|&v| v > 0));
    }
}

/// Hands pages on to the parquet crate's page writer, giving every v2 data
/// page repetition levels although the column is flat, as the writer of
/// parquet-testing's `rle_boolean_encoding.parquet` does: one RLE run of
/// `num_values` zeros at bit width 0, in front of the definition levels.
struct WithRepLevels<'a>(SerializedPageWriter<'a, std::fs::File>);

impl PageWriter for WithRepLevels<'_> {
    fn write_page(&mut self, page: CompressedPage) -> parquet::errors::Result<PageWriteSpec> {
        let size = page.uncompressed_size();
        let page = match page.compressed_page().clone() {
            Page::DataPageV2 { buf, num_values, encoding, num_nulls, num_rows, def_levels_byte_len, rep_levels_byte_len: 0, is_compressed, statistics } => {
                // ULEB128 of the run header (count << 1: an RLE run); bit width 0 means no value bytes.
                let mut levels = Vec::new();
                let mut header = u64::from(num_values) << 1;
                while header >= 0x80 {
                    levels.push(header as u8 | 0x80);
                    header >>= 7;
                }
                levels.push(header as u8);
                let rep_levels_byte_len = levels.len() as u32;
                levels.extend_from_slice(&buf);
                let page = Page::DataPageV2 {
                    buf: levels.into(),
                    num_values,
                    encoding,
                    num_nulls,
                    num_rows,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    is_compressed,
                    statistics,
                };
                CompressedPage::new(page, size + rep_levels_byte_len as usize)
            }
            _ => page,
        };
        self.0.write_page(page)
    }

    fn close(&mut self) -> parquet::errors::Result<()> {
        self.0.close()
    }
}

/// Appends a column chunk written to a file of its own (through a page writer
/// of the test's) to the row group, and removes the file.
fn append_chunk(
    rg: &mut parquet::file::writer::SerializedRowGroupWriter<'_, std::fs::File>,
    sink: TrackedWrite<std::fs::File>,
    chunk_path: &Path,
    close: parquet::column::writer::ColumnCloseResult,
) {
    sink.into_inner().unwrap().sync_all().unwrap();
    rg.append_column(&std::fs::File::open(chunk_path).unwrap(), close).unwrap();
    std::fs::remove_file(chunk_path).unwrap();
}

/// Writes BOOLEAN columns (nullable, required, nullable in long runs) and a
/// nullable INT32 and string column with the parquet crate's column writers,
/// in small pages and two row groups; `encoding` for the booleans, and, with
/// `rep_levels`, repetition levels in every v2 page ([`WithRepLevels`]).
/// Returns the number of rows.
fn write_booleans(path: &Path, v2: bool, encoding: Encoding, codec: Compression, rep_levels: bool) -> usize {
    let schema = Arc::new(
        parse_message_type(
            "message bools { optional boolean opt; required boolean req; optional boolean runs; optional int32 n; optional binary s (UTF8); }",
        )
        .unwrap(),
    );
    let mut b = WriterProperties::builder()
        .set_compression(codec)
        .set_writer_version(if v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        .set_dictionary_enabled(false)
        .set_data_page_row_count_limit(120)
        .set_write_batch_size(37);
    for name in ["opt", "req", "runs"] {
        b = b.set_column_encoding(ColumnPath::from(name), encoding);
    }
    for name in ["n", "s"] {
        b = b.set_column_encoding(ColumnPath::from(name), Encoding::PLAIN);
    }
    let props = Arc::new(b.build());
    let descr = Arc::new(parquet::schema::types::SchemaDescriptor::new(schema.clone()));
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props.clone()).unwrap();
    let mut r = Rng::new(7);
    let mut rows = 0;
    for rg_rows in [1_013usize, 389] {
        let mut rg = w.next_row_group().unwrap();
        for ci in 0..descr.num_columns() {
            // Definition levels (1: present) per row; values of the present rows.
            let defs: Vec<i16> = (0..rg_rows)
                .map(|i| match ci {
                    1 => 1,
                    2 => i16::from((i / 100) % 3 != 2),
                    _ => i16::from(r.below(6) != 0),
                })
                .collect();
            let present = defs.iter().filter(|&&d| d == 1).count();
            let bools: Vec<bool> = (0..present)
                .map(|i| match ci {
                    1 => (i / 40) % 2 == 0 || r.below(5) == 0,
                    2 => (i / 67) % 2 == 0,
                    _ => i % 3 == 0 || r.below(9) == 0,
                })
                .collect();
            let defs = if ci == 1 { None } else { Some(defs.as_slice()) };
            // Each chunk is written to a file of its own first, through WithRepLevels.
            let chunk_path = path.with_extension(format!("chunk{ci}"));
            let mut sink = TrackedWrite::new(std::fs::File::create(&chunk_path).unwrap());
            let close = {
                let pages = SerializedPageWriter::new(&mut sink);
                let pages: Box<dyn PageWriter> = if rep_levels { Box::new(WithRepLevels(pages)) } else { Box::new(pages) };
                match get_column_writer(descr.column(ci), props.clone(), pages) {
                    ColumnWriter::BoolColumnWriter(mut cw) => {
                        cw.write_batch(&bools, defs, None).unwrap();
                        cw.close().unwrap()
                    }
                    ColumnWriter::Int32ColumnWriter(mut cw) => {
                        let v: Vec<i32> = (0..present).map(|_| r.next() as i32).collect();
                        cw.write_batch(&v, defs, None).unwrap();
                        cw.close().unwrap()
                    }
                    ColumnWriter::ByteArrayColumnWriter(mut cw) => {
                        let v: Vec<ByteArray> = (0..present).map(|i| ByteArray::from(format!("s{}", i * 7).as_str())).collect();
                        cw.write_batch(&v, defs, None).unwrap();
                        cw.close().unwrap()
                    }
                    _ => unreachable!("the schema has BOOLEAN, INT32 and BYTE_ARRAY columns"),
                }
            };
            append_chunk(&mut rg, sink, &chunk_path, close);
        }
        rg.close().unwrap();
        rows += rg_rows;
    }
    w.close().unwrap();
    rows
}

/// BOOLEAN columns RLE-encoded (and PLAIN) in v1 and v2 pages, nullable and
/// required, several pages per chunk; v2 pages also with the repetition
/// levels some writers store for flat columns (once "definition level out of
/// range").
fn rle_booleans_v1_and_v2(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for v2 in [false, true] {
        for rep_levels in if v2 { vec![false, true] } else { vec![false] } {
            for encoding in [Encoding::RLE, Encoding::PLAIN] {
                for codec in [Compression::UNCOMPRESSED, Compression::SNAPPY] {
                    let name = format!("bool_v{}_{encoding}_{codec}_{}.parquet", if v2 { 2 } else { 1 }, if rep_levels { "rep" } else { "norep" });
                    let path = dir.path().join(name.replace(['(', ')'], ""));
                    let rows = write_booleans(&path, v2, encoding, codec, rep_levels);
                    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
                    let md = reader.metadata();
                    assert!(md.row_group(0).column(0).encodings().any(|e| e == encoding), "{}", path.display());
                    assert!(md.row_group(0).column(0).num_values() > 120, "{}: a chunk of several pages", path.display());
                    let got = assert_same(&path, &ReadOptions::new());
                    assert_eq!(got.num_rows(), rows);
                    // One column alone, and one row group alone.
                    assert_same_projection(&path, "runs", 1);
                }
            }
        }
    }
}

/// Reads column `name` of row group `rg` and compares it with arrow-rs's.
fn assert_same_projection(path: &Path, name: &str, rg: usize) {
    use arrow::array::RecordBatchReader;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let mask = parquet::arrow::ProjectionMask::columns(builder.parquet_schema(), [name]);
    let reader = builder.with_projection(mask).with_row_groups(vec![rg]).build().unwrap();
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>().unwrap();
    let expected = arrow::compute::concat_batches(&schema, &batches).unwrap();
    let got = read_parquet_to_device(path, &ReadOptions::new().with_columns([name]).with_row_groups([rg]))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_record_batch()
        .unwrap();
    common::assert_batches_equal(&format!("{} ({name}, row group {rg})", path.display()), &expected, &got);
}

/// Files of other writers, from apache/parquet-testing (`testdata/README.md`):
/// Spark's INT96 timestamps past the nanosecond range, and a v2 page of RLE
/// booleans that carries repetition levels for a flat column.
fn files_from_other_writers(_ctx: &Arc<GpuContext>) {
    for (name, rows) in [("int96_from_spark.parquet", 6), ("rle_boolean_encoding.parquet", 68)] {
        let got = assert_same(&testdata(name), &ReadOptions::new());
        assert_eq!(got.num_rows(), rows, "{name}");
    }
}

/// pyarrow's file for `table.slice(0, 0)`: one row group of 0 rows whose
/// chunks are empty dictionary pages or nothing at all (offset 0, 0 bytes).
fn pyarrow_empty_table(_ctx: &Arc<GpuContext>) {
    let path = testdata("pyarrow_empty_table.parquet");
    let got = assert_same(&path, &ReadOptions::new());
    assert_eq!(got.num_rows(), 0);
    let schema = got.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "name", "flag", "price", "ts"]);
    // A projection, and the row group asked for by number.
    let one = read_parquet_to_device(&path, &ReadOptions::new().with_columns(["flag"]).with_row_groups([0])).unwrap();
    assert_eq!((one.num_rows(), one.to_record_batch().unwrap().num_columns()), (0, 1));
}

/// Zero-row row groups between full ones and at the end: pyarrow's (an
/// empty table written between two others) and the parquet crate's, with and
/// without dictionaries.
fn zero_row_row_groups(_ctx: &Arc<GpuContext>) {
    let path = testdata("pyarrow_middle_empty_row_group.parquet");
    let got = assert_same(&path, &ReadOptions::new());
    assert_eq!(got.num_rows(), 6);
    for rg in 0..3 {
        let t = read_parquet_to_device(&path, &ReadOptions::new().with_row_groups([rg])).unwrap();
        assert_eq!(t.num_rows(), if rg == 1 { 0 } else { 3 }, "row group {rg}");
    }

    let dir = tempfile::tempdir().unwrap();
    for dictionary in [false, true] {
        let path = dir.path().join(format!("empty_row_groups_{dictionary}.parquet"));
        let schema = Arc::new(parse_message_type("message t { required int64 id; optional binary name (UTF8); }").unwrap());
        let props = WriterProperties::builder().set_dictionary_enabled(dictionary).build();
        let mut w = SerializedFileWriter::new(std::fs::File::create(&path).unwrap(), schema, Arc::new(props)).unwrap();
        for rows in [10usize, 0, 10, 0] {
            let ids: Vec<i64> = (0..rows as i64).collect();
            let defs: Vec<i16> = (0..rows).map(|i| i16::from(i % 3 != 0)).collect();
            let names: Vec<ByteArray> = (0..rows).filter(|i| i % 3 != 0).map(|i| ByteArray::from(format!("n{i}").as_str())).collect();
            let mut rg = w.next_row_group().unwrap();
            while let Some(mut col) = rg.next_column().unwrap() {
                match col.untyped() {
                    ColumnWriter::Int64ColumnWriter(cw) => cw.write_batch(&ids, None, None).unwrap(),
                    ColumnWriter::ByteArrayColumnWriter(cw) => cw.write_batch(&names, Some(&defs), None).unwrap(),
                    _ => unreachable!("the schema has INT64 and BYTE_ARRAY columns"),
                };
                col.close().unwrap();
            }
            rg.close().unwrap();
        }
        w.close().unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let rows: Vec<i64> = reader.metadata().row_groups().iter().map(|rg| rg.num_rows()).collect();
        assert_eq!(rows, [10, 0, 10, 0], "{}", path.display());
        let got = assert_same(&path, &ReadOptions::new());
        assert_eq!(got.num_rows(), 20);
        let t = read_parquet_to_device(&path, &ReadOptions::new().with_row_groups([3, 1])).unwrap();
        assert_eq!(t.num_rows(), 0);
    }
}

/// Page CRCs (parquet-testing's checksum files, written by parquet-mr): with
/// `verify_page_checksums` the files whose CRCs match read as arrow-rs reads
/// them, every page checked; the two with a wrong CRC fail with
/// `ChecksumMismatch` naming a page, and read as usual without the option.
fn page_checksums_verified_on_request(_ctx: &Arc<GpuContext>) {
    let Some(dir) = common::parquet_testing_dir() else { return };
    let verify = ReadOptions::new().with_page_checksums(true);
    for name in [
        "datapage_v1-uncompressed-checksum.parquet",
        "datapage_v1-snappy-compressed-checksum.parquet",
        "plain-dict-uncompressed-checksum.parquet",
        "rle-dict-snappy-checksum.parquet",
    ] {
        let path = dir.join(name);
        assert_same(&path, &verify);
        let t = read_parquet_to_device(&path, &verify).unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let chunks: usize = reader.metadata().row_groups().iter().map(|rg| rg.num_columns()).sum();
        assert!(t.stats().checksummed_pages >= chunks, "{name}: {} pages checked in {chunks} chunks", t.stats().checksummed_pages);
        assert!(t.stats().summary().contains("page checksums verified"), "{name}: {}", t.stats().summary());
        let unchecked = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
        assert_eq!(unchecked.stats().checksummed_pages, 0, "{name}: checked without being asked");
    }
    for name in ["datapage_v1-corrupt-checksum.parquet", "rle-dict-uncompressed-corrupt-checksum.parquet"] {
        let path = dir.join(name);
        match read_parquet_to_device(&path, &verify) {
            Err(gpq::Error::CorruptPage { kind: gpq::CorruptKind::ChecksumMismatch, column, detail, .. }) => {
                assert!(!column.is_empty() && detail.contains("CRC-32"), "{name}: {column} {detail}");
            }
            other => panic!("{name}: expected a checksum mismatch, got {:?}", other.map(|t| t.num_rows())),
        }
        assert_same(&path, &ReadOptions::new());
    }
    // A file without checksums reads the same with the option on.
    let plain = dir.join("alltypes_plain.parquet");
    let t = read_parquet_to_device(&plain, &verify).unwrap();
    assert_eq!(t.stats().checksummed_pages, 0);
    assert_same(&plain, &verify);
}

/// INTERVAL columns (FIXED_LEN_BYTE_ARRAY(12): months, days, milliseconds)
/// as arrow-rs's writer stores year-month and day-time intervals, nullable
/// and not, PLAIN, dictionary and BYTE_STREAM_SPLIT, v1 and v2 pages.
fn intervals_match_arrow_rs(_ctx: &Arc<GpuContext>) {
    use arrow::array::{IntervalDayTimeArray, IntervalYearMonthArray};
    use arrow::datatypes::{IntervalDayTime, IntervalUnit};
    let rows = 3000;
    let mut rng = Rng::new(11);
    let ym: IntervalYearMonthArray = (0..rows).map(|i| (i % 7 != 3).then(|| (rng.next() as i32) % 500)).collect();
    let dt: IntervalDayTimeArray =
        (0..rows).map(|i| (i % 5 != 1).then(|| IntervalDayTime::new((rng.next() % 40) as i32 - 20, rng.next() as i32))).collect();
    let dt_required: IntervalDayTimeArray = (0..rows).map(|i| Some(IntervalDayTime::new(i as i32, -(i as i32) * 1000))).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("ym", DataType::Interval(IntervalUnit::YearMonth), true),
        Field::new("dt", DataType::Interval(IntervalUnit::DayTime), true),
        Field::new("dt_required", DataType::Interval(IntervalUnit::DayTime), false),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ym), Arc::new(dt), Arc::new(dt_required)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, (version, encoding)) in [
        (WriterVersion::PARQUET_1_0, None),
        (WriterVersion::PARQUET_2_0, None),
        (WriterVersion::PARQUET_1_0, Some(Encoding::PLAIN)),
        (WriterVersion::PARQUET_2_0, Some(Encoding::BYTE_STREAM_SPLIT)),
    ]
    .into_iter()
    .enumerate()
    {
        let mut props = WriterProperties::builder().set_writer_version(version).set_data_page_row_count_limit(700).set_write_batch_size(700);
        if let Some(e) = encoding {
            props = props.set_dictionary_enabled(false).set_encoding(e);
        }
        let path = dir.path().join(format!("intervals_{i}.parquet"));
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), Some(props.build())).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let got = assert_same(&path, &ReadOptions::new());
        assert_eq!(got.schema().field(1).data_type(), &DataType::Interval(IntervalUnit::DayTime));
    }
}

/// Utf8View and BinaryView columns (flat, in a struct and in a list), as
/// the embedded Arrow schema asks for them: the device builds the views
/// (the column's device type is the view type and the characters are its
/// view data, no host cast), and both host copies equal arrow-rs's arrays.
fn string_views_built_on_the_device(_ctx: &Arc<GpuContext>) {
    use arrow::array::{ArrayRef, BinaryViewArray, ListArray, StringViewArray, StructArray};
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::Fields;
    let rows = 5000usize;
    let mut rng = Rng::new(5);
    let mut text = |i: usize| -> Option<String> {
        let len = [0usize, 1, 4, 11, 12, 13, 40][rng.below(7) as usize];
        (i % 9 != 4).then(|| (0..len).map(|k| char::from(b'a' + ((i + k) % 26) as u8)).collect())
    };
    let s: StringViewArray = (0..rows).map(&mut text).collect();
    let b: BinaryViewArray = (0..rows).map(|i| text(i).map(String::into_bytes)).collect();
    let inner: StringViewArray = (0..3 * rows).map(&mut text).collect();
    let item = Arc::new(Field::new("item", DataType::Utf8View, true));
    let offsets = OffsetBuffer::from_lengths((0..rows).map(|i| [0usize, 3, 6][i % 3]));
    let list = ListArray::new(item, offsets, Arc::new(inner), None);
    let fields = Fields::from(vec![Field::new("sv", DataType::Utf8View, true)]);
    let member: StringViewArray = (0..rows).map(&mut text).collect();
    let strukt = StructArray::new(fields, vec![Arc::new(member) as ArrayRef], None);
    let batch = RecordBatch::try_from_iter(vec![
        ("s", Arc::new(s) as ArrayRef),
        ("b", Arc::new(b) as ArrayRef),
        ("l", Arc::new(list) as ArrayRef),
        ("st", Arc::new(strukt) as ArrayRef),
    ])
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, version) in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0].into_iter().enumerate() {
        let path = dir.path().join(format!("views_{i}.parquet"));
        let props = WriterProperties::builder().set_writer_version(version).set_data_page_row_count_limit(600).set_write_batch_size(600).build();
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let got = assert_same(&path, &ReadOptions::new());
        assert_eq!(got.column(0).data_type(), &DataType::Utf8View);
        let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
        let s = table.column_by_name("s").unwrap();
        assert_eq!(s.device_type(), &DataType::Utf8View, "views are built on the device");
        assert!(s.view_data().is_some() && s.offsets().is_none());
        assert_eq!(s.values().len(), 16 * rows as u64);
        assert_eq!(table.column_by_name("b").unwrap().device_type(), &DataType::BinaryView);
        let l = table.column_by_name("l").unwrap();
        assert_eq!(l.children()[0].device_type(), &DataType::Utf8View, "list element views");
        assert!(matches!(l.device_type(), DataType::List(f) if f.data_type() == &DataType::Utf8View));
        let pinned = table.to_record_batch_pinned().unwrap();
        common::assert_batches_equal(&format!("{} (pinned copy)", path.display()), &got, &pinned);
    }
}

/// Rewrites the RLE levels of uncompressed v1 data pages as the deprecated
/// BIT_PACKED encoding (no length prefix, `bit width` bits per level, least
/// significant bit first as arrow-rs reads them), from the levels the column
/// was written with.
struct WithBitPackedLevels<'a> {
    inner: SerializedPageWriter<'a, std::fs::File>,
    reps: Vec<i16>,
    defs: Vec<i16>,
    max_rep: i16,
    max_def: i16,
    cursor: usize,
}

fn bit_packed(levels: &[i16], max: i16) -> Vec<u8> {
    let bw = (16 - (max as u16).leading_zeros()) as usize;
    let mut out = vec![0u8; (levels.len() * bw).div_ceil(8)];
    for (i, &l) in levels.iter().enumerate() {
        for b in 0..bw {
            if (l >> b) & 1 == 1 {
                let bit = i * bw + b;
                out[bit / 8] |= 1 << (bit % 8);
            }
        }
    }
    out
}

impl PageWriter for WithBitPackedLevels<'_> {
    fn write_page(&mut self, page: CompressedPage) -> parquet::errors::Result<PageWriteSpec> {
        let page = match page.compressed_page().clone() {
            Page::DataPage { buf, num_values, encoding, statistics, .. } => {
                let n = num_values as usize;
                let mut pos = 0;
                for max in [self.max_rep, self.max_def] {
                    if max > 0 {
                        pos += 4 + u32::from_le_bytes(buf[pos..pos + 4].try_into().unwrap()) as usize;
                    }
                }
                let mut out = Vec::new();
                if self.max_rep > 0 {
                    out.extend(bit_packed(&self.reps[self.cursor..self.cursor + n], self.max_rep));
                }
                if self.max_def > 0 {
                    out.extend(bit_packed(&self.defs[self.cursor..self.cursor + n], self.max_def));
                }
                out.extend_from_slice(&buf[pos..]);
                self.cursor += n;
                let len = out.len();
                #[allow(deprecated)]
                let packed = Encoding::BIT_PACKED;
                let page = Page::DataPage {
                    buf: out.into(),
                    num_values,
                    encoding,
                    def_level_encoding: if self.max_def > 0 { packed } else { Encoding::RLE },
                    rep_level_encoding: if self.max_rep > 0 { packed } else { Encoding::RLE },
                    statistics,
                };
                CompressedPage::new(page, len)
            }
            _ => page,
        };
        self.inner.write_page(page)
    }

    fn close(&mut self) -> parquet::errors::Result<()> {
        self.inner.close()
    }
}

/// v1 pages whose definition and repetition levels use the deprecated
/// BIT_PACKED encoding: a nullable INT32, a nullable string and a nullable
/// list of nullable INT32 (levels up to 3, so 2-bit levels), several pages
/// per chunk, compared with arrow-rs.
fn bit_packed_levels_match_arrow_rs(_ctx: &Arc<GpuContext>) {
    let schema = Arc::new(
        parse_message_type(
            "message t { optional int32 n; optional binary s (UTF8); optional group l (LIST) { repeated group list { optional int32 element; } } }",
        )
        .unwrap(),
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_1_0)
            .set_dictionary_enabled(false)
            .set_encoding(Encoding::PLAIN)
            .set_data_page_row_count_limit(90)
            .set_write_batch_size(31)
            .build(),
    );
    let descr = Arc::new(parquet::schema::types::SchemaDescriptor::new(schema.clone()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bit_packed_levels.parquet");
    let mut w = SerializedFileWriter::new(std::fs::File::create(&path).unwrap(), schema, props.clone()).unwrap();
    let mut r = Rng::new(3);
    let rows = 700usize;
    let mut rg = w.next_row_group().unwrap();
    for ci in 0..descr.num_columns() {
        let (mut defs, mut reps) = (Vec::new(), Vec::new());
        if ci < 2 {
            defs = (0..rows).map(|_| i16::from(r.below(5) != 0)).collect();
        } else {
            for _ in 0..rows {
                match r.below(6) {
                    // A null list, an empty list, or elements (some null).
                    kind @ (0 | 1) => {
                        defs.push(kind as i16);
                        reps.push(0);
                    }
                    _ => {
                        for k in 0..=r.below(4) {
                            defs.push(if r.below(4) == 0 { 2 } else { 3 });
                            reps.push(i16::from(k > 0));
                        }
                    }
                }
            }
        }
        let max_def = descr.column(ci).max_def_level();
        let present = defs.iter().filter(|&&d| d == max_def).count();
        let chunk_path = path.with_extension(format!("chunk{ci}"));
        let mut sink = TrackedWrite::new(std::fs::File::create(&chunk_path).unwrap());
        let close = {
            let pages = WithBitPackedLevels {
                inner: SerializedPageWriter::new(&mut sink),
                reps: reps.clone(),
                defs: defs.clone(),
                max_rep: descr.column(ci).max_rep_level(),
                max_def,
                cursor: 0,
            };
            let reps = (!reps.is_empty()).then_some(reps.as_slice());
            match get_column_writer(descr.column(ci), props.clone(), Box::new(pages)) {
                ColumnWriter::Int32ColumnWriter(mut cw) => {
                    let v: Vec<i32> = (0..present).map(|_| r.next() as i32).collect();
                    cw.write_batch(&v, Some(&defs), reps).unwrap();
                    cw.close().unwrap()
                }
                ColumnWriter::ByteArrayColumnWriter(mut cw) => {
                    let v: Vec<ByteArray> = (0..present).map(|i| ByteArray::from(format!("v{}", i * 3).as_str())).collect();
                    cw.write_batch(&v, Some(&defs), reps).unwrap();
                    cw.close().unwrap()
                }
                _ => unreachable!("the schema has INT32 and BYTE_ARRAY leaves"),
            }
        };
        append_chunk(&mut rg, sink, &chunk_path, close);
    }
    rg.close().unwrap();
    w.close().unwrap();
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    #[allow(deprecated)]
    let packed = Encoding::BIT_PACKED;
    let mut pages = reader.get_row_group(0).unwrap().get_column_page_reader(2).unwrap();
    let mut data_pages = 0;
    while let Some(page) = pages.get_next_page().unwrap() {
        if let Page::DataPage { def_level_encoding, rep_level_encoding, .. } = page {
            assert_eq!((def_level_encoding, rep_level_encoding), (packed, packed), "the list's levels are BIT_PACKED");
            data_pages += 1;
        }
    }
    assert!(data_pages > 1, "the list spans pages");
    let got = assert_same(&path, &ReadOptions::new());
    assert_eq!(got.num_rows(), rows);
}

/// PLAIN strings (dictionary off) whose lengths change every few batches:
/// empty and one-to-three-byte values (more values than one window of the
/// block-wide walk holds), values longer than the window, medium and mixed
/// lengths (the walk switches between the block and thread 0), with nulls,
/// in small and large pages, v1 and v2; and a dictionary of all of them that
/// overflows into PLAIN pages (dictionary pages are indexed by the same
/// walk). Then one value's length prefix is set past the page's end: both
/// readers must refuse the file.
fn plain_strings_of_every_length(_ctx: &Arc<GpuContext>) {
    use arrow::array::{ArrayRef, StringArray};
    let rows = 16_000usize;
    let mut rng = Rng::new(11);
    let values: StringArray = (0..rows)
        .map(|i| {
            let len = match (i / 1500) % 5 {
                0 => rng.below(4) as usize,
                1 => 1000 + rng.below(1500) as usize,
                2 => rng.below(120) as usize,
                3 => [0usize, 1, 2, 3, 700][rng.below(5) as usize],
                _ => 30 + rng.below(40) as usize,
            };
            (i % 7 != 3).then(|| (0..len).map(|k| char::from(b'a' + ((i * 7 + k) % 26) as u8)).collect::<String>())
        })
        .collect();
    let batch = RecordBatch::try_from_iter(vec![("s", Arc::new(values) as ArrayRef)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, (version, page, dictionary)) in [
        (WriterVersion::PARQUET_1_0, 1 << 20, false),
        (WriterVersion::PARQUET_2_0, 1 << 20, false),
        (WriterVersion::PARQUET_1_0, 9_000, false),
        (WriterVersion::PARQUET_2_0, 9_000, false),
        (WriterVersion::PARQUET_1_0, 1 << 20, true),
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("plain_{i}.parquet"));
        let mut props = WriterProperties::builder().set_writer_version(version).set_dictionary_enabled(dictionary);
        if !dictionary {
            props = props.set_encoding(Encoding::PLAIN);
        }
        let props = props
            .set_compression(Compression::UNCOMPRESSED)
            .set_data_page_size_limit(page)
            .set_write_batch_size(64)
            .build();
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        assert_same(&path, &ReadOptions::new());
    }
    // A length prefix pointing past the page: a short value in the middle of
    // the first run of short values (the block-wide walk finds it).
    let path = dir.path().join("plain_0.parquet");
    let mut bytes = std::fs::read(&path).unwrap();
    let target = batch.column(0).as_any().downcast_ref::<StringArray>().unwrap();
    let row = (700..1400).find(|&r| target.is_valid(r) && target.value(r).len() == 3).expect("a 3-byte value");
    let needle: Vec<u8> = [&3u32.to_le_bytes()[..], target.value(row).as_bytes()].concat();
    let start = 4 + bytes[4..].windows(needle.len()).position(|w| w == needle.as_slice()).expect("the value in the file");
    bytes[start..start + 4].copy_from_slice(&0x00ff_ffffu32.to_le_bytes());
    let bad = dir.path().join("plain_bad.parquet");
    std::fs::write(&bad, &bytes).unwrap();
    assert!(arrow_rs(&bad).is_err(), "arrow-rs reads the broken file");
    match read_parquet_to_device(&bad, &ReadOptions::new()) {
        Err(gpq::Error::CorruptPage { column, .. }) => assert_eq!(column, "s"),
        other => panic!("expected a corrupt page, got {:?}", other.map(|t| t.num_rows())),
    }
}
