//! A file read as a sequence of device tables.
//!
//! [`DeviceReaderBuilder`] plans the selection once (footer, projection, row
//! groups) and splits it into passes of whole row groups: at most
//! [`DeviceReaderBuilder::with_batch_rows`] rows each, and, with
//! [`DeviceReaderBuilder::with_device_memory_limit`], small enough that a
//! pass's working memory (its column chunks, decompressed pages and output
//! columns, as the footer's sizes put them) and the next pass's column chunks
//! (planned as a pass's own, the passes being alike) fit the limit together.
//! A row group larger than that alone is read in windows of its rows, each
//! reading only its own pages where the file has an offset index.
//! [`DeviceBatchReader`] yields one [`DeviceTable`] per pass. Several
//! passes are read and decoded at once, each on a thread and stream of its
//! own ([`DeviceReaderBuilder::with_decode_ahead`]), the batches returned in
//! order: a pass's latency (a large compressed page takes a GPU decompressor
//! milliseconds however little else runs) is hidden behind the others'.
//! Under a memory limit they share it, each planned for its part; where the
//! limit leaves room for one pass only, the GPU decodes one pass while a
//! thread reads the next pass's chunks into device memory on a second
//! stream.
//!
//! A row selection ([`DeviceReaderBuilder::with_row_selection`]) and a row
//! limit read only the row groups that hold wanted rows, and of those, in
//! flat columns, only the pages that do, where the file has an offset index
//! (loaded when a selection or a limit is set); each pass is one run of
//! selected rows, cut on the device without a copy (Arrow offsets). See
//! [`ReadPlan::with_row_window`].
//!
//! Several files ([`DeviceReaderBuilder::try_new_files`], a directory's
//! files say) are one sequence of passes: the first pass of the next file is
//! read while the last one of the current file decodes.
//!
//! The limit is enforced, not only planned for: every allocation of the
//! reader's streams is charged to one [`MemoryBudget`] shared by both, and
//! one over it fails with [`Error::OverBudget`] before the driver is asked
//! (not charged: the nvCOMP worker's exchange buffer, see
//! `decode::isolated`, and the worker's own memory). A
//! pass whose real needs exceed the footer's estimate is read again in two
//! halves (of its row groups, or of a single row group's rows; a single row
//! that does not fit is the error). A
//! table, once returned, is the caller's: its buffers no longer count
//! against the limit.
//!
//! Failures end the iteration with a typed error, after the cleanup
//! [`crate::read_parquet_to_device`] does (a lost context reset, the memory
//! pool trimmed). One is recovered from as there: when nvCOMP never finishes
//! on a pass (possible only with `skip_compressed_page_checks`), its context
//! is abandoned and the reader goes on, that pass included, with CPU
//! decompression.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection};
use parquet::basic::Type as PhysicalType;

use crate::arrow::DeviceTable;
use crate::cuda::{GpuContext, GpuStream, MemoryBudget};
use crate::error::{Error, Result};
use crate::io::{DeviceChunks, read_chunks};
use crate::options::{ColumnSelector, DecompressMode, ReadOptions};
use crate::plan::{ChunkPlan, Footer, ReadPlan, read_footer, row_group_rows};
use crate::stats::SetupStats;

/// Builds a [`DeviceBatchReader`] over one Parquet file, in the manner of
/// arrow-rs's `ParquetRecordBatchReaderBuilder`.
///
/// ```no_run
/// use gpq::DeviceReaderBuilder;
///
/// let reader = DeviceReaderBuilder::try_new("lineitem.parquet")?
///     .with_columns(["l_orderkey", "l_comment"])
///     .with_device_memory_limit(1 << 30)
///     .build()?;
/// for batch in reader {
///     let batch = batch?;
///     println!("{} rows on the GPU", batch.num_rows());
/// }
/// # Ok::<(), gpq::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct DeviceReaderBuilder {
    /// The files and their footers, in reading order (at least one).
    files: Vec<(PathBuf, Footer)>,
    options: ReadOptions,
    limit: Option<usize>,
    batch_rows: Option<usize>,
    pass_bytes: Option<u64>,
    memory_limit: Option<u64>,
    prefetch: bool,
    decode_ahead: Option<usize>,
    selection: Option<RowSelection>,
}

impl DeviceReaderBuilder {
    /// Reads the footer of `path` (once: every pass plans from it).
    pub fn try_new(path: impl AsRef<Path>) -> Result<DeviceReaderBuilder> {
        let footer = read_footer(path.as_ref())?;
        Ok(Self::new_with_footer(path, footer))
    }

