//! The one error type of gpq, and the typed kinds of page corruption.
//!
//! Every failure names where it happened: the file, and where it applies the
//! row group, the column and the page. Errors from the CUDA driver keep the
//! driver's code (as the error's source) so a caller can tell an error that
//! leaves the context unusable from an ordinary one
//! ([`Error::is_context_lost`]); cuFile, NVRTC and nvCOMP errors keep their
//! library's name for the code. Corrupt pages carry a [`CorruptKind`], the
//! same codes the kernels write into their status words.

use std::path::PathBuf;

use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;

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

    /// A CUDA driver call failed; the source holds the driver's code.
    #[error("CUDA driver call {call} failed: {}", describe_cuda(source))]
    Cuda {
        /// The driver entry point, e.g. `cuMemcpyHtoDAsync`.
        call: &'static str,
        /// The driver's error (its `CUresult` is `source.0`).
        #[source]
        source: DriverError,
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

    /// Host memory (pinned or, on the emulator, ordinary) could not be allocated.
    #[error("out of host memory: asked for {requested} bytes ({what})")]
    OutOfHostMemory {
        /// Bytes asked for.
        requested: u64,
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

    /// A file or directory could not be opened, inspected or listed.
    #[error("cannot open {}: {source}", file.display())]
    Open {
        /// The path.
        file: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// An operating-system read failed or came back short.
    #[error("IO error reading {} at offset {offset} (+{len} bytes): {source}", file.display())]
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

    /// The file is not a Parquet file (no `PAR1` magic, or an unreadable footer).
    #[error("{} is not a Parquet file: {reason}", file.display())]
    NotParquet {
        /// The file.
        file: PathBuf,
        /// What was found instead.
        reason: String,
    },

    /// The file uses Parquet modular encryption (an encrypted footer, magic
    /// `PARE`, or a plaintext footer with encrypted columns), which gpq does
    /// not read. Not a fault of the file.
    #[error("{} is encrypted (Parquet modular encryption: {detail}); gpq does not read encrypted files", file.display())]
    Encrypted {
        /// The file.
        file: PathBuf,
        /// How the encryption was recognised.
        detail: String,
    },

    /// The file is shorter than its own metadata says.
    #[error("{} is truncated: row group {row_group}, column {column} ends at byte {end} but the file has {file_size} bytes", file.display())]
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
    #[error("invalid Parquet metadata in {}: {source}", file.display())]
    Metadata {
        /// The file.
        file: PathBuf,
        /// The parquet crate's error.
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// A requested column does not exist.
    #[error("{} has no column {column:?} (columns: {available})", file.display())]
    ColumnNotFound {
        /// The file.
        file: PathBuf,
        /// The name or index asked for.
        column: String,
        /// Comma-separated top-level column names, to help the caller.
        available: String,
    },

    /// A requested row group does not exist.
    #[error("{} has {num_row_groups} row groups; row group {row_group} was requested", file.display())]
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

    /// A page failed to decode: its bytes do not follow the Parquet format.
    #[error("corrupt page in {}: row group {row_group}, column {column}, page {page}: {}", file.display(), describe_corrupt(*kind, detail))]
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
        kind: CorruptKind,
        /// Details (sizes, counts, the decompressor's message); may be empty.
        detail: String,
    },

    /// A valid file uses a feature gpq does not decode (yet).
    #[error("unsupported in {}, column {column}: {what}", file.display())]
    Unsupported {
        /// The file.
        file: PathBuf,
        /// Column path.
        column: String,
        /// The feature.
        what: String,
    },

    /// A kernel failed to compile or load, or the emulator could not run it.
    #[error("kernel build failed ({stage}): {log}")]
    Kernel {
        /// `nvrtc`, `cache`, `load` or `emulator`.
        stage: &'static str,
        /// Compiler log or error text.
        log: String,
    },

    /// nvCOMP could not be used or reported an error outside any one page.
    #[error("nvCOMP: {0}")]
    Nvcomp(String),

    /// A worker thread of gpq (IO, CPU decompression) panicked.
    #[error("a gpq {what} thread panicked: {message}")]
    WorkerPanicked {
        /// Which kind of worker.
        what: &'static str,
        /// The panic's message, where it had one.
        message: String,
    },

    /// Objects of the CPU emulator and of a CUDA device were used together.
    #[error("{what}: objects of the CPU emulator and of a CUDA device cannot be mixed")]
    BackendMismatch {
        /// The operation.
        what: &'static str,
    },

    /// The CUDA context of a device was lost during a read (an illegal
    /// address, or a kernel that never finished). gpq discards the context
    /// (see [`crate::cuda::GpuContext::lose`]); the next read on the device
    /// gets a fresh one.
    #[error("GPU context of device {device} lost ({call}): {detail}; {}", if *recovered { "later reads get a fresh context" } else { "destroying the context failed too" })]
    GpuContextLost {
        /// Device ordinal.
        device: usize,
        /// The call or stage that found the context gone.
        call: &'static str,
        /// The driver's message or what timed out.
        detail: String,
        /// Whether the device's context was reset successfully.
        recovered: bool,
    },

    /// A read needed more device memory than its budget
    /// ([`crate::ReadOptions::device_memory_limit`]) allows.
    #[error("{}: {what} needs {requested} bytes of device memory, over the read's budget of {budget} bytes", file.display())]
    OverBudget {
        /// The file.
        file: PathBuf,
        /// What the memory was for.
        what: String,
        /// Bytes the read would hold at once.
        requested: u64,
        /// The budget.
        budget: u64,
    },

    /// A file of a multi-file read selects other columns or types than the first.
    #[error("{}: its schema {found} differs from {expected} of the first file", file.display())]
    SchemaMismatch {
        /// The file that differs.
        file: PathBuf,
        /// The first file's selected schema.
        expected: String,
        /// This file's.
        found: String,
    },

    /// Device columns cannot be handed to another library as asked: a type
    /// the Arrow C Device Data Interface or DLPack has no representation
    /// for, a column with nulls as a DLPack tensor, a stream batch whose
    /// device types differ from the stream's schema.
    #[error("cannot export: {0}")]
    Export(String),

    /// A predicate the device cannot evaluate as asked: a column type or a
    /// literal it has no comparison for, a nested column to gather, a
    /// program deeper than the kernel's stack. The caller filters on the
    /// host instead.
    #[error("cannot filter on the device: {0}")]
    Filter(String),

    /// A grouped aggregation the device cannot do as asked: a column type
    /// or an expression it has no arithmetic for, a grouping value wider
    /// than its part of the key, a value that overflows, more groups than
    /// its table holds. The caller aggregates on the host instead.
    #[error("cannot aggregate on the device: {0}")]
    Aggregate(String),

    /// An internal invariant did not hold: a bug in gpq, please report it.
    #[error("internal error in gpq: {0}")]
    Internal(String),

    /// Converting device columns to Arrow failed.
    #[error("Arrow conversion: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

/// CUDA driver errors after which the context cannot be used again: the
/// process must be restarted to use the device.
const CONTEXT_LOST: &[CUresult] = &[
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ASSERT,
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
    CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,
];

impl Error {
    /// A short machine-friendly name for the variant, used in statistics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NoCudaDevice { .. } => "no-cuda-device",
            Error::Cuda { .. } => "cuda",
            Error::OutOfDeviceMemory { .. } => "out-of-device-memory",
            Error::OutOfHostMemory { .. } => "out-of-host-memory",
            Error::CufileUnavailable { .. } => "cufile-unavailable",
            Error::Open { .. } => "open",
            Error::Io { .. } => "io",
            Error::NotParquet { .. } => "not-parquet",
            Error::Encrypted { .. } => "encrypted",
            Error::Truncated { .. } => "truncated",
            Error::Metadata { .. } => "metadata",
            Error::ColumnNotFound { .. } => "column-not-found",
            Error::RowGroupOutOfRange { .. } => "row-group-out-of-range",
            Error::InvalidOptions(_) => "invalid-options",
            Error::CorruptPage { .. } => "corrupt-page",
            Error::Unsupported { .. } => "unsupported",
            Error::Kernel { .. } => "kernel",
            Error::Nvcomp(_) => "nvcomp",
            Error::WorkerPanicked { .. } => "worker-panicked",
            Error::BackendMismatch { .. } => "backend-mismatch",
            Error::GpuContextLost { .. } => "gpu-context-lost",
            Error::OverBudget { .. } => "over-budget",
            Error::SchemaMismatch { .. } => "schema-mismatch",
            Error::Export(_) => "export",
            Error::Filter(_) => "filter",
            Error::Aggregate(_) => "aggregate",
            Error::Internal(_) => "internal",
            Error::Arrow(_) => "arrow",
        }
    }

    /// The failed driver entry point, for [`Error::Cuda`].
    pub fn cuda_call(&self) -> Option<&'static str> {
        match self {
            Error::Cuda { call, .. } => Some(call),
            _ => None,
        }
    }

    /// The CUDA driver's code, for [`Error::Cuda`].
    pub fn cuda_code(&self) -> Option<CUresult> {
        match self {
            Error::Cuda { source, .. } => Some(source.0),
            _ => None,
        }
    }

    /// Whether the CUDA context is unusable after this error (an illegal
    /// address, a failed launch and the like are sticky: every later call in
    /// the process fails too).
    pub fn is_context_lost(&self) -> bool {
        matches!(self, Error::GpuContextLost { .. }) || self.cuda_code().is_some_and(|c| CONTEXT_LOST.contains(&c))
    }

    /// Whether the input file is at fault (corrupt, truncated, not Parquet),
    /// as opposed to the machine, the options or gpq itself.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::NotParquet { .. }
                | Error::Truncated { .. }
                | Error::Metadata { .. }
                | Error::CorruptPage { .. }
        )
    }

    /// The error for a panicked worker, with the panic's message.
    pub(crate) fn worker_panicked(what: &'static str, payload: Box<dyn std::any::Any + Send>) -> Error {
        Error::WorkerPanicked { what, message: panic_message(payload.as_ref()).to_string() }
    }
}

