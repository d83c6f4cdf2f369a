//! Filters evaluated on the device: a [`Predicate`] over a table's columns
//! keeps the rows where it is TRUE (SQL's three-valued logic: NULL drops
//! the row), and the kept rows of the columns asked for are gathered into a
//! new [`DeviceTable`], so a host copy moves only them.
//!
//! The predicate is not compiled into a kernel of its own: it becomes a
//! short postfix program (`filter.cu`) that one prebuilt kernel interprets
//! for every row. A program costs no NVRTC compile (which takes a large
//! fraction of a second, longer than filtering a pass), works on devices
//! that have only the prebuilt images, and runs on the CPU emulator like
//! every other kernel; the interpretation overhead is a few instructions per
//! step, small beside reading the column values.
//!
//! Semantics are DataFusion's, so that a filter run here and one run by
//! DataFusion agree row for row: integers, decimals, dates, times,
//! timestamps and durations compare as integers in the column's units (a
//! literal is given in those units), floats in IEEE total order with the
//! zeros made equal (NaN above everything and equal to itself, `-0.0 =
//! 0.0`: Arrow's kernels alone order `-0.0` below `0.0`, DataFusion
//! normalizes zeros first), strings and binary bytewise. `LIKE` takes
//! patterns whose only wildcard is `%`.
//!
//! A predicate the device cannot evaluate on the given columns (a type it
//! has no comparison for, a literal of the wrong kind, a nested column to
//! gather) is an [`Error::Filter`]; the caller filters on the host.

use std::sync::Arc;
use std::time::Instant;

use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::datatypes::{DataType, Schema};

use super::{DeviceColumn, DeviceTable};
use crate::cuda::{DeviceBuffer, GpuStream, as_bytes, from_bytes};
use crate::error::{Error, Result};
use crate::gpu::{Kernel, KernelArgs, Kernels};
use crate::stats::FilterStats;

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
}

impl CmpOp {
    fn code(self) -> u32 {
        match self {
            CmpOp::Eq => 0,
            CmpOp::NotEq => 1,
            CmpOp::Lt => 2,
            CmpOp::LtEq => 3,
            CmpOp::Gt => 4,
            CmpOp::GtEq => 5,
        }
    }
}

/// A constant a column is compared with.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// An integer in the column's units: for integer, decimal (the unscaled
    /// value at the column's scale), date, time, timestamp and duration
    /// columns.
    Int(i128),
    /// For float columns.
    Float(f64),
    /// For string and binary columns.
    Bytes(Vec<u8>),
    /// For boolean columns (`=` and `<>` only).
    Bool(bool),
}

/// A condition on a row, over the columns of a table (by index).
#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    /// `column op value`.
    Compare {
        /// The column.
        column: usize,
        /// The comparison.
        op: CmpOp,
        /// The constant.
        value: Literal,
    },
    /// `column IN (values)`; NULL when the column is.
    InList {
        /// The column.
        column: usize,
        /// The constants (none of them NULL).
        values: Vec<Literal>,
    },
    /// `column IS NULL`.
    IsNull(usize),
    /// `column IS NOT NULL`.
    IsNotNull(usize),
    /// `column LIKE pattern` for a string or binary column, where `%` is
    /// the only wildcard (no `_`, no escapes).
    Like {
        /// The column.
        column: usize,
        /// The pattern's bytes.
        pattern: Vec<u8>,
    },
    /// `left op right`, two columns compared row by row: both numbers
    /// (integers, decimals of one scale, dates, times of one unit; or
    /// both floats) or both strings or binary.
    CompareColumns {
        /// The left column.
        left: usize,
        /// The comparison.
        op: CmpOp,
        /// The right column.
        right: usize,
    },
    /// A boolean column's value.
    Column(usize),
    /// Every condition holds.
    And(Vec<Predicate>),
    /// At least one condition holds.
    Or(Vec<Predicate>),
    /// The condition does not hold.
    Not(Box<Predicate>),
    /// A constant truth value (`None`: NULL).
    Const(Option<bool>),
}

