//! Tables and scans as bytes, so that they can cross process boundaries (a
//! distributed engine such as Ballista plans on a scheduler and executes on
//! executors) without live handles: no open files, footers or device state.
//!
//! A [`GpqTable`] travels as its files, its schema and its options;
//! [`GpqTable::from_bytes`] opens the files and reads their footers again.
//! A [`GpqScanExec`] travels as its table, the columns it outputs and reads,
//! the filters DataFusion pushed down (all of them, and those the scan
//! applies itself), its row limit, the backend chosen when it was planned,
//! its partitions as lists of row groups (each with its page-index
//! selection as runs of rows to skip and to read) and what pruning removed.
//! [`GpqScanExec::from_bytes`] opens only the files the partitions read,
//! checks that each is the file the scan was planned on (same size and
//! modification time) and that each row group is there with the rows the
//! plan says, and rebuilds the filters from their expressions against the
//! read schema. The decoded scan reads exactly the row groups and rows the
//! planner chose; only the backend is decided again where the scan is
//! decoded, since an executor knows its own hardware and the planner does
//! not ([`ScanDevice`]: as the table's options say, on a given GPU, or on
//! the CPU).
//!
//! # Encoding
//!
//! JSON (serde_json) rather than bincode: serde_json is already in the
//! dependency tree and bincode is not; JSON describes itself, so a scan can
//! be read in a log, and bytes of another kind, version or shape fail with an
//! error that names the field; and size does not matter here (a unit is
//! about a hundred bytes, next to the row group of megabytes it reads). What
//! DataFusion already serializes travels as DataFusion's own protobuf
//! messages (datafusion-proto), written into the JSON as hex: the Arrow
//! schema, and each filter as a logical expression, decoded with the
//! functions of the receiving task's context. The table options are mirrored
//! field by field (the core `gpq` crate has no serde); the mirrors
//! destructure the options without `..`, so a new option does not compile
//! until it is carried here too. `ReadOptions::columns` and `row_groups` are
//! not carried: a table ignores them (each scan sets its own).
//!
//! Bytes that are not such a document, of another kind or version, or that
//! describe something impossible (a column outside the table, a row group
//! the file does not have, a selection of other than the row group's rows)
//! are a [`DataFusionError`], never a panic.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::bytes::Serializeable;
use datafusion_proto::protobuf;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use prost::Message;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tracing::debug;

use gpq::{DecompressMode, DeviceDecoder, IoOptions, IoPath, ReadOptions};

use crate::exec::{GpqScanExec, ScanBackend, ScanParts};
use crate::file::{FileStamp, GpqFile, fit_to_table};
use crate::filter::ScanFilter;
use crate::options::{Backend, GpqTableOptions};
use crate::pruning::pushed_predicate;
use crate::table::{GpqTable, resolve_backend, route_small_scan};
use crate::to_df_error;
use crate::units::{PruningSummary, ScanUnit};

/// The version of the documents written here; others are refused.
const VERSION: u32 = 1;
/// What a serialized table says it is.
const TABLE_KIND: &str = "gpq-table";
/// What a serialized scan says it is.
const SCAN_KIND: &str = "gpq-scan";

impl GpqTable {
    /// The table as bytes: its files, schema and options (see the `remote`
    /// module of this crate for the format). Fails on a path that is not UTF-8.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let paths: Vec<PathBuf> = self.files().map(Path::to_path_buf).collect();
        let table = TableSpec::new(&paths, &self.schema(), self.options())?;
        to_json(&Document { kind: TABLE_KIND.into(), version: VERSION, body: table })
    }

    /// The table that `bytes` (from [`GpqTable::to_bytes`]) describe, its
    /// files opened and their footers read again.
    ///
    /// Fails when the bytes are not a serialized gpq table (of this
    /// version), when a file cannot be opened, or when the files no longer
    /// have the schema the table had.
    pub fn from_bytes(bytes: &[u8]) -> Result<GpqTable> {
        let doc: Document<TableSpec> = from_json(bytes, TABLE_KIND)?;
        doc.body.open()
    }
}

