//! Differential tests of the decode stage: gpq's device columns, copied back,
//! must equal what arrow-rs reads from the same file, value for value and
//! type for type, and the read must report the paths it took. Runs on a GPU,
//! or on the CPU emulator in builds with the `emulator` feature (smaller
//! sizes there); reported as ignored otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::*;
use common::{Nulls, Rng, arrow_rs, gpu_trial, probe_device, run_trials};
use gpq::arrow::PinnedHostPool;
use gpq::cuda::GpuContext;
use gpq::{DecompressMode, DeviceDecoder, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, GzipLevel, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnPath;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "matrix_matches_arrow_rs", matrix_matches_arrow_rs),
        gpu_trial(&device, "cpu_decompression_fallback_matches", cpu_decompression_fallback_matches),
        gpu_trial(&device, "large_pages_go_to_the_cpu_by_default", large_pages_go_to_the_cpu_by_default),
        gpu_trial(&device, "projections_and_row_groups", projections_and_row_groups),
        gpu_trial(&device, "pinned_copies_return_and_reuse_their_slab", pinned_copies_return_and_reuse_their_slab),
        gpu_trial(&device, "staged_copies_in_chunks_match_whole_copies", staged_copies_in_chunks_match_whole_copies),
        gpu_trial(&device, "empty_and_single_row_files", empty_and_single_row_files),
        gpu_trial(&device, "tpch_tables_match", tpch_tables_match),
        gpu_trial(&device, "parquet_testing_files", parquet_testing_files),
        gpu_trial(&device, "kernels_come_prebuilt", kernels_come_prebuilt),
        gpu_trial(&device, "overlapped_groups_read_what_one_group_reads", overlapped_groups),
        gpu_trial(&device, "string_views_on_request", string_views_on_request),
        gpu_trial(&device, "plain_values_that_read_as_lengths", plain_values_that_read_as_lengths),
    ])
}

fn assert_batches_equal(path: &Path, expected: &RecordBatch, got: &RecordBatch) {
    common::assert_batches_equal(&path.display().to_string(), expected, got);
}

