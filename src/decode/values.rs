//! Stage 3: values. Lays out every column's output buffers, indexes string
//! dictionaries, and launches the value kernels, choosing them page by page
//! (a chunk may start in dictionary pages and fall back to another
//! encoding): fixed-width and boolean values (PLAIN, dictionary, RLE,
//! BYTE_STREAM_SPLIT) in one pass, DELTA_BINARY_PACKED integers in another;
//! strings (and DELTA_BYTE_ARRAY fixed-length arrays) as sizes passes (one
//! for PLAIN and dictionary pages, one for the DELTA byte-array encodings), a
//! host sum of page totals (which sizes the character buffers), a characters
//! pass, and for DELTA_BYTE_ARRAY pages a walk that joins prefixes and
//! suffixes. Every page's status word is checked before the columns are
//! handed out.

use std::sync::Arc;

use arrow::datatypes::DataType;
use parquet::basic::Encoding;

use crate::cuda::{DeviceBuffer, GpuStream, as_bytes, from_bytes};
use crate::error::{CorruptKind, Result};
use crate::gpu::status::corrupt_kind;
use crate::gpu::{Kernel, KernelArgs, Kernels};
use crate::plan::ReadPlan;

use super::descriptors::{ColumnDesc, DictDesc, PageDesc, PageInfo, levels, page_type};
use super::pages::{PageTable, corrupt};
use super::types::{ColumnRecipe, Family};
use super::{ColumnRecipes, parquet_encoding, unsupported};

const BLOCK: u32 = 256;

fn bitmap_bytes(rows: usize) -> u64 {
    // Kernels OR whole 32-bit words; round up to 8 bytes.
    (rows.div_ceil(64) * 8).max(8) as u64
}

/// Where one kernel page came from, for error messages.
#[derive(Clone, Copy)]
struct PageOrigin {
    chunk: usize,
    page_no: usize,
}

struct Outputs {
    values: DeviceBuffer,
    validity: Option<DeviceBuffer>,
    offsets: Option<DeviceBuffer>,
    scratch: Option<(DeviceBuffer, DeviceBuffer)>,
    prefixes: Option<DeviceBuffer>,
}

/// Which kernels decode a page's values.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// gpq_decode_fixed: PLAIN, dictionary, RLE booleans, BYTE_STREAM_SPLIT.
    Fixed,
    /// gpq_decode_delta: DELTA_BINARY_PACKED integers.
    Delta,
    /// The string passes (sizes, then characters, decimals or, for
    /// DELTA_BYTE_ARRAY, the prefix walk), also for FIXED_LEN_BYTE_ARRAY
    /// pages in DELTA_BYTE_ARRAY.
    Strings,
}

fn route(family: Family, encoding: u32) -> Route {
    match (family, parquet_encoding(encoding)) {
        (Family::Strings | Family::BytesDecimal, _) => Route::Strings,
        (_, Some(Encoding::DELTA_BINARY_PACKED)) => Route::Delta,
        (_, Some(Encoding::DELTA_BYTE_ARRAY)) => Route::Strings,
        _ => Route::Fixed,
    }
}

/// One leaf's decoded device buffers. For a leaf of a nested column they
/// hold a slot per level position (nulls where the definition level is below
/// the leaf's maximum) and come with the levels; `nesting` turns them into
/// the column's arrays.
#[derive(Debug)]
pub(crate) struct LeafOutput {
    /// Index into the plan's columns.
    pub column: usize,
    /// Index into that column's leaves.
    pub leaf: usize,
    /// What the buffers hold.
    pub device_type: DataType,
    /// Values (rows, or level positions).
    pub len: usize,
    /// Nulls among them.
    pub null_count: usize,
    /// Validity bitmap, for a leaf with definition levels.
    pub validity: Option<DeviceBuffer>,
    /// String offsets.
    pub offsets: Option<DeviceBuffer>,
    /// Values, bits or characters.
    pub values: DeviceBuffer,
    /// Nested leaves: u16 repetition levels, if the leaf is repeated.
    pub rep_levels: Option<DeviceBuffer>,
    /// Nested leaves: u16 definition levels, if the leaf has any.
    pub def_levels: Option<DeviceBuffer>,
}

