//! CPU read planning.
//!
//! A [`ReadPlan`] is everything gpq decides before touching the GPU: the
//! footer, the projected columns and their Arrow schema, the selected row
//! groups, one [`ChunkPlan`] per (row group, leaf column) saying where the
//! chunk's bytes are in the file and where they will land in the device
//! buffer, and the [`IoLayout`] of aligned ranges and tasks that the IO layer
//! executes.
//!
//! Every value taken from the footer is checked before it is used (offsets
//! and sizes non-negative, chunks inside the file, counts summed without
//! overflow), and a failed check is an [`crate::Error`] naming the
//! file, row group and column: the footer is untrusted input.

pub(crate) mod cache;
pub mod columns;
pub mod footer;
pub(crate) mod nesting;
pub mod ranges;
mod split;
mod window;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};

pub(crate) use columns::arrow_schema_of;
pub use columns::{LeafColumn, PlannedColumn, with_view_types};
use footer::metadata_error;
pub use cache::{cached_footers, clear_footer_cache};
pub use footer::{Footer, read_footer, read_footer_with_page_index};
pub use ranges::{IoLayout, IoRange, IoTask};

use crate::error::{Error, Result};
use crate::options::ReadOptions;

/// Where one column chunk's bytes are, and what they hold.
#[derive(Debug, Clone)]
pub struct ChunkPlan {
    /// Row group index in the file.
    pub row_group: usize,
    /// Index into [`ReadPlan::columns`].
    pub column: usize,
    /// Index into that column's leaves.
    pub leaf: usize,
    /// File offset of the chunk's first page (the dictionary page, if any).
    pub file_offset: u64,
    /// Chunk length in bytes (all pages, headers included).
    pub len: u64,
    /// Offset of the chunk's first byte in the device buffer.
    pub device_offset: u64,
    /// Compression codec of the chunk's pages.
    pub codec: Compression,
    /// Physical type of the values.
    pub physical_type: PhysicalType,
    /// Values (levels included: nulls count) the chunk's pages to read
    /// hold, per its metadata (all of the chunk's, unless a row window
    /// skips pages: then per the offset index).
    pub num_values: u64,
    /// Rows the chunk's pages to read hold: the row group's, unless a row
    /// window skips pages.
    pub num_rows: u64,
    /// The row group's row where those rows start (0 unless pages are skipped).
    pub first_row: u64,
    /// Where reading resumes after skipped pages: then `file_offset` and
    /// `len` are the bytes in front of the first data page (the dictionary
    /// page; maybe none) and these the pages read after the skipped ones.
    pub resume: Option<ChunkResume>,
    /// Whether the metadata says the chunk starts with a dictionary page.
    pub has_dictionary_page: bool,
    /// Total uncompressed size of the chunk per the metadata.
    pub uncompressed_size: u64,
}

/// Where a chunk's read resumes after pages a row window skips
/// ([`ReadPlan::with_row_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkResume {
    /// File offset of the first page read after the skipped ones.
    pub file_offset: u64,
    /// Bytes read from there (whole pages, headers included).
    pub len: u64,
    /// Where they land in the device buffer.
    pub device_offset: u64,
    /// Data pages skipped.
    pub skipped_pages: u32,
}

/// The whole plan for reading one file.
///
/// A plan is made by [`ReadPlan::new`] or [`ReadPlan::from_footer`] and read
/// through its accessors; the IO layer writes exactly where it says, so it
/// cannot be edited.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub(crate) path: PathBuf,
    pub(crate) file_size: u64,
    pub(crate) metadata: Arc<ParquetMetaData>,
    pub(crate) schema: SchemaRef,
    pub(crate) columns: Vec<PlannedColumn>,
    pub(crate) row_groups: Vec<usize>,
    pub(crate) num_rows: u64,
    /// Rows of the selected row groups (what a column read whole decodes).
    pub(crate) group_rows: u64,
    /// Per result column: rows its decoded pages hold before the result's
    /// first (0 unless a row window cuts the plan).
    pub(crate) lead_rows: Vec<u64>,
    pub(crate) chunks: Vec<ChunkPlan>,
    pub(crate) io: IoLayout,
}

/// A column chunk's footer entry, checked.
struct CheckedChunk {
    start: u64,
    len: u64,
    num_values: u64,
    uncompressed_size: u64,
}