/// Reads `path` with gpq and asserts it equals arrow-rs, through both host
/// copies, and that the page count matches the parquet crate's.
fn assert_same(path: &Path, options: &ReadOptions) -> gpq::DeviceTable {
    let expected = arrow_rs(path).unwrap_or_else(|e| panic!("arrow-rs cannot read {}: {e}", path.display()));
    let table = read_parquet_to_device(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let got = table.to_record_batch().unwrap();
    assert_batches_equal(path, &expected, &got);
    let (pinned, _) = table.to_record_batch_staged().unwrap();
    assert_batches_equal(path, &expected, &pinned);
    assert_eq!(table.stats().pages, parquet_pages(path), "{}: pages decoded", path.display());
    table
}

/// Data and dictionary pages of every column chunk, as the parquet crate's
/// page reader sees them.
fn parquet_pages(path: &Path) -> usize {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut pages = 0;
    for rg in 0..reader.num_row_groups() {
        let group = reader.get_row_group(rg).unwrap();
        for col in 0..group.num_columns() {
            pages += group.get_column_page_reader(col).unwrap().map(|p| p.unwrap()).count();
        }
    }
    pages
}

/// Whether this device run must decompress on the GPU (the device script
/// stages nvCOMP and sets GPQ_REQUIRE_NVCOMP=1); otherwise nvCOMP is used
/// where it loads.
fn nvcomp_expected(ctx: &GpuContext) -> bool {
    if ctx.is_emulated() {
        return false;
    }
    let required = std::env::var("GPQ_REQUIRE_NVCOMP").is_ok_and(|v| v == "1");
    match gpq::decode::nvcomp_version() {
        Ok(v) => {
            eprintln!("nvCOMP {v}");
            true
        }
        Err(e) if required => panic!("GPQ_REQUIRE_NVCOMP=1 but nvCOMP is not usable: {e}"),
        Err(e) => {
            eprintln!("NOTE: nvCOMP is not usable here ({e}); compressed pages go to the CPU");
            false
        }
    }
}

/// Whether ZSTD and GZIP pages should go to nvCOMP in the worker process:
/// where nvCOMP is expected and the worker is found (the device scripts
/// stage it; with GPQ_REQUIRE_NVCOMP=1 it must be there).
fn worker_expected(ctx: &GpuContext) -> bool {
    if !nvcomp_expected(ctx) {
        return false;
    }
    match gpq::decode::nvcomp_worker_path() {
        Ok(_) => true,
        Err(e) if std::env::var("GPQ_REQUIRE_NVCOMP").is_ok_and(|v| v == "1") => panic!("GPQ_REQUIRE_NVCOMP=1 but {e}"),
        Err(e) => {
            eprintln!("NOTE: {e}; ZSTD and GZIP pages go to the CPU");
            false
        }
    }
}

/// Asserts which decompressor handled a file of `codec` by default. ZSTD
/// pages go to gpq's own checked decoder on the device (the emulator's
/// too); SNAPPY and LZ4_RAW pages to nvCOMP behind the device check (gpq's
/// SNAPPY decoder only where asked for); GZIP pages cannot be checked
/// completely on the device, so they go to nvCOMP in the worker process, or
/// to the CPU where there is none.
fn assert_decompression(ctx: &GpuContext, codec: Compression, stats: &gpq::DecompressStats) {
    let nvcomp_codec = matches!(codec, Compression::SNAPPY | Compression::LZ4_RAW);
    let own_zstd = matches!(codec, Compression::ZSTD(_));
    let isolated_codec = matches!(codec, Compression::GZIP(_));
    // By default a batch of few large pages goes to the CPU, where it is
    // estimated faster (`large_pages_go_to_the_cpu_by_default`).
    let routed = stats.fallback.as_deref().is_some_and(|f| f.contains("estimated faster on the CPU"));
    match codec {
        _ if routed && (nvcomp_codec && nvcomp_expected(ctx) || isolated_codec && worker_expected(ctx) || own_zstd) => {
            assert!(stats.cpu_pages > 0, "{codec:?}: routed to the CPU, but no CPU pages: {stats:?}");
            assert_eq!(stats.gpu_pages, 0, "{codec:?}: {stats:?}");
        }
        Compression::UNCOMPRESSED => {
            assert_eq!((stats.gpu_pages, stats.cpu_pages), (0, 0), "{codec:?}: {stats:?}");
            assert_eq!(stats.path(), "none");
        }
        _ if own_zstd => {
            assert!(stats.gpu_pages > 0, "{codec:?}: nothing went to gpq's decoder: {stats:?}");
            assert_eq!(stats.device_zstd_pages, stats.gpu_pages, "{codec:?}: not all by gpq's decoder: {stats:?}");
            assert_eq!((stats.cpu_pages, stats.isolated_pages, stats.check_rejected), (0, 0, 0), "{codec:?}: {stats:?}");
            assert!(stats.fallback.is_none(), "{codec:?}: {stats:?}");
        }
        _ if nvcomp_codec && nvcomp_expected(ctx) => {
            assert!(stats.gpu_pages > 0, "{codec:?}: nothing went to nvCOMP: {stats:?}");
            assert_eq!(stats.cpu_pages, 0, "{codec:?}: {stats:?}");
            assert!(stats.fallback.is_none(), "{codec:?}: {stats:?}");
            assert_eq!(stats.check_rejected, 0, "{codec:?}: the device check rejected pages of a valid file: {stats:?}");
            assert_eq!(stats.isolated_pages, 0, "{codec:?}: checked pages went to the worker: {stats:?}");
        }
        _ if isolated_codec && worker_expected(ctx) => {
            assert!(stats.gpu_pages > 0, "{codec:?}: nothing went to nvCOMP: {stats:?}");
            assert_eq!(stats.isolated_pages, stats.gpu_pages, "{codec:?}: not all in the worker: {stats:?}");
            assert_eq!(stats.cpu_pages, 0, "{codec:?}: {stats:?}");
            assert!(stats.fallback.is_none(), "{codec:?}: {stats:?}");
        }
        _ => {
            assert!(stats.cpu_pages > 0, "{codec:?}: nothing decompressed on the CPU: {stats:?}");
            assert_eq!(stats.gpu_pages, 0, "{codec:?}: {stats:?}");
            assert!(stats.fallback.is_some(), "{codec:?}: a CPU fallback without a reason: {stats:?}");
        }
    }
    if codec != Compression::UNCOMPRESSED {
        assert!(stats.compressed_bytes > 0 && stats.decompressed_bytes > 0, "{codec:?}: {stats:?}");
    }
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
    let tag = nulls.tag();
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

/// Per row of a list: its length (0 for an empty or null list) and validity.
fn list_shape(r: &mut Rng, rows: usize, nulls: Nulls, max_len: u64) -> (Vec<usize>, Option<arrow::buffer::NullBuffer>) {
    let valid: Vec<bool> = (0..rows).map(|_| valid(r, nulls)).collect();
    let lens = valid.iter().map(|&v| if v { r.below(max_len + 1) as usize } else { 0 }).collect();
    (lens, (nulls != Nulls::Required).then(|| valid.into()))
}

/// Nested columns under test, for one nullability (of every level at once):
/// lists of numbers, strings and booleans, a list of lists, a struct, a map,
/// a list of structs, a struct holding a list, large and fixed-size lists.
/// Lists are empty or null at random; with tiny pages they span pages.
fn nested_columns(rows: usize, nulls: Nulls, seed: u64) -> Vec<(Field, ArrayRef)> {
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    let mut r = Rng::new(seed);
    let nullable = nulls != Nulls::Required;
    let tag = nulls.tag();
    let bits = |r: &mut Rng, n: usize| -> Option<NullBuffer> { nullable.then(|| (0..n).map(|_| r.below(6) != 0).collect::<Vec<bool>>().into()) };
    let ints = |r: &mut Rng, n: usize| -> ArrayRef {
        let nb = bits(r, n);
        Arc::new(Int32Array::new((0..n).map(|_| r.below(1000) as i32 - 500).collect(), nb))
    };
    let strs = |r: &mut Rng, n: usize| -> ArrayRef {
        let nb = bits(r, n);
        let s: StringArray = (0..n).map(|i| Some(format!("s{}", r.below(50) * i as u64))).collect();
        Arc::new(StringArray::new(s.offsets().clone(), s.values().clone(), nb))
    };
    let item = |t: DataType| Arc::new(Field::new("item", t, nullable));
    let mut out: Vec<(Field, ArrayRef)> = Vec::new();
    let mut push = |name: &str, a: ArrayRef| out.push((Field::new(format!("{name}_{tag}"), a.data_type().clone(), nullable), a));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 4);
    let child = ints(&mut r, lens.iter().sum());
    push("list_i32", Arc::new(ListArray::new(item(DataType::Int32), OffsetBuffer::from_lengths(lens), child, nb)));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 3);
    let child = strs(&mut r, lens.iter().sum());
    push("list_utf8", Arc::new(ListArray::new(item(DataType::Utf8), OffsetBuffer::from_lengths(lens), child, nb)));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 5);
    let n: usize = lens.iter().sum();
    let bools: ArrayRef = Arc::new(BooleanArray::new((0..n).map(|_| r.below(2) == 0).collect(), bits(&mut r, n)));
    push("list_bool", Arc::new(ListArray::new(item(DataType::Boolean), OffsetBuffer::from_lengths(lens), bools, nb)));

    let (outer, onb) = list_shape(&mut r, rows, nulls, 3);
    let (inner, inb) = list_shape(&mut r, outer.iter().sum(), nulls, 3);
    let leaf = ints(&mut r, inner.iter().sum());
    let inner = ListArray::new(item(DataType::Int32), OffsetBuffer::from_lengths(inner), leaf, inb);
    let inner_type = inner.data_type().clone();
    push("list_list", Arc::new(ListArray::new(item(inner_type), OffsetBuffer::from_lengths(outer), Arc::new(inner), onb)));

    let fields = Fields::from(vec![Field::new("a", DataType::Int32, nullable), Field::new("b", DataType::Utf8, nullable)]);
    let struct_nulls = list_shape(&mut r, rows, nulls, 0).1;
    let (a, b) = (ints(&mut r, rows), strs(&mut r, rows));
    push("struct", Arc::new(StructArray::new(fields.clone(), vec![a, b], struct_nulls)));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 3);
    let n: usize = lens.iter().sum();
    let (a, b) = (ints(&mut r, n), strs(&mut r, n));
    let elements = StructArray::new(fields.clone(), vec![a, b], bits(&mut r, n));
    push("list_struct", Arc::new(ListArray::new(item(DataType::Struct(fields)), OffsetBuffer::from_lengths(lens), Arc::new(elements), nb)));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 3);
    let child = ints(&mut r, lens.iter().sum());
    let list = ListArray::new(item(DataType::Int32), OffsetBuffer::from_lengths(lens), child, nb);
    let holder = Fields::from(vec![Field::new("l", list.data_type().clone(), nullable), Field::new("k", DataType::Int32, nullable)]);
    let k = ints(&mut r, rows);
    let struct_nulls = list_shape(&mut r, rows, nulls, 0).1;
    push("struct_list", Arc::new(StructArray::new(holder, vec![Arc::new(list), k], struct_nulls)));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 3);
    let n: usize = lens.iter().sum();
    let keys: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("key{}", i % 7))));
    let values = ints(&mut r, n);
    let entry_fields = Fields::from(vec![Field::new("keys", DataType::Utf8, false), Field::new("values", DataType::Int32, nullable)]);
    let entries = StructArray::new(entry_fields.clone(), vec![keys, values], None);
    let entries_field = Arc::new(Field::new("entries", DataType::Struct(entry_fields), false));
    push("map", Arc::new(MapArray::new(entries_field, OffsetBuffer::from_lengths(lens), entries, nb, false)));

    let (lens, nb) = list_shape(&mut r, rows, nulls, 4);
    let child = ints(&mut r, lens.iter().sum());
    push("large_list", Arc::new(LargeListArray::new(item(DataType::Int32), OffsetBuffer::from_lengths(lens), child, nb)));

    let nb = list_shape(&mut r, rows, nulls, 0).1;
    let child = ints(&mut r, 3 * rows);
    push("fixed_list", Arc::new(FixedSizeListArray::new(item(DataType::Int32), 3, child, nb)));
    out
}

