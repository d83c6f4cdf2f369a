//! Grouped aggregation on the device: a [`GroupBy`] over a table's columns
//! gives, per group, the partial states a query engine merges later (a
//! count, an exact sum, a minimum, a maximum), so that one row per
//! group crosses the bus instead of every row. DataFusion's provider uses it
//! for its partial aggregations over a GPU scan (`AVG` is a count and a sum).
//!
//! Like the filters, the work is not a kernel per query: the grouping
//! columns and each aggregate's input program ([`ValueExpr`]: integer and
//! decimal columns, constants, `+ - *`, scaling by powers of ten and range
//! checks, in exact 128-bit arithmetic) are interpreted by one prebuilt
//! kernel (`aggregate.cu`). Nothing is approximated: a grouping value wider
//! than its share of the kernel's 63-bit key, an input that overflows or
//! leaves a range the caller set (where its engine would wrap or fail), or
//! more groups than [`GroupBy::capacity`] make the call an
//! [`Error::Aggregate`], and the caller aggregates those rows on the host.
//!
//! Groups come back in no particular order; a group's key columns are
//! arrays of the grouping columns' device types.

use std::time::{Duration, Instant};

use arrow::array::{ArrayData, ArrayRef, make_array};
use arrow::buffer::{Buffer, NullBuffer};
use arrow::datatypes::{DataType, i256};

use super::DeviceTable;
use super::filter::{BLOCK, FilterColumn, Filtering, Predicate, column_slot, KIND_INT, KIND_LARGE_STRING, KIND_STRING, KIND_UINT, KIND_VIEW, Upload, bytes_of, column_kind, ranges_bitmap};
use crate::cuda::{DeviceBuffer, as_bytes, from_bytes};
use crate::error::{Error, Result};
use crate::gpu::{Kernel, KernelArgs, Kernels};

/// An aggregate's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    /// Rows (`COUNT(*)`); takes no input.
    CountRows,
    /// Rows whose input is not NULL.
    Count,
    /// The exact sum of the non-NULL inputs (192 bits wide, so no batch
    /// overflows it), and their count.
    Sum,
    /// The least non-NULL input (which must fit an `i64`), and the count.
    Min,
    /// The greatest non-NULL input (which must fit an `i64`), and the count.
    Max,
}

/// An aggregate's input: a value per row, NULL where a column it reads is.
/// Integers and decimals are their unscaled values; the caller keeps track
/// of scales and inserts the [`ValueExpr::Scale`] steps its engine would.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueExpr {
    /// An integer, decimal, date, time, timestamp or duration column, by
    /// index among the table's columns.
    Column(usize),
    /// A constant; `None` is NULL.
    Literal(Option<i128>),
    /// `a + b`.
    Add(Box<ValueExpr>, Box<ValueExpr>),
    /// `a - b`.
    Sub(Box<ValueExpr>, Box<ValueExpr>),
    /// `a * b`.
    Mul(Box<ValueExpr>, Box<ValueExpr>),
    /// `a * 10^k`, `k <= 38`.
    Scale(Box<ValueExpr>, u32),
    /// `a`, which must fit a signed integer of `bits` bits (1 to 127).
    FitSigned(Box<ValueExpr>, u32),
    /// `a`, which must fit an unsigned integer of `bits` bits (1 to 126).
    FitUnsigned(Box<ValueExpr>, u32),
    /// `a`, whose magnitude must be below `10^digits` (`digits <= 38`).
    FitDigits(Box<ValueExpr>, u32),
}

impl ValueExpr {
    /// The same input with every column index `c` replaced by `map(c)`.
    pub fn map_columns(&self, map: &impl Fn(usize) -> usize) -> ValueExpr {
        let m = |x: &ValueExpr| Box::new(x.map_columns(map));
        match self {
            ValueExpr::Column(c) => ValueExpr::Column(map(*c)),
            ValueExpr::Literal(v) => ValueExpr::Literal(*v),
            ValueExpr::Add(a, b) => ValueExpr::Add(m(a), m(b)),
            ValueExpr::Sub(a, b) => ValueExpr::Sub(m(a), m(b)),
            ValueExpr::Mul(a, b) => ValueExpr::Mul(m(a), m(b)),
            ValueExpr::Scale(a, k) => ValueExpr::Scale(m(a), *k),
            ValueExpr::FitSigned(a, k) => ValueExpr::FitSigned(m(a), *k),
            ValueExpr::FitUnsigned(a, k) => ValueExpr::FitUnsigned(m(a), *k),
            ValueExpr::FitDigits(a, k) => ValueExpr::FitDigits(m(a), *k),
        }
    }
}

