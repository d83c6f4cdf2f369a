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
    let kernels = Kernels::for_context(stream.context())?;
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

    // Columns with DELTA_BYTE_ARRAY pages keep per-row prefix lengths (and,
    // for FIXED_LEN_BYTE_ARRAY, the string scratch arrays).
    let mut has_dba = vec![false; ncols];
    for (ci, ch) in table.chunks.iter().enumerate() {
        let col = kcol_of_chunk[ci];
        has_dba[col] |= ch.data.iter().any(|&pi| parquet_encoding(table.pages[pi].encoding) == Some(Encoding::DELTA_BYTE_ARRAY));
    }

    // Output buffers and the column table.
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

    // String dictionaries: an (offset, length) table per dictionary page.
    let mut dict_descs: Vec<DictDesc> = Vec::new();
    let mut dict_origin: Vec<usize> = Vec::new();
    let mut dict_entry_offset: Vec<Option<u64>> = vec![None; table.chunks.len()];
    let mut entries_len = 0u64;
    for (ci, ch) in table.chunks.iter().enumerate() {
        let fam = kcols[kcol_of_chunk[ci]].recipe.family;
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
            dict_entry_offset[ci] = Some(entries_len);
            entries_len += 8 * count;
            let (data, size) = dec_pages[d];
            dict_descs.push(DictDesc { data, entries: 0, size, count: count as u32, status: 0, pad: 0 });
            dict_origin.push(ci);
        }
    }
    let entries = DeviceBuffer::alloc(stream, entries_len.max(8), "dictionary entries")?;
    {
        let mut k = 0;
        for (ci, off) in dict_entry_offset.iter().enumerate() {
            if let Some(o) = off {
                debug_assert_eq!(dict_origin[k], ci);
                dict_descs[k].entries = entries.ptr() + o;
                k += 1;
            }
        }
    }
    let d_dicts = DeviceBuffer::from_host(stream, as_bytes(&dict_descs), "dictionary table")?;
    if !dict_descs.is_empty() {
        let mut args = KernelArgs::new().arg(d_dicts.ptr()).arg(dict_descs.len() as u32);
        // SAFETY: arguments match gpq_dict_index (one block per dictionary); each entry table has
        // room for `count` pairs.
        unsafe { kernels.launch(Kernel::DictIndex, launch_grid(dict_descs.len())?, BLOCK, 0, stream, &mut args)? };
    }

    // Page descriptors, split by kernel family.
    let mut fixed_pages: Vec<PageDesc> = Vec::new();
    let mut fixed_origin: Vec<PageOrigin> = Vec::new();
    let mut delta_pages: Vec<PageDesc> = Vec::new();
    let mut delta_origin: Vec<PageOrigin> = Vec::new();
    let mut str_pages: Vec<PageDesc> = Vec::new();
    let mut str_origin: Vec<PageOrigin> = Vec::new();
    let mut level_pages: Vec<PageDesc> = Vec::new();
    let mut level_origin: Vec<PageOrigin> = Vec::new();
    let mut row_of_column = vec![0u64; ncols];
    for (ci, ch) in table.chunks.iter().enumerate() {
        let col = kcol_of_chunk[ci];
        let r = kcols[col].recipe;
        let (dict, dict_data, dict_count) = match ch.dictionary {
            None => (0, 0, 0),
            Some(d) => {
                let (ptr, size) = dec_pages[d];
                let count = table.pages[d].num_values as u32;
                match r.family {
                    Family::Strings | Family::BytesDecimal => {
                        (entries.ptr() + dict_entry_offset[ci].expect("indexed dictionary"), ptr, count)
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
            if descs[col].def_levels != 0 {
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
    for (col, &rows) in row_of_column.iter().enumerate() {
        if rows != kcols[col].len as u64 {
            // Each chunk's values were checked against its metadata; only a
            // row group whose chunks disagree on the row count gets here.
            return Err(unsupported(plan, kcols[col].column, format!("pages hold {rows} rows, the row groups {}", kcols[col].len)));
        }
    }

    let d_columns = DeviceBuffer::from_host(stream, as_bytes(&descs), "column table")?;
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

    // Strings: sizes, then character bases from the page totals, then characters.
    let mut col_total = vec![0u64; ncols];
    let mut d_str = DeviceBuffer::from_host(stream, as_bytes(&str_pages), "string page table")?;
    if !str_pages.is_empty() {
        let page_chars = DeviceBuffer::alloc(stream, 8 * str_pages.len() as u64, "page character counts")?;
        let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr()).arg(page_chars.ptr());
        // SAFETY: arguments match gpq_string_sizes; scratch arrays hold num_rows entries.
        unsafe { kernels.launch(Kernel::StringSizes, launch_grid(str_pages.len())?, BLOCK, 0, stream, &mut args)? };
        let delta_strings = str_pages.iter().any(|p| {
            matches!(parquet_encoding(p.encoding), Some(Encoding::DELTA_LENGTH_BYTE_ARRAY | Encoding::DELTA_BYTE_ARRAY))
        });
        if delta_strings {
            let mut args = KernelArgs::new().arg(d_str.ptr()).arg(d_columns.ptr()).arg(page_chars.ptr());
            // SAFETY: arguments match gpq_delta_string_sizes (each kernel takes only its own pages);
            // scratch arrays, prefix lengths included where DELTA_BYTE_ARRAY pages are, hold num_rows entries.
            unsafe { kernels.launch(Kernel::DeltaStringSizes, launch_grid(str_pages.len())?, BLOCK, 0, stream, &mut args)? };
        }
        check_dicts(plan, &d_dicts, &dict_origin)?;
        let totals: Vec<u64> = from_bytes(&page_chars.to_host()?);
        let statuses: Vec<PageDesc> = from_bytes(&d_str.to_host()?);
        check_pages(plan, &statuses, &str_origin)?;
        for (k, p) in str_pages.iter_mut().enumerate() {
            let c = p.column as usize;
            p.char_base = col_total[c];
            col_total[c] += totals[k];
        }
    } else {
        check_dicts(plan, &d_dicts, &dict_origin)?;
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
        d_str = DeviceBuffer::from_host(stream, as_bytes(&str_pages), "string page table")?;
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
    let statuses: Vec<PageDesc> = from_bytes(&d_fixed.to_host()?);
    check_pages(plan, &statuses, &fixed_origin)?;
    let statuses: Vec<PageDesc> = from_bytes(&d_delta.to_host()?);
    check_pages(plan, &statuses, &delta_origin)?;
    let statuses: Vec<PageDesc> = from_bytes(&d_levels.to_host()?);
    check_pages(plan, &statuses, &level_origin)?;
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
