//! Stage 4 for nested columns: the Arrow arrays of structs, lists and maps,
//! built on the device from the leaves' levels.
//!
//! The value kernels leave each nested leaf with a value per level position
//! and its u16 repetition and definition levels. For every leaf, one
//! `gpq_nest_count` pass counts, per tile of positions, the slots of each
//! node above it (the slot tests of `plan::nesting`); the host adds the tile
//! counts up (one small copy for all leaves of the read), which sizes every
//! output and checks that the leaves agree on every node's length and that
//! the column has one entry per row. One `gpq_nest_apply` pass per leaf
//! then writes the list offsets and validity bitmaps of the nodes the leaf
//! provides (each node's first leaf) and gathers the leaf's own values from
//! level positions into its slots. List offsets are `i32`; the host casts to
//! large, fixed-size or view lists where the schema asks for them.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Fields};

use super::descriptors::{NestOp, SlotTestDesc, nest_op};
use super::values::LeafOutput;
use super::{DecodedColumn, unsupported};
use crate::cuda::{DeviceBuffer, GpuStream, as_bytes, from_bytes};
use crate::error::{CorruptKind, Error, Result};
use crate::gpu::{Kernel, KernelArgs, Kernels};
use crate::plan::ReadPlan;
use crate::plan::nesting::{NestKind, NestNode, SlotTest};

/// Level positions per tile (nesting.cu `NEST_TILE`).
const TILE: usize = 256 * 8;
/// Slot tests one leaf may have (nesting.cu `NEST_MAX_TESTS`).
const MAX_TESTS: usize = 16;

/// One nested column to assemble: its tree and its leaves' outputs.
pub(crate) struct NestedColumn<'a> {
    /// Index into the plan's columns.
    pub column: usize,
    /// The column's tree.
    pub tree: &'a NestNode,
    /// The column's leaves, in the order of `PlannedColumn::leaves`.
    pub leaves: Vec<LeafOutput>,
}

/// Per leaf: its slot tests and, after the count pass, each test's total and
/// per-tile bases.
struct LeafCounts {
    tests: Vec<SlotTest>,
    tiles: usize,
    totals: Vec<u64>,
    bases: Vec<u64>,
}

impl LeafCounts {
    fn test_index(&self, t: SlotTest) -> u32 {
        self.tests.iter().position(|&x| x == t).expect("every node's test was collected") as u32
    }
    fn total(&self, t: SlotTest) -> u64 {
        self.totals[self.test_index(t) as usize]
    }
}

/// Collects the slot tests of the nodes on the path to each leaf.
fn collect_tests(node: &NestNode, above: &mut Vec<SlotTest>, out: &mut [Vec<SlotTest>]) {
    let pushed = !above.contains(&node.slot);
    if pushed {
        above.push(node.slot);
    }
    match node.kind {
        NestKind::Leaf { leaf } => out[leaf] = above.clone(),
        _ => node.children.iter().for_each(|c| collect_tests(c, above, out)),
    }
    if pushed {
        above.pop();
    }
}

