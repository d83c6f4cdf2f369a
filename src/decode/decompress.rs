//! Stage 2: decompression.
//!
//! Every compressed page gets a slot in one output buffer, laid out so its
//! values start on a 256-byte boundary; a v2 page's uncompressed level bytes
//! are copied just in front, so each page ends up contiguous
//! (`[levels][values]`) for the decoders. Pages of one codec go to nvCOMP in
//! one batched call, largest first. Codecs nvCOMP lacks (BROTLI, Hadoop LZ4),
//! and every codec where nvCOMP is missing or not wanted, are decompressed on
//! the CPU with several threads; that fallback is logged and counted in the
//! statistics. Uncompressed pages are decoded where they lie.
//!
//! nvCOMP trusts its input, and has no checked mode to ask for: its headers
//! (`snappy.h`, `zstd.h`, `lz4.h`, `gzip.h`, `deflate.h` of the wheel gpq
//! loads) call a corrupt buffer undefined behaviour whatever the backend,
//! say the per-page `device_statuses` cannot be relied on for such input,
//! and the decompression options (`nvcompBatched*DecompressOpts_t`) hold
//! only the backend and a sort flag. On the H200 a corrupt SNAPPY page made
//! it read gigabytes out of bounds, losing the context for the rest of the
//! process, and a corrupt ZSTD page made it never finish, after which the
//! process could not even exit. So before nvCOMP runs, the
//! `gpq_check_compressed` kernel walks every SNAPPY and LZ4_RAW page on the
//! device and swaps any page that fails for an empty stream; such pages go
//! to the CPU decoder, whose verdict stands. Where
//! `ReadOptions::snappy_decoder` asks for it, SNAPPY pages go to gpq's own
//! decoder instead (`unsnappy.cu`, a block a page), which checks every tag
//! before it writes and hands any page it refuses to the CPU decoder
//! likewise. ZSTD pages go to gpq's own
//! decoder (`unzstd.cu`), which checks every step as it decodes and hands
//! any page it does not accept to the CPU decoder likewise; it needs neither
//! nvCOMP nor a check in front (`ReadOptions::zstd_decoder` can choose nvCOMP).
//! It decodes each compressed block's sequences into a list first (a
//! thread a block), then the pages from their lists (a warp a page); the
//! lists take device memory in proportion to the sequences (8 bytes each), at most
//! `GPQ_UNZSTD_LIST_BYTES` at once (a batch whose lists need more goes in
//! rounds), and less where the read's budget has less room.
//! GZIP pages cannot be checked completely on the device, so they go to
//! nvCOMP in a worker process (`isolated`), where a fault or a hang costs
//! only the worker, or to the CPU where there is none, unless the caller
//! trusts the input (`ReadOptions::skip_compressed_page_checks`). The sizes pages promise are
//! checked against the footer before anything is allocated, and the wait for
//! nvCOMP has a deadline: a kernel still running then is reported as a lost
//! context (`GpuContext::lose`) instead of a read that never returns.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parquet::basic::Compression;
use tracing::{debug, info, warn};

use super::descriptors::{CopyDesc, page_type};
use super::isolated;
use super::nvcomp::{self, Codec};
use super::pages::{PageTable, corrupt};
use super::route;
use crate::cuda::{DeviceBuffer, GpuStream, PinnedHostPool, as_bytes, from_bytes};
use crate::error::{CorruptKind, Error, Result};
use crate::gpu::{Kernel, KernelArgs, Kernels};
use crate::io::DeviceChunks;
use crate::options::{DecompressMode, DeviceDecoder};
use crate::plan::ReadPlan;
use crate::stats::DecompressStats;

/// Where each page's uncompressed bytes are.
pub struct Decompressed {
    /// Per page of the table: (device address, bytes).
    pub(crate) pages: Vec<(u64, u32)>,
    /// Owns the decompressed pages (read through `pages`).
    pub(crate) _buffer: DeviceBuffer,
    /// Exchange buffers of the nvCOMP worker holding pages it decompressed
    /// (read in place through `pages`); after `_buffer` in drop order.
    pub(crate) _exchanges: Vec<isolated::HeldExchange>,
    /// What happened.
    pub(crate) stats: DecompressStats,
    /// The device chunks (address, length) the pages came from.
    pub(crate) source: (u64, u64),
}

impl Decompressed {
    /// What decompression did.
    pub fn stats(&self) -> &DecompressStats {
        &self.stats
    }

    /// Fails unless these pages were decompressed from `chunks` with `table`.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) fn check_source(&self, chunks: &DeviceChunks, table: &PageTable) -> Result<()> {
        table.check_source(chunks)?;
        if self.source != table.source || self.pages.len() != table.pages.len() {
            return Err(Error::InvalidOptions("decompressed pages were used with another read's page table".into()));
        }
        Ok(())
    }
}

struct Job {
    page: usize,
    codec: Compression,
    input: u64,
    input_len: usize,
    /// Offset of the values in the output buffer.
    out_offset: u64,
    out_len: usize,
    /// Level bytes of a v2 page, stored uncompressed in front of `input`
    /// (they go in front of the values).
    levels: u64,
}

const SLOT_ALIGN: u64 = 256;

/// How long nvCOMP may take before its kernels are taken for hung: a fixed
/// allowance plus a rate far below what any GPU decompresses at.
fn nvcomp_deadline(output_bytes: u64) -> Duration {
    crate::env::nvcomp_deadline_base() + Duration::from_secs_f64(output_bytes as f64 / 1e9)
}

