//! What the benchmarks compare gpq against, measured the same way on the same
//! files: arrow-rs decoding on every CPU core followed by a copy of the Arrow
//! buffers to the device (what a Rust user does today to get Parquet onto a
//! GPU), and the ceiling of the hardware path: a real host-to-device copy of
//! the same bytes from page-locked memory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use gpq::cuda::{DeviceBuffer, GpuContext, GpuStream, PinnedBuffer};
use gpq::{Error, Result};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};

/// Reads `path` with arrow-rs, one task per row group on `threads` threads;
/// `columns` selects top-level columns by name. Returns the batches in file order.
pub fn arrow_rs_parallel(path: &Path, columns: Option<&[String]>, threads: usize) -> Result<Vec<RecordBatch>> {
    let open = |source| Error::Open { file: path.to_path_buf(), source };
    let meta_err = |source| Error::Metadata { file: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(open)?;
    let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(meta_err)?;
    let num_rg = meta.metadata().num_row_groups();
    let mask = match columns {
        None => ProjectionMask::all(),
        Some(names) => {
            let schema = meta.schema();
            let roots: Vec<usize> = names
                .iter()
                .map(|n| {
                    schema.index_of(n).map_err(|_| Error::ColumnNotFound {
                        file: path.to_path_buf(),
                        column: n.clone(),
                        available: schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", "),
                    })
                })
                .collect::<Result<_>>()?;
            ProjectionMask::roots(meta.parquet_schema(), roots)
        }
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    type Part = (usize, Vec<RecordBatch>);
    let results: Vec<Result<Vec<Part>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let (meta, mask, next) = (&meta, &mask, &next);
                s.spawn(move || -> Result<Vec<Part>> {
                    let mut out = Vec::new();
                    loop {
                        let rg = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if rg >= num_rg {
                            return Ok(out);
                        }
                        let f = std::fs::File::open(path).map_err(open)?;
                        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(f, meta.clone())
                            .with_projection(mask.clone())
                            .with_row_groups(vec![rg])
                            .with_batch_size(1 << 20)
                            .build()
                            .map_err(meta_err)?;
                        let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
                        out.push((rg, batches));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("an arrow-rs reader thread panicked".into()))))
            .collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|(rg, _)| *rg);
    Ok(all.into_iter().flat_map(|(_, b)| b).collect())
}

/// Copies every Arrow buffer of `batches` to the device (from pageable
/// memory, as a plain `Vec`-to-device copy does) and waits. Returns the
/// device buffers and the bytes copied.
pub fn copy_batches_to_device(stream: &Arc<GpuStream>, batches: &[RecordBatch]) -> Result<(Vec<DeviceBuffer>, u64)> {
    let mut out = Vec::new();
    let mut bytes = 0u64;
    fn walk(data: &arrow::array::ArrayData, f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        if let Some(n) = data.nulls() {
            f(n.buffer().as_slice())?;
        }
        for b in data.buffers() {
            f(b.as_slice())?;
        }
        for c in data.child_data() {
            walk(c, f)?;
        }
        Ok(())
    }
    for batch in batches {
        for col in batch.columns() {
            walk(&col.to_data(), &mut |s: &[u8]| {
                let d = DeviceBuffer::alloc(stream, s.len() as u64, "arrow buffer")?;
                // SAFETY: d holds s.len() bytes; synchronized below, before `batches` can go.
                unsafe { stream.copy_htod_async(d.ptr(), s.as_ptr(), s.len())? };
                bytes += s.len() as u64;
                out.push(d);
                Ok(())
            })?;
        }
    }
    stream.synchronize()?;
    Ok((out, bytes))
}

/// The median time of arrow-rs decoding (`decode`) and of decoding plus the
/// copy of its Arrow buffers to the device (`total`), each over the same runs.
#[derive(Debug, Clone, Copy)]
pub struct ArrowRsTimes {
    /// Median of decode alone.
    pub decode: Duration,
    /// Median of decode followed by the copy to the device.
    pub total: Duration,
}

/// Times `runs` reads of `path` by arrow-rs on `threads` threads, each
/// followed by a copy of the decoded buffers to the device (after `warmup`
/// untimed runs). With `before_each`, it runs before every timed run (to
/// drop the page cache, say).
pub fn time_arrow_rs(
    stream: &Arc<GpuStream>,
    path: &Path,
    columns: Option<&[String]>,
    threads: usize,
    warmup: usize,
    runs: usize,
    before_each: &dyn Fn(),
) -> Result<ArrowRsTimes> {
    for _ in 0..warmup {
        let batches = arrow_rs_parallel(path, columns, threads)?;
        copy_batches_to_device(stream, &batches)?;
    }
    let (mut decode, mut total) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        before_each();
        let t = Instant::now();
        let batches = arrow_rs_parallel(path, columns, threads)?;
        decode.push(t.elapsed().as_secs_f64());
        copy_batches_to_device(stream, &batches)?;
        total.push(t.elapsed().as_secs_f64());
    }
    let secs = |v: &mut Vec<f64>| Duration::from_secs_f64(crate::median(v).unwrap_or(0.0));
    Ok(ArrowRsTimes { decode: secs(&mut decode), total: secs(&mut total) })
}