    /// A builder over several files read as one sequence of batches (their
    /// selected columns must have one schema). The footers are read here, on
    /// several threads.
    pub fn try_new_files<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<DeviceReaderBuilder> {
        let paths: Vec<PathBuf> = paths.into_iter().map(|p| p.as_ref().to_path_buf()).collect();
        if paths.is_empty() {
            return Err(Error::InvalidOptions("no files to read".into()));
        }
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 16).min(paths.len());
        let per = paths.len().div_ceil(threads);
        let footers: Vec<Result<Footer>> = std::thread::scope(|s| {
            let handles: Vec<_> = paths.chunks(per).map(|part| s.spawn(move || part.iter().map(|p| read_footer(p)).collect::<Vec<_>>())).collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|_| vec![Err(Error::Internal("a footer thread panicked".into()))])).collect()
        });
        let files = paths.into_iter().zip(footers).map(|(p, f)| f.map(|f| (p, f))).collect::<Result<Vec<_>>>()?;
        Ok(Self::over(files))
    }

    /// A builder over a footer already loaded (see [`crate::read_footer`]).
    pub fn new_with_footer(path: impl AsRef<Path>, footer: Footer) -> DeviceReaderBuilder {
        Self::over(vec![(path.as_ref().to_path_buf(), footer)])
    }

    /// A builder over metadata arrow-rs has already loaded (with
    /// `ArrowReaderMetadata::load`, say, to prune row groups on its
    /// statistics first): its Parquet metadata, page index included where
    /// loaded, is planned from without reading the footer again; the file's
    /// size is taken now. The Arrow schema is gpq's own conversion of the
    /// file's, as [`crate::read_parquet_to_device`] returns it: a schema
    /// supplied through `ArrowReaderOptions::with_schema` is not applied.
    pub fn new_with_metadata(path: impl AsRef<Path>, metadata: &ArrowReaderMetadata) -> Result<DeviceReaderBuilder> {
        let path = path.as_ref();
        let file_size = std::fs::metadata(path).map_err(|source| Error::Open { file: path.to_path_buf(), source })?.len();
        Ok(Self::new_with_footer(path, Footer { file_size, metadata: Arc::clone(metadata.metadata()) }))
    }

    /// Default settings over `files` (at least one).
    fn over(files: Vec<(PathBuf, Footer)>) -> DeviceReaderBuilder {
        DeviceReaderBuilder {
            files,
            options: ReadOptions::default(),
            limit: None,
            batch_rows: None,
            pass_bytes: None,
            memory_limit: None,
            prefetch: true,
            decode_ahead: None,
            selection: None,
        }
    }

    /// The (first) file's footer.
    pub fn footer(&self) -> &Footer {
        &self.files[0].1
    }

    /// Read options for every pass: IO path, device, decompression, checks,
    /// and the column and row-group selection if set there. Replaces what
    /// earlier `with_columns` and `with_row_groups` calls chose; their
    /// `device_memory_limit` is replaced by [`Self::with_device_memory_limit`].
    pub fn with_options(mut self, options: ReadOptions) -> Self {
        self.memory_limit = options.device_memory_limit.or(self.memory_limit);
        self.options = ReadOptions { device_memory_limit: None, ..options };
        self
    }

    /// Reads only these columns (names, dotted leaf paths or indices), in this order.
    pub fn with_columns<I, C>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = C>,
        C: Into<ColumnSelector>,
    {
        self.options = self.options.with_columns(columns);
        self
    }

    /// Reads only the leaves `mask` includes (arrow-rs's projection), in file order.
    pub fn with_projection(mut self, mask: &ProjectionMask) -> Self {
        let schema = self.files[0].1.metadata.file_metadata().schema_descr();
        let leaves = (0..schema.num_columns()).filter(|&i| mask.leaf_included(i));
        let paths: Vec<ColumnSelector> = leaves.map(|i| ColumnSelector::Name(schema.column(i).path().string())).collect();
        self.options.columns = Some(paths);
        self
    }

    /// Reads only these row groups (file indices; read in file order). For
    /// one file only: a multi-file reader with row groups fails to build.
    pub fn with_row_groups(mut self, row_groups: impl IntoIterator<Item = usize>) -> Self {
        let mut list: Vec<usize> = row_groups.into_iter().collect();
        list.sort_unstable();
        self.options.row_groups = Some(list);
        self
    }

    /// Returns only the rows `selection` selects, counted over the selected
    /// row groups in file order (arrow-rs's `RowSelection`; rows past its end
    /// are not selected). Row groups without selected rows are not read; of
    /// the others, flat columns read only the pages that hold selected rows
    /// where the file has an offset index, and every column is cut to each
    /// run of selected rows on the device (without a copy), one batch or
    /// more per run. Over several files the rows are counted across them, in
    /// order, as if they were one file.
    pub fn with_row_selection(mut self, selection: RowSelection) -> Self {
        self.selection = Some(selection);
        self
    }

    /// Returns at most `rows` rows in all: the passes are cut to the limit
    /// when the reader is built (the last one reads only the pages it needs
    /// where the file has an offset index; passes past it are not read).
    pub fn with_limit(mut self, rows: usize) -> Self {
        self.limit = Some(rows);
        self
    }

    /// At most `rows` rows per batch. Batches are whole row groups: a row
    /// group of more rows is a batch of its own.
    pub fn with_batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = Some(rows.max(1));
        self
    }

    /// At most `bytes` of column chunks (the compressed bytes the pass
    /// reads) per batch, at least one row group: a bound on the size of a
    /// read that does not depend on the device (a query engine's unit of
    /// work, say). Combines with the row and memory bounds.
    pub fn with_pass_bytes(mut self, bytes: u64) -> Self {
        self.pass_bytes = Some(bytes.max(1));
        self
    }

    /// The most device memory the reader may hold at once: the passes being
    /// decoded (their chunks, decompressed pages, scratch and the columns
    /// being built, and the tables decoded ahead but not yet returned) and,
    /// one pass at a time, the next pass's chunks being read. Tables already
    /// returned are not counted. A row group that does not fit is read in
    /// windows of its rows (fitting where the file has an offset index and
    /// its columns are flat).
    pub fn with_device_memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Whether the next pass's chunks are read while the current pass
    /// decodes (default `true`); `false` also turns decode-ahead off.
    pub fn with_prefetch(mut self, prefetch: bool) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// How many passes a reader without a memory limit reads and decodes at
    /// once, each on a thread and stream of its own, the batches still
    /// returned in order (the GPU works on several passes together, which
    /// matters where passes are small: many small files, say). Default:
    /// as many as a quarter of the device's free memory holds by the
    /// footer's estimate of the largest pass, at most
    /// [`MAX_DECODE_AHEAD`]; asked for, at most four times that.
    ///
    /// Under a memory limit the passes at once share it: each is planned
    /// for its part of four fifths of the limit (a margin for the footer's
    /// estimates), so more at once means smaller passes. Default
    /// [`BOUNDED_DECODE_AHEAD`], fewer where the largest row group would not
    /// fit its part; 1 decodes one pass at a time, the next one's chunks
    /// read beside it. Should the passes still take more than the limit
    /// (an estimate short of the real need), the reader goes on with half
    /// as many at once.
    pub fn with_decode_ahead(mut self, passes: usize) -> Self {
        // Each pass in flight holds its IO threads and staging buffers.
        self.decode_ahead = Some(passes.clamp(1, 4 * MAX_DECODE_AHEAD));
        self
    }

    /// Plans the passes and makes the reader. Fails on anything the plan
    /// rejects (unknown columns or row groups, a corrupt footer, a column
    /// the GPU cannot decode) before any IO.
    pub fn build(mut self) -> Result<DeviceBatchReader> {
        let t0 = Instant::now();
        if self.files.len() > 1 && self.options.row_groups.is_some() {
            return Err(Error::InvalidOptions("row groups are numbered within one file; this reader has several".into()));
        }
        // A selection counts rows over the files in order: each file takes its share.
        let mut selection_left = self.selection.clone();
        let (ctx, setup) = super::device_setup(self.options.device)?;
        let mut passes = Vec::new();
        let mut runs: Vec<Vec<Pass>> = Vec::new();
        let mut schema: Option<SchemaRef> = None;
        let mut worker = false;
        for (fi, (path, footer)) in self.files.iter().enumerate() {
            let plan = ReadPlan::from_footer(path, footer.clone(), &self.options)?;
            super::can_decode(&plan)?;
            match &schema {
                None => schema = Some(plan.schema().clone()),
                Some(first) if !same_columns(first, plan.schema()) => {
                    return Err(Error::SchemaMismatch {
                        file: path.clone(),
                        expected: format!("{:?}", first.fields()),
                        found: format!("{:?}", plan.schema().fields()),
                    });
                }
                Some(_) => {}
            }
            worker |= crate::decode::needs_nvcomp_worker(&plan, &self.options);
            let per_rg = row_group_passes(&plan);
            let file_runs = match &mut selection_left {
                Some(left) => {
                    let rows: u64 = per_rg.iter().map(|p| p.rows).sum();
                    let mine = left.split_off(usize::try_from(rows).unwrap_or(usize::MAX));
                    select_rows(per_rg, &mine)
                }
                None => vec![per_rg],
            };
            runs.extend(file_runs.into_iter().map(|run| run.into_iter().map(|p| Pass { file: fi, ..p }).collect::<Vec<_>>()));
        }
        let schema = schema.ok_or_else(|| Error::Internal("a reader without files".into()))?;
        let bounded_depth = match self.memory_limit {
            Some(limit) if self.prefetch => {
                let largest = runs.iter().flatten().map(|p| p.working).max().unwrap_or(0);
                bounded_decode_ahead(limit, largest, self.decode_ahead.unwrap_or(BOUNDED_DECODE_AHEAD))
            }
            _ => 1,
        };
        // Passes decoded at once under a limit share it: each is planned
        // for its part (less a margin for the footer's estimate), and reads
        // its own chunks (no prefetch beside it).
        let (pass_limit, pass_prefetch) = match self.memory_limit {
            Some(limit) if bounded_depth > 1 => (Some(limit / 5 * 4 / bounded_depth as u64), false),
            limit => (limit, self.prefetch),
        };
        for run in runs {
            passes.extend(group_passes(run, self.batch_rows, self.pass_bytes, pass_limit, pass_prefetch));
        }
        // The limit cuts the passes, so that the last one reads only the pages it needs.
        if let Some(limit) = self.limit {
            let mut left = limit as u64;
            passes.retain_mut(|p| {
                let wanted = left > 0;
                p.keep = p.keep.min(left);
                left -= p.keep;
                wanted
            });
        }
        // A pass cut inside its row groups may leave pages unread: the offset
        // index of its file says which (loaded here, for those files only).
        let mut cut_files: Vec<usize> = passes.iter().filter(|p| p.skip > 0 || p.keep < p.rows).map(|p| p.file).collect();
        cut_files.dedup();
        for fi in cut_files {
            let (path, footer) = &mut self.files[fi];
            *footer = footer.clone().with_page_index(path)?;
        }
        if worker {
            crate::decode::isolated::prestart(&ctx);
        }
        // Errors name the file; a reader of several names the first one's folder.
        let named = match self.files.as_slice() {
            [(p, _)] => p.clone(),
            [(p, _), ..] => p.parent().map(Path::to_path_buf).unwrap_or_else(|| p.clone()),
            [] => PathBuf::new(),
        };
        let budget = self.memory_limit.map(|limit| MemoryBudget::new(&named, limit));
        let streams = [ctx.new_stream_with_budget(budget.clone())?, ctx.new_stream_with_budget(budget.clone())?];
        let depth = if !self.prefetch || passes.len() < 2 {
            1
        } else if self.memory_limit.is_some() {
            bounded_depth.min(passes.len())
        } else {
            match self.decode_ahead {
                Some(n) => n,
                None => {
                    let largest = passes.iter().map(|p| p.working).max().unwrap_or(0).max(1);
                    let free = ctx.memory_info().map_or(0, |(free, _)| free);
                    usize::try_from(free / 4 / largest).unwrap_or(usize::MAX).clamp(1, MAX_DECODE_AHEAD)
                }
            }
            .min(passes.len())
        };
        // A single pass goes the same way: read as one read would be (its
        // groups overlapped, see `ReadOptions::overlap_groups`).
        let ahead = self.prefetch && (depth > 1 || (passes.len() == 1 && self.memory_limit.is_none()));
        let ahead_streams =
            if ahead { (0..depth).map(|_| ctx.new_stream_with_budget(budget.clone())).collect::<Result<Vec<_>>>()? } else { Vec::new() };
        Ok(DeviceBatchReader {
            files: self.files,
            options: self.options,
            schema,
            passes,
            next: 0,
            prefetch: self.prefetch,
            prefetched: None,
            ahead: std::collections::VecDeque::new(),
            ahead_streams,
            ctx,
            streams,
            budget,
            planned: t0.elapsed().saturating_sub(setup.context + setup.kernels),
            setup: Some(setup),
            done: false,
            hung: None,
        })
    }
}

