//! The GPU decode stage: column-chunk bytes in device memory become Arrow
//! buffers in device memory.
//!
//! Stages, one module each: `pages` parses page headers on the device and
//! checks them against the footer; `checksums` verifies page CRCs when asked;
//! `decompress` runs nvCOMP (or the CPU
//! fallback, `cpu_codecs`); `values` lays out the outputs and launches
//! the value kernels: dictionary indexing for string dictionaries,
//! fixed-width and boolean decoding, DELTA_BINARY_PACKED integers, and for
//! strings a sizes pass, a host sum of page totals, and a characters pass.
//! `types` decides per column which kernel and conversion produce its Arrow
//! type; `nesting` builds structs, lists and maps from the leaves' levels;
//! `layouts` makes `Utf8View`/`BinaryView` views and large-list offsets where
//! the schema asks for them. Encodings: PLAIN, dictionaries, RLE booleans, BYTE_STREAM_SPLIT,
//! DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY, each on
//! the physical types Parquet allows it for, mixed freely within a chunk.
//!
//! nvCOMP is found through `GPQ_NVCOMP_LIB` (an absolute path), the dynamic
//! loader's search path, and known absolute install locations: the
//! `nvidia/libnvcomp/lib64` folder of the active Python environment
//! (`VIRTUAL_ENV` or `CONDA_PREFIX`), of the user's and of the system's
//! site-packages, and `/usr/local/cuda/lib64`. Never a path relative to the
//! current directory.
//!
//! With the `test-util` feature the stages can be run one by one
//! (`read_page_headers`, `decompress_pages`, `decode_values`), for the
//! criterion benches.

pub(crate) mod checksums;
pub(crate) mod cpu_codecs;
pub(crate) mod decompress;
pub(crate) mod descriptors;
pub(crate) mod isolated;
pub(crate) mod nesting;
pub(crate) mod nvcomp;
pub(crate) mod pages;
pub(crate) mod route;
pub(crate) mod types;
pub(crate) mod values;
pub(crate) mod layouts;

use std::time::{Duration, Instant};

use arrow::datatypes::{DataType, FieldRef};
use parquet::basic::{Encoding, Type as PhysicalType};

use crate::cuda::DeviceBuffer;
use crate::error::{CorruptKind, Error, Result};
use crate::io::DeviceChunks;
use crate::options::ReadOptions;
use crate::plan::ReadPlan;
use crate::stats::DecompressStats;

use crate::plan::nesting::{NestKind, NestNode, nest_tree};
use descriptors::page_type;
use pages::corrupt;
use types::{ColumnRecipe, Family};

pub use decompress::Decompressed;
pub(crate) use values::GroupValues;
pub use pages::PageTable;

/// One decoded column's device buffers, in Arrow layout.
#[derive(Debug)]
pub struct DecodedColumn {
    /// The field as the result schema has it.
    pub field: FieldRef,
    /// What the device buffers hold (may differ from the field's type).
    pub device_type: DataType,
    /// Rows.
    pub len: usize,
    /// Nulls.
    pub null_count: usize,
    /// Validity bitmap (LSB first), if the column is nullable.
    pub validity: Option<DeviceBuffer>,
    /// Offsets (`i32`, or `i64` for large types) of string and binary columns.
    pub offsets: Option<DeviceBuffer>,
    /// Values: fixed-width values, a bitmap for booleans, the characters of
    /// strings, the 16-byte views of view types; empty for structs, lists
    /// and maps.
    pub values: DeviceBuffer,
    /// View types: the characters the views point into.
    pub view_data: Option<DeviceBuffer>,
    /// Struct fields, the list element, the map entries.
    pub children: Vec<DecodedColumn>,
}

/// What the decode stage produced.
#[derive(Debug)]
pub struct Decoded {
    /// One column per planned column, in order.
    pub columns: Vec<DecodedColumn>,
    /// Page headers on the device.
    pub page_headers: Duration,
    /// Decompression.
    pub decompress: Duration,
    /// Value decoding.
    pub decode: Duration,
    /// Decompression report.
    pub decompression: DecompressStats,
    /// Pages decoded (data and dictionary).
    pub pages: usize,
    /// Pages whose checksum was verified.
    pub checksummed_pages: usize,
}