/// A leaf as the value kernels see it (their `column`).
struct KernelColumn<'a> {
    column: usize,
    leaf: usize,
    recipe: &'a ColumnRecipe,
    /// Leaf of a nested column: decoded at level positions, levels kept.
    nested: bool,
    /// Output slots: rows, or level positions for a nested leaf.
    len: usize,
}

/// Decodes the (decompressed) pages of `table` into device buffers, one
/// [`LeafOutput`] per planned leaf (columns in order, their leaves in order),
/// following `recipes`. A flat leaf has a value per row of its chunks'
/// pages; a nested one a value per level position (the chunks' value counts).
pub(crate) fn decode_columns(
    plan: &ReadPlan,
    table: &PageTable,
    dec_pages: &[(u64, u32)],
    recipes: &[ColumnRecipes],
    stream: &Arc<GpuStream>,
) -> Result<Vec<LeafOutput>> {
    let has_dba = delta_byte_array_leaves(plan, recipes, |ci| {
        table.chunks[ci].data.iter().any(|&pi| parquet_encoding(table.pages[pi].encoding) == Some(Encoding::DELTA_BYTE_ARRAY))
    });
    let layout = ValueLayout::new(plan, recipes, has_dba, stream)?;
    let group = layout
        .decode_group(plan, table, dec_pages, 0, stream)?
        .ok_or_else(|| crate::error::Error::Internal("the pages' own encodings were not laid out".into()))?;
    layout.finish(plan, vec![group], stream)
}

/// Per leaf of the plan (in kernel column order): whether `dba(chunk)` says
/// one of its chunks has DELTA_BYTE_ARRAY pages.
fn delta_byte_array_leaves(plan: &ReadPlan, recipes: &[ColumnRecipes], dba: impl Fn(usize) -> bool) -> Vec<bool> {
    let (_, kcol_of_chunk) = kernel_columns(plan, recipes);
    let mut out = vec![false; recipes.iter().map(|r| r.leaves.len()).sum()];
    for ci in 0..plan.chunks.len() {
        out[kcol_of_chunk[ci]] |= dba(ci);
    }
    out
}

/// Per leaf (in kernel column order), whether the footer lists
/// DELTA_BYTE_ARRAY among its chunks' encodings: the layout of a read whose
/// groups decode before all its pages are known. A group whose pages say
/// otherwise is not decoded there (see [`ValueLayout::decode_group`]).
pub(crate) fn delta_byte_array_leaves_of_footer(plan: &ReadPlan, recipes: &[ColumnRecipes]) -> Vec<bool> {
    let metadata = plan.metadata();
    delta_byte_array_leaves(plan, recipes, |ci| {
        let c = &plan.chunks[ci];
        metadata
            .row_groups()
            .get(c.row_group)
            .and_then(|rg| rg.columns().get(plan.leaf_of(c).leaf_index))
            .is_none_or(|cc| cc.encodings().any(|e| e == Encoding::DELTA_BYTE_ARRAY))
    })
}

/// The plan's leaves as kernel columns, and each chunk's kernel column.
fn kernel_columns<'r>(plan: &ReadPlan, recipes: &'r [ColumnRecipes]) -> (Vec<KernelColumn<'r>>, Vec<usize>) {
    let mut kcols: Vec<KernelColumn> = Vec::new();
    let mut kcol_index: Vec<Vec<usize>> = Vec::with_capacity(recipes.len());
    for (column, r) in recipes.iter().enumerate() {
        let mut idx = Vec::with_capacity(r.leaves.len());
        for (leaf, recipe) in r.leaves.iter().enumerate() {
            idx.push(kcols.len());
            kcols.push(KernelColumn { column, leaf, recipe, nested: r.nest.is_some(), len: 0 });
        }
        kcol_index.push(idx);
    }
    let kcol_of_chunk: Vec<usize> = plan.chunks.iter().map(|c| kcol_index[c.column][c.leaf]).collect();
    (kcols, kcol_of_chunk)
}

