//! The read entry points: plan, IO, decode and device Arrow columns tied
//! together, with the read's statistics assembled from each stage's report.
//! [`read_parquet_to_device`] reads a selection in one pass; a large one as
//! groups of row groups, each group's page headers, decompression and values
//! decoded beside the IO of the groups after it (see
//! [`ReadOptions::overlap_groups`]); `batches` ([`DeviceReaderBuilder`])
//! reads it as a sequence of device tables, each a pass over a few row
//! groups, bounded in rows and device memory, several passes at once (under
//! a memory limit, sharing it).

mod batches;

pub use batches::{BOUNDED_DECODE_AHEAD, DeviceBatchReader, DeviceReaderBuilder, MAX_DECODE_AHEAD};

use std::path::Path;
use std::time::Instant;

use std::sync::Arc;

use tracing::warn;

use crate::arrow::{DeviceColumn, DeviceTable};
use crate::cuda::{GpuContext, GpuStream, MemoryBudget};
use crate::error::{Error, Result};
use crate::io::{DeviceChunks, read_chunk_groups, read_chunks};
use crate::options::{DecompressMode, ReadOptions};
use crate::plan::{Footer, ReadPlan};
use crate::gpu::Kernels;
use crate::stats::{OverlapStats, ReadStats, SetupStats};

/// Plans a read of `path` and moves its column-chunk bytes into device
/// memory, without decoding them.
pub fn read_column_chunks(path: impl AsRef<Path>, options: &ReadOptions) -> Result<DeviceChunks> {
    let t0 = Instant::now();
    let plan = ReadPlan::new(path.as_ref(), options)?;
    let plan_time = t0.elapsed();
    let ctx = GpuContext::get(options.device)?;
    let stream = read_stream(&ctx, path.as_ref(), options)?;
    read_chunks(plan, plan_time, &stream, &options.io).map_err(|e| after_failure(&ctx, &stream, e))
}

/// The context of `device` and its kernels, with what making them ready
/// cost (nothing once they are).
fn device_setup(device: usize) -> Result<(Arc<GpuContext>, SetupStats)> {
    let (ctx, context) = GpuContext::get_timed(device)?;
    let (kernels, kernel_time) = Kernels::for_context_timed(&ctx)?;
    Ok((ctx, SetupStats { context, kernels: kernel_time, kernel_source: kernels.source().to_string() }))
}

/// Appended to the error of a file that made nvCOMP hang.
const NVCOMP_HUNG: &str = "nvCOMP never finished on this file, so its GPU context was abandoned and the file read again with CPU decompression";

/// The stream a read runs on, charged to the read's memory budget if it has one.
fn read_stream(ctx: &Arc<GpuContext>, path: &Path, options: &ReadOptions) -> Result<Arc<GpuStream>> {
    let budget = options.device_memory_limit.map(|limit| MemoryBudget::new(path, limit));
    ctx.new_stream_with_budget(budget)
}

/// Cleans up after a failed read: a lost context is reset (so the next read
/// works) and reported as [`Error::GpuContextLost`]; otherwise the memory the
/// read took goes back to the driver, leaving the device as it was.
fn after_failure(ctx: &Arc<GpuContext>, stream: &Arc<GpuStream>, e: Error) -> Error {
    if matches!(e, Error::GpuContextLost { .. }) {
        return e;
    }
    if e.is_context_lost() {
        return ctx.lose(e.cuda_call().unwrap_or("a CUDA call"), e.to_string(), false);
    }
    if stream.synchronize().is_ok() {
        ctx.trim_pool();
    }
    e
}

/// Whether the GPU decodes every column of `plan`; the error says why not
/// (an [`crate::Error::Unsupported`] for a nested column,
/// say). Checks types only, before any IO: every value encoding arrow-rs
/// reads for flat columns (PLAIN, dictionaries, RLE, BYTE_STREAM_SPLIT and
/// the DELTA encodings) is decoded on the GPU; the one the kernels lack
/// (deprecated BIT_PACKED definition levels) is found when the pages are read.
pub fn can_decode(plan: &ReadPlan) -> Result<()> {
    crate::decode::column_recipes(plan).map(|_| ())
}

