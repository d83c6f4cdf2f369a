//! Partial aggregation on the device. DataFusion splits a grouped
//! aggregation into a `Partial` step per input partition and a `Final` step
//! after a repartition; where the `Partial` step reads a GPU scan directly
//! (through at most a projection), the physical optimizer rule
//! [`GpqAggregatePushdown`] replaces it with a [`GpqPartialAggregateExec`]
//! that computes the partial states of each decoded batch on the device
//! ([`gpq::DeviceTable::aggregate`]) and copies one row per group to the
//! host instead of every row (TPC-H q1: a handful of rows per batch instead
//! of millions).
//!
//! The rule takes only what the device computes exactly as DataFusion
//! does: grouping by plain integer, date or string columns; `COUNT`, `SUM`
//! and `AVG` of integers and decimals, `MIN` and `MAX` of integers, decimals
//! and dates, without `DISTINCT`, `FILTER` or ordering; inputs made of
//! columns, literals, `+ - *` and casts between integer and decimal types
//! (each translated with DataFusion's result scales, and a range check where
//! DataFusion's arithmetic would wrap or its cast fail). Anything else keeps
//! DataFusion's own plan.
//!
//! A batch the device cannot aggregate (more groups than its table holds, a
//! grouping string longer than its share of the key, an input that
//! overflows), and every batch the scan decodes on the CPU, go to the host:
//! the node runs DataFusion's original `Partial` aggregation over those
//! rows, so its output is the same partial states DataFusion would make,
//! in more rows at most, which the `Final` step merges.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use arrow::array::{ArrayRef, Decimal128Array, Decimal256Array, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::i256;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal, TryCastExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, PlanProperties, RecordBatchStream};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tracing::debug;

use gpq::arrow::aggregate::{Aggregate, AggregateFunction, GroupBy, Groups, ValueExpr};
use gpq::{DeviceTable, Error};

use crate::exec::GpqScanExec;
use crate::scan::PartitionScan;

/// The physical optimizer rule that puts partial aggregations over GPU
/// scans on the device (see the module docs). Add it after DataFusion's
/// own rules, e.g. with [`with_device_aggregation`](crate::with_device_aggregation).
#[derive(Debug, Default)]
pub struct GpqAggregatePushdown;

