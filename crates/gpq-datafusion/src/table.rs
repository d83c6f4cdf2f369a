//! [`GpqTable`]: a DataFusion [`TableProvider`] over Parquet files read by gpq.
//!
//! Creating a table loads every footer. A scan first checks each file's size
//! and modification time against those recorded when its footer was read
//! (one `stat` per file, as DataFusion's listing table does) and re-reads the
//! footers of files that changed, so a file rewritten in place is never
//! pruned with stale statistics or decoded under stale metadata; a rewritten
//! file whose schema no longer fits the table fails the scan. The scan then
//! resolves the backend, turns the pushed-down filters into one physical
//! predicate, prunes row groups (statistics) and pages (page index), applies
//! the limit when there is no filter, cuts what is left into partitions and
//! returns a [`GpqScanExec`].
//!
//! Filters the device evaluates exactly (see the `filter` module) are
//! reported `Exact` when the table's scans can run on a GPU and
//! [`GpqTableOptions::device_filters`] is on: the scan applies them itself,
//! reading their columns even when the query does not project them. Other
//! filters are `Inexact`: they prune, and DataFusion applies them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::catalog::TableProvider;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use tracing::{debug, info};

use crate::exec::{GpqScanExec, ScanBackend, ScanParts};
use crate::file::{GpqFile, discover, open_files, refresh};
use crate::filter::{ScanFilter, device_predicate, filter_columns};
use crate::options::{Backend, GpqTableOptions};
use crate::pruning::pushed_predicate;
use crate::stats::statistics;
use crate::to_df_error;
use crate::units::{ScanUnit, plan_units, split_partitions};
use gpq::cuda::{GpuContext, device_available};
use gpq::{ColumnSelector, ReadOptions, ReadPlan};

/// A table of one or more Parquet files with a common schema, scanned by gpq.
///
/// ```no_run
/// # async fn demo() -> datafusion::error::Result<()> {
/// use datafusion::prelude::SessionContext;
/// use gpq_datafusion::{Backend, GpqTableOptions, register_gpq};
///
/// let ctx = SessionContext::new();
/// register_gpq(&ctx, "lineitem", "data/lineitem.parquet", GpqTableOptions::new().with_backend(Backend::Auto))?;
/// ctx.sql("SELECT count(*) FROM lineitem WHERE l_quantity < 5").await?.show().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct GpqTable {
    paths: Vec<PathBuf>,
    schema: SchemaRef,
    options: GpqTableOptions,
    /// The footers as of the last check, and the statistics derived from them.
    state: RwLock<Arc<TableState>>,
    /// Planned on behalf of executors elsewhere (a distributed scheduler):
    /// see [`GpqTable::planned_for_executors`].
    for_executors: bool,
}

/// The files' footers at one point in time, and the table statistics from them.
#[derive(Debug)]
struct TableState {
    files: Arc<Vec<GpqFile>>,
    statistics: Statistics,
}

impl TableState {
    /// The state of `files`, with the table statistics computed from their footers.
    fn new(files: Vec<GpqFile>, schema: &SchemaRef) -> TableState {
        let columns: Vec<usize> = (0..schema.fields().len()).collect();
        let all: Vec<ScanUnit> = files
            .iter()
            .enumerate()
            .flat_map(|(fi, f)| {
                (0..f.metadata().num_row_groups()).map(move |rg| {
                    let rows = f.row_group_rows(rg);
                    ScanUnit {
                        file: fi,
                        row_group: rg,
                        rg_rows: rows,
                        selection: None,
                        rows,
                        bytes: 0,
                    }
                })
            })
            .collect();
        let statistics = statistics(&files, schema, &columns, [all.as_slice()], None, false);
        TableState {
            files: Arc::new(files),
            statistics,
        }
    }
}

