//! Options that shape a read: which columns and row groups, and how bytes
//! travel from storage to the device.
//!
//! Options are plain values: the library never consults the environment for
//! them. `ReadOptions::from_env` (defined with every other variable in
//! [`crate::env`]) builds options from the `GPQ_*` variables for
//! applications that want that, as the CLI does.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// How column-chunk bytes move from the file into device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoPath {
    /// Probe once per process and take GDS where nvidia-fs is live,
    /// otherwise the fastest working path (the bounce path).
    Auto,
    /// cuFile with nvidia-fs: true GPUDirect Storage, DMA from NVMe into GPU memory.
    Gds,
    /// cuFile in its compatibility mode (no nvidia-fs): cuFile's own POSIX
    /// reads through its internal bounce buffers.
    CufileCompat,
    /// gpq's own path: worker threads `pread` into pinned staging buffers and
    /// copy them to the device asynchronously, double-buffered.
    Bounce,
}

impl IoPath {
    /// The name used in options, logs and statistics.
    pub fn name(self) -> &'static str {
        match self {
            IoPath::Auto => "auto",
            IoPath::Gds => "gds",
            IoPath::CufileCompat => "cufile-compat",
            IoPath::Bounce => "bounce",
        }
    }
}

impl fmt::Display for IoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IoPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(IoPath::Auto),
            "gds" => Ok(IoPath::Gds),
            "cufile-compat" | "cufile_compat" | "compat" => Ok(IoPath::CufileCompat),
            "bounce" | "posix" => Ok(IoPath::Bounce),
            other => Err(Error::InvalidOptions(format!(
                "unknown IO path {other:?}; expected auto, gds, cufile-compat or bounce"
            ))),
        }
    }
}

/// Selects one column to read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ColumnSelector {
    /// A top-level field by name, or a nested leaf by dotted path (`a.b.c`).
    Name(String),
    /// A top-level field by its position in the file's Arrow schema.
    Index(usize),
}

impl From<&str> for ColumnSelector {
    fn from(s: &str) -> Self {
        ColumnSelector::Name(s.to_string())
    }
}

impl From<String> for ColumnSelector {
    fn from(s: String) -> Self {
        ColumnSelector::Name(s)
    }
}

impl From<usize> for ColumnSelector {
    fn from(i: usize) -> Self {
        ColumnSelector::Index(i)
    }
}

impl fmt::Display for ColumnSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnSelector::Name(n) => f.write_str(n),
            ColumnSelector::Index(i) => write!(f, "#{i}"),
        }
    }
}

/// Default alignment of IO ranges: O_DIRECT and cuFile want 4 KiB.
pub const IO_ALIGNMENT: u64 = 4096;
/// Default largest piece one IO task reads.
pub const DEFAULT_TASK_SIZE: u64 = 4 << 20;
/// Default largest gap between two chunks that is read through rather than split.
pub const DEFAULT_MERGE_GAP: u64 = 64 << 10;

/// Knobs of the IO layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoOptions {
    /// Which path to use; [`IoPath::Auto`] probes once per process (see [`crate::io`]).
    pub path: IoPath,
    /// Worker threads; `None`: the number of cores, at most 16.
    pub threads: Option<usize>,
    /// Largest read one task issues, rounded up to 4 KiB (default 4 MiB).
    pub task_size: u64,
    /// Chunks whose gap is at most this many bytes are read as one range.
    pub merge_gap: u64,
    /// Open the file with `O_DIRECT` on the bounce path (bypasses the page cache).
    pub direct: bool,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions { path: IoPath::Auto, threads: None, task_size: DEFAULT_TASK_SIZE, merge_gap: DEFAULT_MERGE_GAP, direct: false }
    }
}