/// Assembles every nested column of a read; returns them in the order given.
pub(crate) fn assemble(
    plan: &ReadPlan,
    columns: Vec<NestedColumn>,
    num_rows: usize,
    stream: &Arc<GpuStream>,
) -> Result<Vec<DecodedColumn>> {
    if columns.is_empty() {
        return Ok(Vec::new());
    }
    let kernels = Kernels::for_context(stream.context())?;

    // Count pass for every leaf, one copy back.
    let mut counts: Vec<Vec<LeafCounts>> = Vec::with_capacity(columns.len());
    let mut keep: Vec<DeviceBuffer> = Vec::new();
    let mut pending: Vec<(usize, usize, DeviceBuffer)> = Vec::new();
    for (c, col) in columns.iter().enumerate() {
        let mut tests = vec![Vec::new(); col.leaves.len()];
        collect_tests(col.tree, &mut Vec::new(), &mut tests);
        let mut per_leaf = Vec::with_capacity(col.leaves.len());
        for (l, (leaf, tests)) in col.leaves.iter().zip(tests).enumerate() {
            if tests.len() > MAX_TESTS {
                return Err(unsupported(plan, col.column, format!("{} nesting levels (at most {MAX_TESTS})", tests.len())));
            }
            let tiles = leaf.len.div_ceil(TILE);
            if tiles > 0 {
                let descs: Vec<SlotTestDesc> =
                    tests.iter().map(|t| SlotTestDesc { max_rep: t.max_rep as u32, min_def: t.min_def as u32 }).collect();
                let d_tests = DeviceBuffer::from_host(stream, as_bytes(&descs), "slot tests")?;
                let d_counts = DeviceBuffer::alloc(stream, 8 * (tests.len() * tiles).max(1) as u64, "slot counts")?;
                let mut args = KernelArgs::new()
                    .arg(leaf.rep_levels.as_ref().map_or(0, |b| b.ptr()))
                    .arg(leaf.def_levels.as_ref().map_or(0, |b| b.ptr()))
                    .arg(leaf.len as u64)
                    .arg(d_tests.ptr())
                    .arg(descs.len() as u32)
                    .arg(d_counts.ptr());
                // SAFETY: arguments match gpq_nest_count; the level arrays hold `len` entries
                // (or are null), the counts tests x tiles.
                unsafe { kernels.launch(Kernel::NestCount, grid(tiles)?, 256, 0, stream, &mut args)? };
                keep.push(d_tests);
                pending.push((c, l, d_counts));
            }
            per_leaf.push(LeafCounts { totals: vec![0; tests.len()], bases: vec![0; tests.len() * tiles], tests, tiles });
        }
        counts.push(per_leaf);
    }
    for (c, l, d_counts) in pending {
        let lc = &mut counts[c][l];
        let raw: Vec<u64> = from_bytes(&d_counts.to_host()?);
        for t in 0..lc.tests.len() {
            let mut acc = 0u64;
            for tile in 0..lc.tiles {
                lc.bases[t * lc.tiles + tile] = acc;
                acc += raw[t * lc.tiles + tile];
            }
            lc.totals[t] = acc;
        }
    }
    drop(keep);

    // Lengths: every leaf beneath a node must agree; the root has a slot per row.
    for (col, cc) in columns.iter().zip(&counts) {
        check_lengths(plan, col, col.tree, cc)?;
        let root = cc[col.tree.leaves()[0]].total(col.tree.slot);
        if root != num_rows as u64 {
            return Err(corrupt_levels(plan, col.column, format!("the levels hold {root} rows, the row groups {num_rows}")));
        }
    }

    // Outputs and operations, then one apply pass per leaf.
    let null_counters = DeviceBuffer::alloc(stream, 8 * 256, "nested null counts")?;
    let status = DeviceBuffer::alloc(stream, 4, "nesting status")?;
    status.fill(stream, 0)?;
    let mut results = Vec::with_capacity(columns.len());
    for (col, cc) in columns.into_iter().zip(&counts) {
        let NestedColumn { column, tree, mut leaves } = col;
        // Kept until the apply passes are done: the levels and the leaves' level-position buffers.
        let level_ptrs: Vec<(u64, u64, u64)> = leaves
            .iter()
            .map(|l| (l.rep_levels.as_ref().map_or(0, |b| b.ptr()), l.def_levels.as_ref().map_or(0, |b| b.ptr()), l.len as u64))
            .collect();
        let mut sources: Vec<DeviceBuffer> = Vec::new();
        for l in &mut leaves {
            sources.extend(l.rep_levels.take());
            sources.extend(l.def_levels.take());
        }
        let mut b = Builder {
            plan,
            column,
            stream,
            counts: cc,
            ops: vec![Vec::new(); leaves.len()],
            counters: 0,
            nulls: Vec::new(),
            sources,
        };
        null_counters.fill(stream, 0)?;
        let mut leaves: Vec<Option<LeafOutput>> = leaves.into_iter().map(Some).collect();
        let mut built = b.node(tree, &mut leaves, &null_counters)?;
        let mut keep = Vec::new();
        for (l, ops) in b.ops.iter().enumerate() {
            let lc = &cc[l];
            if ops.is_empty() || lc.tiles == 0 {
                continue;
            }
            let descs: Vec<SlotTestDesc> =
                lc.tests.iter().map(|t| SlotTestDesc { max_rep: t.max_rep as u32, min_def: t.min_def as u32 }).collect();
            let d_tests = DeviceBuffer::from_host(stream, as_bytes(&descs), "slot tests")?;
            let d_bases = DeviceBuffer::from_host(stream, as_bytes(&lc.bases), "slot bases")?;
            let d_totals = DeviceBuffer::from_host(stream, as_bytes(&lc.totals), "slot totals")?;
            let d_ops = DeviceBuffer::from_host(stream, as_bytes(ops), "nesting operations")?;
            let levels = level_ptrs[l];
            let mut args = KernelArgs::new()
                .arg(levels.0)
                .arg(levels.1)
                .arg(levels.2)
                .arg(d_tests.ptr())
                .arg(descs.len() as u32)
                .arg(d_bases.ptr())
                .arg(d_totals.ptr())
                .arg(d_ops.ptr())
                .arg(ops.len() as u32)
                .arg(status.ptr());
            // SAFETY: arguments match gpq_nest_apply; every output holds the
            // capacity its operation states (sized from the same counts).
            unsafe { kernels.launch(Kernel::NestApply, grid(lc.tiles)?, 256, 0, stream, &mut args)? };
            keep.extend([d_tests, d_bases, d_totals, d_ops]);
        }
        stream.synchronize()?;
        drop(keep);
        drop(b.sources);
        let st: Vec<u32> = from_bytes(&status.to_host()?);
        if st[0] != 0 {
            return Err(corrupt_levels(plan, column, format!("nesting kernel status {}", st[0])));
        }
        let nulls: Vec<u64> = from_bytes(&null_counters.to_host()?);
        set_nulls(&mut built, &b.nulls, &nulls);
        results.push(built);
    }
    Ok(results)
}

