//! Stage 1: page headers, parsed on the device.
//!
//! One thread walks each column chunk's Thrift page headers: a first pass
//! counts pages, the host sizes the page table from the counts, a second pass
//! fills it. The table comes back to the host, which checks it against the
//! footer (value counts, dictionary placement, encodings) before anything is
//! decoded.

use crate::cuda::{DeviceBuffer, as_bytes, from_bytes};
use crate::error::{CorruptKind, Error, Result};
use crate::gpu::status::corrupt_kind;
use crate::gpu::{Kernel, KernelArgs, Kernels};
use crate::io::DeviceChunks;
use crate::plan::{ReadPlan, row_group_rows};

use super::descriptors::{ChunkDesc, PageInfo, page_type};

/// Pages of one chunk, as indices into the page table.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChunkPages {
    /// The dictionary page, if any.
    pub dictionary: Option<usize>,
    /// Data pages in order.
    pub data: Vec<usize>,
    /// Index of the first page of the chunk in the table (for page numbers in errors).
    pub first: usize,
    /// Where the chunk's read skipped pages: the table index of the first
    /// page after them, and how many there were (for page numbers in errors).
    pub resumed: Option<(usize, usize)>,
}

/// The page table of a read: every page header of every chunk, checked
/// against the footer.
#[derive(Debug, Clone, Default)]
pub struct PageTable {
    /// Every page of every chunk, chunk by chunk.
    pub(crate) pages: Vec<PageInfo>,
    /// Per plan chunk.
    pub(crate) chunks: Vec<ChunkPages>,
    /// The device buffer (address, length) the headers were read from.
    pub(crate) source: (u64, u64),
}

impl PageTable {
    /// The page number of page `index` within its chunk in the file (the
    /// dictionary page is page 0; pages a row window skipped count).
    pub(crate) fn page_in_chunk(&self, index: usize) -> usize {
        let c = &self.chunks[self.pages[index].chunk as usize];
        page_number(c.first, c.resumed, index)
    }

    /// Pages in the table (data, dictionary and index pages).
    pub fn num_pages(&self) -> usize {
        self.pages.len()
    }

    /// Fails unless the table was read from `chunks`.
    pub(crate) fn check_source(&self, chunks: &DeviceChunks) -> Result<()> {
        let b = chunks.buffer();
        if self.source != (b.ptr(), b.len()) || self.chunks.len() != chunks.plan().chunks.len() {
            return Err(Error::InvalidOptions("a page table was used with device chunks it was not read from".into()));
        }
        Ok(())
    }
}

/// Builds the error for page `page` of plan chunk `chunk`.
pub(crate) fn corrupt(plan: &ReadPlan, chunk: usize, page: usize, kind: CorruptKind, detail: impl Into<String>) -> Error {
    let c = &plan.chunks[chunk];
    Error::CorruptPage {
        file: plan.path.clone(),
        row_group: c.row_group,
        column: plan.leaf_of(c).path.clone(),
        page,
        kind,
        detail: detail.into(),
    }
}

