//! Moving planned byte ranges from a file into one device buffer.
//!
//! Three paths sit behind [`read_to_device`]:
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
//! an error, never a silent fallback.

pub mod bounce;
pub mod cufile;
pub mod probe;
pub mod verify;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, GpuStream};
use crate::options::{IoOptions, IoPath};
use crate::plan::IoLayout;

pub use probe::{IoProbe, probe};

/// What one read through the IO layer did.
#[derive(Debug, Clone, PartialEq)]
pub struct IoStats {
    /// The path that ran (never [`IoPath::Auto`]).
    pub path: IoPath,
    /// Bytes the plan asked for (column-chunk bytes).
    pub bytes_requested: u64,
    /// Bytes read from the file, alignment and merge over-read included.
    pub bytes_read: u64,
    /// Wall time from the first read issued to the last byte on the device.
    pub wall: Duration,
    /// Worker threads used.
    pub threads: usize,
    /// Tasks executed.
    pub tasks: usize,
    /// Whether the file was opened with O_DIRECT.
    pub direct: bool,
    /// Why the path was chosen, including any fallback from a preferred path.
    pub reason: String,
}

impl IoStats {
    /// Bytes read per second of wall time.
    pub fn throughput(&self) -> f64 {
        self.bytes_read as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Resolves [`IoPath::Auto`] (and `GPQ_IO`) to a concrete path, with the reason.
pub fn choose_path(options: &IoOptions) -> Result<(IoPath, String)> {
    match options.resolved_path()? {
        IoPath::Auto => {
            let p = probe();
            match p.gds() {
                Ok(()) => Ok((IoPath::Gds, "auto: nvidia-fs is live, using GPUDirect Storage".into())),
                Err(why) => Ok((IoPath::Bounce, format!("auto: GDS unavailable ({why}); using the bounce path"))),
            }
        }
        forced => {
            let how = if options.path == IoPath::Auto { "GPQ_IO" } else { "ReadOptions" };
            Ok((forced, format!("forced by {how}")))
        }
    }
}

/// Reads every range of `layout` from `path` into a new device buffer.
///
/// The buffer has `layout.device_bytes` bytes; range `r` lands at
/// `r.device_offset`. All work is complete when this returns.
pub fn read_to_device(
    path: &Path,
    layout: &IoLayout,
    stream: &Arc<GpuStream>,
    options: &IoOptions,
) -> Result<(DeviceBuffer, IoStats)> {
    let (io_path, reason) = choose_path(options)?;
    let threads = options.resolved_threads()?.min(layout.tasks.len().max(1));
    let ctx = stream.context().clone();
    let t0 = Instant::now();
    let (buffer, direct) = match io_path {
        IoPath::Bounce => {
            let direct = options.resolved_direct();
            let buf = DeviceBuffer::alloc(stream, layout.device_bytes, "column chunks")?;
            stream.synchronize()?;
            bounce::read(&ctx, path, layout, &buf, threads, options.resolved_task_size()?, direct)?;
            (buf, direct)
        }
        IoPath::Gds | IoPath::CufileCompat => {
            let mode = if io_path == IoPath::Gds { cufile::Mode::Gds } else { cufile::Mode::Compat };
            let buf = DeviceBuffer::alloc_plain(&ctx, layout.device_bytes, "column chunks")?;
            cufile::read(&ctx, path, layout, &buf, threads, mode)?;
            (buf, mode == cufile::Mode::Gds)
        }
        IoPath::Auto => unreachable!("choose_path resolves auto"),
    };
    let stats = IoStats {
        path: io_path,
        bytes_requested: layout.bytes_requested,
        bytes_read: layout.bytes_read,
        wall: t0.elapsed(),
        threads,
        tasks: layout.tasks.len(),
        direct,
        reason,
    };
    info!(
        path = %stats.path,
        bytes = stats.bytes_read,
        ms = stats.wall.as_secs_f64() * 1e3,
        gbps = stats.throughput() / 1e9,
        threads,
        "IO done"
    );
    Ok((buffer, stats))
}

/// Reads exactly `buf.len()` bytes at `offset`, retrying short reads; with
/// `allow_eof`, a read that ends at end-of-file returns the count read.
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