/// The Parquet encoding a page header's Thrift code names.
pub(crate) fn parquet_encoding(code: u32) -> Option<Encoding> {
    Some(match code {
        0 => Encoding::PLAIN,
        2 => Encoding::PLAIN_DICTIONARY,
        3 => Encoding::RLE,
        #[allow(deprecated)]
        4 => Encoding::BIT_PACKED,
        5 => Encoding::DELTA_BINARY_PACKED,
        6 => Encoding::DELTA_LENGTH_BYTE_ARRAY,
        7 => Encoding::DELTA_BYTE_ARRAY,
        8 => Encoding::RLE_DICTIONARY,
        9 => Encoding::BYTE_STREAM_SPLIT,
        _ => return None,
    })
}

fn encoding_name(code: u32) -> String {
    parquet_encoding(code).map_or_else(|| format!("unknown encoding {code}"), |e| e.to_string())
}

fn unsupported(plan: &ReadPlan, column: usize, what: impl Into<String>) -> Error {
    Error::Unsupported {
        file: plan.path.clone(),
        column: plan.columns[column].field.name().clone(),
        what: what.into(),
    }
}

/// How one planned column is decoded.
#[derive(Debug, Clone)]
pub(crate) struct ColumnRecipes {
    /// One recipe per leaf, in the order of `PlannedColumn::leaves`.
    pub leaves: Vec<ColumnRecipe>,
    /// Structs, lists and maps: how the leaves' levels make the arrays.
    pub nest: Option<NestNode>,
}

