//! Device filters against arrow-rs: a table of every column kind the device
//! compares (signed and unsigned integers of each width, decimals narrow and
//! wide, dates, timestamps, floats with NaN, -0.0 and infinities, booleans,
//! strings as offsets, large offsets and views, binary), with nulls, read
//! with gpq; predicates fixed and generated at random are evaluated on the
//! device (`DeviceTable::filter_columns`) and, on a host copy of the same
//! table, with arrow's comparison, `LIKE`, Kleene boolean and filter
//! kernels (zeros normalized first, as DataFusion does). The two must keep
//! the same rows with the same values. Ignored
//! without a device or the emulator.

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array,
    Int16Array, Int32Array, Int64Array, LargeStringArray, ListArray, RecordBatch, Scalar, StringArray, StringViewArray,
    TimestampMicrosecondArray, UInt8Array, UInt32Array, UInt64Array,
};
use arrow::compute::kernels::boolean::{and_kleene, not, or_kleene};
use arrow::compute::kernels::cmp;
use arrow::compute::{cast, filter_record_batch, is_not_null, is_null};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, TimeUnit};
use common::{Rng, assert_batches_equal, gpu_trial, probe_device, run_trials};
use gpq::arrow::filter::{CmpOp, Literal, Predicate};
use gpq::cuda::GpuContext;
use gpq::{DeviceReaderBuilder, DeviceTable, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::file::properties::WriterProperties;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "fixed_predicates_match_arrow", fixed_predicates_match_arrow),
        gpu_trial(&device, "random_predicates_match_arrow", random_predicates_match_arrow),
        gpu_trial(&device, "kept_columns_in_any_order_and_none", kept_columns_in_any_order),
        gpu_trial(&device, "sliced_columns_filter_from_their_offset", sliced_columns_filter_from_their_offset),
        gpu_trial(&device, "what_the_device_cannot_filter_is_a_filter_error", refusals),
        gpu_trial(&device, "masks_within_ranges_and_takes_of_another_read", masks_within_ranges),
    ])
}

const ROWS: usize = 3000;

const WORDS: [&str; 8] = ["PROMO", "BRASS", "special", "requests", "forest", "green", "MEDIUM POLISHED", "x"];