/// The message of a caught panic's payload (`panic!` with a literal or a
/// formatted message), or `(no message)`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)")
}

fn describe_cuda(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(text) => format!("{name}: {}", text.to_string_lossy()),
        Err(_) => name,
    }
}

fn describe_corrupt(kind: CorruptKind, detail: &str) -> String {
    if detail.is_empty() { kind.description().to_string() } else { format!("{} ({detail})", kind.description()) }
}

/// What is wrong with a corrupt page.
///
/// Codes 1 to 99 are written by the kernels into their status words; the
/// kernel sources define the same names and numbers (`GpqStatus` in
/// `src/gpu/kernels/common.cuh`, checked against this enum by a test). Codes
/// from 100 up are found by the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum CorruptKind {
    /// A page header runs past the end of the column chunk.
    TruncatedHeader = 1,
    /// A page header's Thrift encoding is malformed.
    BadHeader = 2,
    /// A page body runs past the end of the column chunk.
    PageOutOfChunk = 3,
    /// A size or count in a page header is negative.
    NegativeCount = 4,
    /// A page header names an unknown page type.
    UnknownPageType = 5,
    /// The chunk's pages changed between the two header passes.
    PageCountChanged = 6,
    /// A value runs past the end of its page.
    TruncatedPage = 7,
    /// An RLE/bit-packed run header is malformed or runs past the end.
    BadRleRun = 8,
    /// A bit width above 32 (or above what the type allows: 64 for
    /// INT64 deltas).
    BitWidth = 9,
    /// A dictionary index beyond the dictionary.
    DictionaryIndex = 10,
    /// The page holds fewer values than its header claims.
    TooFewValues = 11,
    /// A write would fall outside the page's part of its column.
    OutputOverflow = 12,
    /// A page encoding the column's type cannot have.
    UnsupportedEncoding = 13,
    /// A dictionary-encoded page in a chunk without a dictionary page.
    NoDictionary = 14,
    /// A decimal byte array longer than the output type.
    DecimalTooWide = 15,
    /// A definition level above the column's maximum.
    LevelOutOfRange = 16,
    /// A compressed page fails the structural check made before
    /// decompression (and the CPU decoder rejects it too).
    MalformedCompressedData = 17,
    /// A DELTA_BINARY_PACKED header or block header is malformed: a block
    /// size that is not a multiple of 128, no miniblocks, miniblocks of a
    /// number of values that is not a multiple of 32, a first value or
    /// minimum delta out of the type's range, an over-long varint.
    BadDeltaHeader = 18,
    /// A DELTA_LENGTH_BYTE_ARRAY or DELTA_BYTE_ARRAY length is negative, a
    /// prefix is longer than the value before it, a fixed-length value has
    /// another length, or a page's length streams hold another number of
    /// values than the page.
    BadDeltaLength = 19,
    /// The page's stored bytes do not give the CRC-32 its header carries
    /// (checked only with [`ReadOptions::verify_page_checksums`](crate::ReadOptions::verify_page_checksums)).
    ChecksumMismatch = 20,
    /// The page's bytes do not decompress to the size its header says.
    Decompression = 101,
    /// Sizes in the header contradict each other or the stored bytes.
    SizeMismatch = 102,
    /// The pages hold another number of values than the chunk's metadata.
    ValueCountMismatch = 103,
    /// The pages hold another number of rows than the row group.
    RowCountMismatch = 104,
    /// A dictionary page that is not the chunk's first page, or a second one.
    DictionaryMisplaced = 105,
    /// A dictionary page in an encoding dictionaries cannot have.
    DictionaryEncoding = 106,
}