impl GpqTable {
    /// A table over `path`: one Parquet file, or the `*.parquet` files of a
    /// directory (not recursive; hidden and `_`-prefixed names skipped).
    pub fn try_new(path: impl AsRef<Path>, options: GpqTableOptions) -> gpq::Result<GpqTable> {
        Self::try_new_with_files(discover(path.as_ref())?, options)
    }

    /// A table over the given files, in that order.
    pub fn try_new_with_files<P: AsRef<Path>>(
        files: impl IntoIterator<Item = P>,
        options: GpqTableOptions,
    ) -> gpq::Result<GpqTable> {
        let paths: Vec<PathBuf> = files
            .into_iter()
            .map(|p| p.as_ref().to_path_buf())
            .collect();
        let (files, schema) = open_files(&paths, options.string_views.unwrap_or(false))?;
        if options.backend == Backend::Auto {
            let gpu = device_available();
            info!(
                files = files.len(),
                first = %files.first().map(|f| f.path.display().to_string()).unwrap_or_default(),
                "gpq table: backend auto resolves to {}",
                if gpu { "gpu (a CUDA device is present)" } else { "cpu (no CUDA device)" }
            );
        }
        let state = TableState::new(files, &schema);
        Ok(GpqTable {
            paths,
            schema,
            options,
            state: RwLock::new(Arc::new(state)),
            for_executors: false,
        })
    }

    /// The files of the table.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.paths.iter().map(PathBuf::as_path)
    }

    /// The table's options.
    pub fn options(&self) -> &GpqTableOptions {
        &self.options
    }

    /// This table as a scheduler plans it for executors in other processes
    /// (Ballista's, say), which decode on their own hardware: its scans are
    /// planned without looking for a GPU here. Filters the device can
    /// evaluate are `Exact` unless the backend is `Cpu` (an executor without
    /// a GPU applies them on the host, so the answer is the same), and each
    /// executor resolves the backend and device where it decodes (see
    /// [`GpqScanExec::from_bytes_on`](crate::GpqScanExec::from_bytes_on)).
    pub fn planned_for_executors(mut self) -> GpqTable {
        self.for_executors = true;
        self
    }

    /// Whether scans are planned for executors elsewhere (see
    /// [`GpqTable::planned_for_executors`]).
    pub fn is_planned_for_executors(&self) -> bool {
        self.for_executors
    }

    /// Rows in all files, from the footers as of the last scan (or the
    /// registration); saturates at `usize::MAX`.
    pub fn num_rows(&self) -> usize {
        self.snapshot()
            .files
            .iter()
            .map(GpqFile::rows)
            .fold(0usize, usize::saturating_add)
    }

    /// The footers as of the last check, without checking the files.
    fn snapshot(&self) -> Arc<TableState> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&state)
    }

    /// The footers, current: each file is stat-ed, and the footers of files
    /// whose size or modification time changed are re-read (and the table
    /// statistics recomputed) before a scan plans with them.
    fn current(&self) -> Result<Arc<TableState>> {
        let seen = self.snapshot();
        let mut changed: Vec<(usize, GpqFile)> = Vec::new();
        for (i, file) in seen.files.iter().enumerate() {
            if let Some(fresh) = refresh(file, &self.schema)? {
                info!(
                    file = %fresh.path.display(),
                    size = fresh.stamp.size,
                    "gpq table: file changed since its footer was read; footer re-read"
                );
                changed.push((i, fresh));
            }
        }
        if changed.is_empty() {
            return Ok(seen);
        }
        // Another scan may have refreshed other files meanwhile: apply these
        // changes to what is there now.
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        let mut files: Vec<GpqFile> = state.files.as_ref().clone();
        for (i, fresh) in changed {
            if let Some(slot) = files.get_mut(i) {
                *slot = fresh;
            }
        }
        let fresh = Arc::new(TableState::new(files, &self.schema));
        *state = Arc::clone(&fresh);
        Ok(fresh)
    }

    /// Whether this table's scans may filter on the device: device filters
    /// on, and a GPU backend (or automatic, with a CUDA device present, or
    /// planned for executors that decide).
    fn filters_on_device(&self) -> bool {
        self.options.device_filters
            && match self.options.backend {
                Backend::Gpu => true,
                Backend::Auto => self.for_executors || device_available(),
                Backend::Cpu => false,
            }
    }

    /// Whether the scan applies `filter` itself (it is reported `Exact`).
    fn applies_itself(&self, filter: &Expr) -> bool {
        self.filters_on_device() && !filter.is_volatile() && device_predicate(filter, &self.schema).is_some()
    }
}