impl GpqScanExec {
    /// The scan as bytes: its table, columns, filters, limit, backend,
    /// partitions and pruning summary (see the `remote` module of this crate
    /// for the format). Only the files its partitions read are listed with
    /// the units.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let p = self.parts();
        // The files the partitions read, in table order, numbered anew.
        let mut used: BTreeMap<usize, usize> = p.partitions.iter().flatten().map(|u| (u.file, 0)).collect();
        let mut files = Vec::with_capacity(used.len());
        for (old, new) in used.iter_mut() {
            let file = p.files.get(*old).ok_or_else(|| {
                DataFusionError::Internal(format!("gpq scan: a unit reads file {old} of {}", p.files.len()))
            })?;
            *new = files.len();
            files.push(FileSpec::of(file)?);
        }
        let partitions = p
            .partitions
            .iter()
            .map(|units| units.iter().map(|u| UnitSpec::of(u, used.get(&u.file).copied().unwrap_or_default())).collect())
            .collect();
        let scan = ScanSpec {
            table: TableSpec::new(&p.table_paths, &p.table_schema, &p.options)?,
            files,
            columns: p.columns.clone(),
            read_columns: p.read_columns.clone(),
            pushed_filters: p.pushed_filters.iter().map(encode_expr).collect::<Result<_>>()?,
            own_filters: p.own_filters.iter().map(encode_expr).collect::<Result<_>>()?,
            fetch: self.fetch(),
            backend: p.backend.into(),
            backend_note: p.backend_note.clone(),
            partitions,
            pruning: PruningSpec::from(&p.pruning),
        };
        to_json(&Document { kind: SCAN_KIND.into(), version: VERSION, body: scan })
    }

    /// The scan that `bytes` (from [`GpqScanExec::to_bytes`]) describe,
    /// ready to execute: the same partitions, columns, filters and limit,
    /// on the same backend.
    ///
    /// Opens only the files the partitions read and reads their footers;
    /// the filter expressions are decoded with the functions of `ctx`.
    /// Fails when the bytes are not a serialized gpq scan (of this
    /// version), describe an impossible scan, or when a file cannot be
    /// opened or is no longer the file the scan was planned on.
    pub fn from_bytes(bytes: &[u8], ctx: &TaskContext) -> Result<GpqScanExec> {
        Self::from_bytes_on(bytes, ctx, ScanDevice::AsOptions)
    }

    /// [`GpqScanExec::from_bytes`], decoding on `device`: the backend is
    /// resolved here, by the table's options with `device` applied (see
    /// [`ScanDevice`]), whatever the planner chose.
    pub fn from_bytes_on(bytes: &[u8], ctx: &TaskContext, device: ScanDevice) -> Result<GpqScanExec> {
        let doc: Document<ScanSpec> = from_json(bytes, SCAN_KIND)?;
        doc.body.decode(ctx, device)
    }
}

/// Where a process decodes the scans it receives (an executor's setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScanDevice {
    /// As the table's options say: their devices, and the CPU where
    /// `Backend::Auto` finds none usable here.
    #[default]
    AsOptions,
    /// Every partition on this CUDA device (an executor bound to one GPU);
    /// the CPU where `Backend::Auto` cannot use it.
    Gpu(usize),
    /// On the CPU (an executor without a GPU). A table whose backend is
    /// `Backend::Gpu` cannot be scanned here.
    Cpu,
}

impl ScanDevice {
    /// `options` as a scan decoded on this device uses them.
    fn apply(self, mut options: GpqTableOptions) -> GpqTableOptions {
        if let ScanDevice::Gpu(d) = self {
            options.read.device = d;
            options.devices.clear();
        }
        options
    }
}

/// A serialized table or scan: what it is, the format's version, and itself.
#[derive(Serialize, Deserialize)]
struct Document<T> {
    kind: String,
    version: u32,
    body: T,
}

/// The start of a [`Document`], read first so that bytes of another kind
/// or version are refused as such rather than as a missing field.
#[derive(Deserialize)]
struct Header {
    kind: String,
    version: u32,
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| DataFusionError::Plan(format!("gpq: cannot serialize: {e}")))
}

fn from_json<T: DeserializeOwned>(bytes: &[u8], kind: &str) -> Result<T> {
    let invalid = |e: serde_json::Error| DataFusionError::Plan(format!("gpq: not a serialized {kind}: {e}"));
    let header: Header = serde_json::from_slice(bytes).map_err(invalid)?;
    if header.kind != kind {
        return Err(DataFusionError::Plan(format!("gpq: expected a serialized {kind}, got a {}", header.kind)));
    }
    if header.version != VERSION {
        return Err(DataFusionError::Plan(format!(
            "gpq: a serialized {kind} of version {}, this build reads version {VERSION}",
            header.version
        )));
    }
    serde_json::from_slice(bytes).map_err(invalid)
}

/// An impossible scan, described.
fn invalid_scan(what: String) -> DataFusionError {
    DataFusionError::Plan(format!("gpq: invalid serialized scan: {what}"))
}

/// Bytes written into the JSON as lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hex(Vec<u8>);

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(self.0.len() * 2);
        for b in &self.0 {
            let _ = write!(text, "{b:02x}");
        }
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let digit = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
        if text.len() % 2 != 0 {
            return Err(D::Error::custom("hex text of odd length"));
        }
        text.as_bytes()
            .chunks_exact(2)
            .map(|pair| match (digit(pair[0]), digit(pair[1])) {
                (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
                _ => Err(D::Error::custom("not hex")),
            })
            .collect::<Result<Vec<u8>, D::Error>>()
            .map(Hex)
    }
}