struct Variant {
    codec: Compression,
    v2: bool,
    dictionary: bool,
    tiny_pages: bool,
    /// With the nested columns of [`nested_columns`].
    nested: bool,
}

fn write_variant(dir: &Path, rows: usize, var: &Variant) -> PathBuf {
    let mut cols = columns(rows, Nulls::Required, 1);
    cols.extend(columns(rows, Nulls::Some, 2));
    cols.extend(columns(rows, Nulls::All, 3));
    if var.nested {
        cols.extend(nested_columns(rows, Nulls::Required, 4));
        cols.extend(nested_columns(rows, Nulls::Some, 5));
        cols.extend(nested_columns(rows, Nulls::All, 6));
    }
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
        if !f.data_type().is_nested() {
            b = b.set_column_encoding(ColumnPath::from(f.name().as_str()), enc);
        }
    }
    let name = format!(
        "m_{:?}_{}_{}_{}_{}.parquet",
        var.codec,
        if var.v2 { "v2" } else { "v1" },
        if var.dictionary { "dict" } else { "plain" },
        if var.tiny_pages { "tiny" } else { "default" },
        if var.nested { "nested" } else { "flat" }
    )
    .replace(['(', ')', ' ', '{', '}', ':'], "");
    let path = dir.join(name);
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(b.build())).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

fn matrix_rows(ctx: &GpuContext) -> usize {
    // Not a multiple of 32; smaller on the emulator, which runs blocks one at a
    // time, and under compute-sanitizer (GPQ_TEST_SMALL=1).
    if ctx.is_emulated() || std::env::var("GPQ_TEST_SMALL").is_ok_and(|v| v == "1") { 613 } else { 10_007 }
}

fn matrix_matches_arrow_rs(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(ctx);
    let codecs = [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::ZSTD(ZstdLevel::try_new(1).unwrap()),
        Compression::LZ4_RAW,
        Compression::GZIP(GzipLevel::try_new(1).unwrap()),
    ];
    for codec in codecs {
        for v2 in [false, true] {
            for dictionary in [false, true] {
                for tiny_pages in [false, true] {
                    let path = write_variant(dir.path(), rows, &Variant { codec, v2, dictionary, tiny_pages, nested: true });
                    let t = assert_same(&path, &ReadOptions::new());
                    assert_eq!(t.num_rows(), rows);
                    // Large lists get i64 offsets on the device, not by a host cast.
                    let large = t.column_by_name("large_list_opt").expect("the nested columns are there");
                    assert!(matches!(large.device_type(), DataType::LargeList(_)), "{}", large.device_type());
                    assert_eq!(large.offsets().map(|o| o.len()), Some(8 * (rows as u64 + 1)));
                    assert_decompression(ctx, codec, &t.stats().decompression);
                    if codec == Compression::SNAPPY {
                        // gpq's own SNAPPY decoder, asked for, over every variant.
                        let own = ReadOptions::new().with_snappy_decoder(DeviceDecoder::Gpq).with_decompress(DecompressMode::Nvcomp);
                        let d = assert_same(&path, &own).stats().decompression.clone();
                        assert!(d.gpu_pages > 0 && d.device_snappy_pages == d.gpu_pages && d.cpu_pages == 0, "gpq's decoder: {d:?}");
                    }
                }
            }
        }
    }
}

