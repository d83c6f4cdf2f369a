//! The files behind a table: finding them, loading each footer (page index
//! included), checking that they share one schema, and noticing when a file
//! changed after its footer was read.
//!
//! A table's schema is the first file's Arrow schema (the embedded
//! `ARROW:schema` honoured, so TPC-H strings are `Utf8View`). Every other
//! file must have the same column names with the same types, in any order;
//! a column is nullable in the table when it is in any file.
//!
//! Each file records its size and modification time as they were just
//! before its footer was read ([`FileStamp`]). Before every scan the table
//! compares them with the file's current ones (one `stat` per file) and
//! re-reads the footer of a file that changed ([`refresh`]); a re-read file
//! must fit the table's schema as it is, which cannot change under a
//! registered table.
//!
//! Row counts come from footers and are checked when a footer is loaded: a
//! row group with a negative row count, or a file whose row counts add up to
//! more than `i64::MAX`, is invalid metadata (the file's fault), not a reason
//! to report wrong counts or to overflow later sums.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::error::DataFusionError;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::schema::types::SchemaDescriptor;

use gpq::{Error, Footer, Result, read_footer_with_page_index};

use crate::to_df_error;

/// A file's size and modification time, as one `stat` saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, where the platform reports one.
    pub modified: Option<SystemTime>,
}

