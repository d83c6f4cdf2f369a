//! Proof that IO put the right bytes in the right place: a position-weighted
//! checksum of each planned span (a chunk's bytes; two spans where a row
//! window skips pages), computed on the device by a kernel and on the host
//! from the file, which must agree.

use std::os::unix::fs::FileExt;

use crate::cuda::{DeviceBuffer, as_bytes, from_bytes};
use crate::error::{Error, Result};
use crate::io::DeviceChunks;
use crate::plan::ReadPlan;

use super::{Kernel, KernelArgs, Kernels};

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// The checksum of `bytes`, as the `gpq_span_checksum` kernel computes it.
pub fn host_checksum(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0u64, |acc, (i, &b)| {
        acc.wrapping_add((b as u64 + 1).wrapping_mul((i as u64).wrapping_mul(MIX).wrapping_add(1)))
    })
}

/// Device-side checksums of every span of `chunks`, in plan order (one per
/// chunk, two where a row window skips pages).
pub fn device_chunk_checksums(chunks: &DeviceChunks) -> Result<Vec<u64>> {
    let spans: Vec<(u64, u64)> = spans_of(chunks.plan()).map(|(_, device, len)| (device, len)).collect();
    let n = spans.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let stream = chunks.stream();
    let offsets: Vec<u64> = spans.iter().map(|s| s.0).collect();
    let lengths: Vec<u64> = spans.iter().map(|s| s.1).collect();
    let d_off = DeviceBuffer::from_host(stream, as_bytes(&offsets), "checksum offsets")?;
    let d_len = DeviceBuffer::from_host(stream, as_bytes(&lengths), "checksum lengths")?;
    let d_out = DeviceBuffer::alloc(stream, 8 * n as u64, "checksums")?;
    d_out.fill(stream, 0)?;
    let kernels = Kernels::for_context(stream.context())?;
    // Spread each span over several blocks on a GPU; the emulator runs blocks one by one.
    let slices: u32 = if stream.context().is_emulated() { 1 } else { 64 };
    let grid = u32::try_from(n).ok().and_then(|n| n.checked_mul(slices)).ok_or_else(|| {
        Error::InvalidOptions(format!("{n} chunks are too many to checksum in one launch"))
    })?;
    let mut args = KernelArgs::new()
        .arg(chunks.buffer().ptr())
        .arg(d_off.ptr())
        .arg(d_len.ptr())
        .arg(n as u32)
        .arg(slices)
        .arg(d_out.ptr());
    // SAFETY: arguments match gpq_span_checksum; every span lies inside the buffer
    // (DeviceChunks guarantees the plan's chunks do).
    unsafe { kernels.launch(Kernel::SpanChecksum, grid, 256, 0, stream, &mut args)? };
    stream.synchronize()?;
    Ok(from_bytes(&d_out.to_host()?))
}

/// Host-side checksums of every span, read from the file.
pub fn file_chunk_checksums(chunks: &DeviceChunks) -> Result<Vec<u64>> {
    let path = chunks.plan().path();
    let file = std::fs::File::open(path).map_err(|source| Error::Open { file: path.to_path_buf(), source })?;
    spans_of(chunks.plan())
        .map(|(offset, _, len)| {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, offset).map_err(|source| Error::Io { file: path.to_path_buf(), offset, len, source })?;
            Ok(host_checksum(&buf))
        })
        .collect()
}

/// Every span the plan reads, (file offset, device offset, length), chunk
/// by chunk (a chunk that skips pages has two).
fn spans_of(plan: &ReadPlan) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    plan.chunks().iter().flat_map(|c| {
        std::iter::once((c.file_offset, c.device_offset, c.len)).chain(c.resume.map(|r| (r.file_offset, r.device_offset, r.len)))
    })
}
