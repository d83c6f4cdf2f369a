//! CPU read planning.
//!
//! A [`ReadPlan`] is everything gpq decides before touching the GPU: the
//! footer, the projected columns and their Arrow schema, the selected row
//! groups, one [`ChunkPlan`] per (row group, leaf column) saying where the
//! chunk's bytes are in the file and where they will land in the device
//! buffer, and the [`IoLayout`] of aligned ranges and tasks that the IO layer
//! executes.

pub mod columns;
pub mod footer;
pub mod ranges;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::file::metadata::ParquetMetaData;

pub use columns::{LeafColumn, PlannedColumn};
pub use footer::{Footer, read_footer, read_footer_with_page_index};
pub use ranges::{IoLayout, IoRange, IoTask};

use crate::error::{Error, Result};
use crate::options::{IO_ALIGNMENT, ReadOptions};

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
    /// Values (levels included: nulls count) the chunk holds, per its metadata.
    pub num_values: u64,
    /// Rows in the chunk's row group.
    pub num_rows: u64,
    /// Whether the metadata says the chunk starts with a dictionary page.
    pub has_dictionary_page: bool,
    /// Total uncompressed size of the chunk per the metadata.
    pub uncompressed_size: u64,
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
    pub(crate) chunks: Vec<ChunkPlan>,
    pub(crate) io: IoLayout,
}

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
        let (schema, columns) = columns::project(path, &metadata, options.columns.as_deref())?;

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

        let mut chunks = Vec::new();
        let mut num_rows = 0u64;
        for &rg in &row_groups {
            let rg_meta = metadata.row_group(rg);
            let rg_rows = u64::try_from(rg_meta.num_rows()).unwrap_or(0);
            num_rows += rg_rows;
            for (ci, col) in columns.iter().enumerate() {
                for (li, leaf) in col.leaves.iter().enumerate() {
                    let cc = rg_meta.column(leaf.leaf_index);
                    let (start, len) = cc.byte_range();
                    let end = start.checked_add(len).unwrap_or(u64::MAX);
                    if end > file_size || start < 4 {
                        return Err(Error::Truncated {
                            file: path.to_path_buf(),
                            row_group: rg,
                            column: leaf.path.clone(),
                            end,
                            file_size,
                        });
                    }
                    if cc.num_values() < 0 || cc.uncompressed_size() < 0 {
                        return Err(Error::Metadata {
                            file: path.to_path_buf(),
                            source: parquet::errors::ParquetError::General(format!(
                                "row group {rg}, column {}: negative value count or size",
                                leaf.path
                            )),
                        });
                    }
                    chunks.push(ChunkPlan {
                        row_group: rg,
                        column: ci,
                        leaf: li,
                        file_offset: start,
                        len,
                        device_offset: 0,
                        codec: cc.compression(),
                        physical_type: leaf.physical_type,
                        num_values: cc.num_values() as u64,
                        num_rows: rg_rows,
                        has_dictionary_page: cc.dictionary_page_offset().is_some(),
                        uncompressed_size: cc.uncompressed_size() as u64,
                    });
                }
            }
        }

        let task_size = options.io.resolved_task_size()?;
        let spans: Vec<_> = chunks.iter().map(|c| (c.file_offset, c.len)).collect();
        let io = IoLayout::build(&spans, file_size, IO_ALIGNMENT, options.io.merge_gap, task_size);
        for (c, &off) in chunks.iter_mut().zip(&io.span_device_offsets) {
            c.device_offset = off;
        }

        Ok(ReadPlan {
            path: path.to_path_buf(),
            file_size,
            metadata,
            schema,
            columns,
            row_groups,
            num_rows,
            chunks,
            io,
        })
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

    /// Chunks, row-group-major (for each row group, every leaf of every column).
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
