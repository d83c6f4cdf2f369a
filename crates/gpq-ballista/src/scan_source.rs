//! A gpq scan as the kind of leaf Ballista's scheduler knows: a
//! `DataSourceExec` over file groups.
//!
//! Ballista's scheduler handles its leaves by type. Before it ships a task it
//! restricts the stage's leaves to the task's partitions, and of the
//! `DataSourceExec`s it does so only for a `FileScanConfig` (file groups) or
//! an in-memory source; and it reads a small broadcast build side inside the
//! joining task, instead of behind a stage of its own, only where that side
//! is a `DataSourceExec` (under projections) with an exact byte size. A
//! [`GpqScanExec`] is neither, so each task would run the scan's first
//! partitions instead of its own, and every broadcast join over a gpq scan
//! would wait for an exchange stage whose size is unknown until it has run.
//!
//! [`scan_as_file_groups`] therefore plans a gpq scan of `n` partitions as a
//! `DataSourceExec` over a [`FileScanConfig`] of `n` file groups, group `i`
//! holding one pseudo-file named after scan partition `i`, with a
//! [`GpqFileSource`] that carries the scan. Ballista restricts such a leaf
//! like any file scan (it keeps the groups of the task's partitions), and
//! the source's opener runs, for each pseudo-file, the scan partition it
//! names: each task runs exactly its own partitions. The config carries the
//! scan's statistics, per partition and in total, so exact sizes stay exact.
//! The pseudo-files are never opened as files. A scan partition is never
//! split: asked for more partitions than it has groups, the source says no;
//! asked for fewer, it merges whole groups (Ballista asks a broadcast side
//! for one partition before it reads it in place). Groups are not shared
//! between partitions either: the config asks for its order to be kept,
//! which turns off DataFusion's stealing of files between partitions. The
//! file stream counts the output rows; the scan's own metrics (pruning,
//! bytes copied, device filters) are in the same set.
//!
//! [`GpqSchedulerPlanner`] is the scheduler's query planner: it plans as the
//! planner it wraps, then replaces every gpq scan so.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::Statistics;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileOpenFuture, FileOpener, FileScanConfig, FileScanConfigBuilder, FileSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::prelude::SessionConfig;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::LogicalPlan;
use datafusion::object_store::ObjectStore;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use gpq_datafusion::GpqScanExec;

/// How a pseudo-file of a gpq scan's file group starts; the scan partition
/// it stands for follows.
const PARTITION_PREFIX: &str = "gpq-scan-partition-";

/// The [`FileSource`] of a gpq scan planned as file groups (see the module
/// doc): it carries the scan, and its opener runs the scan partition each
/// pseudo-file names.
#[derive(Debug, Clone)]
pub(crate) struct GpqFileSource {
    /// A [`GpqScanExec`].
    scan: Arc<dyn ExecutionPlan>,
    table_schema: TableSchema,
    /// The scan's own metrics (a handle to the same set).
    metrics: ExecutionPlanMetricsSet,
    /// The session's batch size, set when the scan runs.
    batch_size: Option<usize>,
}

impl GpqFileSource {
    fn new(scan: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let Some(gpq) = scan.downcast_ref::<GpqScanExec>() else {
            return Err(DataFusionError::Internal(format!("a gpq file source over a {}", scan.name())));
        };
        let metrics = gpq.metrics_set();
        Ok(GpqFileSource { table_schema: TableSchema::from(scan.schema()), scan, metrics, batch_size: None })
    }
}

impl FileSource for GpqFileSource {
    fn create_file_opener(&self, _store: Arc<dyn ObjectStore>, _config: &FileScanConfig, _partition: usize) -> Result<Arc<dyn FileOpener>> {
        // A file opener is given no task context, and the scan takes only
        // the session's batch size from one: the context it runs in is
        // made of that.
        let mut config = SessionConfig::new();
        if let Some(batch_size) = self.batch_size {
            config = config.with_batch_size(batch_size);
        }
        let context = Arc::new(TaskContext::default().with_session_config(config));
        Ok(Arc::new(GpqPartitionOpener { scan: Arc::clone(&self.scan), context }))
    }

