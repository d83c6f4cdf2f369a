//! Device grouped aggregation against a host reference: a table with
//! nullable string, view, date, integer and decimal columns is written to
//! Parquet, read with gpq, and aggregated on the device
//! (`DeviceTable::aggregate`) by several groupings and input programs; the
//! same aggregation computed in exact 128-bit arithmetic over a host copy of
//! the same table must give the same groups with the same states. What the
//! device must refuse (too many groups, a grouping value wider than its
//! field, an input out of its range) is an `Error::Aggregate`. Ignored
//! without a device or the emulator.

mod common;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Date32Array, Decimal128Array, Int16Array, Int32Array, Int64Array, RecordBatch, StringArray,
    StringViewArray, UInt8Array,
};
use arrow::datatypes::{DataType, Date32Type, Decimal128Type, Field, Int16Type, Int32Type, Int64Type, Schema, UInt8Type, i256};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use common::{Rng, gpu_trial, probe_device, run_trials};
use gpq::arrow::aggregate::{Aggregate, AggregateFunction as F, GroupBy, Groups, ValueExpr as V};
use gpq::arrow::filter::{CmpOp, Literal, Predicate};
use gpq::cuda::GpuContext;
use gpq::{DeviceTable, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "groupings_and_programs_match_the_host", groupings_match_the_host),
        gpu_trial(&device, "rows_within_ranges_only", rows_within_ranges_only),
        gpu_trial(&device, "rows_a_device_filter_keeps", rows_a_device_filter_keeps),
        gpu_trial(&device, "what_the_device_cannot_do_exactly_is_an_aggregate_error", refusals),
    ])
}

const ROWS: usize = 5000;

fn table(seed: u64) -> RecordBatch {
    let mut r = Rng::new(seed);
    let mut v = |n: u64| r.below(n);
    let rows = 0..ROWS;
    let flags = ["A", "N", "R"];
    let flag: StringArray = rows.clone().map(|_| (v(11) != 0).then(|| flags[v(3) as usize])).collect();
    let status: StringViewArray = rows.clone().map(|_| Some(if v(2) == 0 { "F" } else { "O" })).collect();
    let day: Date32Array = rows.clone().map(|_| Some(8000 + v(12) as i32)).collect();
    let small: Int16Array = rows.clone().map(|_| (v(7) != 0).then(|| v(9) as i16 - 4)).collect();
    let big: Int64Array = rows.clone().map(|_| Some(v(1 << 41) as i64 - (1 << 40))).collect();
    let huge: Int64Array = rows.clone().map(|_| Some(if v(50) == 0 { i64::MAX - v(9) as i64 } else { v(100) as i64 })).collect();
    let price: Decimal128Array =
        rows.clone().map(|_| (v(13) != 0).then(|| v(10_000_000) as i128)).collect::<Decimal128Array>().with_precision_and_scale(15, 2).unwrap();
    let disc: Decimal128Array = rows.clone().map(|_| Some(v(11) as i128)).collect::<Decimal128Array>().with_precision_and_scale(15, 2).unwrap();
    let qty: Int32Array = rows.clone().map(|_| (v(9) != 0).then(|| v(50) as i32 + 1)).collect();
    let id: Int64Array = rows.clone().map(|i| Some(i as i64)).collect();
    let bytes: UInt8Array = rows.clone().map(|_| (v(17) != 0).then(|| v(256) as u8)).collect();
    let words = ["short", "a much longer comment", ""];
    let comment: StringArray = rows.clone().map(|_| Some(words[v(3) as usize])).collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("flag", Arc::new(flag)),
        ("status", Arc::new(status)),
        ("day", Arc::new(day)),
        ("small", Arc::new(small)),
        ("big", Arc::new(big)),
        ("huge", Arc::new(huge)),
        ("price", Arc::new(price)),
        ("disc", Arc::new(disc)),
        ("qty", Arc::new(qty)),
        ("id", Arc::new(id)),
        ("comment", Arc::new(comment)),
        ("byte", Arc::new(bytes)),
    ];
    let fields: Vec<Field> = columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), a.null_count() > 0)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns.into_iter().map(|(_, a)| a).collect()).unwrap()
}