/// Decides how each column is decoded, or why it cannot be.
pub(crate) fn column_recipes(plan: &ReadPlan) -> Result<Vec<ColumnRecipes>> {
    let schema = plan.metadata.file_metadata().schema_descr();
    let natural = crate::plan::arrow_schema_of(&plan.path, schema, None)?;
    plan.columns
        .iter()
        .enumerate()
        .map(|(ci, col)| {
            let recipe = |leaf: &crate::plan::LeafColumn, target: &DataType, natural_type: &DataType| {
                types::recipe(leaf, target, natural_type).ok_or_else(|| {
                    unsupported(plan, ci, format!("{:?} stored as {natural_type} cannot be decoded to {target}", leaf.physical_type))
                })
            };
            if col.is_flat() && col.leaves[0].max_def_level <= 1 {
                let natural_type = natural
                    .fields()
                    .get(col.root_index)
                    .ok_or_else(|| Error::Internal(format!("column {ci} has root {} of {}", col.root_index, natural.fields().len())))?
                    .data_type();
                return Ok(ColumnRecipes { leaves: vec![recipe(&col.leaves[0], col.field.data_type(), natural_type)?], nest: None });
            }
            let tree = nest_tree(&plan.path, schema, col, &col.field)?;
            // The same leaves without the embedded Arrow schema: the types Parquet implies.
            let mask = parquet::arrow::ProjectionMask::leaves(schema, col.leaves.iter().map(|l| l.leaf_index));
            let pruned = crate::plan::footer::catch_parquet_panic("converting the schema to Arrow", || {
                parquet::arrow::parquet_to_arrow_schema_by_columns(schema, mask, None)
            })
            .map_err(|source| Error::Metadata { file: plan.path.clone(), source })?;
            let natural_field = pruned
                .fields()
                .iter()
                .find(|f| f.name() == col.field.name())
                .ok_or_else(|| Error::Internal(format!("column {} is not in its own schema", col.field.name())))?;
            let natural_tree = nest_tree(&plan.path, schema, col, natural_field)?;
            let (mut targets, mut naturals) = (vec![None; col.leaves.len()], vec![None; col.leaves.len()]);
            leaf_types(&tree, &mut targets);
            leaf_types(&natural_tree, &mut naturals);
            let leaves = col
                .leaves
                .iter()
                .zip(targets.into_iter().zip(naturals))
                .map(|(leaf, types)| match types {
                    (Some(t), Some(n)) => recipe(leaf, &t, &n),
                    _ => Err(Error::Internal(format!("leaf {} is missing from its column's tree", leaf.path))),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(ColumnRecipes { leaves, nest: Some(tree) })
        })
        .collect()
}

/// The Arrow type of each leaf of `node`, by position in the planned leaves.
fn leaf_types(node: &NestNode, out: &mut [Option<DataType>]) {
    match node.kind {
        NestKind::Leaf { leaf } => out[leaf] = Some(node.field.data_type().clone()),
        _ => node.children.iter().for_each(|c| leaf_types(c, out)),
    }
}

/// Whether the kernels decode the non-dictionary, non-PLAIN encoding `e`
/// for a column of `physical` type decoded with `recipe` (the encodings
/// Parquet allows for that type).
fn encoding_decodable(e: Encoding, physical: PhysicalType, recipe: &ColumnRecipe) -> bool {
    use PhysicalType as P;
    let family = recipe.family;
    match e {
        Encoding::BYTE_STREAM_SPLIT => {
            family == Family::Fixed && matches!(physical, P::FLOAT | P::DOUBLE | P::INT32 | P::INT64 | P::FIXED_LEN_BYTE_ARRAY)
        }
        Encoding::DELTA_BINARY_PACKED => family == Family::Fixed && matches!(physical, P::INT32 | P::INT64),
        Encoding::DELTA_LENGTH_BYTE_ARRAY => physical == P::BYTE_ARRAY && matches!(family, Family::Strings | Family::BytesDecimal),
        Encoding::DELTA_BYTE_ARRAY => match physical {
            P::BYTE_ARRAY => matches!(family, Family::Strings | Family::BytesDecimal),
            // Prefixes and suffixes rebuild whole values, copied or read as decimals.
            P::FIXED_LEN_BYTE_ARRAY => family == Family::Fixed && matches!(recipe.kind, types::kind::COPY | types::kind::BE_DECIMAL),
            _ => false,
        },
        _ => false,
    }
}

/// Checks that every page uses encodings the kernels decode.
fn check_encodings(plan: &ReadPlan, table: &PageTable, recipes: &[ColumnRecipes]) -> Result<()> {
    for (ci, chunk) in table.chunks.iter().enumerate() {
        let c = &plan.chunks[ci];
        let recipe = &recipes[c.column].leaves[c.leaf];
        let leaf = plan.leaf_of(c);
        if let Some(d) = chunk.dictionary {
            let e = parquet_encoding(table.pages[d].encoding);
            if !matches!(e, Some(Encoding::PLAIN | Encoding::PLAIN_DICTIONARY)) {
                return Err(corrupt(plan, ci, 0, CorruptKind::DictionaryEncoding, encoding_name(table.pages[d].encoding)));
            }
            if recipe.family == Family::Bool {
                return Err(unsupported(plan, c.column, "dictionary-encoded BOOLEAN"));
            }
        }
        for &pi in &chunk.data {
            let p = &table.pages[pi];
            let e = parquet_encoding(p.encoding);
            let ok = matches!(e, Some(Encoding::PLAIN | Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY))
                || (e == Some(Encoding::RLE) && recipe.family == Family::Bool)
                || e.is_some_and(|e| encoding_decodable(e, leaf.physical_type, recipe));
            if !ok {
                return Err(unsupported(plan, c.column, format!("{} encoding (page {})", encoding_name(p.encoding), table.page_in_chunk(pi))));
            }
            if matches!(e, Some(Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY)) && chunk.dictionary.is_none() {
                return Err(corrupt(plan, ci, table.page_in_chunk(pi), CorruptKind::NoDictionary, ""));
            }
            #[allow(deprecated)]
            let level_encoding = |code| matches!(parquet_encoding(code), Some(Encoding::RLE | Encoding::BIT_PACKED));
            if p.page_type == page_type::DATA_V1 && leaf.max_def_level > 0 && !level_encoding(p.def_encoding) {
                return Err(unsupported(plan, c.column, format!("{} definition levels", encoding_name(p.def_encoding))));
            }
            if p.page_type == page_type::DATA_V1 && leaf.max_rep_level > 0 && !level_encoding(p.rep_encoding) {
                return Err(unsupported(plan, c.column, format!("{} repetition levels", encoding_name(p.rep_encoding))));
            }
        }
    }
    Ok(())
}

/// Checks each chunk's values against its rows: without repetition a row has
/// one level (so a flat leaf's rows are its values, which the decoder sizes
/// it by); with it, at least one.
fn check_value_counts(plan: &ReadPlan) -> Result<()> {
    for (ci, c) in plan.chunks.iter().enumerate() {
        let repeated = plan.leaf_of(c).max_rep_level > 0;
        if (!repeated && c.num_values != c.num_rows) || (repeated && c.num_values < c.num_rows) {
            return Err(corrupt(
                plan,
                ci,
                0,
                CorruptKind::ValueCountMismatch,
                format!("{} values in a column chunk of {} rows", c.num_values, c.num_rows),
            ));
        }
    }
    Ok(())
}

/// Decodes the chunks of a read into device columns, as `options` say: the
/// decompressor, whether compressed pages pass the device's structural check
/// before nvCOMP sees them, whether page checksums are verified.
pub(crate) fn decode(chunks: &DeviceChunks, options: &ReadOptions) -> Result<Decoded> {
    let plan = chunks.plan();
    let recipes = column_recipes(plan)?;
    let prepared = prepare(chunks, &recipes, options)?;
    finish(plan, &recipes, Pages::one(prepared), chunks.stream())
}

/// A group's pages parsed, checked and decompressed, ready to decode.
pub(crate) struct Prepared {
    table: PageTable,
    dec: Decompressed,
    page_headers: Duration,
    decompress: Duration,
    checksummed_pages: usize,
}

/// Stages 1 and 2 over `chunks`: page headers (checked against the footer
/// and the decoders), checksums when asked, decompression. The chunks'
/// stream is synchronized when this returns.
pub(crate) fn prepare(chunks: &DeviceChunks, recipes: &[ColumnRecipes], options: &ReadOptions) -> Result<Prepared> {
    let (mode, check_pages) = (options.decompress, !options.skip_compressed_page_checks);
    let plan = chunks.plan();
    let t = Instant::now();
    let table = pages::read_page_headers(chunks)?;
    check_encodings(plan, &table, recipes)?;
    check_value_counts(plan)?;
    let checksummed_pages = if options.verify_page_checksums { checksums::verify_page_checksums(chunks, &table)? } else { 0 };
    let page_headers = t.elapsed();

    let t = Instant::now();
    let dec = decompress::decompress(chunks, &table, mode, check_pages, options.zstd_decoder, options.snappy_decoder)?;
    Ok(Prepared { table, dec, page_headers, decompress: t.elapsed(), checksummed_pages })
}

/// The prepared pages of a whole plan: of one group, or of the consecutive
/// groups of [`ReadPlan::split_row_groups`] joined (their page tables in
/// one, chunk and page indices those of the whole plan).
pub(crate) struct Pages {
    table: PageTable,
    /// Per page of `table`: (device address, bytes) of its decompressed bytes.
    pages: Vec<(u64, u32)>,
    /// What the addresses point into, freed after the decode.
    _hold: Vec<Decompressed>,
    page_headers: Duration,
    decompress: Duration,
    decompression: DecompressStats,
    checksummed_pages: usize,
}

impl Pages {
    /// One group's pages.
    pub(crate) fn one(p: Prepared) -> Pages {
        Pages {
            pages: p.dec.pages.clone(),
            decompression: p.dec.stats.clone(),
            table: p.table,
            _hold: vec![p.dec],
            page_headers: p.page_headers,
            decompress: p.decompress,
            checksummed_pages: p.checksummed_pages,
        }
    }

    /// Consecutive groups' pages joined, in order. Stage times add up (the
    /// groups may have run at the same time).
    pub(crate) fn join(parts: Vec<Prepared>) -> Pages {
        let mut out = Pages {
            table: PageTable::default(),
            pages: Vec::new(),
            _hold: Vec::with_capacity(parts.len()),
            page_headers: Duration::ZERO,
            decompress: Duration::ZERO,
            decompression: DecompressStats::default(),
            checksummed_pages: 0,
        };
        for p in parts {
            let (page_base, chunk_base) = (out.table.pages.len(), out.table.chunks.len() as u32);
            out.table.pages.extend(p.table.pages.iter().map(|info| {
                let mut info = *info;
                info.chunk += chunk_base;
                info
            }));
            out.table.chunks.extend(p.table.chunks.iter().map(|c| pages::ChunkPages {
                dictionary: c.dictionary.map(|d| d + page_base),
                data: c.data.iter().map(|d| d + page_base).collect(),
                first: c.first + page_base,
                resumed: c.resumed.map(|(at, n)| (at + page_base, n)),
            }));
            out.pages.extend_from_slice(&p.dec.pages);
            let (d, s) = (&mut out.decompression, &p.dec.stats);
            d.gpu_pages += s.gpu_pages;
            d.cpu_pages += s.cpu_pages;
            d.compressed_bytes += s.compressed_bytes;
            d.decompressed_bytes += s.decompressed_bytes;
            d.check_rejected += s.check_rejected;
            d.isolated_pages += s.isolated_pages;
            d.device_zstd_pages += s.device_zstd_pages;
            d.device_snappy_pages += s.device_snappy_pages;
            if d.nvcomp_version.is_none() {
                d.nvcomp_version.clone_from(&s.nvcomp_version);
            }
            if d.fallback.is_none() {
                d.fallback.clone_from(&s.fallback);
            }
            out.page_headers += p.page_headers;
            out.decompress += p.decompress;
            out.checksummed_pages += p.checksummed_pages;
            out._hold.push(p.dec);
        }
        out
    }
}

/// Stage 3 over a whole plan's prepared pages, on `stream` (which must be
/// ordered after the work that prepared them: their streams synchronized).
pub(crate) fn finish(plan: &ReadPlan, recipes: &[ColumnRecipes], prepared: Pages, stream: &std::sync::Arc<crate::cuda::GpuStream>) -> Result<Decoded> {
    // Columns read whole decode every row of the row groups; cut to a row
    // window (`ReadPlan::lead_rows`) after.
    let num_rows = usize::try_from(plan.group_rows)
        .map_err(|_| unsupported(plan, 0, format!("{} rows do not fit this machine's address space", plan.group_rows)))?;
    let table = &prepared.table;
    if table.chunks.len() != plan.chunks.len() {
        return Err(Error::Internal(format!("{} chunks of pages for a plan of {}", table.chunks.len(), plan.chunks.len())));
    }
    let pages = table.pages.iter().filter(|p| p.page_type != page_type::INDEX).count();
    let t = Instant::now();
    let leaves = values::decode_columns(plan, table, &prepared.pages, recipes, stream)?;
    let columns = assemble(plan, recipes, leaves, num_rows, stream)?;
    Ok(Decoded {
        columns,
        page_headers: prepared.page_headers,
        decompress: prepared.decompress,
        decode: t.elapsed(),
        decompression: prepared.decompression.clone(),
        pages,
        checksummed_pages: prepared.checksummed_pages,
    })
}

/// The outputs of a whole plan laid out for decoding it group by group
/// ([`decode_group`]), allocated on `stream`. Which leaves get the prefix
/// arrays of DELTA_BYTE_ARRAY pages follows the footer's list of encodings.
pub(crate) fn group_layout<'r>(plan: &ReadPlan, recipes: &'r [ColumnRecipes], stream: &std::sync::Arc<crate::cuda::GpuStream>) -> Result<values::ValueLayout<'r>> {
    values::ValueLayout::new(plan, recipes, values::delta_byte_array_leaves_of_footer(plan, recipes), stream)
}