/// The backend a scan of `columns` of `files` with `options` runs with in
/// this process, and how `EXPLAIN` names it: the CPU for `Backend::Cpu`;
/// else the GPU where every device the options name can be used and can
/// decode the columns; else the CPU where `Backend::Auto` (no usable
/// device) or the GPU fallback (columns it cannot decode) allow, an error
/// where not.
pub(crate) fn resolve_backend(options: &GpqTableOptions, files: &[GpqFile], columns: &[usize]) -> Result<(ScanBackend, String)> {
    let device = options.read.device;
    match options.backend {
        Backend::Cpu => return Ok((ScanBackend::Cpu, "cpu".into())),
        Backend::Auto if !device_available() => {
            return Ok((ScanBackend::Cpu, "cpu (auto: no CUDA device)".into()));
        }
        Backend::Auto | Backend::Gpu => {}
    }
    let devices = if options.devices.is_empty() { vec![device] } else { options.devices.clone() };
    for &d in &devices {
        if let Err(e) = GpuContext::get(d) {
            return match options.backend {
                Backend::Gpu => Err(to_df_error(e)),
                _ => Ok((ScanBackend::Cpu, format!("cpu (auto: {e})"))),
            };
        }
    }
    if let Some(why) = gpu_unsupported(files, columns) {
        if !options.gpu_fallback {
            return Err(to_df_error(why));
        }
        info!("gpq scan decodes on the CPU: {why}");
        return Ok((ScanBackend::Cpu, format!("cpu (gpu fallback: {why})")));
    }
    let io = gpq::io::resolve_path(&options.read.io).map(|(p, _)| p.name()).unwrap_or("invalid");
    let decompress = format!("{:?}", options.read.decompress).to_ascii_lowercase();
    Ok((
        ScanBackend::Gpu,
        if options.devices.is_empty() {
            format!("gpu (device={device}, io={io}, decompress={decompress})")
        } else {
            let list: Vec<String> = devices.iter().map(usize::to_string).collect();
            format!("gpu (devices={}, io={io}, decompress={decompress})", list.join("+"))
        },
    ))
}

/// `Backend::Auto`'s choice for a scan resolved to the GPU: the CPU where
/// the row groups it reads (`units`, all partitions) hold fewer projected
/// compressed bytes than [`GpqTableOptions::gpu_min_scan_bytes`].
pub(crate) fn route_small_scan<'u>(
    options: &GpqTableOptions,
    (backend, note): (ScanBackend, String),
    units: impl Iterator<Item = &'u ScanUnit>,
) -> (ScanBackend, String) {
    if options.backend != Backend::Auto || backend != ScanBackend::Gpu || options.gpu_min_scan_bytes == 0 {
        return (backend, note);
    }
    let bytes = projected_bytes(units);
    if bytes >= options.gpu_min_scan_bytes {
        return (backend, note);
    }
    let why = format!(
        "{:.1} MiB of projected compressed bytes, under gpu_min_scan_bytes ({:.1} MiB)",
        bytes as f64 / (1u64 << 20) as f64,
        options.gpu_min_scan_bytes as f64 / (1u64 << 20) as f64
    );
    debug!("gpq scan decodes on the CPU: {why}");
    (ScanBackend::Cpu, format!("cpu (auto: {why})"))
}