/// Decompresses every compressed page of `table`. With `check_pages`, pages
/// pass the device's structural check before nvCOMP sees them; `zstd` and
/// `snappy` say who takes ZSTD and SNAPPY pages.
pub(crate) fn decompress(
    chunks: &DeviceChunks,
    table: &PageTable,
    mode: DecompressMode,
    check_pages: bool,
    zstd: DeviceDecoder,
    snappy: Option<DeviceDecoder>,
) -> Result<Decompressed> {
    table.check_source(chunks)?;
    let (plan, raw, stream) = (chunks.plan(), chunks.buffer(), chunks.stream());
    check_against_footer(plan, table)?;
    let mut pages = vec![(0u64, 0u32); table.pages.len()];
    let mut jobs: Vec<Job> = Vec::new();
    let mut level_copies: Vec<(u64, u64, u64)> = Vec::new(); // (src, dst offset, len)
    let mut in_buffer: Vec<usize> = Vec::new(); // pages whose address is an offset into the output buffer
    let mut cursor = 0u64;
    for (i, p) in table.pages.iter().enumerate() {
        if p.page_type == page_type::INDEX {
            continue;
        }
        let ci = p.chunk as usize;
        let codec = plan.chunks[ci].codec;
        let page_no = table.page_in_chunk(i);
        let levels = if p.page_type == page_type::DATA_V2 { (p.def_len + p.rep_len) as u64 } else { 0 };
        let compressed = codec != Compression::UNCOMPRESSED && !(p.page_type == page_type::DATA_V2 && p.is_compressed == 0);
        let body = raw.ptr() + p.data_offset;
        if !compressed {
            if p.compressed_size != p.uncompressed_size {
                return Err(corrupt(
                    plan,
                    ci,
                    page_no,
                    CorruptKind::SizeMismatch,
                    format!("uncompressed page stores {} bytes but its header says {}", p.compressed_size, p.uncompressed_size),
                ));
            }
            pages[i] = (body, p.compressed_size as u32);
            continue;
        }
        if (p.uncompressed_size as u64) < levels {
            return Err(corrupt(plan, ci, page_no, CorruptKind::SizeMismatch, "uncompressed size smaller than the page's level bytes"));
        }
        let values_offset = (cursor + levels).div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let page_offset = values_offset - levels;
        let out_len = p.uncompressed_size as u64 - levels;
        cursor = values_offset + out_len;
        pages[i] = (page_offset, p.uncompressed_size as u32);
        in_buffer.push(i);
        if levels > 0 {
            level_copies.push((body, page_offset, levels));
        }
        if out_len == 0 {
            // Nothing to decompress (a v2 page of only nulls may store no value bytes at all).
            continue;
        }
        jobs.push(Job {
            page: i,
            codec,
            input: body + levels,
            input_len: (p.compressed_size as u64 - levels) as usize,
            out_offset: values_offset,
            out_len: out_len as usize,
            levels,
        });
    }

    let buffer = DeviceBuffer::alloc(stream, cursor, "decompressed pages")?;
    for &i in &in_buffer {
        pages[i].0 += buffer.ptr();
    }
    let mut stats = DecompressStats {
        compressed_bytes: jobs.iter().map(|j| j.input_len as u64).sum(),
        decompressed_bytes: jobs.iter().map(|j| j.out_len as u64).sum(),
        ..Default::default()
    };
    let source = table.source;
    if jobs.is_empty() && level_copies.is_empty() {
        return Ok(Decompressed { pages, _buffer: buffer, _exchanges: Vec::new(), stats, source });
    }

    // Split by who decompresses.
    let emulated = stream.context().is_emulated();
    let lib = if mode == DecompressMode::Cpu {
        Err("decompression on the CPU was requested".to_string())
    } else if emulated {
        Err("the device is the CPU emulator".to_string())
    } else {
        nvcomp::nvcomp().map_err(|e| e.to_string())
    };
    let mut gpu: BTreeMap<Codec, Vec<&Job>> = BTreeMap::new();
    let mut isolated_jobs: BTreeMap<Codec, Vec<&Job>> = BTreeMap::new();
    let mut cpu: Vec<&Job> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    let worker = if check_pages { isolated::worker_path().map(|_| ()) } else { Ok(()) };
    let own_zstd = mode != DecompressMode::Cpu && zstd == DeviceDecoder::Gpq;
    // gpq's SNAPPY decoder takes SNAPPY pages only where asked for (for now:
    // see ReadOptions::snappy_decoder).
    let own_snappy = mode != DecompressMode::Cpu && snappy == Some(DeviceDecoder::Gpq);
    let mut device_zstd: Vec<&Job> = Vec::new();
    let mut device_snappy: Vec<&Job> = Vec::new();
    for j in &jobs {
        if own_zstd && matches!(j.codec, Compression::ZSTD(_)) {
            device_zstd.push(j);
            continue;
        }
        if own_snappy && j.codec == Compression::SNAPPY {
            device_snappy.push(j);
            continue;
        }
        match (&lib, Codec::for_parquet(j.codec)) {
            (Ok(l), Some(c @ (Codec::Gzip | Codec::Zstd))) if check_pages && worker.is_ok() && l.supports(c) => {
                isolated_jobs.entry(c).or_default().push(j);
            }
            (Ok(_), Some(c @ (Codec::Gzip | Codec::Zstd))) if check_pages => {
                let no_worker = worker.as_ref().err().map_or(String::new(), |w| format!(" and {w}"));
                let why = format!("{c:?} pages cannot be checked completely on the device{no_worker}, so nvCOMP does not get them");
                if mode == DecompressMode::Nvcomp {
                    return Err(Error::Nvcomp(why));
                }
                if !reasons.contains(&why) {
                    reasons.push(why);
                }
                cpu.push(j);
            }
            (Ok(l), Some(c)) if l.supports(c) => gpu.entry(c).or_default().push(j),
            (Ok(_), _) => {
                let why = format!("nvCOMP has no {:?} decoder", j.codec);
                if mode == DecompressMode::Nvcomp {
                    return Err(Error::Nvcomp(why));
                }
                if !reasons.contains(&why) {
                    reasons.push(why);
                }
                cpu.push(j);
            }
            (Err(e), _) => {
                if mode == DecompressMode::Nvcomp {
                    return Err(Error::Nvcomp(e.clone()));
                }
                if !reasons.contains(e) {
                    reasons.push(e.clone());
                }
                cpu.push(j);
            }
        }
    }
    let mut routed: Vec<String> = Vec::new();
    if mode == DecompressMode::Auto {
        // Batches of few large pages are faster on the CPU (see `route`).
        let threads = cpu_threads();
        for (in_worker, groups) in [(false, &mut gpu), (true, &mut isolated_jobs)] {
            groups.retain(|&codec, list| {
                let Some(why) = route::prefer_cpu(codec, in_worker, threads, &batch_shape(list)) else { return true };
                info!(reason = %why, "decompressing a batch on the CPU");
                routed.push(why);
                cpu.append(list);
                false
            });
        }
        if !device_zstd.is_empty() {
            if let Some(why) = route::prefer_cpu(Codec::Zstd, false, threads, &batch_shape(&device_zstd)) {
                info!(reason = %why, "decompressing a batch on the CPU");
                routed.push(why);
                cpu.append(&mut device_zstd);
            }
        }
        if !device_snappy.is_empty() {
            let shape = batch_shape(&device_snappy);
            if let Some(why) = route::prefer_cpu_over("gpq's SNAPPY decoder", route::GPQ_SNAPPY, Codec::Snappy, threads, &shape) {
                info!(reason = %why, "decompressing a batch on the CPU");
                routed.push(why);
                cpu.append(&mut device_snappy);
            }
        }
    }
    if !cpu.is_empty() {
        if !reasons.is_empty() {
            warn!(pages = cpu.len(), reason = %reasons.join("; "), "decompressing pages on the CPU");
        }
        let why = reasons.into_iter().chain(routed).collect::<Vec<_>>().join("; ");
        stats.fallback = Some(why);
        cpu_decompress(plan, table, raw, &buffer, &cpu, stream, WriteBack::Covering)?;
        stats.cpu_pages = cpu.len();
    }

    // Level bytes of v2 pages go in front of their values.
    let kernels = Kernels::for_context(stream.context())?;
    let mut scratch: Vec<DeviceBuffer> = Vec::new();
    // Host sides of asynchronous uploads. Nothing between the first nvCOMP
    // launch and the deadline-bounded wait below may synchronize the stream:
    // a hung nvCOMP kernel would block it for ever.
    let mut hold: Vec<Vec<u8>> = Vec::new();
    if !level_copies.is_empty() {
        let copies: Vec<CopyDesc> = level_copies
            .iter()
            .map(|&(src, off, len)| CopyDesc { src, dst: buffer.ptr() + off, len })
            .collect();
        batched_copy(stream, &kernels, &copies, &mut scratch, &mut hold)?;
    }

    let mut checks: Vec<(Codec, Vec<usize>, DeviceBuffer)> = Vec::new();
    let nvcomp_started = Instant::now();
    let own_zstd_verdicts = if device_zstd.is_empty() {
        None
    } else {
        device_zstd.sort_by(|a, b| b.out_len.cmp(&a.out_len));
        let verdicts = decode_zstd(stream, &kernels, &buffer, &device_zstd, &mut scratch, &mut hold)?;
        stats.gpu_pages += device_zstd.len();
        stats.device_zstd_pages = device_zstd.len();
        Some(verdicts)
    };
    let own_snappy_verdicts = if device_snappy.is_empty() {
        None
    } else {
        // Largest first: the longest pages start first.
        device_snappy.sort_by(|a, b| b.out_len.cmp(&a.out_len));
        let verdicts = decode_snappy(stream, &kernels, &buffer, &device_snappy, &mut scratch, &mut hold)?;
        stats.gpu_pages += device_snappy.len();
        stats.device_snappy_pages = device_snappy.len();
        Some(verdicts)
    };
    if let Ok(l) = &lib {
        for (codec, mut list) in gpu {
            list.sort_by(|a, b| b.out_len.cmp(&a.out_len));
            let align = l.alignments(codec).map_err(Error::Nvcomp)?;
            // Gather inputs into an aligned buffer when nvCOMP needs aligned input.
            let input_align = align.input.max(1) as u64;
            let mut inputs: Vec<u64> = list.iter().map(|j| j.input).collect();
            if input_align > 1 && inputs.iter().any(|p| p % input_align != 0) {
                let mut offs = Vec::with_capacity(list.len());
                let mut size = 0u64;
                for j in &list {
                    offs.push(size);
                    size = (size + j.input_len as u64).div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
                }
                let staged = DeviceBuffer::alloc(stream, size, "aligned compressed pages")?;
                let copies: Vec<CopyDesc> = list
                    .iter()
                    .zip(&offs)
                    .map(|(j, &o)| CopyDesc { src: j.input, dst: staged.ptr() + o, len: j.input_len as u64 })
                    .collect();
                batched_copy(stream, &kernels, &copies, &mut scratch, &mut hold)?;
                inputs = offs.iter().map(|o| staged.ptr() + o).collect();
                scratch.push(staged);
            }
            let n = list.len();
            let mut host: Vec<u64> = Vec::with_capacity(4 * n);
            host.extend(&inputs);
            host.extend(list.iter().map(|j| j.input_len as u64));
            host.extend(list.iter().map(|j| j.out_len as u64));
            host.extend(list.iter().map(|j| buffer.ptr() + j.out_offset));
            let d_in = upload(stream, as_bytes(&host), "nvCOMP arguments", &mut hold)?;
            // Actual sizes (u64 each), statuses (i32 each), check verdicts (u32 each).
            let d_out = DeviceBuffer::alloc(stream, 16 * n as u64, "nvCOMP results")?;
            d_out.fill(stream, 0xff)?;
            if check_pages {
                check_on_device(stream, &kernels, codec, &d_in, n, d_out.ptr() + 12 * n as u64, &mut scratch, &mut hold)?;
            }
            let max_chunk = list.iter().map(|j| j.out_len).max().unwrap_or(0);
            let total: usize = list.iter().map(|j| j.out_len).sum();
            let temp_bytes = l.temp_size(codec, n, max_chunk, total, stream.raw().cast()).map_err(Error::Nvcomp)?;
            let temp = DeviceBuffer::alloc(stream, temp_bytes as u64, "nvCOMP scratch")?;
            let batch = nvcomp::Batch::packed(d_in.ptr(), d_out.ptr(), n);
            // SAFETY: every array holds n entries in device memory; inputs and
            // outputs address live buffers of the stated sizes, all kept alive
            // (in `scratch` and `checks`) until the stream is synchronized below.
            unsafe { l.decompress(codec, &batch, temp.ptr(), temp_bytes, stream.raw().cast()).map_err(Error::Nvcomp)? };
            stats.gpu_pages += n;
            scratch.push(d_in);
            scratch.push(temp);
            checks.push((codec, list.iter().map(|j| j.page).collect(), d_out));
        }
        stats.nvcomp_version = Some(l.version.clone());
    }
    if stats.gpu_pages > 0 {
        stream.synchronize_within(nvcomp_deadline(stats.decompressed_bytes), "nvCOMP decompression")?;
        debug!(pages = stats.gpu_pages, ms = nvcomp_started.elapsed().as_secs_f64() * 1e3, "nvCOMP in this process, checks included");
    } else {
        stream.synchronize()?;
    }
    drop(scratch);
    drop(hold);

    let mut job_of_page = vec![usize::MAX; table.pages.len()];
    for (k, j) in jobs.iter().enumerate() {
        job_of_page[j.page] = k;
    }
    // Pages nvCOMP rejects (gzip files of several members, say) get a second
    // chance on the CPU; a page neither can decompress is corrupt.
    let mut retry: Vec<&Job> = Vec::new();
    let mut gpu_errors: Vec<String> = Vec::new();
    for (codec, page_ids, d_out) in checks {
        let n = page_ids.len();
        let bytes = d_out.to_host()?;
        let sizes: Vec<u64> = from_bytes(&bytes[..8 * n]);
        let statuses: Vec<i32> = from_bytes(&bytes[8 * n..12 * n]);
        let verdicts: Vec<u32> = from_bytes(&bytes[12 * n..]);
        for (k, &pi) in page_ids.iter().enumerate() {
            let job = &jobs[job_of_page[pi]];
            let problem = if verdicts[k] != 0 && verdicts[k] != u32::MAX {
                stats.check_rejected += 1;
                Some(format!("{codec:?} page fails the device check: {}", nvcomp::check_reason(verdicts[k])))
            } else if statuses[k] != 0 {
                Some(format!("nvCOMP {codec:?}: {} ({})", nvcomp::status_name(statuses[k]), statuses[k]))
            } else if sizes[k] != job.out_len as u64 {
                Some(format!("nvCOMP {codec:?} decompressed to {} bytes, the page header says {}", sizes[k], job.out_len))
            } else {
                None
            };
            if let Some(p) = problem {
                gpu_errors.push(p);
                retry.push(job);
            }
        }
    }
    if let Some((d_verdicts, profile)) = own_zstd_verdicts {
        if let Some(d) = &profile {
            log_unzstd_profile(d)?;
        }
        let verdicts: Vec<u32> = from_bytes(&d_verdicts.to_host()?);
        for (j, &v) in device_zstd.iter().zip(&verdicts) {
            if v != 0 {
                stats.check_rejected += 1;
                stats.device_zstd_pages -= 1;
                let why = if v == UNZSTD_NOT_RUN {
                    "its sequence list does not fit the memory the decoder's lists may have"
                } else {
                    nvcomp::check_reason(v)
                };
                gpu_errors.push(format!("ZSTD page refused by gpq's device decoder: {why}"));
                retry.push(j);
            }
        }
    }
    if let Some(d_verdicts) = own_snappy_verdicts {
        let verdicts: Vec<u32> = from_bytes(&d_verdicts.to_host()?);
        for (j, &v) in device_snappy.iter().zip(&verdicts) {
            if v != 0 {
                stats.check_rejected += 1;
                stats.device_snappy_pages -= 1;
                gpu_errors.push(format!("SNAPPY page refused by gpq's device decoder: {}", nvcomp::check_reason(v)));
                retry.push(j);
            }
        }
    }
    // Pages no device check vouches for: nvCOMP in the worker process; any
    // failure there sends the whole batch to the CPU decoder.
    let gpu_retries = retry.len();
    let mut exchanges = Vec::new();
    for (codec, list) in isolated_jobs {
        // The device's structural check (ZSTD frame and block headers) first:
        // pages it rejects go to the CPU decoder without troubling the worker.
        let t = Instant::now();
        let (list, rejected) = precheck(stream, &kernels, codec, list)?;
        debug!(pages = list.len() + rejected.len(), ms = t.elapsed().as_secs_f64() * 1e3, "device check before the nvCOMP worker");
        if let Some((_, why)) = rejected.first() {
            stats.check_rejected += rejected.len();
            gpu_errors.push(format!("{codec:?} page fails the device check: {}", nvcomp::check_reason(*why)));
            retry.extend(rejected.iter().map(|(j, _)| *j));
        }
        if list.is_empty() {
            continue;
        }
        match decompress_isolated(stream, &kernels, codec, &list) {
            Ok((version, held, in_place)) => {
                for (page, addr) in in_place {
                    pages[page].0 = addr;
                }
                exchanges.push(held);
                stats.gpu_pages += list.len();
                stats.isolated_pages += list.len();
                stats.nvcomp_version.get_or_insert(version);
            }
            Err(e) => {
                warn!(pages = list.len(), error = %e, "nvCOMP worker failed; decompressing its pages on the CPU");
                gpu_errors.push(e);
                retry.extend(list);
            }
        }
    }
    if !retry.is_empty() {
        warn!(pages = retry.len(), first = %gpu_errors[0], "the device rejected pages; retrying them on the CPU");
        cpu_decompress(plan, table, raw, &buffer, &retry, stream, WriteBack::PerPage).map_err(|e| match e {
            Error::CorruptPage { file, row_group, column, page, kind, detail } => {
                Error::CorruptPage { file, row_group, column, page, kind, detail: format!("{detail}; {}", gpu_errors[0]) }
            }
            other => other,
        })?;
        stats.gpu_pages -= gpu_retries;
        stats.cpu_pages += retry.len();
        stats.fallback.get_or_insert_with(|| format!("the device rejected {} pages: {}", retry.len(), gpu_errors[0]));
    }
    if stats.gpu_pages > 0 {
        info!(
            pages = stats.gpu_pages,
            gpq_zstd = stats.device_zstd_pages,
            gpq_snappy = stats.device_snappy_pages,
            nvcomp = ?stats.nvcomp_version,
            "decompressed on the device (gpq's ZSTD and SNAPPY decoders, nvCOMP)"
        );
    }
    Ok(Decompressed { pages, _buffer: buffer, _exchanges: exchanges, stats, source })
}