/// The Arrow schema as DataFusion's protobuf message.
fn encode_schema(schema: &Schema) -> Result<Hex> {
    let proto = protobuf::Schema::try_from(schema)
        .map_err(|e| DataFusionError::Plan(format!("gpq: cannot serialize the schema: {e}")))?;
    Ok(Hex(proto.encode_to_vec()))
}

fn decode_schema(bytes: &Hex) -> Result<Schema> {
    let invalid = |e: String| DataFusionError::Plan(format!("gpq: invalid serialized schema: {e}"));
    let proto = protobuf::Schema::decode(bytes.0.as_slice()).map_err(|e| invalid(e.to_string()))?;
    Schema::try_from(&proto).map_err(|e| invalid(e.to_string()))
}

/// A logical expression as DataFusion's protobuf message.
fn encode_expr(expr: &Expr) -> Result<Hex> {
    Ok(Hex(expr.to_bytes()?.to_vec()))
}

fn decode_expr(bytes: &Hex, ctx: &TaskContext) -> Result<Expr> {
    Expr::from_bytes_with_ctx(&bytes.0, ctx)
}

/// A session over a task's configuration and functions, for planning the
/// filters' physical expressions as the table's scan did.
fn session_of(ctx: &TaskContext) -> SessionState {
    SessionStateBuilder::new()
        .with_config(ctx.session_config().clone())
        .with_runtime_env(ctx.runtime_env())
        .with_scalar_functions(ctx.scalar_functions().values().cloned().collect())
        .build()
}

/// A table: its files, schema and options.
#[derive(Serialize, Deserialize)]
struct TableSpec {
    paths: Vec<PathBuf>,
    schema: Hex,
    options: OptionsSpec,
}

impl TableSpec {
    fn new(paths: &[PathBuf], schema: &Schema, options: &GpqTableOptions) -> Result<TableSpec> {
        Ok(TableSpec { paths: paths.to_vec(), schema: encode_schema(schema)?, options: OptionsSpec::from(options) })
    }

    /// The table, its footers read again; its files must still have its schema.
    fn open(self) -> Result<GpqTable> {
        let schema = decode_schema(&self.schema)?;
        let table = GpqTable::try_new_with_files(&self.paths, self.options.into()).map_err(to_df_error)?;
        if table.schema().fields() != schema.fields() {
            return Err(DataFusionError::Execution(format!(
                "gpq table: its files no longer have the schema it was serialized with: {} now, {} then",
                table.schema(),
                schema
            )));
        }
        Ok(table)
    }
}

/// A scan: see [`GpqScanExec::to_bytes`].
#[derive(Serialize, Deserialize)]
struct ScanSpec {
    table: TableSpec,
    /// The files the partitions read (the units index this list).
    files: Vec<FileSpec>,
    columns: Vec<usize>,
    read_columns: Vec<usize>,
    pushed_filters: Vec<Hex>,
    own_filters: Vec<Hex>,
    fetch: Option<usize>,
    backend: BackendChoice,
    backend_note: String,
    partitions: Vec<Vec<UnitSpec>>,
    pruning: PruningSpec,
}