/// Decodes the values of one group of `plan`'s chunks (from chunk
/// `chunk_base` on, as `prepared` holds them) into `layout` on `stream`:
/// all but the strings' characters. Returns what the last pass needs and
/// the time taken, or `None` where the group has DELTA_BYTE_ARRAY pages its
/// footer did not announce (then the plan is decoded in one pass instead).
pub(crate) fn decode_group(
    plan: &ReadPlan,
    layout: &values::ValueLayout<'_>,
    prepared: &Prepared,
    chunk_base: usize,
    stream: &std::sync::Arc<crate::cuda::GpuStream>,
) -> Result<Option<(values::GroupValues, Duration)>> {
    let t = Instant::now();
    let group = layout.decode_group(plan, &prepared.table, &prepared.dec.pages, chunk_base, stream)?;
    Ok(group.map(|g| (g, t.elapsed())))
}

/// The last pass of a plan decoded group by group, on `stream` (every
/// group's stream synchronized): the strings' characters, then the columns.
/// `pages`: the groups' prepared pages, joined (held until the end);
/// `group_decode`: the time the groups' passes took.
pub(crate) fn finish_groups(
    plan: &ReadPlan,
    recipes: &[ColumnRecipes],
    layout: values::ValueLayout<'_>,
    groups: Vec<values::GroupValues>,
    pages: Pages,
    group_decode: Duration,
    stream: &std::sync::Arc<crate::cuda::GpuStream>,
) -> Result<Decoded> {
    let num_rows = usize::try_from(plan.group_rows)
        .map_err(|_| unsupported(plan, 0, format!("{} rows do not fit this machine's address space", plan.group_rows)))?;
    let t = Instant::now();
    let leaves = layout.finish(plan, groups, stream)?;
    let characters = t.elapsed();
    let columns = assemble(plan, recipes, leaves, num_rows, stream)?;
    tracing::debug!(characters_ms = characters.as_secs_f64() * 1e3, columns_ms = (t.elapsed() - characters).as_secs_f64() * 1e3, "strings' characters, then the columns");
    Ok(Decoded {
        columns,
        page_headers: pages.page_headers,
        decompress: pages.decompress,
        decode: group_decode + t.elapsed(),
        decompression: pages.decompression.clone(),
        pages: pages.table.pages.iter().filter(|p| p.page_type != page_type::INDEX).count(),
        checksummed_pages: pages.checksummed_pages,
    })
}