fn grid(tiles: usize) -> Result<u32> {
    u32::try_from(tiles).map_err(|_| Error::Internal(format!("{tiles} tiles in one launch")))
}

fn corrupt_levels(plan: &ReadPlan, column: usize, what: String) -> Error {
    // Name the column's first chunk: the levels of every chunk went into the result.
    let chunk = plan.chunks.iter().position(|c| c.column == column).unwrap_or(0);
    super::pages::corrupt(plan, chunk, 0, CorruptKind::LevelOutOfRange, what)
}

fn check_lengths(plan: &ReadPlan, col: &NestedColumn, node: &NestNode, cc: &[LeafCounts]) -> Result<()> {
    let leaves = node.leaves();
    let first = cc[leaves[0]].total(node.slot);
    for &l in &leaves[1..] {
        let n = cc[l].total(node.slot);
        if n != first {
            return Err(corrupt_levels(
                plan,
                col.column,
                format!("leaves {} and {} disagree on the length of {} ({first} and {n})", leaves[0], l, node.field.name()),
            ));
        }
    }
    node.children.iter().try_for_each(|c| check_lengths(plan, col, c, cc))
}

/// Builds one column's arrays and the operations that fill them.
struct Builder<'a> {
    plan: &'a ReadPlan,
    column: usize,
    stream: &'a Arc<GpuStream>,
    counts: &'a [LeafCounts],
    /// Operations per leaf.
    ops: Vec<Vec<NestOp>>,
    /// Null counters handed out.
    counters: usize,
    /// Per node in build order: its counter, if it has a validity op.
    nulls: Vec<Option<usize>>,
    /// Buffers the apply passes read, kept until they finish.
    sources: Vec<DeviceBuffer>,
}