impl ScanSpec {
    fn decode(self, ctx: &TaskContext, device: ScanDevice) -> Result<GpqScanExec> {
        let table_schema: SchemaRef = Arc::new(decode_schema(&self.table.schema)?);
        let options: GpqTableOptions = device.apply(self.table.options.into());
        let width = table_schema.fields().len();
        if let Some(bad) = self.read_columns.iter().find(|&&c| c >= width) {
            return Err(invalid_scan(format!("column {bad} of a table of {width} columns")));
        }
        // Decoders output the first `columns.len()` read columns.
        if !self.read_columns.starts_with(&self.columns) {
            return Err(invalid_scan(format!(
                "read columns {:?} do not start with the output columns {:?}",
                self.read_columns, self.columns
            )));
        }
        let schema = Arc::new(table_schema.project(&self.columns)?);
        let read_schema = Arc::new(table_schema.project(&self.read_columns)?);

        // Open the files the partitions read, and only those.
        let views = options.string_views.unwrap_or(false);
        let mut used: BTreeMap<usize, usize> = BTreeMap::new();
        for u in self.partitions.iter().flatten() {
            if u.file >= self.files.len() {
                return Err(invalid_scan(format!("a unit reads file {} of {}", u.file, self.files.len())));
            }
            used.insert(u.file, 0);
        }
        let mut files = Vec::with_capacity(used.len());
        for (old, new) in used.iter_mut() {
            *new = files.len();
            files.push(self.files[*old].open(&table_schema, views)?);
        }
        let partitions = self
            .partitions
            .into_iter()
            .map(|units| {
                units
                    .into_iter()
                    .map(|u| {
                        let file = used.get(&u.file).copied().unwrap_or_default();
                        u.into_unit(&files, file)
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;

        let pushed_filters = self.pushed_filters.iter().map(|f| decode_expr(f, ctx)).collect::<Result<Vec<_>>>()?;
        let own_filters = self.own_filters.iter().map(|f| decode_expr(f, ctx)).collect::<Result<Vec<_>>>()?;
        let (filter, predicate) = if pushed_filters.is_empty() && own_filters.is_empty() {
            (None, None)
        } else {
            let state = session_of(ctx);
            let own: Vec<&Expr> = own_filters.iter().collect();
            let filter = ScanFilter::new(&state, &own, &read_schema)?.map(Arc::new);
            (filter, pushed_predicate(&state, &table_schema, &pushed_filters)?)
        };
        let (backend, backend_note) = match (device, options.backend) {
            (_, Backend::Cpu) => (ScanBackend::Cpu, "cpu".to_string()),
            (ScanDevice::Cpu, Backend::Gpu) => {
                return Err(DataFusionError::Execution(
                    "gpq scan: the table's backend is gpu, and this process decodes on the CPU only".into(),
                ));
            }
            (ScanDevice::Cpu, Backend::Auto) => (ScanBackend::Cpu, "cpu (this executor has no GPU)".to_string()),
            // Bound to a GPU: the automatic backend takes it where it can be used.
            (ScanDevice::Gpu(d), Backend::Auto) => match gpq::cuda::GpuContext::get(d) {
                Ok(_) => resolve_backend(&GpqTableOptions { backend: Backend::Gpu, ..options.clone() }, &files, &self.read_columns)?,
                Err(e) => (ScanBackend::Cpu, format!("cpu (auto: {e})")),
            },
            _ => resolve_backend(&options, &files, &self.read_columns)?,
        };
        let (backend, backend_note) = route_small_scan(&options, (backend, backend_note), partitions.iter().flatten());
        if backend != ScanBackend::from(self.backend) {
            debug!(planned = %self.backend_note, here = %backend_note, "gpq scan: backend resolved where it is decoded");
        }
        Ok(GpqScanExec::new(ScanParts {
            files: Arc::new(files),
            table_paths: self.table.paths,
            table_schema,
            columns: self.columns,
            schema,
            read_columns: self.read_columns,
            read_schema,
            filter,
            pushed_filters,
            own_filters,
            partitions,
            predicate,
            fetch: self.fetch,
            options,
            backend,
            backend_note,
            pruning: self.pruning.into(),
        }))
    }
}

/// A file a scan reads, as the planner saw it.
#[derive(Serialize, Deserialize)]
struct FileSpec {
    path: PathBuf,
    size: u64,
    /// Modification time in nanoseconds since the Unix epoch, where known.
    modified_ns: Option<u64>,
}

impl FileSpec {
    fn of(file: &GpqFile) -> Result<FileSpec> {
        Ok(FileSpec { path: file.path.clone(), size: file.stamp.size, modified_ns: nanos_since_epoch(&file.stamp) })
    }

    /// The file, its footer read; it must be the one the scan was planned on.
    fn open(&self, table_schema: &Schema, views: bool) -> Result<GpqFile> {
        let mut file = GpqFile::open(&self.path, views).map_err(to_df_error)?;
        let now = (file.stamp.size, nanos_since_epoch(&file.stamp));
        if now != (self.size, self.modified_ns) {
            return Err(DataFusionError::Execution(format!(
                "gpq scan: {} changed since the scan was planned (size {} and modified {:?} ns then, {} and {:?} now)",
                self.path.display(),
                self.size,
                self.modified_ns,
                now.0,
                now.1
            )));
        }
        fit_to_table(&mut file, table_schema).map_err(|what| {
            DataFusionError::Execution(format!("gpq scan: {} does not have the table's schema: {what}", self.path.display()))
        })?;
        Ok(file)
    }
}

fn nanos_since_epoch(stamp: &FileStamp) -> Option<u64> {
    let since = stamp.modified?.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since.as_nanos()).ok()
}

/// One row group to read.
#[derive(Serialize, Deserialize)]
struct UnitSpec {
    /// Index in the scan's files.
    file: usize,
    row_group: usize,
    rg_rows: usize,
    /// The rows the page index kept, as (skip, read) runs in row order;
    /// `None`: every row.
    selection: Option<Vec<(usize, usize)>>,
    rows: usize,
    bytes: u64,
}

impl UnitSpec {
    fn of(unit: &ScanUnit, file: usize) -> UnitSpec {
        let selection = unit.selection.as_ref().map(|s| {
            let mut runs = Vec::new();
            let mut skip = 0;
            for selector in s.iter() {
                if selector.skip {
                    skip += selector.row_count;
                } else {
                    runs.push((skip, selector.row_count));
                    skip = 0;
                }
            }
            if skip > 0 {
                runs.push((skip, 0));
            }
            runs
        });
        UnitSpec {
            file,
            row_group: unit.row_group,
            rg_rows: unit.rg_rows,
            selection,
            rows: unit.rows,
            bytes: unit.bytes,
        }
    }

    /// The unit, reading `files[file]`, checked against that file's footer.
    fn into_unit(self, files: &[GpqFile], file: usize) -> Result<ScanUnit> {
        let f = files.get(file).ok_or_else(|| invalid_scan(format!("no file {file}")))?;
        let groups = f.metadata().num_row_groups();
        if self.row_group >= groups {
            return Err(invalid_scan(format!(
                "{} has {groups} row groups, row group {} was planned",
                f.path.display(),
                self.row_group
            )));
        }
        let actual = f.row_group_rows(self.row_group);
        if actual != self.rg_rows {
            return Err(invalid_scan(format!(
                "row group {} of {} has {actual} rows, {} were planned",
                self.row_group,
                f.path.display(),
                self.rg_rows
            )));
        }
        let mismatch = |what: &str| {
            invalid_scan(format!("the selection of row group {} of {} {what}", self.row_group, f.path.display()))
        };
        let selection = match &self.selection {
            None if self.rows != self.rg_rows => return Err(mismatch("is missing, yet not every row is read")),
            None => None,
            Some(runs) => {
                let (mut covered, mut selected) = (0usize, 0usize);
                let mut selectors = Vec::with_capacity(runs.len() * 2);
                for &(skip, read) in runs {
                    covered = covered.checked_add(skip).and_then(|c| c.checked_add(read)).ok_or_else(|| mismatch("overflows"))?;
                    selected += read;
                    selectors.push(RowSelector::skip(skip));
                    selectors.push(RowSelector::select(read));
                }
                if covered != self.rg_rows || selected != self.rows {
                    return Err(mismatch(&format!(
                        "covers {covered} rows and reads {selected}; the row group has {} and the unit reads {}",
                        self.rg_rows, self.rows
                    )));
                }
                // Empty runs are dropped and neighbours of a kind merged.
                Some(RowSelection::from(selectors))
            }
        };
        Ok(ScanUnit {
            file,
            row_group: self.row_group,
            rg_rows: self.rg_rows,
            selection,
            rows: self.rows,
            bytes: self.bytes,
        })
    }
}

/// [`ScanBackend`], serialized.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BackendChoice {
    Cpu,
    Gpu,
}

impl From<ScanBackend> for BackendChoice {
    fn from(b: ScanBackend) -> Self {
        match b {
            ScanBackend::Cpu => BackendChoice::Cpu,
            ScanBackend::Gpu => BackendChoice::Gpu,
        }
    }
}

impl From<BackendChoice> for ScanBackend {
    fn from(b: BackendChoice) -> Self {
        match b {
            BackendChoice::Cpu => ScanBackend::Cpu,
            BackendChoice::Gpu => ScanBackend::Gpu,
        }
    }
}

/// [`PruningSummary`], serialized.
#[derive(Serialize, Deserialize)]
struct PruningSpec {
    files: usize,
    row_groups: usize,
    pruned_by_statistics: usize,
    pruned_by_page_index: usize,
    rows_pruned_by_page_index: usize,
    pruned_by_limit: usize,
    scanned: usize,
    rows: usize,
}

impl From<&PruningSummary> for PruningSpec {
    fn from(p: &PruningSummary) -> Self {
        let PruningSummary {
            files,
            row_groups,
            pruned_by_statistics,
            pruned_by_page_index,
            rows_pruned_by_page_index,
            pruned_by_limit,
            scanned,
            rows,
        } = *p;
        PruningSpec {
            files,
            row_groups,
            pruned_by_statistics,
            pruned_by_page_index,
            rows_pruned_by_page_index,
            pruned_by_limit,
            scanned,
            rows,
        }
    }
}

impl From<PruningSpec> for PruningSummary {
    fn from(p: PruningSpec) -> Self {
        let PruningSpec {
            files,
            row_groups,
            pruned_by_statistics,
            pruned_by_page_index,
            rows_pruned_by_page_index,
            pruned_by_limit,
            scanned,
            rows,
        } = p;
        PruningSummary {
            files,
            row_groups,
            pruned_by_statistics,
            pruned_by_page_index,
            rows_pruned_by_page_index,
            pruned_by_limit,
            scanned,
            rows,
        }
    }
}

/// [`GpqTableOptions`], serialized.
#[derive(Serialize, Deserialize)]
struct OptionsSpec {
    backend: BackendOption,
    read: ReadSpec,
    page_index: bool,
    gpu_read_bytes: u64,
    #[serde(default = "default_min_passes")]
    gpu_min_passes: u64,
    #[serde(default = "default_min_scan_bytes")]
    gpu_min_scan_bytes: u64,
    #[serde(default)]
    gpu_min_partition_bytes: u64,
    gpu_fallback: bool,
    device_filters: bool,
    late_materialization: bool,
    devices: Vec<usize>,
    string_views: Option<bool>,
    inject_gpu_context_loss: usize,
    inject_gpu_context_loss_after: usize,
}

impl From<&GpqTableOptions> for OptionsSpec {
    fn from(o: &GpqTableOptions) -> Self {
        let GpqTableOptions {
            backend,
            read,
            page_index,
            gpu_read_bytes,
            gpu_min_passes,
            gpu_min_scan_bytes,
            gpu_min_partition_bytes,
            gpu_fallback,
            device_filters,
            late_materialization,
            devices,
            string_views,
            inject_gpu_context_loss,
            inject_gpu_context_loss_after,
        } = o;
        OptionsSpec {
            backend: (*backend).into(),
            read: ReadSpec::from(read),
            page_index: *page_index,
            gpu_read_bytes: *gpu_read_bytes,
            gpu_min_passes: *gpu_min_passes,
            gpu_min_scan_bytes: *gpu_min_scan_bytes,
            gpu_min_partition_bytes: *gpu_min_partition_bytes,
            gpu_fallback: *gpu_fallback,
            device_filters: *device_filters,
            late_materialization: *late_materialization,
            devices: devices.clone(),
            string_views: *string_views,
            inject_gpu_context_loss: *inject_gpu_context_loss,
            inject_gpu_context_loss_after: *inject_gpu_context_loss_after,
        }
    }
}

impl From<OptionsSpec> for GpqTableOptions {
    fn from(o: OptionsSpec) -> Self {
        let OptionsSpec {
            backend,
            read,
            page_index,
            gpu_read_bytes,
            gpu_min_passes,
            gpu_min_scan_bytes,
            gpu_min_partition_bytes,
            gpu_fallback,
            device_filters,
            late_materialization,
            devices,
            string_views,
            inject_gpu_context_loss,
            inject_gpu_context_loss_after,
        } = o;
        GpqTableOptions {
            backend: backend.into(),
            read: read.into(),
            page_index,
            gpu_read_bytes,
            gpu_min_passes,
            gpu_min_scan_bytes,
            gpu_min_partition_bytes,
            gpu_fallback,
            device_filters,
            late_materialization,
            devices,
            string_views,
            inject_gpu_context_loss,
            inject_gpu_context_loss_after,
        }
    }
}

/// What a plan serialized before `gpu_min_passes` existed gets.
fn default_min_passes() -> u64 {
    crate::options::DEFAULT_GPU_MIN_PASSES
}

/// What a plan serialized before `gpu_min_scan_bytes` existed gets.
fn default_min_scan_bytes() -> u64 {
    crate::options::DEFAULT_GPU_MIN_SCAN_BYTES
}

/// [`Backend`], serialized.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BackendOption {
    Auto,
    Gpu,
    Cpu,
}

impl From<Backend> for BackendOption {
    fn from(b: Backend) -> Self {
        match b {
            Backend::Auto => BackendOption::Auto,
            Backend::Gpu => BackendOption::Gpu,
            Backend::Cpu => BackendOption::Cpu,
        }
    }
}

impl From<BackendOption> for Backend {
    fn from(b: BackendOption) -> Self {
        match b {
            BackendOption::Auto => Backend::Auto,
            BackendOption::Gpu => Backend::Gpu,
            BackendOption::Cpu => Backend::Cpu,
        }
    }
}

/// The [`ReadOptions`] a table's device reads use, serialized (the
/// columns and row groups left out: each scan sets its own).
#[derive(Serialize, Deserialize)]
struct ReadSpec {
    io_path: IoPathOption,
    io_threads: Option<usize>,
    io_task_size: u64,
    io_merge_gap: u64,
    io_direct: bool,
    device: usize,
    decompress: DecompressOption,
    device_memory_limit: Option<u64>,
    skip_compressed_page_checks: bool,
    verify_page_checksums: bool,
    overlap_groups: Option<usize>,
    string_views: bool,
    #[serde(default)]
    zstd_decoder: DecoderOption,
    #[serde(default)]
    snappy_decoder: Option<DecoderOption>,
}

impl From<&ReadOptions> for ReadSpec {
    fn from(r: &ReadOptions) -> Self {
        let ReadOptions {
            columns: _,
            row_groups: _,
            io,
            device,
            decompress,
            device_memory_limit,
            skip_compressed_page_checks,
            verify_page_checksums,
            overlap_groups,
            string_views,
            zstd_decoder,
            snappy_decoder,
        } = r;
        let IoOptions { path, threads, task_size, merge_gap, direct } = io;
        ReadSpec {
            io_path: (*path).into(),
            io_threads: *threads,
            io_task_size: *task_size,
            io_merge_gap: *merge_gap,
            io_direct: *direct,
            device: *device,
            decompress: (*decompress).into(),
            device_memory_limit: *device_memory_limit,
            skip_compressed_page_checks: *skip_compressed_page_checks,
            verify_page_checksums: *verify_page_checksums,
            overlap_groups: *overlap_groups,
            string_views: *string_views,
            zstd_decoder: (*zstd_decoder).into(),
            snappy_decoder: snappy_decoder.map(Into::into),
        }
    }
}

impl From<ReadSpec> for ReadOptions {
    fn from(r: ReadSpec) -> Self {
        let ReadSpec {
            io_path,
            io_threads,
            io_task_size,
            io_merge_gap,
            io_direct,
            device,
            decompress,
            device_memory_limit,
            skip_compressed_page_checks,
            verify_page_checksums,
            overlap_groups,
            string_views,
            zstd_decoder,
            snappy_decoder,
        } = r;
        ReadOptions {
            columns: None,
            row_groups: None,
            io: IoOptions {
                path: io_path.into(),
                threads: io_threads,
                task_size: io_task_size,
                merge_gap: io_merge_gap,
                direct: io_direct,
            },
            device,
            decompress: decompress.into(),
            device_memory_limit,
            skip_compressed_page_checks,
            verify_page_checksums,
            overlap_groups,
            string_views,
            zstd_decoder: zstd_decoder.into(),
            snappy_decoder: snappy_decoder.map(Into::into),
        }
    }
}

/// [`DeviceDecoder`], serialized (absent in plans from before the option existed: gpq's).
#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum DecoderOption {
    #[default]
    Gpq,
    Nvcomp,
}

