//! The Arrow C Device Data Interface: device tables, columns and streams of
//! batches handed to other libraries (cuDF, nanoarrow, pyarrow, anything that
//! imports `ArrowDeviceArray`) without copying a byte of device memory.
//!
//! An export describes the device buffers of a [`DeviceTable`] (a record
//! batch is a struct array, one child per column) or of one of its columns
//! in an [`FFI_ArrowDeviceArray`], whose embedded `ArrowArray` carries the
//! device pointers. The schema goes out as arrow-rs's [`FFI_ArrowSchema`] of
//! the *device* types ([`DeviceTable::device_schema`]): what the buffers
//! hold, which is the result schema's type except where the host would cast
//! on conversion (a dictionary the device decodes to its values, say).
//!
//! Ownership moves to the consumer: every export holds a reference to the
//! table, and the table's device memory is freed when the table itself and
//! every export of it are released (the release callback drops the
//! reference). Nothing is freed while a consumer still holds an array, and a
//! consumer may move children out and release them on their own, as the
//! specification allows.
//!
//! `sync_event` points at a CUDA event (a `CUevent*`) recorded after the
//! last work that wrote the buffers: reads return with their work finished,
//! so the event has completed by the time a consumer sees it; it is there
//! because consumers are entitled to wait on one. When a consumer releases
//! its export, the device is synchronized before the reference goes: work
//! the consumer queued on its own streams may still read the buffers, and
//! freed memory goes back to the pool the next read allocates from. The
//! buffers are shared, not copied: a consumer that writes to them changes
//! the table. Export and release keep the calling thread's current CUDA
//! context. The buffers belong to the
//! device's primary context and its default memory pool, which is where
//! CuPy, PyTorch and cuDF allocate too. On gpq's CPU emulator the buffers
//! are host memory and exports say so (`ARROW_DEVICE_CPU`, no event), which
//! is what lets the export be tested, and consumed by pyarrow, without a GPU.
//!
//! Streams ([`FFI_ArrowDeviceArrayStream`]) wrap any sequence of device
//! tables, the batch reader's in particular. Their schema is the first
//! batch's device schema (asked for lazily); a batch whose device types
//! differ from it, or a failed read, makes `get_next` return an error code
//! with the error's text from `get_last_error`, and every later `get_next`
//! returns the same error.

use std::any::Any;
use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};

use super::{DeviceColumn, DeviceTable};
use crate::cuda::{DeviceBuffer, GpuContext, GpuEvent, GpuStream};
use crate::decode::layouts::VIEW_BUFFER_SHIFT;
use crate::error::{Error, Result};

/// `ArrowDeviceType` of host memory (gpq's CPU emulator).
pub const ARROW_DEVICE_CPU: i32 = 1;
/// `ArrowDeviceType` of CUDA device memory.
pub const ARROW_DEVICE_CUDA: i32 = 2;

/// The C Device Data Interface's `ArrowDeviceArray`: an `ArrowArray` whose
/// buffers live on a device, the device, and an event to wait on before
/// reading them. Dropping a live one releases it.
#[repr(C)]
#[derive(Debug)]
pub struct FFI_ArrowDeviceArray {
    /// The array; its buffer pointers are device pointers.
    pub array: FFI_ArrowArray,
    /// The device ordinal.
    pub device_id: i64,
    /// Where the buffers are: [`ARROW_DEVICE_CUDA`] or [`ARROW_DEVICE_CPU`].
    pub device_type: i32,
    /// A `CUevent*` to wait on before reading the buffers, or null.
    pub sync_event: *mut c_void,
    /// Zero, as the specification asks.
    pub reserved: [i64; 3],
}

// The struct only describes the buffers; the memory behind them is owned
// through the release callback, which may run on any thread.
unsafe impl Send for FFI_ArrowDeviceArray {}

impl FFI_ArrowDeviceArray {
    /// A released (empty) array, for a producer to move an export into.
    pub fn empty() -> FFI_ArrowDeviceArray {
        FFI_ArrowDeviceArray {
            array: FFI_ArrowArray::empty(),
            device_id: 0,
            device_type: ARROW_DEVICE_CPU,
            sync_event: std::ptr::null_mut(),
            reserved: [0; 3],
        }
    }

