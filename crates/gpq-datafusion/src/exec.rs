//! [`GpqScanExec`]: the physical scan of a [`GpqTable`](super::GpqTable).
//!
//! It holds the row groups left after pruning, cut into partitions, and runs
//! each partition as a stream (see the `stream` module). `EXPLAIN` shows the
//! backend (and, for the GPU, the IO path and decompressor), the projection,
//! the filter, the filters the scan applies itself (`scan_filters`, on the
//! device or the host) and what pruning removed; `EXPLAIN ANALYZE` adds the
//! metrics: `bytes_read`, `io_time`, `plan_time`, `decompress_time`,
//! `decode_time`, `copy_time`, `bytes_to_host`, `device_reads`,
//! `gpu_fallback_row_groups`, `gpu_context_lost_fallbacks`,
//! `pageable_copies`, the filters' rows (`device_filter_rows_in`,
//! `device_filter_rows_out`, `device_filter_time`,
//! `device_filter_fallbacks`, `host_filter_rows_in`,
//! `host_filter_rows_out`), the pruning
//! counters (`row_groups_total`, `row_groups_pruned_statistics`,
//! `row_groups_pruned_page_index`, `row_groups_pruned_limit`,
//! `page_index_rows_pruned`) and the baseline output counters.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use datafusion::common::Statistics;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};

use crate::cpu::CpuDecoder;
use crate::file::GpqFile;
use crate::filter::ScanFilter;
use crate::gpu::GpuDecoder;
use crate::options::GpqTableOptions;
use crate::scan::{Decoder, PartitionMetrics, PartitionScan};
use crate::stats::{filtered_statistics, statistics};
use crate::stream::execute;
use crate::units::{PruningSummary, ScanUnit};

/// The decoder a scan runs with, once resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScanBackend {
    /// arrow-rs on the CPU.
    Cpu,
    /// gpq on the GPU.
    Gpu,
}

/// What a [`GpqScanExec`] is built from (assembled by the table provider,
/// or decoded by the `remote` module).
pub(crate) struct ScanParts {
    /// The files the partitions' units index: every file of the table when
    /// planned, only those the partitions read when decoded.
    pub files: Arc<Vec<GpqFile>>,
    /// Every file of the table, as registered.
    pub table_paths: Vec<PathBuf>,
    pub table_schema: SchemaRef,
    pub columns: Vec<usize>,
    pub schema: SchemaRef,
    /// `columns`, then the columns only `filter` reads.
    pub read_columns: Vec<usize>,
    pub read_schema: SchemaRef,
    /// The filters the scan applies itself (reported `Exact` to DataFusion).
    pub filter: Option<Arc<ScanFilter>>,
    /// Every filter DataFusion pushed down (`predicate` is made of them).
    pub pushed_filters: Vec<Expr>,
    /// The pushed-down filters the scan applies itself (`filter` is made of them).
    pub own_filters: Vec<Expr>,
    pub partitions: Vec<Vec<ScanUnit>>,
    pub predicate: Option<Arc<dyn PhysicalExpr>>,
    pub fetch: Option<usize>,
    pub options: GpqTableOptions,
    pub backend: ScanBackend,
    pub backend_note: String,
    pub pruning: PruningSummary,
}

/// Scans the row groups of a gpq table left after pruning, on the CPU or the GPU.
pub struct GpqScanExec {
    parts: Arc<ScanParts>,
    schema: SchemaRef,
    fetch: Option<usize>,
    metrics: ExecutionPlanMetricsSet,
    io_paths: Arc<Mutex<Vec<String>>>,
    /// Tests only: device reads still to fail with an injected context loss.
    injected_faults: Arc<AtomicUsize>,
    injected_after: Arc<AtomicUsize>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for GpqScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpqScanExec")
            .field("backend", &self.parts.backend)
            .field("files", &self.parts.table_paths.len())
            .field("partitions", &self.parts.partitions.len())
            .field("columns", &self.parts.columns)
            .field("fetch", &self.fetch)
            .field("pruning", &self.parts.pruning)
            .finish()
    }
}