impl IoOptions {
    /// Worker threads after applying the default, checked to be 1..=256.
    pub fn resolved_threads(&self) -> Result<usize> {
        let n = self.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4).min(16));
        if n == 0 || n > 256 {
            return Err(Error::InvalidOptions(format!("IO threads must be 1..=256, got {n}")));
        }
        Ok(n)
    }

    /// The task size, checked and rounded up to the alignment.
    pub fn resolved_task_size(&self) -> Result<u64> {
        let t = self.task_size;
        if !(IO_ALIGNMENT..=(1 << 30)).contains(&t) {
            return Err(Error::InvalidOptions(format!("IO task size must be between 4 KiB and 1 GiB, got {t}")));
        }
        Ok(t.div_ceil(IO_ALIGNMENT) * IO_ALIGNMENT)
    }
}

/// Parses `123`, `64k`, `8M`, `1G` (binary units) into bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let mult = match s[i..].trim().to_ascii_lowercase().as_str() {
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "b" => 1,
                _ => return None,
            };
            (&s[..i], mult)
        }
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Which decompressor to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecompressMode {
    /// nvCOMP where it is available and handles the codec, else the CPU;
    /// and the CPU for a batch of a few large pages, which nvCOMP (one warp
    /// a page) would take longer over than the CPU's threads and copies
    /// (a small table, the first pages of a row limit). The statistics'
    /// `fallback` says which batches went to the CPU and why.
    #[default]
    Auto,
    /// The device only: nvCOMP, or gpq's own ZSTD decoder; a codec or
    /// machine neither can serve is an error.
    Nvcomp,
    /// The CPU only.
    Cpu,
}

/// Who decompresses pages of a codec gpq has a device decoder of its own for
/// ([`ReadOptions::zstd_decoder`], [`ReadOptions::snappy_decoder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceDecoder {
    /// gpq's own decoder: it checks every step of the format as it decodes,
    /// so no input can make it read or write out of bounds or run on; a page
    /// it does not accept goes to the CPU decoder, whose verdict stands.
    #[default]
    Gpq,
    /// nvCOMP, which trusts its input: SNAPPY pages behind the device's
    /// structural check; ZSTD pages in the worker process while page checks
    /// are on, in this process when
    /// [`ReadOptions::skip_compressed_page_checks`] is set.
    Nvcomp,
}

/// The name [`DeviceDecoder`] had when only ZSTD had a decoder of gpq's own.
pub type ZstdDecoder = DeviceDecoder;

impl std::str::FromStr for DeviceDecoder {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gpq" | "" => Ok(DeviceDecoder::Gpq),
            "nvcomp" => Ok(DeviceDecoder::Nvcomp),
            o => Err(Error::InvalidOptions(format!("unknown device decoder {o:?}; expected gpq or nvcomp"))),
        }
    }
}

impl std::str::FromStr for DecompressMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(DecompressMode::Auto),
            "nvcomp" | "gpu" => Ok(DecompressMode::Nvcomp),
            "cpu" => Ok(DecompressMode::Cpu),
            o => Err(Error::InvalidOptions(format!("unknown decompression mode {o:?}; expected auto, nvcomp or cpu"))),
        }
    }
}