/// The test table; column names say their type.
fn table(seed: u64) -> RecordBatch {
    let mut r = Rng::new(seed);
    let mut null = |p: u64| r.below(p) == 0;
    let mut rr = Rng::new(seed ^ 0xABCD);
    let mut v = |n: u64| rr.below(n);
    let rows = 0..ROWS;
    let i8s: Int8Array = rows.clone().map(|_| (!null(7)).then(|| v(256) as u8 as i8)).collect();
    let i16s: Int16Array = rows.clone().map(|_| Some(v(65536) as u16 as i16)).collect();
    let i32s: Int32Array = rows.clone().map(|_| (!null(5)).then(|| v(200) as i32 - 100)).collect();
    let i64s: Int64Array = rows.clone().map(|_| Some((v(u64::MAX) as i64) >> v(60))).collect();
    let u8s: UInt8Array = rows.clone().map(|_| Some(v(256) as u8)).collect();
    let u32s: UInt32Array = rows.clone().map(|_| Some(v(u32::MAX as u64 + 1) as u32)).collect();
    let u64s: UInt64Array = rows.clone().map(|_| Some(v(u64::MAX) | if v(2) == 0 { 1 << 63 } else { 0 })).collect();
    let dec: Decimal128Array =
        rows.clone().map(|_| (!null(9)).then(|| v(2000) as i128 - 1000)).collect::<Decimal128Array>().with_precision_and_scale(15, 2).unwrap();
    let wide: Decimal128Array = rows
        .clone()
        .map(|_| Some(((v(u64::MAX) as i128) << v(40)) * if v(2) == 0 { -1 } else { 1 }))
        .collect::<Decimal128Array>()
        .with_precision_and_scale(38, 5)
        .unwrap();
    let dates: Date32Array = rows.clone().map(|_| Some(8000 + v(3000) as i32)).collect();
    let ts: TimestampMicrosecondArray = rows.clone().map(|_| (!null(11)).then(|| v(1 << 50) as i64 - (1 << 49))).collect();
    let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 1.5, -1.5];
    let f32s: Float32Array =
        rows.clone().map(|_| (!null(13)).then(|| if v(4) == 0 { specials[v(7) as usize] as f32 } else { (v(1000) as f32 - 500.0) / 8.0 })).collect();
    let f64s: Float64Array =
        rows.clone().map(|_| Some(if v(4) == 0 { specials[v(7) as usize] } else { (v(100_000) as f64 - 50_000.0) / 100.0 })).collect();
    let bools: BooleanArray = rows.clone().map(|_| (!null(6)).then(|| v(2) == 0)).collect();
    let mut text = |long: bool| -> String {
        let n = 1 + v(if long { 5 } else { 2 }) as usize;
        (0..n).map(|_| WORDS[v(WORDS.len() as u64) as usize]).collect::<Vec<_>>().join(" ")
    };
    let strs: StringArray = rows.clone().map(|_| (!null(8)).then(|| text(true))).collect();
    let larges: LargeStringArray = rows.clone().map(|_| Some(text(false))).collect();
    let views: StringViewArray = rows.clone().map(|_| (!null(10)).then(|| text(true))).collect();
    let bins: BinaryArray = rows.clone().map(|i| Some(format!("b{}", i % 97).into_bytes())).collect::<Vec<_>>().iter().map(|b| b.as_deref()).collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("i8", Arc::new(i8s)),
        ("i16", Arc::new(i16s)),
        ("i32", Arc::new(i32s)),
        ("i64", Arc::new(i64s)),
        ("u8", Arc::new(u8s)),
        ("u32", Arc::new(u32s)),
        ("u64", Arc::new(u64s)),
        ("dec", Arc::new(dec)),
        ("wide", Arc::new(wide)),
        ("date", Arc::new(dates)),
        ("ts", Arc::new(ts)),
        ("f32", Arc::new(f32s)),
        ("f64", Arc::new(f64s)),
        ("bool", Arc::new(bools)),
        ("str", Arc::new(strs)),
        ("large", Arc::new(larges)),
        ("view", Arc::new(views)),
        ("bin", Arc::new(bins)),
    ];
    let fields: Vec<Field> = columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), a.null_count() > 0)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns.into_iter().map(|(_, a)| a).collect()).unwrap()
}

fn write(dir: &std::path::Path, batch: &RecordBatch) -> std::path::PathBuf {
    let path = dir.join("filter.parquet");
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(1000)).set_data_page_row_count_limit(300).set_write_batch_size(100).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    path
}

fn column(schema: &Schema, name: &str) -> usize {
    schema.index_of(name).unwrap()
}

/// A one-value array of `t` holding `lit`, for arrow's comparison kernels.
fn scalar(t: &DataType, lit: &Literal) -> ArrayRef {
    match (t, lit) {
        (DataType::Decimal128(p, s), Literal::Int(v)) => Arc::new(Decimal128Array::from(vec![*v]).with_precision_and_scale(*p, *s).unwrap()),
        (DataType::UInt64, Literal::Int(v)) => Arc::new(UInt64Array::from(vec![*v as u64])),
        (t, Literal::Int(v)) => cast(&(Arc::new(Int64Array::from(vec![*v as i64])) as ArrayRef), t).unwrap(),
        (_, Literal::Float(f)) => Arc::new(Float64Array::from(vec![if *f == 0.0 { 0.0 } else { *f }])),
        (DataType::Binary, Literal::Bytes(b)) => Arc::new(BinaryArray::from(vec![b.as_slice()])),
        (_, Literal::Bytes(b)) => Arc::new(StringArray::from(vec![String::from_utf8(b.clone()).unwrap()])),
        (_, Literal::Bool(b)) => Arc::new(BooleanArray::from(vec![*b])),
    }
}