fn cpu_decompression_fallback_matches(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(ctx);
    for codec in [Compression::SNAPPY, Compression::BROTLI(Default::default()), Compression::LZ4, Compression::ZSTD(Default::default())] {
        let path = write_variant(dir.path(), rows, &Variant { codec, v2: true, dictionary: true, tiny_pages: false, nested: true });
        let t = assert_same(&path, &ReadOptions::new().with_decompress(DecompressMode::Cpu));
        let d = &t.stats().decompression;
        assert!(d.cpu_pages > 0, "{codec:?}: {d:?}");
        assert_eq!(d.gpu_pages, 0, "{codec:?}: {d:?}");
        assert!(d.fallback.as_deref().is_some_and(|f| f.contains("requested")), "{codec:?}: {d:?}");
        // Auto: BROTLI and Hadoop LZ4 fall back, the rest go to nvCOMP where it is.
        let t = assert_same(&path, &ReadOptions::new());
        assert_decompression(ctx, codec, &t.stats().decompression);
        // Trusted input: ZSTD pages still go to gpq's decoder on the device.
        if matches!(codec, Compression::ZSTD(_)) {
            let mut trusted = ReadOptions::new();
            trusted.skip_compressed_page_checks = true;
            let t = assert_same(&path, &trusted);
            let d = &t.stats().decompression;
            assert!(d.gpu_pages > 0 && d.cpu_pages == 0 && d.device_zstd_pages == d.gpu_pages, "{codec:?} trusted: {d:?}");
        }
        // Forcing the device where it cannot serve (or not safely) is an error, not a silent fallback.
        // gpq's ZSTD decoder serves ZSTD wherever there is a device; nvCOMP serves SNAPPY where it is.
        let forced = read_parquet_to_device(&path, &ReadOptions::new().with_decompress(DecompressMode::Nvcomp));
        let served = matches!(codec, Compression::ZSTD(_)) || (matches!(codec, Compression::SNAPPY) && nvcomp_expected(ctx));
        match forced {
            Ok(t) if served => assert_eq!(t.stats().decompression.cpu_pages, 0),
            Ok(t) => panic!("{codec:?}: nvCOMP forced, but {:?}", t.stats().decompression),
            Err(Error::Nvcomp(_)) => assert!(!served, "{codec:?}: the device refused"),
            Err(e) => panic!("{codec:?}: expected an nvCOMP error, got {e}"),
        }
        // gpq's SNAPPY decoder serves SNAPPY wherever there is a device.
        let own_snappy = ReadOptions::new().with_decompress(DecompressMode::Nvcomp).with_snappy_decoder(DeviceDecoder::Gpq);
        let forced = read_parquet_to_device(&path, &own_snappy);
        let served = matches!(codec, Compression::ZSTD(_) | Compression::SNAPPY);
        match forced {
            Ok(t) if served => assert_eq!(t.stats().decompression.cpu_pages, 0),
            Ok(t) => panic!("{codec:?}: nvCOMP forced, but {:?}", t.stats().decompression),
            Err(Error::Nvcomp(_)) => assert!(!served, "{codec:?}: the device refused"),
            Err(e) => panic!("{codec:?}: expected an nvCOMP error, got {e}"),
        }
    }
}

/// nvCOMP takes a page's whole length at one warp's pace, so a file of a
/// few 1 MiB pages is decompressed on the CPU by default (the statistics say
/// why), and by nvCOMP when it is asked for; many small pages stay on nvCOMP.
/// gpq's SNAPPY decoder, where asked for, is held to one block a page: the
/// same shapes route the same way, and forcing the device keeps every page
/// there. Every read gives what arrow-rs reads.
fn large_pages_go_to_the_cpu_by_default(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = if ctx.is_emulated() { 200_000 } else { 1_000_000 };
    let mut rng = Rng::new(7);
    let values: Int64Array = (0..rows).map(|_| rng.next() as i64).collect();
    let batch = RecordBatch::try_from_iter(vec![("v", Arc::new(values) as ArrayRef)]).unwrap();
    let write = |name: &str, page_bytes: usize| {
        let path = dir.path().join(name);
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false)
            .set_data_page_size_limit(page_bytes)
            .set_data_page_row_count_limit(usize::MAX)
            .set_write_batch_size(1024)
            .build();
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    };
    let large = write("large-pages.parquet", 1 << 20);
    let small = write("small-pages.parquet", 8 << 10);
    let own = ReadOptions::new().with_snappy_decoder(DeviceDecoder::Gpq);
    let d = assert_same(&large, &own).stats().decompression.clone();
    assert!(d.cpu_pages > 0 && d.gpu_pages == 0, "few large pages, gpq's decoder: {d:?}");
    assert!(d.fallback.as_deref().is_some_and(|f| f.contains("faster on the CPU") && f.contains("gpq's SNAPPY decoder")), "{d:?}");
    for path in [&large, &small] {
        let d = assert_same(path, &own.clone().with_decompress(DecompressMode::Nvcomp)).stats().decompression.clone();
        assert!(d.gpu_pages > 0 && d.device_snappy_pages == d.gpu_pages && d.cpu_pages == 0, "gpq's decoder on the device: {d:?}");
    }
    let d = assert_same(&small, &own).stats().decompression.clone();
    assert!(d.gpu_pages > 100 && d.device_snappy_pages == d.gpu_pages && d.fallback.is_none(), "many small pages, gpq's decoder: {d:?}");
    let d = assert_same(&large, &ReadOptions::new()).stats().decompression.clone();
    if !nvcomp_expected(ctx) {
        assert_eq!(d.gpu_pages, 0, "{d:?}");
        return;
    }
    assert!(d.cpu_pages > 0 && d.gpu_pages == 0, "few large pages: {d:?}");
    assert!(d.fallback.as_deref().is_some_and(|f| f.contains("estimated faster on the CPU")), "{d:?}");
    let d = assert_same(&large, &ReadOptions::new().with_decompress(DecompressMode::Nvcomp)).stats().decompression.clone();
    assert!(d.gpu_pages > 0 && d.cpu_pages == 0 && d.fallback.is_none(), "nvCOMP asked for: {d:?}");
    let d = assert_same(&small, &ReadOptions::new()).stats().decompression.clone();
    assert!(d.gpu_pages > 100 && d.cpu_pages == 0 && d.fallback.is_none() && d.device_snappy_pages == 0, "many small pages: {d:?}");
}