    /// Whether the array was released (or moved out of).
    pub fn is_released(&self) -> bool {
        self.array.release.is_none()
    }
}

/// The C Device Data Interface's `ArrowDeviceArrayStream`: a pull-style
/// sequence of device arrays of one schema. Dropping a live one releases it.
#[repr(C)]
#[derive(Debug)]
pub struct FFI_ArrowDeviceArrayStream {
    /// Where every array of the stream lives.
    pub device_type: i32,
    /// Writes the schema of the stream's arrays; 0 or an `errno` code.
    pub get_schema: Option<unsafe extern "C" fn(*mut FFI_ArrowDeviceArrayStream, *mut FFI_ArrowSchema) -> c_int>,
    /// Writes the next array (released at the end); 0 or an `errno` code.
    pub get_next: Option<unsafe extern "C" fn(*mut FFI_ArrowDeviceArrayStream, *mut FFI_ArrowDeviceArray) -> c_int>,
    /// The last error's text, valid until the next call.
    pub get_last_error: Option<unsafe extern "C" fn(*mut FFI_ArrowDeviceArrayStream) -> *const c_char>,
    /// Releases the stream (not the arrays it produced).
    pub release: Option<unsafe extern "C" fn(*mut FFI_ArrowDeviceArrayStream)>,
    /// The producer's state.
    pub private_data: *mut c_void,
}

unsafe impl Send for FFI_ArrowDeviceArrayStream {}

impl FFI_ArrowDeviceArrayStream {
    /// A released (empty) stream.
    pub fn empty() -> FFI_ArrowDeviceArrayStream {
        FFI_ArrowDeviceArrayStream {
            device_type: ARROW_DEVICE_CPU,
            get_schema: None,
            get_next: None,
            get_last_error: None,
            release: None,
            private_data: std::ptr::null_mut(),
        }
    }

    /// Whether the stream was released (or moved out of).
    pub fn is_released(&self) -> bool {
        self.release.is_none()
    }
}

impl Drop for FFI_ArrowDeviceArrayStream {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: a live stream's release callback, called once.
            unsafe { release(self) };
        }
    }
}

impl DeviceColumn {
    /// The field of the device buffers: the result field's name, nullability
    /// and metadata with the [device type](DeviceColumn::device_type).
    pub fn device_field(&self) -> Field {
        Field::new(self.field.name(), self.device_type.clone(), self.field.is_nullable()).with_metadata(self.field.metadata().clone())
    }
}

impl DeviceTable {
    /// The schema of the device buffers: one [`DeviceColumn::device_field`]
    /// per column, with the result schema's metadata. It is what exports
    /// describe, and it equals [`DeviceTable::schema`] except where the host
    /// casts on conversion.
    pub fn device_schema(&self) -> Schema {
        Schema::new_with_metadata(self.columns.iter().map(DeviceColumn::device_field).collect::<Vec<_>>(), self.schema.metadata().clone())
    }

    /// Exports the table as a struct array (one child per column), keeping
    /// the table alive until the consumer releases it; the table may be
    /// exported again, or used, meanwhile.
    pub fn to_device_array(self: &Arc<Self>) -> Result<FFI_ArrowDeviceArray> {
        let owner: Arc<dyn Any + Send + Sync> = self.clone();
        Exporter::new(self.context())?.export(owner, |e| {
            let children = self.columns.iter().map(|c| e.node(c)).collect::<Result<Vec<_>>>()?;
            Ok(Node { len: self.num_rows, null_count: 0, offset: 0, buffers: vec![std::ptr::null()], children })
        })
    }

    /// Exports the table as [`DeviceTable::to_device_array`] does, handing it over.
    pub fn into_device_array(self) -> Result<FFI_ArrowDeviceArray> {
        Arc::new(self).to_device_array()
    }