    fn table_schema(&self) -> &TableSchema {
        &self.table_schema
    }

    fn with_batch_size(&self, batch_size: usize) -> Arc<dyn FileSource> {
        Arc::new(GpqFileSource { batch_size: Some(batch_size), ..self.clone() })
    }

    fn metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn file_type(&self) -> &str {
        "gpq"
    }

    fn fmt_extra(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, ", ")?;
        self.scan.fmt_as(t, f)
    }

    /// Fewer partitions merge groups (a partition then runs several scan
    /// partitions, one after the other); a scan partition is never split,
    /// so more partitions than there are groups is refused.
    /// Ballista asks for one partition where it reads a broadcast join
    /// side inside the joining task.
    fn repartitioned(&self, target: usize, _min_size: usize, _ordering: Option<LexOrdering>, config: &FileScanConfig) -> Result<Option<FileScanConfig>> {
        let groups = &config.file_groups;
        if target == 0 || target > groups.len() {
            return Ok(None);
        }
        // As many as there are: the same scan, so that a one-partition
        // broadcast side is read in place too.
        if target == groups.len() {
            return Ok(Some(config.clone()));
        }
        let groups = group_partitions(config)?;
        let mut merged = Vec::with_capacity(target);
        let mut start = 0;
        for i in 0..target {
            // Contiguous runs of groups, as even in count as they divide.
            let end = groups.len() * (i + 1) / target;
            merged.push(groups[start..end].concat());
            start = end;
        }
        file_scan_config(Arc::clone(&self.scan), Some(&merged), config.limit).map(Some)
    }

    /// The scan's filters were planned into it before it became a file
    /// source; none are added here.
    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
}

/// Opens a pseudo-file by running the scan partition it names.
struct GpqPartitionOpener {
    scan: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
}

impl FileOpener for GpqPartitionOpener {
    fn open(&self, file: PartitionedFile) -> Result<FileOpenFuture> {
        let name = file.object_meta.location.as_ref();
        let partition = partition_of(name).ok_or_else(|| DataFusionError::Internal(format!("{name} is not a partition of a gpq scan")))?;
        let scan = self.scan.downcast_ref::<GpqScanExec>().ok_or_else(|| DataFusionError::Internal("a gpq file source without a gpq scan".into()))?;
        // The file stream counts the output itself: the scan's own counters
        // of it go to a set nobody reads, or they would count it twice.
        let uncounted = BaselineMetrics::new(&ExecutionPlanMetricsSet::new(), partition);
        let stream = scan.execute_with_baseline(partition, Arc::clone(&self.context), uncounted)?;
        Ok(Box::pin(async move { Ok(stream.boxed()) }))
    }
}

/// The scan partition a pseudo-file's name stands for.
fn partition_of(name: &str) -> Option<usize> {
    name.strip_prefix(PARTITION_PREFIX)?.parse().ok()
}

/// The pseudo-file of scan partition `i`.
fn partition_file(i: usize) -> PartitionedFile {
    PartitionedFile::new(format!("{PARTITION_PREFIX}{i}"), 0)
}

/// `scan` (a [`GpqScanExec`]) as a `DataSourceExec` of file groups: one
/// group per scan partition when `groups` is `None`, else one per entry of
/// `groups`, each running the scan partitions it lists, in that order; at
/// most `limit` rows per partition where one was pushed into the file scan.
pub(crate) fn scan_as_file_groups(scan: Arc<dyn ExecutionPlan>, groups: Option<&[Vec<usize>]>, limit: Option<usize>) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(DataSourceExec::from_data_source(file_scan_config(scan, groups, limit)?))
}

