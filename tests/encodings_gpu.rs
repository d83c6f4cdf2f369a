//! Differential tests of the encodings beyond PLAIN and dictionaries:
//! BYTE_STREAM_SPLIT, DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY and
//! DELTA_BYTE_ARRAY. Files come from the arrow-rs writer (`PARQUET_2_0`,
//! the encoding set per column, v1 and v2 pages, pages small enough that
//! values span many of them, several codecs, required, nullable and all-null
//! columns, with and without dictionaries: with a small dictionary limit a
//! chunk starts in dictionary pages and falls back to the column's encoding)
//! and from parquet-testing; gpq's columns must equal arrow-rs's. Each file is
//! checked to hold the encoding under test, so a writer that quietly chose
//! another one cannot make a test pass. Runs on a GPU, or on the CPU emulator
//! in builds with the `emulator` feature; reported as ignored otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::*;
use common::{Nulls, Rng, arrow_rs, gpu_trial, probe_device, run_trials};
use gpq::cuda::GpuContext;
use gpq::{ReadOptions, ReadPlan, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnPath;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "byte_stream_split_matches_arrow_rs", byte_stream_split_matches_arrow_rs),
        gpu_trial(&device, "delta_binary_packed_matches_arrow_rs", delta_binary_packed_matches_arrow_rs),
        gpu_trial(&device, "delta_length_byte_array_matches_arrow_rs", delta_length_byte_array_matches_arrow_rs),
        gpu_trial(&device, "delta_byte_array_matches_arrow_rs", delta_byte_array_matches_arrow_rs),
        gpu_trial(&device, "default_v2_writer_falls_back_to_delta", default_v2_writer_falls_back_to_delta),
        gpu_trial(&device, "parquet_testing_encoding_files", parquet_testing_encoding_files),
    ])
}


/// Builds columns of one nullability; `valid` decides each row's validity.
struct Cols {
    rows: usize,
    nulls: Nulls,
    r: Rng,
    out: Vec<(Field, ArrayRef)>,
}

impl Cols {
    fn new(rows: usize, nulls: Nulls, seed: u64) -> Cols {
        Cols { rows, nulls, r: Rng::new(seed), out: Vec::new() }
    }

    fn valid(&mut self) -> bool {
        match self.nulls {
            Nulls::Required => true,
            Nulls::Some => self.r.below(10) != 0,
            Nulls::All => false,
        }
    }

    fn push(&mut self, name: &str, a: ArrayRef) {
        let f = Field::new(format!("{name}_{}", self.nulls.tag()), a.data_type().clone(), self.nulls != Nulls::Required);
        self.out.push((f, a));
    }

    /// A column of `rows` values from `f(rng, row)`, nulls as configured.
    fn prim<A>(&mut self, name: &str, mut f: impl FnMut(&mut Rng, usize) -> A::Native)
    where
        A: ArrowPrimitiveType,
    {
        let mut v = Vec::with_capacity(self.rows);
        for i in 0..self.rows {
            let ok = self.valid();
            let x = f(&mut self.r, i);
            v.push(ok.then_some(x));
        }
        self.push(name, Arc::new(v.into_iter().collect::<PrimitiveArray<A>>()));
    }

    fn decimal(&mut self, name: &str, precision: u8, scale: i8, bits: u32) {
        let mut v = Vec::with_capacity(self.rows);
        for _ in 0..self.rows {
            let ok = self.valid();
            let mag = ((self.r.next() as u128) << 64 | self.r.next() as u128) >> (128 - bits);
            let x = if self.r.below(2) == 0 { mag as i128 } else { -(mag as i128) };
            v.push(ok.then_some(x));
        }
        let a = Decimal128Array::from(v).with_precision_and_scale(precision, scale).unwrap();
        self.push(name, Arc::new(a));
    }

    fn decimal256(&mut self, name: &str) {
        let mut v = Vec::with_capacity(self.rows);
        for _ in 0..self.rows {
            let ok = self.valid();
            let hi = (self.r.next() >> 30) as i128 - (1 << 33);
            let x = i256::from_parts(self.r.next() as u128 | ((self.r.next() as u128) << 64), hi);
            v.push(ok.then_some(x));
        }
        let a = Decimal256Array::from(v).with_precision_and_scale(50, 4).unwrap();
        self.push(name, Arc::new(a));
    }