/// One aggregate: its function and input (`None` only for
/// [`AggregateFunction::CountRows`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// The function.
    pub function: AggregateFunction,
    /// Its input.
    pub input: Option<ValueExpr>,
}

/// A grouped aggregation: group by `keys` (columns by index; none: one
/// group of every row), computing `aggregates`.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupBy {
    /// Grouping columns: integers, dates, times, timestamps, decimals
    /// (whose values fit their share of the key) and strings or binary
    /// (short enough to fit it).
    pub keys: Vec<usize>,
    /// The aggregates, at most [`GroupBy::MAX_AGGREGATES`].
    pub aggregates: Vec<Aggregate>,
    /// Most groups one call may find (rounded up to a power of two); more
    /// is an [`Error::Aggregate`]. The device table starts at
    /// [`GroupBy::FIRST_TABLE`] slots (or this, if less) and is made 16
    /// times larger, and the rows aggregated again, each time it fills,
    /// up to this: a few groups cost a small table to clear and copy back.
    pub capacity: usize,
}

impl GroupBy {
    /// The same aggregation with every column index `c` (keys and inputs)
    /// replaced by `map(c)`.
    pub fn map_columns(&self, map: &impl Fn(usize) -> usize) -> GroupBy {
        GroupBy {
            keys: self.keys.iter().map(|&c| map(c)).collect(),
            aggregates: self.aggregates.iter().map(|a| Aggregate { function: a.function, input: a.input.as_ref().map(|e| e.map_columns(map)) }).collect(),
            capacity: self.capacity,
        }
    }

    /// Most aggregates per call (`aggregate.cu` `AGG_MAX_FUNCS`).
    pub const MAX_AGGREGATES: usize = 8;
    /// The default [`GroupBy::capacity`].
    pub const DEFAULT_CAPACITY: usize = 4096;
    /// Slots of the first device table.
    pub const FIRST_TABLE: usize = 4096;
    /// The largest [`GroupBy::capacity`].
    pub const MAX_CAPACITY: usize = 1 << 20;
}

/// One aggregate's partial state per group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AggregateState {
    /// Rows counted: every row for [`AggregateFunction::CountRows`],
    /// otherwise the rows whose input was not NULL.
    pub counts: Vec<u64>,
    /// The sum, minimum or maximum (0 where the count is 0, and for the
    /// counting functions).
    pub values: Vec<i256>,
}

/// The groups a [`DeviceTable::aggregate`] found.
#[derive(Debug, Clone)]
pub struct Groups {
    /// Per grouping column, its value in each group (the column's device
    /// type; NULL is a group of its own).
    pub keys: Vec<ArrayRef>,
    /// Per aggregate, its state in each group.
    pub states: Vec<AggregateState>,
    /// Groups found.
    pub len: usize,
    /// Rows aggregated.
    pub rows_in: u64,
    /// Wall time of the call.
    pub time: Duration,
}

