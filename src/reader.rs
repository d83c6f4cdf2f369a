//! The read entry points: plan, IO, decode and device Arrow columns tied
//! together, with the read's statistics assembled from each stage's report.

use std::path::Path;
use std::time::Instant;

use crate::arrow::{DeviceColumn, DeviceTable};
use crate::cuda::GpuContext;
use crate::error::Result;
use crate::io::{DeviceChunks, read_chunks};
use crate::options::ReadOptions;
use crate::plan::{Footer, ReadPlan};
use crate::stats::ReadStats;

/// Plans a read of `path` and moves its column-chunk bytes into device
/// memory, without decoding them.
pub fn read_column_chunks(path: impl AsRef<Path>, options: &ReadOptions) -> Result<DeviceChunks> {
    let t0 = Instant::now();
    let plan = ReadPlan::new(path.as_ref(), options)?;
    let plan_time = t0.elapsed();
    let ctx = GpuContext::get(options.device)?;
    let stream = ctx.new_stream()?;
    read_chunks(plan, plan_time, &stream, &options.io)
}

/// Whether the GPU decodes every column of `plan`; the error says why not
/// (an [`Error::Unsupported`](crate::Error::Unsupported) for a nested column,
/// say). Checks types only, before any IO: an encoding the kernels lack is
/// found when the pages are read.
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
    let ctx = GpuContext::get(options.device)?;
    let stream = ctx.new_stream()?;
    let chunks = read_chunks(plan, plan_time, &stream, &options.io)?;
    let decoded = crate::decode::decode(&chunks, options.decompress)?;
    let stats = ReadStats {
        io: Some(chunks.io().clone()),
        plan: plan_time,
        page_headers: decoded.page_headers,
        decompress: decoded.decompress,
        decode: decoded.decode,
        total: t0.elapsed(),
        decompression: decoded.decompression,
        pages: decoded.pages,
        decoded_bytes: 0,
    };
    let plan = chunks.plan();
    let columns = decoded.columns.into_iter().map(DeviceColumn::from).collect();
    let rows = usize::try_from(plan.num_rows()).map_err(|_| crate::Error::Internal("row count overflow".into()))?;
    Ok(DeviceTable::new(plan.schema().clone(), columns, rows, stats))
}
