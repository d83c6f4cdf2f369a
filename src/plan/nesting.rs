//! How a nested column's Arrow arrays arise from its leaves' repetition and
//! definition levels.
//!
//! Each node of an Arrow field (struct, list, map, leaf) is matched with the
//! Parquet schema node it comes from, following the rules arrow-rs uses to
//! convert schemas (three- and two-level lists, `repeated` fields without a
//! LIST annotation, the `array` and `<name>_tuple` one-field element groups,
//! maps). The match yields, per node, two level tests that the device
//! applies to every level position `i` of a leaf beneath it:
//!
//! * the node has a slot (an entry of its Arrow array) at `i` when
//!   `rep[i] <= slot.max_rep && def[i] >= slot.min_def`;
//! * that entry is valid (non-null) when `def[i] >= valid_def`.
//!
//! A list's element slots follow the same test one repetition and one
//! definition level deeper, and a list's offsets count its element slots
//! before each of its own. Any leaf beneath a node sees the same slots, so
//! the first leaf provides the node's offsets and validity, and the others
//! are checked to agree.

use std::path::Path;

use arrow::datatypes::{DataType, FieldRef};
use parquet::basic::{ConvertedType, Repetition};
use parquet::schema::types::{SchemaDescriptor, Type};

use super::columns::PlannedColumn;
use crate::error::{Error, Result};

/// A level test: a slot exists at level position `i` when
/// `rep[i] <= max_rep` and `def[i] >= min_def`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotTest {
    /// Highest repetition level that starts a new slot.
    pub max_rep: u16,
    /// Lowest definition level at which the slot exists.
    pub min_def: u16,
}

/// What a node of a nested column is.
#[derive(Debug, Clone, PartialEq)]
pub enum NestKind {
    /// A primitive leaf: `leaf` indexes [`PlannedColumn::leaves`].
    Leaf {
        /// Position in the planned column's leaves.
        leaf: usize,
    },
    /// A struct: one child per field, the same slots as the struct.
    Struct,
    /// A list (or large or fixed-size list, or list view): one child, the
    /// element, whose slots pass `element`.
    List {
        /// The element's slot test.
        element: SlotTest,
    },
    /// A map: one child, the entries struct (key, value), whose slots pass `element`.
    Map {
        /// The entries' slot test.
        element: SlotTest,
    },
}

/// One node of a nested column, matched with its levels.
#[derive(Debug, Clone)]
pub struct NestNode {
    /// The Arrow field of this node as the result has it.
    pub field: FieldRef,
    /// Kind of node.
    pub kind: NestKind,
    /// Where the node has slots.
    pub slot: SlotTest,
    /// The definition level at and above which a slot is valid; equal to
    /// `slot.min_def` when the node is never null.
    pub valid_def: u16,
    /// Children (struct fields, the list element, the map entries).
    pub children: Vec<NestNode>,
}

impl NestNode {
    /// Whether some slot of this node can be null.
    pub fn can_be_null(&self) -> bool {
        self.valid_def > self.slot.min_def
    }

    /// The planned leaves beneath this node, in schema order.
    pub fn leaves(&self) -> Vec<usize> {
        match self.kind {
            NestKind::Leaf { leaf } => vec![leaf],
            _ => self.children.iter().flat_map(NestNode::leaves).collect(),
        }
    }
}

/// Matches a planned column's Arrow field with its Parquet schema subtree.
/// `field` is the column's field or another Arrow rendering of the same
/// subtree (such as the one without an embedded Arrow schema); it may be
/// pruned to some leaves, which must then be exactly the planned ones.
pub fn nest_tree(path: &Path, schema: &SchemaDescriptor, column: &PlannedColumn, field: &FieldRef) -> Result<NestNode> {
    let roots = schema.root_schema().get_fields();
    let root = roots
        .get(column.root_index)
        .ok_or_else(|| Error::Internal(format!("root {} of {}", column.root_index, roots.len())))?;
    let first_leaf = (0..schema.num_columns())
        .find(|&l| schema.get_column_root_idx(l) == column.root_index)
        .ok_or_else(|| Error::Internal(format!("root {} has no leaves", column.root_index)))?;
    let mut walk = Walk { path, column, next_leaf: first_leaf };
    let top = Level { rep: 0, def: 0, slot: SlotTest { max_rep: 0, min_def: 0 } };
    walk.node(root, field, top, false)?
        .ok_or_else(|| walk.unsupported(format!("no planned leaf under {}", field.name())))
}