/// Decompresses `list` (pages of one codec) with nvCOMP in the worker
/// process, through its exchange buffer, where the pages stay to be decoded
/// in place (a v2 page's level bytes are copied in front of its values
/// there): the exchange buffer comes back held for them, with each page's
/// (page, device address). Returns the worker's nvCOMP version too, or why
/// it could not (then the pages are where they were: none of the read's
/// buffers has been written).
#[allow(clippy::type_complexity)]
fn decompress_isolated(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    codec: Codec,
    list: &[&Job],
) -> std::result::Result<(String, isolated::HeldExchange, Vec<(usize, u64)>), String> {
    // An input keeps its offset within 16 bytes where nvCOMP's alignment
    // allows, so that its copy into the exchange goes 16 bytes at a time.
    let input_align = nvcomp::nvcomp().ok().and_then(|l| l.alignments(codec).ok()).map_or(SLOT_ALIGN, |a| a.input.max(1) as u64);
    let skew = |src: u64| if (src & 15) % input_align == 0 { (src & 15) as u8 } else { 0 };
    // (Page sizes are 32-bit in Parquet; the footer check bounds them.)
    let to_u32 = |v: usize| u32::try_from(v).map_err(|_| format!("a page of {v} bytes is too large for the nvCOMP worker"));
    let layout = isolated::BatchLayout {
        input_lens: list.iter().map(|j| to_u32(j.input_len)).collect::<std::result::Result<_, _>>()?,
        output_lens: list.iter().map(|j| to_u32(j.out_len)).collect::<std::result::Result<_, _>>()?,
        skews: list.iter().map(|j| skew(j.input)).collect(),
        prefixes: list.iter().map(|j| to_u32(j.levels as usize)).collect::<std::result::Result<_, _>>()?,
    };
    let (slots, at) = layout.slots();
    let mut lease = isolated::Lease::acquire(stream.context(), at)?;
    let base = lease.base();
    let (mut keep, mut hold) = (Vec::new(), Vec::new());
    let copy = |copies: Vec<CopyDesc>, keep: &mut Vec<DeviceBuffer>, hold: &mut Vec<Vec<u8>>| {
        batched_copy(stream, kernels, &copies, keep, hold).and_then(|_| stream.synchronize()).map_err(|e| e.to_string())
    };
    // The compressed bytes into their slots, and the level bytes of v2 pages
    // in front of their outputs.
    let copies_in = list
        .iter()
        .zip(&slots)
        .map(|(j, s)| CopyDesc { src: j.input, dst: base + s.input, len: s.input_len })
        .chain(list.iter().zip(&slots).filter(|(j, _)| j.levels > 0).map(|(j, s)| CopyDesc {
            src: j.input - j.levels,
            dst: base + s.output - j.levels,
            len: j.levels,
        }))
        .collect();
    let t = Instant::now();
    copy(copies_in, &mut keep, &mut hold)?;
    let copy_in = t.elapsed();
    let output_bytes = slots.iter().map(|s| s.output_len).sum();
    let t = Instant::now();
    let answer = lease.run(codec, &layout, isolated::deadline(output_bytes))?;
    let round_trip = t.elapsed();
    if codec == Codec::Gzip {
        if let Err(e) = verify_gzip_trailers(stream, kernels, base, list, &slots) {
            lease.abandon();
            return Err(e);
        }
    }
    let in_place = list.iter().zip(&slots).map(|(j, s)| (j.page, base + s.output - j.levels)).collect();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    debug!(
        pages = list.len(),
        copy_in_ms = ms(copy_in),
        round_trip_ms = ms(round_trip),
        worker_ms = ms(answer.worker_time),
        nvcomp_ms = ms(answer.nvcomp_time),
        worker = %answer.phases,
        "nvCOMP worker batch"
    );
    let version = lease.version();
    Ok((version, lease.hold(stream), in_place))
}

