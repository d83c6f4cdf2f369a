//! PyCapsules of the Arrow PyCapsule interface (`arrow_schema`,
//! `arrow_array`, `arrow_device_array`, `arrow_device_array_stream`) and of
//! DLPack (`dltensor`, `dltensor_versioned`).
//!
//! Each capsule owns a heap struct. A consumer takes the content over by
//! moving it out (Arrow: it copies the struct and marks the source released)
//! or by renaming the capsule (DLPack: `used_dltensor`); the capsule's
//! destructor releases whatever was not taken, so a capsule dropped unused
//! frees its device memory reference too.

use std::ffi::{CStr, c_void};

use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use gpq::arrow::dlpack::{DLManagedTensor, DLManagedTensorVersioned};
use gpq::arrow::{FFI_ArrowDeviceArray, FFI_ArrowDeviceArrayStream};
use pyo3::prelude::*;
use pyo3::{PyErr, ffi};

const SCHEMA: &CStr = c"arrow_schema";
const ARRAY: &CStr = c"arrow_array";
const DEVICE_ARRAY: &CStr = c"arrow_device_array";
const DEVICE_STREAM: &CStr = c"arrow_device_array_stream";
const DLTENSOR: &CStr = c"dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";

/// Wraps `ptr` in a capsule named `name`; on failure frees it with `free`.
fn capsule<'py>(
    py: Python<'py>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
    free: impl FnOnce(),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `name` is 'static; the destructor matches what `ptr` is.
    let raw = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if raw.is_null() {
        free();
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference we own.
    Ok(unsafe { Bound::from_owned_ptr(py, raw) })
}

/// The capsule's pointer if it still has the name `name` (a consumer
/// renames a DLPack capsule it took), without leaving an exception set.
///
/// # Safety
/// `cap` is a live capsule.
unsafe fn pointer(cap: *mut ffi::PyObject, name: &CStr) -> *mut c_void {
    // SAFETY: the caller's promise; IsValid sets no exception.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, name.as_ptr()) == 1 { ffi::PyCapsule_GetPointer(cap, name.as_ptr()) } else { std::ptr::null_mut() }
    }
}

unsafe extern "C" fn drop_schema(cap: *mut ffi::PyObject) {
    // SAFETY: made by `schema_capsule`; a moved-out schema has a null release.
    unsafe {
        let p = pointer(cap, SCHEMA).cast::<FFI_ArrowSchema>();
        if !p.is_null() {
            drop(Box::from_raw(p));
        }
    }
}

unsafe extern "C" fn drop_array(cap: *mut ffi::PyObject) {
    // SAFETY: made by `array_capsule`.
    unsafe {
        let p = pointer(cap, ARRAY).cast::<FFI_ArrowArray>();
        if !p.is_null() {
            drop(Box::from_raw(p));
        }
    }
}

unsafe extern "C" fn drop_device_array(cap: *mut ffi::PyObject) {
    // SAFETY: made by `device_array_capsule`.
    unsafe {
        let p = pointer(cap, DEVICE_ARRAY).cast::<FFI_ArrowDeviceArray>();
        if !p.is_null() {
            drop(Box::from_raw(p));
        }
    }
}

unsafe extern "C" fn drop_device_stream(cap: *mut ffi::PyObject) {
    // SAFETY: made by `device_stream_capsule`.
    unsafe {
        let p = pointer(cap, DEVICE_STREAM).cast::<FFI_ArrowDeviceArrayStream>();
        if !p.is_null() {
            drop(Box::from_raw(p));
        }
    }
}

unsafe extern "C" fn drop_dltensor(cap: *mut ffi::PyObject) {
    // SAFETY: made by `dltensor_capsule`; renamed (and then not ours) once consumed.
    unsafe {
        let p = pointer(cap, DLTENSOR).cast::<DLManagedTensor>();
        if let Some(deleter) = p.as_ref().and_then(|t| t.deleter) {
            deleter(p);
        }
    }
}

unsafe extern "C" fn drop_dltensor_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: made by `dltensor_versioned_capsule`; renamed once consumed.
    unsafe {
        let p = pointer(cap, DLTENSOR_VERSIONED).cast::<DLManagedTensorVersioned>();
        if let Some(deleter) = p.as_ref().and_then(|t| t.deleter) {
            deleter(p);
        }
    }
}

/// An `arrow_schema` capsule.
pub fn schema_capsule(py: Python<'_>, schema: FFI_ArrowSchema) -> PyResult<Bound<'_, PyAny>> {
    let p = Box::into_raw(Box::new(schema));
    // SAFETY (free): `p` was just boxed and not handed out.
    capsule(py, p.cast(), SCHEMA, drop_schema, || drop(unsafe { Box::from_raw(p) }))
}

/// An `arrow_array` capsule (host memory).
pub fn array_capsule(py: Python<'_>, array: FFI_ArrowArray) -> PyResult<Bound<'_, PyAny>> {
    let p = Box::into_raw(Box::new(array));
    // SAFETY (free): as in `schema_capsule`.
    capsule(py, p.cast(), ARRAY, drop_array, || drop(unsafe { Box::from_raw(p) }))
}

/// An `arrow_device_array` capsule.
pub fn device_array_capsule(py: Python<'_>, array: FFI_ArrowDeviceArray) -> PyResult<Bound<'_, PyAny>> {
    let p = Box::into_raw(Box::new(array));
    // SAFETY (free): as in `schema_capsule`.
    capsule(py, p.cast(), DEVICE_ARRAY, drop_device_array, || drop(unsafe { Box::from_raw(p) }))
}

/// An `arrow_device_array_stream` capsule.
pub fn device_stream_capsule(py: Python<'_>, stream: FFI_ArrowDeviceArrayStream) -> PyResult<Bound<'_, PyAny>> {
    let p = Box::into_raw(Box::new(stream));
    // SAFETY (free): as in `schema_capsule`.
    capsule(py, p.cast(), DEVICE_STREAM, drop_device_stream, || drop(unsafe { Box::from_raw(p) }))
}

/// A `dltensor` capsule over a managed tensor the capsule now owns.
pub fn dltensor_capsule(py: Python<'_>, t: *mut DLManagedTensor) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY (free): `t` came from `DeviceTensor::into_dlpack` and was not handed out.
    capsule(py, t.cast(), DLTENSOR, drop_dltensor, || unsafe {
        if let Some(d) = (*t).deleter {
            d(t)
        }
    })
}

/// A `dltensor_versioned` capsule over a managed tensor the capsule now owns.
pub fn dltensor_versioned_capsule(py: Python<'_>, t: *mut DLManagedTensorVersioned) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY (free): as in `dltensor_capsule`, for `into_dlpack_versioned`.
    capsule(py, t.cast(), DLTENSOR_VERSIONED, drop_dltensor_versioned, || unsafe {
        if let Some(d) = (*t).deleter {
            d(t)
        }
    })
}