/// Whether two selections have the same columns: names, types and
/// nullability (field metadata, such as writers' field ids, may differ).
fn same_columns(a: &SchemaRef, b: &SchemaRef) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields()).all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type() && x.is_nullable() == y.is_nullable())
}

/// Bytes of device memory a chunk's pass needs, from the footer: the chunk,
/// its decompressed pages, and its output column (values at the type's
/// width, 16 bytes a value for byte arrays plus their bytes, validity).
/// `value_bytes`: the byte arrays' total length where the footer says it
/// (Parquet's size statistics; a dictionary's values repeat in the output,
/// so the pages alone understate it).
fn chunk_estimate(c: &ChunkPlan, value_bytes: Option<u64>) -> u64 {
    let n = c.num_values;
    let width = match c.physical_type {
        PhysicalType::BOOLEAN => 1,
        PhysicalType::INT32 | PhysicalType::FLOAT => 4,
        PhysicalType::INT64 | PhysicalType::DOUBLE => 8,
        PhysicalType::INT96 => 16,
        PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY => 16,
    };
    let strings = matches!(c.physical_type, PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY);
    let chars = if strings { c.uncompressed_size.max(value_bytes.unwrap_or(0)) } else { 0 };
    let output = n.saturating_mul(width).saturating_add(n.div_ceil(8)).saturating_add(chars);
    c.len.saturating_add(c.uncompressed_size).saturating_add(output)
}