/// Columns from leaf outputs: flat leaves as they are, nested columns through `nesting`.
fn assemble(
    plan: &ReadPlan,
    recipes: &[ColumnRecipes],
    leaves: Vec<values::LeafOutput>,
    num_rows: usize,
    stream: &std::sync::Arc<crate::cuda::GpuStream>,
) -> Result<Vec<DecodedColumn>> {
    let mut flat: Vec<Option<DecodedColumn>> = (0..recipes.len()).map(|_| None).collect();
    let mut nested: Vec<nesting::NestedColumn> = Vec::new();
    for leaf in leaves {
        let ci = leaf.column;
        match &recipes[ci].nest {
            None => {
                flat[ci] = Some(DecodedColumn {
                    field: plan.columns[ci].field.clone(),
                    device_type: leaf.device_type,
                    len: leaf.len,
                    null_count: leaf.null_count,
                    validity: leaf.validity,
                    offsets: leaf.offsets,
                    values: leaf.values,
                    view_data: None,
                    children: Vec::new(),
                })
            }
            Some(tree) => match nested.last_mut() {
                Some(n) if n.column == ci => {
                    debug_assert_eq!(leaf.leaf, n.leaves.len(), "leaves arrive in order");
                    n.leaves.push(leaf)
                }
                _ => {
                    debug_assert_eq!(leaf.leaf, 0, "leaves arrive in order");
                    nested.push(nesting::NestedColumn { column: ci, tree, leaves: vec![leaf] })
                }
            },
        }
    }
    let order: Vec<usize> = nested.iter().map(|n| n.column).collect();
    for (ci, col) in order.into_iter().zip(nesting::assemble(plan, nested, num_rows, stream)?) {
        flat[ci] = Some(col);
    }
    flat.into_iter()
        .enumerate()
        .map(|(ci, c)| {
            let mut c = c.ok_or_else(|| Error::Internal(format!("column {ci} was not decoded")))?;
            layouts::build_layouts(&plan.path, &mut c, stream)?;
            Ok(c)
        })
        .collect()
}