/// Checks one column chunk's footer entry: offsets and sizes non-negative,
/// the chunk inside the file after the leading magic. The chunk's range is
/// computed here as the parquet crate's `ColumnChunkMetaData::byte_range`
/// would (from the dictionary page if any, else the first data page), since
/// that asserts on negative values.
fn check_chunk(path: &Path, rg: usize, column: &str, cc: &ColumnChunkMetaData, file_size: u64) -> Result<CheckedChunk> {
    let bad = |what: String| metadata_error(path, format!("row group {rg}, column {column}: {what}"));
    let non_negative = |name: &str, v: i64| u64::try_from(v).map_err(|_| bad(format!("negative {name} ({v})")));
    let data_page_offset = non_negative("data_page_offset", cc.data_page_offset())?;
    let dictionary_page_offset =
        cc.dictionary_page_offset().map(|v| non_negative("dictionary_page_offset", v)).transpose()?;
    let len = non_negative("total_compressed_size", cc.compressed_size())?;
    let uncompressed_size = non_negative("total_uncompressed_size", cc.uncompressed_size())?;
    let num_values = non_negative("num_values", cc.num_values())?;
    let start = dictionary_page_offset.unwrap_or(data_page_offset);
    let end = start
        .checked_add(len)
        .ok_or_else(|| bad(format!("a chunk of {len} bytes at byte {start} ends past 2^64")))?;
    if end > file_size {
        return Err(Error::Truncated { file: path.to_path_buf(), row_group: rg, column: column.to_string(), end, file_size });
    }
    if start < MAGIC_LEN {
        return Err(bad(format!("the chunk starts at byte {start}, inside the leading PAR1")));
    }
    if data_page_offset > file_size {
        return Err(bad(format!("data_page_offset {data_page_offset} is past the end of the file ({file_size} bytes)")));
    }
    Ok(CheckedChunk { start, len, num_values, uncompressed_size })
}

/// Rows of row group `rg` as the footer says (0 for a negative count, which
/// planning rejects, or a row group that is not there).
pub(crate) fn row_group_rows(metadata: &ParquetMetaData, rg: usize) -> u64 {
    metadata.row_groups().get(rg).map_or(0, |m| m.num_rows().max(0) as u64)
}

/// `a + b` where it fits Parquet's counts (an i64, like the footer's own
/// `num_rows`), else `None`.
fn checked_total(a: u64, b: u64) -> Option<u64> {
    a.checked_add(b).filter(|&t| t <= i64::MAX as u64)
}

/// Length of the `PAR1` magic that starts every Parquet file.
const MAGIC_LEN: u64 = 4;

impl ReadPlan {
    /// Plans a read of `path`.
    pub fn new(path: impl AsRef<Path>, options: &ReadOptions) -> Result<ReadPlan> {
        let path = path.as_ref();
        let footer = read_footer(path)?;
        Self::from_footer(path, footer, options)
    }