    fn fixed_binary(&mut self, name: &str, width: i32, shared_prefix: bool) {
        let mut v = Vec::with_capacity(self.rows);
        for i in 0..self.rows {
            let ok = self.valid();
            let bytes: Vec<u8> = (0..width as usize)
                .map(|b| if shared_prefix && b + 2 < width as usize { ((i / 50) >> b) as u8 } else { self.r.next() as u8 })
                .collect();
            v.push(ok.then_some(bytes));
        }
        let a = FixedSizeBinaryArray::try_from_sparse_iter_with_size(v.into_iter(), width).unwrap();
        self.push(name, Arc::new(a));
    }

    fn float16(&mut self, name: &str) {
        let mut v = Vec::with_capacity(self.rows);
        for _ in 0..self.rows {
            let ok = self.valid();
            v.push(ok.then_some(half::f16::from_f32((self.r.below(4000) as f32 - 2000.0) / 8.0)));
        }
        self.push(name, Arc::new(Float16Array::from(v)));
    }

    /// Strings of several shapes: sorted keys with long shared prefixes (what
    /// DELTA_BYTE_ARRAY is for), random words, empty strings, long values.
    fn strings(&mut self) {
        let words = ["", "a", "tiny", "lorem ipsum dolor", "furiously regular deposits", "ünïcödé ✓"];
        let mut keys = Vec::with_capacity(self.rows);
        let mut mixed = Vec::with_capacity(self.rows);
        let mut long = Vec::with_capacity(self.rows);
        for i in 0..self.rows {
            let (a, b, c) = (self.valid(), self.valid(), self.valid());
            keys.push(a.then(|| format!("customer#{:09}/{}", i / 3, i % 3)));
            let w = words[self.r.below(6) as usize];
            mixed.push(b.then(|| if self.r.below(3) == 0 { format!("{w}{i}") } else { w.to_string() }));
            let n = self.r.below(300) as usize;
            long.push(c.then(|| "x".repeat(n) + &i.to_string()));
        }
        self.push("keys", Arc::new(StringArray::from(keys)));
        self.push("mixed", Arc::new(StringArray::from(mixed)));
        self.push("large", Arc::new(LargeStringArray::from(long)));
        let mut bin = Vec::with_capacity(self.rows);
        let mut view = Vec::with_capacity(self.rows);
        for i in 0..self.rows {
            let (a, b) = (self.valid(), self.valid());
            let n = self.r.below(20) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| self.r.next() as u8).collect();
            bin.push(a.then_some(bytes));
            view.push(b.then(|| format!("view string number {}", i / 7)));
        }
        self.push("binary", Arc::new(BinaryArray::from_iter(bin)));
        self.push("view", Arc::new(StringViewArray::from_iter(view)));
    }
}

/// The columns of one encoding family, in one nullability.
fn family_columns(enc: Encoding, rows: usize, nulls: Nulls, seed: u64) -> Vec<(Field, ArrayRef)> {
    let mut c = Cols::new(rows, nulls, seed);
    match enc {
        Encoding::BYTE_STREAM_SPLIT => {
            c.prim::<Float32Type>("f32", |r, _| (r.next() as i32) as f32 / 7.0);
            c.prim::<Float64Type>("f64", |r, _| (r.next() as i64) as f64 / 13.0);
            c.prim::<Float64Type>("f64_special", |r, i| [f64::NAN, f64::INFINITY, -0.0, f64::MIN_POSITIVE, 1.5][i % 5] * (r.below(3) as f64 + 1.0));
            c.prim::<Int32Type>("i32", |r, _| r.next() as i32);
            c.prim::<Int64Type>("i64", |r, _| r.next() as i64);
            c.prim::<Int8Type>("i8", |r, _| r.next() as i8);
            c.prim::<UInt16Type>("u16", |r, _| r.next() as u16);
            c.prim::<UInt64Type>("u64", |r, _| r.next());
            c.prim::<Date64Type>("date64", |r, _| (r.below(40_000) as i64 - 10_000) * 86_400_000);
            c.decimal("dec_i32", 9, 2, 28);
            c.decimal("dec_i64", 18, 3, 58);
            c.decimal("dec_flba", 38, 5, 120);
            c.decimal256("dec256");
            c.float16("f16");
            c.fixed_binary("fsb7", 7, false);
            c.fixed_binary("fsb40", 40, false);
        }
        Encoding::DELTA_BINARY_PACKED => {
            c.prim::<Int32Type>("i32", |r, _| r.next() as i32);
            c.prim::<Int32Type>("i32_small", |r, _| r.below(100) as i32);
            c.prim::<Int32Type>("i32_const", |_, _| 7);
            c.prim::<Int32Type>("i32_seq", |_, i| i as i32 * 3 - 1000);
            c.prim::<Int32Type>("i32_extreme", |r, _| [i32::MIN, i32::MAX, 0, -1][r.below(4) as usize]);
            c.prim::<Int64Type>("i64", |r, _| r.next() as i64);
            c.prim::<Int64Type>("i64_extreme", |r, _| [i64::MIN, i64::MAX, 0, -1][r.below(4) as usize]);
            c.prim::<Int64Type>("i64_steps", |r, i| (i as i64) << 20 | r.below(1 << 12) as i64);
            c.prim::<Int8Type>("i8", |r, _| r.next() as i8);
            c.prim::<Int16Type>("i16", |r, _| r.next() as i16);
            c.prim::<UInt32Type>("u32", |r, _| r.next() as u32);
            c.prim::<UInt64Type>("u64", |r, _| r.next());
            c.prim::<Date32Type>("date32", |r, _| r.below(40_000) as i32 - 10_000);
            c.prim::<Date64Type>("date64", |r, _| (r.below(40_000) as i64 - 10_000) * 86_400_000);
            c.prim::<TimestampMicrosecondType>("ts_us", |r, i| 1_600_000_000_000_000 + i as i64 * 1_000_000 + r.below(1000) as i64);
            c.decimal("dec_i32", 9, 2, 28);
            c.decimal("dec_i64", 18, 3, 58);
        }
        Encoding::DELTA_LENGTH_BYTE_ARRAY => c.strings(),
        Encoding::DELTA_BYTE_ARRAY => {
            c.strings();
            c.fixed_binary("fsb7", 7, true);
            c.fixed_binary("fsb40", 40, true);
            c.float16("f16");
            c.decimal("dec_flba", 38, 5, 120);
            c.decimal256("dec256");
        }
        _ => unreachable!("no columns for {enc}"),
    }
    c.out
}

