//! # gpq: Apache Parquet straight into GPU memory
//!
//! gpq reads Parquet files into Arrow-layout columns that live in GPU memory.
//! Footers are parsed on the CPU, the selected column chunks move from
//! storage into device memory (GPUDirect Storage through cuFile, cuFile's
//! compatibility mode, or gpq's own pinned bounce buffers), and the GPU parses
//! page headers, decompresses and decodes them.
//!
//! ## Which entry point to use
//!
//! | you want | use |
//! | --- | --- |
//! | a file (or some of its columns and row groups) as device Arrow columns | [`read_parquet_to_device`] |
//! | the same as a sequence of tables, bounded in rows or device memory, IO overlapping decode | [`DeviceReaderBuilder`] |
//! | the same for many reads of one file, footer parsed once | [`read_footer`] then [`read_parquet_to_device_with_footer`] |
//! | to know before any IO whether the GPU decodes a selection | [`ReadPlan::new`] then [`can_decode`] |
//! | the raw column-chunk bytes in device memory, no decoding | [`read_column_chunks`] |
//! | to look at what a read would do (columns, row groups, IO ranges) | [`ReadPlan`] |
//! | the decoded columns back on the host as arrow-rs arrays | [`DeviceTable::to_record_batch`] or, faster, [`DeviceTable::to_record_batch_pinned`]; in chunks, each as it lands: [`DeviceTable::into_staged_batches`] |
//! | options from `GPQ_*` environment variables, as the CLI does | [`ReadOptions::from_env`] |
//! | to hand a table, a column or a stream of batches to another GPU library without a copy (cuDF, nanoarrow, anything that imports `ArrowDeviceArray`) | [`DeviceTable::to_device_array`], [`DeviceTable::column_to_device_array`], [`DeviceBatchReader::into_device_stream`] ([`arrow::c_device`]) |
//! | a fixed-width column, or any buffer of a column, as a DLPack tensor (PyTorch, CuPy, JAX) | [`DeviceColumn::values_tensor`], [`DeviceColumn::buffer_tensor`] ([`arrow::dlpack`]) |
//! | the rows where a predicate holds, filtered on the device before any copy | [`DeviceTable::filter_columns`] ([`arrow::filter`]) |
//! | per-group counts, exact sums, minima and maxima computed on the device, one row per group copied back | [`DeviceTable::aggregate`] ([`arrow::aggregate`]) |
//!
//! SQL over Parquet decoded by gpq is the `gpq-datafusion` crate; the `gpq`
//! command line is `gpq-cli`; the Python package `gpq` is `gpq-python`.
//!
//! ## Layout
//!
//! The modules follow the data: [`plan`] (CPU: footer, projection, IO
//! ranges) -> [`io`] (bytes into device memory) -> [`gpu`] (the kernels) ->
//! [`decode`] (page headers, decompression, values) -> [`arrow`] (device
//! columns and their host copies). [`reader`] ties them together. Below every
//! stage sit [`cuda`] (device, streams, memory), [`error`], [`options`] and
//! [`stats`]. No module imports from a stage downstream of it
//! (`tests/layering.rs` checks this).
//!
//! ## Machines without CUDA
//!
//! CUDA libraries are loaded at run time: the crate builds, and its CPU parts
//! work, on a machine without CUDA. Without a device, reads return
//! [`Error::NoCudaDevice`]. Every fallback (IO path, CPU decompression) is
//! logged with `tracing` and reported in the read's [`ReadStats`].
//!
//! ## Environment
//!
//! The library reads no per-read setting from the environment; the CLI builds
//! its options with [`ReadOptions::from_env`]. Process-wide settings with
//! documented defaults are read in one place, [`mod@env`]: where the kernel cache
//! lives, where nvCOMP and cuFile are, the pinned host pool's size, and
//! whether to route the GPU to the CPU emulator.

#![warn(missing_docs)]

pub mod arrow;
pub mod cuda;
pub mod decode;
pub mod env;
pub mod error;
pub mod files;
pub mod gpu;
pub mod io;
pub mod options;
pub mod plan;
pub mod reader;
pub mod stats;

pub use arrow::{DeviceColumn, DeviceTable};
pub use error::{CorruptKind, Error, Result};
pub use files::parquet_files;
pub use io::DeviceChunks;
pub use options::{ColumnSelector, DecompressMode, IoOptions, IoPath, OVERLAP_GROUP_BYTES, OVERLAP_MAX_GROUPS, OVERLAP_MAX_WORKER_GROUPS, ReadOptions, DeviceDecoder, ZstdDecoder};
pub use plan::{Footer, ReadPlan, cached_footers, clear_footer_cache, read_footer, read_footer_with_page_index};
pub use reader::{
    BOUNDED_DECODE_AHEAD, DeviceBatchReader, DeviceReaderBuilder, MAX_DECODE_AHEAD, can_decode, read_column_chunks, read_parquet_to_device, read_parquet_to_device_with_footer,
};
pub use stats::{DecompressStats, FilterStats, IoStats, OverlapStats, ReadStats, SetupStats};

/// The main loop of the `gpq-nvcomp-worker` process the library starts to
/// run nvCOMP in isolation; not for other use.
#[doc(hidden)]
pub use decode::isolated::worker_main as nvcomp_worker_main;