/// Reads a Parquet file into device memory as Arrow columns.
///
/// Plans the read on the CPU, moves the selected column chunks into device
/// memory through the chosen IO path, and decodes them on the GPU: page
/// headers, decompression (nvCOMP, or the CPU where nvCOMP cannot), levels,
/// dictionaries and values. The result's [`DeviceTable::stats`] says which
/// paths ran and where the time went.
///
/// Without a CUDA device this returns [`crate::Error::NoCudaDevice`].
///
/// ```no_run
/// use gpq::{ReadOptions, read_parquet_to_device};
///
/// let options = ReadOptions::new().with_columns(["l_orderkey", "l_comment"]);
/// let table = read_parquet_to_device("lineitem.parquet", &options)?;
/// println!("{} rows on the GPU: {}", table.num_rows(), table.stats().summary());
/// let batch = table.to_record_batch()?; // back to the host, as arrow-rs arrays
/// # Ok::<(), gpq::Error>(())
/// ```
pub fn read_parquet_to_device(path: impl AsRef<Path>, options: &ReadOptions) -> Result<DeviceTable> {
    read_with(path.as_ref(), None, options)
}

/// Like [`read_parquet_to_device`], with the file's footer already loaded (for
/// callers that read one file in many pieces, such as the DataFusion provider).
pub fn read_parquet_to_device_with_footer(path: impl AsRef<Path>, footer: Footer, options: &ReadOptions) -> Result<DeviceTable> {
    read_with(path.as_ref(), Some(footer), options)
}

fn read_with(path: &Path, footer: Option<Footer>, options: &ReadOptions) -> Result<DeviceTable> {
    let t0 = Instant::now();
    let plan = match footer {
        Some(footer) => ReadPlan::from_footer(path, footer, options)?,
        None => ReadPlan::new(path, options)?,
    };
    // Fail on unsupported columns before any IO.
    can_decode(&plan)?;
    let plan_time = t0.elapsed();
    let (ctx, setup) = device_setup(options.device)?;
    if crate::decode::needs_nvcomp_worker(&plan, options) {
        // Started while the chunks are read, ready when their pages are.
        crate::decode::isolated::prestart(&ctx);
    }
    let stream = read_stream(&ctx, path, options)?;
    let footer = Footer { file_size: plan.file_size(), metadata: plan.metadata().clone() };
    let read = read_on(plan, plan_time, t0, &stream, options).map(|mut table| {
        table.set_setup(setup);
        table
    });
    match read.map_err(|e| after_failure(&ctx, &stream, e)) {
        // nvCOMP never finished (it can loop forever on a corrupt ZSTD page
        // the device check cannot see into): the context was abandoned for a
        // fresh one; the CPU decoders give the page's verdict.
        Err(e) if nvcomp_hung(&e, options) => {
            warn!(file = %path.display(), error = %e, "reading again with CPU decompression after nvCOMP hung");
            let cpu = ReadOptions { decompress: DecompressMode::Cpu, ..options.clone() };
            read_with(path, Some(footer), &cpu).map_err(after_nvcomp_hang)
        }
        other => other,
    }
}

/// Whether a read failed because nvCOMP never finished and its context was
/// replaced, so that it can be read again with CPU decompression.
fn nvcomp_hung(e: &Error, options: &ReadOptions) -> bool {
    matches!(e, Error::GpuContextLost { call: crate::cuda::DEADLINE, recovered: true, .. }) && options.decompress != DecompressMode::Cpu
}

/// A page error of that second read, saying why there was one.
fn after_nvcomp_hang(e: Error) -> Error {
    match e {
        Error::CorruptPage { file, row_group, column, page, kind, detail } => {
            Error::CorruptPage { file, row_group, column, page, kind, detail: format!("{detail}; {NVCOMP_HUNG}") }
        }
        other => other,
    }
}