/// The table on the device and its host copy (what the device holds).
fn load(dir: &std::path::Path, seed: u64) -> (DeviceTable, RecordBatch) {
    let batch = table(seed);
    let path = dir.join("aggregate.parquet");
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(2000)).set_data_page_row_count_limit(500).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let device = read_parquet_to_device(&path, &ReadOptions::new()).unwrap();
    let host = device.to_record_batch().unwrap();
    assert_eq!(host.num_rows(), ROWS);
    (device, host)
}

fn col(batch: &RecordBatch, name: &str) -> usize {
    batch.schema().index_of(name).unwrap()
}

/// Row `row` of a numeric column as its unscaled value.
fn number(a: &dyn Array, row: usize) -> Option<i128> {
    if a.is_null(row) {
        return None;
    }
    Some(match a.data_type() {
        DataType::Int16 => a.as_primitive::<Int16Type>().value(row) as i128,
        DataType::Int32 => a.as_primitive::<Int32Type>().value(row) as i128,
        DataType::Int64 => a.as_primitive::<Int64Type>().value(row) as i128,
        DataType::UInt8 => a.as_primitive::<UInt8Type>().value(row) as i128,
        DataType::Date32 => a.as_primitive::<Date32Type>().value(row) as i128,
        DataType::Decimal128(..) => a.as_primitive::<Decimal128Type>().value(row),
        t => panic!("no number of type {t}"),
    })
}

/// `e` on row `row`, exactly; `Err` where the device must refuse.
fn eval(batch: &RecordBatch, e: &V, row: usize) -> Result<Option<i128>, ()> {
    let two = |a: &V, b: &V| -> Result<Option<(i128, i128)>, ()> { Ok(eval(batch, a, row)?.zip(eval(batch, b, row)?)) };
    Ok(match e {
        V::Column(c) => number(batch.column(*c).as_ref(), row),
        V::Literal(v) => *v,
        V::Add(a, b) => two(a, b)?.map(|(x, y)| x.checked_add(y).ok_or(())).transpose()?,
        V::Sub(a, b) => two(a, b)?.map(|(x, y)| x.checked_sub(y).ok_or(())).transpose()?,
        V::Mul(a, b) => two(a, b)?.map(|(x, y)| x.checked_mul(y).ok_or(())).transpose()?,
        V::Scale(a, k) => eval(batch, a, row)?.map(|x| x.checked_mul(10i128.pow(*k)).ok_or(())).transpose()?,
        V::FitSigned(a, bits) => {
            let x = eval(batch, a, row)?;
            if x.is_some_and(|x| x < -(1i128 << (bits - 1)) || x >= 1i128 << (bits - 1)) {
                return Err(());
            }
            x
        }
        V::FitUnsigned(a, bits) => {
            let x = eval(batch, a, row)?;
            if x.is_some_and(|x| x < 0 || x >= 1i128 << bits) {
                return Err(());
            }
            x
        }
        V::FitDigits(a, d) => {
            let x = eval(batch, a, row)?;
            if x.is_some_and(|x| x.unsigned_abs() >= 10u128.pow(*d)) {
                return Err(());
            }
            x
        }
    })
}

type Table = BTreeMap<Vec<String>, Vec<(u64, i256)>>;

fn render(a: &dyn Array, row: usize) -> String {
    if a.is_null(row) {
        return "NULL".into();
    }
    ArrayFormatter::try_new(a, &FormatOptions::default()).unwrap().value(row).to_string()
}

/// The host reference over the rows `within` (all if `None`).
fn reference(batch: &RecordBatch, g: &GroupBy, within: Option<&[std::ops::Range<usize>]>) -> Table {
    let mut out = Table::new();
    for row in 0..batch.num_rows() {
        if within.is_some_and(|rs| !rs.iter().any(|r| r.contains(&row))) {
            continue;
        }
        let key: Vec<String> = g.keys.iter().map(|&c| render(batch.column(c).as_ref(), row)).collect();
        let states = out.entry(key).or_insert_with(|| vec![(0, i256::ZERO); g.aggregates.len()]);
        for (a, s) in g.aggregates.iter().zip(states.iter_mut()) {
            let Some(input) = &a.input else {
                s.0 += 1;
                continue;
            };
            let Some(x) = eval(batch, input, row).expect("the reference input is in range") else { continue };
            let x = i256::from_i128(x);
            s.1 = match (a.function, s.0) {
                (F::Sum, _) => s.1 + x,
                (F::Min, 0) | (F::Max, 0) => x,
                (F::Min, _) => s.1.min(x),
                (F::Max, _) => s.1.max(x),
                _ => i256::ZERO,
            };
            s.0 += 1;
        }
    }
    out
}

