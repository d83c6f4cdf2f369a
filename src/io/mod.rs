//! Moving a plan's byte ranges from a file into one device buffer.
//!
//! Three paths sit behind [`read_chunks`]:
//! - [`IoPath::Gds`]: cuFile with nvidia-fs, DMA from storage into GPU memory;
//! - [`IoPath::CufileCompat`]: cuFile's compatibility mode, POSIX reads
//!   through cuFile's own bounce buffers;
//! - [`IoPath::Bounce`]: gpq's own worker threads, each `pread`ing into pinned
//!   staging buffers and copying to the device on its own stream,
//!   double-buffered so file reads overlap PCIe copies.
//!
//! [`IoPath::Auto`] probes once per process ([`mod@probe`]): GDS when nvidia-fs is
//! live, otherwise the bounce path (faster than cuFile's compatibility mode on
//! the machines we measured, see BENCHMARKS.md). The choice and any fallback are
//! logged and reported in [`IoStats`]. Forcing a path that is not available is
//! an error, never a silent fallback. The result is [`DeviceChunks`]: the plan
//! and the device buffer that holds every chunk where the plan says.
//! [`read_chunk_groups`] reads several plans of one file through one
//! pipeline, handing each plan's chunks out as soon as they are in.

mod bounce;
pub mod cufile;
pub mod probe;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use crate::cuda::{DeviceBuffer, GpuStream};
use crate::error::{Error, Result};
use crate::options::{IoOptions, IoPath};
use crate::plan::{IoLayout, ReadPlan};
use crate::stats::IoStats;

pub use probe::{IoProbe, probe};

/// Column-chunk bytes of a plan, resident in device memory.
///
/// Chunk `c` of [`DeviceChunks::plan`] occupies `c.len` bytes at
/// `buffer().ptr() + c.device_offset`. Made only by the IO layer, so the
/// buffer always holds every chunk the plan names.
pub struct DeviceChunks {
    plan: ReadPlan,
    buffer: DeviceBuffer,
    io: IoStats,
    plan_time: Duration,
    stream: Arc<GpuStream>,
}

impl DeviceChunks {
    /// The plan the bytes follow.
    pub fn plan(&self) -> &ReadPlan {
        &self.plan
    }

    /// The device buffer holding every IO range.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// What the IO layer did.
    pub fn io(&self) -> &IoStats {
        &self.io
    }

    /// Time spent planning (footer, projection, ranges).
    pub fn plan_time(&self) -> Duration {
        self.plan_time
    }

    /// The stream later stages order their work on.
    pub fn stream(&self) -> &Arc<GpuStream> {
        &self.stream
    }
}

/// Resolves [`IoPath::Auto`] to a concrete path (probing once per process),
/// with the reason for the choice.
pub fn resolve_path(options: &IoOptions) -> Result<(IoPath, String)> {
    match options.path {
        IoPath::Auto => {
            let p = probe();
            match p.gds() {
                Ok(()) => Ok((IoPath::Gds, "auto: nvidia-fs is live, using GPUDirect Storage".into())),
                Err(why) => Ok((IoPath::Bounce, format!("auto: GDS unavailable ({why}); using the bounce path"))),
            }
        }
        forced => Ok((forced, "forced by the read options".into())),
    }
}

/// Reads every range of `plan` into a new device buffer, ordered on `stream`.
/// All work is complete when this returns.
pub fn read_chunks(plan: ReadPlan, plan_time: Duration, stream: &Arc<GpuStream>, options: &IoOptions) -> Result<DeviceChunks> {
    let layout = &plan.io;
    let path = plan.path.as_path();
    let (io_path, reason) = resolve_path(options)?;
    let threads = options.resolved_threads()?.min(layout.tasks.len().max(1));
    let ctx = stream.context().clone();
    let t0 = Instant::now();
    let (buffer, direct, bytes_read) = match io_path {
        IoPath::Bounce => {
            let buf = DeviceBuffer::alloc(stream, layout.device_bytes, "column chunks")?;
            stream.synchronize()?;
            let n = bounce::read(&ctx, path, layout, &buf, threads, options.resolved_task_size()?, options.direct)?;
            (buf, options.direct, n)
        }
        IoPath::Gds | IoPath::CufileCompat => {
            let mode = if io_path == IoPath::Gds { cufile::Mode::Gds } else { cufile::Mode::Compat };
            let buf = DeviceBuffer::alloc_plain_for(stream, layout.device_bytes, "column chunks")?;
            let n = cufile::read(&ctx, path, layout, &buf, threads, mode)?;
            (buf, mode == cufile::Mode::Gds, n)
        }
        IoPath::Auto => return Err(Error::Internal("resolve_path returned auto".into())),
    };
    if bytes_read != layout.bytes_read {
        return Err(Error::Internal(format!(
            "IO read {bytes_read} bytes of {}, the plan has {}",
            path.display(),
            layout.bytes_read
        )));
    }
    let io = IoStats {
        path: io_path,
        bytes_requested: layout.bytes_requested,
        bytes_read,
        wall: t0.elapsed(),
        threads,
        tasks: layout.tasks.len(),
        direct,
        reason,
    };
    info!(
        path = %io.path,
        bytes = io.bytes_read,
        ms = io.wall.as_secs_f64() * 1e3,
        gbps = io.throughput() / 1e9,
        threads,
        "IO done"
    );
    Ok(DeviceChunks { plan, buffer, io, plan_time, stream: stream.clone() })
}