impl From<DeviceDecoder> for DecoderOption {
    fn from(d: DeviceDecoder) -> Self {
        match d {
            DeviceDecoder::Gpq => DecoderOption::Gpq,
            DeviceDecoder::Nvcomp => DecoderOption::Nvcomp,
        }
    }
}

impl From<DecoderOption> for DeviceDecoder {
    fn from(d: DecoderOption) -> Self {
        match d {
            DecoderOption::Gpq => DeviceDecoder::Gpq,
            DecoderOption::Nvcomp => DeviceDecoder::Nvcomp,
        }
    }
}

/// [`IoPath`], serialized.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum IoPathOption {
    Auto,
    Gds,
    CufileCompat,
    Bounce,
}

impl From<IoPath> for IoPathOption {
    fn from(p: IoPath) -> Self {
        match p {
            IoPath::Auto => IoPathOption::Auto,
            IoPath::Gds => IoPathOption::Gds,
            IoPath::CufileCompat => IoPathOption::CufileCompat,
            IoPath::Bounce => IoPathOption::Bounce,
        }
    }
}

impl From<IoPathOption> for IoPath {
    fn from(p: IoPathOption) -> Self {
        match p {
            IoPathOption::Auto => IoPath::Auto,
            IoPathOption::Gds => IoPath::Gds,
            IoPathOption::CufileCompat => IoPath::CufileCompat,
            IoPathOption::Bounce => IoPath::Bounce,
        }
    }
}