/// The output buffers and column table of a whole plan, laid out before
/// any page is decoded: values, validity and levels at every row (or level
/// position) of the plan, the string columns' per-row scratch arrays.
/// Groups of the plan's chunks ([`ValueLayout::decode_group`]) decode into
/// it in any order, each on its own stream; [`ValueLayout::finish`] then
/// fills the strings, whose characters need every group's sizes.
pub(crate) struct ValueLayout<'r> {
    kcols: Vec<KernelColumn<'r>>,
    kcol_of_chunk: Vec<usize>,
    outputs: Vec<Outputs>,
    descs: Vec<ColumnDesc>,
    level_buffers: Vec<(Option<DeviceBuffer>, Option<DeviceBuffer>)>,
    null_counts: DeviceBuffer,
    has_dba: Vec<bool>,
    /// `descs` on the device (without string offsets and characters).
    d_columns: DeviceBuffer,
}

/// What a group's pass leaves for the last one: its string pages (sized,
/// with their character counts) and the dictionary entries they point into.
pub(crate) struct GroupValues {
    str_pages: Vec<PageDesc>,
    str_origin: Vec<PageOrigin>,
    page_chars: Vec<u64>,
    _entries: DeviceBuffer,
}

impl<'r> ValueLayout<'r> {
    /// Allocates the outputs of `plan` on `stream` (and waits for them):
    /// `has_dba` says which leaves get the prefix arrays of DELTA_BYTE_ARRAY
    /// pages.
    pub(crate) fn new(plan: &ReadPlan, recipes: &'r [ColumnRecipes], has_dba: Vec<bool>, stream: &Arc<GpuStream>) -> Result<ValueLayout<'r>> {
        let (mut kcols, kcol_of_chunk) = kernel_columns(plan, recipes);
        let mut levels = vec![0u64; kcols.len()];
        for (ci, c) in plan.chunks.iter().enumerate() {
            // The plan checked that each leaf's values add up within an i64.
            levels[kcol_of_chunk[ci]] += c.num_values;
        }
        // A flat leaf has a value (or null) per row: its rows are its values
        // (the callers checked, chunk by chunk), which differ between columns
        // where a row window skipped pages.
        for (k, kc) in kcols.iter_mut().enumerate() {
            kc.len = usize::try_from(levels[k])
                .map_err(|_| unsupported(plan, kc.column, format!("{} level positions do not fit this machine", levels[k])))?;
        }
        let ncols = kcols.len();
        let null_counts = DeviceBuffer::alloc(stream, 8 * ncols.max(1) as u64, "null counts")?;
        null_counts.fill(stream, 0)?;

        let mut outputs: Vec<Outputs> = Vec::with_capacity(ncols);
        let mut descs: Vec<ColumnDesc> = Vec::with_capacity(ncols);
        let mut level_buffers: Vec<(Option<DeviceBuffer>, Option<DeviceBuffer>)> = Vec::with_capacity(ncols);
        for (ci, kc) in kcols.iter().enumerate() {
            let (r, num_rows) = (kc.recipe, kc.len);
            let leaf = &plan.columns[kc.column].leaves[kc.leaf];
            let nullable = leaf.max_def_level > 0;
            let level_array = |max: i16, what: &'static str| -> Result<Option<DeviceBuffer>> {
                if !kc.nested || max == 0 {
                    return Ok(None);
                }
                Ok(Some(DeviceBuffer::alloc(stream, 2 * num_rows.max(1) as u64, what)?))
            };
            let rep_levels = level_array(leaf.max_rep_level, "repetition levels")?;
            let def_levels = level_array(leaf.max_def_level, "definition levels")?;
            let validity = if nullable {
                let v = DeviceBuffer::alloc(stream, bitmap_bytes(num_rows), "validity")?;
                v.fill(stream, 0)?;
                Some(v)
            } else {
                None
            };
            let too_many = || unsupported(plan, kc.column, format!("{num_rows} rows of {} bytes overflow a 64-bit size", r.out_width));
            let (values, offsets, scratch) = match r.family {
                Family::Fixed | Family::BytesDecimal => {
                    let bytes = (num_rows as u64).checked_mul(r.out_width as u64).ok_or_else(too_many)?;
                    (DeviceBuffer::alloc(stream, bytes.max(1), "values")?, None, None)
                }
                Family::Bool => {
                    let v = DeviceBuffer::alloc(stream, bitmap_bytes(num_rows), "boolean values")?;
                    v.fill(stream, 0)?;
                    (v, None, None)
                }
                // Characters are allocated once their total is known.
                Family::Strings => (DeviceBuffer::alloc(stream, 0, "characters")?, None, None),
            };
            let scratch = match r.family {
                _ if r.family == Family::Fixed && has_dba[ci] => Some((
                    DeviceBuffer::alloc(stream, 4 * num_rows.max(1) as u64, "string lengths")?,
                    DeviceBuffer::alloc(stream, 4 * num_rows.max(1) as u64, "string sources")?,
                )),
                Family::Strings | Family::BytesDecimal => Some((
                    DeviceBuffer::alloc(stream, 4 * num_rows.max(1) as u64, "string lengths")?,
                    DeviceBuffer::alloc(stream, 4 * num_rows.max(1) as u64, "string sources")?,
                )),
                _ => scratch,
            };
            let prefixes = if has_dba[ci] { Some(DeviceBuffer::alloc(stream, 4 * num_rows.max(1) as u64, "prefix lengths")?) } else { None };
            descs.push(ColumnDesc {
                values: values.ptr(),
                validity: validity.as_ref().map_or(0, |v| v.ptr()),
                offsets: 0,
                chars: 0,
                scratch_len: scratch.as_ref().map_or(0, |s| s.0.ptr()),
                scratch_src: scratch.as_ref().map_or(0, |s| s.1.ptr()),
                scratch_pre: prefixes.as_ref().map_or(0, |s| s.ptr()),
                null_count: null_counts.ptr() + 8 * ci as u64,
                num_rows: num_rows as u64,
                rep_levels: rep_levels.as_ref().map_or(0, |b| b.ptr()),
                def_levels: def_levels.as_ref().map_or(0, |b| b.ptr()),
                mul: r.mul,
                div: r.div,
                kind: r.kind,
                in_width: r.in_width,
                out_width: r.out_width,
                max_def: leaf.max_def_level as u32,
                large_offsets: 0,
                max_rep: leaf.max_rep_level as u32,
            });
            outputs.push(Outputs { values, validity, offsets, scratch, prefixes });
            level_buffers.push((rep_levels, def_levels));
        }
        let d_columns = DeviceBuffer::from_host(stream, as_bytes(&descs), "column table")?;
        // Groups write from streams of their own.
        stream.synchronize()?;
        Ok(ValueLayout { kcols, kcol_of_chunk, outputs, descs, level_buffers, null_counts, has_dba, d_columns })
    }