struct Variant {
    codec: Compression,
    v2: bool,
    dictionary: bool,
    tiny_pages: bool,
}

fn rows_for(ctx: &GpuContext) -> usize {
    // Not a multiple of 32; large pages hold more than one 1024-row batch.
    if ctx.is_emulated() || std::env::var("GPQ_TEST_SMALL").is_ok_and(|v| v == "1") { 2_501 } else { 20_011 }
}

/// Writes the columns of `enc`'s family (required, nullable, all null) with
/// `enc` set on every column, and returns the path.
fn write_family(dir: &Path, enc: Encoding, rows: usize, var: &Variant) -> PathBuf {
    let mut cols = family_columns(enc, rows, Nulls::Required, 1);
    cols.extend(family_columns(enc, rows, Nulls::Some, 2));
    cols.extend(family_columns(enc, rows, Nulls::All, 3));
    let schema = Arc::new(Schema::new(cols.iter().map(|c| c.0.clone()).collect::<Vec<_>>()));
    let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
    let mut b = WriterProperties::builder()
        .set_compression(var.codec)
        // arrow-rs writes v2 data pages for PARQUET_2_0 and v1 pages otherwise.
        .set_writer_version(if var.v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        .set_max_row_group_row_count(Some(rows / 2 + 1))
        .set_dictionary_enabled(var.dictionary)
        .set_dictionary_page_size_limit(256);
    if var.tiny_pages {
        b = b.set_data_page_row_count_limit(97).set_write_batch_size(61);
    }
    for f in schema.fields() {
        b = b.set_column_encoding(ColumnPath::from(f.name().as_str()), enc);
    }
    let name = format!(
        "{enc}_{:?}_{}_{}_{}.parquet",
        var.codec,
        if var.v2 { "v2" } else { "v1" },
        if var.dictionary { "dict" } else { "nodict" },
        if var.tiny_pages { "tiny" } else { "large" }
    )
    .replace(['(', ')', ' ', '{', '}', ':'], "");
    let path = dir.join(name);
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(b.build())).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

/// The encodings of every column chunk, by column name.
fn chunk_encodings(path: &Path) -> Vec<(String, Vec<Encoding>)> {
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let md = reader.metadata();
    let mut out = Vec::new();
    for rg in md.row_groups() {
        for c in rg.columns() {
            out.push((c.column_path().string(), c.encodings().collect()));
        }
    }
    out
}

/// Reads `path` with gpq (after `can_decode` agrees) and asserts it equals arrow-rs.
fn assert_same(path: &Path) {
    let plan = ReadPlan::new(path, &ReadOptions::new()).unwrap();
    gpq::can_decode(&plan).unwrap_or_else(|e| panic!("{}: can_decode says {e}", path.display()));
    let expected = arrow_rs(path).unwrap_or_else(|e| panic!("arrow-rs cannot read {}: {e}", path.display()));
    let table = read_parquet_to_device(path, &ReadOptions::new()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let got = table.to_record_batch().unwrap();
    common::assert_batches_equal(&path.display().to_string(), &expected, &got);
}

/// Every variant of `enc`'s family: v1/v2 pages, dictionary on (with
/// fallback) and off, tiny and large pages, codecs in turn.
fn family_matches(ctx: &GpuContext, enc: Encoding) {
    let dir = tempfile::tempdir().unwrap();
    let rows = rows_for(ctx);
    let codecs = [Compression::UNCOMPRESSED, Compression::SNAPPY, Compression::ZSTD(ZstdLevel::try_new(1).unwrap())];
    let mut k = 0;
    let mut fallbacks = 0;
    for v2 in [false, true] {
        for dictionary in [false, true] {
            for tiny_pages in [false, true] {
                let var = Variant { codec: codecs[k % codecs.len()], v2, dictionary, tiny_pages };
                k += 1;
                let path = write_family(dir.path(), enc, rows, &var);
                for (col, encs) in chunk_encodings(&path) {
                    let dict = encs.iter().any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY));
                    if !col.ends_with("_null") {
                        assert!(encs.contains(&enc) || dict, "{}: column {col} holds {encs:?}, not {enc}", path.display());
                    }
                    if dict && encs.contains(&enc) {
                        fallbacks += 1;
                    }
                    if !dictionary && !col.ends_with("_null") {
                        assert!(encs.contains(&enc), "{}: column {col} holds {encs:?}, not {enc}", path.display());
                    }
                }
                eprintln!("{}", path.file_name().unwrap().to_string_lossy());
                assert_same(&path);
            }
        }
    }
    assert!(fallbacks > 0, "{enc}: no chunk mixes dictionary pages with {enc} pages");
}

