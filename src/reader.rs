//! The top-level read entry points, tying plan, IO and decode together.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::gpu::{DeviceBuffer, GpuContext, GpuStream};
use crate::io::{IoStats, read_to_device};
use crate::options::ReadOptions;
use crate::plan::ReadPlan;

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