/// Runs the device's structural check of `codec` (where it has one) over
/// `list`; returns the pages that pass, and those that fail with the reason.
#[allow(clippy::type_complexity)]
fn precheck<'a>(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    codec: Codec,
    list: Vec<&'a Job>,
) -> Result<(Vec<&'a Job>, Vec<(&'a Job, u32)>)> {
    if nvcomp::empty_stream(codec).is_none() || list.is_empty() {
        return Ok((list, Vec::new()));
    }
    let n = list.len();
    let mut host: Vec<u64> = Vec::with_capacity(3 * n);
    host.extend(list.iter().map(|j| j.input));
    host.extend(list.iter().map(|j| j.input_len as u64));
    host.extend(list.iter().map(|j| j.out_len as u64));
    let (mut keep, mut hold) = (Vec::new(), Vec::new());
    let args = upload(stream, as_bytes(&host), "check arguments", &mut hold)?;
    let verdicts = DeviceBuffer::alloc(stream, 4 * n as u64, "check verdicts")?;
    verdicts.fill(stream, 0xff)?;
    check_on_device(stream, kernels, codec, &args, n, verdicts.ptr(), &mut keep, &mut hold)?;
    stream.synchronize()?;
    let v: Vec<u32> = from_bytes(&verdicts.to_host()?);
    let (mut pass, mut fail) = (Vec::with_capacity(n), Vec::new());
    for (j, &verdict) in list.into_iter().zip(&v) {
        if verdict != 0 && verdict != u32::MAX { fail.push((j, verdict)) } else { pass.push(j) }
    }
    Ok((pass, fail))
}