/// The column as DataFusion compares it with `lit`: floats as f64 with
/// -0.0 made 0.0, strings as Utf8.
fn comparable(a: &ArrayRef, lit: &Literal) -> ArrayRef {
    match (a.data_type(), lit) {
        (DataType::Float32 | DataType::Float64, _) => {
            let f = cast(a, &DataType::Float64).unwrap();
            let f = f.as_any().downcast_ref::<Float64Array>().unwrap();
            Arc::new(f.unary::<_, arrow::datatypes::Float64Type>(|v| if v == 0.0 { 0.0 } else { v }))
        }
        (DataType::LargeUtf8 | DataType::Utf8View, _) => cast(a, &DataType::Utf8).unwrap(),
        _ => Arc::clone(a),
    }
}

/// The host's answer: arrow's kernels, with SQL's three-valued logic.
fn host_eval(batch: &RecordBatch, p: &Predicate) -> BooleanArray {
    let n = batch.num_rows();
    match p {
        Predicate::Compare { column, op, value } => {
            let a = comparable(batch.column(*column), value);
            let s = Scalar::new(scalar(a.data_type(), value));
            match op {
                CmpOp::Eq => cmp::eq(&a, &s),
                CmpOp::NotEq => cmp::neq(&a, &s),
                CmpOp::Lt => cmp::lt(&a, &s),
                CmpOp::LtEq => cmp::lt_eq(&a, &s),
                CmpOp::Gt => cmp::gt(&a, &s),
                CmpOp::GtEq => cmp::gt_eq(&a, &s),
            }
            .unwrap()
        }
        Predicate::InList { column, values } => {
            let mut acc = BooleanArray::from(vec![false; n]);
            for v in values {
                let eq = host_eval(batch, &Predicate::Compare { column: *column, op: CmpOp::Eq, value: v.clone() });
                acc = or_kleene(&acc, &eq).unwrap();
            }
            // NULL where the column is (the list holds no NULL).
            let nulls = is_null(batch.column(*column)).unwrap();
            let unknown: BooleanArray = (0..n).map(|i| if nulls.value(i) { None } else { Some(acc.value(i)) }).collect();
            unknown
        }
        Predicate::CompareColumns { left, op, right } => {
            let side = |c: usize| -> ArrayRef {
                let a = batch.column(c);
                match a.data_type() {
                    DataType::Float32 | DataType::Float64 => comparable(a, &Literal::Float(0.0)),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => cast(a, &DataType::Utf8).unwrap(),
                    DataType::Binary => Arc::clone(a),
                    _ => cast(a, &DataType::Int64).unwrap(),
                }
            };
            let (a, b) = (side(*left), side(*right));
            match op {
                CmpOp::Eq => cmp::eq(&a, &b),
                CmpOp::NotEq => cmp::neq(&a, &b),
                CmpOp::Lt => cmp::lt(&a, &b),
                CmpOp::LtEq => cmp::lt_eq(&a, &b),
                CmpOp::Gt => cmp::gt(&a, &b),
                CmpOp::GtEq => cmp::gt_eq(&a, &b),
            }
            .unwrap()
        }
        Predicate::IsNull(c) => is_null(batch.column(*c)).unwrap(),
        Predicate::IsNotNull(c) => is_not_null(batch.column(*c)).unwrap(),
        Predicate::Like { column, pattern } => {
            let a = cast(batch.column(*column), &DataType::Utf8).unwrap();
            let pat = StringArray::new_scalar(String::from_utf8(pattern.clone()).unwrap());
            arrow::compute::like(&a, &pat).unwrap()
        }
        Predicate::Column(c) => batch.column(*c).as_any().downcast_ref::<BooleanArray>().unwrap().clone(),
        Predicate::And(ps) => ps.iter().fold(BooleanArray::from(vec![true; n]), |acc, q| and_kleene(&acc, &host_eval(batch, q)).unwrap()),
        Predicate::Or(ps) => ps.iter().fold(BooleanArray::from(vec![false; n]), |acc, q| or_kleene(&acc, &host_eval(batch, q)).unwrap()),
        Predicate::Not(q) => not(&host_eval(batch, q)).unwrap(),
        Predicate::Const(v) => (0..n).map(|_| *v).collect(),
    }
}