impl Builder<'_> {
    fn alloc(&self, bytes: u64, what: &'static str, zero: bool) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(self.stream, bytes.max(8), what)?;
        if zero {
            b.fill(self.stream, 0)?;
        }
        Ok(b)
    }

    fn validity(&mut self, node: &NestNode, provider: usize, len: u64, counters: &DeviceBuffer) -> Result<Option<DeviceBuffer>> {
        if !node.can_be_null() {
            self.nulls.push(None);
            return Ok(None);
        }
        let bits = self.alloc(len.div_ceil(64) * 8, "nested validity", true)?;
        if self.counters == 256 {
            return Err(unsupported(self.plan, self.column, "more than 256 nullable nodes in one column".to_string()));
        }
        let counter = self.counters;
        self.counters += 1;
        let test = self.counts[provider].test_index(node.slot);
        self.ops[provider].push(NestOp {
            kind: nest_op::VALIDITY,
            test,
            element: 0,
            arg: node.valid_def as u32,
            src: 0,
            dst: bits.ptr(),
            capacity: len,
            counter: counters.ptr() + 8 * counter as u64,
        });
        self.nulls.push(Some(counter));
        Ok(Some(bits))
    }

    fn node(&mut self, node: &NestNode, leaves: &mut [Option<LeafOutput>], counters: &DeviceBuffer) -> Result<DecodedColumn> {
        let provider = node.leaves()[0];
        let len = self.counts[provider].total(node.slot);
        let null_leaf = matches!(node.kind, NestKind::Leaf { .. }) && node.field.data_type() == &DataType::Null;
        let validity = if null_leaf {
            self.nulls.push(None);
            None
        } else {
            self.validity(node, provider, len, counters)?
        };
        let len_usize = usize::try_from(len).map_err(|_| Error::Internal(format!("{len} slots")))?;
        match &node.kind {
            NestKind::Leaf { leaf } => {
                let out = leaves[*leaf].take().ok_or_else(|| Error::Internal("a leaf used twice".into()))?;
                self.leaf(node, *leaf, out, len, validity)
            }
            NestKind::Struct => {
                let children =
                    node.children.iter().map(|c| self.node(c, leaves, counters)).collect::<Result<Vec<_>>>()?;
                let fields: Fields = node
                    .children
                    .iter()
                    .zip(&children)
                    .map(|(n, c)| device_field(&n.field, &c.device_type))
                    .collect();
                Ok(nested(node, DataType::Struct(fields), len_usize, validity, None, children, self.stream)?)
            }
            NestKind::List { element } | NestKind::Map { element } => {
                let elements = self.counts[provider].total(*element);
                if elements > i32::MAX as u64 {
                    return Err(unsupported(self.plan, self.column, format!("{} has {elements} elements, over i32 offsets", node.field.name())));
                }
                let offsets = self.alloc(4 * (len + 1), "list offsets", true)?;
                let lc = &self.counts[provider];
                self.ops[provider].push(NestOp {
                    kind: nest_op::OFFSETS,
                    test: lc.test_index(node.slot),
                    element: lc.test_index(*element),
                    arg: 0,
                    src: 0,
                    dst: offsets.ptr(),
                    capacity: len,
                    counter: 0,
                });
                let child = self.node(&node.children[0], leaves, counters)?;
                let child_field = device_field(&node.children[0].field, &child.device_type);
                let device_type = match (&node.kind, node.field.data_type()) {
                    (NestKind::Map { .. }, DataType::Map(_, sorted)) => DataType::Map(child_field, *sorted),
                    _ => DataType::List(child_field),
                };
                Ok(nested(node, device_type, len_usize, validity, Some(offsets), vec![child], self.stream)?)
            }
        }
    }

    fn leaf(&mut self, node: &NestNode, leaf: usize, mut out: LeafOutput, len: u64, validity: Option<DeviceBuffer>) -> Result<DecodedColumn> {
        let test = self.counts[leaf].test_index(node.slot);
        let device_type = out.device_type.clone();
        let (values, offsets) = match &device_type {
            DataType::Null => (self.alloc(0, "no values", false)?, None),
            DataType::Boolean => {
                let bits = self.alloc(len.div_ceil(64) * 8, "nested booleans", true)?;
                self.ops[leaf].push(gather(nest_op::GATHER_BITS, test, 0, out.values.ptr(), bits.ptr(), len));
                self.sources.push(out.values);
                (bits, None)
            }
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
                let width = if matches!(out.device_type, DataType::LargeUtf8 | DataType::LargeBinary) { 8 } else { 4 };
                let src = out.offsets.take().ok_or_else(|| Error::Internal("strings without offsets".into()))?;
                let offsets = self.alloc(width * (len + 1), "nested string offsets", true)?;
                self.ops[leaf].push(gather(nest_op::GATHER_OFFSETS, test, width as u32, src.ptr(), offsets.ptr(), len));
                self.sources.push(src);
                // The characters stay where they are: slots dropped are empty.
                (out.values, Some(offsets))
            }
            t => {
                let width = t.primitive_width().or(match t {
                    DataType::FixedSizeBinary(w) => Some(*w as usize),
                    _ => None,
                });
                let width = width.ok_or_else(|| Error::Internal(format!("no width for {t}")))? as u64;
                let bytes = len.checked_mul(width).ok_or_else(|| unsupported(self.plan, self.column, "nested values overflow"))?;
                let values = self.alloc(bytes, "nested values", false)?;
                self.ops[leaf].push(gather(nest_op::GATHER, test, width as u32, out.values.ptr(), values.ptr(), len));
                self.sources.push(out.values);
                (values, None)
            }
        };
        Ok(DecodedColumn {
            field: node.field.clone(),
            device_type,
            len: len as usize,
            null_count: 0,
            validity,
            offsets,
            values,
            view_data: None,
            children: Vec::new(),
        })
    }
}