impl CorruptKind {
    /// Every kind, kernel codes first.
    pub const ALL: [CorruptKind; 26] = [
        CorruptKind::TruncatedHeader,
        CorruptKind::BadHeader,
        CorruptKind::PageOutOfChunk,
        CorruptKind::NegativeCount,
        CorruptKind::UnknownPageType,
        CorruptKind::PageCountChanged,
        CorruptKind::TruncatedPage,
        CorruptKind::BadRleRun,
        CorruptKind::BitWidth,
        CorruptKind::DictionaryIndex,
        CorruptKind::TooFewValues,
        CorruptKind::OutputOverflow,
        CorruptKind::UnsupportedEncoding,
        CorruptKind::NoDictionary,
        CorruptKind::DecimalTooWide,
        CorruptKind::LevelOutOfRange,
        CorruptKind::MalformedCompressedData,
        CorruptKind::BadDeltaHeader,
        CorruptKind::BadDeltaLength,
        CorruptKind::ChecksumMismatch,
        CorruptKind::Decompression,
        CorruptKind::SizeMismatch,
        CorruptKind::ValueCountMismatch,
        CorruptKind::RowCountMismatch,
        CorruptKind::DictionaryMisplaced,
        CorruptKind::DictionaryEncoding,
    ];

    /// The kind a kernel status word holds, if it names one.
    pub fn from_code(code: u32) -> Option<CorruptKind> {
        CorruptKind::ALL.into_iter().find(|k| *k as u32 == code)
    }

