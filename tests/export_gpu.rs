//! Handing device columns to other libraries: the Arrow C Device Data
//! Interface (tables, columns, streams of batches) and DLPack tensors. On the
//! emulator the exports are host memory, so they are imported back with
//! arrow-rs's C Data Interface and compared with arrow-rs reading the file;
//! on a GPU the structs are checked against the table's device pointers.
//! Both check that the table is freed exactly when the last consumer
//! releases what it holds. Ignored without a device or the emulator.

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int32Array, ListArray, RecordBatch, StringViewArray, StructArray, make_array};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema, from_ffi};
use common::{arrow_rs, assert_batches_equal, gpu_trial, probe_device, run_trials, write_sample};
use gpq::arrow::c_device::{ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA, FFI_ArrowDeviceArray, FFI_ArrowDeviceArrayStream};
use gpq::arrow::dlpack::{ColumnBuffer, DLDataType, KDL_CPU, KDL_CUDA};
use gpq::cuda::GpuContext;
use gpq::{DeviceReaderBuilder, DeviceTable, Error, ReadOptions, read_parquet_to_device};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "table_exports_as_a_struct_of_its_columns", table_exports_as_struct),
        gpu_trial(&device, "views_lists_and_structs_export", views_lists_and_structs_export),
        gpu_trial(&device, "release_frees_only_after_every_consumer", release_frees_after_every_consumer),
        gpu_trial(&device, "stream_yields_every_batch_then_ends", stream_yields_every_batch),
        gpu_trial(&device, "stream_errors_are_sticky_and_named", stream_errors_are_sticky),
        gpu_trial(&device, "fixed_width_columns_are_dlpack_tensors", dlpack_tensors),
        gpu_trial(&device, "exports_keep_the_threads_current_context", exports_keep_current_context),
    ])
}

/// Held by every test: one of them counts the device's live bytes.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn read(path: &std::path::Path) -> Arc<DeviceTable> {
    Arc::new(read_parquet_to_device(path, &ReadOptions::new()).unwrap())
}

/// Moves the `ArrowArray` out of a device array (as a consumer would).
fn take_array(d: &mut FFI_ArrowDeviceArray) -> FFI_ArrowArray {
    std::mem::replace(&mut d.array, FFI_ArrowArray::empty())
}

/// Imports a host-memory (emulator) export of a table as a record batch.
fn import_batch(mut d: FFI_ArrowDeviceArray, schema: &FFI_ArrowSchema) -> RecordBatch {
    assert_eq!(d.device_type, ARROW_DEVICE_CPU);
    let data = unsafe { from_ffi(take_array(&mut d), schema) }.unwrap();
    RecordBatch::from(StructArray::from(data))
}

/// Checks the device array's envelope: where it says the buffers are, and the event.
fn check_envelope(ctx: &Arc<GpuContext>, d: &FFI_ArrowDeviceArray) {
    assert!(!d.is_released());
    assert_eq!(d.reserved, [0; 3]);
    if ctx.is_emulated() {
        assert_eq!((d.device_type, d.device_id), (ARROW_DEVICE_CPU, 0));
        assert!(d.sync_event.is_null());
    } else {
        assert_eq!((d.device_type, d.device_id), (ARROW_DEVICE_CUDA, ctx.ordinal() as i64));
        assert!(!d.sync_event.is_null(), "a CUDA export carries an event");
    }
}

/// The buffer pointers of an exported array.
fn buffers(a: &FFI_ArrowArray) -> Vec<u64> {
    (0..a.n_buffers as usize).map(|i| unsafe { *a.buffers.add(i) } as u64).collect()
}

fn child(a: &FFI_ArrowArray, i: usize) -> &FFI_ArrowArray {
    assert!(i < a.n_children as usize);
    unsafe { &**a.children.add(i) }
}