/// The levels above a node: its parent's cumulative repetition and definition
/// levels, and the slot test the node inherits.
#[derive(Clone, Copy)]
struct Level {
    rep: u16,
    def: u16,
    slot: SlotTest,
}

struct Walk<'a> {
    path: &'a Path,
    column: &'a PlannedColumn,
    /// Schema index of the next Parquet leaf in depth-first order.
    next_leaf: usize,
}

fn num_leaves(t: &Type) -> usize {
    if t.is_primitive() { 1 } else { t.get_fields().iter().map(|f| num_leaves(f)).sum() }
}

fn is_list(t: &Type) -> bool {
    t.is_group() && t.get_basic_info().converted_type() == ConvertedType::LIST
}

fn is_map(t: &Type) -> bool {
    t.is_group() && matches!(t.get_basic_info().converted_type(), ConvertedType::MAP | ConvertedType::MAP_KEY_VALUE)
}

fn list_element(field: &FieldRef) -> Option<&FieldRef> {
    match field.data_type() {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => Some(f),
        DataType::ListView(f) | DataType::LargeListView(f) => Some(f),
        _ => None,
    }
}

impl Walk<'_> {
    fn unsupported(&self, what: String) -> Error {
        Error::Unsupported { file: self.path.to_path_buf(), column: self.column.field.name().clone(), what }
    }

    fn mismatch(&self, t: &Type, field: &FieldRef) -> Error {
        self.unsupported(format!(
            "the Arrow type {} of {} does not match its Parquet schema node {}",
            field.data_type(),
            field.name(),
            t.name()
        ))
    }

    fn add(&self, a: u16, by: u16) -> Result<u16> {
        a.checked_add(by).ok_or_else(|| self.unsupported("more than 65535 nesting levels".into()))
    }

    /// `t` with Arrow field `field`; `as_element`: `t` is the repeated field
    /// of a list seen as its element (its repetition already counted).
    /// `None` when no planned leaf lies beneath `t`.
    fn node(&mut self, t: &Type, field: &FieldRef, up: Level, as_element: bool) -> Result<Option<NestNode>> {
        let repetition = if t.get_basic_info().has_repetition() { t.get_basic_info().repetition() } else { Repetition::REQUIRED };
        if repetition == Repetition::REPEATED && !as_element {
            // A repeated field outside a LIST or MAP group: a list of required elements.
            let Some(element) = list_element(field) else { return Err(self.mismatch(t, field)) };
            let inner = Level { rep: self.add(up.rep, 1)?, def: self.add(up.def, 1)?, slot: up.slot };
            let element_slot = SlotTest { max_rep: inner.rep, min_def: inner.def };
            let child = self.node(t, element, Level { slot: element_slot, ..inner }, true)?;
            return Ok(child.map(|c| NestNode {
                field: field.clone(),
                kind: NestKind::List { element: element_slot },
                slot: up.slot,
                valid_def: up.slot.min_def,
                children: vec![c],
            }));
        }
        let def = if repetition == Repetition::OPTIONAL { self.add(up.def, 1)? } else { up.def };
        if t.is_primitive() {
            let leaf_index = self.next_leaf;
            self.next_leaf += 1;
            let Some(leaf) = self.column.leaves.iter().position(|l| l.leaf_index == leaf_index) else { return Ok(None) };
            let l = &self.column.leaves[leaf];
            if l.max_def_level != def as i16 || l.max_rep_level != up.rep as i16 {
                return Err(self.unsupported(format!(
                    "leaf {} has levels ({}, {}) where its schema path gives ({def}, {})",
                    l.path, l.max_def_level, l.max_rep_level, up.rep
                )));
            }
            if field.data_type().is_nested() {
                return Err(self.mismatch(t, field));
            }
            return Ok(Some(NestNode { field: field.clone(), kind: NestKind::Leaf { leaf }, slot: up.slot, valid_def: def, children: vec![] }));
        }
        let here = Level { rep: up.rep, def, slot: up.slot };
        if !as_element && is_map(t) && t.get_fields().len() == 1 && t.get_fields()[0].get_fields().len() == 2 {
            return self.map(t, field, here);
        }
        if !as_element && (is_list(t) || is_map(t)) {
            return self.list(t, field, here);
        }
        // A struct.
        let DataType::Struct(fields) = field.data_type() else { return Err(self.mismatch(t, field)) };
        let mut children = Vec::new();
        for child in t.get_fields() {
            match fields.iter().find(|f| f.name() == child.name()) {
                Some(f) => {
                    if let Some(c) = self.node(child, f, here, false)? {
                        children.push(c);
                    }
                }
                None => self.next_leaf += num_leaves(child),
            }
        }
        if children.is_empty() {
            return Ok(None);
        }
        if children.len() != fields.len() {
            return Err(self.mismatch(t, field));
        }
        Ok(Some(NestNode { field: field.clone(), kind: NestKind::Struct, slot: up.slot, valid_def: def, children }))
    }

    /// A LIST-annotated group (or a MAP group whose key_value has one field).
    fn list(&mut self, t: &Type, field: &FieldRef, here: Level) -> Result<Option<NestNode>> {
        let Some(element) = list_element(field) else { return Err(self.mismatch(t, field)) };
        let [repeated] = t.get_fields() else { return Err(self.mismatch(t, field)) };
        if repeated.get_basic_info().repetition() != Repetition::REPEATED {
            return Err(self.mismatch(t, field));
        }
        let inner = Level { rep: self.add(here.rep, 1)?, def: self.add(here.def, 1)?, slot: here.slot };
        let element_slot = SlotTest { max_rep: inner.rep, min_def: inner.def };
        let below = Level { slot: element_slot, ..inner };
        // arrow-rs's rules for which node is the element.
        let two_level = repeated.is_primitive() || {
            let items = repeated.get_fields();
            let single_repeated_child =
                items.len() == 1 && items[0].get_basic_info().has_repetition() && items[0].get_basic_info().repetition() == Repetition::REPEATED;
            items.len() != 1
                || (!is_list(repeated)
                    && !single_repeated_child
                    && (repeated.name() == "array" || repeated.name() == format!("{}_tuple", t.name())))
        };
        let child = if two_level {
            self.node(repeated, element, below, true)?
        } else {
            self.node(&repeated.get_fields()[0], element, below, false)?
        };
        Ok(child.map(|c| NestNode {
            field: field.clone(),
            kind: NestKind::List { element: element_slot },
            slot: here.slot,
            valid_def: here.def,
            children: vec![c],
        }))
    }

    /// A MAP group: key_value entries of a key and a value.
    fn map(&mut self, t: &Type, field: &FieldRef, here: Level) -> Result<Option<NestNode>> {
        let DataType::Map(entries, _) = field.data_type() else { return Err(self.mismatch(t, field)) };
        let key_value = &t.get_fields()[0];
        if key_value.get_basic_info().repetition() != Repetition::REPEATED {
            return Err(self.mismatch(t, field));
        }
        let inner = Level { rep: self.add(here.rep, 1)?, def: self.add(here.def, 1)?, slot: here.slot };
        let element_slot = SlotTest { max_rep: inner.rep, min_def: inner.def };
        let DataType::Struct(kv_fields) = entries.data_type() else { return Err(self.mismatch(t, field)) };
        if kv_fields.len() != 2 {
            return Err(self.mismatch(t, field));
        }
        let below = Level { slot: element_slot, ..inner };
        let mut children = Vec::new();
        for (child, f) in key_value.get_fields().iter().zip(kv_fields.iter()) {
            if let Some(c) = self.node(child, f, below, false)? {
                children.push(c);
            }
        }
        if children.is_empty() {
            return Ok(None);
        }
        if children.len() != 2 {
            // arrow-rs reads a map only with both its key and its value.
            return Err(self.unsupported(format!("a projection of {} that keeps only one of its key and value", field.name())));
        }
        let entries_node =
            NestNode { field: entries.clone(), kind: NestKind::Struct, slot: element_slot, valid_def: inner.def, children };
        Ok(Some(NestNode {
            field: field.clone(),
            kind: NestKind::Map { element: element_slot },
            slot: here.slot,
            valid_def: here.def,
            children: vec![entries_node],
        }))
    }
}