impl Predicate {
    /// The columns the predicate reads, sorted, without repeats.
    pub fn columns(&self) -> Vec<usize> {
        let mut out = Vec::new();
        self.collect_columns(&mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    fn collect_columns(&self, out: &mut Vec<usize>) {
        match self {
            Predicate::Compare { column, .. }
            | Predicate::InList { column, .. }
            | Predicate::Like { column, .. }
            | Predicate::IsNull(column)
            | Predicate::IsNotNull(column)
            | Predicate::Column(column) => out.push(*column),
            Predicate::CompareColumns { left, right, .. } => out.extend([*left, *right]),
            Predicate::And(ps) | Predicate::Or(ps) => ps.iter().for_each(|p| p.collect_columns(out)),
            Predicate::Not(p) => p.collect_columns(out),
            Predicate::Const(_) => {}
        }
    }

    /// The same predicate with every column index `c` replaced by `map(c)`.
    pub fn map_columns(&self, map: &impl Fn(usize) -> usize) -> Predicate {
        match self {
            Predicate::Compare { column, op, value } => Predicate::Compare { column: map(*column), op: *op, value: value.clone() },
            Predicate::InList { column, values } => Predicate::InList { column: map(*column), values: values.clone() },
            Predicate::Like { column, pattern } => Predicate::Like { column: map(*column), pattern: pattern.clone() },
            Predicate::IsNull(c) => Predicate::IsNull(map(*c)),
            Predicate::IsNotNull(c) => Predicate::IsNotNull(map(*c)),
            Predicate::Column(c) => Predicate::Column(map(*c)),
            Predicate::CompareColumns { left, op, right } => Predicate::CompareColumns { left: map(*left), op: *op, right: map(*right) },
            Predicate::And(ps) => Predicate::And(ps.iter().map(|p| p.map_columns(map)).collect()),
            Predicate::Or(ps) => Predicate::Or(ps.iter().map(|p| p.map_columns(map)).collect()),
            Predicate::Not(p) => Predicate::Not(Box::new(p.map_columns(map))),
            Predicate::Const(v) => Predicate::Const(*v),
        }
    }

    /// Whether the device can evaluate the predicate on columns of
    /// `schema`'s types (as decoded: a field whose device type differs,
    /// such as a dictionary, is refused when the table is filtered).
    pub fn check(&self, schema: &Schema) -> Result<()> {
        let kinds: Vec<Option<(u32, u32)>> = schema.fields().iter().map(|f| column_kind(f.data_type())).collect();
        Program::compile(self, &|c| kinds.get(c).copied().flatten().ok_or_else(|| unsupported_column(schema, c))).map(|_| ())
    }
}

fn unsupported_column(schema: &Schema, c: usize) -> Error {
    match schema.fields().get(c) {
        Some(f) => Error::Filter(format!("column {} of type {} has no device comparison", f.name(), f.data_type())),
        None => Error::Filter(format!("no column {c}")),
    }
}

// FilterColumnKind (filter.cu).
pub(super) const KIND_INT: u32 = 0;
pub(super) const KIND_UINT: u32 = 1;
pub(super) const KIND_FLOAT: u32 = 2;
pub(super) const KIND_BOOL: u32 = 3;
pub(super) const KIND_STRING: u32 = 4;
pub(super) const KIND_LARGE_STRING: u32 = 5;
pub(super) const KIND_VIEW: u32 = 6;

// FilterOpCode (filter.cu).
const OP_COMPARE: u32 = 0;
const OP_IN: u32 = 1;
const OP_IS_NULL: u32 = 2;
const OP_IS_NOT_NULL: u32 = 3;
const OP_LIKE: u32 = 4;
const OP_BOOL: u32 = 5;
const OP_AND: u32 = 6;
const OP_OR: u32 = 7;
const OP_NOT: u32 = 8;
const OP_CONST: u32 = 9;
const OP_COLUMNS: u32 = 10;

/// The deepest program stack the kernel holds (filter.cu `FILTER_MAX_DEPTH`).
const MAX_DEPTH: usize = 32;

/// The filter kind and value width of a column type, if the device compares it.
pub(super) fn column_kind(t: &DataType) -> Option<(u32, u32)> {
    use DataType as D;
    Some(match t {
        D::Int8 => (KIND_INT, 1),
        D::Int16 => (KIND_INT, 2),
        D::Int32 | D::Date32 | D::Time32(_) | D::Decimal32(..) => (KIND_INT, 4),
        D::Int64 | D::Date64 | D::Time64(_) | D::Timestamp(..) | D::Duration(_) | D::Decimal64(..) => (KIND_INT, 8),
        D::Decimal128(..) => (KIND_INT, 16),
        D::UInt8 => (KIND_UINT, 1),
        D::UInt16 => (KIND_UINT, 2),
        D::UInt32 => (KIND_UINT, 4),
        D::UInt64 => (KIND_UINT, 8),
        D::Float32 => (KIND_FLOAT, 4),
        D::Float64 => (KIND_FLOAT, 8),
        D::Boolean => (KIND_BOOL, 0),
        D::Utf8 | D::Binary => (KIND_STRING, 4),
        D::LargeUtf8 | D::LargeBinary => (KIND_LARGE_STRING, 8),
        D::Utf8View | D::BinaryView => (KIND_VIEW, 16),
        _ => return None,
    })
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FilterColumn {
    values: u64,
    values_len: u64,
    validity: u64,
    validity_len: u64,
    offsets: u64,
    offsets_len: u64,
    data: u64,
    data_len: u64,
    offset: u64,
    kind: u32,
    width: u32,
}

impl FilterColumn {
    /// The kernel's view of `col`'s buffers (kind `u32::MAX` where the
    /// device has no comparison for its type).
    pub(super) fn of(col: &DeviceColumn) -> FilterColumn {
        let (kind, width) = column_kind(&col.device_type).unwrap_or((u32::MAX, 0));
        let (offsets, data) = match kind {
            KIND_VIEW => (None, col.view_data.as_ref()),
            KIND_STRING | KIND_LARGE_STRING => (col.offsets.as_ref(), None),
            _ => (None, None),
        };
        let validity = col.validity.as_ref().filter(|_| col.null_count > 0);
        FilterColumn {
            values: col.values.ptr(),
            values_len: col.values.len(),
            validity: validity.map_or(0, |v| v.ptr()),
            validity_len: validity.map_or(0, |v| v.len()),
            offsets: offsets.map_or(0, |o| o.ptr()),
            offsets_len: offsets.map_or(0, |o| o.len()),
            data: data.map_or(0, |d| d.ptr()),
            data_len: data.map_or(0, |d| d.len()),
            offset: col.offset as u64,
            kind,
            width,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FilterOp {
    code: u32,
    column: u32,
    cmp: u32,
    count: u32,
    literal: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FilterLiteral {
    a: u64,
    b: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FilterProgram {
    ops: u64,
    columns: u64,
    literals: u64,
    pool: u64,
    pool_len: u64,
    rows: u64,
    bits: u64,
    counts: u64,
    allowed: u64,
    allowed_len: u64,
    n_ops: u32,
    n_columns: u32,
    n_literals: u32,
    status: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GatherDesc {
    src: u64,
    src_len: u64,
    src_data: u64,
    src_data_len: u64,
    src_offset: u64,
    rows: u64,
    n: u64,
    dst: u64,
    dst_len: u64,
    dst_data: u64,
    dst_data_len: u64,
    starts: u64,
    lengths: u64,
    unset: u64,
    width: u32,
    status: u32,
}

const _: () = assert!(std::mem::size_of::<FilterColumn>() == 80);
const _: () = assert!(std::mem::size_of::<FilterOp>() == 24);
const _: () = assert!(std::mem::size_of::<FilterProgram>() == 96);
const _: () = assert!(std::mem::size_of::<GatherDesc>() == 120);

/// The index of table column `c` in a program's column table `columns`,
/// added at the end if it is not there yet.
pub(super) fn column_slot(columns: &mut Vec<usize>, c: usize) -> u32 {
    match columns.iter().position(|&x| x == c) {
        Some(i) => i as u32,
        None => {
            columns.push(c);
            (columns.len() - 1) as u32
        }
    }
}

/// A predicate compiled for the kernel: postfix steps over a table of the
/// columns it reads, with its literals.
pub(super) struct Program {
    ops: Vec<FilterOp>,
    literals: Vec<FilterLiteral>,
    pool: Vec<u8>,
    /// Table column of each program column.
    columns: Vec<usize>,
}

impl Program {
    /// Compiles `p`; `kind(c)` gives table column `c`'s filter kind and width.
    fn compile(p: &Predicate, kind: &dyn Fn(usize) -> Result<(u32, u32)>) -> Result<Program> {
        let mut prog = Program { ops: Vec::new(), literals: Vec::new(), pool: Vec::new(), columns: Vec::new() };
        let depth = prog.emit(p, kind)?;
        if depth > MAX_DEPTH {
            return Err(Error::Filter(format!("the predicate needs a stack of {depth}, the kernel holds {MAX_DEPTH}")));
        }
        Ok(prog)
    }

    /// The program column reading table column `c`.
    fn slot(&mut self, c: usize) -> u32 {
        column_slot(&mut self.columns, c)
    }

    fn literal(&mut self, kind: (u32, u32), value: &Literal) -> Result<FilterLiteral> {
        match (kind.0, value) {
            (KIND_INT | KIND_UINT, Literal::Int(v)) => Ok(FilterLiteral { a: (*v >> 64) as i64 as u64, b: *v as u64 }),
            (KIND_FLOAT, Literal::Float(f)) => {
                // -0.0 as 0.0 (the kernel does the same to the column).
                let f = if *f == 0.0 { 0.0 } else { *f };
                let bits = f.to_bits() as i64;
                Ok(FilterLiteral { a: (bits ^ (((bits >> 63) as u64) >> 1) as i64) as u64, b: 0 })
            }
            (KIND_STRING | KIND_LARGE_STRING | KIND_VIEW, Literal::Bytes(b)) => Ok(self.bytes(b)),
            _ => Err(Error::Filter(format!("a literal {value:?} cannot be compared with a column of filter kind {}", kind.0))),
        }
    }

    fn bytes(&mut self, b: &[u8]) -> FilterLiteral {
        let at = self.pool.len() as u64;
        self.pool.extend_from_slice(b);
        FilterLiteral { a: at, b: b.len() as u64 }
    }

    fn push(&mut self, code: u32, column: u32, cmp: u32, count: u32, literal: usize) {
        self.ops.push(FilterOp { code, column, cmp, count, literal: literal as u64 });
    }

    /// Emits `p`; returns the stack depth it needs.
    fn emit(&mut self, p: &Predicate, kind: &dyn Fn(usize) -> Result<(u32, u32)>) -> Result<usize> {
        match p {
            Predicate::Compare { column, op, value } => {
                let k = kind(*column)?;
                let slot = self.slot(*column);
                if k.0 == KIND_BOOL {
                    let Literal::Bool(b) = value else {
                        return Err(Error::Filter(format!("a boolean column compared with {value:?}")));
                    };
                    let negate = match op {
                        CmpOp::Eq => !*b,
                        CmpOp::NotEq => *b,
                        _ => return Err(Error::Filter("booleans compare only with = and <>".into())),
                    };
                    self.push(OP_BOOL, slot, 0, 0, 0);
                    if negate {
                        self.push(OP_NOT, 0, 0, 0, 0);
                    }
                    return Ok(1);
                }
                let lit = self.literal(k, value)?;
                self.literals.push(lit);
                self.push(OP_COMPARE, slot, op.code(), 1, self.literals.len() - 1);
                Ok(1)
            }
            Predicate::InList { column, values } => {
                let k = kind(*column)?;
                if k.0 == KIND_BOOL {
                    return Err(Error::Filter("IN lists of booleans".into()));
                }
                let slot = self.slot(*column);
                let first = self.literals.len();
                for v in values {
                    let lit = self.literal(k, v)?;
                    self.literals.push(lit);
                }
                let count = u32::try_from(values.len()).map_err(|_| Error::Filter("IN list too long".into()))?;
                self.push(OP_IN, slot, 0, count, first);
                Ok(1)
            }
            Predicate::IsNull(c) | Predicate::IsNotNull(c) => {
                kind(*c)?;
                let slot = self.slot(*c);
                let code = if matches!(p, Predicate::IsNull(_)) { OP_IS_NULL } else { OP_IS_NOT_NULL };
                self.push(code, slot, 0, 0, 0);
                Ok(1)
            }
            Predicate::Like { column, pattern } => {
                let k = kind(*column)?;
                if !matches!(k.0, KIND_STRING | KIND_LARGE_STRING | KIND_VIEW) {
                    return Err(Error::Filter("LIKE on a column that is not a string".into()));
                }
                if pattern.iter().any(|&b| b == b'_' || b == b'\\') {
                    return Err(Error::Filter("LIKE patterns with `_` or escapes".into()));
                }
                let slot = self.slot(*column);
                let anchors = u32::from(pattern.first() != Some(&b'%')) | (u32::from(pattern.last() != Some(&b'%')) << 1);
                let segments: Vec<&[u8]> = if pattern.is_empty() {
                    vec![&[][..]]
                } else {
                    pattern.split(|&b| b == b'%').filter(|s| !s.is_empty()).collect()
                };
                // A pattern of only `%`: every non-null value.
                let (segments, anchors) = if segments.is_empty() { (Vec::new(), 0) } else { (segments, anchors) };
                let first = self.literals.len();
                for s in &segments {
                    let lit = self.bytes(s);
                    self.literals.push(lit);
                }
                self.push(OP_LIKE, slot, anchors, segments.len() as u32, first);
                Ok(1)
            }
            Predicate::CompareColumns { left, op, right } => {
                let (a, b) = (kind(*left)?.0, kind(*right)?.0);
                let numbers = |k| matches!(k, KIND_INT | KIND_UINT);
                let strings = |k| matches!(k, KIND_STRING | KIND_LARGE_STRING | KIND_VIEW);
                let comparable = (numbers(a) && numbers(b)) || (a == KIND_FLOAT && b == KIND_FLOAT) || (strings(a) && strings(b));
                if !comparable {
                    return Err(Error::Filter(format!("columns of filter kinds {a} and {b} do not compare on the device")));
                }
                let (l, r) = (self.slot(*left), self.slot(*right));
                self.push(OP_COLUMNS, l, op.code(), 0, r as usize);
                Ok(1)
            }
            Predicate::Column(c) => {
                if kind(*c)?.0 != KIND_BOOL {
                    return Err(Error::Filter("a column used as a condition is not boolean".into()));
                }
                let slot = self.slot(*c);
                self.push(OP_BOOL, slot, 0, 0, 0);
                Ok(1)
            }
            Predicate::And(ps) | Predicate::Or(ps) => {
                let code = if matches!(p, Predicate::And(_)) { OP_AND } else { OP_OR };
                let Some((head, rest)) = ps.split_first() else {
                    // The empty conjunction is TRUE, the empty disjunction FALSE.
                    self.push(OP_CONST, 0, u32::from(code == OP_AND), 0, 0);
                    return Ok(1);
                };
                let mut depth = self.emit(head, kind)?;
                for q in rest {
                    depth = depth.max(1 + self.emit(q, kind)?);
                    self.push(code, 0, 0, 0, 0);
                }
                Ok(depth)
            }
            Predicate::Not(q) => {
                let depth = self.emit(q, kind)?;
                self.push(OP_NOT, 0, 0, 0, 0);
                Ok(depth)
            }
            Predicate::Const(v) => {
                self.push(OP_CONST, 0, v.map_or(2, u32::from), 0, 0);
                Ok(1)
            }
        }
    }
}

/// Threads per block of the filter and gather kernels (whole warps).
pub(super) const BLOCK: u32 = 256;
/// Threads per block of the scan kernels (scan.cu `SCAN_TILE`).
const SCAN_TILE: u64 = 1024;
/// Most blocks of one grid-stride launch.
const MAX_BLOCKS: u64 = 65_535;

pub(super) fn grid_for(threads: u64) -> u32 {
    threads.div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32
}

/// Bytes of `n` items of `size` bytes, checked.
pub(super) fn bytes_of(n: u64, size: u64) -> Result<u64> {
    n.checked_mul(size).ok_or_else(|| Error::Internal("filter buffer size overflow".into()))
}

/// Packs host tables into one upload, each at a 16-byte aligned offset.
#[derive(Default)]
pub(super) struct Upload {
    pub(super) bytes: Vec<u8>,
}

impl Upload {
    pub(super) fn put(&mut self, data: &[u8]) -> u64 {
        let at = self.bytes.len().next_multiple_of(16);
        self.bytes.resize(at, 0);
        self.bytes.extend_from_slice(data);
        at as u64
    }
}

/// Runs filters and gathers on one stream.
pub(super) struct Filtering<'a> {
    pub(super) stream: &'a Arc<GpuStream>,
    pub(super) kernels: Arc<Kernels>,
}

impl Filtering<'_> {
    /// Replaces `values` (n u64, device) with their exclusive prefix sums;
    /// returns their total.
    fn exclusive_scan(&self, values: &DeviceBuffer, n: u64) -> Result<u64> {
        let tiles = n.div_ceil(SCAN_TILE).max(1);
        let sums = DeviceBuffer::alloc(self.stream, bytes_of(tiles, 8)?, "filter scan sums")?;
        let total = DeviceBuffer::alloc(self.stream, 8, "filter scan total")?;
        let grid = u32::try_from(tiles).map_err(|_| Error::Filter(format!("{n} values are too many to scan")))?;
        let mut args = KernelArgs::new().arg(values.ptr()).arg(n).arg(sums.ptr());
        // SAFETY: arguments match gpq_scan_tile_sums; `sums` holds one u64 per tile.
        unsafe { self.kernels.launch(Kernel::ScanTileSums, grid, SCAN_TILE as u32, 0, self.stream, &mut args)? };
        let mut args = KernelArgs::new().arg(sums.ptr()).arg(tiles).arg(total.ptr());
        // SAFETY: arguments match gpq_scan_tile_bases; one block.
        unsafe { self.kernels.launch(Kernel::ScanTileBases, 1, SCAN_TILE as u32, 0, self.stream, &mut args)? };
        let mut args = KernelArgs::new().arg(values.ptr()).arg(n).arg(sums.ptr()).arg(values.ptr());
        // SAFETY: arguments match gpq_scan_apply; in place.
        unsafe { self.kernels.launch(Kernel::ScanApply, grid, SCAN_TILE as u32, 0, self.stream, &mut args)? };
        let host: Vec<u64> = from_bytes(&total.to_host()?);
        Ok(host[0])
    }

    /// Runs one gather kernel on `desc`; returns the descriptor as it ended
    /// (its status and counters).
    fn gather(&self, kernel: Kernel, desc: GatherDesc, threads: u64) -> Result<GatherDesc> {
        let d = DeviceBuffer::from_host(self.stream, as_bytes(&[desc]), "gather descriptor")?;
        let mut args = KernelArgs::new().arg(d.ptr());
        // SAFETY: arguments match the gather kernels; the descriptor's buffers are alive and sized as it says.
        unsafe { self.kernels.launch(kernel, grid_for(threads), BLOCK, 0, self.stream, &mut args)? };
        let done: Vec<GatherDesc> = from_bytes(&d.to_host()?);
        if done[0].status != 0 {
            return Err(Error::Internal(format!("a device gather read outside a column's buffers ({kernel:?})")));
        }
        Ok(done[0])
    }

    /// Column `c`'s rows listed in `rows` (m of them), in fresh buffers.
    fn gather_column(&self, c: &DeviceColumn, rows: &DeviceBuffer, m: u64) -> Result<DeviceColumn> {
        if c.is_nested() {
            return Err(Error::Filter(format!("column {} is nested; the device gathers flat columns only", c.field.name())));
        }
        let base = GatherDesc { src_offset: c.offset as u64, rows: rows.ptr(), n: m, ..Default::default() };
        let validity = match (&c.validity, c.null_count) {
            (Some(v), k) if k > 0 => {
                let out = DeviceBuffer::alloc(self.stream, bytes_of(m.div_ceil(32), 4)?, "filtered validity")?;
                let desc = GatherDesc { src: v.ptr(), src_len: v.len(), dst: out.ptr(), dst_len: out.len(), ..base };
                let done = if m > 0 { self.gather(Kernel::GatherBits, desc, m.div_ceil(32) * 32)? } else { desc };
                Some((out, done.unset as usize))
            }
            _ => None,
        };
        let null_count = validity.as_ref().map_or(0, |(_, n)| *n);
        let mut out = DeviceColumn {
            field: c.field.clone(),
            device_type: c.device_type.clone(),
            offset: 0,
            len: m as usize,
            null_count,
            validity: validity.map(|(v, _)| v),
            offsets: None,
            values: DeviceBuffer::alloc(self.stream, 0, "filtered values")?,
            view_data: None,
            children: Vec::new(),
        };
        match &c.device_type {
            DataType::Null => {}
            DataType::Boolean => {
                let values = DeviceBuffer::alloc(self.stream, bytes_of(m.div_ceil(32), 4)?, "filtered booleans")?;
                let desc = GatherDesc { src: c.values.ptr(), src_len: c.values.len(), dst: values.ptr(), dst_len: values.len(), ..base };
                if m > 0 {
                    self.gather(Kernel::GatherBits, desc, m.div_ceil(32) * 32)?;
                }
                out.values = values;
            }
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary | DataType::Utf8View | DataType::BinaryView => {
                self.gather_strings(c, &base, &mut out)?;
            }
            t => {
                let width = t.primitive_width().or(match t {
                    DataType::FixedSizeBinary(w) => usize::try_from(*w).ok(),
                    _ => None,
                });
                let Some(width) = width.filter(|&w| w > 0) else {
                    return Err(Error::Filter(format!("column {} of device type {t} cannot be gathered", c.field.name())));
                };
                let values = DeviceBuffer::alloc(self.stream, bytes_of(m, width as u64)?, "filtered values")?;
                let desc = GatherDesc {
                    src: c.values.ptr(),
                    src_len: c.values.len(),
                    dst: values.ptr(),
                    dst_len: values.len(),
                    width: width as u32,
                    ..base
                };
                if m > 0 {
                    self.gather(Kernel::GatherFixed, desc, m)?;
                }
                out.values = values;
            }
        }
        Ok(out)
    }

    /// Strings and binary (offsets and characters) or views (views and
    /// their long values' characters).
    fn gather_strings(&self, c: &DeviceColumn, base: &GatherDesc, out: &mut DeviceColumn) -> Result<()> {
        let m = base.n;
        let view = matches!(c.device_type, DataType::Utf8View | DataType::BinaryView);
        let width: u64 = if view { 16 } else if matches!(c.device_type, DataType::LargeUtf8 | DataType::LargeBinary) { 8 } else { 4 };
        let (src, src_data) = if view {
            let data = c.view_data.as_ref().ok_or_else(|| Error::Internal(format!("{}: views without data", c.field.name())))?;
            (&c.values, data)
        } else {
            let offsets = c.offsets.as_ref().ok_or_else(|| Error::Internal(format!("{}: strings without offsets", c.field.name())))?;
            (offsets, &c.values)
        };
        let desc = GatherDesc {
            src: src.ptr(),
            src_len: src.len(),
            src_data: src_data.ptr(),
            src_data_len: src_data.len(),
            width: width as u32,
            ..*base
        };
        let dst = DeviceBuffer::alloc(self.stream, bytes_of(if view { m } else { m + 1 }, width)?, "filtered offsets")?;
        if m == 0 {
            dst.fill(self.stream, 0)?;
            let data = DeviceBuffer::alloc(self.stream, 0, "filtered characters")?;
            self.place(out, view, dst, data);
            return Ok(());
        }
        let lengths = DeviceBuffer::alloc(self.stream, bytes_of(m, 8)?, "filtered string lengths")?;
        self.gather(Kernel::GatherLengths, GatherDesc { lengths: lengths.ptr(), ..desc }, m)?;
        let total = self.exclusive_scan(&lengths, m)?;
        if !view && width == 4 && total > i32::MAX as u64 {
            return Err(Error::Internal(format!("{}: kept strings hold more bytes than their source", c.field.name())));
        }
        // After the scan `lengths` holds each value's start; the lengths are gathered again beside it.
        let again = DeviceBuffer::alloc(self.stream, bytes_of(m, 8)?, "filtered string lengths")?;
        self.gather(Kernel::GatherLengths, GatherDesc { lengths: again.ptr(), ..desc }, m)?;
        let data = DeviceBuffer::alloc(self.stream, total, "filtered characters")?;
        let copy = GatherDesc {
            dst: dst.ptr(),
            dst_len: dst.len(),
            dst_data: data.ptr(),
            dst_data_len: data.len(),
            starts: lengths.ptr(),
            lengths: again.ptr(),
            ..desc
        };
        self.gather(Kernel::GatherStrings, copy, m.saturating_mul(32))?;
        self.place(out, view, dst, data);
        Ok(())
    }

    fn place(&self, out: &mut DeviceColumn, view: bool, dst: DeviceBuffer, data: DeviceBuffer) {
        if view {
            out.values = dst;
            out.view_data = Some(data);
        } else {
            out.offsets = Some(dst);
            out.values = data;
        }
    }
}

impl DeviceTable {
    /// The rows where `predicate` is TRUE, every column kept. See
    /// [`DeviceTable::filter_columns`].
    pub fn filter(&self, predicate: &Predicate) -> Result<DeviceTable> {
        let all: Vec<usize> = (0..self.columns.len()).collect();
        self.filter_columns(predicate, &all)
    }

    /// The rows where `predicate` (over this table's columns, by index) is
    /// TRUE, of the columns `keep` (by index, in that order): a new table
    /// whose buffers hold only those rows, so that a copy to the host moves
    /// nothing else. The result's statistics are this table's, with
    /// [`ReadStats::filter`](crate::ReadStats::filter) set.
    ///
    /// [`Error::Filter`] when the device cannot evaluate the predicate on
    /// these columns or gather one of `keep` (a nested column); nothing is
    /// changed then, and the caller can filter a host copy instead.
    pub fn filter_columns(&self, predicate: &Predicate, keep: &[usize]) -> Result<DeviceTable> {
        self.filter_columns_within(predicate, keep, None)
    }

    /// [`DeviceTable::filter_columns`], keeping only rows inside `within`
    /// (ranges of row numbers; `None`: any row), such as the rows a row
    /// selection keeps of a span read whole.
    pub fn filter_columns_within(&self, predicate: &Predicate, keep: &[usize], within: Option<&[std::ops::Range<usize>]>) -> Result<DeviceTable> {
        let t0 = Instant::now();
        let program = self.program(predicate)?;
        let allowed = within.map(|ranges| ranges_bitmap(ranges, self.num_rows));
        self.gather_kept(&program, keep, allowed.as_deref(), t0)
    }

    /// Where `predicate` is TRUE, as a host bitmap of this table's rows
    /// (only rows inside `within`, if given, can be set): the first step of
    /// late materialization, which decodes a filter's columns, learns which
    /// rows survive, and then decodes the other columns only where some do
    /// (see [`DeviceTable::take_rows`]). One bit per row crosses the bus.
    ///
    /// [`Error::Filter`] as for [`DeviceTable::filter_columns`].
    pub fn filter_mask(&self, predicate: &Predicate, within: Option<&[std::ops::Range<usize>]>) -> Result<BooleanBuffer> {
        let program = self.program(predicate)?;
        let allowed = within.map(|ranges| ranges_bitmap(ranges, self.num_rows));
        let n = self.num_rows as u64;
        if n == 0 {
            return Ok(BooleanBuffer::new_unset(0));
        }
        let ctx = self.filter_context()?;
        let _bound = ctx.bind_scoped()?;
        let stream = ctx.new_stream()?;
        let f = Filtering { stream: &stream, kernels: Kernels::for_context(&ctx)? };
        let (bits, _, _) = f.evaluate(self, &program, n, allowed.as_deref())?;
        let host = bits.to_host()?;
        Ok(BooleanBuffer::new(Buffer::from_vec(host), 0, self.num_rows))
    }

    /// The rows whose bit in `mask` (one per row of this table, such as a
    /// [`DeviceTable::filter_mask`] of another read of the same rows) is
    /// set, of the columns `keep` (by index, in that order), in fresh
    /// buffers. The result's statistics are this table's, with
    /// [`ReadStats::filter`](crate::ReadStats::filter) set.
    ///
    /// [`Error::InvalidOptions`] when the mask's length is not the table's
    /// row count; [`Error::Filter`] when a column of `keep` cannot be
    /// gathered on the device (a nested one).
    pub fn take_rows(&self, mask: &BooleanBuffer, keep: &[usize]) -> Result<DeviceTable> {
        let t0 = Instant::now();
        if mask.len() != self.num_rows {
            return Err(Error::InvalidOptions(format!("a mask of {} rows for a table of {}", mask.len(), self.num_rows)));
        }
        let program = Program::compile(&Predicate::Const(Some(true)), &|c| Err(Error::Filter(format!("no column {c} in a constant"))))?;
        let bits = mask.sliced();
        self.gather_kept(&program, keep, Some(bits.as_slice()), t0)
    }

    /// `predicate` compiled against this table's columns.
    pub(super) fn program(&self, predicate: &Predicate) -> Result<Program> {
        Program::compile(predicate, &|c| {
            let col = self.columns.get(c).ok_or_else(|| Error::Filter(format!("no column {c}")))?;
            if col.is_nested() || col.device_type != *col.field.data_type() {
                return Err(Error::Filter(format!(
                    "column {} is decoded as {} for a field of type {}",
                    col.field.name(),
                    col.device_type,
                    col.field.data_type()
                )));
            }
            column_kind(&col.device_type).ok_or_else(|| Error::Filter(format!("column {} of type {} has no device comparison", col.field.name(), col.device_type)))
        })
    }

    /// The context of the table's buffers.
    fn filter_context(&self) -> Result<Arc<crate::cuda::GpuContext>> {
        self.context().ok_or_else(|| Error::Filter("a table without columns".into()))
    }

    /// The rows where `program` is TRUE and `allowed` (a bitmap of the
    /// table's rows, if given) is set, of the columns `keep`.
    fn gather_kept(&self, program: &Program, keep: &[usize], allowed: Option<&[u8]>, t0: Instant) -> Result<DeviceTable> {
        let kept_columns: Vec<&DeviceColumn> = keep
            .iter()
            .map(|&c| self.columns.get(c).ok_or_else(|| Error::Filter(format!("no column {c} to keep"))))
            .collect::<Result<_>>()?;
        if let Some(c) = kept_columns.iter().find(|c| c.is_nested()) {
            return Err(Error::Filter(format!("column {} is nested; the device gathers flat columns only", c.field.name())));
        }
        let fields: Vec<_> = keep.iter().map(|&c| self.schema.field(c).clone()).collect();
        let schema = Arc::new(Schema::new_with_metadata(fields, self.schema.metadata().clone()));
        let n = self.num_rows as u64;
        let mut stats = self.stats.clone();
        let ctx = self.filter_context()?;
        let _bound = ctx.bind_scoped()?;
        let stream = ctx.new_stream()?;
        let f = Filtering { stream: &stream, kernels: Kernels::for_context(&ctx)? };
        let rows = if n == 0 { DeviceBuffer::alloc(&stream, 0, "filter rows")? } else { f.kept_rows(self, program, n, allowed)? };
        let m = rows.len() / 4;
        let columns = kept_columns.iter().map(|c| f.gather_column(c, &rows, m)).collect::<Result<Vec<_>>>()?;
        stream.synchronize()?;
        stats.filter = Some(FilterStats { rows_in: self.num_rows, rows_out: m as usize, time: t0.elapsed() });
        Ok(DeviceTable::new(schema, columns, m as usize, stats))
    }
}

/// A bitmap of `n` rows with the rows inside `ranges` set.
pub(super) fn ranges_bitmap(ranges: &[std::ops::Range<usize>], n: usize) -> Vec<u8> {
    let mut bitmap = vec![0u8; n.div_ceil(8)];
    for r in ranges {
        for i in r.start.min(n)..r.end.min(n) {
            bitmap[i / 8] |= 1 << (i % 8);
        }
    }
    bitmap
}

impl Filtering<'_> {
    /// Evaluates `program` over the table's `n` rows: the kept rows' numbers
    /// (u32, in order) in a buffer of exactly their count.
    fn kept_rows(&self, table: &DeviceTable, program: &Program, n: u64, allowed: Option<&[u8]>) -> Result<DeviceBuffer> {
        let (bits, counts, words) = self.evaluate(table, program, n, allowed)?;
        let m = self.exclusive_scan(&counts, words)?;
        let rows = DeviceBuffer::alloc(self.stream, bytes_of(m, 4)?, "filter rows")?;
        let status = DeviceBuffer::from_host(self.stream, &[0u8; 4], "filter status")?;
        if m > 0 {
            let mut args = KernelArgs::new().arg(bits.ptr()).arg(counts.ptr()).arg(words).arg(rows.ptr()).arg(m).arg(status.ptr());
            // SAFETY: arguments match gpq_filter_rows; `rows` holds m u32, `counts` now the words' bases.
            unsafe { self.kernels.launch(Kernel::FilterRows, grid_for(words), BLOCK, 0, self.stream, &mut args)? };
            let s: Vec<u32> = from_bytes(&status.to_host()?);
            if s[0] != 0 {
                return Err(Error::Internal("the device filter listed more rows than it counted".into()));
            }
        }
        Ok(rows)
    }

    /// Evaluates `program` over the table's `n` rows: the bitmap of the
    /// kept rows (u32 words), each word's count of them (u64), and the
    /// number of words.
    pub(super) fn evaluate(&self, table: &DeviceTable, program: &Program, n: u64, allowed: Option<&[u8]>) -> Result<(DeviceBuffer, DeviceBuffer, u64)> {
        if n > u32::MAX as u64 {
            return Err(Error::Filter(format!("{n} rows are more than a device filter takes at once (2^32)")));
        }
        let words = n.div_ceil(32);
        let bits = DeviceBuffer::alloc(self.stream, bytes_of(words, 4)?, "filter bitmap")?;
        let counts = DeviceBuffer::alloc(self.stream, bytes_of(words, 8)?, "filter counts")?;
        let columns: Vec<FilterColumn> = program.columns.iter().map(|&c| FilterColumn::of(&table.columns[c])).collect();
        // One upload: the program header first, then its tables.
        let mut up = Upload::default();
        let header_len = std::mem::size_of::<FilterProgram>();
        up.put(&vec![0u8; header_len]);
        let ops_at = up.put(as_bytes(&program.ops));
        let columns_at = up.put(as_bytes(&columns));
        let literals_at = up.put(as_bytes(&program.literals));
        let pool_at = up.put(&program.pool);
        let allowed_at = allowed.map(|a| up.put(a));
        // The addresses are known only once the upload has one; place the
        // tables first, then write the header that points into them.
        let d = DeviceBuffer::from_host(self.stream, &up.bytes, "filter program")?;
        let header = FilterProgram {
            ops: d.ptr() + ops_at,
            columns: d.ptr() + columns_at,
            literals: d.ptr() + literals_at,
            pool: d.ptr() + pool_at,
            pool_len: program.pool.len() as u64,
            rows: n,
            bits: bits.ptr(),
            counts: counts.ptr(),
            allowed: allowed_at.map_or(0, |at| d.ptr() + at),
            allowed_len: allowed.map_or(0, |a| a.len() as u64),
            n_ops: program.ops.len() as u32,
            n_columns: program.columns.len() as u32,
            n_literals: program.literals.len() as u32,
            status: 0,
        };
        let h = DeviceBuffer::from_host(self.stream, as_bytes(&[header]), "filter program header")?;
        let mut args = KernelArgs::new().arg(h.ptr());
        // SAFETY: arguments match gpq_filter_eval; the program's tables are in `d`, alive until the end.
        unsafe { self.kernels.launch(Kernel::FilterEval, grid_for(words * 32), BLOCK, 0, self.stream, &mut args)? };
        let done: Vec<FilterProgram> = from_bytes(&h.to_host()?);
        if done[0].status != 0 {
            return Err(Error::Internal("the device filter read outside a column's buffers".into()));
        }
        drop(d);
        Ok((bits, counts, words))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;

    fn no_kinds(_: usize) -> Result<(u32, u32)> {
        Ok((KIND_INT, 8))
    }

    #[test]
    fn and_or_chains_need_one_more_slot_than_their_deepest_part() {
        let leaf = |c| Predicate::IsNull(c);
        let p = Predicate::And(vec![leaf(0), Predicate::Or(vec![leaf(1), leaf(2)]), leaf(3)]);
        let prog = Program::compile(&p, &no_kinds).unwrap();
        let codes: Vec<u32> = prog.ops.iter().map(|o| o.code).collect();
        assert_eq!(codes, vec![OP_IS_NULL, OP_IS_NULL, OP_IS_NULL, OP_OR, OP_AND, OP_IS_NULL, OP_AND]);
        assert_eq!(prog.columns, vec![0, 1, 2, 3]);
        // 33 nested right-leaning ORs need a stack of 34: refused.
        let mut deep = leaf(0);
        for _ in 0..33 {
            deep = Predicate::Or(vec![leaf(0), deep]);
        }
        assert!(matches!(Program::compile(&deep, &no_kinds), Err(Error::Filter(_))));
    }

    #[test]
    fn like_patterns_become_anchored_segments() {
        let kind = |_| Ok((KIND_STRING, 4));
        let like = |p: &str| {
            let prog = Program::compile(&Predicate::Like { column: 0, pattern: p.as_bytes().to_vec() }, &kind).unwrap();
            let segs: Vec<String> = prog
                .literals
                .iter()
                .map(|l| String::from_utf8(prog.pool[l.a as usize..(l.a + l.b) as usize].to_vec()).unwrap())
                .collect();
            (prog.ops[0].cmp, segs)
        };
        assert_eq!(like("PROMO%"), (1, vec!["PROMO".to_string()]));
        assert_eq!(like("%BRASS"), (2, vec!["BRASS".to_string()]));
        assert_eq!(like("%special%requests%"), (0, vec!["special".to_string(), "requests".to_string()]));
        assert_eq!(like("a%%b"), (3, vec!["a".to_string(), "b".to_string()]));
        assert_eq!(like("%"), (0, vec![]));
        assert_eq!(like(""), (3, vec![String::new()]));
        assert!(Program::compile(&Predicate::Like { column: 0, pattern: b"a_c".to_vec() }, &kind).is_err());
    }

    #[test]
    fn literals_must_match_the_column() {
        let schema = Schema::new(vec![
            Field::new("i", DataType::Int32, true),
            Field::new("f", DataType::Float64, true),
            Field::new("s", DataType::Utf8View, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("d", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
        ]);
        let cmp = |column, value| Predicate::Compare { column, op: CmpOp::Lt, value };
        assert!(cmp(0, Literal::Int(3)).check(&schema).is_ok());
        assert!(cmp(0, Literal::Float(3.0)).check(&schema).is_err());
        assert!(cmp(1, Literal::Float(3.0)).check(&schema).is_ok());
        assert!(cmp(2, Literal::Bytes(b"x".to_vec())).check(&schema).is_ok());
        assert!(cmp(3, Literal::Bool(true)).check(&schema).is_err());
        assert!(Predicate::Compare { column: 3, op: CmpOp::Eq, value: Literal::Bool(false) }.check(&schema).is_ok());
        assert!(Predicate::IsNull(4).check(&schema).is_err());
        assert!(Predicate::IsNull(9).check(&schema).is_err());
    }

    #[test]
    fn float_keys_order_as_total_cmp_with_equal_zeros() {
        let kind = |_| Ok((KIND_FLOAT, 8));
        let key = |f: f64| {
            let p = Program::compile(&Predicate::Compare { column: 0, op: CmpOp::Eq, value: Literal::Float(f) }, &kind).unwrap();
            p.literals[0].a as i64
        };
        let values = [f64::NEG_INFINITY, -1.5, -1e-300, 0.0, 1e-300, 2.0, f64::INFINITY, f64::NAN];
        for w in values.windows(2) {
            assert_eq!(key(w[0]).cmp(&key(w[1])), w[0].total_cmp(&w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(key(-0.0), key(0.0));
    }

    #[test]
    fn descriptors_match_the_cuda_source() {
        let filter = include_str!("../gpu/kernels/filter.cu");
        for (name, value) in [
            ("FILTER_INT", KIND_INT),
            ("FILTER_UINT", KIND_UINT),
            ("FILTER_FLOAT", KIND_FLOAT),
            ("FILTER_BOOL", KIND_BOOL),
            ("FILTER_STRING", KIND_STRING),
            ("FILTER_LARGE_STRING", KIND_LARGE_STRING),
            ("FILTER_VIEW", KIND_VIEW),
            ("FILTER_OP_COMPARE", OP_COMPARE),
            ("FILTER_OP_IN", OP_IN),
            ("FILTER_OP_IS_NULL", OP_IS_NULL),
            ("FILTER_OP_IS_NOT_NULL", OP_IS_NOT_NULL),
            ("FILTER_OP_LIKE", OP_LIKE),
            ("FILTER_OP_BOOL", OP_BOOL),
            ("FILTER_OP_AND", OP_AND),
            ("FILTER_OP_OR", OP_OR),
            ("FILTER_OP_NOT", OP_NOT),
            ("FILTER_OP_CONST", OP_CONST),
            ("FILTER_OP_COLUMNS", OP_COLUMNS),
            ("FILTER_MAX_DEPTH", MAX_DEPTH as u32),
        ] {
            let line = filter
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} =")) || l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not in filter.cu"));
            let number: String = line.split(['=', ' ']).filter(|s| !s.is_empty()).nth(if line.starts_with("#define") { 2 } else { 1 }).unwrap().chars().filter(char::is_ascii_digit).collect();
            assert_eq!(number.parse::<u32>().unwrap(), value, "{name}");
        }
        for (op, code) in [(CmpOp::Eq, "FILTER_EQ"), (CmpOp::NotEq, "FILTER_NE"), (CmpOp::Lt, "FILTER_LT"), (CmpOp::LtEq, "FILTER_LE"), (CmpOp::Gt, "FILTER_GT"), (CmpOp::GtEq, "FILTER_GE")] {
            assert!(filter.contains(&format!("{code} = {},", op.code())), "{code}");
        }
        let scan = include_str!("../gpu/kernels/scan.cu");
        assert!(scan.contains(&format!("#define SCAN_TILE {SCAN_TILE}")));
    }
}