/// The file scan config of [`scan_as_file_groups`].
fn file_scan_config(scan: Arc<dyn ExecutionPlan>, groups: Option<&[Vec<usize>]>, limit: Option<usize>) -> Result<FileScanConfig> {
    let source = GpqFileSource::new(Arc::clone(&scan))?;
    let count = scan.properties().partitioning.partition_count();
    let groups: Vec<Vec<usize>> = match groups {
        Some(groups) => groups.to_vec(),
        None => (0..count).map(|i| vec![i]).collect(),
    };
    let mut seen = vec![false; count];
    for &i in groups.iter().flatten() {
        match seen.get_mut(i) {
            Some(seen) if !*seen => *seen = true,
            Some(_) => return Err(DataFusionError::Plan(format!("partition {i} of a gpq scan is in two file groups"))),
            None => return Err(DataFusionError::Plan(format!("partition {i} of a gpq scan of {count} partitions"))),
        }
    }
    let stats = StatisticsContext::new();
    let schema = scan.schema();
    let groups = groups
        .iter()
        .map(|partitions| {
            let mut files = Vec::with_capacity(partitions.len());
            let mut group_stats = Vec::with_capacity(partitions.len());
            for &i in partitions {
                files.push(partition_file(i));
                group_stats.push(stats.compute(scan.as_ref(), &StatisticsArgs::new().with_partition(Some(i)))?);
            }
            let merged = match group_stats.as_slice() {
                [one] => Arc::clone(one),
                many => Arc::new(Statistics::try_merge_iter(many.iter().map(Arc::as_ref), &schema)?),
            };
            Ok(FileGroup::new(files).with_statistics(merged))
        })
        .collect::<Result<Vec<_>>>()?;
    let total = stats.compute(scan.as_ref(), &StatisticsArgs::new())?;
    let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
        .with_file_groups(groups)
        .with_statistics(total.as_ref().clone())
        .with_limit(limit)
        // Keeps each group with its partition: without it DataFusion lets
        // the partitions of one execution take files from a shared queue,
        // so that the first partition polled could run every scan
        // partition (each row would still be read once, but a task's work
        // would no longer be the partitions it was given).
        .with_preserve_order(true)
        .build();
    Ok(config)
}

/// What a gpq scan planned as file groups is made of.
pub(crate) struct FileGroupsScan<'a> {
    /// The scan.
    pub scan: &'a GpqScanExec,
    /// The scan partitions each group runs.
    pub groups: Vec<Vec<usize>>,
    /// A limit pushed into the file scan (rows per partition).
    pub limit: Option<usize>,
}

/// The parts of a gpq scan planned as file groups; `None` for any other plan.
pub(crate) fn file_groups_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<Result<FileGroupsScan<'_>>> {
    let exec = plan.downcast_ref::<DataSourceExec>()?;
    let config = exec.data_source().as_ref().downcast_ref::<FileScanConfig>()?;
    let scan = config.file_source().downcast_ref::<GpqFileSource>()?.scan.downcast_ref::<GpqScanExec>()?;
    Some(group_partitions(config).map(|groups| FileGroupsScan { scan, groups, limit: config.limit }))
}

/// The scan partitions each file group of `config` runs, from its pseudo-files' names.
fn group_partitions(config: &FileScanConfig) -> Result<Vec<Vec<usize>>> {
    config
        .file_groups
        .iter()
        .map(|group| {
            group
                .iter()
                .map(|file| {
                    partition_of(file.object_meta.location.as_ref())
                        .ok_or_else(|| DataFusionError::Internal(format!("{} is not a partition of a gpq scan", file.object_meta.location)))
                })
                .collect()
        })
        .collect()
}

/// Every gpq scan of `plan`, as file groups.
pub(crate) fn scans_as_file_groups(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(plan
        .transform_up(|node| {
            if !node.is::<GpqScanExec>() {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(scan_as_file_groups(node, None, None)?))
        })?
        .data)
}

