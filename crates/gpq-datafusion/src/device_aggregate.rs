//! What the device computes for a partial aggregation: the translation of
//! DataFusion's `Partial` aggregation into a [`gpq::arrow::aggregate::GroupBy`]
//! (see the `aggregate` module for what it takes), DataFusion's partial
//! states made from the device's groups, and the sink through which a GPU
//! scan sends them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::{ArrayRef, Decimal128Array, Decimal256Array, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Schema, SchemaRef, i256};
use datafusion::common::{ScalarValue, Statistics};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal, TryCastExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use tokio::sync::mpsc;
use tracing::debug;

use gpq::arrow::aggregate::{Aggregate, AggregateFunction, GroupBy, Groups, ValueExpr};
use gpq::arrow::filter::Predicate;
use gpq::{DeviceTable, Error};

/// Per-partition metrics of the device aggregation.
#[derive(Debug, Clone)]
pub(crate) struct AggregateMetrics {
    /// Rows aggregated on the device.
    pub rows_in: Count,
    /// Partial-state rows (groups) the device aggregation sent.
    pub groups_out: Count,
    /// Time aggregating on the device.
    pub time: Time,
    /// Device batches the device could not aggregate (copied to the host
    /// and aggregated there).
    pub fallbacks: Count,
}

impl AggregateMetrics {
    /// Registers the metrics of `partition`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let count = |name: &'static str| MetricBuilder::new(set).counter(name, partition);
        AggregateMetrics {
            rows_in: count("device_aggregate_rows_in"),
            groups_out: count("device_aggregate_groups_out"),
            time: MetricBuilder::new(set).subset_time("device_aggregate_time", partition),
            fallbacks: count("device_aggregate_fallbacks"),
        }
    }
}

/// A numeric value's type, as the translation tracks it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int { bits: u32, signed: bool },
    Decimal { precision: u8, scale: i8 },
    Date,
}

fn num_of(t: &DataType) -> Option<Num> {
    use DataType as D;
    Some(match t {
        D::Int8 => Num::Int { bits: 8, signed: true },
        D::Int16 => Num::Int { bits: 16, signed: true },
        D::Int32 => Num::Int { bits: 32, signed: true },
        D::Int64 => Num::Int { bits: 64, signed: true },
        D::UInt8 => Num::Int { bits: 8, signed: false },
        D::UInt16 => Num::Int { bits: 16, signed: false },
        D::UInt32 => Num::Int { bits: 32, signed: false },
        D::UInt64 => Num::Int { bits: 64, signed: false },
        D::Decimal128(p, s) => Num::Decimal { precision: *p, scale: *s },
        D::Date32 => Num::Date,
        _ => return None,
    })
}

fn fit(e: ValueExpr, bits: u32, signed: bool) -> ValueExpr {
    if signed { ValueExpr::FitSigned(Box::new(e), bits) } else { ValueExpr::FitUnsigned(Box::new(e), bits) }
}

fn scaled(e: ValueExpr, by: i8) -> Option<ValueExpr> {
    match by {
        0 => Some(e),
        1..=38 => Some(ValueExpr::Scale(Box::new(e), by as u32)),
        _ => None,
    }
}