fn table_exports_as_struct(ctx: &Arc<GpuContext>) {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 3000, 1000, Compression::SNAPPY);
    let table = read(&path);
    let d = table.to_device_array().unwrap();
    check_envelope(ctx, &d);
    let a = &d.array;
    assert_eq!((a.length, a.null_count, a.offset, a.n_buffers, a.n_children), (3000, 0, 0, 1, 4));
    assert_eq!(buffers(a), vec![0], "a record batch has no validity");
    // Each child points at the column's own device buffers: nothing was copied.
    for (i, c) in table.columns().iter().enumerate() {
        let ch = child(a, i);
        assert_eq!((ch.length as usize, ch.null_count as usize), (c.len(), c.null_count()), "column {i}");
        let b = buffers(ch);
        assert_eq!(b.last().copied(), Some(c.values_ptr()), "column {i} values");
        if c.null_count() > 0 {
            assert_eq!(b[0], c.validity().unwrap().ptr(), "column {i} validity");
        }
        if let Some(o) = c.offsets() {
            assert_eq!(b[1], o.ptr(), "column {i} offsets");
        }
    }
    let schema = table.device_schema_ffi().unwrap();
    let expected = arrow_rs(&path).unwrap();
    if ctx.is_emulated() {
        assert_batches_equal("imported export", &expected, &import_batch(d, &schema));
        // A column on its own.
        let mut col = table.column_to_device_array(1).unwrap();
        let field = FFI_ArrowSchema::try_from(&table.columns()[1].device_field()).unwrap();
        let data = unsafe { from_ffi(take_array(&mut col), &field) }.unwrap();
        assert_eq!(&make_array(data), expected.column(1));
    }
    assert!(matches!(table.column_to_device_array(4), Err(Error::Export(_))));
}

/// A file with a Utf8View column (its embedded Arrow schema asks for
/// views), a list column with nulls and a struct column.
fn write_nested(path: &std::path::Path, rows: usize) -> RecordBatch {
    let views: StringViewArray =
        (0..rows).map(|i| if i % 7 == 3 { None } else { Some(format!("v{i}{}", "-long-enough-to-leave-the-view".repeat(i % 3))) }).collect();
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
        (0..rows).map(|i| if i % 5 == 0 { None } else { Some((0..(i % 4) as i32).map(move |k| if k == 2 { None } else { Some(k + i as i32) })) }),
    );
    let ints: Int32Array = (0..rows as i32).map(Some).collect();
    let strukt = StructArray::from(vec![(Arc::new(Field::new("x", DataType::Int32, true)), Arc::new(ints) as ArrayRef)]);
    let schema = Schema::new(vec![
        Field::new("v", DataType::Utf8View, true),
        Field::new("l", list.data_type().clone(), true),
        Field::new("s", strukt.data_type().clone(), true),
    ]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(views) as ArrayRef, Arc::new(list), Arc::new(strukt)]).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    batch
}

fn views_lists_and_structs_export(ctx: &Arc<GpuContext>) {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.parquet");
    write_nested(&path, 2000);
    let table = read(&path);
    assert_eq!(table.columns()[0].device_type(), &DataType::Utf8View);
    let d = table.to_device_array().unwrap();
    check_envelope(ctx, &d);
    // The view column: validity, views, one data buffer, and the data buffer sizes (on the device too).
    let v = child(&d.array, 0);
    assert_eq!(v.n_buffers, 4);
    assert_eq!(buffers(v)[2], table.columns()[0].view_data().unwrap().ptr());
    assert_eq!(child(&d.array, 1).n_children, 1, "a list has its element");
    assert_eq!(child(&d.array, 2).n_children, 1, "a struct has its field");
    if ctx.is_emulated() {
        let schema = table.device_schema_ffi().unwrap();
        assert_batches_equal("nested export", &arrow_rs(&path).unwrap(), &import_batch(d, &schema));
    }
}

fn release_frees_after_every_consumer(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 5000, 1000, Compression::ZSTD(Default::default()));
    // Alone in the process (the other tests allocate on the same device),
    // after a first read has made whatever the device keeps between reads.
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    drop(read(&path));
    let before = ctx.live_buffer_bytes();
    let table = read(&path);
    let held = ctx.live_buffer_bytes() - before;
    assert!(held >= table.device_bytes(), "the table's {} bytes are counted ({held})", table.device_bytes());
    let weak = Arc::downgrade(&table);
    let mut whole = table.to_device_array().unwrap();
    let column = table.column_to_device_array(0).unwrap();
    drop(table);
    assert!(weak.upgrade().is_some(), "exports keep the table");
    // A consumer moves one child out (bitwise copy, source marked released).
    let moved = unsafe {
        let slot = *whole.array.children.add(3);
        let out = std::ptr::read(slot);
        (*slot).release = None;
        out
    };
    drop(take_array(&mut whole)); // releases the struct and its other children
    drop(whole);
    assert!(weak.upgrade().is_some(), "the column export and the moved child still hold it");
    drop(column);
    assert!(weak.upgrade().is_some(), "the moved child still holds it");
    assert_eq!(moved.length, 5000);
    drop(moved);
    assert!(weak.upgrade().is_none(), "the last release frees the table");
    // Every device byte of the table (and of the exports) is given back.
    assert_eq!(ctx.live_buffer_bytes(), before, "device bytes after the last release");
}