/// Reads the chunks of several plans of one file (the runs of
/// [`ReadPlan::split_row_groups`]), in order, through one IO pipeline: each
/// plan into a device buffer of its own, allocated on its stream
/// (`streams[i]` for `plans[i]`). Each plan's [`DeviceChunks`] goes to
/// `ready` with the plan's index as soon as its bytes are in device memory (called on an IO
/// thread), while the later plans' bytes are still being read, so that the
/// GPU can work on it meanwhile. A plan whose IO failed is never handed
/// out. Returns the IO statistics of the whole read.
pub fn read_chunk_groups(
    plans: Vec<ReadPlan>,
    streams: &[Arc<GpuStream>],
    options: &IoOptions,
    ready: &(dyn Fn(usize, DeviceChunks) + Sync),
) -> Result<IoStats> {
    let Some(first) = plans.first() else { return Err(Error::Internal("no plans to read".into())) };
    if streams.len() != plans.len() {
        return Err(Error::Internal(format!("{} plans with {} streams", plans.len(), streams.len())));
    }
    let path = first.path.clone();
    let (io_path, reason) = resolve_path(options)?;
    let all_tasks: usize = plans.iter().map(|p| p.io.tasks.len()).sum();
    let threads = options.resolved_threads()?.min(all_tasks.max(1));
    let ctx = streams[0].context().clone();
    let t0 = Instant::now();
    let layouts: Vec<IoLayout> = plans.iter().map(|p| p.io.clone()).collect();
    let mut buffers = Vec::with_capacity(plans.len());
    for (p, stream) in plans.iter().zip(streams) {
        buffers.push(match io_path {
            IoPath::Bounce => DeviceBuffer::alloc(stream, p.io.device_bytes, "column chunks")?,
            _ => DeviceBuffer::alloc_plain_for(stream, p.io.device_bytes, "column chunks")?,
        });
    }
    for stream in streams {
        stream.synchronize()?;
    }
    let targets: Vec<(u64, u64)> = buffers.iter().map(|b| (b.ptr(), b.len())).collect();
    let slots: Vec<std::sync::Mutex<Option<(ReadPlan, DeviceBuffer)>>> =
        plans.into_iter().zip(buffers).map(|pb| std::sync::Mutex::new(Some(pb))).collect();
    let direct = match io_path {
        IoPath::Bounce => options.direct,
        IoPath::Gds => true,
        _ => false,
    };
    let stats_of = |layout: &IoLayout, bytes_read: u64| IoStats {
        path: io_path,
        bytes_requested: layout.bytes_requested,
        bytes_read,
        wall: t0.elapsed(),
        threads,
        tasks: layout.tasks.len(),
        direct,
        reason: reason.clone(),
    };
    let hand_out = |j: usize| {
        let taken = slots[j].lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((plan, buffer)) = taken {
            let io = stats_of(&plan.io, plan.io.bytes_read);
            ready(j, DeviceChunks { plan, buffer, io, plan_time: Duration::ZERO, stream: streams[j].clone() });
        }
    };
    let bytes_read = match io_path {
        IoPath::Bounce => {
            let jobs: Vec<bounce::Job> =
                layouts.iter().zip(&targets).map(|(layout, &(dst, dst_len))| bounce::Job { layout, dst, dst_len }).collect();
            bounce::read_jobs(&ctx, &path, &jobs, threads, options.resolved_task_size()?, options.direct, &hand_out)?
        }
        IoPath::Gds | IoPath::CufileCompat => {
            let mode = if io_path == IoPath::Gds { cufile::Mode::Gds } else { cufile::Mode::Compat };
            let mut total = 0u64;
            for (j, layout) in layouts.iter().enumerate() {
                let n = {
                    let guard = slots[j].lock().unwrap_or_else(|p| p.into_inner());
                    let (_, buffer) = guard.as_ref().ok_or_else(|| Error::Internal("a group was handed out before its IO".into()))?;
                    cufile::read(&ctx, &path, layout, buffer, threads, mode)?
                };
                if n != layout.bytes_read {
                    return Err(Error::Internal(format!("IO read {n} bytes of {}, the plan has {}", path.display(), layout.bytes_read)));
                }
                total += n;
                hand_out(j);
            }
            total
        }
        IoPath::Auto => return Err(Error::Internal("resolve_path returned auto".into())),
    };
    let requested: u64 = layouts.iter().map(|l| l.bytes_requested).sum();
    let expected: u64 = layouts.iter().map(|l| l.bytes_read).sum();
    if bytes_read != expected {
        return Err(Error::Internal(format!("IO read {bytes_read} bytes of {}, the plans have {expected}", path.display())));
    }
    let io = IoStats { path: io_path, bytes_requested: requested, bytes_read, wall: t0.elapsed(), threads, tasks: all_tasks, direct, reason };
    info!(path = %io.path, bytes = io.bytes_read, ms = io.wall.as_secs_f64() * 1e3, gbps = io.throughput() / 1e9, threads, groups = layouts.len(), "IO done");
    Ok(io)
}

/// Reads `buf.len()` bytes at `offset`, retrying short reads; end of file
/// after at least `min_len` bytes is not an error. Returns the bytes read.
pub(crate) fn pread_full(
    file: &std::fs::File,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
    min_len: usize,
) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(Error::Io { file: path.to_path_buf(), offset: offset + done as u64, len: (buf.len() - done) as u64, source });
            }
        }
    }
    if done < min_len {
        return Err(Error::Io {
            file: path.to_path_buf(),
            offset: offset + done as u64,
            len: (min_len - done) as u64,
            source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file ended early (did it shrink after planning?)"),
        });
    }
    Ok(done)
}