    /// Exports column `index` on its own, keeping the whole table alive
    /// until the consumer releases it.
    pub fn column_to_device_array(self: &Arc<Self>, index: usize) -> Result<FFI_ArrowDeviceArray> {
        let column = self.columns.get(index).ok_or_else(|| {
            Error::Export(format!("column {index} of a table of {} columns", self.columns.len()))
        })?;
        let owner: Arc<dyn Any + Send + Sync> = self.clone();
        Exporter::new(self.context())?.export(owner, |e| e.node(column))
    }

    /// The [device schema](DeviceTable::device_schema) as a C `ArrowSchema`
    /// (a struct, as for a record batch).
    pub fn device_schema_ffi(&self) -> Result<FFI_ArrowSchema> {
        Ok(FFI_ArrowSchema::try_from(&self.device_schema())?)
    }

    /// The context the table's buffers belong to (none for a table without buffers).
    pub(super) fn context(&self) -> Option<Arc<GpuContext>> {
        fn of(c: &DeviceColumn) -> Option<Arc<GpuContext>> {
            Some(c.values.context().clone()).or_else(|| c.children.iter().find_map(of))
        }
        self.columns.iter().find_map(of)
    }
}

/// Exports a sequence of device tables as a C device stream (each batch
/// exported as [`DeviceTable::to_device_array`] does). `schema` is
/// what the stream reports if it has no batch at all (the tables' result
/// schema); otherwise the first batch's device schema is the stream's.
/// `device_type` is where the batches will be ([`ARROW_DEVICE_CUDA`], or
/// [`ARROW_DEVICE_CPU`] on the emulator).
pub fn device_stream<I>(schema: SchemaRef, device_type: i32, batches: I) -> FFI_ArrowDeviceArrayStream
where
    I: Iterator<Item = Result<Arc<DeviceTable>>> + Send + 'static,
{
    let private = Box::new(StreamState {
        batches: Box::new(batches),
        empty_schema: schema,
        schema: None,
        peeked: None,
        error: None,
        done: false,
        produced: 0,
    });
    FFI_ArrowDeviceArrayStream {
        device_type,
        get_schema: Some(stream_get_schema),
        get_next: Some(stream_get_next),
        get_last_error: Some(stream_get_last_error),
        release: Some(stream_release),
        private_data: Box::into_raw(private).cast(),
    }
}

/// One array of an export before it becomes an `ArrowArray`.
struct Node {
    len: usize,
    null_count: usize,
    offset: usize,
    buffers: Vec<*const c_void>,
    children: Vec<Node>,
}

/// What one export keeps alive until its last array is released: the owner
/// of the buffers, what the export allocated itself, and the event.
struct Keep {
    _owner: Arc<dyn Any + Send + Sync>,
    _extra: Vec<DeviceBuffer>,
    event: Option<GpuEvent>,
    _stream: Option<Arc<GpuStream>>,
    ctx: Option<Arc<GpuContext>>,
}

impl Drop for Keep {
    /// The consumer released its last array, but the work it queued on its
    /// own streams may still be reading the buffers; freeing them (here, or
    /// later with the table) returns the memory to a pool that the next read
    /// takes from. So the device finishes that work first.
    fn drop(&mut self) {
        if let Some(ctx) = &self.ctx {
            let _ = ctx.synchronize();
        }
    }
}

/// Builds one export: walks the columns, allocates what the format needs
/// beyond gpq's buffers (the data-buffer sizes of view columns), and records
/// the event.
struct Exporter {
    ctx: Option<Arc<GpuContext>>,
    stream: Option<Arc<GpuStream>>,
    extra: Vec<DeviceBuffer>,
}

impl Exporter {
    fn new(ctx: Option<Arc<GpuContext>>) -> Result<Exporter> {
        Ok(Exporter { ctx, stream: None, extra: Vec::new() })
    }

    fn stream(&mut self) -> Result<Option<Arc<GpuStream>>> {
        if self.stream.is_none()
            && let Some(ctx) = &self.ctx
        {
            self.stream = Some(ctx.new_stream()?);
        }
        Ok(self.stream.clone())
    }