/// Everything a read can be told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Columns to read, in the order wanted; `None` reads all.
    pub columns: Option<Vec<ColumnSelector>>,
    /// Row groups to read, in file order after sorting; `None` reads all.
    pub row_groups: Option<Vec<usize>>,
    /// IO knobs.
    pub io: IoOptions,
    /// CUDA device ordinal.
    pub device: usize,
    /// Which decompressor to use.
    pub decompress: DecompressMode,
    /// Most bytes of device memory the read may hold at once (its input
    /// chunks, decompressed pages and output columns); a read that would
    /// need more fails with [`Error::OverBudget`] before allocating.
    /// `None`: bounded only by the device (and by what the file's footer
    /// can justify, which every read checks).
    pub device_memory_limit: Option<u64>,
    /// Trust the compressed pages: hand LZ4_RAW pages (and SNAPPY pages
    /// where [`snappy_decoder`](Self::snappy_decoder) is nvCOMP) to nvCOMP
    /// without the device's structural check, and decompress GZIP pages
    /// (which gpq cannot check on the device) with nvCOMP in this process
    /// instead of in the isolated worker process (or on the CPU where there
    /// is no worker); ZSTD pages likewise where
    /// [`zstd_decoder`](Self::zstd_decoder) is nvCOMP. Only for input you
    /// trust: on corrupt data nvCOMP reads out of bounds (the CUDA context is
    /// lost for the rest of the process) or never finishes. Default `false`.
    pub skip_compressed_page_checks: bool,
    /// Who decompresses ZSTD pages on the device: gpq's own checked decoder
    /// (the default) or nvCOMP.
    pub zstd_decoder: DeviceDecoder,
    /// Who decompresses SNAPPY pages on the device. `None` (the default)
    /// lets gpq choose: today nvCOMP behind the device's structural check,
    /// and the CPU where nvCOMP is not there. `Some(DeviceDecoder::Gpq)`:
    /// gpq's own checked decoder (a block a page; the CPU still takes a
    /// batch estimated faster there, unless the device is forced with
    /// [`DecompressMode::Nvcomp`]). It is not the default: its first
    /// version took 78 ms of kernel time over SF10 lineitem on an H100,
    /// against 25 ms for nvCOMP and the check (BENCHMARKS.md 5.16).
    pub snappy_decoder: Option<DeviceDecoder>,
    /// Verify the CRC-32 that writers may put in page headers, on the
    /// device, before decompression; a page that disagrees fails the read
    /// with [`CorruptKind::ChecksumMismatch`](crate::CorruptKind::ChecksumMismatch).
    /// Pages without a checksum are read as they are. Default `false`, as in
    /// arrow-rs (most writers write no checksums).
    pub verify_page_checksums: bool,
    /// How many groups of row groups a read is split into so that its stages
    /// overlap: the GPU parses, decompresses and decodes one group's pages
    /// while the next group's chunks are still being read (the strings'
    /// characters, which need every group's sizes, come last). `None` (the default) chooses: about one
    /// group per [`OVERLAP_GROUP_BYTES`] of chunks, at most
    /// [`OVERLAP_MAX_GROUPS`], none for a read of less than two groups' bytes.
    /// `Some(1)` reads in one group. Reads cut to a row window always read in
    /// one group. A read whose pages go to the nvCOMP worker process (GZIP, or
    /// ZSTD with [`DeviceDecoder::Nvcomp`], with page checks on) chooses at most [`OVERLAP_MAX_WORKER_GROUPS`]:
    /// the worker's context and this one share the GPU by time slices, and
    /// more groups measured slower (BENCHMARKS.md section 5.8).
    pub overlap_groups: Option<usize>,
    /// Read top-level string and binary columns as Arrow's view types
    /// (`Utf8View`, `BinaryView`), built on the device, whatever type the
    /// file's embedded Arrow schema gives them (what DataFusion's
    /// `schema_force_view_types` asks of its Parquet reader). Default `false`:
    /// the file's types (views only where its embedded schema says so).
    pub string_views: bool,
}

/// The bytes of column chunks per group an overlapped read aims at when it
/// chooses its groups ([`ReadOptions::overlap_groups`]).
pub const OVERLAP_GROUP_BYTES: u64 = 128 << 20;

/// The most groups an overlapped read chooses on its own.
pub const OVERLAP_MAX_GROUPS: usize = 8;
/// The most groups [`ReadOptions::overlap_groups`] chooses for a read that
/// sends pages to the nvCOMP worker process.
pub const OVERLAP_MAX_WORKER_GROUPS: usize = 2;

impl ReadOptions {
    /// The groups a read of `chunk_bytes` is split into (see
    /// [`ReadOptions::overlap_groups`]; at least 1).
    pub fn resolved_overlap_groups(&self, chunk_bytes: u64) -> usize {
        match self.overlap_groups {
            Some(n) => n.max(1),
            None => usize::try_from(chunk_bytes / OVERLAP_GROUP_BYTES).unwrap_or(usize::MAX).clamp(1, OVERLAP_MAX_GROUPS),
        }
    }
}