fn read_on(plan: ReadPlan, plan_time: std::time::Duration, t0: Instant, stream: &Arc<GpuStream>, options: &ReadOptions) -> Result<DeviceTable> {
    let mut groups = options.resolved_overlap_groups(plan.chunk_bytes());
    if options.overlap_groups.is_none() && crate::decode::needs_nvcomp_worker(&plan, options) {
        groups = groups.min(crate::options::OVERLAP_MAX_WORKER_GROUPS);
    }
    if groups > 1 {
        let parts = plan.split_row_groups(groups, &options.io)?;
        if parts.len() > 1 {
            return read_overlapped(plan, parts, plan_time, t0, stream, options);
        }
    }
    let chunks = read_chunks(plan, plan_time, stream, &options.io)?;
    decode_chunks(&chunks, t0, options)
}

/// Reads `plan` as its consecutive `parts` (see
/// [`ReadPlan::split_row_groups`]): one IO pipeline moves the parts' chunks
/// in order; each part's page headers, decompression and values (all but
/// the strings' characters, which need every part's sizes) run on a stream
/// and thread of their own as soon as its bytes are in, beside the IO of the
/// parts after it, into output buffers laid out for the whole plan; the
/// strings' characters are decoded last, on `stream`.
fn read_overlapped(
    plan: ReadPlan,
    parts: Vec<ReadPlan>,
    plan_time: std::time::Duration,
    t0: Instant,
    stream: &Arc<GpuStream>,
    options: &ReadOptions,
) -> Result<DeviceTable> {
    use crate::decode::{GroupValues, Prepared};
    let recipes = crate::decode::column_recipes(&plan)?;
    let ctx = stream.context().clone();
    let n = parts.len();
    // Where each group's chunks start among the plan's.
    let bases: Vec<usize> = parts.iter().scan(0, |at, p| Some(std::mem::replace(at, *at + p.chunks().len()))).collect();
    let streams = (0..n).map(|_| ctx.new_stream_with_budget(stream.budget().cloned())).collect::<Result<Vec<_>>>()?;
    let layout = crate::decode::group_layout(&plan, &recipes, stream)?;
    type Group = (DeviceChunks, Result<(Prepared, Option<(GroupValues, std::time::Duration)>)>, Instant);
    let (io, groups, io_end) = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, DeviceChunks)>();
        let streams = &streams;
        let io = std::thread::Builder::new()
            .name("gpq-io".into())
            .spawn_scoped(s, move || read_chunk_groups(parts, streams, &options.io, &|j, chunks| drop(tx.send((j, chunks)))))
            .map_err(|e| Error::Internal(format!("no thread for the IO: {e}")));
        let mut workers = Vec::with_capacity(n);
        let (recipes, layout, plan, bases) = (&recipes, &layout, &plan, &bases);
        for (j, chunks) in rx {
            let ctx = ctx.clone();
            let ready = t0.elapsed();
            let work = move || -> Group {
                let done = ctx.bind().and_then(|()| crate::decode::prepare(&chunks, recipes, options)).and_then(|p| {
                    let prepared_at = t0.elapsed();
                    let values = crate::decode::decode_group(plan, layout, &p, bases[j], chunks.stream())?;
                    chunks.stream().synchronize()?;
                    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                    tracing::debug!(
                        group = j,
                        bytes_in_at_ms = ms(ready),
                        prepared_at_ms = ms(prepared_at),
                        decoded_at_ms = ms(t0.elapsed()),
                        "group of an overlapped read"
                    );
                    Ok((p, values))
                });
                // After an error, none of the group's kernels may still
                // write into the layout when it is freed (unless the
                // context is gone, and its memory with it).
                let done = match done {
                    Err(e) if !e.is_context_lost() && !matches!(e, Error::GpuContextLost { .. }) => {
                        let _ = chunks.stream().synchronize_within(std::time::Duration::from_secs(30), "a failed group's kernels");
                        Err(e)
                    }
                    other => other,
                };
                (chunks, done, Instant::now())
            };
            let spawned = std::thread::Builder::new().name("gpq-group".into()).spawn_scoped(s, work);
            workers.push((j, spawned.map_err(|e| Error::Internal(format!("no thread for group {j}: {e}")))));
        }
        let io = match io {
            Ok(h) => h.join().unwrap_or_else(|p| Err(Error::worker_panicked("overlapped IO", p))),
            Err(e) => Err(e),
        };
        let io_end = Instant::now();
        workers.sort_by_key(|(j, _)| *j);
        let groups: Vec<Result<Group>> = workers
            .into_iter()
            .map(|(_, h)| h.and_then(|h| h.join().map_err(|p| Error::worker_panicked("group decoding", p))))
            .collect();
        (io, groups, io_end)
    });
    let io = io?;
    if groups.len() != n {
        return Err(Error::Internal(format!("{} of {n} groups were read", groups.len())));
    }
    let mut held = Vec::with_capacity(n);
    let mut prepared = Vec::with_capacity(n);
    let mut values = Vec::with_capacity(n);
    let mut group_decode = std::time::Duration::ZERO;
    let mut errors = Vec::new();
    let mut last = io_end;
    for g in groups {
        match g {
            Ok((chunks, Ok((p, v)), end)) => {
                prepared.push(p);
                if let Some((v, took)) = v {
                    values.push(v);
                    group_decode += took;
                }
                held.push(chunks);
                last = last.max(end);
            }
            Ok((_, Err(e), _)) | Err(e) => errors.push(e),
        }
    }
    // The first group's error, unless one group made nvCOMP hang: then the
    // others failed because the context went with it, and the hang is what
    // the caller recovers from.
    if !errors.is_empty() {
        let hung = errors.iter().position(|e| matches!(e, Error::GpuContextLost { call: crate::cuda::DEADLINE, .. }));
        return Err(errors.swap_remove(hung.unwrap_or(0)));
    }
    let after_io = last.saturating_duration_since(io_end);
    let pages = crate::decode::Pages::join(prepared);
    let decoded = if values.len() == n {
        let started = t0.elapsed();
        let decoded = crate::decode::finish_groups(&plan, &recipes, layout, values, pages, group_decode, stream)?;
        tracing::debug!(started_ms = started.as_secs_f64() * 1e3, ended_ms = t0.elapsed().as_secs_f64() * 1e3, "last pass of an overlapped read");
        decoded
    } else {
        // A group held DELTA_BYTE_ARRAY pages its footer did not announce:
        // the plan's values in one pass, over every group's pages.
        drop((layout, values));
        crate::decode::finish(&plan, &recipes, pages, stream)?
    };
    drop(held);
    let overlap = Some(OverlapStats { groups: n, after_io });
    table_of(&plan, decoded, io, plan_time, t0, overlap)
}