    fn export(mut self, owner: Arc<dyn Any + Send + Sync>, root: impl FnOnce(&mut Exporter) -> Result<Node>) -> Result<FFI_ArrowDeviceArray> {
        // The caller's thread keeps its current context.
        let _bound = self.ctx.as_ref().map(|c| c.bind_scoped()).transpose()?;
        let root = root(&mut self)?;
        let (device_type, device_id) = match &self.ctx {
            Some(ctx) if ctx.is_emulated() => (ARROW_DEVICE_CPU, 0),
            Some(ctx) => (ARROW_DEVICE_CUDA, ctx.ordinal() as i64),
            None => (ARROW_DEVICE_CUDA, 0),
        };
        let event = match (self.ctx.clone(), device_type) {
            (Some(ctx), ARROW_DEVICE_CUDA) => {
                let stream = self.stream()?.expect("a context gives a stream");
                let event = GpuEvent::new(&ctx, false)?;
                event.record(&stream)?;
                Some(event)
            }
            _ => None,
        };
        let ctx = self.ctx.filter(|c| !c.is_emulated());
        let keep = Arc::new(Keep { _owner: owner, _extra: self.extra, event, _stream: self.stream, ctx });
        let sync_event = keep.event.as_ref().and_then(GpuEvent::handle_ptr).map_or(std::ptr::null_mut(), |p| p.cast_mut());
        Ok(FFI_ArrowDeviceArray { array: ffi_array(root, &keep), device_id, device_type, sync_event, reserved: [0; 3] })
    }

    /// The array of one column and its children.
    fn node(&mut self, c: &DeviceColumn) -> Result<Node> {
        let ptr = |b: &DeviceBuffer| -> *const c_void { b.ptr() as *const c_void };
        let validity = match (&c.validity, c.null_count) {
            (Some(v), n) if n > 0 => ptr(v),
            _ => std::ptr::null(),
        };
        let offsets = || {
            c.offsets.as_ref().map(ptr).ok_or_else(|| Error::Internal(format!("column {} ({}) has no offsets", c.field.name(), c.device_type)))
        };
        let buffers = match &c.device_type {
            DataType::Null => Vec::new(),
            DataType::Struct(_) => vec![validity],
            DataType::List(_) | DataType::LargeList(_) | DataType::Map(..) => vec![validity, offsets()?],
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => vec![validity, offsets()?, ptr(&c.values)],
            DataType::Utf8View | DataType::BinaryView => {
                let mut buffers = vec![validity, ptr(&c.values)];
                let mut sizes = Vec::new();
                if let Some(data) = &c.view_data {
                    // The same overlapping slices the host copy makes (see `DeviceColumn::view_data`).
                    let (step, longest) = (1u64 << VIEW_BUFFER_SHIFT, 1u64 << (VIEW_BUFFER_SHIFT + 1));
                    let mut start = 0;
                    while start < data.len() {
                        buffers.push((data.ptr() + start) as *const c_void);
                        sizes.push(longest.min(data.len() - start) as i64);
                        start += step;
                    }
                }
                // The sizes are a buffer like the others: on the device.
                let stream = self.stream()?.ok_or_else(|| Error::Internal("a view column without a device".into()))?;
                let bytes: Vec<u8> = sizes.iter().flat_map(|s| s.to_le_bytes()).collect();
                let d = DeviceBuffer::from_host(&stream, &bytes, "view buffer sizes of an export")?;
                buffers.push(if d.is_empty() { std::ptr::null() } else { ptr(&d) });
                self.extra.push(d);
                buffers
            }
            t if t.is_primitive() || matches!(t, DataType::Boolean | DataType::FixedSizeBinary(_)) => vec![validity, ptr(&c.values)],
            t => {
                return Err(Error::Export(format!(
                    "column {} of device type {t}: the C Device Data Interface export does not handle this type",
                    c.field.name()
                )));
            }
        };
        let children = c.children.iter().map(|ch| self.node(ch)).collect::<Result<Vec<_>>>()?;
        let null_count = if c.device_type == DataType::Null { c.len } else { c.null_count };
        Ok(Node { len: c.len, null_count, offset: c.offset, buffers, children })
    }
}

