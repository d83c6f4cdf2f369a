//! The Python classes over device data: `Table`, `Column`, `Buffer`,
//! `Schema` and `BatchReader`.
//!
//! Every object that hands memory out holds the table behind an `Arc`, and
//! every export (capsule) holds another reference, so a table's device
//! memory is freed when the last of the Python objects and of the consumers
//! that imported it lets go, in whatever order.

use std::any::Any;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, StructArray};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::ffi::{FFI_ArrowSchema, to_ffi};
use gpq::arrow::dlpack::{ColumnBuffer, DeviceTensor, KDL_CUDA};
use gpq::arrow::{ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA, device_stream};
use gpq::{DeviceBatchReader, DeviceColumn, DeviceTable, ReadStats};
use pyo3::exceptions::{PyAttributeError, PyIndexError, PyKeyError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::capsules;
use crate::cuda_scope;
use crate::errors::{export_err, invalid, py_err};

/// A table in device memory (one read, or one batch of a batch reader).
#[pyclass(frozen, name = "Table", module = "gpq")]
pub struct PyTable {
    pub table: Arc<DeviceTable>,
}

/// One column of a device table.
#[pyclass(frozen, name = "Column", module = "gpq")]
pub struct PyColumn {
    table: Arc<DeviceTable>,
    index: usize,
}

/// One Arrow buffer of a column (validity, offsets, values, view data).
#[pyclass(frozen, name = "Buffer", module = "gpq")]
pub struct PyBuffer {
    table: Arc<DeviceTable>,
    tensor: DeviceTensor,
    kind: &'static str,
}

/// An Arrow schema (exported through `__arrow_c_schema__`).
#[pyclass(frozen, name = "Schema", module = "gpq")]
pub struct PySchema {
    pub schema: SchemaRef,
}

/// Batches of a multi-pass read, one `Table` each; also an Arrow C device stream.
#[pyclass(frozen, name = "BatchReader", module = "gpq")]
pub struct PyBatchReader {
    pub reader: Mutex<Option<DeviceBatchReader>>,
    pub schema: SchemaRef,
}

fn table_owner(t: &Arc<DeviceTable>) -> Arc<dyn Any + Send + Sync> {
    t.clone()
}

/// Whether the table's buffers are host memory (gpq's CPU emulator).
fn is_host(t: &DeviceTable) -> bool {
    t.columns().first().is_some_and(|c| c.values().context().is_emulated())
}

/// `__dlpack__` of the array API standard over `tensor`.
fn dlpack<'py>(
    py: Python<'py>,
    table: &Arc<DeviceTable>,
    tensor: DeviceTensor,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    if copy == Some(true) {
        return Err(export_err(py, "copy=True: gpq hands out its device memory without copying, never a copy"));
    }
    if let Some(d) = dl_device
        && d != (tensor.device.device_type, tensor.device.device_id)
    {
        return Err(export_err(py, format!("dl_device={d:?}: the memory is on device {:?}", (tensor.device.device_type, tensor.device.device_id))));
    }
    // Reads return with their kernels finished: no stream owes a wait.
    if let Some((major, minor)) = max_version.filter(|(major, _)| *major >= 1) {
        let t = tensor.into_dlpack_versioned(table_owner(table));
        if major == 1 {
            // Never a newer minor version than the consumer knows (1.1 only added types).
            // SAFETY: `t` was just made and is not shared yet.
            unsafe { (*t).version.minor = (*t).version.minor.min(minor) };
        }
        capsules::dltensor_versioned_capsule(py, t)
    } else {
        capsules::dltensor_capsule(py, tensor.into_dlpack(table_owner(table)))
    }
}

/// `__cuda_array_interface__` (version 3) over `tensor`; only for CUDA memory.
fn cuda_array_interface<'py>(py: Python<'py>, tensor: &DeviceTensor) -> PyResult<Bound<'py, PyDict>> {
    if tensor.device.device_type != KDL_CUDA {
        return Err(PyAttributeError::new_err("__cuda_array_interface__: the memory is not CUDA device memory (gpq's CPU emulator)"));
    }
    let d = PyDict::new(py);
    d.set_item("shape", (tensor.len,))?;
    d.set_item("typestr", tensor.dtype.typestr())?;
    d.set_item("data", (tensor.ptr, false))?;
    d.set_item("version", 3)?;
    d.set_item("strides", py.None())?;
    Ok(d)
}