/// Decodes chunks already in device memory into a table whose statistics
/// count from `t0`.
fn decode_chunks(chunks: &DeviceChunks, t0: Instant, options: &ReadOptions) -> Result<DeviceTable> {
    let decoded = crate::decode::decode(chunks, options)?;
    table_of(chunks.plan(), decoded, chunks.io().clone(), chunks.plan_time(), t0, None)
}

/// The table of a read of `plan`, its statistics counted from `t0`.
fn table_of(
    plan: &ReadPlan,
    decoded: crate::decode::Decoded,
    io: crate::stats::IoStats,
    plan_time: std::time::Duration,
    t0: Instant,
    overlap: Option<OverlapStats>,
) -> Result<DeviceTable> {
    let stats = ReadStats {
        setup: SetupStats::default(),
        io: Some(io),
        plan: plan_time,
        page_headers: decoded.page_headers,
        decompress: decoded.decompress,
        decode: decoded.decode,
        total: t0.elapsed(),
        decompression: decoded.decompression,
        pages: decoded.pages,
        decoded_bytes: 0,
        checksummed_pages: decoded.checksummed_pages,
        overlap,
        filter: None,
    };
    let rows = usize::try_from(plan.num_rows()).map_err(|_| crate::Error::Internal("row count overflow".into()))?;
    // Each column to the plan's rows (a row window's cut: no copy).
    let mut columns = Vec::with_capacity(decoded.columns.len());
    for (c, &lead) in decoded.columns.into_iter().zip(plan.lead_rows()) {
        let mut column = DeviceColumn::from(c);
        let lead = usize::try_from(lead).map_err(|_| crate::Error::Internal("row count overflow".into()))?;
        if column.len() < lead + rows {
            return Err(crate::Error::Internal(format!("a column decoded {} rows, the plan needs {}", column.len(), lead + rows)));
        }
        column.slice(lead, rows)?;
        columns.push(column);
    }
    Ok(DeviceTable::new(plan.schema().clone(), columns, rows, stats))
}