/// The projected compressed bytes of `units` (saturating: footers are input).
fn projected_bytes<'u>(units: impl IntoIterator<Item = &'u ScanUnit>) -> u64 {
    units.into_iter().map(|u| u.bytes).fold(0u64, u64::saturating_add)
}

/// The partitions a scan on `backend` is cut into at most: `target`, or
/// for a GPU scan with [`GpqTableOptions::gpu_min_partition_bytes`] set, one
/// for each that many projected compressed bytes of `units` (at least one).
pub(crate) fn gpu_partitions(options: &GpqTableOptions, backend: ScanBackend, units: &[ScanUnit], target: usize) -> usize {
    if backend != ScanBackend::Gpu || options.gpu_min_partition_bytes == 0 {
        return target;
    }
    let bytes = projected_bytes(units);
    let fit = usize::try_from(bytes / options.gpu_min_partition_bytes).unwrap_or(usize::MAX);
    target.min(fit).max(1)
}

/// The backend a scheduler records for a scan its executors will resolve
/// (see [`GpqTable::planned_for_executors`]); nothing here is probed.
fn planned_for_executors(options: &GpqTableOptions) -> (ScanBackend, String) {
    match options.backend {
        Backend::Cpu => (ScanBackend::Cpu, "cpu".into()),
        b => (ScanBackend::Gpu, format!("{b} (resolved by each executor)")),
    }
}

#[async_trait]
impl TableProvider for GpqTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Filters prune row groups and pages; those the scan applies itself
        // are exact, DataFusion applies the others to the rows.
        Ok(filters
            .iter()
            .map(|f| {
                if f.is_volatile() {
                    TableProviderFilterPushDown::Unsupported
                } else if self.applies_itself(f) {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Inexact
                }
            })
            .collect())
    }

    /// Statistics from the footers as of the last scan (or the registration).
    fn statistics(&self) -> Option<Statistics> {
        Some(self.snapshot().statistics.clone())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let width = self.schema.fields().len();
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..width).collect(),
        };
        if let Some(&bad) = columns.iter().find(|&&c| c >= width) {
            return Err(DataFusionError::Plan(format!(
                "gpq table has {width} columns, column {bad} was projected"
            )));
        }
        let schema = Arc::new(self.schema.project(&columns)?);
        // The filters the scan applies itself, and the columns they add.
        let own: Vec<&Expr> = filters.iter().filter(|f| self.applies_itself(f)).collect();
        let mut read_columns = columns.clone();
        read_columns.extend(filter_columns(&own, &self.schema).into_iter().filter(|c| !columns.contains(c)));
        let read_schema = Arc::new(self.schema.project(&read_columns)?);
        let filter = ScanFilter::new(state, &own, &read_schema)?.map(Arc::new);
        let files = Arc::clone(&self.current()?.files);
        let (backend, backend_note) = if self.for_executors {
            planned_for_executors(&self.options)
        } else {
            resolve_backend(&self.options, &files, &read_columns)?
        };
        let predicate = pushed_predicate(state, &self.schema, filters)?;
        // A limit prunes row groups only when there is no filter; it is the
        // scan's own when every filter is (it counts the rows they keep).
        let prune_limit = if filters.is_empty() { limit } else { None };
        let fetch = if own.len() == filters.len() { limit } else { None };
        let (units, pruning) = plan_units(
            &files,
            &self.schema,
            &read_columns,
            predicate.as_ref(),
            self.options.page_index,
            prune_limit,
        );
        let (backend, backend_note) = if self.for_executors {
            (backend, backend_note)
        } else {
            route_small_scan(&self.options, (backend, backend_note), units.iter())
        };
        debug!(?pruning, backend = %backend_note, "gpq scan planned");
        let target = gpu_partitions(&self.options, backend, &units, state.config().target_partitions());
        let partitions = split_partitions(units, target, read_columns.is_empty());
        let own_filters = own.into_iter().cloned().collect();
        Ok(Arc::new(GpqScanExec::new(ScanParts {
            files,
            table_paths: self.paths.clone(),
            table_schema: Arc::clone(&self.schema),
            columns,
            schema,
            read_columns,
            read_schema,
            filter,
            pushed_filters: filters.to_vec(),
            own_filters,
            partitions,
            predicate,
            fetch,
            options: self.options.clone(),
            backend,
            backend_note,
            pruning,
        })))
    }
}

