//! # gpq: Apache Parquet straight into GPU memory
//!
//! gpq plans a read on the CPU from the file's footer ([`plan`]), moves the
//! planned column-chunk bytes from storage into device memory ([`io`]:
//! GPUDirect Storage through cuFile, cuFile's compatibility mode, or gpq's own
//! pinned bounce-buffer path), and decodes them on the GPU into Arrow-layout
//! device columns.
//!
//! The crate loads CUDA at run time: it builds, and its CPU parts work, on a
//! machine without CUDA. Without a device, GPU entry points return
//! [`Error::NoCudaDevice`].

#![warn(missing_docs)]

pub mod arrow;
pub mod baseline;
#[cfg(feature = "datafusion")]
pub mod datafusion;
pub mod decode;
pub mod error;
pub mod gpu;
pub mod io;
pub mod options;
pub mod plan;

pub use error::{Error, Result};
pub use options::{ColumnSelector, DecompressMode, IoOptions, IoPath, ReadOptions};
pub use plan::ReadPlan;
pub mod tpch;
pub mod reader;

pub use reader::{DeviceChunks, read_column_chunks, read_parquet_to_device, read_parquet_to_device_with_footer};
pub use arrow::{DeviceColumn, DeviceTable, ReadStats};