/// `e` (over `schema`, the scan's output) as a device input program.
fn value(e: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<(ValueExpr, Num)> {
    if let Some(c) = e.downcast_ref::<Column>() {
        let t = schema.fields().get(c.index())?.data_type();
        return Some((ValueExpr::Column(c.index()), num_of(t)?));
    }
    if let Some(l) = e.downcast_ref::<Literal>() {
        let v = l.value();
        let num = num_of(&v.data_type())?;
        let x = match &v {
            ScalarValue::Int8(x) => x.map(i128::from),
            ScalarValue::Int16(x) => x.map(i128::from),
            ScalarValue::Int32(x) => x.map(i128::from),
            ScalarValue::Int64(x) => x.map(i128::from),
            ScalarValue::UInt8(x) => x.map(i128::from),
            ScalarValue::UInt16(x) => x.map(i128::from),
            ScalarValue::UInt32(x) => x.map(i128::from),
            ScalarValue::UInt64(x) => x.map(i128::from),
            ScalarValue::Decimal128(x, ..) => *x,
            _ => return None,
        };
        return Some((ValueExpr::Literal(x), num));
    }
    let cast = e.downcast_ref::<CastExpr>().map(|c| (c.expr(), c.cast_type())).or_else(|| e.downcast_ref::<TryCastExpr>().map(|c| (c.expr(), c.cast_type())));
    if let Some((inner, to)) = cast {
        let (x, from) = value(inner, schema)?;
        let to_num = num_of(to)?;
        let e = match (from, to_num) {
            (Num::Decimal { scale: s1, .. }, Num::Decimal { precision, scale }) => ValueExpr::FitDigits(Box::new(scaled(x, scale.checked_sub(s1)?)?), precision as u32),
            (Num::Int { .. }, Num::Decimal { precision, scale }) => ValueExpr::FitDigits(Box::new(scaled(x, scale)?), precision as u32),
            (Num::Int { .. }, Num::Int { bits, signed }) => fit(x, bits, signed),
            _ => return None,
        };
        return Some((e, to_num));
    }
    if let Some(b) = e.downcast_ref::<BinaryExpr>() {
        let op = *b.op();
        if !matches!(op, Operator::Plus | Operator::Minus | Operator::Multiply) {
            return None;
        }
        let (l, ln) = value(b.left(), schema)?;
        let (r, rn) = value(b.right(), schema)?;
        let out = num_of(&e.data_type(schema).ok()?)?;
        let node = |l, r| match op {
            Operator::Plus => ValueExpr::Add(Box::new(l), Box::new(r)),
            Operator::Minus => ValueExpr::Sub(Box::new(l), Box::new(r)),
            _ => ValueExpr::Mul(Box::new(l), Box::new(r)),
        };
        let e = match (ln, rn, out) {
            (Num::Int { .. }, Num::Int { .. }, Num::Int { bits, signed }) => fit(node(l, r), bits, signed),
            (Num::Decimal { scale: s1, .. }, Num::Decimal { scale: s2, .. }, Num::Decimal { scale, .. }) => {
                if op == Operator::Multiply {
                    if i16::from(s1) + i16::from(s2) != i16::from(scale) {
                        return None;
                    }
                    node(l, r)
                } else {
                    if scale != s1.max(s2) {
                        return None;
                    }
                    node(scaled(l, scale.checked_sub(s1)?)?, scaled(r, scale.checked_sub(s2)?)?)
                }
            }
            _ => return None,
        };
        return Some((e, out));
    }
    None
}

/// Default of [`GpqAggregatePushdown::max_groups`](crate::GpqAggregatePushdown::max_groups):
/// one device table of 4096 slots, tried once. On the H100 (BENCHMARKS.md
/// section 12.5) TPC-H q15, q17, q18 and q20 at SF 10, which group by
/// supplier, part, order, and part and supplier, ran slower with a limit of
/// 2^17 groups than without the device aggregation, and q1's and q6's
/// gains need only a few groups.
pub const DEFAULT_DEVICE_AGGREGATION_MAX_GROUPS: usize = GroupBy::FIRST_TABLE;

/// How many distinct keys the grouping columns `keys` (of the scan whose
/// statistics are `stats`) can make at most: the product of each column's
/// `max - min + 1` (plus one for a column that may hold nulls), saturating.
/// `None` where a key is not an integer or date column with both bounds
/// known (strings: their bounds say nothing of their count).
pub(crate) fn key_span(stats: &Statistics, keys: &[usize]) -> Option<u128> {
    let mut span: u128 = 1;
    for &k in keys {
        let c = stats.column_statistics.get(k)?;
        let (Some(lo), Some(hi)) = (c.min_value.get_value().and_then(integer_of), c.max_value.get_value().and_then(integer_of)) else {
            return None;
        };
        let values = u128::try_from(hi.checked_sub(lo)?).ok()?.saturating_add(1);
        let nulls = u128::from(c.null_count.get_value() != Some(&0));
        span = span.saturating_mul(values.saturating_add(nulls));
    }
    Some(span)
}

fn integer_of(v: &ScalarValue) -> Option<i128> {
    use ScalarValue as S;
    Some(match v {
        S::Int8(Some(x)) => i128::from(*x),
        S::Int16(Some(x)) => i128::from(*x),
        S::Int32(Some(x)) | S::Date32(Some(x)) => i128::from(*x),
        S::Int64(Some(x)) => i128::from(*x),
        S::UInt8(Some(x)) => i128::from(*x),
        S::UInt16(Some(x)) => i128::from(*x),
        S::UInt32(Some(x)) => i128::from(*x),
        S::UInt64(Some(x)) => i128::from(*x),
        _ => return None,
    })
}

/// How one DataFusion aggregate's partial state is made from the device's.
#[derive(Debug, Clone)]
enum StatePlan {
    /// `COUNT`: one Int64 state.
    Count,
    /// `SUM`: one state of this type, NULL where nothing was summed.
    Sum(DataType),
    /// `AVG`: a UInt64 count and a sum of this type (a decimal, 128 or 256
    /// bits wide), both NULL where nothing was counted.
    Avg(DataType),
    /// `MIN` or `MAX`: one state of the input's type.
    Extreme(DataType),
}

/// A partial aggregation the device runs: the grouping and aggregates over
/// the scan's output columns, and how its groups become DataFusion's
/// partial-state rows.
#[derive(Debug)]
pub(crate) struct DeviceAggregation {
    group_by: GroupBy,
    states: Vec<StatePlan>,
    schema: SchemaRef,
}

impl DeviceAggregation {
    /// The device plan of `agg` (a `Partial` aggregation whose input is the
    /// scan of schema `scan_schema`, through `projection` if given), or
    /// `None` where the device cannot compute it exactly, or where the
    /// scan's statistics (`scan_stats`) show that its integer and date keys
    /// span more than `max_groups` values between them: such a grouping
    /// almost always has more groups a batch than the device table holds,
    /// and trying the device first only delays the host. A batch with more
    /// than `max_groups` groups goes to the host.
    pub fn plan(
        agg: &AggregateExec,
        projection: Option<&[Arc<dyn PhysicalExpr>]>,
        scan_schema: &Schema,
        scan_stats: &Statistics,
        max_groups: usize,
    ) -> Option<DeviceAggregation> {
        let over_scan = |e: &Arc<dyn PhysicalExpr>| -> Option<Arc<dyn PhysicalExpr>> {
            let Some(proj) = projection else { return Some(Arc::clone(e)) };
            Arc::clone(e)
                .transform_up(|node| {
                    Ok(match node.downcast_ref::<Column>() {
                        Some(c) => Transformed::yes(Arc::clone(proj.get(c.index()).ok_or_else(|| DataFusionError::Internal("projection index".into()))?)),
                        None => Transformed::no(node),
                    })
                })
                .data()
                .ok()
        };
        let group = agg.group_expr();
        if !group.is_single() || !group.null_expr().is_empty() {
            return None;
        }
        let mut keys = Vec::new();
        for (e, _) in group.expr() {
            let e = over_scan(e)?;
            let c = e.downcast_ref::<Column>()?;
            let t = scan_schema.fields().get(c.index())?.data_type();
            use DataType as D;
            if !matches!(t, D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32 | D::Date32 | D::Utf8 | D::LargeUtf8 | D::Utf8View) {
                return None;
            }
            keys.push(c.index());
        }
        // The largest table the device grows (as `DeviceTable::aggregate` sizes it).
        let most = max_groups.clamp(1, GroupBy::MAX_CAPACITY).next_power_of_two();
        if let Some(span) = key_span(scan_stats, &keys)
            && span > most as u128
        {
            debug!(span, most, "no device aggregation: its keys span more values than the device table holds");
            return None;
        }
        let mut aggregates = Vec::new();
        let mut states = Vec::new();
        for a in agg.aggr_expr() {
            if a.is_distinct() || !a.order_bys().is_empty() || a.ignore_nulls() {
                return None;
            }
            let args = a.expressions();
            let [arg] = args.as_slice() else { return None };
            let arg = over_scan(arg)?;
            let fields = a.state_fields().ok()?;
            let types: Vec<&DataType> = fields.iter().map(|f| f.data_type()).collect();
            let name = a.fun().name();
            let (aggregate, state) = match (name, types.as_slice()) {
                ("count", [DataType::Int64]) => {
                    let constant = arg.downcast_ref::<Literal>().is_some_and(|l| !l.value().is_null());
                    if constant {
                        (Aggregate { function: AggregateFunction::CountRows, input: None }, StatePlan::Count)
                    } else {
                        let (e, _) = value(&arg, scan_schema)?;
                        (Aggregate { function: AggregateFunction::Count, input: Some(e) }, StatePlan::Count)
                    }
                }
                ("sum", [t @ (DataType::Int64 | DataType::UInt64 | DataType::Decimal128(..))]) => {
                    let (e, n) = value(&arg, scan_schema)?;
                    if n == Num::Date {
                        return None;
                    }
                    (Aggregate { function: AggregateFunction::Sum, input: Some(e) }, StatePlan::Sum((*t).clone()))
                }
                ("avg", [DataType::UInt64, t @ (DataType::Decimal128(..) | DataType::Decimal256(..))]) => {
                    let (e, n) = value(&arg, scan_schema)?;
                    if !matches!(n, Num::Decimal { .. }) {
                        return None;
                    }
                    (Aggregate { function: AggregateFunction::Sum, input: Some(e) }, StatePlan::Avg((*t).clone()))
                }
                ("min" | "max", [t]) => {
                    let (e, _) = value(&arg, scan_schema)?;
                    if !matches!(t, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::Date32 | DataType::Decimal128(..)) {
                        return None;
                    }
                    let function = if name == "min" { AggregateFunction::Min } else { AggregateFunction::Max };
                    (Aggregate { function, input: Some(e) }, StatePlan::Extreme((*t).clone()))
                }
                _ => return None,
            };
            aggregates.push(aggregate);
            states.push(state);
        }
        if aggregates.len() > GroupBy::MAX_AGGREGATES {
            return None;
        }
        let group_by = GroupBy { keys, aggregates, capacity: max_groups };
        Some(DeviceAggregation { group_by, states, schema: agg.schema() })
    }

    /// DataFusion's partial-state rows of `groups`.
    fn to_batch(&self, groups: &Groups) -> Result<RecordBatch> {
        let fields = self.schema.fields();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
        for (k, f) in groups.keys.iter().zip(fields.iter()) {
            columns.push(if k.data_type() == f.data_type() { Arc::clone(k) } else { arrow::compute::cast(k, f.data_type())? });
        }
        for (plan, s) in self.states.iter().zip(&groups.states) {
            let some = |i: usize| s.counts[i] > 0;
            match plan {
                StatePlan::Count => columns.push(Arc::new(Int64Array::from_iter_values(s.counts.iter().map(|&c| c as i64)))),
                StatePlan::Sum(t) => columns.push(int_array(t, (0..groups.len).map(|i| some(i).then_some(s.values[i])))?),
                StatePlan::Avg(t) => {
                    columns.push(Arc::new(UInt64Array::from_iter((0..groups.len).map(|i| some(i).then_some(s.counts[i])))));
                    columns.push(int_array(t, (0..groups.len).map(|i| some(i).then_some(s.values[i])))?);
                }
                StatePlan::Extreme(t) => columns.push(int_array(t, (0..groups.len).map(|i| some(i).then_some(s.values[i])))?),
            }
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// The grouping with the scan's output column `j` at table column `map[j]`.
    fn mapped(&self, map: &[usize]) -> GroupBy {
        self.group_by.map_columns(&|c| map.get(c).copied().unwrap_or(usize::MAX))
    }
}

/// An array of `t` (integers, dates, decimals) from unscaled values, cut to
/// its width as DataFusion's wrapping sums would leave them (a 256-bit
/// decimal, an `AVG`'s sum, keeps them exact).
fn int_array(t: &DataType, values: impl Iterator<Item = Option<i256>>) -> Result<ArrayRef> {
    let values: Vec<Option<i256>> = values.collect();
    let array: ArrayRef = match t {
        DataType::Decimal256(p, s) => Arc::new(Decimal256Array::from(values).with_precision_and_scale(*p, *s)?),
        DataType::Decimal128(p, s) => {
            Arc::new(Decimal128Array::from(values.into_iter().map(|v| v.map(i256::as_i128)).collect::<Vec<_>>()).with_precision_and_scale(*p, *s)?)
        }
        DataType::UInt64 => Arc::new(UInt64Array::from_iter(values.into_iter().map(|v| v.map(|v| v.as_i128() as u64)))),
        _ => {
            let wide: ArrayRef = Arc::new(Int64Array::from_iter(values.into_iter().map(|v| v.map(|v| v.as_i128() as i64))));
            arrow::compute::cast(&wide, t)?
        }
    };
    Ok(array)
}

/// Where one partition's device aggregation goes: its plan, and the channel
/// to the node's output.
pub(crate) struct AggregateSink {
    plan: Arc<DeviceAggregation>,
    tx: mpsc::UnboundedSender<Result<RecordBatch>>,
    /// Batches the device could not aggregate; after a few it stops trying.
    failures: AtomicUsize,
}

/// Batches of a partition the device may fail to aggregate before the rest
/// of the partition goes to the host without trying.
const MAX_FAILURES: usize = 2;

impl AggregateSink {
    /// A sink for `plan`'s states, sending them to `tx`.
    pub fn new(plan: Arc<DeviceAggregation>, tx: mpsc::UnboundedSender<Result<RecordBatch>>) -> Self {
        AggregateSink { plan, tx, failures: AtomicUsize::new(0) }
    }

    /// Whether the node's output is gone (the query stopped): the scan stops too.
    pub fn closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Aggregates `table` (the scan's output column `j` at table column
    /// `map[j]`, or at `j` without a map; only rows inside `within` if
    /// given) on the device and sends the partial states: `Some(rows
    /// aggregated)`, or `None` where the device cannot (the caller sends
    /// the rows to the host instead). After `Some`, [`AggregateSink::closed`]
    /// says whether the query still wants states.
    pub fn try_aggregate(&self, metrics: &AggregateMetrics, table: &DeviceTable, map: Option<&[usize]>, within: Option<&[std::ops::Range<usize>]>) -> gpq::Result<Option<usize>> {
        self.run(metrics, map, |group_by| table.aggregate(group_by, within))
    }

    /// [`AggregateSink::try_aggregate`] of the rows where `predicate` (over
    /// the table's columns) holds, the filter evaluated on the device; `None`
    /// too where the device cannot evaluate it (the caller filters its own
    /// way, which counts that).
    pub fn try_filter_aggregate(
        &self,
        metrics: &AggregateMetrics,
        table: &DeviceTable,
        predicate: &Predicate,
        map: &[usize],
        within: Option<&[std::ops::Range<usize>]>,
    ) -> gpq::Result<Option<usize>> {
        match self.run(metrics, Some(map), |group_by| table.filter_aggregate(predicate, within, group_by)) {
            Err(Error::Filter(why)) => {
                debug!(%why, "the device cannot filter this batch for its aggregation");
                Ok(None)
            }
            other => other,
        }
    }

    fn run(&self, m: &AggregateMetrics, map: Option<&[usize]>, aggregate: impl FnOnce(&GroupBy) -> gpq::Result<Groups>) -> gpq::Result<Option<usize>> {
        if self.failures.load(Ordering::Relaxed) >= MAX_FAILURES {
            return Ok(None);
        }
        let group_by = match map {
            Some(map) => self.plan.mapped(map),
            None => self.plan.group_by.clone(),
        };
        match aggregate(&group_by) {
            Ok(groups) => {
                m.rows_in.add(groups.rows_in as usize);
                m.groups_out.add(groups.len);
                m.time.add_duration(groups.time);
                let batch = self.plan.to_batch(&groups).map_err(|e| Error::Internal(format!("device aggregation states: {e}")))?;
                // A closed channel: the query stopped; nothing waits for the states.
                let _ = self.tx.send(Ok(batch));
                Ok(Some(groups.rows_in as usize))
            }
            Err(Error::Aggregate(why)) => {
                debug!(%why, "gpq scan aggregates a batch on the host");
                m.fallbacks.add(1);
                self.failures.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::common::ColumnStatistics;
    use datafusion::common::stats::Precision;

    use super::*;

    fn column(min: ScalarValue, max: ScalarValue, nulls: Precision<usize>) -> ColumnStatistics {
        ColumnStatistics { min_value: Precision::Inexact(min), max_value: Precision::Inexact(max), null_count: nulls, ..Default::default() }
    }

    #[test]
    fn key_spans_multiply_and_count_nulls() {
        let stats = Statistics {
            num_rows: Precision::Exact(1000),
            total_byte_size: Precision::Absent,
            column_statistics: vec![
                column(ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(100)), Precision::Exact(0)),
                column(ScalarValue::Date32(Some(-3)), ScalarValue::Date32(Some(6)), Precision::Absent),
                column(ScalarValue::Utf8(Some("A".into())), ScalarValue::Utf8(Some("R".into())), Precision::Exact(0)),
                column(ScalarValue::Int64(Some(i64::MIN)), ScalarValue::Int64(Some(i64::MAX)), Precision::Exact(0)),
                column(ScalarValue::UInt8(Some(9)), ScalarValue::UInt8(Some(2)), Precision::Exact(0)),
                ColumnStatistics::new_unknown(),
            ],
        };
        assert_eq!(key_span(&stats, &[0]), Some(100));
        // Ten dates and the null group (the null count is unknown).
        assert_eq!(key_span(&stats, &[0, 1]), Some(100 * 11));
        assert_eq!(key_span(&stats, &[]), Some(1));
        // Strings' bounds say nothing of their count; unknown bounds neither.
        assert_eq!(key_span(&stats, &[0, 2]), None);
        assert_eq!(key_span(&stats, &[5]), None);
        assert_eq!(key_span(&stats, &[3]), Some(1u128 << 64));
        assert_eq!(key_span(&stats, &[3, 3, 3]), Some(u128::MAX));
        // A footer whose min exceeds its max is no bound.
        assert_eq!(key_span(&stats, &[4]), None);
        assert_eq!(key_span(&stats, &[9]), None);
    }
}