/// One pass: row groups (file indices, in order), their rows, the footer's
/// estimate of the pass's working memory and of its chunks alone.
#[derive(Debug, Clone)]
struct Pass {
    /// Index into the reader's files.
    file: usize,
    row_groups: Vec<usize>,
    /// Rows the row groups hold (what is decoded).
    rows: u64,
    working: u64,
    chunks: u64,
    /// Of the decoded rows, those before the selected ones, and how many are selected.
    skip: u64,
    keep: u64,
}


/// One entry per row group of the plan that holds rows: its rows and the
/// footer's estimates, every row kept.
fn row_group_passes(plan: &ReadPlan) -> Vec<Pass> {
    // Rows from the footer, so that a selection of no columns still counts them.
    let rg_meta = plan.metadata().row_groups();
    let mut per_rg: Vec<Pass> = plan
        .row_groups()
        .iter()
        .map(|&rg| {
            let rows = row_group_rows(plan.metadata(), rg);
            Pass { file: 0, row_groups: vec![rg], rows, working: 0, chunks: 0, skip: 0, keep: rows }
        })
        .collect();
    let index: std::collections::HashMap<usize, usize> = plan.row_groups().iter().enumerate().map(|(i, &rg)| (rg, i)).collect();
    for c in plan.chunks() {
        if let Some(p) = index.get(&c.row_group).map(|&i| &mut per_rg[i]) {
            let value_bytes = rg_meta
                .get(c.row_group)
                .and_then(|m| m.columns().get(plan.leaf_of(c).leaf_index))
                .and_then(|cc| cc.unencoded_byte_array_data_bytes())
                .and_then(|b| u64::try_from(b).ok());
            p.working = p.working.saturating_add(chunk_estimate(c, value_bytes));
            p.chunks = p.chunks.saturating_add(c.len);
        }
    }
    per_rg.retain(|p| p.rows > 0);
    per_rg
}

/// The row groups' entries cut to a selection: for each run of selected
/// rows (counted over the plan's row groups in order), the row groups it
/// touches, each with the rows it skips and keeps. A row group that two runs
/// touch appears twice (it is read once for each).
fn select_rows(per_rg: Vec<Pass>, selection: &RowSelection) -> Vec<Vec<Pass>> {
    let total: u64 = per_rg.iter().map(|p| p.rows).sum();
    let mut runs = Vec::new();
    // `first`: the first row group not wholly before the run, starting at row `first_start`.
    let (mut at, mut first, mut first_start) = (0u64, 0usize, 0u64);
    for sel in selection.iter() {
        let (a, b) = (at, at.saturating_add(sel.row_count as u64).min(total));
        at = b;
        if sel.skip || a >= b {
            continue;
        }
        // (a < total, so a row group holds row a; every one holds rows.)
        while first_start + per_rg[first].rows <= a {
            first_start += per_rg[first].rows;
            first += 1;
        }
        let mut run = Vec::new();
        let mut start = first_start;
        for p in &per_rg[first..] {
            if start >= b {
                break;
            }
            let skip = a.saturating_sub(start);
            let keep = b.min(start + p.rows) - start - skip;
            run.push(Pass { skip, keep, ..p.clone() });
            start += p.rows;
        }
        runs.push(run);
    }
    runs
}