/// Four files of 700, 1, 2500 and 1200 rows.
fn four_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    [700usize, 1, 2500, 1200]
        .into_iter()
        .enumerate()
        .map(|(i, rows)| write_sample(&dir.join(format!("part-{i}.parquet")), rows, 500, Compression::SNAPPY))
        .collect()
}

fn stream_next(s: &mut FFI_ArrowDeviceArrayStream) -> Result<Option<FFI_ArrowDeviceArray>, (i32, String)> {
    let mut out = FFI_ArrowDeviceArray::empty();
    let code = unsafe { (s.get_next.unwrap())(s, &mut out) };
    if code != 0 {
        let text = unsafe { (s.get_last_error.unwrap())(s) };
        let text = if text.is_null() { String::new() } else { unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned() };
        return Err((code, text));
    }
    Ok((!out.is_released()).then_some(out))
}

fn stream_yields_every_batch(ctx: &Arc<GpuContext>) {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let files = four_files(dir.path());
    let expected: Vec<RecordBatch> = files.iter().map(|p| arrow_rs(p).unwrap()).collect();
    let want = arrow::compute::concat_batches(&expected[0].schema(), &expected).unwrap();
    let reader = DeviceReaderBuilder::try_new_files(&files).unwrap().with_batch_rows(1000).build().unwrap();
    let mut s = reader.into_device_stream();
    assert_eq!(s.device_type, if ctx.is_emulated() { ARROW_DEVICE_CPU } else { ARROW_DEVICE_CUDA });
    let mut schema = FFI_ArrowSchema::empty();
    assert_eq!(unsafe { (s.get_schema.unwrap())(&mut s, &mut schema) }, 0);
    let mut rows = Vec::new();
    let mut host = Vec::new();
    while let Some(d) = stream_next(&mut s).unwrap() {
        check_envelope(ctx, &d);
        rows.push(d.array.length as usize);
        if ctx.is_emulated() {
            host.push(import_batch(d, &schema));
        }
    }
    assert_eq!(rows, vec![700, 1, 1000, 1000, 500, 1000, 200]);
    assert!(stream_next(&mut s).unwrap().is_none(), "the end stays the end");
    if ctx.is_emulated() {
        assert_batches_equal("stream", &want, &arrow::compute::concat_batches(&host[0].schema(), &host).unwrap());
    }
    drop(s);
    // An empty selection: the result schema, and the end at once.
    let reader = DeviceReaderBuilder::try_new(&files[0]).unwrap().with_limit(0).build().unwrap();
    let mut s = reader.into_device_stream();
    let mut schema = FFI_ArrowSchema::empty();
    assert_eq!(unsafe { (s.get_schema.unwrap())(&mut s, &mut schema) }, 0);
    assert_eq!(Schema::try_from(&schema).unwrap().fields().len(), 4);
    assert!(stream_next(&mut s).unwrap().is_none());
}

fn stream_errors_are_sticky(_: &Arc<GpuContext>) {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let files = four_files(dir.path());
    // The third file's second row group has a corrupt page header.
    let mut bytes = std::fs::read(&files[2]).unwrap();
    let md = parquet::file::serialized_reader::SerializedFileReader::new(std::fs::File::open(&files[2]).unwrap()).unwrap();
    let start = parquet::file::reader::FileReader::metadata(&md).row_group(1).column(0).byte_range().0 as usize;
    bytes[start..start + 24].fill(0xFF);
    std::fs::write(&files[2], &bytes).unwrap();
    let reader = DeviceReaderBuilder::try_new_files(&files).unwrap().with_batch_rows(1000).build().unwrap();
    let mut s = reader.into_device_stream();
    assert_eq!(stream_next(&mut s).unwrap().unwrap().array.length, 700);
    assert_eq!(stream_next(&mut s).unwrap().unwrap().array.length, 1);
    let (code, text) = stream_next(&mut s).expect_err("the corrupt file's batch is an error");
    assert_eq!(code, EIO);
    assert!(text.contains("part-2.parquet") && text.contains("row group 1"), "{text}");
    assert_eq!(stream_next(&mut s).err().map(|e| e.0), Some(code), "the error stays");
}