fn stats_dict<'py>(py: Python<'py>, s: &ReadStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let secs = |x: std::time::Duration| x.as_secs_f64();
    if let Some(io) = &s.io {
        d.set_item("io_path", io.path.name())?;
        d.set_item("io_bytes", io.bytes_read)?;
        d.set_item("io_s", secs(io.wall))?;
        d.set_item("io_threads", io.threads)?;
        d.set_item("io_reason", &io.reason)?;
    }
    d.set_item("decompression", s.decompression.path())?;
    d.set_item("decompression_fallback", s.decompression.fallback.clone())?;
    d.set_item("gpu_pages", s.decompression.gpu_pages)?;
    d.set_item("cpu_pages", s.decompression.cpu_pages)?;
    d.set_item("plan_s", secs(s.plan))?;
    d.set_item("page_headers_s", secs(s.page_headers))?;
    d.set_item("decompress_s", secs(s.decompress))?;
    d.set_item("decode_s", secs(s.decode))?;
    d.set_item("setup_s", secs(s.setup.context + s.setup.kernels))?;
    d.set_item("total_s", secs(s.total))?;
    d.set_item("pages", s.pages)?;
    d.set_item("decoded_bytes", s.decoded_bytes)?;
    d.set_item("summary", s.summary())?;
    Ok(d)
}

fn column_index(py: Python<'_>, table: &DeviceTable, key: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(i) = key.extract::<isize>() {
        let n = table.columns().len() as isize;
        let j = if i < 0 { i + n } else { i };
        return if (0..n).contains(&j) { Ok(j as usize) } else { Err(PyIndexError::new_err(format!("column {i} of a table of {n} columns"))) };
    }
    let name: String = key.extract().map_err(|_| invalid(py, "a column is named by its name (str) or position (int)"))?;
    table.columns().iter().position(|c| c.field().name() == &name).ok_or_else(|| {
        let names: Vec<&str> = table.columns().iter().map(|c| c.field().name().as_str()).collect();
        PyKeyError::new_err(format!("no column {name:?}; the table has {names:?}"))
    })
}

/// Host arrays go to pyarrow through `__arrow_c_array__` of this one-shot holder.
#[pyclass(name = "_HostArray", module = "gpq")]
pub struct HostArray {
    parts: Mutex<Option<(arrow::ffi::FFI_ArrowArray, FFI_ArrowSchema)>>,
}

#[pymethods]
impl HostArray {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        let (array, schema) = self.parts.lock().unwrap().take().ok_or_else(|| export_err(py, "this host array was already handed over"))?;
        let schema = capsules::schema_capsule(py, schema)?;
        let array = capsules::array_capsule(py, array)?;
        PyTuple::new(py, [schema, array])
    }
}

/// `array` for pyarrow; `schema` replaces the type-only schema (to carry a
/// record batch's metadata).
fn host_array(py: Python<'_>, array: &dyn Array, schema: Option<&Schema>) -> PyResult<HostArray> {
    let (a, mut s) = to_ffi(&array.to_data()).map_err(|e| py_err(py, e.into()))?;
    if let Some(schema) = schema {
        s = FFI_ArrowSchema::try_from(schema).map_err(|e| py_err(py, e.into()))?;
    }
    Ok(HostArray { parts: Mutex::new(Some((a, s))) })
}

#[pymethods]
impl PyTable {
    fn __len__(&self) -> usize {
        self.table.num_rows()
    }

    /// Rows.
    #[getter]
    fn num_rows(&self) -> usize {
        self.table.num_rows()
    }

    /// Columns.
    #[getter]
    fn num_columns(&self) -> usize {
        self.table.columns().len()
    }