fn projections_and_row_groups(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(ctx);
    let path = write_variant(dir.path(), rows, &Variant { codec: Compression::SNAPPY, v2: false, dictionary: true, tiny_pages: true, nested: true });
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

fn pinned_copies_return_and_reuse_their_slab(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(ctx);
    let path = write_variant(dir.path(), rows, &Variant { codec: Compression::SNAPPY, v2: true, dictionary: true, tiny_pages: false, nested: false });
    let expected = arrow_rs(&path).unwrap();
    let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let pool = PinnedHostPool::with_capacity(ctx, 1 << 30);

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
    let full = PinnedHostPool::with_capacity(ctx, 0);
    let (third, pinned) = table.to_record_batch_in(&full).unwrap();
    assert!(!pinned);
    assert_eq!(full.allocated(), 0);
    assert_batches_equal(&path, &expected, &third);
}

/// `into_staged_batches`: the chunks, put back together, are the whole
/// copy, for every chunk size, for columns sliced on the device (a row
/// window's cut pages give them offsets), for string views, and without
/// pinned memory; the slab goes back to the pool however early the chunks
/// are dropped.
fn staged_copies_in_chunks_match_whole_copies(ctx: &Arc<GpuContext>) {
    use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(ctx);
    let path = write_variant(dir.path(), rows, &Variant { codec: Compression::SNAPPY, v2: false, dictionary: true, tiny_pages: true, nested: false });
    let expected = arrow_rs(&path).unwrap();
    let pool = PinnedHostPool::with_capacity(ctx, 1 << 30);
    let staged = |table: gpq::DeviceTable, pool: &Arc<PinnedHostPool>, chunk: usize| -> (RecordBatch, usize, bool) {
        let staged = table.into_staged_batches_in(pool, chunk).unwrap();
        let (chunks, pinned) = (staged.chunks(), staged.pinned());
        let batches: Vec<RecordBatch> = staged.map(Result::unwrap).collect();
        assert_eq!(batches.len(), chunks);
        let schema = batches[0].schema();
        (arrow::compute::concat_batches(&schema, &batches).unwrap(), chunks, pinned)
    };
    for chunk in [1, 7, 64, rows - 1, rows, 10 * rows] {
        let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
        let (got, chunks, pinned) = staged(table, &pool, chunk);
        assert!(pinned);
        assert_eq!(chunks, rows.div_ceil(chunk), "chunks of {chunk} rows");
        assert_batches_equal(&path, &expected, &got);
    }
    // Chunks sized by the bytes copied chunk by chunk; each chunk's
    // fixed-width buffers are its own rows only (DataFusion counts a
    // buffer's whole allocation as the batch's memory).
    let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let per_row = table.staged_chunk_rows(1 << 20);
    assert!(per_row > 1 && per_row < (1 << 20), "{per_row} rows a MiB");
    assert_eq!(table.staged_chunk_rows(0), 1);
    let batches: Vec<RecordBatch> = table.into_staged_batches_in(&pool, 100).unwrap().map(Result::unwrap).collect();
    for b in &batches {
        let column = b.column_by_name("i64_req").unwrap();
        assert!(column.get_array_memory_size() < 8 * b.num_rows() + 256, "{} bytes for {} rows", column.get_array_memory_size(), b.num_rows());
    }
    drop(batches);
    // A row window: columns cut on the device, each at its own offset.
    let (start, len) = (rows / 3 + 5, rows / 3);
    let selection = RowSelection::from(vec![RowSelector::skip(start), RowSelector::select(len), RowSelector::skip(rows - start - len)]);
    let mut reader = gpq::DeviceReaderBuilder::try_new(&path).unwrap().with_row_selection(selection).build().unwrap();
    let table = reader.next().unwrap().unwrap();
    assert!(reader.next().is_none());
    assert!(table.columns().iter().any(|c| c.offset() > 0), "the window cuts pages on the device");
    let (got, _, _) = staged(table, &pool, 33);
    assert_batches_equal(&path, &expected.slice(start, len), &got);
    // String views built on the device.
    let table = read_parquet_to_device(&path, &ReadOptions::new().with_string_views(true)).unwrap();
    let whole = table.to_record_batch().unwrap();
    assert!(whole.schema().fields().iter().any(|f| f.data_type() == &DataType::Utf8View));
    let (got, _, _) = staged(table, &pool, 50);
    assert_batches_equal(&path, &whole, &got);
    // No pinned memory: one batch, copied to pageable memory.
    let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let (got, chunks, pinned) = staged(table, &PinnedHostPool::with_capacity(ctx, 0), 10);
    assert_eq!((chunks, pinned), (1, false));
    assert_batches_equal(&path, &expected, &got);
    // Dropped after one chunk: the queued copies are waited for, and the
    // slab goes back once the chunk handed out is dropped too.
    let pool = PinnedHostPool::with_capacity(ctx, 1 << 30);
    let table = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let mut staged = table.into_staged_batches_in(&pool, 10).unwrap();
    let first = staged.next().unwrap().unwrap();
    drop(staged);
    assert_batches_equal(&path, &expected.slice(0, 10), &first);
    assert_eq!(pool.idle(), 0, "the chunk handed out holds the slab");
    drop(first);
    assert!(pool.allocated() > 0);
    assert_eq!(pool.idle(), pool.allocated(), "the slab is back in the pool");
}

fn empty_and_single_row_files(_ctx: &Arc<GpuContext>) {
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
        assert_eq!(t.num_rows(), rows);
    }
}

