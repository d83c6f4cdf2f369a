//! Column projection: which leaf columns a selection needs, and the Arrow
//! schema of the result (honouring the `ARROW:schema` the writer embedded).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use parquet::arrow::{ProjectionMask, parquet_to_arrow_schema, parquet_to_arrow_schema_by_columns};
use parquet::basic::Type as PhysicalType;
use parquet::file::metadata::{KeyValue, ParquetMetaData};
use parquet::schema::types::{ColumnDescPtr, SchemaDescriptor};

use super::footer::{catch_parquet_panic, metadata_error};
use crate::error::{Error, Result};
use crate::options::ColumnSelector;

/// One leaf (primitive) column of the Parquet schema that the read needs.
#[derive(Debug, Clone)]
pub struct LeafColumn {
    /// Index of the leaf in the file's Parquet schema.
    pub leaf_index: usize,
    /// Dotted path of the leaf, e.g. `l_orderkey` or `a.b.list.element`.
    pub path: String,
    /// Physical storage type.
    pub physical_type: PhysicalType,
    /// Byte width of FIXED_LEN_BYTE_ARRAY values (0 otherwise).
    pub type_length: i32,
    /// Highest definition level (0 for a required top-level column).
    pub max_def_level: i16,
    /// Highest repetition level (0 for a flat column).
    pub max_rep_level: i16,
    /// The parquet crate's descriptor, for logical and converted types.
    pub descr: ColumnDescPtr,
}

/// One field of the result: a top-level Arrow field and the leaves it is built from.
#[derive(Debug, Clone)]
pub struct PlannedColumn {
    /// The Arrow field as the result will carry it.
    pub field: FieldRef,
    /// Index of the field's root in the file's schema.
    pub root_index: usize,
    /// Leaves in schema order; exactly one for a flat column.
    pub leaves: Vec<LeafColumn>,
}

impl PlannedColumn {
    /// True when the field is a primitive top-level column (one leaf, no repetition).
    pub fn is_flat(&self) -> bool {
        self.leaves.len() == 1
            && self.leaves[0].max_rep_level == 0
            && !self.field.data_type().is_nested()
    }
}