// Must match aggregate.cu.
const AGG_WORDS: usize = 4;
const AGG_MAX_DEPTH: usize = 16;
const AGG_EMPTY: u64 = u64::MAX;
const AGG_SIGN: u64 = 1 << 63;
const KEY_BITS: u32 = 63;
const STATUS_BAD_BUFFER: u32 = 1;
const STATUS_BAD_PROGRAM: u32 = 2;
const STATUS_KEY_TOO_WIDE: u32 = 4;
const STATUS_OVERFLOW: u32 = 8;
const STATUS_TABLE_FULL: u32 = 16;
const OP_COLUMN: u32 = 0;
const OP_CONST: u32 = 1;
const OP_ADD: u32 = 2;
const OP_SUB: u32 = 3;
const OP_MUL: u32 = 4;
const OP_SCALE: u32 = 5;
const OP_FIT_SIGNED: u32 = 6;
const OP_FIT_UNSIGNED: u32 = 7;
const OP_FIT_DIGITS: u32 = 8;
/// Blocks of one launch at most: each block's shared table is flushed into
/// the global one at its end, so fewer, longer blocks flush less.
const MAX_BLOCKS: u64 = 1024;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AggKey {
    column: u32,
    shift: u32,
    bits: u32,
    len_bits: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AggOp {
    code: u32,
    column: u32,
    arg: u32,
    pad: u32,
    hi: i64,
    lo: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AggFunc {
    kind: u32,
    first_op: u32,
    n_ops: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AggProgram {
    columns: u64,
    keys: u64,
    ops: u64,
    funcs: u64,
    allowed: u64,
    allowed_len: u64,
    rows: u64,
    table_keys: u64,
    table_acc: u64,
    status: u64,
    capacity: u32,
    n_columns: u32,
    n_keys: u32,
    n_ops: u32,
    n_funcs: u32,
    pad: u32,
}

const _: () = assert!(std::mem::size_of::<AggKey>() == 16);
const _: () = assert!(std::mem::size_of::<AggOp>() == 32);
const _: () = assert!(std::mem::size_of::<AggFunc>() == 16);
const _: () = assert!(std::mem::size_of::<AggProgram>() == 104);

/// Where a grouping column sits in the packed key.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Field {
    /// First bit.
    shift: u32,
    /// Bits: the null bit, then the value (or a string's length and bytes).
    bits: u32,
    /// Bits of a string's length; 0 for numbers.
    len_bits: u32,
}

/// A grouping column: its program column and field.
#[derive(Debug, Clone, Copy, PartialEq)]
struct KeyField {
    slot: u32,
    field: Field,
}

/// Bits needed to write `n`.
fn bit_len(n: u64) -> u32 {
    64 - n.leading_zeros()
}

/// The longest string a field of `bits` bits holds, and its length's bits.
fn string_capacity(bits: u32) -> (u64, u32) {
    let mut best = (0, 1);
    for len in 0..=((bits.saturating_sub(2)) / 8) as u64 {
        let lb = bit_len(len).max(1);
        if 1 + lb + 8 * len as u32 <= bits {
            best = (len, lb);
        }
    }
    best
}

/// Splits the key's 63 bits among the grouping columns: a number takes what
/// its width needs (a null bit and its value) where the share allows, and
/// strings share the rest evenly. `kinds[i]` is column i's filter kind and
/// value width.
fn key_layout(kinds: &[(u32, u32)]) -> Result<Vec<Field>> {
    let is_string = |k: u32| matches!(k, KIND_STRING | KIND_LARGE_STRING | KIND_VIEW);
    let n = kinds.len() as u32;
    if n == 0 {
        return Ok(Vec::new());
    }
    if 2 * n > KEY_BITS {
        return Err(Error::Aggregate(format!("{n} grouping columns do not fit one key")));
    }
    let mut bits = vec![0u32; kinds.len()];
    let mut left = KEY_BITS;
    // Numbers, narrowest first, take their whole width where every column
    // after them keeps at least MIN_FIELD bits (a string of one byte).
    const MIN_FIELD: u32 = 10;
    let mut order: Vec<usize> = (0..kinds.len()).collect();
    order.sort_by_key(|&i| if is_string(kinds[i].0) { u32::MAX } else { kinds[i].1 });
    let mut rest = Vec::new();
    for (at, &i) in order.iter().enumerate() {
        let (kind, width) = kinds[i];
        let need = 1 + 8 * width;
        let after = (order.len() - at - 1) as u32;
        if !is_string(kind) && need + MIN_FIELD * after <= left {
            bits[i] = need;
            left -= need;
        } else {
            rest.push(i);
        }
    }
    // The others share the rest evenly (a number never more than its width).
    for (at, &i) in rest.iter().enumerate() {
        let share = left / (rest.len() - at) as u32;
        bits[i] = if is_string(kinds[i].0) { share } else { share.min(1 + 8 * kinds[i].1) };
        left -= bits[i];
    }
    let mut shift = 0;
    let mut out = Vec::with_capacity(kinds.len());
    for (&(kind, _), &b) in kinds.iter().zip(&bits) {
        if b < 2 {
            return Err(Error::Aggregate("grouping columns do not fit one key".into()));
        }
        let len_bits = if is_string(kind) { string_capacity(b).1 } else { 0 };
        out.push(Field { shift, bits: b, len_bits });
        shift += b;
    }
    Ok(out)
}

/// Which of a table's rows an aggregation takes.
#[derive(Clone, Copy)]
enum Rows<'a> {
    All,
    Nothing,
    /// A host bitmap of the rows.
    Host(&'a [u8]),
    /// A device bitmap of the rows (a filter's, in u32 words).
    Device(&'a DeviceBuffer),
}

/// The aggregation compiled for the kernel.
struct Program {
    keys: Vec<KeyField>,
    ops: Vec<AggOp>,
    funcs: Vec<AggFunc>,
    /// Table column of each program column.
    columns: Vec<usize>,
}

impl Program {
    fn compile(group_by: &GroupBy, kind: &dyn Fn(usize) -> Result<(u32, u32)>) -> Result<Program> {
        if group_by.aggregates.len() > GroupBy::MAX_AGGREGATES {
            return Err(Error::Aggregate(format!(
                "{} aggregates; the device computes at most {} at once",
                group_by.aggregates.len(),
                GroupBy::MAX_AGGREGATES
            )));
        }
        let mut p = Program { keys: Vec::new(), ops: Vec::new(), funcs: Vec::new(), columns: Vec::new() };
        let kinds: Vec<(u32, u32)> = group_by
            .keys
            .iter()
            .map(|&c| {
                let k = kind(c)?;
                if !matches!(k.0, KIND_INT | KIND_UINT | KIND_STRING | KIND_LARGE_STRING | KIND_VIEW) {
                    return Err(Error::Aggregate(format!("column {c} cannot be a grouping column on the device")));
                }
                Ok(k)
            })
            .collect::<Result<_>>()?;
        let layout = key_layout(&kinds)?;
        for (&c, field) in group_by.keys.iter().zip(layout) {
            let slot = p.slot(c);
            p.keys.push(KeyField { slot, field });
        }
        for a in &group_by.aggregates {
            let first_op = p.ops.len() as u32;
            let kind_code = match a.function {
                AggregateFunction::CountRows => 0,
                AggregateFunction::Count => 1,
                AggregateFunction::Sum => 2,
                AggregateFunction::Min => 3,
                AggregateFunction::Max => 4,
            };
            match (&a.input, a.function) {
                (None, AggregateFunction::CountRows) => {}
                (Some(e), f) if f != AggregateFunction::CountRows => {
                    let depth = p.emit(e, kind)?;
                    if depth > AGG_MAX_DEPTH {
                        return Err(Error::Aggregate(format!("an input needs a stack of {depth}; the kernel holds {AGG_MAX_DEPTH}")));
                    }
                }
                (input, f) => return Err(Error::InvalidOptions(format!("aggregate {f:?} with input {input:?}"))),
            }
            p.funcs.push(AggFunc { kind: kind_code, first_op, n_ops: p.ops.len() as u32 - first_op, pad: 0 });
        }
        Ok(p)
    }

    fn slot(&mut self, c: usize) -> u32 {
        column_slot(&mut self.columns, c)
    }

    fn push(&mut self, code: u32, column: u32, arg: u32, value: i128) {
        self.ops.push(AggOp { code, column, arg, pad: 0, hi: (value >> 64) as i64, lo: value as u64 });
    }

    /// Emits `e`; returns the stack depth it needs.
    fn emit(&mut self, e: &ValueExpr, kind: &dyn Fn(usize) -> Result<(u32, u32)>) -> Result<usize> {
        Ok(match e {
            ValueExpr::Column(c) => {
                if !matches!(kind(*c)?.0, KIND_INT | KIND_UINT) {
                    return Err(Error::Aggregate(format!("column {c} is not an integer or decimal column")));
                }
                let slot = self.slot(*c);
                self.push(OP_COLUMN, slot, 0, 0);
                1
            }
            ValueExpr::Literal(v) => {
                self.push(OP_CONST, 0, u32::from(v.is_none()), v.unwrap_or(0));
                1
            }
            ValueExpr::Add(a, b) | ValueExpr::Sub(a, b) | ValueExpr::Mul(a, b) => {
                let da = self.emit(a, kind)?;
                let db = self.emit(b, kind)?;
                let code = match e {
                    ValueExpr::Add(..) => OP_ADD,
                    ValueExpr::Sub(..) => OP_SUB,
                    _ => OP_MUL,
                };
                self.push(code, 0, 0, 0);
                da.max(1 + db)
            }
            ValueExpr::Scale(a, k) | ValueExpr::FitDigits(a, k) => {
                if *k > 38 {
                    return Err(Error::InvalidOptions(format!("a power of ten of {k} digits (at most 38)")));
                }
                let d = self.emit(a, kind)?;
                self.push(if matches!(e, ValueExpr::Scale(..)) { OP_SCALE } else { OP_FIT_DIGITS }, 0, *k, 0);
                d
            }
            ValueExpr::FitSigned(a, bits) | ValueExpr::FitUnsigned(a, bits) => {
                let most = if matches!(e, ValueExpr::FitSigned(..)) { 127 } else { 126 };
                if !(1..=most).contains(bits) {
                    return Err(Error::InvalidOptions(format!("a range of {bits} bits (1 to {most})")));
                }
                let d = self.emit(a, kind)?;
                self.push(if matches!(e, ValueExpr::FitSigned(..)) { OP_FIT_SIGNED } else { OP_FIT_UNSIGNED }, 0, *bits, 0);
                d
            }
        })
    }
}

impl DeviceTable {
    /// Groups the rows (those inside `within`, ranges of row numbers, if
    /// given) by `group_by`'s keys and computes its aggregates per group, on
    /// the device; only the groups' states are copied to the host.
    ///
    /// [`Error::Aggregate`] when the device cannot do it exactly (see the
    /// [module docs](self)): nothing is returned then, and the caller
    /// aggregates on the host.
    pub fn aggregate(&self, group_by: &GroupBy, within: Option<&[std::ops::Range<usize>]>) -> Result<Groups> {
        let t0 = Instant::now();
        let program = self.aggregate_program(group_by)?;
        let allowed = within.map(|ranges| ranges_bitmap(ranges, self.num_rows));
        let none = within.is_some_and(|ranges| ranges.iter().all(|r| r.start >= r.end.min(self.num_rows)));
        let rows = if none { Rows::Nothing } else { allowed.as_deref().map_or(Rows::All, Rows::Host) };
        self.aggregate_rows(group_by, &program, rows, t0)
    }

    /// [`DeviceTable::aggregate`] of the rows (inside `within`, if given)
    /// where `predicate` (over this table's columns, as for
    /// [`DeviceTable::filter_columns`]) is TRUE. The filter's bitmap stays on
    /// the device and no column is gathered: a filtered aggregation reads
    /// each column once.
    ///
    /// [`Error::Filter`] when the device cannot evaluate the predicate,
    /// [`Error::Aggregate`] as for [`DeviceTable::aggregate`]; nothing is
    /// returned then.
    pub fn filter_aggregate(&self, predicate: &Predicate, within: Option<&[std::ops::Range<usize>]>, group_by: &GroupBy) -> Result<Groups> {
        let t0 = Instant::now();
        let filter = self.program(predicate)?;
        let program = self.aggregate_program(group_by)?;
        let n = self.num_rows as u64;
        if n == 0 {
            return self.aggregate_rows(group_by, &program, Rows::Nothing, t0);
        }
        let ctx = self.context().ok_or_else(|| Error::Filter("a table without columns".into()))?;
        let _bound = ctx.bind_scoped()?;
        let stream = ctx.new_stream()?;
        let f = Filtering { stream: &stream, kernels: Kernels::for_context(&ctx)? };
        let allowed = within.map(|ranges| ranges_bitmap(ranges, self.num_rows));
        // (Evaluating waits for the kernel: the bitmap is ready for the aggregation's stream.)
        let (bits, _, _) = f.evaluate(self, &filter, n, allowed.as_deref())?;
        self.aggregate_rows(group_by, &program, Rows::Device(&bits), t0)
    }

    /// The aggregation `group_by` compiled against this table's columns.
    fn aggregate_program(&self, group_by: &GroupBy) -> Result<Program> {
        Program::compile(group_by, &|c| {
            let col = self.columns.get(c).ok_or_else(|| Error::Aggregate(format!("no column {c}")))?;
            if col.is_nested() || col.device_type != *col.field.data_type() {
                return Err(Error::Aggregate(format!(
                    "column {} is decoded as {} for a field of type {}",
                    col.field.name(),
                    col.device_type,
                    col.field.data_type()
                )));
            }
            column_kind(&col.device_type)
                .ok_or_else(|| Error::Aggregate(format!("column {} of type {} has no device arithmetic", col.field.name(), col.device_type)))
        })
    }

    /// Runs `program` over `rows`, in a table grown as it fills, and reads
    /// the groups back.
    fn aggregate_rows(&self, group_by: &GroupBy, program: &Program, rows: Rows<'_>, t0: Instant) -> Result<Groups> {
        let most = group_by.capacity.clamp(1, GroupBy::MAX_CAPACITY).next_power_of_two();
        let n = self.num_rows as u64;
        let words = program.funcs.len() * AGG_WORDS;
        let (keys, acc, rows_in) = if n == 0 || matches!(rows, Rows::Nothing) {
            (Vec::new(), Vec::new(), 0)
        } else {
            let mut capacity = most.min(GroupBy::FIRST_TABLE);
            loop {
                match self.run_aggregate(program, capacity, n, rows)? {
                    Some(table) => break table,
                    None if capacity < most => capacity = (capacity * 16).min(most),
                    None => return Err(Error::Aggregate(format!("more than {most} groups"))),
                }
            }
        };
        // The occupied slots, in slot order.
        let slots: Vec<usize> = (0..keys.len()).filter(|&s| keys[s] != AGG_EMPTY).collect();
        let mut states = Vec::with_capacity(program.funcs.len());
        for (f, func) in program.funcs.iter().enumerate() {
            let mut st = AggregateState { counts: Vec::with_capacity(slots.len()), values: Vec::with_capacity(slots.len()) };
            for &s in &slots {
                let w = &acc[s * words + f * AGG_WORDS..s * words + (f + 1) * AGG_WORDS];
                st.counts.push(w[0]);
                let v = if w[0] == 0 {
                    i256::ZERO
                } else {
                    match func.kind {
                        // 192 bits, sign-extended to 256.
                        2 => i256::from_parts(((w[2] as u128) << 64) | w[1] as u128, w[3] as i64 as i128),
                        3 => i256::from_i128((!w[1] ^ AGG_SIGN) as i64 as i128),
                        4 => i256::from_i128((w[1] ^ AGG_SIGN) as i64 as i128),
                        _ => i256::ZERO,
                    }
                };
                st.values.push(v);
            }
            states.push(st);
        }
        let mut key_arrays = Vec::with_capacity(program.keys.len());
        for k in &program.keys {
            let col = &self.columns[program.columns[k.slot as usize]];
            let fields: Vec<u64> = slots.iter().map(|&s| (keys[s] >> k.field.shift) & ((1u64 << k.field.bits) - 1)).collect();
            key_arrays.push(key_array(col.device_type(), k.field, &fields)?);
        }
        Ok(Groups { keys: key_arrays, states, len: slots.len(), rows_in, time: t0.elapsed() })
    }

    /// Launches the kernel with a table of `capacity` slots; returns the
    /// table's keys and accumulators and the rows aggregated, or `None` when
    /// the groups did not fit.
    fn run_aggregate(&self, program: &Program, capacity: usize, n: u64, rows: Rows<'_>) -> Result<Option<(Vec<u64>, Vec<u64>, u64)>> {
        let ctx = self.context().ok_or_else(|| Error::Aggregate("a table without columns".into()))?;
        let _bound = ctx.bind_scoped()?;
        let stream = ctx.new_stream()?;
        let kernels = Kernels::for_context(&ctx)?;
        let words = (program.funcs.len() * AGG_WORDS) as u64;
        let table_keys = DeviceBuffer::alloc(&stream, bytes_of(capacity as u64, 8)?, "aggregate keys")?;
        table_keys.fill(&stream, 0xff)?;
        let table_acc = DeviceBuffer::alloc(&stream, bytes_of(capacity as u64, 8 * words)?.max(8), "aggregate states")?;
        table_acc.fill(&stream, 0)?;
        let columns: Vec<FilterColumn> = program.columns.iter().map(|&c| FilterColumn::of(&self.columns[c])).collect();
        let keys: Vec<AggKey> =
            program.keys.iter().map(|k| AggKey { column: k.slot, shift: k.field.shift, bits: k.field.bits, len_bits: k.field.len_bits }).collect();
        let mut up = Upload::default();
        let columns_at = up.put(as_bytes(&columns));
        let keys_at = up.put(as_bytes(&keys));
        let ops_at = up.put(as_bytes(&program.ops));
        let funcs_at = up.put(as_bytes(&program.funcs));
        let allowed_at = match rows {
            Rows::Host(a) => Some(up.put(a)),
            _ => None,
        };
        up.put(&[0u8; 16]);
        let d = DeviceBuffer::from_host(&stream, &up.bytes, "aggregate program")?;
        let status = DeviceBuffer::alloc(&stream, 16, "aggregate status")?;
        status.fill(&stream, 0)?;
        let header = AggProgram {
            columns: d.ptr() + columns_at,
            keys: d.ptr() + keys_at,
            ops: d.ptr() + ops_at,
            funcs: d.ptr() + funcs_at,
            allowed: match (rows, allowed_at) {
                (Rows::Device(b), _) => b.ptr(),
                (_, Some(at)) => d.ptr() + at,
                _ => 0,
            },
            allowed_len: match rows {
                Rows::Device(b) => b.len(),
                Rows::Host(a) => a.len() as u64,
                _ => 0,
            },
            rows: n,
            table_keys: table_keys.ptr(),
            table_acc: table_acc.ptr(),
            status: status.ptr(),
            capacity: capacity as u32,
            n_columns: columns.len() as u32,
            n_keys: keys.len() as u32,
            n_ops: program.ops.len() as u32,
            n_funcs: program.funcs.len() as u32,
            pad: 0,
        };
        let h = DeviceBuffer::from_host(&stream, as_bytes(&[header]), "aggregate program header")?;
        let grid = n.div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
        let mut args = KernelArgs::new().arg(h.ptr());
        // SAFETY: arguments match gpq_aggregate; the program's tables are in `d` and the
        // table buffers hold `capacity` slots of `words` words, all alive until the end.
        unsafe { kernels.launch(Kernel::Aggregate, grid, BLOCK, 0, &stream, &mut args)? };
        let status_words: Vec<u64> = from_bytes(&status.to_host()?);
        let (status, rows_in) = (status_words[0] as u32, status_words[1]);
        drop(h);
        if status & (STATUS_BAD_BUFFER | STATUS_BAD_PROGRAM) != 0 {
            return Err(Error::Internal(format!("the device aggregation read outside a column's buffers or its program (status {status})")));
        }
        if status & STATUS_KEY_TOO_WIDE != 0 {
            return Err(Error::Aggregate("a grouping value is wider than its part of the key".into()));
        }
        if status & STATUS_OVERFLOW != 0 {
            return Err(Error::Aggregate("an aggregate's input overflowed or left its range".into()));
        }
        if status & STATUS_TABLE_FULL != 0 {
            return Ok(None);
        }
        let keys: Vec<u64> = from_bytes(&table_keys.to_host()?);
        let acc: Vec<u64> = from_bytes(&table_acc.to_host()?);
        drop(d);
        Ok(Some((keys, acc, rows_in)))
    }
}

/// A grouping column's values, from each group's field of the packed key.
fn key_array(t: &DataType, k: Field, fields: &[u64]) -> Result<ArrayRef> {
    let valid: Vec<bool> = fields.iter().map(|f| f & 1 == 0).collect();
    let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid.clone()));
    let vbits = k.bits - 1;
    let (kind, width) = column_kind(t).ok_or_else(|| Error::Internal(format!("a grouping column of type {t}")))?;
    let data = if k.len_bits > 0 {
        let mut offsets: Vec<i64> = vec![0];
        let mut bytes = Vec::new();
        for (f, v) in fields.iter().zip(&valid) {
            if *v {
                let field = f >> 1;
                let len = field & ((1u64 << k.len_bits) - 1);
                for j in 0..len {
                    bytes.push((field >> (k.len_bits as u64 + 8 * j)) as u8);
                }
            }
            offsets.push(bytes.len() as i64);
        }
        let (plain, large) = match t {
            DataType::Utf8 | DataType::Utf8View => (DataType::Utf8, false),
            DataType::LargeUtf8 => (DataType::LargeUtf8, true),
            DataType::Binary | DataType::BinaryView => (DataType::Binary, false),
            DataType::LargeBinary => (DataType::LargeBinary, true),
            _ => return Err(Error::Internal(format!("a string key of type {t}"))),
        };
        let offsets = if large { Buffer::from_vec(offsets) } else { Buffer::from_vec(offsets.iter().map(|&o| o as i32).collect::<Vec<i32>>()) };
        let data = ArrayData::builder(plain.clone())
            .len(fields.len())
            .add_buffer(offsets)
            .add_buffer(Buffer::from_vec(bytes))
            .nulls(nulls)
            .build()
            .map_err(|e| Error::Aggregate(format!("grouping strings: {e}")))?;
        let array = make_array(data);
        if plain == *t {
            return Ok(array);
        }
        return Ok(arrow::compute::cast(&array, t)?);
    } else {
        debug_assert!(matches!(kind, KIND_INT | KIND_UINT));
        let width = width as usize;
        let mut bytes = Vec::with_capacity(fields.len() * width);
        for f in fields {
            // The field's value bits: unsigned values zero-extended, signed ones sign-extended.
            let bits = (f >> 1) << (64 - vbits);
            let v = if kind == KIND_UINT { (bits >> (64 - vbits)) as i128 } else { (bits as i64 >> (64 - vbits)) as i128 };
            bytes.extend_from_slice(&v.to_le_bytes()[..width]);
        }
        ArrayData::builder(t.clone())
            .len(fields.len())
            .add_buffer(Buffer::from_vec(bytes))
            .nulls(nulls)
            .build()?
    };
    Ok(make_array(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_fields_fit_63_bits_and_numbers_get_their_width() {
        let unpack = |v: Vec<Field>| v.into_iter().map(|f| (f.shift, f.bits, f.len_bits)).collect::<Vec<_>>();
        // Two one-character strings (TPC-H q1): 31 and 32 bits.
        let two = unpack(key_layout(&[(KIND_STRING, 4), (KIND_VIEW, 16)]).unwrap());
        assert_eq!(two.iter().map(|f| f.1).sum::<u32>(), 63);
        assert!(two.iter().all(|f| string_capacity(f.1).0 >= 3));
        // An i32 and a string: the i32 takes 33 bits, the string the other 30.
        let mixed = unpack(key_layout(&[(KIND_STRING, 4), (KIND_INT, 4)]).unwrap());
        assert_eq!(mixed[1].1, 33);
        assert_eq!(mixed[0].1, 30);
        assert_eq!(mixed[0].0 + mixed[0].1 <= 63 && mixed[1].0 + mixed[1].1 <= 63, true);
        // An i64 alone gets 63 bits (its values must fit 62 at run time).
        assert_eq!(unpack(key_layout(&[(KIND_INT, 8)]).unwrap())[0].1, 63);
        // Fields do not overlap.
        let three = unpack(key_layout(&[(KIND_INT, 2), (KIND_STRING, 4), (KIND_INT, 8)]).unwrap());
        let mut spans: Vec<(u32, u32)> = three.iter().map(|f| (f.0, f.0 + f.1)).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        assert!(spans.last().unwrap().1 <= 63);
        assert!(key_layout(&vec![(KIND_INT, 1); 32]).is_err());
    }

    #[test]
    fn string_fields_hold_their_length_and_bytes() {
        assert_eq!(string_capacity(31), (3, 2));
        assert_eq!(string_capacity(63), (7, 3));
        assert_eq!(string_capacity(2), (0, 1));
    }

    #[test]
    fn programs_are_postfix_with_their_depth() {
        let col = |c| Box::new(ValueExpr::Column(c));
        let e = ValueExpr::Mul(col(0), Box::new(ValueExpr::Sub(Box::new(ValueExpr::Literal(Some(100))), col(1))));
        let g = GroupBy {
            keys: vec![],
            aggregates: vec![Aggregate { function: AggregateFunction::Sum, input: Some(e) }, Aggregate { function: AggregateFunction::CountRows, input: None }],
            capacity: 16,
        };
        let p = Program::compile(&g, &|_| Ok((KIND_INT, 16))).unwrap();
        let codes: Vec<u32> = p.ops.iter().map(|o| o.code).collect();
        assert_eq!(codes, vec![OP_COLUMN, OP_CONST, OP_COLUMN, OP_SUB, OP_MUL]);
        assert_eq!((p.funcs[0].first_op, p.funcs[0].n_ops, p.funcs[1].n_ops), (0, 5, 0));
        let bad = GroupBy { aggregates: vec![Aggregate { function: AggregateFunction::Sum, input: None }], ..g.clone() };
        assert!(matches!(Program::compile(&bad, &|_| Ok((KIND_INT, 8))), Err(Error::InvalidOptions(_))));
        let moved = GroupBy { keys: vec![1, 0], ..g.clone() }.map_columns(&|c| c + 10);
        assert_eq!(moved.keys, vec![11, 10]);
        let inputs: Vec<Option<ValueExpr>> = moved.aggregates.iter().map(|a| a.input.clone()).collect();
        let e = ValueExpr::Mul(Box::new(ValueExpr::Column(10)), Box::new(ValueExpr::Sub(Box::new(ValueExpr::Literal(Some(100))), Box::new(ValueExpr::Column(11)))));
        assert_eq!(inputs, vec![Some(e), None]);
        let float = GroupBy { keys: vec![0], ..g };
        assert!(matches!(Program::compile(&float, &|_| Ok((2, 8))), Err(Error::Aggregate(_))));
    }
}