impl GpqScanExec {
    pub(crate) fn new(parts: ScanParts) -> Self {
        let fetch = parts.fetch;
        Self::with_parts(Arc::new(parts), fetch)
    }

    fn with_parts(parts: Arc<ScanParts>, fetch: Option<usize>) -> Self {
        let schema = Arc::clone(&parts.schema);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(parts.partitions.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        let metrics = ExecutionPlanMetricsSet::new();
        let p = &parts.pruning;
        for (name, value) in [
            ("row_groups_total", p.row_groups),
            ("row_groups_pruned_statistics", p.pruned_by_statistics),
            ("row_groups_pruned_page_index", p.pruned_by_page_index),
            ("row_groups_pruned_limit", p.pruned_by_limit),
            ("page_index_rows_pruned", p.rows_pruned_by_page_index),
        ] {
            MetricBuilder::new(&metrics).global_counter(name).add(value);
        }
        let injected_faults = Arc::new(AtomicUsize::new(parts.options.inject_gpu_context_loss));
        let injected_after = Arc::new(AtomicUsize::new(parts.options.inject_gpu_context_loss_after));
        GpqScanExec {
            parts,
            schema,
            fetch,
            metrics,
            io_paths: Arc::new(Mutex::new(Vec::new())),
            injected_faults,
            injected_after,
            properties: Arc::new(properties),
        }
    }

    /// What the scan is made of (for the `remote` module).
    pub(crate) fn parts(&self) -> &ScanParts {
        &self.parts
    }

    /// The backend in use: `cpu` or `gpu`, with details (IO path, fallback reason).
    pub fn backend(&self) -> &str {
        &self.parts.backend_note
    }

    /// Whether the GPU decodes this scan.
    pub fn uses_gpu(&self) -> bool {
        self.parts.backend == ScanBackend::Gpu
    }

    /// Runs scan partition `partition` as `ExecutionPlan::execute` does,
    /// but counts its output rows and compute time in `baseline` instead of
    /// the scan's own metrics (which still get everything else: pruning,
    /// bytes copied, device filters): for a node that runs the scan's
    /// partitions on its behalf and counts their output itself.
    pub fn execute_with_baseline(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        baseline: BaselineMetrics,
    ) -> Result<SendableRecordBatchStream> {
        self.execute_with_aggregate(partition, context, baseline, None)
    }

    /// [`GpqScanExec::execute_with_baseline`], with the GPU backend sending
    /// the partial aggregation of what it decodes to `aggregate` (the
    /// stream then carries only the rows the device did not aggregate).
    pub(crate) fn execute_with_aggregate(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        baseline: BaselineMetrics,
        aggregate: Option<crate::device_aggregate::AggregateSink>,
    ) -> Result<SendableRecordBatchStream> {
        let p = &self.parts;
        let empty = Vec::new();
        let units = match p.partitions.get(partition) {
            Some(units) => units,
            None if partition == 0 => &empty,
            None => {
                return Err(DataFusionError::Internal(format!(
                    "GpqScanExec has {} partitions, partition {partition} was asked for",
                    p.partitions.len()
                )));
            }
        };
        let scan = PartitionScan {
            files: Arc::clone(&p.files),
            units: units.clone(),
            columns: p.columns.clone(),
            schema: Arc::clone(&self.schema),
            read_columns: p.read_columns.clone(),
            read_schema: Arc::clone(&p.read_schema),
            filter: p.filter.clone(),
            device: p.options.device_of(partition),
            // The batch size is all a partition takes from its context:
            // gpq-ballista's file source runs partitions in a context made
            // of that alone.
            batch_size: context.session_config().batch_size(),
            limit: self.fetch,
            options: p.options.clone(),
            decoder: match p.backend {
                ScanBackend::Cpu => Arc::new(CpuDecoder) as Arc<dyn Decoder>,
                ScanBackend::Gpu => Arc::new(GpuDecoder),
            },
            metrics: PartitionMetrics::new(&self.metrics, partition),
            io_paths: Arc::clone(&self.io_paths),
            aggregate,
            injected_faults: Arc::clone(&self.injected_faults),
            injected_after: Arc::clone(&self.injected_after),
        };
        execute(scan, baseline)
    }

    /// A handle to the scan's metrics (the same set, not a copy), for a
    /// node that runs the scan's partitions on its behalf (with
    /// [`GpqScanExec::execute_with_baseline`]) and shows its metrics.
    pub fn metrics_set(&self) -> ExecutionPlanMetricsSet {
        self.metrics.clone()
    }

    /// What pruning removed when the scan was planned.
    pub fn pruning(&self) -> &PruningSummary {
        &self.parts.pruning
    }

    /// The row groups each partition reads, as (file, row group) pairs.
    pub fn partition_row_groups(&self) -> Vec<Vec<(std::path::PathBuf, usize)>> {
        self.parts
            .partitions
            .iter()
            .map(|p| {
                p.iter()
                    .map(|u| (self.parts.files[u.file].path.clone(), u.row_group))
                    .collect()
            })
            .collect()
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>, verbose: bool) -> fmt::Result {
        let p = &self.parts;
        let s = &p.pruning;
        write!(f, "backend={}", p.backend_note)?;
        let used = self
            .io_paths
            .lock()
            .map(|v| v.join("+"))
            .unwrap_or_default();
        if !used.is_empty() {
            write!(f, ", io_used={used}")?;
        }
        write!(
            f,
            ", files={}, partitions={}",
            p.table_paths.len(),
            p.partitions.len()
        )?;
        let names: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(f, ", projection=[{}]", names.join(", "))?;
        if let Some(pred) = &p.predicate {
            write!(f, ", predicate={pred}")?;
        }
        if let Some(filter) = &p.filter {
            let on = if p.backend == ScanBackend::Gpu { "device" } else { "host" };
            write!(f, ", scan_filters[{on}]=[{}]", filter.display.join(", "))?;
        }
        write!(
            f,
            ", row_groups={}/{} (pruned: statistics={}, page_index={}, limit={}), page_index_rows_pruned={}",
            s.scanned,
            s.row_groups,
            s.pruned_by_statistics,
            s.pruned_by_page_index,
            s.pruned_by_limit,
            s.rows_pruned_by_page_index
        )?;
        if let Some(fetch) = self.fetch {
            write!(f, ", fetch={fetch}")?;
        }
        if verbose {
            let files: Vec<String> = p
                .table_paths
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            write!(f, ", file_paths=[{}]", files.join(", "))?;
        }
        Ok(())
    }
}

impl DisplayAs for GpqScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::Default => {
                write!(f, "GpqScanExec: ")?;
                self.describe(f, false)
            }
            DisplayFormatType::Verbose => {
                write!(f, "GpqScanExec: ")?;
                self.describe(f, true)
            }
            DisplayFormatType::TreeRender => {
                let s = &self.parts.pruning;
                writeln!(f, "backend={}", self.parts.backend_note)?;
                writeln!(f, "files={}", self.parts.table_paths.len())?;
                write!(f, "row_groups={}/{}", s.scanned, s.row_groups)
            }
        }
    }
}

impl ExecutionPlan for GpqScanExec {
    fn name(&self) -> &str {
        "GpqScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "GpqScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.execute_with_baseline(partition, context, BaselineMetrics::new(&self.metrics, partition))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let p = &self.parts;
        let parts: Vec<&[ScanUnit]> = match args.partition() {
            None => p.partitions.iter().map(Vec::as_slice).collect(),
            Some(i) => vec![p.partitions.get(i).map(Vec::as_slice).unwrap_or(&[])],
        };
        Ok(Arc::new(if p.own_filters.is_empty() {
            statistics(&p.files, &p.table_schema, &p.columns, parts, self.fetch, p.filter.is_some())
        } else {
            filtered_statistics(&p.files, &p.table_schema, &p.columns, parts, self.fetch, &p.own_filters)
        }))
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(Self::with_parts(Arc::clone(&self.parts), limit)))
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }
}
