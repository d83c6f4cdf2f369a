//! gpq's errors as Python exceptions: each [`gpq::Error`] becomes one of the
//! classes of `gpq.errors` (all subclasses of `GpqError`, most also of the
//! built-in exception a Python user would catch: `OSError`, `KeyError`,
//! `MemoryError`...), with the Rust error's message and its `kind` as an
//! attribute.

use gpq::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The `gpq.errors` class for an error kind ([`Error::kind`]).
pub fn class_of(kind: &str) -> &'static str {
    match kind {
        "no-cuda-device" => "NoDeviceError",
        "invalid-options" | "row-group-out-of-range" => "InvalidArgumentError",
        "column-not-found" => "ColumnNotFoundError",
        "open" | "io" | "cufile-unavailable" => "FileError",
        "not-parquet" | "truncated" | "metadata" | "corrupt-page" => "CorruptFileError",
        "schema-mismatch" => "SchemaMismatchError",
        "unsupported" | "encrypted" | "filter" => "UnsupportedError",
        "out-of-device-memory" | "out-of-host-memory" | "over-budget" => "OutOfMemoryError",
        "export" => "ExportError",
        "cuda" | "kernel" | "nvcomp" | "gpu-context-lost" | "backend-mismatch" => "DeviceError",
        _ => "GpqError",
    }
}

/// The Python exception for `e`.
pub fn py_err(py: Python<'_>, e: Error) -> PyErr {
    let kind = e.kind();
    let message = e.to_string();
    let class = py
        .import("gpq.errors")
        .and_then(|m| m.getattr(class_of(kind)))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(ty) => {
            let err = PyErr::from_type(ty, message);
            let _ = err.value(py).setattr("kind", kind);
            err
        }
        // The package's Python half is missing (a bare extension module).
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// An export error raised from the bindings themselves.
pub fn export_err(py: Python<'_>, message: impl Into<String>) -> PyErr {
    py_err(py, Error::Export(message.into()))
}

/// An invalid-argument error raised from the bindings themselves.
pub fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    py_err(py, Error::InvalidOptions(message.into()))
}