/// `EIO` on Linux: what a failed read is, as a stream's error code.
const EIO: i32 = 5;

fn dlpack_tensors(ctx: &Arc<GpuContext>) {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 3000, 1000, Compression::SNAPPY);
    let table = read(&path);
    let expected = arrow_rs(&path).unwrap();
    let id = &table.columns()[0];
    let t = id.values_tensor().unwrap();
    assert_eq!((t.ptr, t.len, t.dtype), (id.values_ptr(), 3000, DLDataType::int(64)));
    assert_eq!(t.device.device_type, if ctx.is_emulated() { KDL_CPU } else { KDL_CUDA });
    assert_eq!(t.dtype.typestr(), "<i8");
    if ctx.is_emulated() {
        let got = unsafe { std::slice::from_raw_parts(t.ptr as *const i64, t.len) };
        let want = expected.column(0).as_any().downcast_ref::<arrow::array::Int64Array>().unwrap();
        assert_eq!(got, want.values().as_ref());
    }
    // Nulls, strings: no tensor, a typed error.
    assert!(matches!(table.columns()[1].values_tensor(), Err(Error::Export(m)) if m.contains("nulls")));
    assert!(matches!(table.columns()[3].values_tensor(), Err(Error::Export(_))));
    // Their buffers are tensors.
    let validity = table.columns()[1].buffer_tensor(ColumnBuffer::Validity).unwrap().unwrap();
    assert_eq!((validity.len, validity.dtype), (375, DLDataType::uint(8)));
    let offsets = table.columns()[3].buffer_tensor(ColumnBuffer::Offsets).unwrap().unwrap();
    assert_eq!((offsets.len, offsets.dtype), (3001, DLDataType::int(32)));
    assert_eq!(table.columns()[0].buffer_tensor(ColumnBuffer::Offsets).unwrap(), None);
    // The managed tensor holds the table until its deleter runs.
    let weak = Arc::downgrade(&table);
    let owner: Arc<dyn std::any::Any + Send + Sync> = table.clone();
    let managed = t.into_dlpack(owner.clone());
    let versioned = t.into_dlpack_versioned(owner);
    drop(table);
    unsafe {
        assert_eq!((*managed).dl_tensor.data as u64, t.ptr);
        assert_eq!(*(*managed).dl_tensor.shape, 3000);
        assert_eq!((*versioned).version.major, 1);
        ((*managed).deleter.unwrap())(managed);
    }
    assert!(weak.upgrade().is_some(), "the versioned tensor still holds the table");
    unsafe { ((*versioned).deleter.unwrap())(versioned) };
    assert!(weak.upgrade().is_none());
}

/// The context current on this thread (null for none).
fn current_context() -> cudarc::driver::sys::CUcontext {
    let mut c = std::ptr::null_mut();
    assert_eq!(unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut c) }, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    c
}

fn exports_keep_current_context(ctx: &Arc<GpuContext>) {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    if ctx.is_emulated() {
        return; // no CUDA contexts on the emulator
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 3000, 1000, Compression::SNAPPY);
    // A thread with no current context (as a consumer's thread may be) stays without one.
    unsafe { cudarc::driver::sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    let table = gpq::cuda::keeping_current_context(|| read(&path));
    assert!(current_context().is_null(), "a read wrapped in keeping_current_context");
    let whole = table.to_device_array().unwrap();
    let tensor = table.columns()[0].values_tensor().unwrap().into_dlpack(table.clone());
    assert!(current_context().is_null(), "exports keep the caller's context");
    drop(table);
    drop(whole);
    unsafe { ((*tensor).deleter.unwrap())(tensor) };
    assert!(current_context().is_null(), "releases (which synchronize and free) keep the caller's context");
}
