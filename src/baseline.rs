//! What the benchmarks compare gpq against, measured the same way on the same
//! files: arrow-rs decoding on every CPU core followed by a copy of the Arrow
//! buffers to the device (what a Rust user does today to get Parquet onto a
//! GPU), and the ceilings of the hardware path (a pinned host-to-device copy).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, RecordBatch};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};

use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, GpuContext, GpuStream, PinnedBuffer};

/// Reads `path` with arrow-rs, one task per row group on `threads` threads;
/// `columns` selects top-level columns by name. Returns the batches in file order.
pub fn arrow_rs_parallel(path: &Path, columns: Option<&[String]>, threads: usize) -> Result<Vec<RecordBatch>> {
    let io = |source| Error::Io { file: path.to_path_buf(), offset: 0, len: 0, source };
    let meta_err = |source| Error::Metadata { file: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
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
    let results: Vec<Result<Vec<(usize, Vec<RecordBatch>)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let (meta, mask, next) = (&meta, &mask, &next);
                s.spawn(move || -> Result<Vec<(usize, Vec<RecordBatch>)>> {
                    let mut out = Vec::new();
                    loop {
                        let rg = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if rg >= num_rg {
                            return Ok(out);
                        }
                        let f = std::fs::File::open(path).map_err(io)?;
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
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::InvalidOptions("reader thread panicked".into())))).collect()
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

/// Host-to-device bandwidth from pinned memory: copies `bytes` (in 64 MiB
/// pieces on four streams) `repeat` times and returns the median bytes per second.
pub fn pinned_copy_bandwidth(ctx: &Arc<GpuContext>, bytes: u64, repeat: usize) -> Result<f64> {
    let piece = 64usize << 20;
    let src = PinnedBuffer::new(ctx, piece)?;
    let streams: Vec<_> = (0..4).map(|_| ctx.new_stream()).collect::<Result<_>>()?;
    let dst = DeviceBuffer::alloc(&streams[0], bytes.max(1), "pinned copy target")?;
    streams[0].synchronize()?;
    let mut rates = Vec::new();
    for i in 0..=repeat {
        let t = Instant::now();
        let mut off = 0u64;
        let mut k = 0;
        while off < bytes {
            let n = (bytes - off).min(piece as u64) as usize;
            // SAFETY: pinned source stays alive; destination inside dst; synchronized below.
            unsafe { streams[k % 4].copy_htod_async(dst.ptr() + off, src.as_mut_ptr(), n)? };
            off += n as u64;
            k += 1;
        }
        for s in &streams {
            s.synchronize()?;
        }
        if i > 0 {
            rates.push(bytes as f64 / t.elapsed().as_secs_f64());
        }
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    Ok(rates[rates.len() / 2])
}

/// Drops the OS page cache (needs root); false where the OS does not allow it.
pub fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Times `f` `repeat` times after one warm-up and returns the median.
pub fn median_time<T>(repeat: usize, mut f: impl FnMut() -> Result<T>) -> Result<Duration> {
    f()?;
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        let r = f()?;
        times.push(t.elapsed());
        drop(r);
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Rows of `batches`.
pub fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// Bytes of the Arrow data of `batches`.
pub fn arrow_bytes(batches: &[RecordBatch]) -> u64 {
    batches
        .iter()
        .flat_map(|b| b.columns())
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0) as u64)
        .sum()
}