    /// Decodes one group of the plan's chunks (those from plan chunk
    /// `chunk_base` on, as many as `table` has: a page table of those chunks
    /// alone, `dec_pages` its pages' bytes) into the layout on `stream`:
    /// levels, fixed-width and DELTA_BINARY_PACKED values, string
    /// dictionaries and the string sizes; every page's status is checked.
    /// `None` where a leaf of the group has DELTA_BYTE_ARRAY pages the
    /// layout has no prefix arrays for (its footer did not list the encoding).
    pub(crate) fn decode_group(
        &self,
        plan: &ReadPlan,
        table: &PageTable,
        dec_pages: &[(u64, u32)],
        chunk_base: usize,
        stream: &Arc<GpuStream>,
    ) -> Result<Option<GroupValues>> {
        let kernels = Kernels::for_context(stream.context())?;
        let kcols = &self.kcols;
        let ncols = kcols.len();
        let kcol_of = |local: usize| self.kcol_of_chunk[chunk_base + local];
        for (local, ch) in table.chunks.iter().enumerate() {
            let dba = ch.data.iter().any(|&pi| parquet_encoding(table.pages[pi].encoding) == Some(Encoding::DELTA_BYTE_ARRAY));
            if dba && !self.has_dba[kcol_of(local)] {
                return Ok(None);
            }
        }

        // String dictionaries: an (offset, length) table per dictionary page.
        let mut dict_descs: Vec<DictDesc> = Vec::new();
        let mut dict_origin: Vec<usize> = Vec::new();
        let mut dict_entry_offset: Vec<Option<u64>> = vec![None; table.chunks.len()];
        let mut entries_len = 0u64;
        for (local, ch) in table.chunks.iter().enumerate() {
            let ci = chunk_base + local;
            let fam = kcols[kcol_of(local)].recipe.family;
            if let (Some(d), Family::Strings | Family::BytesDecimal) = (ch.dictionary, fam) {
                let count = table.pages[d].num_values as u64;
                // Each entry takes at least its 4-byte length: a header claiming
                // more entries than that must not size the entry table.
                let size = dec_pages[d].1 as u64;
                if count > size / 4 {
                    return Err(corrupt(
                        plan,
                        ci,
                        0,
                        CorruptKind::TruncatedPage,
                        format!("string dictionary of {count} entries cannot fit its {size} bytes"),
                    ));
                }
                dict_entry_offset[local] = Some(entries_len);
                entries_len += 8 * count;
                let (data, size) = dec_pages[d];
                dict_descs.push(DictDesc { data, entries: 0, size, count: count as u32, status: 0, pad: 0 });
                dict_origin.push(ci);
            }
        }
        let entries = DeviceBuffer::alloc(stream, entries_len.max(8), "dictionary entries")?;
        for (d, off) in dict_descs.iter_mut().zip(dict_entry_offset.iter().flatten()) {
            d.entries = entries.ptr() + off;
        }
        let d_dicts = DeviceBuffer::from_host(stream, as_bytes(&dict_descs), "dictionary table")?;
        if !dict_descs.is_empty() {
            let mut args = KernelArgs::new().arg(d_dicts.ptr()).arg(dict_descs.len() as u32);
            // SAFETY: arguments match gpq_dict_index (one block per dictionary); each entry table has
            // room for `count` pairs.
            unsafe { kernels.launch(Kernel::DictIndex, launch_grid(dict_descs.len())?, BLOCK, 0, stream, &mut args)? };
        }

        // Page descriptors, split by kernel family; rows counted from where
        // the group starts in each column.
        let mut fixed_pages: Vec<PageDesc> = Vec::new();
        let mut fixed_origin: Vec<PageOrigin> = Vec::new();
        let mut delta_pages: Vec<PageDesc> = Vec::new();
        let mut delta_origin: Vec<PageOrigin> = Vec::new();
        let mut str_pages: Vec<PageDesc> = Vec::new();
        let mut str_origin: Vec<PageOrigin> = Vec::new();
        let mut level_pages: Vec<PageDesc> = Vec::new();
        let mut level_origin: Vec<PageOrigin> = Vec::new();
        let mut row_of_column = vec![0u64; ncols];
        for (ci, c) in plan.chunks[..chunk_base].iter().enumerate() {
            row_of_column[self.kcol_of_chunk[ci]] += c.num_values;
        }
        let group_start = row_of_column.clone();
        let mut group_values = vec![0u64; ncols];
        for (local, ch) in table.chunks.iter().enumerate() {
            let ci = chunk_base + local;
            let col = kcol_of(local);
            group_values[col] += plan.chunks[ci].num_values;
            let r = kcols[col].recipe;
            let (dict, dict_data, dict_count) = match ch.dictionary {
                None => (0, 0, 0),
                Some(d) => {
                    let (ptr, size) = dec_pages[d];
                    let count = table.pages[d].num_values as u32;
                    match r.family {
                        Family::Strings | Family::BytesDecimal => {
                            (entries.ptr() + dict_entry_offset[local].expect("indexed dictionary"), ptr, count)
                        }
                        _ => {
                            if count as u64 * r.in_width as u64 > size as u64 {
                                return Err(corrupt(
                                    plan,
                                    ci,
                                    0,
                                    CorruptKind::TruncatedPage,
                                    format!("dictionary of {count} values needs more than its {size} bytes"),
                                ));
                            }
                            (ptr, 0, count)
                        }
                    }
                }
            };
            for &pi in &ch.data {
                let p = &table.pages[pi];
                let (data, size) = dec_pages[pi];
                let desc = PageDesc {
                    data,
                    dict,
                    dict_data,
                    row_start: row_of_column[col],
                    char_base: 0,
                    size,
                    num_values: p.num_values as u32,
                    dict_count,
                    encoding: p.encoding,
                    level_mode: level_mode(p),
                    def_len: p.def_len as u32,
                    rep_len: p.rep_len as u32,
                    column: col as u32,
                    status: 0,
                    v2_nulls: if p.page_type == page_type::DATA_V2 && p.num_nulls >= 0 { p.num_nulls as u32 + 1 } else { 0 },
                };
                row_of_column[col] += p.num_values as u64;
                let origin = PageOrigin { chunk: ci, page_no: table.page_in_chunk(pi) };
                if self.descs[col].def_levels != 0 {
                    level_pages.push(desc);
                    level_origin.push(origin);
                }
                let (pages, origins) = match route(r.family, p.encoding) {
                    Route::Fixed => (&mut fixed_pages, &mut fixed_origin),
                    Route::Delta => (&mut delta_pages, &mut delta_origin),
                    Route::Strings => (&mut str_pages, &mut str_origin),
                };
                pages.push(desc);
                origins.push(origin);
            }
        }
        for col in 0..ncols {
            let rows = row_of_column[col] - group_start[col];
            if rows != group_values[col] {
                // Each chunk's values were checked against its metadata; only a
                // row group whose chunks disagree on the row count gets here.
                return Err(unsupported(plan, kcols[col].column, format!("pages hold {rows} rows, the row groups {}", group_values[col])));
            }
        }

        let d_columns = &self.d_columns;
        let d_levels = DeviceBuffer::from_host(stream, as_bytes(&level_pages), "level page table")?;
        if !level_pages.is_empty() {
            let mut args = KernelArgs::new().arg(d_levels.ptr()).arg(d_columns.ptr());
            // SAFETY: arguments match gpq_decode_levels; each nested leaf's level arrays hold its level positions.
            unsafe { kernels.launch(Kernel::DecodeLevels, launch_grid(level_pages.len())?, BLOCK, 0, stream, &mut args)? };
        }
        let d_fixed = DeviceBuffer::from_host(stream, as_bytes(&fixed_pages), "fixed page table")?;
        if !fixed_pages.is_empty() {
            let mut args = KernelArgs::new().arg(d_fixed.ptr()).arg(d_columns.ptr());
            // SAFETY: arguments match gpq_decode_fixed; outputs hold num_rows values per column.
            unsafe { kernels.launch(Kernel::DecodeFixed, launch_grid(fixed_pages.len())?, BLOCK, 0, stream, &mut args)? };
        }
        let d_delta = DeviceBuffer::from_host(stream, as_bytes(&delta_pages), "delta page table")?;
        if !delta_pages.is_empty() {
            let mut args = KernelArgs::new().arg(d_delta.ptr()).arg(d_columns.ptr());
            // SAFETY: arguments match gpq_decode_delta; outputs hold num_rows values per column.
            unsafe { kernels.launch(Kernel::DecodeDelta, launch_grid(delta_pages.len())?, BLOCK, 0, stream, &mut args)? };
        }

        // Strings: sizes now; characters once every group's sizes are known.
        let mut page_chars = Vec::new();
        if !str_pages.is_empty() {
            let d_str = DeviceBuffer::from_host(stream, as_bytes(&str_pages), "string page table")?;
            let d_page_chars = DeviceBuffer::alloc(stream, 8 * str_pages.len() as u64, "page character counts")?;
            let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr()).arg(d_page_chars.ptr());
            // SAFETY: arguments match gpq_string_sizes; scratch arrays hold num_rows entries.
            unsafe { kernels.launch(Kernel::StringSizes, launch_grid(str_pages.len())?, BLOCK, 0, stream, &mut args)? };
            let delta_strings = str_pages.iter().any(|p| {
                matches!(parquet_encoding(p.encoding), Some(Encoding::DELTA_LENGTH_BYTE_ARRAY | Encoding::DELTA_BYTE_ARRAY))
            });
            if delta_strings {
                let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr()).arg(d_page_chars.ptr());
                // SAFETY: arguments match gpq_delta_string_sizes (each kernel takes only its own pages);
                // scratch arrays, prefix lengths included where DELTA_BYTE_ARRAY pages are, hold num_rows entries.
                unsafe { kernels.launch(Kernel::DeltaStringSizes, launch_grid(str_pages.len())?, BLOCK, 0, stream, &mut args)? };
            }
            check_dicts(plan, &d_dicts, &dict_origin)?;
            page_chars = from_bytes(&d_page_chars.to_host()?);
            let statuses: Vec<PageDesc> = from_bytes(&d_str.to_host()?);
            check_pages(plan, &statuses, &str_origin)?;
        } else {
            check_dicts(plan, &d_dicts, &dict_origin)?;
        }
        stream.synchronize()?;
        let statuses: Vec<PageDesc> = from_bytes(&d_fixed.to_host()?);
        check_pages(plan, &statuses, &fixed_origin)?;
        let statuses: Vec<PageDesc> = from_bytes(&d_delta.to_host()?);
        check_pages(plan, &statuses, &delta_origin)?;
        let statuses: Vec<PageDesc> = from_bytes(&d_levels.to_host()?);
        check_pages(plan, &statuses, &level_origin)?;
        Ok(Some(GroupValues { str_pages, str_origin, page_chars, _entries: entries }))
    }

    /// The last pass, once every group is decoded (their streams
    /// synchronized), on `stream`: character offsets from the groups' string
    /// sizes (groups in plan order), the characters, byte-array decimals and
    /// DELTA_BYTE_ARRAY values; then the leaves' outputs.
    pub(crate) fn finish(self, plan: &ReadPlan, groups: Vec<GroupValues>, stream: &Arc<GpuStream>) -> Result<Vec<LeafOutput>> {
        let kernels = Kernels::for_context(stream.context())?;
        let ValueLayout { kcols, mut outputs, mut descs, level_buffers, null_counts, .. } = self;
        let ncols = kcols.len();
        let mut str_pages: Vec<PageDesc> = Vec::new();
        let mut str_origin: Vec<PageOrigin> = Vec::new();
        let mut col_total = vec![0u64; ncols];
        let mut held = Vec::with_capacity(groups.len());
        for g in groups {
            for (mut p, total) in g.str_pages.into_iter().zip(g.page_chars) {
                let c = p.column as usize;
                p.char_base = col_total[c];
                col_total[c] += total;
                str_pages.push(p);
            }
            str_origin.extend(g.str_origin);
            held.push(g._entries);
        }
        for (ci, kc) in kcols.iter().enumerate() {
            let (r, num_rows) = (kc.recipe, kc.len);
            if r.family != Family::Strings {
                continue;
            }
            let large = matches!(r.device_type, DataType::LargeUtf8 | DataType::LargeBinary) || col_total[ci] > i32::MAX as u64;
            let width = if large { 8 } else { 4 };
            let offsets = DeviceBuffer::alloc(stream, (num_rows as u64 + 1) * width, "offsets")?;
            offsets.fill(stream, 0)?;
            let chars = DeviceBuffer::alloc(stream, col_total[ci].max(1), "characters")?;
            descs[ci].offsets = offsets.ptr();
            descs[ci].chars = chars.ptr();
            descs[ci].large_offsets = large as u32;
            outputs[ci].values = chars;
            outputs[ci].offsets = Some(offsets);
        }
        if !str_pages.is_empty() {
            let d_columns = DeviceBuffer::from_host(stream, as_bytes(&descs), "column table")?;
            let d_str = DeviceBuffer::from_host(stream, as_bytes(&str_pages), "string page table")?;
            // Each kernel skips the pages of the other family.
            if kcols.iter().any(|k| k.recipe.family == Family::Strings) {
                let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr());
                // SAFETY: arguments match gpq_string_chars; offsets hold num_rows + 1 entries and
                // characters the column's total.
                unsafe { kernels.launch(Kernel::StringChars, launch_grid(str_pages.len())?, BLOCK, 0, stream, &mut args)? };
            }
            if kcols.iter().any(|k| k.recipe.family == Family::BytesDecimal) {
                let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr());
                // SAFETY: arguments match gpq_bytes_decimal; values hold num_rows decimals.
                unsafe { kernels.launch(Kernel::BytesDecimal, launch_grid(str_pages.len())?, BLOCK, 0, stream, &mut args)? };
            }
            if str_pages.iter().any(|p| parquet_encoding(p.encoding) == Some(Encoding::DELTA_BYTE_ARRAY)) {
                let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr());
                // SAFETY: arguments match gpq_delta_byte_array_values; after gpq_string_chars (same stream)
                // the offsets exist, and values hold num_rows values per fixed-width column.
                unsafe { kernels.launch(Kernel::DeltaByteArrayValues, launch_grid(str_pages.len())?, 32, 0, stream, &mut args)? };
            }
            stream.synchronize()?;
            let statuses: Vec<PageDesc> = from_bytes(&d_str.to_host()?);
            check_pages(plan, &statuses, &str_origin)?;
        }
        stream.synchronize()?;
        drop(held);
        let nulls: Vec<u64> = from_bytes(&null_counts.to_host()?);

        let mut columns = Vec::with_capacity(ncols);
        for (ci, ((o, kc), (rep_levels, def_levels))) in outputs.into_iter().zip(&kcols).zip(level_buffers).enumerate() {
            let mut device_type = kc.recipe.device_type.clone();
            if descs[ci].large_offsets == 1 {
                device_type = match device_type {
                    DataType::Utf8 => DataType::LargeUtf8,
                    DataType::Binary => DataType::LargeBinary,
                    t => t,
                };
            }
            drop(o.scratch);
            drop(o.prefixes);
            columns.push(LeafOutput {
                column: kc.column,
                leaf: kc.leaf,
                device_type,
                len: kc.len,
                null_count: nulls[ci] as usize,
                validity: o.validity,
                offsets: o.offsets,
                values: o.values,
                rep_levels,
                def_levels,
            });
        }
        Ok(columns)
    }
}

