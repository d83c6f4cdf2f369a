//! The one error type of gpq.
//!
//! Every failure names where it happened: the file, and where it applies the
//! row group, the column and the page. Errors coming from the CUDA driver,
//! cuFile, NVRTC or nvCOMP keep the library's own code and name so a user can
//! look them up.

use std::path::PathBuf;

/// Result alias used across gpq.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, and where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable CUDA device: the driver library is missing, it failed to
    /// initialise, or there is no device with the requested ordinal.
    #[error("no CUDA device: {reason}")]
    NoCudaDevice {
        /// Why the probe found no device.
        reason: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {message}")]
    Cuda {
        /// The driver entry point, e.g. `cuMemcpyHtoDAsync`.
        call: &'static str,
        /// The driver's error name and description.
        message: String,
    },

    /// The device has too little free memory for an allocation.
    #[error("out of GPU memory: asked for {requested} bytes ({what}), {free} of {total} bytes free")]
    OutOfDeviceMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the device reported free at the time.
        free: u64,
        /// Total bytes on the device.
        total: u64,
        /// What the allocation was for.
        what: &'static str,
    },

    /// cuFile (GPUDirect Storage) cannot be used in the requested mode.
    #[error("cuFile unavailable ({mode}): {reason}")]
    CufileUnavailable {
        /// `gds` or `cufile-compat`.
        mode: &'static str,
        /// Why, as precisely as the probe could tell.
        reason: String,
    },

    /// An operating-system read failed or came back short.
    #[error("IO error reading {file} at offset {offset} (+{len} bytes): {source}")]
    Io {
        /// The file being read.
        file: PathBuf,
        /// Byte offset of the failed read.
        offset: u64,
        /// Length of the failed read.
        len: u64,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The file is not a Parquet file (no `PAR1` magic).
    #[error("{file} is not a Parquet file: {reason}")]
    NotParquet {
        /// The file.
        file: PathBuf,
        /// What was found instead.
        reason: String,
    },

    /// The file is shorter than its own metadata says.
    #[error("{file} is truncated: row group {row_group}, column {column} ends at byte {end} but the file has {file_size} bytes")]
    Truncated {
        /// The file.
        file: PathBuf,
        /// Row group whose chunk runs past the end.
        row_group: usize,
        /// Column path of that chunk.
        column: String,
        /// End offset the metadata claims.
        end: u64,
        /// Actual file size.
        file_size: u64,
    },

    /// The parquet crate rejected the footer or metadata.
    #[error("invalid Parquet metadata in {file}: {source}")]
    Metadata {
        /// The file.
        file: PathBuf,
        /// The parquet crate's error.
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// A requested column does not exist.
    #[error("{file} has no column {column:?} (columns: {available})")]
    ColumnNotFound {
        /// The file.
        file: PathBuf,
        /// The name or index asked for.
        column: String,
        /// Comma-separated top-level column names, to help the caller.
        available: String,
    },

    /// A requested row group does not exist.
    #[error("{file} has {num_row_groups} row groups; row group {row_group} was requested")]
    RowGroupOutOfRange {
        /// The file.
        file: PathBuf,
        /// Index asked for.
        row_group: usize,
        /// Row groups in the file.
        num_row_groups: usize,
    },

    /// Options that contradict each other or are out of range.
    #[error("invalid options: {0}")]
    InvalidOptions(String),

    /// A page failed to decode: the bytes do not follow the Parquet format.
    #[error("corrupt page in {file}: row group {row_group}, column {column}, page {page}: {kind}")]
    CorruptPage {
        /// The file.
        file: PathBuf,
        /// Row group index within the file.
        row_group: usize,
        /// Column path.
        column: String,
        /// Page index within the column chunk (the dictionary page, if any, is page 0).
        page: usize,
        /// What was wrong.
        kind: String,
    },

    /// A valid file uses a feature gpq does not decode (yet).
    #[error("unsupported in {file}, column {column}: {what}")]
    Unsupported {
        /// The file.
        file: PathBuf,
        /// Column path.
        column: String,
        /// The feature.
        what: String,
    },

    /// A kernel failed to compile or load.
    #[error("kernel build failed ({stage}): {log}")]
    Kernel {
        /// `nvrtc`, `cache` or `load`.
        stage: &'static str,
        /// Compiler log or error text.
        log: String,
    },

    /// nvCOMP could not be used or reported an error outside any one page.
    #[error("nvCOMP: {0}")]
    Nvcomp(String),

    /// Converting device columns to Arrow failed.
    #[error("Arrow conversion: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl Error {
    /// A short machine-friendly name for the variant, used in statistics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NoCudaDevice { .. } => "no-cuda-device",
            Error::Cuda { .. } => "cuda",
            Error::OutOfDeviceMemory { .. } => "out-of-device-memory",
            Error::CufileUnavailable { .. } => "cufile-unavailable",
            Error::Io { .. } => "io",
            Error::NotParquet { .. } => "not-parquet",
            Error::Truncated { .. } => "truncated",
            Error::Metadata { .. } => "metadata",
            Error::ColumnNotFound { .. } => "column-not-found",
            Error::RowGroupOutOfRange { .. } => "row-group-out-of-range",
            Error::InvalidOptions(_) => "invalid-options",
            Error::CorruptPage { .. } => "corrupt-page",
            Error::Unsupported { .. } => "unsupported",
            Error::Kernel { .. } => "kernel",
            Error::Nvcomp(_) => "nvcomp",
            Error::Arrow(_) => "arrow",
        }
    }
}