/// Resolves a selection against the file's schema.
/// `views`: top-level strings and binary become view types
/// ([`with_view_types`]).
pub fn project(
    path: &Path,
    metadata: &ParquetMetaData,
    selection: Option<&[ColumnSelector]>,
    views: bool,
) -> Result<(SchemaRef, Vec<PlannedColumn>)> {
    let schema_descr = metadata.file_metadata().schema_descr();
    let kv = metadata.file_metadata().key_value_metadata();
    let full = arrow_schema_of(path, schema_descr, kv)?;
    let full = if views { with_view_types(&full) } else { full };
    let num_roots = schema_descr.root_schema().get_fields().len();
    // The result's fields are looked up by root index below.
    if full.fields().len() != num_roots {
        return Err(metadata_error(
            path,
            format!("the Arrow schema has {} fields for {num_roots} top-level columns", full.fields().len()),
        ));
    }

    // Leaves that belong to each root.
    let mut root_leaves: Vec<Vec<usize>> = vec![Vec::new(); num_roots];
    for leaf in 0..schema_descr.num_columns() {
        let root = schema_descr.get_column_root_idx(leaf);
        root_leaves
            .get_mut(root)
            .ok_or_else(|| metadata_error(path, format!("leaf {leaf} belongs to a root {root} that does not exist")))?
            .push(leaf);
    }

    // Requested roots in order, each with the leaves it needs (None = all).
    let mut wanted: Vec<(usize, Option<Vec<usize>>)> = Vec::new();
    let mut add = |root: usize, leaves: Option<Vec<usize>>| {
        match wanted.iter_mut().find(|(r, _)| *r == root) {
            Some((_, existing)) => match (existing.as_mut(), leaves) {
                (None, _) => {}
                (Some(_), None) => *existing = None,
                (Some(e), Some(l)) => {
                    for x in l {
                        if !e.contains(&x) {
                            e.push(x);
                        }
                    }
                }
            },
            None => wanted.push((root, leaves)),
        }
    };
    let available = || {
        full.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
    };
    match selection {
        None => (0..num_roots).for_each(|r| add(r, None)),
        Some(sel) => {
            for s in sel {
                match s {
                    ColumnSelector::Index(i) if *i < num_roots => add(*i, None),
                    ColumnSelector::Name(name) => {
                        if let Some(r) = full.fields().iter().position(|f| f.name() == name) {
                            add(r, None);
                        } else if let Some(leaf) = (0..schema_descr.num_columns())
                            .find(|&l| schema_descr.column(l).path().string() == *name)
                        {
                            add(schema_descr.get_column_root_idx(leaf), Some(vec![leaf]));
                        } else {
                            // A dotted prefix of a nested group selects every leaf under it.
                            let prefix = format!("{name}.");
                            let leaves: Vec<usize> = (0..schema_descr.num_columns())
                                .filter(|&l| schema_descr.column(l).path().string().starts_with(&prefix))
                                .collect();
                            if leaves.is_empty() {
                                return Err(Error::ColumnNotFound {
                                    file: path.to_path_buf(),
                                    column: name.clone(),
                                    available: available(),
                                });
                            }
                            add(schema_descr.get_column_root_idx(leaves[0]), Some(leaves));
                        }
                    }
                    ColumnSelector::Index(i) => {
                        return Err(Error::ColumnNotFound {
                            file: path.to_path_buf(),
                            column: format!("#{i}"),
                            available: available(),
                        });
                    }
                }
            }
        }
    }

    let mut columns = Vec::with_capacity(wanted.len());
    let mut fields = Vec::with_capacity(wanted.len());
    let mut metadata_map = BTreeMap::new();
    for (root, leaves) in wanted {
        // Every root index here is below `num_roots` (by construction), which
        // is the length of both `full.fields()` and `root_leaves`.
        let (Some(full_field), Some(all_leaves)) = (full.fields().get(root), root_leaves.get(root)) else {
            return Err(Error::Internal(format!("projected root {root} of {num_roots}")));
        };
        let (field, leaf_ids) = match leaves {
            None => (full_field.clone(), all_leaves.clone()),
            Some(mut l) => {
                l.sort_unstable();
                let mask = ProjectionMask::leaves(schema_descr, l.iter().copied());
                let pruned = catch_parquet_panic("converting the schema to Arrow", || {
                    parquet_to_arrow_schema_by_columns(schema_descr, mask, kv)
                })
                .map_err(|source| Error::Metadata { file: path.to_path_buf(), source })?;
                let pruned = if views { with_view_types(&pruned) } else { pruned };
                let field = pruned
                    .fields()
                    .iter()
                    .find(|f| f.name() == full_field.name())
                    .cloned()
                    .unwrap_or_else(|| full_field.clone());
                (field, l)
            }
        };
        let leaves = leaf_ids
            .into_iter()
            .map(|l| {
                let d = schema_descr.column(l);
                LeafColumn {
                    leaf_index: l,
                    path: d.path().string(),
                    physical_type: d.physical_type(),
                    type_length: d.type_length(),
                    max_def_level: d.max_def_level(),
                    max_rep_level: d.max_rep_level(),
                    descr: d,
                }
            })
            .collect();
        fields.push(field.clone());
        columns.push(PlannedColumn { field, root_index: root, leaves });
    }
    for (k, v) in full.metadata() {
        metadata_map.insert(k.clone(), v.clone());
    }
    let schema = Schema::new(fields).with_metadata(metadata_map.into_iter().collect());
    Ok((Arc::new(schema), columns))
}

/// `schema` with its top-level `Utf8` and `LargeUtf8` fields as `Utf8View`
/// and `Binary` and `LargeBinary` as `BinaryView` (nested fields keep their
/// types), as DataFusion's `schema_force_view_types` maps a Parquet schema.
pub fn with_view_types(schema: &Schema) -> Schema {
    let fields: Vec<FieldRef> = schema
        .fields()
        .iter()
        .map(|f| {
            let view = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
                DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
                _ => return Arc::clone(f),
            };
            Arc::new(f.as_ref().clone().with_data_type(view))
        })
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// The Arrow schema of a file's Parquet schema, honouring the writer's
/// `ARROW:schema` hint where `kv` holds one. The conversion decodes that hint
/// (an Arrow IPC message) and the schema, both file-controlled, and the
/// parquet and arrow-ipc crates panic on some malformed values (an integer of
/// bit width 0, say): a panic becomes an [`Error::Metadata`] naming `path`.
pub(crate) fn arrow_schema_of(path: &Path, schema: &SchemaDescriptor, kv: Option<&Vec<KeyValue>>) -> Result<Schema> {
    catch_parquet_panic("converting the schema to Arrow", || parquet_to_arrow_schema(schema, kv))
        .map_err(|source| Error::Metadata { file: path.to_path_buf(), source })
}