/// Groups consecutive entries of one run into passes (see the module doc):
/// at most `batch_rows` kept rows and `pass_bytes` of chunks; with a memory
/// limit and prefetch, a pass's working memory and its own chunks (standing
/// for the next pass's, read beside it) within the limit.
fn group_passes(run: Vec<Pass>, batch_rows: Option<usize>, pass_bytes: Option<u64>, memory_limit: Option<u64>, prefetch: bool) -> Vec<Pass> {
    let need = |working: u64, chunks: u64| if prefetch { working.saturating_add(chunks) } else { working };
    let mut passes: Vec<Pass> = Vec::new();
    let run = run.into_iter().flat_map(|rg| {
        let parts = memory_limit.map_or(1, |limit| need(rg.working, rg.chunks).div_ceil(limit.max(1)));
        split_rows(rg, parts)
    });
    for rg in run {
        let fits = passes.last().is_some_and(|p| {
            let rows_ok = batch_rows.is_none_or(|b| p.keep + rg.keep <= b as u64);
            let bytes_ok = pass_bytes.is_none_or(|b| p.chunks.saturating_add(rg.chunks) <= b);
            let mem_ok = memory_limit.is_none_or(|l| need(p.working.saturating_add(rg.working), p.chunks.saturating_add(rg.chunks)) <= l);
            rows_ok && bytes_ok && mem_ok
        });
        match passes.last_mut() {
            Some(p) if fits => {
                p.row_groups.extend(rg.row_groups);
                p.rows += rg.rows;
                p.keep += rg.keep;
                p.working = p.working.saturating_add(rg.working);
                p.chunks = p.chunks.saturating_add(rg.chunks);
            }
            _ => passes.push(rg),
        }
    }
    passes
}

/// `rg` (one row group's entry) as up to `parts` entries of consecutive
/// kept rows, its estimates shared out by rows: a row group larger than a
/// pass may hold is read in row windows, each reading only its own pages
/// where the file has an offset index (see [`ReadPlan::with_row_window`]).
/// Without one, or in nested columns, a window decodes the whole row group,
/// so the budget still finds it too large and [`DeviceBatchReader`] halves
/// it again, down to a single row (then the error).
fn split_rows(rg: Pass, parts: u64) -> Vec<Pass> {
    let parts = parts.min(rg.keep);
    if parts <= 1 || rg.row_groups.len() != 1 {
        return vec![rg];
    }
    let share = |v: u64, rows: u64| u64::try_from((v as u128 * rows as u128).div_ceil(rg.keep.max(1) as u128)).unwrap_or(u64::MAX);
    let per = rg.keep.div_ceil(parts);
    let mut out = Vec::new();
    let mut done = 0;
    while done < rg.keep {
        let keep = per.min(rg.keep - done);
        out.push(Pass { skip: rg.skip + done, keep, working: share(rg.working, keep), chunks: share(rg.chunks, keep), ..rg.clone() });
        done += keep;
    }
    out
}

/// The most passes a reader decodes at once by default
/// ([`DeviceReaderBuilder::with_decode_ahead`]).
pub const MAX_DECODE_AHEAD: usize = 16;

/// How many passes a reader with a memory limit decodes at once by default
/// (they share the limit: see [`DeviceReaderBuilder::with_decode_ahead`]).
pub const BOUNDED_DECODE_AHEAD: usize = 4;

/// Passes at once under a memory limit of `limit` bytes, `wanted` asked
/// for: as many as leave each pass, planned for its share of the limit less
/// a fifth, room for `largest_row_group` (a pass holds one row group at
/// least); 1 where two would not.
fn bounded_decode_ahead(limit: u64, largest_row_group: u64, wanted: usize) -> usize {
    let fits = limit / 5 * 4 / largest_row_group.max(1);
    usize::try_from(fits).unwrap_or(usize::MAX).min(wanted).max(1)
}

/// A pass being read and decoded on a thread of its own.
struct Ahead {
    pass: usize,
    handle: JoinHandle<Result<DeviceTable>>,
}

/// The next pass's chunks, being read on a thread.
struct Prefetch {
    pass: usize,
    handle: JoinHandle<Result<DeviceChunks>>,
    started: Instant,
}

/// The batches of one file, one [`DeviceTable`] per pass (see
/// [`DeviceReaderBuilder`]). An iterator of `Result<DeviceTable>`; after an
/// error it ends.
pub struct DeviceBatchReader {
    files: Vec<(PathBuf, Footer)>,
    options: ReadOptions,
    schema: SchemaRef,
    passes: Vec<Pass>,
    next: usize,
    prefetch: bool,
    prefetched: Option<Prefetch>,
    /// Passes read and decoded ahead, in order (readers without a memory
    /// limit); empty when `ahead_streams` is.
    ahead: std::collections::VecDeque<Ahead>,
    /// One stream per pass decoded at once, if more than one is.
    ahead_streams: Vec<Arc<GpuStream>>,
    ctx: Arc<GpuContext>,
    streams: [Arc<GpuStream>; 2],
    budget: Option<Arc<MemoryBudget>>,
    planned: std::time::Duration,
    /// Device set-up done while building, reported with the first batch.
    setup: Option<SetupStats>,
    done: bool,
    /// The pass nvCOMP hung on, if it did (the reader went on decompressing on the CPU).
    hung: Option<usize>,
}

impl std::fmt::Debug for DeviceBatchReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatchReader")
            .field("files", &self.files.len())
            .field("passes", &self.passes.len())
            .field("next", &self.next)
            .field("decode_ahead", &self.ahead_streams.len().max(1))
            .finish()
    }
}

impl DeviceBatchReader {
    /// The schema of every batch.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Hands the reader over as an Arrow C device stream
    /// ([`crate::arrow::c_device`]): each `get_next` reads the next batch and
    /// exports it, a failed read is the stream's error.
    pub fn into_device_stream(self) -> crate::arrow::FFI_ArrowDeviceArrayStream {
        let device_type = if self.ctx.is_emulated() { crate::arrow::ARROW_DEVICE_CPU } else { crate::arrow::ARROW_DEVICE_CUDA };
        crate::arrow::device_stream(self.schema.clone(), device_type, self.map(|batch| batch.map(Arc::new)))
    }