/// Every read names where its kernels came from: on a device of an
/// architecture gpq ships a cubin for, that cubin (unless `GPQ_KERNELS` asks
/// for NVRTC or the PTX), so nothing is compiled; a read after the first
/// finds the device ready and pays no set-up.
fn kernels_come_prebuilt(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("sample.parquet"), 1000, 500, Compression::SNAPPY);
    let asked = std::env::var("GPQ_KERNELS").map(|v| v.trim().to_ascii_lowercase()).unwrap_or_default();
    let expected = if ctx.is_emulated() {
        "the CPU emulator".to_string()
    } else if asked == "jit" {
        format!("NVRTC {}", ctx.arch())
    } else if asked == "ptx" {
        "prebuilt compute_80 PTX, compiled by the driver".to_string()
    } else {
        let image = gpq::gpu::prebuilt::cubin_for(ctx.compute_capability)
            .unwrap_or_else(|| panic!("gpq ships no cubin for {}; add it to the prebuilt images", ctx.arch()));
        format!("prebuilt {} cubin", image.arch)
    };
    for _ in 0..2 {
        let t = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
        assert_eq!(t.stats().setup.kernel_source, expected);
        assert_batches_equal(&path, &arrow_rs(&path).unwrap(), &t.to_record_batch().unwrap());
    }
    let setup = read_parquet_to_device(&path, &ReadOptions::new()).unwrap().stats().setup.clone();
    assert!(setup.context.is_zero() && setup.kernels.is_zero(), "a later read paid for set-up: {setup:?}");
}

fn tpch_tables_match(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    // SF 1 on a device; small on the emulator and under compute-sanitizer
    // (GPQ_TEST_SMALL=1); GPQ_TEST_TPCH_SF overrides both.
    let small = ctx.is_emulated() || std::env::var("GPQ_TEST_SMALL").is_ok_and(|v| v == "1");
    let sf = std::env::var("GPQ_TEST_TPCH_SF").ok().and_then(|s| s.parse().ok()).unwrap_or(if small { 0.002 } else { 1.0 });
    for table in gpq_bench::tpch::Table::ALL {
        let path = common::tpch_table(dir.path(), table, sf);
        let t = assert_same(&path, &ReadOptions::new());
        assert_decompression(ctx, Compression::SNAPPY, &t.stats().decompression);
        eprintln!("{} sf{sf}: {} rows, {}", table.name(), t.num_rows(), t.stats().summary());
    }
    // Orders with their line items as a list<struct> column, whole and one
    // leaf inside the list selected by its dotted path.
    let path = common::tpch_table(dir.path(), gpq_bench::tpch::Table::OrdersLineitems, sf);
    let t = assert_same(&path, &ReadOptions::new());
    eprintln!("orders_lineitems sf{sf}: {} rows, {}", t.num_rows(), t.stats().summary());
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let leaf = (0..schema.num_columns()).find(|&i| schema.column(i).path().string().ends_with(".l_quantity")).expect("l_quantity leaf");
    let dotted = schema.column(leaf).path().string();
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
    let mask = parquet::arrow::ProjectionMask::leaves(builder.parquet_schema(), [leaf]);
    let reader = builder.with_projection(mask).build().unwrap();
    let expected_schema = reader.schema();
    let expected = arrow::compute::concat_batches(&expected_schema, &reader.collect::<Result<Vec<_>, _>>().unwrap()).unwrap();
    let got = read_parquet_to_device(&path, &ReadOptions::new().with_columns([dotted.as_str()])).unwrap().to_record_batch().unwrap();
    common::assert_batches_equal(&format!("orders_lineitems {dotted}"), &expected, &got);
}

/// parquet-testing files gpq does not yet decode, each with the reason;
/// each must fail with `Unsupported` naming that reason. Issue 11
/// (coverage) empties this list; a file that starts to decode must be taken
/// off it.
const NOT_YET_DECODED: &[(&str, &str)] = &[];

/// parquet-testing files where arrow-rs's answer is not the file's content,
/// so gpq is checked another way.
const ARROW_RS_QUIRKS: &[(&str, &str)] = &[
    // The footer's total row count is 0 over a row group of 6 rows; arrow-rs
    // caps its batch size at the footer's total and returns no rows. gpq
    // reads the row group (ids 1 to 6).
    ("repeated_no_annotation.parquet", "footer says 0 rows"),
];

/// parquet-testing files neither arrow-rs nor gpq can return: both must
/// fail, neither panic.
const NEITHER_READS: &[(&str, &str)] = &[
    // A map whose strings need more than i32 offsets while the schema asks
    // for Utf8: arrow-rs fails decoding, gpq decodes (with 64-bit offsets)
    // and then refuses the cast to the schema's type.
    ("large_string_map.brotli.parquet", "strings past i32 offsets"),
];

/// Checks a file of [`ARROW_RS_QUIRKS`] against what it is known to hold.
fn check_quirk(name: &str, got: &RecordBatch) {
    match name {
        "repeated_no_annotation.parquet" => {
            assert_eq!(got.num_rows(), 6, "{name}: rows");
            let ids = got.column(0).as_any().downcast_ref::<arrow::array::Int32Array>().expect("id is Int32");
            assert_eq!(ids.values().to_vec(), vec![1, 2, 3, 4, 5, 6], "{name}: ids");
        }
        _ => panic!("{name} is listed as a quirk without a check"),
    }
}

/// parquet-testing files that are malformed on purpose: arrow-rs rejects
/// them, and gpq must too, with an error that blames the file.
const MALFORMED: &[&str] = &[
    // A list of page encoding statistics whose element type is wrong.
    "dict-page-offset-zero.parquet",
    // A dictionary page that claims more bytes than its chunk has.
    "nation.dict-malformed.parquet",
];