impl ReadOptions {
    /// Default options: every column and row group, automatic IO path, device 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Read only these columns (names, dotted paths or indices).
    pub fn with_columns<I, C>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = C>,
        C: Into<ColumnSelector>,
    {
        self.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Read only these row groups.
    pub fn with_row_groups(mut self, row_groups: impl IntoIterator<Item = usize>) -> Self {
        self.row_groups = Some(row_groups.into_iter().collect());
        self
    }

    /// Force an IO path.
    pub fn with_io_path(mut self, path: IoPath) -> Self {
        self.io.path = path;
        self
    }

    /// Set the number of IO worker threads.
    pub fn with_io_threads(mut self, threads: usize) -> Self {
        self.io.threads = Some(threads);
        self
    }

    /// Set the IO task size in bytes.
    pub fn with_task_size(mut self, bytes: u64) -> Self {
        self.io.task_size = bytes;
        self
    }

    /// Open files with `O_DIRECT` on the bounce path.
    pub fn with_direct_io(mut self, direct: bool) -> Self {
        self.io.direct = direct;
        self
    }

    /// Set the merge gap in bytes.
    pub fn with_merge_gap(mut self, bytes: u64) -> Self {
        self.io.merge_gap = bytes;
        self
    }

    /// Choose the decompressor.
    pub fn with_decompress(mut self, mode: DecompressMode) -> Self {
        self.decompress = mode;
        self
    }

    /// Choose who decompresses ZSTD pages on the device.
    pub fn with_zstd_decoder(mut self, decoder: DeviceDecoder) -> Self {
        self.zstd_decoder = decoder;
        self
    }

    /// Choose who decompresses SNAPPY pages on the device.
    pub fn with_snappy_decoder(mut self, decoder: DeviceDecoder) -> Self {
        self.snappy_decoder = Some(decoder);
        self
    }

    /// Cap the device memory the read may hold at once.
    pub fn with_device_memory_limit(mut self, bytes: u64) -> Self {
        self.device_memory_limit = Some(bytes);
        self
    }

    /// Verify page checksums where the file has them.
    pub fn with_page_checksums(mut self, verify: bool) -> Self {
        self.verify_page_checksums = verify;
        self
    }

    /// Read top-level strings and binary as view types (see [`ReadOptions::string_views`]).
    pub fn with_string_views(mut self, views: bool) -> Self {
        self.string_views = views;
        self
    }

    /// Use the CUDA device with this ordinal.
    pub fn with_device(mut self, ordinal: usize) -> Self {
        self.device = ordinal;
        self
    }

    /// Split the read into this many groups of row groups whose IO and
    /// GPU stages overlap (see [`ReadOptions::overlap_groups`]; 1 turns it off).
    pub fn with_overlap_groups(mut self, groups: usize) -> Self {
        self.overlap_groups = Some(groups);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("12q"), None);
    }

    #[test]
    fn overlap_groups_follow_the_bytes() {
        let o = ReadOptions::new();
        assert_eq!(o.resolved_overlap_groups(0), 1);
        assert_eq!(o.resolved_overlap_groups(OVERLAP_GROUP_BYTES * 2 - 1), 1);
        assert_eq!(o.resolved_overlap_groups(OVERLAP_GROUP_BYTES * 3), 3);
        assert_eq!(o.resolved_overlap_groups(u64::MAX), OVERLAP_MAX_GROUPS);
        assert_eq!(o.clone().with_overlap_groups(0).resolved_overlap_groups(u64::MAX), 1);
        assert_eq!(o.with_overlap_groups(20).resolved_overlap_groups(0), 20);
    }

    #[test]
    fn parses_io_paths() {
        assert_eq!("bounce".parse::<IoPath>().unwrap(), IoPath::Bounce);
        assert_eq!("cufile-compat".parse::<IoPath>().unwrap(), IoPath::CufileCompat);
        assert_eq!("GDS".parse::<IoPath>().unwrap(), IoPath::Gds);
        assert!("nvme".parse::<IoPath>().is_err());
    }

    #[test]
    fn rejects_bad_knobs() {
        let o = IoOptions { threads: Some(0), ..Default::default() };
        assert!(o.resolved_threads().is_err());
        let o = IoOptions { task_size: 100, ..Default::default() };
        assert!(o.resolved_task_size().is_err());
        let o = IoOptions { task_size: 5000, ..Default::default() };
        assert_eq!(o.resolved_task_size().unwrap(), 8192);
    }
}
