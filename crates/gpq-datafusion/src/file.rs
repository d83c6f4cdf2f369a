//! The files behind a table: finding them, loading each footer (page index
//! included) once, and checking that they share one schema.
//!
//! A table's schema is the first file's Arrow schema (the embedded
//! `ARROW:schema` honoured, so TPC-H strings are `Utf8View`). Every other
//! file must have the same column names with the same types, in any order;
//! a column is nullable in the table when it is in any file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::ParquetMetaData;
use parquet::schema::types::SchemaDescriptor;

use gpq::{Error, Footer, Result, read_footer_with_page_index};

/// One Parquet file of a table, with its footer loaded.
#[derive(Debug)]
pub(crate) struct GpqFile {
    /// The file.
    pub path: PathBuf,
    /// Its footer (and page index, where the file has one) and size.
    pub footer: Footer,
    /// The parquet crate's view of the footer: Arrow schema and metadata.
    pub reader_metadata: ArrowReaderMetadata,
    /// For each table column, the index of the file's top-level field holding it.
    pub roots: Vec<usize>,
    /// For each top-level field of the file, its leaf columns.
    pub root_leaves: Vec<Vec<usize>>,
}

impl GpqFile {
    /// Loads the footer of `path`.
    pub fn open(path: &Path) -> Result<GpqFile> {
        let footer = read_footer_with_page_index(path)?;
        let reader_metadata =
            ArrowReaderMetadata::try_new(Arc::clone(&footer.metadata), ArrowReaderOptions::new())
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
            footer,
            reader_metadata,
            roots,
            root_leaves,
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

    /// Rows of row group `rg`.
    pub fn row_group_rows(&self, rg: usize) -> usize {
        usize::try_from(self.metadata().row_group(rg).num_rows()).unwrap_or(0)
    }

    /// Compressed bytes of the chunks of the given table columns in row group `rg`.
    pub fn projected_bytes(&self, rg: usize, columns: &[usize]) -> u64 {
        let rg = self.metadata().row_group(rg);
        columns
            .iter()
            .flat_map(|&c| &self.root_leaves[self.roots[c]])
            .map(|&leaf| u64::try_from(rg.column(leaf).compressed_size()).unwrap_or(0))
            .sum()
    }

    /// The file's top-level field indices of the given table columns, in that order.
    pub fn file_roots(&self, columns: &[usize]) -> Vec<usize> {
        columns.iter().map(|&c| self.roots[c]).collect()
    }
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
pub(crate) fn open_files(paths: &[PathBuf]) -> Result<(Vec<GpqFile>, SchemaRef)> {
    if paths.is_empty() {
        return Err(Error::InvalidOptions(
            "a gpq table needs at least one file".into(),
        ));
    }
    let mut files = paths
        .iter()
        .map(|p| GpqFile::open(p))
        .collect::<Result<Vec<_>>>()?;
    let first = Arc::clone(files[0].schema());
    let mut fields: Vec<Field> = first.fields().iter().map(|f| f.as_ref().clone()).collect();
    for file in files.iter_mut().skip(1) {
        let schema = Arc::clone(file.schema());
        let mismatch = |what: String| {
            Error::InvalidOptions(format!(
                "{} does not share the schema of {}: {what}",
                file.path.display(),
                paths[0].display()
            ))
        };
        if schema.fields().len() != fields.len() {
            return Err(mismatch(format!(
                "{} columns, expected {}",
                schema.fields().len(),
                fields.len()
            )));
        }
        let mut roots = Vec::with_capacity(fields.len());
        for field in fields.iter_mut() {
            let (i, f) = schema
                .column_with_name(field.name())
                .ok_or_else(|| mismatch(format!("no column {:?}", field.name())))?;
            if f.data_type() != field.data_type() {
                return Err(mismatch(format!(
                    "column {:?} is {}, expected {}",
                    field.name(),
                    f.data_type(),
                    field.data_type()
                )));
            }
            if f.is_nullable() {
                field.set_nullable(true);
            }
            roots.push(i);
        }
        file.roots = roots;
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, first.metadata().clone()));
    Ok((files, schema))
}