/// Why the GPU cannot decode `columns`, if it cannot (checked on the first
/// file; the files share one schema).
fn gpu_unsupported(files: &[GpqFile], columns: &[usize]) -> Option<gpq::Error> {
    if columns.is_empty() {
        return None;
    }
    let file = files.first()?;
    let selection = file
        .file_roots(columns)
        .into_iter()
        .map(ColumnSelector::Index);
    let options = ReadOptions::new()
        .with_string_views(file.views)
        .with_columns(selection)
        .with_row_groups([]);
    let plan = ReadPlan::from_footer(&file.path, file.footer.clone(), &options).ok()?;
    match gpq::can_decode(&plan) {
        Err(e @ gpq::Error::Unsupported { .. }) => Some(e),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> (ScanBackend, String) {
        (ScanBackend::Gpu, "gpu (device=0)".into())
    }

    #[test]
    fn only_automatic_scans_under_the_threshold_go_to_the_cpu() {
        let units = [ScanUnit::whole(10, 20 << 20), ScanUnit::whole(10, 11 << 20)];
        let auto = GpqTableOptions::new().with_gpu_min_scan_bytes(32 << 20);
        let (backend, note) = route_small_scan(&auto, gpu(), units.iter());
        assert_eq!(backend, ScanBackend::Cpu);
        assert!(note.starts_with("cpu (auto: 31.0 MiB"), "{note}");
        // The default threshold (128 MiB) takes it to the CPU too.
        assert_eq!(route_small_scan(&GpqTableOptions::new(), gpu(), units.iter()).0, ScanBackend::Cpu);
        // At the threshold, with the option off, or with the GPU asked for: the GPU.
        assert_eq!(route_small_scan(&auto.clone().with_gpu_min_scan_bytes(31 << 20), gpu(), units.iter()).0, ScanBackend::Gpu);
        assert_eq!(route_small_scan(&GpqTableOptions::new().with_gpu_min_scan_bytes(0), gpu(), units.iter()).0, ScanBackend::Gpu);
        let forced = auto.clone().with_backend(Backend::Gpu);
        assert_eq!(route_small_scan(&forced, gpu(), units.iter()), gpu());
        // A scan already on the CPU stays there with its own reason.
        let cpu = (ScanBackend::Cpu, "cpu (auto: no CUDA device)".to_string());
        assert_eq!(route_small_scan(&auto, cpu.clone(), units.iter()), cpu);
        // Nothing left after pruning is under any threshold.
        assert_eq!(route_small_scan(&auto, gpu(), [].iter()).0, ScanBackend::Cpu);
    }

    #[test]
    fn gpu_scans_take_a_partition_per_min_partition_bytes() {
        let units: Vec<ScanUnit> = (0..10).map(|_| ScanUnit::whole(10, 10 << 20)).collect();
        let options = GpqTableOptions::new().with_gpu_min_partition_bytes(32 << 20);
        assert_eq!(gpu_partitions(&options, ScanBackend::Gpu, &units, 16), 3, "100 MiB in partitions of 32 MiB or more");
        assert_eq!(gpu_partitions(&options, ScanBackend::Gpu, &units, 2), 2, "never more than the session asks for");
        assert_eq!(gpu_partitions(&options, ScanBackend::Gpu, &units[..1], 16), 1, "at least one");
        assert_eq!(gpu_partitions(&options, ScanBackend::Cpu, &units, 16), 16, "CPU scans keep the session's");
        assert_eq!(gpu_partitions(&GpqTableOptions::new(), ScanBackend::Gpu, &units, 16), 16, "off by default");
    }
}