    /// How many passes (batches) the selection is read in, as planned now
    /// (a pass over the limit is split when it is read).
    pub fn num_passes(&self) -> usize {
        self.passes.len()
    }

    /// The row groups of each pass, as planned now.
    pub fn pass_row_groups(&self) -> Vec<Vec<usize>> {
        self.passes.iter().map(|p| p.row_groups.clone()).collect()
    }

    /// How many passes are read and decoded at once (1: one at a time, the
    /// next one's chunks read beside it); see
    /// [`DeviceReaderBuilder::with_decode_ahead`].
    pub fn decode_ahead(&self) -> usize {
        self.ahead_streams.len().max(1)
    }

    /// The file of each pass (an index into the files given), as planned now.
    pub fn pass_files(&self) -> Vec<usize> {
        self.passes.iter().map(|p| p.file).collect()
    }

    /// The most device memory the reader held at once so far (charged to its
    /// budget), if it has a limit.
    pub fn peak_device_memory(&self) -> Option<u64> {
        self.budget.as_ref().map(|b| b.peak())
    }

    /// Plans pass `k` for reading (from the loaded footer): its row groups,
    /// cut to its selected rows (only the pages holding them, where the
    /// footer has an offset index).
    fn plan_of(&self, k: usize) -> Result<ReadPlan> {
        let pass = &self.passes[k];
        let options = ReadOptions { row_groups: Some(pass.row_groups.clone()), ..self.options.clone() };
        let (path, footer) = &self.files[pass.file];
        ReadPlan::from_footer(path, footer.clone(), &options)?.with_row_window(pass.skip, pass.keep, &self.options.io)
    }

    /// Starts reading pass `k`'s chunks on a thread, on the stream of its parity.
    fn start_prefetch(&mut self, k: usize) {
        let Ok(plan) = self.plan_of(k) else { return };
        let stream = self.streams[k % 2].clone();
        let io = self.options.io.clone();
        let started = Instant::now();
        let spawned = std::thread::Builder::new()
            .name("gpq-prefetch".into())
            .spawn(move || read_chunks(plan, std::time::Duration::ZERO, &stream, &io));
        if let Ok(handle) = spawned {
            self.prefetched = Some(Prefetch { pass: k, handle, started });
        }
    }

    /// Keeps the passes from `self.next` on in flight, as many as there are
    /// ahead streams, each read and decoded on a thread of its own.
    fn fill_ahead(&mut self) {
        while self.ahead.len() < self.ahead_streams.len() && self.next + self.ahead.len() < self.passes.len() {
            let k = self.next + self.ahead.len();
            let plan = self.plan_of(k);
            let stream = self.ahead_streams[k % self.ahead_streams.len()].clone();
            let (ctx, options) = (self.ctx.clone(), self.options.clone());
            let work = move || -> Result<DeviceTable> {
                let t0 = Instant::now();
                ctx.bind()?;
                super::read_on(plan?, std::time::Duration::ZERO, t0, &stream, &options).map_err(|e| super::after_failure(&ctx, &stream, e))
            };
            match std::thread::Builder::new().name("gpq-pass".into()).spawn(work) {
                Ok(handle) => self.ahead.push_back(Ahead { pass: k, handle }),
                // No thread: the rest one at a time.
                Err(_) => break,
            }
        }
    }

    /// Waits for every pass in flight and drops what they made; returns
    /// whether one of them made nvCOMP hang.
    fn cancel_ahead(&mut self) -> bool {
        let mut hung = false;
        for a in self.ahead.drain(..) {
            if let Ok(Err(e)) = a.handle.join() {
                hung |= super::nvcomp_hung(&e, &self.options);
            }
        }
        hung
    }

    /// The next batch of a reader decoding passes ahead.
    fn next_ahead(&mut self) -> Option<Result<DeviceTable>> {
        loop {
            if self.done || self.next >= self.passes.len() {
                self.cancel_ahead();
                return None;
            }
            self.fill_ahead();
            let k = self.next;
            let made = match self.ahead.pop_front() {
                Some(a) if a.pass == k => a.handle.join().unwrap_or_else(|p| Err(Error::worker_panicked("a pass", p))),
                other => {
                    // (A thread that could not start, or out of order: this pass alone.)
                    if let Some(a) = other {
                        self.ahead.push_front(a);
                    }
                    self.cancel_ahead();
                    let t0 = Instant::now();
                    let stream = self.streams[k % 2].clone();
                    self.plan_of(k)
                        .and_then(|plan| read_chunks(plan, std::time::Duration::ZERO, &stream, &self.options.io))
                        .and_then(|chunks| super::decode_chunks(&chunks, t0, &self.options))
                        .map_err(|e| super::after_failure(&self.ctx, &stream, e))
                }
            };
            match made {
                Ok(mut table) => {
                    // (The caller's now: no longer counted against the limit.)
                    table.detach_budget();
                    if k == 0 {
                        table.add_plan_time(self.planned);
                    }
                    if let Some(setup) = self.setup.take() {
                        table.add_setup(setup);
                    }
                    self.next += 1;
                    self.fill_ahead();
                    return Some(Ok(table));
                }
                Err(Error::OverBudget { .. }) if self.budget.is_some() => {
                    // The passes at once took more than the footer's
                    // estimates: fewer of them (passes planned for more
                    // company fit more easily), and this one again. One at a
                    // time, the reader splits what still does not fit.
                    self.cancel_ahead();
                    let fewer = self.ahead_streams.len() / 2;
                    tracing::info!(pass = k, at_once = fewer.max(1), "passes decoded at once exceed the memory limit; fewer at once");
                    if fewer > 1 {
                        self.ahead_streams.truncate(fewer);
                    } else {
                        self.ahead_streams.clear();
                        return self.next_batch();
                    }
                }
                Err(e) => {
                    // nvCOMP never finished on this pass, or on one after it
                    // (whose lost context failed this one).
                    let later_hung = self.cancel_ahead();
                    let hung = super::nvcomp_hung(&e, &self.options) || later_hung;
                    match self.recover_or_end(k, e, hung) {
                        None => continue,
                        end => return end,
                    }
                }
            }
        }
    }