fn gather(kind: u32, test: u32, arg: u32, src: u64, dst: u64, capacity: u64) -> NestOp {
    NestOp { kind, test, element: 0, arg, src, dst, capacity, counter: 0 }
}

/// `field` with the type its device buffers hold.
pub(crate) fn device_field(field: &FieldRef, device_type: &DataType) -> FieldRef {
    if field.data_type() == device_type {
        field.clone()
    } else {
        Arc::new(Field::new(field.name(), device_type.clone(), field.is_nullable()).with_metadata(field.metadata().clone()))
    }
}

fn nested(
    node: &NestNode,
    device_type: DataType,
    len: usize,
    validity: Option<DeviceBuffer>,
    offsets: Option<DeviceBuffer>,
    children: Vec<DecodedColumn>,
    stream: &Arc<GpuStream>,
) -> Result<DecodedColumn> {
    Ok(DecodedColumn {
        field: node.field.clone(),
        device_type,
        len,
        null_count: 0,
        validity,
        offsets,
        values: DeviceBuffer::alloc(stream, 0, "no values")?,
        view_data: None,
        children,
    })
}

/// Fills in null counts, in the order the builder visited the nodes.
fn set_nulls(col: &mut DecodedColumn, order: &[Option<usize>], counts: &[u64]) {
    fn walk(c: &mut DecodedColumn, order: &mut std::slice::Iter<'_, Option<usize>>, counts: &[u64]) {
        if let Some(Some(k)) = order.next() {
            c.null_count = counts[*k] as usize;
        }
        for child in &mut c.children {
            walk(child, order, counts);
        }
    }
    walk(col, &mut order.iter(), counts);
}