fn check_pages(plan: &ReadPlan, pages: &[PageDesc], origin: &[PageOrigin]) -> Result<()> {
    for (p, o) in pages.iter().zip(origin) {
        if p.status != 0 {
            return Err(corrupt(plan, o.chunk, o.page_no, corrupt_kind(p.status)?, ""));
        }
    }
    Ok(())
}

fn check_dicts(plan: &ReadPlan, d_dicts: &DeviceBuffer, origin: &[usize]) -> Result<()> {
    if origin.is_empty() {
        return Ok(());
    }
    let dicts: Vec<DictDesc> = from_bytes(&d_dicts.to_host()?);
    for (d, &ci) in dicts.iter().zip(origin) {
        if d.status != 0 {
            return Err(corrupt(plan, ci, 0, corrupt_kind(d.status)?, "in the dictionary page"));
        }
    }
    Ok(())
}

/// A grid size for `blocks` blocks (one per page or dictionary).
fn launch_grid(blocks: usize) -> Result<u32> {
    u32::try_from(blocks).map_err(|_| crate::error::Error::Internal(format!("{blocks} blocks in one launch")))
}

/// `PageDesc::level_mode` of a data page: the page version, and for v1
/// pages which level streams are BIT_PACKED.
fn level_mode(p: &PageInfo) -> u32 {
    if p.page_type == page_type::DATA_V2 {
        return levels::V2;
    }
    #[allow(deprecated)]
    let bit_packed = |code| parquet_encoding(code) == Some(Encoding::BIT_PACKED);
    let rep = if bit_packed(p.rep_encoding) { levels::REP_BIT_PACKED } else { 0 };
    let def = if bit_packed(p.def_encoding) { levels::DEF_BIT_PACKED } else { 0 };
    levels::V1 | rep | def
}
