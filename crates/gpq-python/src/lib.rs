//! `gpq._gpq`, the extension module of the Python package `gpq`: reads
//! Parquet into GPU memory with the `gpq` crate and hands the columns to
//! other libraries through the Arrow PyCapsule interface (C Device Data
//! Interface), DLPack and the CUDA Array Interface, without copying device
//! memory. The package's Python half (`python/gpq`) re-exports it and
//! defines the exception classes.
//!
//! Reads run without the GIL. Device memory lives as long as any Python
//! object or consumer holds the table (see `table`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gpq::{DecompressMode, DeviceReaderBuilder, IoPath, ReadOptions, ReadPlan};
use pyo3::prelude::*;

mod capsules;
mod errors;
mod table;

use errors::{invalid, py_err};

/// Runs `f` (anything that may bind gpq's CUDA context to this thread) and
/// puts back the context that was current: the Python thread's current
/// device belongs to CuPy, PyTorch and the like.
pub(crate) fn cuda_scope<T>(f: impl FnOnce() -> T) -> T {
    gpq::cuda::keeping_current_context(f)
}
use table::{HostArray, PyBatchReader, PyBuffer, PyColumn, PySchema, PyTable};

/// One path, or several (a list or tuple of paths).
#[derive(FromPyObject)]
enum Paths {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

#[allow(clippy::too_many_arguments)]
fn read_options(
    py: Python<'_>,
    columns: Option<Vec<String>>,
    row_groups: Option<Vec<usize>>,
    device: usize,
    io: &str,
    decompress: &str,
    io_threads: Option<usize>,
    memory_limit: Option<u64>,
    verify_checksums: bool,
) -> PyResult<ReadOptions> {
    let mut o = ReadOptions::new()
        .with_device(device)
        .with_io_path(io.parse::<IoPath>().map_err(|e| py_err(py, e))?)
        .with_decompress(decompress.parse::<DecompressMode>().map_err(|e| py_err(py, e))?)
        .with_page_checksums(verify_checksums);
    if let Some(c) = columns {
        o = o.with_columns(c);
    }
    if let Some(r) = row_groups {
        o = o.with_row_groups(r);
    }
    if let Some(t) = io_threads {
        o = o.with_io_threads(t);
    }
    if let Some(m) = memory_limit {
        o = o.with_device_memory_limit(m);
    }
    Ok(o)
}

/// Reads a Parquet file into GPU memory.
#[pyfunction]
#[pyo3(signature = (path, columns=None, row_groups=None, *, device=0, io="auto", decompress="auto", io_threads=None, memory_limit=None, verify_checksums=false))]
#[allow(clippy::too_many_arguments)]
fn read_parquet(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    row_groups: Option<Vec<usize>>,
    device: usize,
    io: &str,
    decompress: &str,
    io_threads: Option<usize>,
    memory_limit: Option<u64>,
    verify_checksums: bool,
) -> PyResult<PyTable> {
    let options = read_options(py, columns, row_groups, device, io, decompress, io_threads, memory_limit, verify_checksums)?;
    let table = py.detach(move || cuda_scope(|| gpq::read_parquet_to_device(&path, &options))).map_err(|e| py_err(py, e))?;
    Ok(PyTable { table: Arc::new(table) })
}

/// Reads Parquet files (one, a list, or a directory's) as a sequence of
/// device tables, bounded in rows or device memory.
#[pyfunction]
#[pyo3(signature = (paths, columns=None, row_groups=None, *, batch_rows=None, memory_limit=None, limit=None, decode_ahead=None, device=0, io="auto", decompress="auto", io_threads=None, verify_checksums=false))]
#[allow(clippy::too_many_arguments)]
fn read_parquet_batches(
    py: Python<'_>,
    paths: Paths,
    columns: Option<Vec<String>>,
    row_groups: Option<Vec<usize>>,
    batch_rows: Option<usize>,
    memory_limit: Option<u64>,
    limit: Option<usize>,
    decode_ahead: Option<usize>,
    device: usize,
    io: &str,
    decompress: &str,
    io_threads: Option<usize>,
    verify_checksums: bool,
) -> PyResult<PyBatchReader> {
    let options = read_options(py, columns, row_groups, device, io, decompress, io_threads, None, verify_checksums)?;
    let files = match paths {
        Paths::One(p) if p.is_dir() => gpq::parquet_files(&p).map_err(|e| py_err(py, e))?,
        Paths::One(p) => vec![p],
        Paths::Many(v) if v.is_empty() => return Err(invalid(py, "no file to read")),
        Paths::Many(v) => v,
    };
    let reader = py
        .detach(move || cuda_scope(|| {
            let mut b = DeviceReaderBuilder::try_new_files(&files)?.with_options(options);
            if let Some(r) = batch_rows {
                b = b.with_batch_rows(r);
            }
            if let Some(m) = memory_limit {
                b = b.with_device_memory_limit(m);
            }
            if let Some(l) = limit {
                b = b.with_limit(l);
            }
            if let Some(d) = decode_ahead {
                b = b.with_decode_ahead(d);
            }
            b.build()
        }))
        .map_err(|e| py_err(py, e))?;
    let schema = reader.schema().clone();
    Ok(PyBatchReader { reader: Mutex::new(Some(reader)), schema })
}

/// The schema a read of `path` (these columns) would return; needs no GPU.
#[pyfunction]
#[pyo3(signature = (path, columns=None))]
fn read_schema(py: Python<'_>, path: PathBuf, columns: Option<Vec<String>>) -> PyResult<PySchema> {
    let mut options = ReadOptions::new();
    if let Some(c) = columns {
        options = options.with_columns(c);
    }
    let plan = py.detach(move || ReadPlan::new(&path, &options)).map_err(|e| py_err(py, e))?;
    Ok(PySchema { schema: plan.schema().clone() })
}

/// Whether a CUDA device can be used (or the CPU emulator, where the
/// package was built with it and `GPQ_EMULATE=1`).
#[pyfunction]
fn device_available() -> bool {
    cuda_scope(|| gpq::cuda::device_available() || gpq::cuda::GpuContext::get(0).is_ok_and(|c| c.is_emulated()))
}

/// Bytes of gpq's device buffers alive now on `device` (tables, and
/// exports not yet released by their consumers).
#[pyfunction]
#[pyo3(signature = (device=0))]
fn live_device_bytes(py: Python<'_>, device: usize) -> PyResult<u64> {
    let ctx = cuda_scope(|| gpq::cuda::GpuContext::get(device)).map_err(|e| py_err(py, e))?;
    Ok(ctx.live_buffer_bytes())
}

/// Forgets the decoded footers gpq keeps for the next read of a file.
#[pyfunction]
fn clear_footer_cache() {
    gpq::clear_footer_cache();
}

#[pymodule]
fn _gpq(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(read_parquet, m)?)?;
    m.add_function(wrap_pyfunction!(read_parquet_batches, m)?)?;
    m.add_function(wrap_pyfunction!(read_schema, m)?)?;
    m.add_function(wrap_pyfunction!(device_available, m)?)?;
    m.add_function(wrap_pyfunction!(live_device_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(clear_footer_cache, m)?)?;
    m.add_class::<PyTable>()?;
    m.add_class::<PyColumn>()?;
    m.add_class::<PyBuffer>()?;
    m.add_class::<PySchema>()?;
    m.add_class::<PyBatchReader>()?;
    m.add_class::<HostArray>()?;
    Ok(())
}