fn byte_stream_split_matches_arrow_rs(ctx: &Arc<GpuContext>) {
    family_matches(ctx, Encoding::BYTE_STREAM_SPLIT);
}

fn delta_binary_packed_matches_arrow_rs(ctx: &Arc<GpuContext>) {
    family_matches(ctx, Encoding::DELTA_BINARY_PACKED);
}

fn delta_length_byte_array_matches_arrow_rs(ctx: &Arc<GpuContext>) {
    family_matches(ctx, Encoding::DELTA_LENGTH_BYTE_ARRAY);
}

fn delta_byte_array_matches_arrow_rs(ctx: &Arc<GpuContext>) {
    family_matches(ctx, Encoding::DELTA_BYTE_ARRAY);
}

/// The arrow-rs `PARQUET_2_0` writer with no encodings set: dictionaries
/// that overflow fall back to DELTA_BINARY_PACKED for integers and
/// DELTA_BYTE_ARRAY for byte arrays, inside one column chunk.
fn default_v2_writer_falls_back_to_delta(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let rows = rows_for(ctx);
    let mut cols = family_columns(Encoding::DELTA_BINARY_PACKED, rows, Nulls::Some, 5);
    cols.extend(family_columns(Encoding::DELTA_BYTE_ARRAY, rows, Nulls::Required, 6));
    let schema = Arc::new(Schema::new(cols.iter().map(|c| c.0.clone()).collect::<Vec<_>>()));
    let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
    for codec in [Compression::SNAPPY, Compression::UNCOMPRESSED] {
        let props = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_compression(codec)
            .set_dictionary_page_size_limit(512)
            .set_data_page_row_count_limit(200)
            .set_write_batch_size(100)
            .build();
        let path = dir.path().join(format!("default_v2_{codec:?}.parquet"));
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let encs = chunk_encodings(&path);
        for want in [Encoding::DELTA_BINARY_PACKED, Encoding::DELTA_BYTE_ARRAY] {
            assert!(
                encs.iter().any(|(_, e)| e.contains(&want) && e.contains(&Encoding::RLE_DICTIONARY)),
                "{}: no chunk falls back from a dictionary to {want}: {encs:?}",
                path.display()
            );
        }
        assert_same(&path);
    }
}

/// The parquet-testing files in these encodings.
fn parquet_testing_encoding_files(_ctx: &Arc<GpuContext>) {
    let Some(dir) = common::parquet_testing_dir() else { return };
    for name in [
        "byte_stream_split.zstd.parquet",
                "delta_binary_packed.parquet",
        "delta_byte_array.parquet",
        "delta_length_byte_array.parquet",
        "delta_encoding_required_column.parquet",
            ] {
        let path = dir.join(name);
        assert!(path.exists(), "{} is missing from the parquet-testing corpus", path.display());
        assert_same(&path);
    }
}
