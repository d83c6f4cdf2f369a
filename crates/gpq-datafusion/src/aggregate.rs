//! Partial aggregation on the device. DataFusion splits a grouped
//! aggregation into a `Partial` step per input partition and a `Final` step
//! after a repartition; where the `Partial` step reads a GPU scan directly
//! (through at most a projection), the physical optimizer rule
//! [`GpqAggregatePushdown`] replaces it with a [`GpqPartialAggregateExec`]
//! that computes the partial states of each decoded batch on the device
//! ([`gpq::DeviceTable::aggregate`]) and copies one row per group to the
//! host instead of every row (TPC-H q1: a handful of rows per batch instead
//! of millions). Where the scan has device filters, the aggregation takes
//! the filter's bitmap on the device ([`gpq::DeviceTable::filter_aggregate`]):
//! no column is gathered.
//!
//! The rule takes only what the device computes exactly as DataFusion
//! does: grouping by plain integer, date or string columns; `COUNT`, `SUM`
//! and `AVG` of integers and decimals, `MIN` and `MAX` of integers, decimals
//! and dates, without `DISTINCT`, `FILTER` or ordering; inputs made of
//! columns, literals, `+ - *` and casts between integer and decimal types
//! (each translated with DataFusion's result scales, and a range check where
//! DataFusion's arithmetic would wrap or its cast fail). Anything else keeps
//! DataFusion's own plan, and so does a grouping whose integer and date keys
//! span more values, by the scan's statistics, than the device table holds
//! ([`GpqAggregatePushdown::max_groups`]): its batches would nearly all
//! overflow the table and reach DataFusion later than without the device.
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
use std::task::{Context, Poll};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::Statistics;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, PlanProperties, RecordBatchStream};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::device_aggregate::{AggregateSink, DEFAULT_DEVICE_AGGREGATION_MAX_GROUPS, DeviceAggregation};
use crate::exec::GpqScanExec;

/// The physical optimizer rule that puts partial aggregations over GPU
/// scans on the device (see the module docs). Add it after DataFusion's
/// own rules, e.g. with [`with_device_aggregation`](crate::with_device_aggregation).
#[derive(Debug, Clone)]
pub struct GpqAggregatePushdown {
    /// Most groups the device aggregates in one batch (its table is grown
    /// up to this many slots, rounded up to a power of two, at most
    /// [`gpq::arrow::aggregate::GroupBy::MAX_CAPACITY`]); a batch with more
    /// goes to the host, and after a few such batches the rest of the
    /// partition does. Default [`DEFAULT_DEVICE_AGGREGATION_MAX_GROUPS`].
    pub max_groups: usize,
}

impl Default for GpqAggregatePushdown {
    fn default() -> Self {
        GpqAggregatePushdown { max_groups: DEFAULT_DEVICE_AGGREGATION_MAX_GROUPS }
    }
}

impl GpqAggregatePushdown {
    /// The rule with [`GpqAggregatePushdown::max_groups`] set to `groups`
    /// (at least 1).
    pub fn with_max_groups(mut self, groups: usize) -> Self {
        self.max_groups = groups.max(1);
        self
    }
}

impl PhysicalOptimizerRule for GpqAggregatePushdown {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            Ok(match rewrite(&node, self.max_groups) {
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
    let passes = matches!(node.name(), "CoalesceBatchesExec" | "CooperativeExec") && node.fetch().is_none();
    passes.then(|| node.children().first().map(|c| Arc::clone(c))).flatten()
}

fn rewrite(node: &Arc<dyn ExecutionPlan>, max_groups: usize) -> Option<Arc<dyn ExecutionPlan>> {
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
    let stats = StatisticsContext::new().compute(scan, &StatisticsArgs::new()).ok()?;
    let plan = DeviceAggregation::plan(agg, projection.as_deref(), &scan.schema(), &stats, max_groups)?;
    Some(Arc::new(GpqPartialAggregateExec { partial: Arc::clone(node), scan: below, plan: Arc::new(plan), metrics: ExecutionPlanMetricsSet::new() }))
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
        let sink = AggregateSink::new(Arc::clone(&self.plan), tx);
        let scan = self.gpq_scan()?;
        let rows = scan.execute_with_aggregate(partition, Arc::clone(&context), BaselineMetrics::new(&scan.metrics_set(), partition), Some(sink))?;
        let source = Arc::new(OneStream::new(Arc::clone(&self.scan), rows));
        let host = self.host_plan(source)?.execute(partition, context)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        Ok(Box::pin(Merged { schema: self.schema(), device: Some(rx), host: Some(host), baseline }))
    }

    fn statistics_from_inputs(&self, _input_stats: &[Arc<Statistics>], args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        // The same rows as DataFusion's node: its estimate holds.
        StatisticsContext::new().compute(self.partial.as_ref(), args)
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