/// A gzip member ends with the CRC-32 and the length (mod 2^32) of what it
/// decompresses to; nvCOMP checks neither. Each page's output in the
/// exchange buffer (`base` + slot) is checksummed on the device and compared
/// with its trailer; a page that disagrees (or holds several members, whose
/// last trailer covers only the last) fails the batch, for the CPU decoder.
fn verify_gzip_trailers(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    base: u64,
    list: &[&Job],
    slots: &[isolated::Slot],
) -> std::result::Result<(), String> {
    use super::descriptors::PageCrcDesc;
    let e = |e: Error| e.to_string();
    let n = list.len();
    if let Some(j) = list.iter().find(|j| j.input_len < 18) {
        return Err(format!("a GZIP page of {} bytes is shorter than a gzip member", j.input_len));
    }
    let (mut keep, mut hold) = (Vec::new(), Vec::new());
    let trailers = DeviceBuffer::alloc(stream, 8 * n as u64, "gzip trailers").map_err(e)?;
    let copies: Vec<CopyDesc> = list
        .iter()
        .enumerate()
        .map(|(k, j)| CopyDesc { src: j.input + j.input_len as u64 - 8, dst: trailers.ptr() + 8 * k as u64, len: 8 })
        .collect();
    batched_copy(stream, kernels, &copies, &mut keep, &mut hold).map_err(e)?;
    stream.synchronize().map_err(e)?;
    let t = trailers.to_host().map_err(e)?;
    let mut descs = Vec::with_capacity(n);
    for (k, s) in slots.iter().enumerate() {
        let crc = u32::from_le_bytes(t[8 * k..8 * k + 4].try_into().unwrap());
        let size = u32::from_le_bytes(t[8 * k + 4..8 * k + 8].try_into().unwrap());
        if size != s.output_len as u32 {
            return Err(format!("a GZIP page's trailer says {size} bytes (mod 2^32), its header {}", s.output_len));
        }
        descs.push(PageCrcDesc { offset: s.output, len: s.output_len, expected: crc, ..Default::default() });
    }
    let d = DeviceBuffer::from_host(stream, as_bytes(&descs), "gzip checksum table").map_err(e)?;
    let grid = u32::try_from(n.div_ceil(4)).map_err(|_| format!("{n} GZIP pages in one batch"))?;
    let mut args = KernelArgs::new().arg(base).arg(d.ptr()).arg(n as u32);
    // SAFETY: arguments match gpq_page_crc (4 warps a block, one page each);
    // every slot lies inside the exchange buffer at `base`.
    unsafe { kernels.launch(Kernel::PageCrc, grid, 128, 0, stream, &mut args).map_err(e)? };
    stream.synchronize().map_err(e)?;
    let done: Vec<PageCrcDesc> = from_bytes(&d.to_host().map_err(e)?);
    if let Some(x) = done.iter().find(|x| x.status != 0) {
        return Err(format!("a GZIP page decompresses to bytes of CRC-32 {:08x}, its trailer says {:08x}", x.computed, x.expected));
    }
    Ok(())
}

/// Fails when a chunk's pages promise more uncompressed bytes than the
/// footer's `total_uncompressed_size` for the chunk, before anything is
/// allocated for them.
fn check_against_footer(plan: &ReadPlan, table: &PageTable) -> Result<()> {
    for (ci, chunk) in table.chunks.iter().enumerate() {
        let limit = plan.chunks[ci].uncompressed_size;
        let mut total = 0u64;
        for pi in chunk.dictionary.iter().chain(&chunk.data) {
            let p = &table.pages[*pi];
            total += p.uncompressed_size.max(0) as u64;
            if total > limit {
                return Err(corrupt(
                    plan,
                    ci,
                    table.page_in_chunk(*pi),
                    CorruptKind::SizeMismatch,
                    format!("the chunk's pages promise {total}+ uncompressed bytes, its footer entry says {limit} in all"),
                ));
            }
        }
    }
    Ok(())
}

/// Queues `gpq_check_compressed` over the `n` pages whose nvCOMP arguments
/// are in `args` (pointers, sizes, capacities); verdicts go to `verdicts`.
fn check_on_device(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    codec: Codec,
    args: &DeviceBuffer,
    n: usize,
    verdicts: u64,
    keep: &mut Vec<DeviceBuffer>,
    hold: &mut Vec<Vec<u8>>,
) -> Result<()> {
    let Some((code, empty)) = nvcomp::empty_stream(codec) else {
        return Err(Error::Internal(format!("no device check for {codec:?} pages")));
    };
    let d_empty = upload(stream, &empty, "empty compressed stream", hold)?;
    let base = args.ptr();
    let count = u32::try_from(n).map_err(|_| Error::Internal(format!("{n} pages in one nvCOMP batch")))?;
    let mut a = KernelArgs::new()
        .arg(base)
        .arg(base + 8 * n as u64)
        .arg(base + 16 * n as u64)
        .arg(code)
        .arg(count)
        .arg(d_empty.ptr())
        .arg(empty.len() as u64)
        .arg(verdicts);
    // SAFETY: arguments match gpq_check_compressed; the three arrays hold n
    // entries each, `verdicts` n u32s; `d_empty` lives in `keep` until the
    // stream is synchronized.
    // One warp per page, CHECK_WARPS = 4 warps per block.
    unsafe { kernels.launch(Kernel::CheckCompressed, count.div_ceil(4), 128, 0, stream, &mut a)? };
    keep.push(d_empty);
    Ok(())
}

/// What the CPU-or-device estimate needs to know of `list`.
fn batch_shape(list: &[&Job]) -> route::BatchShape {
    route::BatchShape {
        pages: list.len(),
        input_bytes: list.iter().map(|j| j.input_len as u64).sum(),
        output_bytes: list.iter().map(|j| j.out_len as u64).sum(),
        largest_output: list.iter().map(|j| j.out_len as u64).max().unwrap_or(0),
    }
}

/// Runs gpq's ZSTD decoder over `list`, writing each page's values at its
/// slot of `buffer`; returns the buffer its verdicts (a `CheckReason` per
/// page of `list`, 0 for decoded) will be in once the stream is
/// synchronized, and with `GPQ_UNZSTD_PROFILE=1` the one of its phase
/// times. Synchronizes the stream once, after counting the sequence lists.
fn decode_zstd(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    buffer: &DeviceBuffer,
    list: &[&Job],
    keep: &mut Vec<DeviceBuffer>,
    hold: &mut Vec<Vec<u8>>,
) -> Result<(DeviceBuffer, Option<DeviceBuffer>)> {
    let n = list.len();
    let d_args = upload(stream, as_bytes(&decoder_args(list, buffer)), "ZSTD decoder arguments", hold)?;
    let d_verdicts = DeviceBuffer::alloc(stream, 4 * n as u64, "ZSTD decoder verdicts")?;
    let profile = if crate::env::unzstd_profile() {
        let d = DeviceBuffer::alloc(stream, 8 * UNZSTD_PHASES.len() as u64, "ZSTD decoder profile")?;
        d.fill(stream, 0)?;
        Some(d)
    } else {
        None
    };
    run_unzstd(stream, kernels, &d_args, n, &d_verdicts, profile.as_ref().map_or(0, |d| d.ptr()), keep, hold)?;
    keep.push(d_args);
    Ok((d_verdicts, profile))
}

/// The arguments gpq's own decoders take for `list`: n input pointers, n
/// input sizes, n output sizes and n output pointers (into `buffer`).
fn decoder_args(list: &[&Job], buffer: &DeviceBuffer) -> Vec<u64> {
    let mut host: Vec<u64> = Vec::with_capacity(4 * list.len());
    host.extend(list.iter().map(|j| j.input));
    host.extend(list.iter().map(|j| j.input_len as u64));
    host.extend(list.iter().map(|j| j.out_len as u64));
    host.extend(list.iter().map(|j| buffer.ptr() + j.out_offset));
    host
}

/// Threads a block of `gpq_unsnappy` (`UNSNAP_THREADS` in `unsnappy.cu`).
const UNSNAP_THREADS: u32 = 256;

/// Runs gpq's SNAPPY decoder over `list`, writing each page's values at its
/// slot of `buffer`; returns the buffer its verdicts (a `CheckReason` per
/// page of `list`, 0 for decoded) will be in once the stream is synchronized.
fn decode_snappy(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    buffer: &DeviceBuffer,
    list: &[&Job],
    keep: &mut Vec<DeviceBuffer>,
    hold: &mut Vec<Vec<u8>>,
) -> Result<DeviceBuffer> {
    let n = list.len();
    let d_args = upload(stream, as_bytes(&decoder_args(list, buffer)), "SNAPPY decoder arguments", hold)?;
    let d_verdicts = DeviceBuffer::alloc(stream, 4 * n as u64, "SNAPPY decoder verdicts")?;
    run_unsnappy(stream, kernels, &d_args, n, &d_verdicts)?;
    keep.push(d_args);
    Ok(d_verdicts)
}