    /// The column names, in order.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.table.columns().iter().map(|c| c.field().name().clone()).collect()
    }

    /// The result schema (what `to_arrow()` returns).
    #[getter]
    fn schema(&self) -> PySchema {
        PySchema { schema: self.table.schema().clone() }
    }

    /// The schema of the device buffers (what the Arrow device export describes).
    #[getter]
    fn device_schema(&self) -> PySchema {
        PySchema { schema: Arc::new(self.table.device_schema()) }
    }

    /// What the read did: IO path, decompression path, per-stage seconds, bytes.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, self.table.stats())
    }

    /// Bytes of all device buffers of the table.
    #[getter]
    fn device_bytes(&self) -> u64 {
        self.table.device_bytes()
    }

    /// The column named `key` (str) or at position `key` (int).
    fn column(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyColumn> {
        Ok(PyColumn { table: self.table.clone(), index: column_index(py, &self.table, key)? })
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyColumn> {
        self.column(py, key)
    }

    /// Every column, in order.
    #[getter]
    fn columns(&self) -> Vec<PyColumn> {
        (0..self.table.columns().len()).map(|index| PyColumn { table: self.table.clone(), index }).collect()
    }

    /// The device schema as an `arrow_schema` capsule.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.table.device_schema_ffi().map_err(|e| py_err(py, e))?;
        capsules::schema_capsule(py, s)
    }

    /// The table as a struct device array: (`arrow_schema`, `arrow_device_array`) capsules.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
        kwargs: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = (requested_schema, kwargs);
        let schema = self.table.device_schema_ffi().map_err(|e| py_err(py, e))?;
        let array = self.table.to_device_array().map_err(|e| py_err(py, e))?;
        PyTuple::new(py, [capsules::schema_capsule(py, schema)?, capsules::device_array_capsule(py, array)?])
    }

    /// The table as a device stream of one batch.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
        kwargs: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (requested_schema, kwargs);
        let device_type = if is_host(&self.table) { ARROW_DEVICE_CPU } else { ARROW_DEVICE_CUDA };
        let stream = device_stream(self.table.schema().clone(), device_type, std::iter::once(Ok(self.table.clone())));
        capsules::device_stream_capsule(py, stream)
    }

    /// A host copy as a `pyarrow.Table`.
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let table = self.table.clone();
        let batch = py.detach(move || cuda_scope(|| table.to_record_batch())).map_err(|e| py_err(py, e))?;
        let schema = batch.schema();
        let holder = host_array(py, &StructArray::from(batch), Some(schema.as_ref()))?;
        let pa = py.import("pyarrow")?;
        let batch = pa.call_method1("record_batch", (holder,))?;
        pa.getattr("Table")?.call_method1("from_batches", (vec![batch],))
    }

    fn __repr__(&self) -> String {
        format!("gpq.Table({} rows, columns {:?}, {} device bytes)", self.table.num_rows(), self.column_names(), self.table.device_bytes())
    }
}

impl PyColumn {
    fn column(&self) -> &DeviceColumn {
        &self.table.columns()[self.index]
    }
}

#[pymethods]
impl PyColumn {
    /// The column's name.
    #[getter]
    fn name(&self) -> String {
        self.column().field().name().clone()
    }

    /// The Arrow type of the device buffers.
    #[getter]
    fn device_type(&self) -> String {
        self.column().device_type().to_string()
    }

    /// The Arrow type of the result schema (of `to_arrow()`).
    #[getter]
    fn r#type(&self) -> String {
        self.column().field().data_type().to_string()
    }

    fn __len__(&self) -> usize {
        self.column().len()
    }

    /// Nulls.
    #[getter]
    fn null_count(&self) -> usize {
        self.column().null_count()
    }

    /// Rows of every buffer before the column's first (Arrow's offset).
    #[getter]
    fn offset(&self) -> usize {
        self.column().offset()
    }

    /// The column's Arrow buffers that exist, by name: `validity`,
    /// `offsets`, `values`, `view_data`.
    fn buffers(&self, py: Python<'_>) -> PyResult<Vec<(String, PyBuffer)>> {
        let mut out = Vec::new();
        for (kind, which) in [
            ("validity", ColumnBuffer::Validity),
            ("offsets", ColumnBuffer::Offsets),
            ("values", ColumnBuffer::Values),
            ("view_data", ColumnBuffer::ViewData),
        ] {
            if let Some(tensor) = self.column().buffer_tensor(which).map_err(|e| py_err(py, e))? {
                out.push((kind.to_string(), PyBuffer { table: self.table.clone(), tensor, kind }));
            }
        }
        Ok(out)
    }

    /// DLPack of the values (fixed-width numbers without nulls).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let tensor = self.column().values_tensor().map_err(|e| py_err(py, e))?;
        dlpack(py, &self.table, tensor, max_version, dl_device, copy)
    }

    /// (device type, device id) of the values, as DLPack numbers them.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let t = self.column().values_tensor().map_err(|e| py_err(py, e))?;
        Ok((t.device.device_type, t.device.device_id))
    }

    /// The CUDA Array Interface of the values (fixed-width numbers without
    /// nulls, on a CUDA device); absent otherwise.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let tensor = self.column().values_tensor().map_err(|e| PyAttributeError::new_err(e.to_string()))?;
        cuda_array_interface(py, &tensor)
    }

    /// The device field as an `arrow_schema` capsule.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = FFI_ArrowSchema::try_from(&self.column().device_field()).map_err(|e| py_err(py, e.into()))?;
        capsules::schema_capsule(py, s)
    }

    /// The column as a device array: (`arrow_schema`, `arrow_device_array`) capsules.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
        kwargs: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = (requested_schema, kwargs);
        let schema = self.__arrow_c_schema__(py)?;
        let array = self.table.column_to_device_array(self.index).map_err(|e| py_err(py, e))?;
        PyTuple::new(py, [schema, capsules::device_array_capsule(py, array)?])
    }

    /// A host copy as a `pyarrow.Array`.
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (table, index) = (self.table.clone(), self.index);
        let array = py.detach(move || cuda_scope(|| table.columns()[index].to_array())).map_err(|e| py_err(py, e))?;
        let holder = host_array(py, array.as_ref(), None)?;
        py.import("pyarrow")?.call_method1("array", (holder,))
    }

    fn __repr__(&self) -> String {
        let c = self.column();
        format!("gpq.Column({:?}, {}, {} rows, {} nulls)", c.field().name(), c.device_type(), c.len(), c.null_count())
    }
}