/// Filters `table` on the device and its host copy with arrow; both keep the same rows.
fn check(table: &DeviceTable, host: &RecordBatch, p: &Predicate, keep: &[usize]) {
    let got = table.filter_columns(p, keep).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    let got = got.to_record_batch().unwrap();
    let mask = host_eval(host, p);
    let want = filter_record_batch(host, &mask).unwrap().project(keep).unwrap();
    assert_batches_equal(&format!("{p:?}"), &want, &got);
    let stats = table.filter_columns(p, &[]).unwrap();
    assert_eq!(stats.num_rows(), want.num_rows(), "{p:?}: rows with no columns kept");
    let f = stats.stats().filter.clone().unwrap();
    assert_eq!((f.rows_in, f.rows_out), (host.num_rows(), want.num_rows()), "{p:?}: filter stats");
    // Late materialization's two steps: the mask (NULL is not kept), then the rows it sets.
    let device_mask = table.filter_mask(p, None).unwrap_or_else(|e| panic!("{p:?}: mask: {e}"));
    assert_eq!(device_mask, true_rows(&mask), "{p:?}: mask");
    let taken = table.take_rows(&device_mask, keep).unwrap().to_record_batch().unwrap();
    assert_batches_equal(&format!("{p:?} (take_rows)"), &want, &taken);
}

fn read(ctx: &Arc<GpuContext>) -> (tempfile::TempDir, DeviceTable, RecordBatch) {
    let _ = ctx;
    let dir = tempfile::tempdir().unwrap();
    let batch = table(7);
    let path = write(dir.path(), &batch);
    let device = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let host = device.to_record_batch().unwrap();
    // The device read is the one arrow-rs makes of the file.
    assert_batches_equal("read", &batch, &host);
    (dir, device, host)
}