fn parquet_testing_files(_ctx: &Arc<GpuContext>) {
    let Some(dir) = common::parquet_testing_dir() else { return };
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "parquet")).collect();
    files.sort();
    let mut same = 0;
    let mut problems = Vec::new();
    let mut outside_shard = 0;
    for (index, path) in files.iter().enumerate() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !common::in_shard(index) {
            outside_shard += 1;
            continue;
        }
        common::progress(format_args!("{name}"));
        let skip = NOT_YET_DECODED.iter().find(|(f, _)| *f == name).map(|(_, why)| *why);
        let malformed = MALFORMED.contains(&name.as_str());
        let expected = common::arrow_rs(path);
        let got = read_parquet_to_device(path, &ReadOptions::new());
        if NEITHER_READS.iter().any(|(f, _)| *f == name) {
            assert!(expected.is_err(), "{name}: arrow-rs now reads it; compare instead");
            let got = got.and_then(|t| t.to_record_batch());
            assert!(got.is_err(), "{name}: gpq returns a table where arrow-rs fails");
            same += 1;
            continue;
        }
        if ARROW_RS_QUIRKS.iter().any(|(f, _)| *f == name) {
            let t = got.unwrap_or_else(|e| panic!("{name}: {e}"));
            check_quirk(&name, &t.to_record_batch().unwrap_or_else(|err| panic!("{name}: {err}")));
            same += 1;
            continue;
        }
        match (got, expected, skip, malformed) {
            (Ok(t), Ok(e), None, false) => {
                let got = t.to_record_batch().unwrap_or_else(|err| panic!("{}: {err}", path.display()));
                assert_batches_equal(path, &e, &got);
                same += 1;
            }
            (Err(Error::Unsupported { what, .. }), _, Some(why), false) if what.contains(why) => {}
            (Err(e), Err(_), None, true) if e.is_bad_input() => {}
            (got, expected, skip, malformed) => problems.push(format!(
                "{name}: gpq {}, arrow-rs {}, listed as {}",
                match &got {
                    Ok(_) => "reads it".to_string(),
                    Err(e) => format!("fails ({e})"),
                },
                match &expected {
                    Ok(_) => "reads it".to_string(),
                    Err(e) => format!("fails ({e})"),
                },
                match (skip, malformed) {
                    (Some(why), _) => format!("not yet decoded ({why})"),
                    (None, true) => "malformed".to_string(),
                    (None, false) => "readable".to_string(),
                }
            )),
        }
    }
    eprintln!(
        "parquet-testing: {same} of {} files read as expected ({} of them checked otherwise than against arrow-rs)",
        files.len(),
        ARROW_RS_QUIRKS.len() + NEITHER_READS.len()
    );
    assert!(problems.is_empty(), "{} files do not behave as listed:\n{}", problems.len(), problems.join("\n"));
    if common::test_shard().is_none() {
        assert_eq!(same + NOT_YET_DECODED.len() + MALFORMED.len(), files.len(), "a listed file is missing from the corpus");
    } else {
        eprintln!("GPQ_TEST_SHARD: {outside_shard} files left to the other shards; the corpus check needs the whole run");
    }
}

/// A read split into groups of row groups (IO of one group beside the page
/// headers and decompression of the others) returns what arrow-rs and a
/// read in one group return, page for page, over codecs, page versions,
/// nested columns, projections and row-group selections; a corrupt page in
/// a later group is the same typed error, naming its row group.
fn overlapped_groups(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = matrix_rows(ctx);
    let zstd = Compression::ZSTD(ZstdLevel::try_new(1).unwrap());
    // (codec, page v2, DELTA encodings: DELTA_BYTE_ARRAY strings and fixed-size binary, DELTA_LENGTH_BYTE_ARRAY, DELTA_BINARY_PACKED)
    let variants = [
        (Compression::SNAPPY, false, false),
        (Compression::SNAPPY, true, false),
        (zstd, false, false),
        (zstd, true, false),
        (Compression::UNCOMPRESSED, false, false),
        (Compression::UNCOMPRESSED, true, false),
        (Compression::SNAPPY, false, true),
        (zstd, true, true),
    ];
    for (codec, v2, delta) in variants {
        {
            let mut cols = columns(rows, Nulls::Some, 7);
            cols.extend(nested_columns(rows, Nulls::Some, 8));
            let schema = Arc::new(Schema::new(cols.iter().map(|c| c.0.clone()).collect::<Vec<_>>()));
            let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
            let mut props = WriterProperties::builder()
                .set_compression(codec)
                .set_writer_version(if v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
                .set_max_row_group_row_count(Some(rows / 7 + 1))
                .set_data_page_row_count_limit(97)
                .set_write_batch_size(61);
            if delta {
                props = props.set_dictionary_enabled(false);
                for (column, encoding) in [
                    ("utf8_opt", Encoding::DELTA_BYTE_ARRAY),
                    ("binary_opt", Encoding::DELTA_BYTE_ARRAY),
                    ("fsb7_opt", Encoding::DELTA_BYTE_ARRAY),
                    ("large_utf8_opt", Encoding::DELTA_LENGTH_BYTE_ARRAY),
                    ("i32_opt", Encoding::DELTA_BINARY_PACKED),
                    ("i64_opt", Encoding::DELTA_BINARY_PACKED),
                ] {
                    props = props.set_column_encoding(ColumnPath::from(column), encoding);
                }
            }
            let props = props.build();
            let path = dir.path().join(format!("groups_{codec:?}_{v2}_{delta}.parquet").replace(['(', ')', ' ', '{', '}', ':'], ""));
            let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props)).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            let num_rg = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap().num_row_groups();
            assert_eq!(num_rg, 7);

            let one = assert_same(&path, &ReadOptions::new().with_overlap_groups(1));
            assert!(one.stats().overlap.is_none(), "one group is not an overlapped read");
            for groups in [2, 3, 7, 50] {
                let t = assert_same(&path, &ReadOptions::new().with_overlap_groups(groups));
                let overlap = t.stats().overlap.as_ref().unwrap_or_else(|| panic!("{groups} groups: no overlap reported"));
                assert_eq!(overlap.groups, groups.min(num_rg));
                let (a, b) = (&one.stats().decompression, &t.stats().decompression);
                assert_eq!((a.gpu_pages + a.cpu_pages, a.decompressed_bytes), (b.gpu_pages + b.cpu_pages, b.decompressed_bytes));
                assert_eq!(t.stats().io.as_ref().unwrap().bytes_requested, one.stats().io.as_ref().unwrap().bytes_requested);
                assert!(t.stats().summary().contains(&format!("in {} overlapped groups", groups.min(num_rg))), "{}", t.stats().summary());
            }
            // A projection over some row groups, in three groups.
            let options = ReadOptions::new().with_columns(["i64_opt", "utf8_opt", "list_i32_opt"]).with_row_groups([1, 2, 4, 5, 6]);
            let t = read_parquet_to_device(&path, &options.clone().with_overlap_groups(3)).unwrap();
            assert_eq!(t.stats().overlap.as_ref().map(|o| o.groups), Some(3));
            let single = read_parquet_to_device(&path, &options.with_overlap_groups(1)).unwrap();
            assert_batches_equal(&path, &single.to_record_batch().unwrap(), &t.to_record_batch().unwrap());

            // The first page header of row group 5's first chunk overwritten.
            let md = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap().metadata().clone();
            let start = md.row_group(5).column(0).byte_range().0 as usize;
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[start..start + 24].fill(0xFF);
            let bad = dir.path().join("groups_bad.parquet");
            std::fs::write(&bad, &bytes).unwrap();
            let single = read_parquet_to_device(&bad, &ReadOptions::new().with_overlap_groups(1)).expect_err("a corrupt header");
            let grouped = read_parquet_to_device(&bad, &ReadOptions::new().with_overlap_groups(4)).expect_err("a corrupt header");
            assert!(matches!(grouped, Error::CorruptPage { row_group: 5, .. }), "{grouped}");
            assert_eq!(grouped.to_string(), single.to_string());
            // The device is fine for the next read.
            assert_same(&path, &ReadOptions::new().with_overlap_groups(3));
        }
    }
}

