//! Stage 1b, on request: page checksums verified on the device.
//!
//! Parquet lets a writer put a CRC-32 of each page's stored bytes into the
//! page header. Like arrow-rs, gpq ignores them unless asked
//! ([`ReadOptions::verify_page_checksums`](crate::ReadOptions::verify_page_checksums)):
//! then every page whose header has one (data, dictionary and index pages)
//! is checksummed by `gpq_page_crc` before decompression, one warp per
//! page, and the first page that disagrees fails the read with
//! [`CorruptKind::ChecksumMismatch`]. Pages without a checksum are counted
//! but not checked.

use crate::cuda::{DeviceBuffer, as_bytes, from_bytes};
use crate::error::{CorruptKind, Result};
use crate::gpu::{Kernel, KernelArgs, Kernels};
use crate::io::DeviceChunks;

use super::descriptors::{PageCrcDesc, page_flags};
use super::pages::{PageTable, corrupt};

/// Pages per block of `gpq_page_crc` (page_checksums.cu `CRC_WARPS`).
const PAGES_PER_BLOCK: usize = 4;

/// Verifies the checksum of every page of `table` that has one; returns how
/// many pages had one (all of which matched).
pub(crate) fn verify_page_checksums(chunks: &DeviceChunks, table: &PageTable) -> Result<usize> {
    table.check_source(chunks)?;
    let (plan, stream) = (chunks.plan(), chunks.stream());
    let mut descs = Vec::new();
    let mut which = Vec::new();
    for (i, p) in table.pages.iter().enumerate() {
        if p.flags & page_flags::HAS_CRC != 0 {
            // The page table holds only pages that lie inside their chunk.
            descs.push(PageCrcDesc { offset: p.data_offset, len: p.compressed_size as u64, expected: p.crc, ..Default::default() });
            which.push(i);
        }
    }
    if descs.is_empty() {
        return Ok(0);
    }
    let kernels = Kernels::for_context(stream.context())?;
    let d_descs = DeviceBuffer::from_host(stream, as_bytes(&descs), "page checksum table")?;
    let grid = u32::try_from(descs.len().div_ceil(PAGES_PER_BLOCK))
        .map_err(|_| crate::Error::Internal(format!("{} pages to checksum", descs.len())))?;
    let mut args = KernelArgs::new().arg(chunks.buffer().ptr()).arg(d_descs.ptr()).arg(descs.len() as u32);
    // SAFETY: arguments match gpq_page_crc; every page body lies inside the chunk buffer.
    unsafe { kernels.launch(Kernel::PageCrc, grid, (PAGES_PER_BLOCK * 32) as u32, 0, stream, &mut args)? };
    let done: Vec<PageCrcDesc> = from_bytes(&d_descs.to_host()?);
    for (d, &i) in done.iter().zip(&which) {
        if d.status != 0 {
            let chunk = table.pages[i].chunk as usize;
            return Err(corrupt(
                plan,
                chunk,
                table.page_in_chunk(i),
                CorruptKind::ChecksumMismatch,
                format!("the page's {} stored bytes give CRC-32 {:08x}, its header says {:08x}", d.len, d.computed, d.expected),
            ));
        }
    }
    Ok(descs.len())
}