/// Launches `gpq_unsnappy` over the `n` pages `args` describes (input
/// pointers, input sizes, output sizes, output pointers: n u64s each).
fn run_unsnappy(stream: &Arc<GpuStream>, kernels: &Kernels, args: &DeviceBuffer, n: usize, verdicts: &DeviceBuffer) -> Result<()> {
    let count = u32::try_from(n).map_err(|_| Error::Internal(format!("{n} SNAPPY pages in one launch")))?;
    if count == 0 {
        return Ok(());
    }
    let mut a = KernelArgs::new().arg(args.ptr()).arg(count).arg(verdicts.ptr());
    // SAFETY: arguments match gpq_unsnappy: `args` holds 4n u64s addressing
    // live buffers of the stated sizes, `verdicts` n u32s. A block a page.
    unsafe { kernels.launch(Kernel::Unsnappy, count, UNSNAP_THREADS, 0, stream, &mut a) }
}

/// The phases of `gpq_unzstd`'s profile (`ZstdPhase` in `unzstd.cu`).
const UNZSTD_PHASES: [&str; 10] = ["plan", "literals", "execute", "copy", "page", "pages", "sequences", "batches", "waves", "serial batches"];

/// The verdict of a page the decoder did not take: its sequence list does
/// not fit the memory the lists may have (the warp kernel never ran on it).
const UNZSTD_NOT_RUN: u32 = u32::MAX;

/// Threads a block of the sequence kernel (`UNZSTD_LIST_THREADS` in `unzstd.cu`).
const ZSTD_LIST_THREADS: u32 = 16;

/// A sequence-kernel work item's block for a whole page (`ZSTD_ITEM_PAGE`
/// in `unzstd.cu`); an item is `page | block << 32`.
const ZSTD_ITEM_PAGE: u64 = 0xffff_ffff;

/// A round's work items for the sequence kernel: a page's compressed
/// blocks each on its own where the counting kernel says they are decoded
/// apart (`blocks[i]` of them), else the whole page; longest first by the
/// list entries they may write, so that the kernel's longest chains start
/// first.
fn unzstd_items(first: u32, last: u32, sizes: &[u32], blocks: &[u32]) -> Vec<u64> {
    let mut items: Vec<(u32, u64)> = Vec::new();
    for i in first..last {
        let (size, nb) = (sizes[i as usize], blocks[i as usize]);
        if nb >= 1 {
            items.extend((0..nb as u64).map(|b| (size / nb, i as u64 | b << 32)));
        } else {
            items.push((size, i as u64 | ZSTD_ITEM_PAGE << 32));
        }
    }
    items.sort_by_key(|&(size, _)| std::cmp::Reverse(size));
    items.into_iter().map(|(_, item)| item).collect()
}

/// Logs the decoder's profile: per phase, clock cycles per page (counts as they are).
fn log_unzstd_profile(d: &DeviceBuffer) -> Result<()> {
    let v: Vec<u64> = from_bytes(&d.to_host()?);
    let pages = v[5].max(1) as f64;
    let text: Vec<String> = UNZSTD_PHASES
        .iter()
        .zip(&v)
        .enumerate()
        .map(|(k, (name, x))| if k < 5 { format!("{name} {:.0}", *x as f64 / pages) } else { format!("{name} {x}") })
        .collect();
    info!(profile = %text.join(", "), "gpq's ZSTD decoder: lane 0's clock cycles per page by phase");
    Ok(())
}

/// Consecutive runs of pages, each run's lists within `limit` entries in
/// all; a page whose list alone is over the limit is in none.
fn unzstd_rounds(offsets: &[u64], limit: u64) -> Vec<(u32, u32)> {
    let n = offsets.len() - 1;
    let mut rounds = Vec::new();
    let mut first = 0;
    for i in 0..n {
        if offsets[i + 1] - offsets[first] <= limit {
            continue;
        }
        if first < i {
            rounds.push((first as u32, i as u32));
        }
        first = if offsets[i + 1] - offsets[i] > limit { i + 1 } else { i };
    }
    if first < n {
        rounds.push((first as u32, n as u32));
    }
    rounds
}

/// Runs the decoder's three kernels (`unzstd.cu`) over the `n` pages whose
/// packed arguments are in `args`: counts each page's sequence list
/// (waiting for that), then decodes the pages in rounds whose lists fit the
/// memory the lists may have (`GPQ_UNZSTD_LIST_BYTES`, less where the
/// read's budget or the device has less): their sequences into lists, then
/// the pages from the lists. Verdicts go to `verdicts` (n u32s); a page
/// whose list fits no round gets `UNZSTD_NOT_RUN`. Buffers the kernels use
/// go to `keep`, to live until the stream is synchronized.
#[allow(clippy::too_many_arguments)]
fn run_unzstd(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    args: &DeviceBuffer,
    n: usize,
    verdicts: &DeviceBuffer,
    profile: u64,
    keep: &mut Vec<DeviceBuffer>,
    hold: &mut Vec<Vec<u8>>,
) -> Result<()> {
    let count = u32::try_from(n).map_err(|_| Error::Internal(format!("{n} ZSTD pages in one launch")))?;
    if count == 0 {
        return Ok(());
    }
    let timed = profile != 0;
    let started = Instant::now();
    verdicts.fill(stream, 0xff)?;
    let counts = DeviceBuffer::alloc(stream, 8 * n as u64, "ZSTD sequence list sizes")?;
    let mut a = KernelArgs::new().arg(args.ptr()).arg(count).arg(counts.ptr());
    // SAFETY: arguments match gpq_unzstd_count: `args` holds 4n u64s
    // addressing live buffers, `counts` 2n u32s. A thread a page, 64 a block.
    unsafe { kernels.launch(Kernel::UnzstdCount, count.div_ceil(64), 64, 0, stream, &mut a)? };
    let counted_pages: Vec<u32> = from_bytes(&counts.to_host()?);
    let (sizes, blocks) = counted_pages.split_at(n);
    let counted = started.elapsed();
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0u64);
    for &s in sizes {
        offsets.push(offsets.last().unwrap() + s as u64);
    }
    let total = offsets[n];
    let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
    // The lists' memory: as asked, less where the budget or the device
    // refuses it (then fewer pages a round, down to the largest page alone).
    let mut limit = crate::env::unzstd_list_bytes().div_ceil(8).min(total).max(largest).max(1);
    let list = loop {
        match DeviceBuffer::alloc(stream, 8 * limit, "ZSTD sequence lists") {
            Ok(b) => break Some(b),
            Err(e @ (Error::OverBudget { .. } | Error::OutOfDeviceMemory { .. })) => {
                if limit <= 1 {
                    warn!(error = %e, "no device memory for gpq's ZSTD decoder's sequence lists; its pages go to the CPU");
                    break None;
                }
                limit /= 2;
            }
            Err(e) => return Err(e),
        }
    };
    let Some(list) = list else {
        keep.push(counts);
        return Ok(());
    };
    let rounds = unzstd_rounds(&offsets, limit);
    // Each round's work items, one after another.
    let mut items: Vec<u64> = Vec::new();
    let mut item_ranges = Vec::with_capacity(rounds.len());
    let whole = vec![0u32; if crate::env::unzstd_apart() { 0 } else { n }];
    let blocks = if whole.is_empty() { blocks } else { &whole[..] };
    for &(first, last) in &rounds {
        let from = items.len() as u32;
        items.extend(unzstd_items(first, last, sizes, blocks));
        item_ranges.push((from, items.len() as u32));
    }
    let widest = item_ranges.iter().map(|&(f, l)| l - f).max().unwrap_or(0);
    let sm_blocks = (stream.context().sm_count.max(1) as u32).saturating_mul(crate::env::unzstd_list_blocks());
    let list_grid = widest.div_ceil(ZSTD_LIST_THREADS).min(sm_blocks).max(1);
    let d_items = upload(stream, as_bytes(&items), "ZSTD sequence work items", hold)?;
    let d_offsets = upload(stream, as_bytes(&offsets), "ZSTD sequence list offsets", hold)?;
    let written = DeviceBuffer::alloc(stream, 8 * n as u64, "ZSTD sequence lists written")?;
    written.fill(stream, 0)?;
    let next_item = DeviceBuffer::alloc(stream, 4 * rounds.len() as u64, "ZSTD work item counters")?;
    next_item.fill(stream, 0)?;
    let list_profile = if timed {
        let d = DeviceBuffer::alloc(stream, 16, "ZSTD sequence kernel profile")?;
        d.fill(stream, 0)?;
        Some(d)
    } else {
        None
    };
    let (mut lists_time, mut warp_time) = (Duration::ZERO, Duration::ZERO);
    for (r, (&(first, last), &(item_first, item_last))) in rounds.iter().zip(&item_ranges).enumerate() {
        let t = Instant::now();
        let grid = (item_last - item_first).div_ceil(ZSTD_LIST_THREADS).min(list_grid);
        let mut a = KernelArgs::new()
            .arg(args.ptr())
            .arg(count)
            .arg(d_items.ptr())
            .arg(item_first)
            .arg(item_last)
            .arg(first)
            .arg(last)
            .arg(d_offsets.ptr())
            .arg(list.ptr())
            .arg(written.ptr())
            .arg(next_item.ptr() + 4 * r as u64)
            .arg(list_profile.as_ref().map_or(0, |d| d.ptr()));
        // SAFETY: arguments match gpq_unzstd_sequences: pages [first, last)
        // of `args` (4n u64s), items [item_first, item_last) of `items`
        // (each naming a page of the round), `offsets` n + 1 u64s whose
        // round spans at most `limit` entries of `list`, `written` n u64s
        // zeroed, the round's counter zeroed, `profile` null or 2 u64s.
        unsafe { kernels.launch(Kernel::UnzstdSequences, grid, ZSTD_LIST_THREADS, 0, stream, &mut a)? };
        if timed {
            stream.synchronize()?;
            lists_time += t.elapsed();
        }
        let t = Instant::now();
        let mut a = KernelArgs::new()
            .arg(args.ptr())
            .arg(count)
            .arg(first)
            .arg(last)
            .arg(d_offsets.ptr())
            .arg(list.ptr())
            .arg(written.ptr())
            .arg(verdicts.ptr())
            .arg(profile);
        // SAFETY: arguments match gpq_unzstd: pages [first, last) as above, with `verdicts` n
        // u32s and `profile` null or 10 u64s. One warp a page,
        // UNZSTD_WARPS = 2 warps a block.
        unsafe { kernels.launch(Kernel::Unzstd, (last - first).div_ceil(2), 64, 0, stream, &mut a)? };
        if timed {
            stream.synchronize()?;
            warp_time += t.elapsed();
        }
    }
    if let Some(d) = &list_profile {
        let v: Vec<u64> = from_bytes(&d.to_host()?);
        info!(
            pages = n,
            rounds = rounds.len(),
            items = items.len(),
            list_entries = total,
            longest_list = largest,
            list_bytes = 8 * limit,
            count_ms = counted.as_secs_f64() * 1e3,
            lists_ms = lists_time.as_secs_f64() * 1e3,
            warp_ms = warp_time.as_secs_f64() * 1e3,
            sequence_kernel_cycles_an_item = v[0] / items.len().max(1) as u64,
            sequence_kernel_longest_item_cycles = v[1],
            "gpq's ZSTD decoder: kernel times"
        );
    }
    keep.extend([counts, list, d_items, d_offsets, written, next_item]);
    keep.extend(list_profile);
    Ok(())
}