/// What each exported `ArrowArray` owns.
struct NodeState {
    _keep: Arc<Keep>,
    buffers: Box<[*const c_void]>,
    children: Box<[*mut FFI_ArrowArray]>,
}

fn ffi_array(node: Node, keep: &Arc<Keep>) -> FFI_ArrowArray {
    let children: Box<[*mut FFI_ArrowArray]> = node.children.into_iter().map(|c| Box::into_raw(Box::new(ffi_array(c, keep)))).collect();
    let mut state = Box::new(NodeState { _keep: keep.clone(), buffers: node.buffers.into_boxed_slice(), children });
    FFI_ArrowArray {
        length: node.len as i64,
        null_count: node.null_count as i64,
        offset: node.offset as i64,
        n_buffers: state.buffers.len() as i64,
        n_children: state.children.len() as i64,
        buffers: state.buffers.as_mut_ptr(),
        children: state.children.as_mut_ptr(),
        dictionary: std::ptr::null_mut(),
        release: Some(release_node),
        private_data: Box::into_raw(state).cast(),
    }
}

/// The release callback of every exported array: releases the children the
/// consumer did not move out, frees the structs, and drops the reference
/// that keeps the device buffers.
unsafe extern "C" fn release_node(array: *mut FFI_ArrowArray) {
    if array.is_null() {
        return;
    }
    // SAFETY: the consumer passes an array this module exported (or a bitwise move of one).
    let array = unsafe { &mut *array };
    if !array.private_data.is_null() {
        // SAFETY: private_data is the NodeState box made in `ffi_array`, taken once.
        let state = unsafe { Box::from_raw(array.private_data.cast::<NodeState>()) };
        for &child in state.children.iter() {
            // SAFETY: each child struct was boxed in `ffi_array`; a child
            // moved out has a null release, so dropping the box does nothing
            // more than free it, and a live one is released by its drop.
            drop(unsafe { Box::from_raw(child) });
        }
    }
    array.private_data = std::ptr::null_mut();
    array.release = None;
}

/// A stream's state.
struct StreamState {
    batches: Box<dyn Iterator<Item = Result<Arc<DeviceTable>>> + Send>,
    /// The schema reported when there is no batch.
    empty_schema: SchemaRef,
    /// The device schema of the first batch, once it was read.
    schema: Option<Schema>,
    /// The first batch, read early to learn the schema.
    peeked: Option<Arc<DeviceTable>>,
    error: Option<(c_int, CString)>,
    done: bool,
    produced: usize,
}

impl StreamState {
    fn fail(&mut self, e: &Error) -> c_int {
        let code = match e {
            Error::OutOfDeviceMemory { .. } | Error::OutOfHostMemory { .. } | Error::OverBudget { .. } => libc::ENOMEM,
            Error::InvalidOptions(_) | Error::Export(_) => libc::EINVAL,
            _ => libc::EIO,
        };
        let text = e.to_string().replace('\0', " ");
        self.error = Some((code, CString::new(text).unwrap_or_default()));
        self.done = true;
        code
    }

    /// Reads until the schema is known (the first batch, or the end).
    fn learn_schema(&mut self) -> Result<()> {
        if self.schema.is_some() {
            return Ok(());
        }
        match self.batches.next() {
            Some(Ok(t)) => {
                self.schema = Some(t.device_schema());
                self.peeked = Some(t);
            }
            Some(Err(e)) => return Err(e),
            None => {
                self.done = true;
                self.schema = Some(self.empty_schema.as_ref().clone());
            }
        }
        Ok(())
    }

    fn schema(&mut self) -> Result<FFI_ArrowSchema> {
        self.learn_schema()?;
        Ok(FFI_ArrowSchema::try_from(self.schema.as_ref().expect("learnt"))?)
    }