    /// Waits for a prefetch, if any, and drops what it read.
    fn cancel_prefetch(&mut self) {
        if let Some(p) = self.prefetched.take() {
            let _ = p.handle.join();
        }
    }

    /// Pass `k`'s chunks: the prefetched ones if they are there and were read
    /// without error, else read now. Returns them with when their read began.
    fn chunks_of(&mut self, k: usize) -> Result<(DeviceChunks, Instant)> {
        if self.prefetched.as_ref().is_some_and(|p| p.pass != k) {
            self.cancel_prefetch();
        }
        if let Some(p) = self.prefetched.take()
            && let Ok(Ok(chunks)) = p.handle.join()
        {
            return Ok((chunks, p.started));
        }
        // (An error of the prefetch, an over-budget one say, is met again here, alone.)
        let t0 = Instant::now();
        let plan = self.plan_of(k)?;
        let chunks = read_chunks(plan, t0.elapsed(), &self.streams[k % 2], &self.options.io)?;
        Ok((chunks, t0))
    }

    /// Splits pass `k` in two: at its middle row group, or a pass of one
    /// row group at its middle kept row; false if it keeps one row.
    fn split(&mut self, k: usize) -> bool {
        let p = &self.passes[k];
        if p.row_groups.len() < 2 {
            let halves = split_rows(p.clone(), 2);
            let more = halves.len() == 2;
            if more {
                self.passes.splice(k..=k, halves);
            }
            return more;
        }
        let half = p.row_groups.len() / 2;
        let metadata = &self.files[p.file].1.metadata;
        let rows_of = |rgs: &[usize]| -> u64 { rgs.iter().map(|&rg| row_group_rows(metadata, rg)).sum() };
        let (a, b) = p.row_groups.split_at(half);
        let (rows_a, rows_b) = (rows_of(a), rows_of(b));
        // The selected rows are one run: those in the first half, then the rest.
        let keep_a = p.keep.min(rows_a.saturating_sub(p.skip));
        let first = Pass {
            file: p.file,
            row_groups: a.to_vec(),
            rows: rows_a,
            working: p.working / 2,
            chunks: p.chunks / 2,
            skip: p.skip.min(rows_a),
            keep: keep_a,
        };
        let second = Pass {
            file: p.file,
            row_groups: b.to_vec(),
            rows: rows_b,
            working: p.working - p.working / 2,
            chunks: p.chunks - p.chunks / 2,
            skip: p.skip.saturating_sub(rows_a),
            keep: p.keep - keep_a,
        };
        let parts: Vec<Pass> = [first, second].into_iter().filter(|q| q.keep > 0).collect();
        self.passes.splice(k..=k, parts);
        true
    }

    fn next_batch(&mut self) -> Option<Result<DeviceTable>> {
        if !self.ahead_streams.is_empty() {
            return self.next_ahead();
        }
        loop {
            if self.done || self.next >= self.passes.len() {
                self.cancel_prefetch();
                return None;
            }
            let k = self.next;
            let (chunks, started) = match self.chunks_of(k) {
                Ok(c) => c,
                Err(e) => {
                    // Chunks over the limit: the pass in halves, if it has two.
                    if matches!(e, Error::OverBudget { .. }) && self.split(k) {
                        continue;
                    }
                    return self.fail(k, e);
                }
            };
            // The next pass's chunks are read while this one decodes (passes
            // past a row limit were cut when the reader was built).
            if self.prefetch && k + 1 < self.passes.len() {
                self.start_prefetch(k + 1);
            }
            let mut decoded = super::decode_chunks(&chunks, started, &self.options);
            if matches!(decoded, Err(Error::OverBudget { .. })) && self.prefetched.is_some() {
                // What the next pass is reading counts against the limit too:
                // without it, this pass again from the chunks it has.
                self.cancel_prefetch();
                decoded = super::decode_chunks(&chunks, started, &self.options);
                if decoded.is_ok() {
                    // The footer's estimate fell short: later passes, planned
                    // the same way, would each be decoded twice (the cost of a
                    // decode, against the IO that prefetch hides).
                    tracing::info!(pass = k, "a pass and the next one's chunks exceed the memory limit; reading on without prefetch");
                    self.prefetch = false;
                }
            }
            drop(chunks);
            match decoded {
                Ok(mut table) => {
                    // (Its plan cut the pass to its selected rows and the limit.)
                    table.detach_budget();
                    if k == 0 {
                        table.add_plan_time(self.planned);
                    }
                    if let Some(setup) = self.setup.take() {
                        table.add_setup(setup);
                    }
                    self.next += 1;
                    return Some(Ok(table));
                }
                Err(e @ Error::OverBudget { .. }) => {
                    self.cancel_prefetch();
                    if self.split(k) {
                        continue;
                    }
                    return self.fail(k, e);
                }
                Err(e) => {
                    self.cancel_prefetch();
                    let e = super::after_failure(&self.ctx, &self.streams[k % 2], e);
                    let hung = super::nvcomp_hung(&e, &self.options);
                    match self.recover_or_end(k, e, hung) {
                        None => continue,
                        end => return end,
                    }
                }
            }
        }
    }