impl FileStamp {
    /// Stats `path`.
    pub fn of(path: &Path) -> Result<FileStamp> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Open {
            file: path.to_path_buf(),
            source,
        })?;
        Ok(FileStamp {
            size: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// One Parquet file of a table, with its footer loaded.
#[derive(Debug, Clone)]
pub(crate) struct GpqFile {
    /// The file.
    pub path: PathBuf,
    /// Size and modification time just before the footer was read.
    pub stamp: FileStamp,
    /// Its footer (and page index, where the file has one) and size.
    pub footer: Footer,
    /// The parquet crate's view of the footer: Arrow schema and metadata.
    pub reader_metadata: ArrowReaderMetadata,
    /// For each table column, the index of the file's top-level field holding it.
    pub roots: Vec<usize>,
    /// For each top-level field of the file, its leaf columns.
    pub root_leaves: Vec<Vec<usize>>,
    /// Whether top-level strings and binary read as view types (the
    /// schema says so; device reads are asked for them).
    pub views: bool,
}

impl GpqFile {
    /// Loads the footer of `path`.
    ///
    /// The file is stat-ed before its footer is read, so a change made while
    /// the footer is being read is noticed by the next scan.
    pub fn open(path: &Path, views: bool) -> Result<GpqFile> {
        let stamp = FileStamp::of(path)?;
        let footer = read_footer_with_page_index(path)?;
        GpqFile::from_footer(path, stamp, footer, views)
    }

    /// The file at `path` with the given footer, read when the file had
    /// `stamp`; `views`: top-level strings and binary as view types.
    pub fn from_footer(path: &Path, stamp: FileStamp, footer: Footer, views: bool) -> Result<GpqFile> {
        check_row_counts(path, &footer.metadata)?;
        // The parquet crate's schema conversion panics on some hostile
        // footers (an integer type of bit width 0); that is bad input, not a crash.
        let metadata = Arc::clone(&footer.metadata);
        let reader_metadata = std::panic::catch_unwind(move || {
            let plain = ArrowReaderMetadata::try_new(Arc::clone(&metadata), ArrowReaderOptions::new())?;
            let viewed = gpq::plan::with_view_types(plain.schema());
            if !views || viewed == **plain.schema() {
                return Ok(plain);
            }
            // arrow-rs then decodes them as views too (the CPU backend).
            ArrowReaderMetadata::try_new(metadata, ArrowReaderOptions::new().with_schema(Arc::new(viewed)))
        })
        .unwrap_or_else(|panic| {
            Err(parquet::errors::ParquetError::General(format!(
                "the parquet crate panicked on this footer: {}",
                gpq::error::panic_message(panic.as_ref())
            )))
        })
        .map_err(|source| Error::Metadata {
            file: path.to_path_buf(),
            source,
        })?;
        let descr = reader_metadata.parquet_schema();
        let mut root_leaves = vec![Vec::new(); descr.root_schema().get_fields().len()];
        for leaf in 0..descr.num_columns() {
            if let Some(r) = root_leaves.get_mut(descr.get_column_root_idx(leaf)) {
                r.push(leaf);
            }
        }
        let roots = (0..reader_metadata.schema().fields().len()).collect();
        Ok(GpqFile {
            path: path.to_path_buf(),
            stamp,
            footer,
            reader_metadata,
            roots,
            root_leaves,
            views,
        })
    }

    /// The file's own Arrow schema.
    pub fn schema(&self) -> &SchemaRef {
        self.reader_metadata.schema()
    }

    /// The file's Parquet schema.
    pub fn parquet_schema(&self) -> &SchemaDescriptor {
        self.reader_metadata.parquet_schema()
    }

    /// The parsed footer.
    pub fn metadata(&self) -> &Arc<ParquetMetaData> {
        &self.footer.metadata
    }

    /// Rows of row group `rg` (0 for a row group the file does not have;
    /// row counts were checked to be non-negative when the footer was read).
    pub fn row_group_rows(&self, rg: usize) -> usize {
        self.metadata()
            .row_groups()
            .get(rg)
            .and_then(|g| usize::try_from(g.num_rows()).ok())
            .unwrap_or(0)
    }

    /// Rows of all row groups (checked to fit in an `i64` when the footer was read).
    pub fn rows(&self) -> usize {
        (0..self.metadata().num_row_groups())
            .map(|rg| self.row_group_rows(rg))
            .fold(0usize, usize::saturating_add)
    }

    /// Compressed bytes of the chunks of the given table columns in row group
    /// `rg` (a weight for splitting work: negative sizes count as 0, and the
    /// sum saturates).
    pub fn projected_bytes(&self, rg: usize, columns: &[usize]) -> u64 {
        let Some(rg) = self.metadata().row_groups().get(rg) else {
            return 0;
        };
        columns
            .iter()
            .filter_map(|&c| self.roots.get(c))
            .filter_map(|&r| self.root_leaves.get(r))
            .flatten()
            .filter_map(|&leaf| rg.columns().get(leaf))
            .map(|chunk| u64::try_from(chunk.compressed_size()).unwrap_or(0))
            .fold(0u64, u64::saturating_add)
    }

    /// The file's top-level field indices of the given table columns, in that order.
    pub fn file_roots(&self, columns: &[usize]) -> Vec<usize> {
        columns
            .iter()
            .map(|&c| self.roots.get(c).copied().unwrap_or(c))
            .collect()
    }
}

/// Rejects footers whose row counts cannot be right: a negative row count
/// in a row group, or a total over `i64::MAX`.
fn check_row_counts(path: &Path, metadata: &ParquetMetaData) -> Result<()> {
    let invalid = |what: String| Error::Metadata {
        file: path.to_path_buf(),
        source: ParquetError::General(what),
    };
    let mut total: i64 = 0;
    for (i, rg) in metadata.row_groups().iter().enumerate() {
        let rows = rg.num_rows();
        if rows < 0 {
            return Err(invalid(format!(
                "row group {i} has a negative row count ({rows})"
            )));
        }
        total = total.checked_add(rows).ok_or_else(|| {
            invalid(format!(
                "the row counts of the row groups overflow at row group {i}"
            ))
        })?;
    }
    Ok(())
}

/// The Parquet files of a table at `path` (see [`gpq::parquet_files`]);
/// a directory without any is an error.
pub(crate) fn discover(path: &Path) -> Result<Vec<PathBuf>> {
    let files = gpq::parquet_files(path)?;
    if files.is_empty() {
        return Err(Error::InvalidOptions(format!(
            "{} holds no .parquet files",
            path.display()
        )));
    }
    Ok(files)
}

/// Opens `paths` and derives their common schema; sets each file's `roots`.
pub(crate) fn open_files(paths: &[PathBuf], views: bool) -> Result<(Vec<GpqFile>, SchemaRef)> {
    let Some(first_path) = paths.first() else {
        return Err(Error::InvalidOptions(
            "a gpq table needs at least one file".into(),
        ));
    };
    let mut files = paths
        .iter()
        .map(|p| GpqFile::open(p, views))
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = files.first().map(|f| Arc::clone(f.schema())) else {
        return Err(Error::Internal("a gpq table opened no file".into()));
    };
    let mut fields: Vec<Field> = first.fields().iter().map(|f| f.as_ref().clone()).collect();
    for file in files.iter_mut().skip(1) {
        let roots = match_columns(file.schema(), &fields).map_err(|what| {
            Error::InvalidOptions(format!(
                "{} does not share the schema of {}: {what}",
                file.path.display(),
                first_path.display()
            ))
        })?;
        for (field, &r) in fields.iter_mut().zip(&roots) {
            if file.schema().field(r).is_nullable() {
                field.set_nullable(true);
            }
        }
        file.roots = roots;
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, first.metadata().clone()));
    Ok((files, schema))
}

/// Where each of `fields` is in `schema` (by name), or what does not match:
/// a different number of columns, a missing column, or a column of another type.
fn match_columns(schema: &Schema, fields: &[Field]) -> std::result::Result<Vec<usize>, String> {
    if schema.fields().len() != fields.len() {
        return Err(format!(
            "{} columns, expected {}",
            schema.fields().len(),
            fields.len()
        ));
    }
    fields
        .iter()
        .map(|field| {
            let (i, f) = schema
                .column_with_name(field.name())
                .ok_or_else(|| format!("no column {:?}", field.name()))?;
            if f.data_type() != field.data_type() {
                return Err(format!(
                    "column {:?} is {}, expected {}",
                    field.name(),
                    f.data_type(),
                    field.data_type()
                ));
            }
            Ok(i)
        })
        .collect()
}

/// Re-reads the footer of `file` if its size or modification time changed
/// since the footer was read; `None` when it did not change.
///
/// The new footer must fit `table_schema`: the same columns (in any order)
/// with the same types, and no column nullable that the table declares
/// non-nullable. Otherwise the scan fails with an error naming the file and
/// the difference; so does a file that is gone or no longer valid Parquet.
pub(crate) fn refresh(
    file: &GpqFile,
    table_schema: &Schema,
) -> datafusion::error::Result<Option<GpqFile>> {
    let now = FileStamp::of(&file.path).map_err(to_df_error)?;
    if now == file.stamp {
        return Ok(None);
    }
    let mut fresh = GpqFile::open(&file.path, file.views).map_err(to_df_error)?;
    fit_to_table(&mut fresh, table_schema).map_err(|what| {
        DataFusionError::Execution(format!(
            "gpq table: {} changed since the table was registered and no longer has the table's schema: {what}",
            file.path.display()
        ))
    })?;
    Ok(Some(fresh))
}

/// Sets the `roots` of `file`, opened on its own, as a file of a table
/// with `table_schema`; or says why it does not fit: a different set of
/// columns or types, or a column nullable that the table declares
/// non-nullable.
pub(crate) fn fit_to_table(file: &mut GpqFile, table_schema: &Schema) -> std::result::Result<(), String> {
    let fields: Vec<Field> = table_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let roots = match_columns(file.schema(), &fields)?;
    for (field, &r) in fields.iter().zip(&roots) {
        if file.schema().field(r).is_nullable() && !field.is_nullable() {
            return Err(format!("column {:?} is nullable, the table's is not", field.name()));
        }
    }
    file.roots = roots;
    Ok(())
}

/// Footers made up in memory, for tests of what hostile footers do.
#[cfg(test)]
pub(crate) mod synthetic {
    use std::sync::Arc;

    use parquet::file::metadata::{
        ColumnChunkMetaData, FileMetaData, ParquetMetaData, RowGroupMetaData,
    };
    use parquet::file::statistics::Statistics;
    use parquet::schema::parser::parse_message_type;
    use parquet::schema::types::SchemaDescriptor;

    use super::*;

    /// A file of one `int64 a` column whose row groups claim `rows` rows and
    /// `nulls` nulls each.
    pub fn file(rows: &[i64], nulls: u64) -> Result<GpqFile> {
        let schema = parse_message_type("message m { optional int64 a; }").unwrap();
        let descr = Arc::new(SchemaDescriptor::new(Arc::new(schema)));
        let row_groups = rows
            .iter()
            .map(|&n| {
                let chunk = ColumnChunkMetaData::builder(descr.column(0))
                    .set_num_values(n)
                    .set_total_compressed_size(i64::MAX)
                    .set_statistics(Statistics::int64(
                        Some(0),
                        Some(9),
                        None,
                        Some(nulls),
                        false,
                    ))
                    .build()
                    .unwrap();
                RowGroupMetaData::builder(Arc::clone(&descr))
                    .set_num_rows(n)
                    .set_column_metadata(vec![chunk])
                    .build()
                    .unwrap()
            })
            .collect();
        let total = rows.iter().fold(0i64, |a, &n| a.wrapping_add(n));
        let meta = FileMetaData::new(2, total, None, None, descr, None);
        let footer = Footer {
            file_size: 1 << 40,
            metadata: Arc::new(ParquetMetaData::new(meta, row_groups)),
        };
        let stamp = FileStamp {
            size: 1 << 40,
            modified: None,
        };
        GpqFile::from_footer(Path::new("synthetic.parquet"), stamp, footer, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_row_counts_are_invalid_metadata() {
        let err = synthetic::file(&[10, -1], 0).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        assert!(err.to_string().contains("negative row count"), "{err}");
        let err = synthetic::file(&[i64::MAX, 1], 0).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        let f = synthetic::file(&[i64::MAX], 0).unwrap();
        assert_eq!(f.rows(), i64::MAX as usize);
        // Chunk sizes of i64::MAX saturate instead of overflowing.
        assert_eq!(f.projected_bytes(0, &[0, 0, 0]), u64::MAX);
        assert_eq!(f.projected_bytes(7, &[0]), 0);
        assert_eq!(f.row_group_rows(7), 0);
    }
}