fn fixed_predicates_match_arrow(ctx: &Arc<GpuContext>) {
    let (_dir, device, host) = read(ctx);
    let s = host.schema();
    let c = |n| column(&s, n);
    let all: Vec<usize> = (0..s.fields().len()).collect();
    let int = |name, op, v: i128| Predicate::Compare { column: c(name), op, value: Literal::Int(v) };
    let float = |name, op, v: f64| Predicate::Compare { column: c(name), op, value: Literal::Float(v) };
    let bytes = |name, op, v: &str| Predicate::Compare { column: c(name), op, value: Literal::Bytes(v.as_bytes().to_vec()) };
    let like = |name, p: &str| Predicate::Like { column: c(name), pattern: p.as_bytes().to_vec() };
    let predicates = vec![
        // TPC-H q6's shape: a date range, a decimal BETWEEN, a bound.
        Predicate::And(vec![
            int("date", CmpOp::GtEq, 8766),
            int("date", CmpOp::Lt, 9131),
            int("dec", CmpOp::GtEq, -50),
            int("dec", CmpOp::LtEq, 70),
            int("i32", CmpOp::Lt, 24),
        ]),
        float("f64", CmpOp::Eq, f64::NAN),
        float("f64", CmpOp::Gt, 0.0),
        float("f64", CmpOp::Eq, -0.0),
        float("f32", CmpOp::LtEq, -0.0),
        float("f32", CmpOp::Lt, f64::INFINITY),
        float("f32", CmpOp::NotEq, 1.5),
        int("u64", CmpOp::Gt, 1 << 63),
        int("i8", CmpOp::Lt, 0),
        int("i64", CmpOp::GtEq, 1 << 40),
        int("wide", CmpOp::Lt, -(1i128 << 80)),
        int("ts", CmpOp::Gt, 0),
        bytes("str", CmpOp::Eq, "PROMO"),
        bytes("view", CmpOp::Lt, "forest"),
        bytes("view", CmpOp::GtEq, "special requests"),
        bytes("large", CmpOp::NotEq, "x"),
        bytes("bin", CmpOp::Eq, "b13"),
        like("str", "PROMO%"),
        like("view", "%BRASS"),
        like("view", "%special%requests%"),
        like("large", "%green%"),
        like("str", "forest"),
        like("view", "%"),
        Predicate::Not(Box::new(like("str", "MEDIUM POLISHED%"))),
        Predicate::InList { column: c("str"), values: ["x", "PROMO", "green forest"].iter().map(|s| Literal::Bytes(s.as_bytes().to_vec())).collect() },
        Predicate::InList { column: c("i32"), values: vec![Literal::Int(-3), Literal::Int(0), Literal::Int(7)] },
        Predicate::Not(Box::new(Predicate::InList { column: c("i32"), values: vec![Literal::Int(5)] })),
        Predicate::Column(c("bool")),
        Predicate::Not(Box::new(Predicate::Column(c("bool")))),
        Predicate::Compare { column: c("bool"), op: CmpOp::Eq, value: Literal::Bool(false) },
        Predicate::IsNull(c("i8")),
        Predicate::IsNotNull(c("view")),
        // NULL OR TRUE is TRUE; NULL AND FALSE is FALSE; NOT NULL is NULL.
        Predicate::Or(vec![int("i32", CmpOp::Eq, 1), Predicate::IsNull(c("i32"))]),
        Predicate::And(vec![int("i32", CmpOp::Gt, 0), Predicate::Const(None)]),
        Predicate::Or(vec![int("i32", CmpOp::Gt, 0), Predicate::Const(None)]),
        Predicate::Not(Box::new(int("i32", CmpOp::Gt, 0))),
        Predicate::Const(Some(true)),
        Predicate::Const(Some(false)),
        Predicate::And(vec![]),
        Predicate::Or(vec![]),
        Predicate::CompareColumns { left: c("i16"), op: CmpOp::Lt, right: c("i32") },
        Predicate::CompareColumns { left: c("i8"), op: CmpOp::GtEq, right: c("u8") },
        Predicate::CompareColumns { left: c("f32"), op: CmpOp::LtEq, right: c("f64") },
        Predicate::CompareColumns { left: c("str"), op: CmpOp::Gt, right: c("view") },
        Predicate::CompareColumns { left: c("large"), op: CmpOp::Eq, right: c("view") },
        Predicate::CompareColumns { left: c("i64"), op: CmpOp::NotEq, right: c("i64") },
    ];
    for p in &predicates {
        check(&device, &host, p, &all);
    }
    // Only rows inside given ranges may be kept.
    let ranges = [10..500, 900..905, 1400..2999];
    let p = float("f64", CmpOp::Gt, 0.0);
    let got = device.filter_columns_within(&p, &all, Some(&ranges)).unwrap().to_record_batch().unwrap();
    let mask = host_eval(&host, &p);
    let mask: BooleanArray = (0..host.num_rows()).map(|i| Some(mask.is_valid(i) && mask.value(i) && ranges.iter().any(|r| r.contains(&i)))).collect();
    assert_batches_equal("within ranges", &filter_record_batch(&host, &mask).unwrap(), &got);
}