fn device_groups(groups: &Groups) -> Table {
    let mut out = Table::new();
    for i in 0..groups.len {
        let key: Vec<String> = groups.keys.iter().map(|k| render(k.as_ref(), i)).collect();
        let states = groups.states.iter().map(|s| (s.counts[i], s.values[i])).collect();
        assert!(out.insert(key.clone(), states).is_none(), "group {key:?} twice");
    }
    out
}

fn agg(function: F, input: Option<V>) -> Aggregate {
    Aggregate { function, input }
}

fn c(i: usize) -> Box<V> {
    Box::new(V::Column(i))
}

fn groupings_match_the_host(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for seed in [1u64, 2] {
        let (device, host) = load(dir.path(), seed);
        let [flag, status, day, small, big, price, disc, qty] =
            ["flag", "status", "day", "small", "big", "price", "disc", "qty"].map(|n| col(&host, n));
        // TPC-H q1's shape: price * (1 - disc) at scale 4, a sum of an
        // integer kept in i64's range, counts, a min and a max.
        let q1 = vec![
            agg(F::Sum, Some(V::Column(price))),
            agg(F::Sum, Some(V::Mul(c(price), Box::new(V::Sub(Box::new(V::Literal(Some(100))), c(disc)))))),
            agg(F::Sum, Some(V::FitSigned(c(qty), 64))),
            agg(F::CountRows, None),
            agg(F::Count, Some(V::Column(qty))),
            agg(F::Min, Some(V::Column(qty))),
            agg(F::Max, Some(V::Column(price))),
            agg(F::Sum, Some(V::Scale(c(disc), 3))),
        ];
        let groupings: Vec<(Vec<usize>, Vec<Aggregate>)> = vec![
            (vec![flag, status], q1.clone()),
            (vec![status, flag], q1.clone()),
            (vec![day, small], vec![agg(F::Sum, Some(V::Column(big))), agg(F::Min, Some(V::Column(big))), agg(F::Max, Some(V::Column(small)))]),
            (vec![], q1),
            (vec![small], vec![agg(F::Count, Some(V::Add(c(qty), Box::new(V::Literal(None)))))]),
            // Unsigned keys above the signed range of their width.
            (vec![col(&host, "byte")], vec![agg(F::CountRows, None), agg(F::Max, Some(V::Column(price)))]),
            // Sums beyond 128 bits (products near 2^126 in each row).
            (vec![status], vec![agg(F::Sum, Some(V::Mul(c(col(&host, "huge")), c(col(&host, "huge"))))), agg(F::Sum, Some(V::Column(big)))]),
        ];
        for (keys, aggregates) in groupings {
            let g = GroupBy { keys, aggregates, capacity: GroupBy::DEFAULT_CAPACITY };
            let got = device.aggregate(&g, None).unwrap_or_else(|e| panic!("{:?}: {e}", g.keys));
            assert_eq!(got.rows_in, ROWS as u64);
            assert_eq!(device_groups(&got), reference(&host, &g, None), "seed {seed}, keys {:?}", g.keys);
            for (k, &c) in got.keys.iter().zip(&g.keys) {
                assert_eq!(k.data_type(), host.column(c).data_type());
            }
        }
    }
}

fn rows_within_ranges_only(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let (device, host) = load(dir.path(), 3);
    let g = GroupBy {
        keys: vec![col(&host, "flag")],
        aggregates: vec![agg(F::CountRows, None), agg(F::Sum, Some(V::Column(col(&host, "price"))))],
        capacity: 16,
    };
    let within = [10..700, 1999..2001, 4990..6000];
    let got = device.aggregate(&g, Some(&within)).unwrap();
    assert_eq!(got.rows_in, 690 + 2 + 10);
    assert_eq!(device_groups(&got), reference(&host, &g, Some(&within)));
    let none = device.aggregate(&g, Some(&[])).unwrap();
    assert_eq!((none.len, none.rows_in), (0, 0));
}