/// Stage 1 alone: parses and checks every chunk's page headers (`test-util`).
#[cfg(feature = "test-util")]
pub fn read_page_headers(chunks: &DeviceChunks) -> Result<PageTable> {
    pages::read_page_headers(chunks)
}

/// Stage 2 alone: decompresses every page of `table` (`test-util`).
#[cfg(feature = "test-util")]
pub fn decompress_pages(chunks: &DeviceChunks, table: &PageTable, mode: crate::DecompressMode) -> Result<Decompressed> {
    decompress::decompress(chunks, table, mode, true, Default::default(), Default::default())
}

/// The compressed pages of `table` as nvCOMP would get them: (plan chunk,
/// page in chunk, codec, compressed bytes, promised uncompressed size), the
/// bytes copied to the host (`test-util`).
#[cfg(feature = "test-util")]
pub fn compressed_pages(
    chunks: &DeviceChunks,
    table: &PageTable,
) -> Result<Vec<(usize, usize, parquet::basic::Compression, Vec<u8>, u64)>> {
    table.check_source(chunks)?;
    let plan = chunks.plan();
    let base = chunks.buffer().ptr();
    let mut out = Vec::new();
    for (i, p) in table.pages.iter().enumerate() {
        let ci = p.chunk as usize;
        let codec = plan.chunks[ci].codec;
        if p.page_type == page_type::INDEX
            || codec == parquet::basic::Compression::UNCOMPRESSED
            || (p.page_type == page_type::DATA_V2 && p.is_compressed == 0)
        {
            continue;
        }
        let levels = if p.page_type == page_type::DATA_V2 { (p.def_len + p.rep_len) as u64 } else { 0 };
        let (len, promised) = ((p.compressed_size as u64).saturating_sub(levels), (p.uncompressed_size as u64).saturating_sub(levels));
        let bytes = chunks.buffer().copy_range_to_host(p.data_offset + levels, len)?;
        debug_assert!(base != 0 || chunks.buffer().len() == 0);
        out.push((ci, table.page_in_chunk(i), codec, bytes, promised));
    }
    Ok(out)
}