/// A random predicate over the table, of at most `depth` levels, its
/// literals mostly values the table holds.
fn random_predicate(r: &mut Rng, host: &RecordBatch, depth: u32) -> Predicate {
    let n = host.num_rows() as u64;
    let ops = [CmpOp::Eq, CmpOp::NotEq, CmpOp::Lt, CmpOp::LtEq, CmpOp::Gt, CmpOp::GtEq];
    if depth > 0 && r.below(3) == 0 {
        let parts = (0..1 + r.below(3)).map(|_| random_predicate(r, host, depth - 1)).collect();
        return match r.below(3) {
            0 => Predicate::And(parts),
            1 => Predicate::Or(parts),
            _ => Predicate::Not(Box::new(random_predicate(r, host, depth - 1))),
        };
    }
    let c = r.below(host.num_columns() as u64) as usize;
    let a = host.column(c);
    let row = r.below(n) as usize;
    if r.below(8) == 0 {
        return if r.below(2) == 0 { Predicate::IsNull(c) } else { Predicate::IsNotNull(c) };
    }
    let value = |r: &mut Rng, row: usize| -> Option<Literal> {
        let a = host.column(c);
        if a.is_null(row) {
            return None;
        }
        let any = a.as_any();
        Some(match a.data_type() {
            DataType::Int8 => Literal::Int(any.downcast_ref::<Int8Array>().unwrap().value(row).into()),
            DataType::Int16 => Literal::Int(any.downcast_ref::<Int16Array>().unwrap().value(row).into()),
            DataType::Int32 => Literal::Int(any.downcast_ref::<Int32Array>().unwrap().value(row).into()),
            DataType::Int64 => Literal::Int(any.downcast_ref::<Int64Array>().unwrap().value(row).into()),
            DataType::UInt8 => Literal::Int(any.downcast_ref::<UInt8Array>().unwrap().value(row).into()),
            DataType::UInt32 => Literal::Int(any.downcast_ref::<UInt32Array>().unwrap().value(row).into()),
            DataType::UInt64 => Literal::Int(any.downcast_ref::<UInt64Array>().unwrap().value(row).into()),
            DataType::Decimal128(..) => Literal::Int(any.downcast_ref::<Decimal128Array>().unwrap().value(row)),
            DataType::Date32 => Literal::Int(any.downcast_ref::<Date32Array>().unwrap().value(row).into()),
            DataType::Timestamp(TimeUnit::Microsecond, _) => Literal::Int(any.downcast_ref::<TimestampMicrosecondArray>().unwrap().value(row).into()),
            DataType::Float32 => Literal::Float(any.downcast_ref::<Float32Array>().unwrap().value(row).into()),
            DataType::Float64 => Literal::Float(any.downcast_ref::<Float64Array>().unwrap().value(row)),
            DataType::Boolean => Literal::Bool(any.downcast_ref::<BooleanArray>().unwrap().value(row)),
            DataType::Binary => Literal::Bytes(any.downcast_ref::<BinaryArray>().unwrap().value(row).to_vec()),
            _ => {
                let s = cast(a, &DataType::Utf8).unwrap();
                let s = s.as_any().downcast_ref::<StringArray>().unwrap().value(row).to_string();
                // Sometimes a prefix of the value, so that orderings split ties.
                let cut = if r.below(3) == 0 { r.below(s.len() as u64 + 1) as usize } else { s.len() };
                Literal::Bytes(s.as_bytes()[..cut].to_vec())
            }
        })
    };
    let Some(v) = value(r, row) else {
        return Predicate::IsNull(c);
    };
    if matches!(a.data_type(), DataType::Boolean) {
        return if r.below(2) == 0 {
            Predicate::Compare { column: c, op: [CmpOp::Eq, CmpOp::NotEq][r.below(2) as usize], value: v }
        } else {
            Predicate::Column(c)
        };
    }
    let is_text = matches!(a.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    match r.below(6) {
        0 if is_text => {
            let w = WORDS[r.below(WORDS.len() as u64) as usize];
            let pattern = match r.below(4) {
                0 => format!("{w}%"),
                1 => format!("%{w}"),
                2 => format!("%{w}%"),
                _ => format!("%{w}%{}%", WORDS[r.below(WORDS.len() as u64) as usize]),
            };
            Predicate::Like { column: c, pattern: pattern.into_bytes() }
        }
        1 => {
            let mut values = Vec::new();
            for _ in 0..1 + r.below(4) {
                let row = r.below(n) as usize;
                values.extend(value(r, row));
            }
            Predicate::InList { column: c, values }
        }
        _ => Predicate::Compare { column: c, op: ops[r.below(6) as usize], value: v },
    }
}

fn random_predicates_match_arrow(ctx: &Arc<GpuContext>) {
    let (_dir, device, host) = read(ctx);
    let mut r = Rng::new(2026);
    let all: Vec<usize> = (0..host.num_columns()).collect();
    let trials = if matches!(ctx.is_emulated(), true) { 120 } else { 400 };
    for t in 0..trials {
        let p = random_predicate(&mut r, &host, 3);
        if common::in_shard(t) {
            common::progress(format_args!("predicate {t}"));
            check(&device, &host, &p, &all);
        }
    }
}

fn kept_columns_in_any_order(ctx: &Arc<GpuContext>) {
    let (_dir, device, host) = read(ctx);
    let s = host.schema();
    let p = Predicate::Compare { column: column(&s, "i16"), op: CmpOp::Gt, value: Literal::Int(1000) };
    for keep in [vec![column(&s, "view"), column(&s, "i16")], vec![column(&s, "bool"), column(&s, "dec"), column(&s, "str")], vec![]] {
        check(&device, &host, &p, &keep);
    }
    // The filtered table has the kept fields, in order.
    let got = device.filter_columns(&p, &[column(&s, "view"), column(&s, "i16")]).unwrap();
    let names: Vec<&str> = got.schema().fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["view", "i16"]);
}