/// A host-to-device copy from page-locked memory: byte ranges of a file,
/// loaded once into pinned host buffers of at most 64 MiB, copied on four
/// streams into one device buffer.
pub struct PinnedCopy {
    pieces: Vec<PinnedBuffer>,
    len: u64,
    streams: Vec<Arc<GpuStream>>,
    dst: DeviceBuffer,
}

const PIECE: u64 = 64 << 20;

impl PinnedCopy {
    /// Loads the first `len` bytes of `path` (all of it if shorter) into pinned memory.
    pub fn of_file(ctx: &Arc<GpuContext>, path: &Path, len: u64) -> Result<PinnedCopy> {
        let size = std::fs::metadata(path).map_err(|source| Error::Open { file: path.to_path_buf(), source })?.len();
        Self::of_ranges(ctx, path, &[(0, len.min(size))])
    }

    /// Loads the byte ranges `(offset, len)` of `path` into pinned memory:
    /// for gpq's own IO plan, the very bytes a read moves.
    pub fn of_ranges(ctx: &Arc<GpuContext>, path: &Path, ranges: &[(u64, u64)]) -> Result<PinnedCopy> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path).map_err(|source| Error::Open { file: path.to_path_buf(), source })?;
        let len: u64 = ranges.iter().map(|r| r.1).sum();
        let streams: Vec<_> = (0..4).map(|_| ctx.new_stream()).collect::<Result<_>>()?;
        let dst = DeviceBuffer::alloc(&streams[0], len.max(1), "pinned copy target")?;
        streams[0].synchronize()?;
        // The ranges' bytes back to back, in pieces of at most 64 MiB.
        let mut pieces = Vec::new();
        let mut ranges = ranges.iter().copied().filter(|r| r.1 > 0);
        let mut current = ranges.next();
        let mut left = len;
        while left > 0 {
            let mut piece = PinnedBuffer::new(ctx, left.min(PIECE) as usize)?;
            let mut filled = 0usize;
            while filled < piece.len() {
                let Some((start, n)) = current else { break };
                let take = (n as usize).min(piece.len() - filled);
                file.read_exact_at(&mut piece.as_mut_slice()[filled..filled + take], start)
                    .map_err(|source| Error::Io { file: path.to_path_buf(), offset: start, len: take as u64, source })?;
                filled += take;
                current = if take as u64 == n { ranges.next() } else { Some((start + take as u64, n - take as u64)) };
            }
            left -= piece.len() as u64;
            pieces.push(piece);
        }
        Ok(PinnedCopy { pieces, len, streams, dst })
    }

    /// Bytes one copy moves.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there is nothing to copy.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies every byte to the device once and waits; returns the wall time.
    pub fn run(&self) -> Result<Duration> {
        let t = Instant::now();
        let mut offset = 0u64;
        for (k, p) in self.pieces.iter().enumerate() {
            let stream = &self.streams[k % self.streams.len()];
            // SAFETY: the pinned source lives as long as self; the destination
            // range lies inside dst; every stream is synchronized below.
            unsafe { stream.copy_htod_async(self.dst.ptr() + offset, p.as_mut_ptr(), p.len())? };
            offset += p.len() as u64;
        }
        for s in &self.streams {
            s.synchronize()?;
        }
        Ok(t.elapsed())
    }

    /// Median wall time of `runs` copies after one untimed copy.
    pub fn median(&self, runs: usize) -> Result<Duration> {
        self.run()?;
        let mut secs = (0..runs.max(1)).map(|_| self.run().map(|d| d.as_secs_f64())).collect::<Result<Vec<_>>>()?;
        Ok(Duration::from_secs_f64(crate::median(&mut secs).unwrap_or(0.0)))
    }
}

/// Host-to-device bandwidth from pinned memory: a copy of `bytes` bytes of
/// `path` (see [`PinnedCopy`]), median of `runs`, in bytes per second.
pub fn pinned_copy_bandwidth(ctx: &Arc<GpuContext>, path: &Path, bytes: u64, runs: usize) -> Result<f64> {
    let copy = PinnedCopy::of_file(ctx, path, bytes)?;
    Ok(copy.len() as f64 / copy.median(runs)?.as_secs_f64().max(1e-9))
}

/// Drops the OS page cache (needs root); false where the OS does not allow it.
pub fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Times `f` `runs` times after `warmup` untimed runs, with `before_each`
/// before every timed run, and returns the median.
pub fn median_time<T>(warmup: usize, runs: usize, before_each: &dyn Fn(), mut f: impl FnMut() -> Result<T>) -> Result<Duration> {
    for _ in 0..warmup {
        f()?;
    }
    let mut secs = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        before_each();
        let t = Instant::now();
        let r = f()?;
        secs.push(t.elapsed().as_secs_f64());
        drop(r);
    }
    Ok(Duration::from_secs_f64(crate::median(&mut secs).unwrap_or(0.0)))
}

/// Rows of `batches`.
pub fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}