    /// The numeric code (for kernel kinds, the status word's value).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Whether kernels report this kind (as opposed to the host).
    pub fn is_kernel_status(self) -> bool {
        self.code() < 100
    }

    /// A sentence saying what is wrong.
    pub fn description(self) -> &'static str {
        match self {
            CorruptKind::TruncatedHeader => "page header runs past the end of the column chunk",
            CorruptKind::BadHeader => "malformed page header",
            CorruptKind::PageOutOfChunk => "page body runs past the end of the column chunk",
            CorruptKind::NegativeCount => "negative size or count in a page header",
            CorruptKind::UnknownPageType => "unknown page type",
            CorruptKind::PageCountChanged => "page count changed between passes",
            CorruptKind::TruncatedPage => "a value runs past the end of its page",
            CorruptKind::BadRleRun => "malformed RLE/bit-packed run",
            CorruptKind::BitWidth => "bit width over what the type allows",
            CorruptKind::DictionaryIndex => "dictionary index out of range",
            CorruptKind::TooFewValues => "page holds fewer values than its header claims",
            CorruptKind::OutputOverflow => "page writes past the end of its column",
            CorruptKind::UnsupportedEncoding => "encoding not valid for the column's type",
            CorruptKind::NoDictionary => "dictionary-encoded page without a dictionary page",
            CorruptKind::DecimalTooWide => "decimal byte array longer than the output type",
            CorruptKind::LevelOutOfRange => "definition level out of range",
            CorruptKind::MalformedCompressedData => "compressed page is malformed",
            CorruptKind::BadDeltaHeader => "malformed DELTA_BINARY_PACKED header",
            CorruptKind::BadDeltaLength => "malformed DELTA byte-array lengths",
            CorruptKind::ChecksumMismatch => "page checksum mismatch",
            CorruptKind::Decompression => "page does not decompress",
            CorruptKind::SizeMismatch => "page sizes contradict each other",
            CorruptKind::ValueCountMismatch => "pages hold another number of values than the column chunk",
            CorruptKind::RowCountMismatch => "pages hold another number of rows than the row group",
            CorruptKind::DictionaryMisplaced => "dictionary page is not the first page of its chunk",
            CorruptKind::DictionaryEncoding => "dictionary page in an encoding dictionaries cannot have",
        }
    }
}

impl std::fmt::Display for CorruptKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.description())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        for k in CorruptKind::ALL {
            assert_eq!(CorruptKind::from_code(k.code()), Some(k));
        }
        let mut codes: Vec<u32> = CorruptKind::ALL.iter().map(|k| k.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), CorruptKind::ALL.len());
        assert_eq!(CorruptKind::from_code(0), None);
        assert_eq!(CorruptKind::from_code(21), None);
    }

    #[test]
    fn context_loss_is_told_apart() {
        let lost = Error::Cuda { call: "cuStreamSynchronize", source: DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS) };
        assert!(lost.is_context_lost());
        assert_eq!(lost.cuda_code(), Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        let ordinary = Error::Cuda { call: "cuMemAlloc", source: DriverError(CUresult::CUDA_ERROR_INVALID_VALUE) };
        assert!(!ordinary.is_context_lost());
        assert!(!Error::InvalidOptions("x".into()).is_context_lost());
        assert_eq!(Error::InvalidOptions("x".into()).cuda_code(), None);
    }

    #[test]
    fn corrupt_page_message_names_everything() {
        let e = Error::CorruptPage {
            file: PathBuf::from("/data/x.parquet"),
            row_group: 3,
            column: "a.b".into(),
            page: 7,
            kind: CorruptKind::DictionaryIndex,
            detail: String::new(),
        };
        let s = e.to_string();
        for part in ["/data/x.parquet", "row group 3", "column a.b", "page 7", "dictionary index out of range"] {
            assert!(s.contains(part), "{s}");
        }
        assert!(e.is_bad_input());
    }
}