    fn next(&mut self) -> Result<Option<FFI_ArrowDeviceArray>> {
        self.learn_schema()?;
        let table = match self.peeked.take() {
            Some(t) => t,
            None if self.done => return Ok(None),
            None => match self.batches.next() {
                Some(t) => t?,
                None => {
                    self.done = true;
                    return Ok(None);
                }
            },
        };
        let expected = self.schema.as_ref().expect("learnt");
        let got = table.device_schema();
        if got.fields() != expected.fields() {
            let (field, want) = got
                .fields()
                .iter()
                .zip(expected.fields())
                .find(|(g, w)| g != w)
                .map_or_else(|| (String::new(), String::new()), |(g, w)| (g.to_string(), w.to_string()));
            return Err(Error::Export(format!(
                "batch {} of the stream has device field {field} where the stream's schema (its first batch's) has {want}; \
                 a pass with more than 2 GiB of characters in one string column makes 64-bit offsets: read smaller batches",
                self.produced
            )));
        }
        self.produced += 1;
        Ok(Some(table.to_device_array()?))
    }
}

/// Runs a stream callback on its state, turning errors and panics into the
/// stream's sticky error.
///
/// # Safety
/// `stream` must be a live stream made by [`device_stream`].
unsafe fn with_state(stream: *mut FFI_ArrowDeviceArrayStream, f: impl FnOnce(&mut StreamState) -> Result<()>) -> c_int {
    if stream.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's promise.
    let private = unsafe { (*stream).private_data.cast::<StreamState>() };
    if private.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: private_data is the StreamState box of a live stream; the
    // specification has the consumer serialise calls.
    let state = unsafe { &mut *private };
    if let Some((code, _)) = &state.error {
        return *code;
    }
    // Reads bind gpq's context; the consumer's thread keeps its own.
    match catch_unwind(AssertUnwindSafe(|| crate::cuda::keeping_current_context(|| f(state)))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => state.fail(&e),
        Err(_) => state.fail(&Error::Internal("a panic inside gpq's device stream".into())),
    }
}

unsafe extern "C" fn stream_get_schema(stream: *mut FFI_ArrowDeviceArrayStream, out: *mut FFI_ArrowSchema) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live stream of ours; `out` is the consumer's struct to write.
    unsafe {
        with_state(stream, |s| {
            let schema = s.schema()?;
            std::ptr::write(out, schema);
            Ok(())
        })
    }
}

unsafe extern "C" fn stream_get_next(stream: *mut FFI_ArrowDeviceArrayStream, out: *mut FFI_ArrowDeviceArray) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live stream of ours; `out` is the consumer's struct to write.
    unsafe {
        with_state(stream, |s| {
            let next = s.next()?.unwrap_or_else(FFI_ArrowDeviceArray::empty);
            std::ptr::write(out, next);
            Ok(())
        })
    }
}

unsafe extern "C" fn stream_get_last_error(stream: *mut FFI_ArrowDeviceArrayStream) -> *const c_char {
    if stream.is_null() {
        return std::ptr::null();
    }
    // SAFETY: a live stream of ours.
    let private = unsafe { (*stream).private_data.cast::<StreamState>() };
    if private.is_null() {
        return std::ptr::null();
    }
    // SAFETY: as in `with_state`.
    match unsafe { &(*private).error } {
        Some((_, text)) => text.as_ptr(),
        None => std::ptr::null(),
    }
}

unsafe extern "C" fn stream_release(stream: *mut FFI_ArrowDeviceArrayStream) {
    if stream.is_null() {
        return;
    }
    // SAFETY: a live stream of ours (or a bitwise move of one).
    let stream = unsafe { &mut *stream };
    if !stream.private_data.is_null() {
        // SAFETY: the StreamState box made in `device_stream`, taken once. A
        // panic while dropping the reader must not cross the C boundary.
        let state = unsafe { Box::from_raw(stream.private_data.cast::<StreamState>()) };
        let _ = catch_unwind(AssertUnwindSafe(|| drop(state)));
    }
    stream.private_data = std::ptr::null_mut();
    stream.release = None;
}