fn sliced_columns_filter_from_their_offset(ctx: &Arc<GpuContext>) {
    let _ = ctx;
    let dir = tempfile::tempdir().unwrap();
    let batch = table(11);
    let path = write(dir.path(), &batch);
    // Rows 150..650 and 1210..1900: pages cut on the device leave columns
    // that start inside a page (a non-zero array offset).
    let selection = RowSelection::from(vec![
        RowSelector::skip(150),
        RowSelector::select(500),
        RowSelector::skip(560),
        RowSelector::select(690),
        RowSelector::skip(ROWS - 1900),
    ]);
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_row_selection(selection).build().unwrap();
    let s = batch.schema();
    let p = Predicate::Or(vec![
        Predicate::Like { column: column(&s, "view"), pattern: b"%forest%".to_vec() },
        Predicate::Compare { column: column(&s, "i32"), op: CmpOp::Lt, value: Literal::Int(-50) },
    ]);
    let all: Vec<usize> = (0..s.fields().len()).collect();
    let mut offsets = 0;
    for table in reader {
        let table = table.unwrap();
        offsets += table.columns().iter().filter(|c| c.offset() > 0).count();
        let host = table.to_record_batch().unwrap();
        check(&table, &host, &p, &all);
    }
    assert!(offsets > 0, "no column with an offset was filtered");
}

/// The rows where `mask` is TRUE (not FALSE, not NULL).
fn true_rows(mask: &BooleanArray) -> arrow::buffer::BooleanBuffer {
    match mask.nulls() {
        Some(nulls) => mask.values() & nulls.inner(),
        None => mask.values().clone(),
    }
}