#[pymethods]
impl PyBuffer {
    /// Which buffer: `validity`, `offsets`, `values` or `view_data`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// Device address of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.tensor.ptr
    }

    /// Bytes.
    #[getter]
    fn size(&self) -> usize {
        self.tensor.len * self.tensor.dtype.bytes()
    }

    /// Element type, as the CUDA Array Interface writes it (`|u1`, `<i4`, `<i8`, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.tensor.dtype.typestr()
    }

    fn __len__(&self) -> usize {
        self.tensor.len
    }

    /// DLPack of the buffer (one dimension).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        dlpack(py, &self.table, self.tensor, max_version, dl_device, copy)
    }

    /// (device type, device id), as DLPack numbers them.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.tensor.device.device_type, self.tensor.device.device_id)
    }

    /// The CUDA Array Interface of the buffer (CUDA devices only).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cuda_array_interface(py, &self.tensor)
    }

    fn __repr__(&self) -> String {
        format!("gpq.Buffer({}, {:#x}, {} x {})", self.kind, self.tensor.ptr, self.tensor.len, self.tensor.dtype.typestr())
    }
}

#[pymethods]
impl PySchema {
    /// Field names, in order.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.schema.fields().iter().map(|f| f.name().clone()).collect()
    }

    /// Arrow types of the fields, in order.
    #[getter]
    fn types(&self) -> Vec<String> {
        self.schema.fields().iter().map(|f| f.data_type().to_string()).collect()
    }

    fn __len__(&self) -> usize {
        self.schema.fields().len()
    }

    /// The schema as an `arrow_schema` capsule (a struct, as for a record batch).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = FFI_ArrowSchema::try_from(self.schema.as_ref()).map_err(|e| py_err(py, e.into()))?;
        capsules::schema_capsule(py, s)
    }

    /// The schema as a `pyarrow.Schema`.
    fn to_pyarrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py().import("pyarrow")?.call_method1("schema", (slf,))
    }

    fn __repr__(&self) -> String {
        let fields: Vec<String> = self.schema.fields().iter().map(|f: &Arc<Field>| format!("{}: {}", f.name(), f.data_type())).collect();
        format!("gpq.Schema({})", fields.join(", "))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PySchema>().is_ok_and(|o| o.get().schema == self.schema)
    }
}

impl PySchema {
    pub fn new(schema: Schema) -> PySchema {
        PySchema { schema: Arc::new(schema) }
    }
}

#[pymethods]
impl PyBatchReader {
    /// The result schema of every batch.
    #[getter]
    fn schema(&self) -> PySchema {
        PySchema { schema: self.schema.clone() }
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<PyTable> {
        // The lock is taken and the read done without the GIL: a second
        // thread's `__next__` waits for this one's batch, then reads the next.
        let next = py.detach(|| {
            let mut guard = self.reader.lock().unwrap_or_else(|p| p.into_inner());
            let next = cuda_scope(|| guard.as_mut().and_then(Iterator::next));
            if !matches!(next, Some(Ok(_))) {
                // The end, or an error (which ends the batches).
                *guard = None;
            }
            next
        });
        match next {
            Some(Ok(t)) => Ok(PyTable { table: Arc::new(t) }),
            Some(Err(e)) => Err(py_err(py, e)),
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// The batches not read yet as an Arrow C device stream; the reader is
    /// handed over (iterating it afterwards gives nothing).
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
        kwargs: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (requested_schema, kwargs);
        let reader = py
            .detach(|| self.reader.lock().unwrap_or_else(|p| p.into_inner()).take())
            .ok_or_else(|| export_err(py, "this batch reader was already consumed or handed over"))?;
        capsules::device_stream_capsule(py, reader.into_device_stream())
    }

    fn __repr__(&self) -> String {
        let state = match self.reader.try_lock() {
            Ok(g) => g.as_ref().map_or("consumed".to_string(), |r| format!("{} passes", r.num_passes())),
            Err(_) => "reading".to_string(),
        };
        format!("gpq.BatchReader({state})")
    }
}