/// Runs the device's structural check of compressed pages (the one made
/// before nvCOMP) over `pages`, each (compressed bytes, promised
/// uncompressed size), on `stream`'s device; returns one verdict per page,
/// `0` for well-formed (`test-util`).
#[cfg(feature = "test-util")]
pub fn check_compressed_pages(
    stream: &std::sync::Arc<crate::cuda::GpuStream>,
    codec: parquet::basic::Compression,
    pages: &[(&[u8], u64)],
) -> Result<Vec<u32>> {
    decompress::check_standalone(stream, codec, pages)
}

/// Runs gpq's ZSTD decoder over `pages`, each (compressed bytes, promised
/// uncompressed size), on `stream`'s device; returns per page its verdict
/// (`0`: decoded to exactly the promised size, else the check's reason) and
/// its output bytes (`test-util`).
#[cfg(feature = "test-util")]
pub fn unzstd_pages(stream: &std::sync::Arc<crate::cuda::GpuStream>, pages: &[(&[u8], u64)]) -> Result<Vec<(u32, Vec<u8>)>> {
    decompress::decoder_standalone(stream, pages, nvcomp::Codec::Zstd)
}

/// Runs gpq's SNAPPY decoder over `pages` as [`unzstd_pages`] runs the ZSTD
/// one; a refused page's verdict is the device check's (`test-util`).
#[cfg(feature = "test-util")]
pub fn unsnappy_pages(stream: &std::sync::Arc<crate::cuda::GpuStream>, pages: &[(&[u8], u64)]) -> Result<Vec<(u32, Vec<u8>)>> {
    decompress::decoder_standalone(stream, pages, nvcomp::Codec::Snappy)
}

/// Stage 3 alone: decodes decompressed pages into device columns (`test-util`).
#[cfg(feature = "test-util")]
pub fn decode_values(chunks: &DeviceChunks, table: &PageTable, pages: &Decompressed) -> Result<Vec<DecodedColumn>> {
    pages.check_source(chunks, table)?;
    let plan = chunks.plan();
    let recipes = column_recipes(plan)?;
    check_encodings(plan, table, &recipes)?;
    check_value_counts(plan)?;
    let leaves = values::decode_columns(plan, table, &pages.pages, &recipes, chunks.stream())?;
    assemble(plan, &recipes, leaves, plan.group_rows as usize, chunks.stream())
}

/// The nvCOMP version this process decompresses with and where it was
/// loaded from, or why nvCOMP is not used (not found, wrong major version). Loads nvCOMP on first call.
pub fn nvcomp_version() -> std::result::Result<String, String> {
    nvcomp::nvcomp().map(|n| format!("{} ({})", n.version, n.path))
}

/// Where the `gpq-nvcomp-worker` executable is, which runs nvCOMP in a
/// process of its own for pages no device check can vouch for (ZSTD, GZIP),
/// or why there is none (then those pages are decompressed on the CPU). It is
/// looked for at `$GPQ_NVCOMP_WORKER` (`off` turns it off), else beside the
/// running executable or in its parent folder.
pub fn nvcomp_worker_path() -> std::result::Result<std::path::PathBuf, String> {
    isolated::worker_path()
}

/// Whether reading `plan` with `options` sends pages to the nvCOMP worker:
/// GZIP chunks (or ZSTD ones for [`DeviceDecoder::Nvcomp`](crate::DeviceDecoder::Nvcomp)), page checks
/// on, nvCOMP allowed.
pub(crate) fn needs_nvcomp_worker(plan: &ReadPlan, options: &ReadOptions) -> bool {
    use parquet::basic::Compression;
    let zstd_in_worker = options.zstd_decoder == crate::options::DeviceDecoder::Nvcomp;
    !options.skip_compressed_page_checks
        && options.decompress != crate::options::DecompressMode::Cpu
        && plan.chunks.iter().any(|c| match c.codec {
            Compression::GZIP(_) => true,
            Compression::ZSTD(_) => zstd_in_worker,
            _ => false,
        })
}