/// One of gpq's own decoders (ZSTD, SNAPPY) alone, over host pages, each (compressed bytes,
/// promised size): per page its verdict (0: decoded) and output (for tests).
#[cfg(feature = "test-util")]
pub(crate) fn decoder_standalone(stream: &Arc<GpuStream>, pages: &[(&[u8], u64)], codec: Codec) -> Result<Vec<(u32, Vec<u8>)>> {
    let n = pages.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut blob = Vec::new();
    let mut offsets = Vec::with_capacity(n);
    for (bytes, _) in pages {
        offsets.push(blob.len() as u64);
        blob.extend_from_slice(bytes);
    }
    let mut out_offsets = Vec::with_capacity(n);
    let mut out_total = 0u64;
    for (_, out) in pages {
        out_offsets.push(out_total);
        out_total += out.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
    }
    // One extra byte so that an empty blob still allocates.
    blob.push(0);
    let d_blob = DeviceBuffer::from_host(stream, &blob, "test pages")?;
    let d_out = DeviceBuffer::alloc(stream, out_total.max(1), "test outputs")?;
    d_out.fill(stream, 0)?;
    let mut host: Vec<u64> = offsets.iter().map(|o| d_blob.ptr() + o).collect();
    host.extend(pages.iter().map(|(b, _)| b.len() as u64));
    host.extend(pages.iter().map(|(_, out)| *out));
    host.extend(out_offsets.iter().map(|o| d_out.ptr() + o));
    let d_args = DeviceBuffer::from_host(stream, as_bytes(&host), "test arguments")?;
    let d_verdicts = DeviceBuffer::alloc(stream, 4 * n as u64, "test verdicts")?;
    let kernels = Kernels::for_context(stream.context())?;
    let (mut keep, mut hold) = (Vec::new(), Vec::new());
    match codec {
        Codec::Zstd => run_unzstd(stream, &kernels, &d_args, n, &d_verdicts, 0, &mut keep, &mut hold)?,
        Codec::Snappy => run_unsnappy(stream, &kernels, &d_args, n, &d_verdicts)?,
        other => return Err(Error::Internal(format!("gpq has no device decoder of its own for {other:?}"))),
    }
    stream.synchronize()?;
    drop(keep);
    drop(hold);
    let verdicts: Vec<u32> = from_bytes(&d_verdicts.to_host()?);
    let out = d_out.to_host()?;
    Ok(verdicts
        .iter()
        .zip(pages)
        .zip(&out_offsets)
        .map(|((&v, (_, len)), &o)| (v, out[o as usize..(o + len) as usize].to_vec()))
        .collect())
}

/// The device check alone, over host pages (for tests).
#[cfg(feature = "test-util")]
pub(crate) fn check_standalone(stream: &Arc<GpuStream>, codec: Compression, pages: &[(&[u8], u64)]) -> Result<Vec<u32>> {
    let codec = Codec::for_parquet(codec).ok_or_else(|| Error::InvalidOptions(format!("no device check for {codec:?}")))?;
    let n = pages.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut offsets = Vec::with_capacity(n);
    let mut blob = Vec::new();
    for (bytes, _) in pages {
        offsets.push(blob.len() as u64);
        blob.extend_from_slice(bytes);
    }
    let d_blob = DeviceBuffer::from_host(stream, &blob, "test pages")?;
    let mut host: Vec<u64> = offsets.iter().map(|o| d_blob.ptr() + o).collect();
    host.extend(pages.iter().map(|(b, _)| b.len() as u64));
    host.extend(pages.iter().map(|(_, out)| *out));
    let d_args = DeviceBuffer::from_host(stream, as_bytes(&host), "test arguments")?;
    let d_verdicts = DeviceBuffer::alloc(stream, 4 * n as u64, "test verdicts")?;
    let kernels = Kernels::for_context(stream.context())?;
    let (mut keep, mut hold) = (Vec::new(), Vec::new());
    check_on_device(stream, &kernels, codec, &d_args, n, d_verdicts.ptr(), &mut keep, &mut hold)?;
    stream.synchronize()?;
    Ok(from_bytes(&d_verdicts.to_host()?))
}