/// Parses every chunk's page headers on the device.
pub(crate) fn read_page_headers(chunks: &DeviceChunks) -> Result<PageTable> {
    let (plan, raw, stream) = (chunks.plan(), chunks.buffer(), chunks.stream());
    let n = plan.chunks.len();
    if n == 0 {
        return Ok(PageTable { source: (raw.ptr(), raw.len()), ..Default::default() });
    }
    let kernels = Kernels::for_context(stream.context())?;
    let mut descs: Vec<ChunkDesc> = plan
        .chunks
        .iter()
        .map(|c| ChunkDesc {
            offset: c.device_offset,
            len: c.len,
            resume_offset: c.resume.map_or(0, |r| r.device_offset),
            resume_len: c.resume.map_or(0, |r| r.len),
            skipped_pages: c.resume.map_or(0, |r| r.skipped_pages),
            ..Default::default()
        })
        .collect();
    let d_chunks = DeviceBuffer::from_host(stream, as_bytes(&descs), "chunk table")?;
    let grid = u32::try_from(n.div_ceil(128)).map_err(|_| Error::Unsupported {
        file: plan.path.clone(),
        column: String::new(),
        what: format!("{n} column chunks in one read"),
    })?;
    let mut args = KernelArgs::new().arg(raw.ptr()).arg(d_chunks.ptr()).arg(n as u32);
    // SAFETY: arguments match gpq_count_pages; every chunk lies inside `raw`.
    unsafe { kernels.launch(Kernel::CountPages, grid, 128, 0, stream, &mut args)? };
    let counted: Vec<ChunkDesc> = from_bytes(&d_chunks.to_host()?);
    check_chunks(plan, &counted)?;

    let mut total = 0u32;
    for (d, c) in descs.iter_mut().zip(&counted) {
        d.page_start = total;
        d.page_count = c.page_count;
        total = total.checked_add(c.page_count).ok_or_else(|| Error::Unsupported {
            file: plan.path.clone(),
            column: String::new(),
            what: "more than 2^32 pages in one read".into(),
        })?;
    }
    let d_chunks = DeviceBuffer::from_host(stream, as_bytes(&descs), "chunk table")?;
    let d_pages = DeviceBuffer::alloc(stream, total as u64 * std::mem::size_of::<PageInfo>() as u64, "page table")?;
    let mut args = KernelArgs::new().arg(raw.ptr()).arg(d_chunks.ptr()).arg(n as u32).arg(d_pages.ptr());
    // SAFETY: arguments match gpq_parse_pages; the page table has a slot for every counted page.
    unsafe { kernels.launch(Kernel::ParsePages, grid, 128, 0, stream, &mut args)? };
    let parsed: Vec<ChunkDesc> = from_bytes(&d_chunks.to_host()?);
    check_chunks(plan, &parsed)?;
    let pages: Vec<PageInfo> = from_bytes(&d_pages.to_host()?);

    let mut table = PageTable { pages, chunks: Vec::with_capacity(n), source: (raw.ptr(), raw.len()) };
    for (ci, d) in descs.iter().enumerate() {
        table.chunks.push(classify(plan, ci, &table.pages, d.page_start as usize, d.page_count as usize)?);
    }
    Ok(table)
}

fn check_chunks(plan: &ReadPlan, descs: &[ChunkDesc]) -> Result<()> {
    for (i, d) in descs.iter().enumerate() {
        if d.status != 0 {
            return Err(corrupt(plan, i, d.error_page as usize, corrupt_kind(d.status)?, ""));
        }
    }
    Ok(())
}

/// Sorts a chunk's pages into dictionary and data pages and checks them against the footer.
fn classify(plan: &ReadPlan, ci: usize, pages: &[PageInfo], first: usize, count: usize) -> Result<ChunkPages> {
    let chunk = &plan.chunks[ci];
    let resumed = chunk.resume.map(|r| {
        let after = pages[first..first + count].iter().position(|p| p.header_offset >= r.device_offset).unwrap_or(count);
        (first + after, r.skipped_pages as usize)
    });
    let number = |k: usize| page_number(first, resumed, first + k);
    let mut out = ChunkPages { first, resumed, ..Default::default() };
    let mut values = 0u64;
    for (k, p) in pages[first..first + count].iter().enumerate() {
        let i = first + k;
        match p.page_type {
            page_type::DICTIONARY => {
                if out.dictionary.is_some() || !out.data.is_empty() {
                    return Err(corrupt(plan, ci, number(k), CorruptKind::DictionaryMisplaced, ""));
                }
                out.dictionary = Some(i);
            }
            page_type::DATA_V1 | page_type::DATA_V2 => {
                if p.page_type == page_type::DATA_V2 && p.num_rows != p.num_values && plan.leaf_of(chunk).max_rep_level == 0 {
                    return Err(corrupt(
                        plan,
                        ci,
                        number(k),
                        CorruptKind::RowCountMismatch,
                        format!("v2 page of a flat column has {} rows but {} values", p.num_rows, p.num_values),
                    ));
                }
                values += p.num_values as u64;
                out.data.push(i);
            }
            _ => {} // index pages carry nothing to decode
        }
    }
    if values != chunk.num_values {
        let last = number(count.saturating_sub(1));
        let source = if chunk.num_rows == row_group_rows(plan.metadata(), chunk.row_group) {
            "the column chunk metadata"
        } else {
            "the offset index (for the pages read)"
        };
        return Err(corrupt(
            plan,
            ci,
            last,
            CorruptKind::ValueCountMismatch,
            format!("pages hold {values} values, {source} says {}", chunk.num_values),
        ));
    }
    Ok(out)
}

/// The page number, within its chunk in the file, of table entry `index` of
/// a chunk whose pages start at `first` (the dictionary page is page 0);
/// `resumed`: where the read skipped pages, and how many (they count).
fn page_number(first: usize, resumed: Option<(usize, usize)>, index: usize) -> usize {
    let skipped = resumed.filter(|&(from, _)| index >= from).map_or(0, |(_, n)| n);
    index - first + skipped
}