/// A mask limited to ranges of rows, computed on a read of some columns,
/// takes the same rows from a second read of other columns (late
/// materialization); a mask of the wrong length is refused.
fn masks_within_ranges(ctx: &Arc<GpuContext>) {
    let (dir, device, host) = read(ctx);
    let s = host.schema();
    let p = Predicate::Compare { column: column(&s, "i32"), op: CmpOp::GtEq, value: Literal::Int(0) };
    let within = [10..700, 950..951, 1400..2999];
    let mask = device.filter_mask(&p, Some(&within)).unwrap();
    let host_mask = true_rows(&host_eval(&host, &p));
    let want: arrow::buffer::BooleanBuffer = (0..host.num_rows()).map(|i| host_mask.value(i) && within.iter().any(|r| r.contains(&i))).collect();
    assert_eq!(mask, want);
    assert!(mask.count_set_bits() > 0 && mask.count_set_bits() < host.num_rows());
    // The other columns, read again, taken by that mask.
    let path = dir.path().join("filter.parquet");
    let others = read_parquet_to_device(&path, &ReadOptions::new().with_columns(["view", "dec", "bool"])).unwrap();
    let o = others.schema();
    let got = others.take_rows(&mask, &[column(&o, "bool"), column(&o, "view")]).unwrap().to_record_batch().unwrap();
    let expected = filter_record_batch(&host, &BooleanArray::new(want.clone(), None)).unwrap().project(&[column(&s, "bool"), column(&s, "view")]).unwrap();
    assert_batches_equal("take_rows of a second read", &expected, &got);
    // Nothing kept, everything kept, and a mask of another length.
    let none = others.take_rows(&arrow::buffer::BooleanBuffer::new_unset(host.num_rows()), &[0, 1, 2]).unwrap();
    assert_eq!(none.num_rows(), 0);
    let all = others.take_rows(&arrow::buffer::BooleanBuffer::new_set(host.num_rows()), &[0, 1, 2]).unwrap();
    assert_batches_equal("take_rows of every row", &others.to_record_batch().unwrap(), &all.to_record_batch().unwrap());
    assert!(matches!(others.take_rows(&arrow::buffer::BooleanBuffer::new_set(5), &[0]), Err(Error::InvalidOptions(_))));
}

fn refusals(ctx: &Arc<GpuContext>) {
    let _ = ctx;
    let dir = tempfile::tempdir().unwrap();
    // A list column and a dictionary column beside an integer.
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>((0..100).map(|i| Some(vec![Some(i), None])));
    let ids = Int32Array::from_iter_values(0..100);
    let dict: arrow::array::DictionaryArray<Int32Type> = (0..100).map(|i| if i % 2 == 0 { "a" } else { "b" }).collect();
    let batch = RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef), ("list", Arc::new(list)), ("dict", Arc::new(dict))]).unwrap();
    let path = dir.path().join("nested.parquet");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let device = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let lt = Predicate::Compare { column: 0, op: CmpOp::Lt, value: Literal::Int(10) };
    // Keeping the flat column works; the list cannot be gathered.
    assert_eq!(device.filter_columns(&lt, &[0]).unwrap().num_rows(), 10);
    assert!(matches!(device.filter_columns(&lt, &[0, 1]), Err(Error::Filter(_))));
    // A predicate on the list, or on a column decoded as another type than its field's.
    assert!(matches!(device.filter_columns(&Predicate::IsNull(1), &[0]), Err(Error::Filter(_))));
    let on_dict = Predicate::Compare { column: 2, op: CmpOp::Eq, value: Literal::Bytes(b"a".to_vec()) };
    match device.filter_columns(&on_dict, &[0]) {
        Err(Error::Filter(_)) => {}
        // A dictionary read as plain strings compares like them.
        Ok(t) if device.columns()[2].device_type() == device.columns()[2].field().data_type() => assert_eq!(t.num_rows(), 50),
        other => panic!("filter on a dictionary column: {:?}", other.map(|t| t.num_rows())),
    }
    // Literals of the wrong kind, and missing columns.
    assert!(matches!(
        device.filter_columns(&Predicate::Compare { column: 0, op: CmpOp::Lt, value: Literal::Float(1.0) }, &[0]),
        Err(Error::Filter(_))
    ));
    assert!(matches!(device.filter_columns(&Predicate::IsNull(7), &[0]), Err(Error::Filter(_))));
    assert!(matches!(device.filter_columns(&lt, &[7]), Err(Error::Filter(_))));
    assert_eq!(Error::Filter(String::new()).kind(), "filter");
}