/// `ReadOptions::with_string_views`: top-level strings and binary of a file
/// whose schema says `Utf8`, `LargeUtf8`, `Binary` come back as views built
/// on the device, equal to arrow-rs's values cast; nested strings keep their type.
fn string_views_on_request(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let n = 500;
    let s: StringArray = (0..n).map(|i| (i % 7 != 0).then(|| format!("value-{i}-{}", "x".repeat(i % 20)))).collect();
    let l: LargeStringArray = (0..n).map(|i| Some(format!("{i}"))).collect();
    let b: BinaryArray = (0..n).map(|i| Some(format!("bytes that are long enough {i}").into_bytes())).collect::<Vec<_>>().iter().map(|v| v.as_deref()).collect();
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>((0..n).map(|i| Some(vec![Some(i as i32)])));
    let batch = RecordBatch::try_from_iter([
        ("s", Arc::new(s) as ArrayRef),
        ("l", Arc::new(l)),
        ("b", Arc::new(b)),
        ("list", Arc::new(list)),
    ])
    .unwrap();
    let path = dir.path().join("strings.parquet");
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(200)).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let plain = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    assert_eq!(plain.schema().field(0).data_type(), &DataType::Utf8);
    let views = read_parquet_to_device(&path, &ReadOptions::new().with_string_views(true)).unwrap();
    let types: Vec<DataType> = views.columns().iter().map(|c| c.device_type().clone()).collect();
    assert_eq!(&types[..3], &[DataType::Utf8View, DataType::Utf8View, DataType::BinaryView]);
    assert!(matches!(views.schema().field(3).data_type(), DataType::List(_)));
    let got = views.to_record_batch().unwrap();
    let expected = arrow_rs(&path).unwrap();
    for (i, t) in [DataType::Utf8View, DataType::Utf8View, DataType::BinaryView].iter().enumerate() {
        let want = arrow::compute::cast(expected.column(i), t).unwrap();
        assert_eq!(got.column(i).as_ref(), want.as_ref(), "column {i}");
    }
    assert_eq!(got.column(3).as_ref(), expected.column(3).as_ref());
}

/// PLAIN byte arrays whose bytes read as plausible lengths from the wrong
/// offset: runs of empty values, values of zeros, values that are themselves
/// PLAIN streams, and values longer than a thread's share of the walk. The
/// block-wide walk guesses where the chain enters each chunk and must repair
/// every wrong guess; data pages and dictionary pages (low cardinality), with
/// and without nulls, small and large pages, all equal to arrow-rs.
fn plain_values_that_read_as_lengths(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = 12_000;
    let value = |r: &mut Rng, i: usize| -> Vec<u8> {
        match r.below(9) {
            0 | 1 => Vec::new(),
            2 => vec![0; r.below(12) as usize],
            3 => {
                // A PLAIN stream of its own: lengths and bytes of small values.
                let mut v = Vec::new();
                for _ in 0..r.below(6) {
                    let k = r.below(9) as u32;
                    v.extend_from_slice(&k.to_le_bytes());
                    v.extend((0..k).map(|_| r.below(3) as u8));
                }
                v
            }
            4 => (0..r.below(40)).map(|_| r.below(2) as u8).collect(),
            5 => vec![0; 200 + r.below(2_000) as usize],
            6 => (0..r.below(700)).map(|_| r.next() as u8).collect(),
            7 => format!("ordinary text {i}").into_bytes(),
            _ => ((r.below(64) as u32).to_le_bytes()).to_vec(),
        }
    };
    for (seed, nulls) in [(1u64, false), (2, true)] {
        let mut r = Rng::new(seed);
        let vals: Vec<Option<Vec<u8>>> = (0..rows).map(|i| (!nulls || r.below(5) != 0).then(|| value(&mut r, i))).collect();
        let few: Vec<Option<Vec<u8>>> = (0..rows).map(|i| vals[(i * 7) % 40].clone()).collect();
        let plain: BinaryArray = vals.iter().map(|v| v.as_deref()).collect();
        let dict: BinaryArray = few.iter().map(|v| v.as_deref()).collect();
        let batch = RecordBatch::try_from_iter([("plain", Arc::new(plain) as ArrayRef), ("dict", Arc::new(dict))]).unwrap();
        for page_bytes in [1usize << 10, 1 << 20] {
            let path = dir.path().join(format!("plain-{seed}-{page_bytes}.parquet"));
            let props = WriterProperties::builder()
                .set_column_dictionary_enabled(ColumnPath::from("plain"), false)
                .set_column_dictionary_enabled(ColumnPath::from("dict"), true)
                .set_data_page_size_limit(page_bytes)
                .set_write_batch_size(64)
                .build();
            let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            assert_same(&path, &ReadOptions::new());
        }
    }
}