impl PhysicalOptimizerRule for GpqAggregatePushdown {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            Ok(match rewrite(&node) {
                Some(new) => Transformed::yes(new),
                None => Transformed::no(node),
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        "gpq_device_aggregation"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Nodes between a partial aggregation and its scan that change nothing
/// the device aggregation needs to know.
fn transparent(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    matches!(node.name(), "CoalesceBatchesExec" | "CooperativeExec").then(|| Arc::clone(node.children()[0]))
}

fn rewrite(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let agg = node.downcast_ref::<AggregateExec>()?;
    if *agg.mode() != AggregateMode::Partial || agg.limit_options().is_some() || agg.filter_expr().iter().any(Option::is_some) {
        return None;
    }
    // The device's groups come in no order: a partial aggregation that
    // streams over sorted input (and promises sorted output) stays.
    if *agg.input_order_mode() != InputOrderMode::Linear || agg.properties().output_ordering().is_some() {
        return None;
    }
    let mut below = Arc::clone(agg.input());
    while let Some(next) = transparent(&below) {
        below = next;
    }
    let projection = below.downcast_ref::<ProjectionExec>().map(|p| p.expr().iter().map(|e| Arc::clone(&e.expr)).collect::<Vec<_>>());
    if projection.is_some() {
        below = Arc::clone(below.children()[0]);
        while let Some(next) = transparent(&below) {
            below = next;
        }
    }
    let scan = below.downcast_ref::<GpqScanExec>()?;
    if !scan.uses_gpu() || scan.fetch().is_some() {
        return None;
    }
    let plan = DeviceAggregation::plan(agg, projection.as_deref(), &scan.schema())?;
    Some(Arc::new(GpqPartialAggregateExec { partial: Arc::clone(node), scan: below, plan: Arc::new(plan), metrics: ExecutionPlanMetricsSet::new() }))
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
    let any = e;
    if let Some(c) = any.downcast_ref::<Column>() {
        let t = schema.fields().get(c.index())?.data_type();
        return Some((ValueExpr::Column(c.index()), num_of(t)?));
    }
    if let Some(l) = any.downcast_ref::<Literal>() {
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
    let cast = any.downcast_ref::<CastExpr>().map(|c| (c.expr(), c.cast_type())).or_else(|| any.downcast_ref::<TryCastExpr>().map(|c| (c.expr(), c.cast_type())));
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
    if let Some(b) = any.downcast_ref::<BinaryExpr>() {
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
                    node(scaled(l, scale - s1)?, scaled(r, scale - s2)?)
                }
            }
            _ => return None,
        };
        return Some((e, out));
    }
    None
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
    /// `None` where the device cannot compute it exactly.
    fn plan(agg: &AggregateExec, projection: Option<&[Arc<dyn PhysicalExpr>]>, scan_schema: &Schema) -> Option<DeviceAggregation> {
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
        let group_by = GroupBy { keys, aggregates, capacity: GroupBy::DEFAULT_CAPACITY };
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
        fn remap(e: &ValueExpr, map: &[usize]) -> ValueExpr {
            let b = |x: &ValueExpr| Box::new(remap(x, map));
            match e {
                ValueExpr::Column(c) => ValueExpr::Column(map.get(*c).copied().unwrap_or(usize::MAX)),
                ValueExpr::Literal(v) => ValueExpr::Literal(*v),
                ValueExpr::Add(x, y) => ValueExpr::Add(b(x), b(y)),
                ValueExpr::Sub(x, y) => ValueExpr::Sub(b(x), b(y)),
                ValueExpr::Mul(x, y) => ValueExpr::Mul(b(x), b(y)),
                ValueExpr::Scale(x, k) => ValueExpr::Scale(b(x), *k),
                ValueExpr::FitSigned(x, k) => ValueExpr::FitSigned(b(x), *k),
                ValueExpr::FitUnsigned(x, k) => ValueExpr::FitUnsigned(b(x), *k),
                ValueExpr::FitDigits(x, k) => ValueExpr::FitDigits(b(x), *k),
            }
        }
        GroupBy {
            keys: self.group_by.keys.iter().map(|&c| map.get(c).copied().unwrap_or(usize::MAX)).collect(),
            aggregates: self
                .group_by
                .aggregates
                .iter()
                .map(|a| Aggregate { function: a.function, input: a.input.as_ref().map(|e| remap(e, map)) })
                .collect(),
            capacity: self.group_by.capacity,
        }
    }
}

/// An array of `t` (integers, dates, decimals) from unscaled values.
fn int_array(t: &DataType, values: impl Iterator<Item = Option<i128>>) -> Result<ArrayRef> {
    let values: Vec<Option<i128>> = values.collect();
    let array: ArrayRef = match t {
        DataType::Decimal128(p, s) => Arc::new(Decimal128Array::from(values).with_precision_and_scale(*p, *s)?),
        DataType::Decimal256(p, s) => {
            Arc::new(Decimal256Array::from(values.into_iter().map(|v| v.map(i256::from_i128)).collect::<Vec<_>>()).with_precision_and_scale(*p, *s)?)
        }
        // Wrapping, as DataFusion's sums wrap.
        DataType::UInt64 => Arc::new(UInt64Array::from_iter(values.into_iter().map(|v| v.map(|v| v as u64)))),
        _ => {
            let wide: ArrayRef = Arc::new(Int64Array::from_iter(values.into_iter().map(|v| v.map(|v| v as i64))));
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
    /// Aggregates `table` (the scan's output column `j` at table column
    /// `map[j]`, or at `j` without a map; only rows inside `within` if
    /// given) on the device and sends the partial states: `Some(rows
    /// aggregated)`, or `None` where the device cannot (the caller sends
    /// the rows to the host instead).
    pub fn try_aggregate(&self, scan: &PartitionScan, table: &DeviceTable, map: Option<&[usize]>, within: Option<&[std::ops::Range<usize>]>) -> gpq::Result<Option<usize>> {
        if self.failures.load(Ordering::Relaxed) >= MAX_FAILURES {
            return Ok(None);
        }
        let group_by = match map {
            Some(map) => self.plan.mapped(map),
            None => self.plan.group_by.clone(),
        };
        let m = &scan.metrics;
        match table.aggregate(&group_by, within) {
            Ok(groups) => {
                m.device_aggregate_rows_in.add(groups.rows_in as usize);
                m.device_aggregate_groups_out.add(groups.len);
                m.device_aggregate_time.add_duration(groups.time);
                let batch = self.plan.to_batch(&groups).map_err(|e| Error::Internal(format!("device aggregation states: {e}")))?;
                // A closed channel: the query stopped; nothing waits for the states.
                let _ = self.tx.send(Ok(batch));
                Ok(Some(groups.rows_in as usize))
            }
            Err(Error::Aggregate(why)) => {
                debug!(%why, "gpq scan aggregates a batch on the host");
                m.device_aggregate_fallbacks.add(1);
                self.failures.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// A `Partial` aggregation over a GPU scan, computed on the device where it
/// can be and by DataFusion's own node over the rest (see the module docs).
#[derive(Debug)]
pub struct GpqPartialAggregateExec {
    /// DataFusion's `Partial` aggregation this node replaces, over the scan.
    partial: Arc<dyn ExecutionPlan>,
    /// The scan (a [`GpqScanExec`]).
    scan: Arc<dyn ExecutionPlan>,
    plan: Arc<DeviceAggregation>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpqPartialAggregateExec {
    fn gpq_scan(&self) -> Result<&GpqScanExec> {
        self.scan.downcast_ref::<GpqScanExec>().ok_or_else(|| DataFusionError::Internal("GpqPartialAggregateExec over another scan".into()))
    }

    /// DataFusion's `Partial` aggregation over `source` instead of the scan.
    fn host_plan(&self, source: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        Arc::clone(&self.partial)
            .transform_down(|node| {
                Ok(if node.is::<GpqScanExec>() {
                    Transformed::new(Arc::clone(&source), true, TreeNodeRecursion::Jump)
                } else {
                    Transformed::no(node)
                })
            })
            .data()
    }
}

impl DisplayAs for GpqPartialAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpqPartialAggregateExec: on the device, ")?;
        match self.partial.downcast_ref::<AggregateExec>() {
            Some(agg) => agg.fmt_as(t, f)?,
            None => write!(f, "{}", self.partial.name())?,
        }
        // The scan is not a child (the node runs it itself): shown here.
        if let Ok(scan) = self.gpq_scan() {
            write!(f, ", over ")?;
            scan.fmt_as(t, f)?;
        }
        Ok(())
    }
}

impl ExecutionPlan for GpqPartialAggregateExec {
    fn name(&self) -> &str {
        "GpqPartialAggregateExec"
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.partial.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal("GpqPartialAggregateExec has no children".into()))
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = AggregateSink { plan: Arc::clone(&self.plan), tx, failures: AtomicUsize::new(0) };
        let scan = self.gpq_scan()?;
        let rows = scan.execute_with_aggregate(partition, Arc::clone(&context), BaselineMetrics::new(&scan.metrics_set(), partition), Some(sink))?;
        let source = Arc::new(OneStream::new(Arc::clone(&self.scan), rows));
        let host = self.host_plan(source)?.execute(partition, context)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        Ok(Box::pin(Merged { schema: self.schema(), device: Some(rx), host: Some(host), baseline }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        let mut all = self.metrics.clone_inner();
        for m in self.gpq_scan().ok()?.metrics_set().clone_inner().iter() {
            all.push(Arc::clone(m));
        }
        Some(all)
    }
}

/// A leaf that hands out one stream made elsewhere: the scan's rows the
/// device did not aggregate, for DataFusion's `Partial` aggregation.
struct OneStream {
    like: Arc<dyn ExecutionPlan>,
    stream: std::sync::Mutex<Option<SendableRecordBatchStream>>,
}

impl fmt::Debug for OneStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneStream").finish_non_exhaustive()
    }
}

impl OneStream {
    fn new(like: Arc<dyn ExecutionPlan>, stream: SendableRecordBatchStream) -> Self {
        OneStream { like, stream: std::sync::Mutex::new(Some(stream)) }
    }
}

impl DisplayAs for OneStream {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the rows the device did not aggregate")
    }
}

impl ExecutionPlan for OneStream {
    fn name(&self) -> &str {
        "GpqHostRows"
    }

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.like.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(self: Arc<Self>, _: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(&self, _partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let schema = self.like.schema();
        match self.stream.lock().map_err(|_| DataFusionError::Internal("a poisoned lock".into()))?.take() {
            Some(s) => Ok(s),
            None => Ok(Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::once(async {
                Err(DataFusionError::Internal("the host rows of a device aggregation were asked for twice".into()))
            })))),
        }
    }
}

/// The device's partial states as they come, and DataFusion's over the
/// rest; ends when both have.
struct Merged {
    schema: SchemaRef,
    device: Option<mpsc::UnboundedReceiver<Result<RecordBatch>>>,
    host: Option<SendableRecordBatchStream>,
    baseline: BaselineMetrics,
}

impl Merged {
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        if let Some(rx) = &mut self.device {
            match rx.poll_recv(cx) {
                Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                Poll::Ready(None) => self.device = None,
                Poll::Pending => {}
            }
        }
        if let Some(host) = &mut self.host {
            match host.poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                Poll::Ready(None) => self.host = None,
                Poll::Pending => return Poll::Pending,
            }
        }
        match (&self.device, &self.host) {
            (None, None) => Poll::Ready(None),
            // The host side ended: the producer is done, and its channel closes with it.
            (Some(_), None) => match self.device.as_mut().map(|rx| rx.poll_recv(cx)) {
                Some(Poll::Ready(Some(item))) => Poll::Ready(Some(item)),
                Some(Poll::Pending) => Poll::Pending,
                _ => {
                    self.device = None;
                    Poll::Ready(None)
                }
            },
            _ => Poll::Pending,
        }
    }
}

impl Stream for Merged {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let poll = self.poll_inner(cx);
        self.baseline.record_poll(poll)
    }
}

impl RecordBatchStream for Merged {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