/// [`DecompressMode`], serialized.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DecompressOption {
    Auto,
    Nvcomp,
    Cpu,
}

impl From<DecompressMode> for DecompressOption {
    fn from(m: DecompressMode) -> Self {
        match m {
            DecompressMode::Auto => DecompressOption::Auto,
            DecompressMode::Nvcomp => DecompressOption::Nvcomp,
            DecompressMode::Cpu => DecompressOption::Cpu,
        }
    }
}

impl From<DecompressOption> for DecompressMode {
    fn from(m: DecompressOption) -> Self {
        match m {
            DecompressOption::Auto => DecompressMode::Auto,
            DecompressOption::Nvcomp => DecompressMode::Nvcomp,
            DecompressOption::Cpu => DecompressMode::Cpu,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::{collect_partitioned, displayable};
    use datafusion::prelude::{SessionContext, col, lit};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::file::open_files;
    use crate::filter::filter_columns;
    use crate::units::{plan_units, split_partitions};

    /// 400 rows in row groups of 100 and pages of 20: `k` ascending, `v` cycling through four words.
    fn write_file(path: &Path) {
        let k: Vec<i64> = (0..400).collect();
        let v: Vec<&str> = k.iter().map(|i| ["ant", "bee", "cat", "dog"][*i as usize % 4]).collect();
        let batch =
            RecordBatch::try_from_iter([("k", Arc::new(Int64Array::from(k)) as ArrayRef), ("v", Arc::new(StringArray::from(v)))])
                .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .set_data_page_row_count_limit(20)
            .set_write_batch_size(20)
            .build();
        let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    /// A CPU scan of column `k` of `path` that applies `filters` itself
    /// (on the host, as a GPU scan does where the device cannot), put
    /// together as the table's `scan` does for a GPU table.
    fn scan_applying(state: &SessionState, path: &Path, filters: Vec<Expr>) -> GpqScanExec {
        let (files, table_schema) = open_files(&[path.to_path_buf()], false).unwrap();
        let columns = vec![0];
        let own: Vec<&Expr> = filters.iter().collect();
        let mut read_columns = columns.clone();
        read_columns.extend(filter_columns(&own, &table_schema).into_iter().filter(|c| !columns.contains(c)));
        let read_schema = Arc::new(table_schema.project(&read_columns).unwrap());
        let filter = ScanFilter::new(state, &own, &read_schema).unwrap().map(Arc::new);
        let predicate = pushed_predicate(state, &table_schema, &filters).unwrap();
        let (units, pruning) = plan_units(&files, &table_schema, &read_columns, predicate.as_ref(), true, None);
        GpqScanExec::new(ScanParts {
            files: Arc::new(files),
            table_paths: vec![path.to_path_buf()],
            schema: Arc::new(table_schema.project(&columns).unwrap()),
            table_schema,
            columns,
            read_columns,
            read_schema,
            filter,
            own_filters: filters.clone(),
            pushed_filters: filters,
            partitions: split_partitions(units, 2, false),
            predicate,
            fetch: Some(25),
            options: GpqTableOptions::new().with_backend(Backend::Cpu),
            backend: ScanBackend::Cpu,
            backend_note: "cpu".into(),
            pruning,
        })
    }

    async fn partitions(scan: GpqScanExec, ctx: &SessionContext) -> Vec<String> {
        let parts = collect_partitioned(Arc::new(scan), ctx.task_ctx()).await.unwrap();
        parts.iter().map(|p| pretty_format_batches(p).unwrap().to_string()).collect()
    }

    #[tokio::test]
    async fn the_scans_own_filters_survive_the_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.parquet");
        write_file(&path);
        let ctx = SessionContext::new();
        let state = ctx.state();
        let filters = vec![col("k").gt_eq(lit(150i64)), col("v").in_list(vec![lit("bee"), lit("dog")], false)];
        let scan = scan_applying(&state, &path, filters.clone());
        let decoded = GpqScanExec::from_bytes(&scan.to_bytes().unwrap(), &ctx.task_ctx()).unwrap();

        let shown = displayable(&decoded).one_line().to_string();
        assert!(shown.contains("scan_filters[host]=[") && shown.contains("predicate="), "{shown}");
        assert_eq!(shown, displayable(&scan).one_line().to_string());
        assert_eq!(decoded.parts().own_filters, filters);
        assert_eq!(decoded.parts().read_columns, vec![0, 1]);
        let filter = decoded.parts().filter.as_ref().expect("a scan filter");
        assert_eq!(filter.device, scan.parts().filter.as_ref().unwrap().device);

        let (got, expected) = (partitions(decoded, &ctx).await, partitions(scan, &ctx).await);
        assert_eq!(got, expected);
        // Filtered by the scan: odd keys from 151, at most 25 rows per partition.
        let text = got.join("\n");
        assert!(text.contains("| 151 |") && !text.contains("| 150 |") && !text.contains("| 149 |"), "{text}");
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = Hex((0..=255).collect());
        let text = serde_json::to_string(&bytes).unwrap();
        assert_eq!(serde_json::from_str::<Hex>(&text).unwrap(), bytes);
        for bad in ["\"abc\"", "\"0g\"", "\"é0\"", "12"] {
            assert!(serde_json::from_str::<Hex>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn selections_become_skip_and_read_runs() {
        let selection = RowSelection::from(vec![
            RowSelector::skip(20),
            RowSelector::select(40),
            RowSelector::skip(20),
            RowSelector::select(10),
            RowSelector::skip(10),
        ]);
        let unit = ScanUnit { file: 0, row_group: 0, rg_rows: 100, selection: Some(selection), rows: 50, bytes: 7 };
        let spec = UnitSpec::of(&unit, 3);
        assert_eq!(spec.selection, Some(vec![(20, 40), (20, 10), (10, 0)]));
        assert_eq!(spec.file, 3);
    }
}