    /// After pass `k` failed with `e` (cleaned up): where nvCOMP hung
    /// (`hung`), its context was abandoned for a fresh one and the rest is
    /// read with CPU decompression, whose verdict on the pass stands: `None`,
    /// read pass `k` again. Otherwise the end of the batches, with `e`.
    fn recover_or_end(&mut self, k: usize, e: Error, hung: bool) -> Option<Result<DeviceTable>> {
        if hung {
            tracing::warn!(file = %self.files[self.passes[k].file].0.display(), error = %e, "nvCOMP hung; reading on with CPU decompression");
            if let Err(again) = self.renew_context() {
                self.done = true;
                return Some(Err(again));
            }
            self.options.decompress = DecompressMode::Cpu;
            self.hung = Some(k);
            return None;
        }
        self.done = true;
        Some(Err(if self.hung == Some(k) { super::after_nvcomp_hang(e) } else { e }))
    }

    /// Ends the iteration with `e`, after the read's cleanup on pass `k`'s stream.
    fn fail(&mut self, k: usize, e: Error) -> Option<Result<DeviceTable>> {
        self.done = true;
        Some(Err(super::after_failure(&self.ctx, &self.streams[k % 2], e)))
    }

    /// A fresh context and streams after the old context was abandoned.
    fn renew_context(&mut self) -> Result<()> {
        let ctx = GpuContext::get(self.options.device)?;
        self.streams = [ctx.new_stream_with_budget(self.budget.clone())?, ctx.new_stream_with_budget(self.budget.clone())?];
        for s in &mut self.ahead_streams {
            *s = ctx.new_stream_with_budget(self.budget.clone())?;
        }
        self.ctx = ctx;
        Ok(())
    }
}

impl Iterator for DeviceBatchReader {
    type Item = Result<DeviceTable>;

    fn next(&mut self) -> Option<Result<DeviceTable>> {
        self.next_batch()
    }
}

impl Drop for DeviceBatchReader {
    fn drop(&mut self) {
        self.cancel_ahead();
        self.cancel_prefetch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::RowSelector;

    fn rgs(rows: &[u64]) -> Vec<Pass> {
        rows.iter()
            .enumerate()
            .map(|(i, &r)| Pass { file: 0, row_groups: vec![i], rows: r, working: 10 * r, chunks: r, skip: 0, keep: r })
            .collect()
    }

    fn selection(parts: &[(bool, usize)]) -> RowSelection {
        parts.iter().map(|&(skip, n)| if skip { RowSelector::skip(n) } else { RowSelector::select(n) }).collect::<Vec<_>>().into()
    }

    /// (row groups, skip, keep) of each pass.
    fn shape(passes: &[Pass]) -> Vec<(Vec<usize>, u64, u64)> {
        passes.iter().map(|p| (p.row_groups.clone(), p.skip, p.keep)).collect()
    }

    #[test]
    fn selections_become_runs_of_row_groups() {
        let runs = select_rows(rgs(&[100, 100, 50]), &selection(&[(true, 90), (false, 20), (true, 30), (false, 5), (true, 1000)]));
        assert_eq!(runs.len(), 2);
        assert_eq!(shape(&runs[0]), vec![(vec![0], 90, 10), (vec![1], 0, 10)]);
        assert_eq!(shape(&runs[1]), vec![(vec![1], 40, 5)]);
        // Past the end: cut at the rows there are; nothing selected: no runs.
        let runs = select_rows(rgs(&[100, 50]), &selection(&[(true, 120), (false, 1000)]));
        assert_eq!(shape(&runs[0]), vec![(vec![1], 20, 30)]);
        assert!(select_rows(rgs(&[100]), &selection(&[(true, 100), (false, 0)])).is_empty());
        assert!(select_rows(rgs(&[100]), &selection(&[])).is_empty());
    }

    #[test]
    fn passes_at_once_under_a_limit_leave_each_room_for_a_row_group() {
        // Four fifths of 1,000 is 800: four row groups of 200, two of 400, one of 401.
        assert_eq!(bounded_decode_ahead(1000, 200, 8), 4);
        assert_eq!(bounded_decode_ahead(1000, 200, 3), 3);
        assert_eq!(bounded_decode_ahead(1000, 400, 8), 2);
        assert_eq!(bounded_decode_ahead(1000, 401, 8), 1);
        assert_eq!(bounded_decode_ahead(1000, 5000, 8), 1);
        assert_eq!(bounded_decode_ahead(u64::MAX, 0, 4), 4);
    }

    #[test]
    fn runs_group_by_kept_rows_bytes_and_memory() {
        let run = select_rows(rgs(&[100, 100, 100, 100]), &selection(&[(true, 50), (false, 300)])).remove(0);
        // Kept rows per row group: 50, 100, 100, 50.
        assert_eq!(shape(&group_passes(run.clone(), None, None, None, true)), vec![(vec![0, 1, 2, 3], 50, 300)]);
        assert_eq!(shape(&group_passes(run.clone(), Some(150), None, None, true)), vec![(vec![0, 1], 50, 150), (vec![2, 3], 0, 150)]);
        // Chunks of 100 bytes a row group: 250 bytes a pass holds two; 50, one (at least one).
        assert_eq!(shape(&group_passes(run.clone(), None, Some(250), None, true)), vec![(vec![0, 1], 50, 150), (vec![2, 3], 0, 150)]);
        assert_eq!(group_passes(run.clone(), None, Some(50), None, true).len(), 4);
        // Working 1000 and chunks 100 a row group: a limit of 2,200 holds two with their chunks.
        assert_eq!(shape(&group_passes(run.clone(), None, None, Some(2200), true)), vec![(vec![0, 1], 50, 150), (vec![2, 3], 0, 150)]);
        // 2,000: two row groups fit without the prefetch's share, one with it.
        assert_eq!(shape(&group_passes(run.clone(), None, None, Some(2000), false)), vec![(vec![0, 1], 50, 150), (vec![2, 3], 0, 150)]);
        assert_eq!(group_passes(run, None, None, Some(2000), true).len(), 4);
    }
}