/// The query planner of a Ballista scheduler that plans gpq scans: plans
/// as the planner it wraps, then makes every gpq scan a `DataSourceExec`
/// of one file group per partition (see the `scan_source` module), so that
/// Ballista gives each task its own partitions of it and reads small
/// broadcast sides inside the joining task.
#[derive(Debug)]
pub struct GpqSchedulerPlanner {
    inner: Arc<dyn QueryPlanner + Send + Sync>,
}

impl GpqSchedulerPlanner {
    /// Plans with `inner`, then turns the gpq scans into file groups.
    pub fn wrapping(inner: Arc<dyn QueryPlanner + Send + Sync>) -> Self {
        GpqSchedulerPlanner { inner }
    }
}

#[async_trait]
impl QueryPlanner for GpqSchedulerPlanner {
    async fn create_physical_plan(&self, logical_plan: &LogicalPlan, session: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        scans_as_file_groups(self.inner.create_physical_plan(logical_plan, session).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::object_store::local::LocalFileSystem;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::prelude::SessionContext;
    use futures::TryStreamExt;
    use gpq_datafusion::{Backend, GpqTableOptions, register_gpq};

    /// A gpq scan (CPU backend, one partition) of a file of `rows` rows in one row group.
    async fn scan_of(rows: i64) -> (Arc<dyn ExecutionPlan>, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("gpq-ballista-scan-source-{}-{rows}.parquet", std::process::id()));
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(0..rows))]).unwrap();
        let mut writer = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let ctx = SessionContext::new();
        register_gpq(&ctx, "t", &path, GpqTableOptions::new().with_backend(Backend::Cpu)).unwrap();
        let plan = ctx.sql("select x from t").await.unwrap().create_physical_plan().await.unwrap();
        let mut node = plan;
        while !node.is::<GpqScanExec>() {
            let child = Arc::clone(node.children().first().expect("a gpq scan below"));
            node = child;
        }
        (node, path)
    }

    /// The batch sizes the opener's stream gives for `batch_size`.
    async fn opened_batches(scan: &Arc<dyn ExecutionPlan>, batch_size: usize) -> Vec<usize> {
        let exec = scan_as_file_groups(Arc::clone(scan), None, None).unwrap();
        let exec = exec.downcast_ref::<DataSourceExec>().unwrap();
        let config = exec.data_source().as_ref().downcast_ref::<FileScanConfig>().unwrap();
        let source = config.file_source().with_batch_size(batch_size);
        let opener = source.create_file_opener(Arc::new(LocalFileSystem::new()), config, 0).unwrap();
        let stream = opener.open(partition_file(0)).unwrap().await.unwrap();
        let batches: Vec<RecordBatch> = stream.try_collect().await.unwrap();
        batches.iter().map(RecordBatch::num_rows).collect()
    }

    /// The opener runs the scan with the session's batch size: `DataSourceExec`
    /// would split larger batches anyway, so this looks below it.
    #[tokio::test]
    async fn the_opener_takes_the_batch_size_to_the_scan() {
        let (scan, path) = scan_of(1000).await;
        assert_eq!(opened_batches(&scan, 100).await, vec![100; 10]);
        assert_eq!(opened_batches(&scan, 4096).await, vec![1000]);
        std::fs::remove_file(path).unwrap();
    }

    /// A partition in two groups, or one the scan does not have, is refused.
    #[tokio::test]
    async fn groups_name_each_partition_once() {
        let (scan, path) = scan_of(10).await;
        assert!(scan_as_file_groups(Arc::clone(&scan), Some(&[vec![0]]), None).is_ok());
        assert!(scan_as_file_groups(Arc::clone(&scan), Some(&[vec![0], vec![0]]), None).is_err());
        assert!(scan_as_file_groups(Arc::clone(&scan), Some(&[vec![0, 0]]), None).is_err());
        assert!(scan_as_file_groups(Arc::clone(&scan), Some(&[vec![1]]), None).is_err());
        std::fs::remove_file(path).unwrap();
    }
}