/// Allocates a device buffer and queues a copy of `bytes` into it without
/// waiting; the host copy stays in `hold` until the stream is synchronized.
fn upload(stream: &Arc<GpuStream>, bytes: &[u8], what: &'static str, hold: &mut Vec<Vec<u8>>) -> Result<DeviceBuffer> {
    let d = DeviceBuffer::alloc(stream, bytes.len() as u64, what)?;
    let host = bytes.to_vec();
    // SAFETY: `d` holds bytes.len() bytes; `host` moves into `hold` (its heap
    // buffer does not move) and lives until the caller synchronizes.
    unsafe { stream.copy_htod_async(d.ptr(), host.as_ptr(), host.len())? };
    hold.push(host);
    Ok(d)
}

fn batched_copy(
    stream: &Arc<GpuStream>,
    kernels: &Kernels,
    copies: &[CopyDesc],
    keep: &mut Vec<DeviceBuffer>,
    hold: &mut Vec<Vec<u8>>,
) -> Result<()> {
    if copies.is_empty() {
        return Ok(());
    }
    let d = upload(stream, as_bytes(copies), "copy table", hold)?;
    let mut args = KernelArgs::new().arg(d.ptr()).arg(copies.len() as u32);
    // SAFETY: arguments match gpq_batched_copy; every range lies in a live buffer.
    let grid = u32::try_from(copies.len()).map_err(|_| Error::Internal(format!("{} copies in one launch", copies.len())))?;
    unsafe { kernels.launch(Kernel::BatchedCopy, grid, 256, 0, stream, &mut args)? };
    keep.push(d);
    Ok(())
}

/// A zeroed host buffer of `len` bytes, or `OutOfHostMemory`. The zeroes
/// come from the allocator (fresh pages of a large allocation are zero
/// already), so gigabytes are not written twice, once with zeroes on one
/// thread and then with data by the decompressing threads.
fn zeroed_host_bytes(len: u64, what: &'static str) -> Result<Vec<u8>> {
    let too_much = || Error::OutOfHostMemory { requested: len, what };
    let n = usize::try_from(len).map_err(|_| too_much())?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).map_err(|_| too_much())?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(too_much());
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // a `Vec<u8>` of capacity `n`, and its `n` bytes are initialized (zero).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// How CPU results go back to the device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteBack {
    /// One copy of the range covering every job's slot (anything in between
    /// is overwritten, so only before the GPU writes its slots).
    Covering,
    /// One copy per page (safe at any time).
    PerPage,
}

/// The largest CPU decompression batch (input or output bytes) whose copies
/// go through the pinned host pool.
const PINNED_CPU_BATCH: u64 = 64 << 20;

/// The threads CPU decompression runs on (and the routing's estimate assumes).
fn cpu_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// Decompresses `jobs` on the CPU and copies the results into `out`.
fn cpu_decompress(
    plan: &ReadPlan,
    table: &PageTable,
    raw: &DeviceBuffer,
    out: &DeviceBuffer,
    jobs: &[&Job],
    stream: &Arc<GpuStream>,
    write_back: WriteBack,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let t = Instant::now();
    let in_lo = jobs.iter().map(|j| j.input - raw.ptr()).min().unwrap_or(0);
    let in_hi = jobs.iter().map(|j| j.input - raw.ptr() + j.input_len as u64).max().unwrap_or(0);
    let lo = jobs.iter().map(|j| j.out_offset).min().unwrap_or(0);
    let hi = jobs.iter().map(|j| j.out_offset + j.out_len as u64).max().unwrap_or(0);
    // Small batches copy through pinned slabs where the pool grants them:
    // fresh pageable memory is faulted in page by page and staged by the
    // driver, which cost small reads more than the decompression itself.
    // Large ones (CPU decompression chosen or forced for a whole file) stay
    // pageable: page-locking gigabytes once costs more than copying them.
    let slabs = (in_hi - in_lo <= PINNED_CPU_BATCH && hi - lo <= PINNED_CPU_BATCH)
        .then(|| PinnedHostPool::for_context(raw.context()))
        .and_then(|pool| Some((pool.lease((in_hi - in_lo) as usize)?, pool.lease((hi - lo) as usize)?)));
    let (mut input_vec, mut output_vec): (Vec<u8>, Vec<u8>);
    let (input, host): (&mut [u8], &mut [u8]) = match &slabs {
        // SAFETY: each lease holds at least the asked length of page-locked
        // memory, owned by this call until the leases drop (after the
        // synchronize below), and the two slabs are distinct.
        Some((i, o)) => unsafe {
            (
                std::slice::from_raw_parts_mut(i.as_mut_ptr(), (in_hi - in_lo) as usize),
                std::slice::from_raw_parts_mut(o.as_mut_ptr(), (hi - lo) as usize),
            )
        },
        None => {
            input_vec = zeroed_host_bytes(in_hi - in_lo, "CPU decompression input")?;
            output_vec = zeroed_host_bytes(hi - lo, "CPU decompression output")?;
            (&mut input_vec, &mut output_vec)
        }
    };
    // The compressed bytes, in one copy of the range covering them all.
    raw.copy_range_into(in_lo, input)?;
    let input: &[u8] = input;
    let mut order: Vec<&&Job> = jobs.iter().collect();
    order.sort_by_key(|j| j.out_offset);
    let mut slices: Vec<(&Job, &mut [u8])> = Vec::with_capacity(order.len());
    let mut rest: &mut [u8] = &mut *host;
    let mut at = lo;
    for j in order {
        let skip = (j.out_offset - at) as usize;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (mine, tail) = tail.split_at_mut(j.out_len);
        slices.push((j, mine));
        rest = tail;
        at = j.out_offset + j.out_len as u64;
    }
    // Largest pages first, in small groups pulled from a shared queue: the
    // threads stay evenly busy, and no large page starts last to hold up the
    // batch (a table of few pages waits for its largest).
    slices.sort_by_key(|(j, _)| std::cmp::Reverse(j.out_len));
    let threads = cpu_threads().min(slices.len()).max(1);
    let group = slices.len().div_ceil(threads * 8).max(1);
    let queue = std::sync::Mutex::new(slices.chunks_mut(group));
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let queue = &queue;
                s.spawn(move || -> Result<()> {
                    loop {
                        let Some(batch) = queue.lock().unwrap_or_else(|p| p.into_inner()).next() else { return Ok(()) };
                        for (j, dst) in batch.iter_mut() {
                            let start = (j.input - raw.ptr() - in_lo) as usize;
                            let src = &input[start..start + j.input_len];
                            let ci = table.pages[j.page].chunk as usize;
                            super::cpu_codecs::decompress(j.codec, src, dst)
                                .map_err(|e| corrupt(plan, ci, table.page_in_chunk(j.page), CorruptKind::Decompression, e))?;
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(Error::worker_panicked("CPU decompression", p)))).collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let host: &[u8] = host;
    let queued = match write_back {
        // SAFETY: [lo, hi) lies inside `out`; the stream is synchronized before `host` is dropped.
        WriteBack::Covering => unsafe { stream.copy_htod_async(out.ptr() + lo, host.as_ptr(), host.len()) },
        WriteBack::PerPage => jobs.iter().try_for_each(|j| {
            let at = (j.out_offset - lo) as usize;
            // SAFETY: each slot lies inside `out`; synchronized below.
            unsafe { stream.copy_htod_async(out.ptr() + j.out_offset, host[at..].as_ptr(), j.out_len) }
        }),
    };
    // Whatever was queued reads `host`: wait for it before the memory goes back.
    if let Err(e) = stream.synchronize() {
        // A copy may still be reading the slab: never lend it again.
        std::mem::forget(slabs);
        return Err(e);
    }
    queued?;
    info!(pages = jobs.len(), ms = t.elapsed().as_secs_f64() * 1e3, "CPU decompression done");
    Ok(())
}
