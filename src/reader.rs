//! The top-level read entry points, tying plan, IO and decode together.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::arrow::DeviceTable;
use crate::error::Result;
use crate::gpu::{DeviceBuffer, GpuContext, GpuStream};
use crate::io::{IoStats, read_to_device};
use crate::options::ReadOptions;
use crate::plan::{Footer, ReadPlan};

/// Column-chunk bytes of a plan, resident in device memory.
///
/// Chunk `c` of [`DeviceChunks::plan`] occupies `c.len` bytes at
/// `buffer.ptr() + c.device_offset`.
pub struct DeviceChunks {
    /// The plan the bytes follow.
    pub plan: ReadPlan,
    /// The device buffer holding every IO range.
    pub buffer: DeviceBuffer,
    /// What the IO layer did.
    pub io: IoStats,
    /// Time spent planning (footer, projection, ranges).
    pub plan_time: Duration,
    /// The stream later stages should order their work on.
    pub stream: Arc<GpuStream>,
}

/// Plans a read of `path` and moves its column-chunk bytes into device memory.
pub fn read_column_chunks(path: impl AsRef<Path>, options: &ReadOptions) -> Result<DeviceChunks> {
    let t0 = Instant::now();
    let plan = ReadPlan::new(path.as_ref(), options)?;
    let plan_time = t0.elapsed();
    let ctx = GpuContext::get(options.device)?;
    let stream = ctx.new_stream()?;
    read_planned_chunks(plan, plan_time, &stream, options)
}

/// Moves the column-chunk bytes of an existing plan into device memory, ordered on `stream`.
pub fn read_planned_chunks(
    plan: ReadPlan,
    plan_time: Duration,
    stream: &Arc<GpuStream>,
    options: &ReadOptions,
) -> Result<DeviceChunks> {
    let (buffer, io) = read_to_device(&plan.path, &plan.io, stream, &options.io)?;
    Ok(DeviceChunks { plan, buffer, io, plan_time, stream: stream.clone() })
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
/// println!("{} rows on the GPU: {}", table.num_rows, table.stats.summary());
/// let batch = table.to_record_batch()?; // back to the host, as arrow-rs arrays
/// # Ok::<(), gpq::Error>(())
/// ```
pub fn read_parquet_to_device(path: impl AsRef<Path>, options: &ReadOptions) -> Result<DeviceTable> {
    read_to_device_with(path.as_ref(), None, options)
}

/// Like [`read_parquet_to_device`], with the file's footer already loaded (for
/// callers that read one file in many pieces, such as the DataFusion provider).
pub fn read_parquet_to_device_with_footer(path: impl AsRef<Path>, footer: Footer, options: &ReadOptions) -> Result<DeviceTable> {
    read_to_device_with(path.as_ref(), Some(footer), options)
}

fn read_to_device_with(path: &Path, footer: Option<Footer>, options: &ReadOptions) -> Result<DeviceTable> {
    let t0 = Instant::now();
    let mode = options.resolved_decompress()?;
    let plan = match footer {
        Some(footer) => ReadPlan::from_footer(path, footer, options)?,
        None => ReadPlan::new(path, options)?,
    };
    // Fail on unsupported columns before any IO.
    crate::decode::column_recipes(&plan)?;
    let plan_time = t0.elapsed();
    let ctx = GpuContext::get(options.device)?;
    let stream = ctx.new_stream()?;
    let chunks = read_planned_chunks(plan, plan_time, &stream, options)?;
    crate::decode::decode(chunks, mode, t0)
}