fn rows_a_device_filter_keeps(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let (device, host) = load(dir.path(), 5);
    let (qty, price, flag) = (col(&host, "qty"), col(&host, "price"), col(&host, "flag"));
    let g = GroupBy {
        keys: vec![flag],
        aggregates: vec![agg(F::CountRows, None), agg(F::Sum, Some(V::Column(price))), agg(F::Min, Some(V::Column(qty)))],
        capacity: 16,
    };
    // qty < 25 (NULL drops the row), inside the ranges or everywhere.
    let predicate = Predicate::Compare { column: qty, op: CmpOp::Lt, value: Literal::Int(25) };
    let kept = |row: usize| number(host.column(qty).as_ref(), row).is_some_and(|q| q < 25);
    for within in [None, Some(vec![0..1000, 3000..3100])] {
        let rows: Vec<std::ops::Range<usize>> = (0..ROWS)
            .filter(|&r| kept(r) && within.as_ref().is_none_or(|w| w.iter().any(|x| x.contains(&r))))
            .map(|r| r..r + 1)
            .collect();
        let got = device.filter_aggregate(&predicate, within.as_deref(), &g).unwrap();
        assert_eq!(got.rows_in, rows.len() as u64);
        assert_eq!(device_groups(&got), reference(&host, &g, Some(&rows)), "within {within:?}");
    }
    // A predicate the device cannot evaluate is the filter's error.
    let like_on_int = Predicate::Like { column: qty, pattern: b"1%".to_vec() };
    assert!(matches!(device.filter_aggregate(&like_on_int, None, &g), Err(Error::Filter(_))));
}

fn refusals(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let (device, host) = load(dir.path(), 4);
    let count = vec![agg(F::CountRows, None)];
    let refused = |g: &GroupBy| match device.aggregate(g, None) {
        Err(Error::Aggregate(why)) => why,
        other => panic!("{:?}: {:?}", g.keys, other.map(|g| g.len)),
    };
    // Five thousand groups in a table of 64.
    let ids = GroupBy { keys: vec![col(&host, "id")], aggregates: count.clone(), capacity: 64 };
    assert!(refused(&ids).contains("more than 64 groups"));
    // ... which the default table holds.
    assert_eq!(device.aggregate(&GroupBy { capacity: GroupBy::DEFAULT_CAPACITY * 2, ..ids }, None).unwrap().len, ROWS);
    // A string longer than its field, and an i64 beyond 62 bits.
    let long = GroupBy { keys: vec![col(&host, "comment")], aggregates: count.clone(), capacity: 64 };
    assert!(refused(&long).contains("wider"));
    let huge = GroupBy { keys: vec![col(&host, "huge")], aggregates: count.clone(), capacity: 1024 };
    assert!(refused(&huge).contains("wider"));
    // big * big overflows i64; huge + huge overflows i64 (but not i128: only the fit refuses).
    let big = col(&host, "big");
    let squared = GroupBy { keys: vec![], aggregates: vec![agg(F::Sum, Some(V::FitSigned(Box::new(V::Mul(c(big), c(big))), 64)))], capacity: 1 };
    assert!(refused(&squared).contains("overflow"));
    let huge = col(&host, "huge");
    let exact = GroupBy { keys: vec![], aggregates: vec![agg(F::Sum, Some(V::Add(c(huge), c(huge))))], capacity: 1 };
    assert_eq!(device_groups(&device.aggregate(&exact, None).unwrap()), reference(&host, &exact, None));
    // A min of a value beyond i64, and a decimal cast out of its precision.
    let min = GroupBy { keys: vec![], aggregates: vec![agg(F::Min, Some(V::Mul(c(huge), c(huge))))], capacity: 1 };
    assert!(refused(&min).contains("overflow"));
    let price = col(&host, "price");
    let digits = GroupBy { keys: vec![], aggregates: vec![agg(F::Sum, Some(V::FitDigits(Box::new(V::Scale(c(price), 4)), 10)))], capacity: 1 };
    assert!(refused(&digits).contains("overflow"));
    // Types it has no arithmetic or key for.
    let on_string = GroupBy { keys: vec![], aggregates: vec![agg(F::Sum, Some(V::Column(col(&host, "flag"))))], capacity: 1 };
    assert!(matches!(device.aggregate(&on_string, None), Err(Error::Aggregate(_))));
    assert!(matches!(device.aggregate(&GroupBy { keys: vec![99], aggregates: count, capacity: 1 }, None), Err(Error::Aggregate(_))));
    assert_eq!(Error::Aggregate(String::new()).kind(), "aggregate");
}
