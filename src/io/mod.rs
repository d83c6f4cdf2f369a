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
//! [`IoPath::Auto`] probes once per process ([`probe`]): GDS when nvidia-fs is
//! live, otherwise the bounce path (faster than cuFile's compatibility mode on
//! the machines we measured, see BENCHMARKS.md). The choice and any fallback are
//! logged and reported in [`IoStats`]. Forcing a path that is not available is
//! an error, never a silent fallback. The result is [`DeviceChunks`]: the plan
//! and the device buffer that holds every chunk where the plan says.

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
use crate::plan::ReadPlan;
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
