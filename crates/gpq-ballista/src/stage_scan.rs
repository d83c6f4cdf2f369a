//! Giving each Ballista task its own partitions of a gpq scan.
//!
//! Before it sends a stage to an executor, Ballista's scheduler restricts
//! the stage's plan to the task's partitions by rewriting its leaves (file
//! groups of a `DataSourceExec`, locations of a shuffle reader); the
//! executor then runs partitions `0..k` of what it got. A leaf Ballista does
//! not know, such as a [`GpqScanExec`], is left whole, so a task for
//! partitions {2, 3} would run the scan's partitions 0 and 1: rows read
//! twice, others never. [`GpqStageScanExec`] carries the scan as data and
//! takes its partition numbers from a child Ballista does restrict: an
//! in-memory source whose partition `i` is one row holding `i`. Partition
//! `j` of the stage scan reads that row and runs the scan's partition of
//! that number, so after restriction each task runs exactly the scan
//! partitions the scheduler assigned to it.
//!
//! [`GpqSchedulerPlanner`] is the scheduler's query planner: it plans as the
//! planner it wraps and then puts every gpq scan of more than one partition
//! into a stage scan.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::catalog::Session;
use datafusion::common::Statistics;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use gpq_datafusion::GpqScanExec;

/// The column of the partition-number source.
const PARTITION_COLUMN: &str = "gpq_scan_partition";

/// A [`GpqScanExec`] whose partition `j` runs the scan partition named by
/// partition `j` of its input (see the module doc): what the scheduler
/// plans in place of a gpq scan of several partitions, so that Ballista can
/// hand each task its own share of the scan.
#[derive(Debug)]
pub(crate) struct GpqStageScanExec {
    /// A [`GpqScanExec`].
    scan: Arc<dyn ExecutionPlan>,
    /// One row per partition, holding the scan partition it runs.
    partitions: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl GpqStageScanExec {
    /// `scan` (a [`GpqScanExec`]), its partitions numbered by an in-memory source.
    pub fn new(scan: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let count = scan.properties().partitioning.partition_count();
        let schema = partition_schema();
        let numbers = (0..count)
            .map(|i| {
                let i = u32::try_from(i)
                    .map_err(|_| DataFusionError::Plan(format!("a gpq scan of {count} partitions")))?;
                let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(UInt32Array::from(vec![i]))])?;
                Ok(vec![batch])
            })
            .collect::<Result<Vec<_>>>()?;
        let partitions = MemorySourceConfig::try_new_exec(&numbers, schema, None)?;
        Self::with_input(scan, partitions)
    }

    /// `scan` with the partition-number source `partitions` (as decoded,
    /// possibly restricted to a task's partitions).
    pub fn with_input(scan: Arc<dyn ExecutionPlan>, partitions: Arc<dyn ExecutionPlan>) -> Result<Self> {
        if !scan.is::<GpqScanExec>() {
            return Err(DataFusionError::Internal(format!("a gpq stage scan of a {}", scan.name())));
        }
        if partitions.schema().fields() != partition_schema().fields() {
            return Err(DataFusionError::Plan(format!(
                "the input of a gpq stage scan must be one {PARTITION_COLUMN} column, not {}",
                partitions.schema()
            )));
        }
        let count = partitions.properties().partitioning.partition_count();
        let properties = PlanProperties::new(
            scan.properties().equivalence_properties().clone(),
            Partitioning::UnknownPartitioning(count),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(GpqStageScanExec { scan, partitions, properties: Arc::new(properties) })
    }

    /// The scan.
    pub fn scan(&self) -> Option<&GpqScanExec> {
        self.scan.downcast_ref::<GpqScanExec>()
    }
}

fn partition_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(PARTITION_COLUMN, DataType::UInt32, false)]))
}

impl DisplayAs for GpqStageScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpqStageScanExec: scan partitions from input, ")?;
        self.scan.fmt_as(t, f)
    }
}

impl ExecutionPlan for GpqStageScanExec {
    fn name(&self) -> &str {
        "GpqStageScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.partitions]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 1]>::try_from(children) {
            Ok([input]) => Ok(Arc::new(Self::with_input(Arc::clone(&self.scan), input)?)),
            Err(children) => Err(DataFusionError::Internal(format!(
                "a gpq stage scan has one input, {} were given",
                children.len()
            ))),
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let numbers = self.partitions.execute(partition, Arc::clone(&context))?;
        let scan = Arc::clone(&self.scan);
        let stream = futures::stream::once(async move {
            let batches: Vec<RecordBatch> = numbers.try_collect().await?;
            let numbers: Vec<u32> = batches
                .iter()
                .filter_map(|b| b.column(0).as_primitive_opt::<UInt32Type>())
                .flat_map(|a| a.values().iter().copied())
                .collect();
            let [number] = numbers.as_slice() else {
                return Err(DataFusionError::Internal(format!(
                    "partition {partition} of a gpq stage scan names {} scan partitions, not one",
                    numbers.len()
                )));
            };
            scan.execute(*number as usize, context)
        })
        .try_flatten()
        .boxed();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.scan.metrics()
    }

    fn statistics_from_inputs(&self, _input_stats: &[Arc<Statistics>], args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        match args.partition() {
            // Which scan partition a partition runs is known only when it runs.
            Some(_) => Ok(Arc::new(Statistics::new_unknown(&self.schema()))),
            None => self.scan.statistics_from_inputs(&[], args),
        }
    }
}

/// Every gpq scan of `plan` with more than one partition, in a [`GpqStageScanExec`].
pub(crate) fn stage_scans(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(plan
        .transform_up(|node| {
            let Some(scan) = node.downcast_ref::<GpqScanExec>() else {
                return Ok(Transformed::no(node));
            };
            if scan.properties().partitioning.partition_count() <= 1 {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(Arc::new(GpqStageScanExec::new(node)?) as Arc<dyn ExecutionPlan>))
        })?
        .data)
}

/// The query planner of a Ballista scheduler that plans gpq scans: plans
/// as the planner it wraps, then puts every gpq scan of more than one
/// partition into a stage scan, so that each task runs its own partitions
/// of it (see the `stage_scan` module).
#[derive(Debug)]
pub struct GpqSchedulerPlanner {
    inner: Arc<dyn QueryPlanner + Send + Sync>,
}

impl GpqSchedulerPlanner {
    /// Plans with `inner`, then stages the gpq scans.
    pub fn wrapping(inner: Arc<dyn QueryPlanner + Send + Sync>) -> Self {
        GpqSchedulerPlanner { inner }
    }
}

#[async_trait]
impl QueryPlanner for GpqSchedulerPlanner {
    async fn create_physical_plan(&self, logical_plan: &LogicalPlan, session: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        stage_scans(self.inner.create_physical_plan(logical_plan, session).await?)
    }
}