    /// Plans a read given an already-loaded footer.
    pub fn from_footer(path: &Path, footer: Footer, options: &ReadOptions) -> Result<ReadPlan> {
        let metadata = footer.metadata;
        let file_size = footer.file_size;
        let (schema, columns) = columns::project(path, &metadata, options.columns.as_deref(), options.string_views)?;

        let num_row_groups = metadata.num_row_groups();
        let row_groups: Vec<usize> = match &options.row_groups {
            None => (0..num_row_groups).collect(),
            Some(list) => {
                for (i, &rg) in list.iter().enumerate() {
                    if rg >= num_row_groups {
                        return Err(Error::RowGroupOutOfRange {
                            file: path.to_path_buf(),
                            row_group: rg,
                            num_row_groups,
                        });
                    }
                    if list[..i].contains(&rg) {
                        return Err(Error::InvalidOptions(format!("row group {rg} is listed twice")));
                    }
                }
                list.clone()
            }
        };

        // Every footer value used below is checked first: the file is
        // untrusted, and the parquet crate's own accessors (`byte_range`)
        // assert instead of returning errors.
        let mut chunks = Vec::new();
        let mut num_rows = 0u64;
        // Values per leaf over the selected row groups, so that any consumer's sum fits.
        let mut leaf_values = vec![0u64; columns.iter().map(|c| c.leaves.len()).sum()];
        for &rg in &row_groups {
            let rg_meta = metadata.row_groups().get(rg).ok_or_else(|| Error::RowGroupOutOfRange {
                file: path.to_path_buf(),
                row_group: rg,
                num_row_groups,
            })?;
            let rg_rows = u64::try_from(rg_meta.num_rows())
                .map_err(|_| metadata_error(path, format!("row group {rg}: negative row count {}", rg_meta.num_rows())))?;
            num_rows = checked_total(num_rows, rg_rows).ok_or_else(|| {
                metadata_error(path, format!("row group {rg}: the row groups' row counts add up past 2^63 - 1"))
            })?;
            // A row group of no rows has nothing to read. Its chunks need not
            // point anywhere: pyarrow writes an empty table's chunks at offset
            // 0 with 0 bytes (or as a dictionary page of 0 entries), and
            // arrow-rs reads such files without looking at them.
            // But a row group that says it has no rows while a chunk holds
            // values is corrupt: reading nothing would drop data silently.
            if rg_rows == 0 {
                if let Some(cc) = rg_meta.columns().iter().find(|cc| cc.num_values() != 0) {
                    return Err(metadata_error(
                        path,
                        format!(
                            "row group {rg} says it has 0 rows, but column {} holds {} values",
                            cc.column_path(),
                            cc.num_values()
                        ),
                    ));
                }
                continue;
            }
            let mut leaf_totals = leaf_values.iter_mut();
            for (ci, col) in columns.iter().enumerate() {
                for (li, leaf) in col.leaves.iter().enumerate() {
                    let cc = rg_meta.columns().get(leaf.leaf_index).ok_or_else(|| {
                        metadata_error(
                            path,
                            format!(
                                "row group {rg} has {} column chunks; column {} is leaf {}",
                                rg_meta.columns().len(),
                                leaf.path,
                                leaf.leaf_index
                            ),
                        )
                    })?;
                    let checked = check_chunk(path, rg, &leaf.path, cc, file_size)?;
                    if let Some(total) = leaf_totals.next() {
                        *total = checked_total(*total, checked.num_values).ok_or_else(|| {
                            metadata_error(
                                path,
                                format!("row group {rg}, column {}: value counts add up past 2^63 - 1", leaf.path),
                            )
                        })?;
                    }
                    chunks.push(ChunkPlan {
                        row_group: rg,
                        column: ci,
                        leaf: li,
                        file_offset: checked.start,
                        len: checked.len,
                        device_offset: 0,
                        codec: cc.compression(),
                        physical_type: leaf.physical_type,
                        num_values: checked.num_values,
                        num_rows: rg_rows,
                        first_row: 0,
                        resume: None,
                        has_dictionary_page: cc.dictionary_page_offset().is_some(),
                        uncompressed_size: checked.uncompressed_size,
                    });
                }
            }
        }

        let task_size = options.io.resolved_task_size()?;
        let lead_rows = vec![0; columns.len()];
        let mut plan = ReadPlan {
            path: path.to_path_buf(),
            file_size,
            metadata,
            schema,
            columns,
            row_groups,
            num_rows,
            group_rows: num_rows,
            lead_rows,
            chunks,
            io: IoLayout::default(),
        };
        plan.plan_io(options.io.merge_gap, task_size);
        Ok(plan)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size when the footer was read.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// The parsed footer (and page index, where loaded).
    pub fn metadata(&self) -> &Arc<ParquetMetaData> {
        &self.metadata
    }

    /// Arrow schema of the result.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Result columns, in output order.
    pub fn columns(&self) -> &[PlannedColumn] {
        &self.columns
    }

    /// Selected row groups, in output order.
    pub fn row_groups(&self) -> &[usize] {
        &self.row_groups
    }

    /// Rows in the result.
    pub fn num_rows(&self) -> u64 {
        self.num_rows
    }

    /// Per result column, the rows its decoded pages hold before the
    /// result's first: 0, unless [`ReadPlan::with_row_window`] cut the plan.
    pub fn lead_rows(&self) -> &[u64] {
        &self.lead_rows
    }

    /// Chunks, row-group-major (for each row group, every leaf of every
    /// column). Row groups of zero rows have none: there is nothing to read.
    pub fn chunks(&self) -> &[ChunkPlan] {
        &self.chunks
    }

    /// Aligned IO ranges and tasks.
    pub fn io(&self) -> &IoLayout {
        &self.io
    }

    /// The chunks of one column (all row groups, leaf order within each).
    pub fn column_chunks(&self, column: usize) -> impl Iterator<Item = &ChunkPlan> {
        self.chunks.iter().filter(move |c| c.column == column)
    }

    /// The leaf a chunk belongs to.
    pub fn leaf_of(&self, chunk: &ChunkPlan) -> &LeafColumn {
        &self.columns[chunk.column].leaves[chunk.leaf]
    }
}
