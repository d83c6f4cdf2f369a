//! How a [`GpqTable`](super::GpqTable) scans: which backend decodes, the
//! device-read knobs, and whether the page index is used for pruning.

use std::fmt;
use std::str::FromStr;

use gpq::{Error, ReadOptions, Result};

/// Which decoder a scan uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The GPU when a CUDA device is present, otherwise the CPU; the choice is
    /// logged (tracing, `info`) and shown in `EXPLAIN`. Scans smaller than
    /// [`GpqTableOptions::gpu_min_scan_bytes`] decode on the CPU.
    #[default]
    Auto,
    /// Read and decode on the GPU through [`gpq::read_parquet_to_device`],
    /// then copy to the host. Without a device (and without the emulator
    /// routed in) planning a scan fails with gpq's "no CUDA device" error.
    Gpu,
    /// Decode with arrow-rs on the CPU.
    Cpu,
}

impl Backend {
    /// The name used in options, `EXPLAIN` and logs.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Gpu => "gpu",
            Backend::Cpu => "cpu",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Backend::Auto),
            "gpu" | "cuda" => Ok(Backend::Gpu),
            "cpu" => Ok(Backend::Cpu),
            other => Err(Error::InvalidOptions(format!(
                "unknown backend {other:?}; expected auto, gpu or cpu"
            ))),
        }
    }
}

/// Default compressed bytes of projected column chunks one device read covers.
pub const DEFAULT_GPU_READ_BYTES: u64 = 64 << 20;

/// Default of [`GpqTableOptions::gpu_min_passes`].
pub const DEFAULT_GPU_MIN_PASSES: u64 = 1;

/// Default of [`GpqTableOptions::gpu_min_scan_bytes`]: 128 MiB. Of the
/// thresholds tried on TPC-H SF10 at 16 partitions on an H100 (32, 64 and
/// 128 MiB; BENCHMARKS.md section 12.2) it made the small-table queries
/// fastest: q2, q11, q16 and q22 as fast as arrow-rs alone (their GPU scans
/// took 2x to 4x longer), q12 faster than either backend alone (its
/// lineitem scan on the GPU, orders on the CPU).
pub const DEFAULT_GPU_MIN_SCAN_BYTES: u64 = 128 << 20;

/// Options of a [`GpqTable`](super::GpqTable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpqTableOptions {
    /// Which decoder scans use.
    pub backend: Backend,
    /// IO path, IO threads, device ordinal and decompressor of device reads.
    /// Its `columns` and `row_groups` are ignored: each scan sets its own.
    pub read: ReadOptions,
    /// Prune pages with the page index where a file has one (default on).
    pub page_index: bool,
    /// GPU backend: the batch reader of a run of a partition's row groups
    /// reads passes of consecutive row groups up to this many projected
    /// compressed bytes (at least one row group per pass), the next pass
    /// read while the device decodes the current one.
    pub gpu_read_bytes: u64,
    /// GPU backend: passes a run of a partition's row groups is cut into at
    /// least, where that leaves passes of 8 MiB or more of projected
    /// compressed bytes, so that DataFusion works on one pass's batches
    /// while the device decodes the next. Default 1: passes of
    /// [`gpu_read_bytes`](Self::gpu_read_bytes) however few, since each pass
    /// has a fixed cost on the device (TPC-H SF10 at 16 partitions on an
    /// H200: 4 made q1 faster, 0.93 to 0.73 s, but q6 slower, 0.09 to
    /// 0.16 s), and each batch's copy to the host already overlaps
    /// DataFusion's work chunk by chunk.
    pub gpu_min_passes: u64,
    /// [`Backend::Auto`]: a scan whose row groups left after pruning hold
    /// fewer projected compressed bytes than this decodes on the CPU, as
    /// `EXPLAIN` says (`cpu (auto: ...)`). Each device read has a fixed cost
    /// (IO tasks, launches, synchronizations, the copy to the host), which a
    /// small table split over many partitions pays once per partition, while
    /// arrow-rs decodes it in a few milliseconds a partition. Default
    /// [`DEFAULT_GPU_MIN_SCAN_BYTES`]; 0: no scan is too small for the GPU.
    /// [`Backend::Gpu`] ignores it.
    pub gpu_min_scan_bytes: u64,
    /// GPU backend: a scan is cut into at most as many partitions as it holds
    /// this many projected compressed bytes (at least one), however many
    /// the session asks for, so that each device read is large enough to
    /// pay for its fixed cost; DataFusion spreads the batches over its
    /// partitions above the scan where that helps. 0 (the default): the
    /// session's `target_partitions`.
    pub gpu_min_partition_bytes: u64,
    /// GPU backend: decode on the CPU what the GPU cannot (nested columns,
    /// encodings the kernels lack), logged and counted in the
    /// `gpu_fallback_row_groups` metric; when false such a scan fails with
    /// gpq's `Unsupported` error instead (default on).
    ///
    /// A device read that loses the GPU context (see
    /// [`gpq::Error::is_context_lost`]) is always decoded on the CPU
    /// instead, whatever this says: the data is fine, the device is not. It
    /// is logged and counted in the `gpu_context_lost_fallbacks` metric.
    pub gpu_fallback: bool,
    /// GPU backend: evaluate the pushed-down filters the device can
    /// evaluate exactly on the device, after decoding, and copy only the
    /// rows they keep (default on). The table then reports those filters
    /// `Exact` and DataFusion plans no filter for them; a batch the device
    /// cannot filter is filtered on the host by the scan.
    pub device_filters: bool,
    /// GPU backend, with device filters: decode the filters' columns first
    /// and the other output columns only from each row group's first
    /// surviving row to its last (row groups without survivors not at
    /// all), copying only the kept rows. Off by default: every read column
    /// is then decoded in one read and filtered there. It pays where the
    /// survivors cluster (data sorted or grouped by a filter column); where
    /// they are spread over every row group, as in TPC-H, it decodes the
    /// same pages in two reads instead of one, and measured slower on 14
    /// of the 20 TPC-H queries timed at SF10 (BENCHMARKS.md section 12).
    pub late_materialization: bool,
    /// GPU backend: the devices a scan's partitions are spread over, round
    /// robin (partition `i` decodes on `devices[i % devices.len()]`); empty
    /// (the default): every partition on `read.device`.
    pub devices: Vec<usize>,
    /// Read top-level string and binary columns as `Utf8View`/`BinaryView`
    /// (built on the device by the GPU backend), whatever the files' embedded
    /// Arrow schema says. `None` (the default): as the session asks
    /// (DataFusion's `datafusion.execution.parquet.schema_force_view_types`,
    /// on by default) when registered with [`register_gpq`](crate::register_gpq);
    /// the files' own types for a table made with
    /// [`GpqTable::try_new`](crate::GpqTable::try_new).
    pub string_views: Option<bool>,
    /// For tests only, not a stable option: the first this many device passes
    /// of each executed scan fail as if the GPU context had been lost
    /// (`gpq::Error::GpuContextLost`), to exercise the CPU fallback without
    /// a failing device. 0 (the default) injects nothing.
    #[doc(hidden)]
    pub inject_gpu_context_loss: usize,
    /// For tests only, not a stable option: how many device passes of each
    /// executed scan succeed before the injected losses begin.
    #[doc(hidden)]
    pub inject_gpu_context_loss_after: usize,
}

impl Default for GpqTableOptions {
    fn default() -> Self {
        GpqTableOptions {
            backend: Backend::Auto,
            read: ReadOptions::default(),
            page_index: true,
            gpu_read_bytes: DEFAULT_GPU_READ_BYTES,
            gpu_min_passes: DEFAULT_GPU_MIN_PASSES,
            gpu_min_scan_bytes: DEFAULT_GPU_MIN_SCAN_BYTES,
            gpu_min_partition_bytes: 0,
            gpu_fallback: true,
            device_filters: true,
            late_materialization: false,
            devices: Vec::new(),
            string_views: None,
            inject_gpu_context_loss: 0,
            inject_gpu_context_loss_after: 0,
        }
    }
}

impl GpqTableOptions {
    /// Defaults: automatic backend, page index on, 64 MiB device passes,
    /// CPU fallback on, device filters on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Choose the backend.
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Set the device-read options (IO path, threads, device, decompressor).
    pub fn with_read_options(mut self, read: ReadOptions) -> Self {
        self.read = read;
        self
    }

    /// Use (or ignore) the page index for pruning.
    pub fn with_page_index(mut self, enabled: bool) -> Self {
        self.page_index = enabled;
        self
    }

    /// Sets the projected compressed bytes per pass of a device read.
    pub fn with_gpu_read_bytes(mut self, bytes: u64) -> Self {
        self.gpu_read_bytes = bytes.max(1);
        self
    }

    /// Sets the passes a partition's run of row groups is cut into at least
    /// (see [`GpqTableOptions::gpu_min_passes`]).
    pub fn with_gpu_min_passes(mut self, passes: u64) -> Self {
        self.gpu_min_passes = passes.max(1);
        self
    }

    /// Sets the projected compressed bytes under which a scan of
    /// [`Backend::Auto`] decodes on the CPU (see [`GpqTableOptions::gpu_min_scan_bytes`]).
    pub fn with_gpu_min_scan_bytes(mut self, bytes: u64) -> Self {
        self.gpu_min_scan_bytes = bytes;
        self
    }

    /// Sets the projected compressed bytes a GPU scan's partition holds at
    /// least (see [`GpqTableOptions::gpu_min_partition_bytes`]).
    pub fn with_gpu_min_partition_bytes(mut self, bytes: u64) -> Self {
        self.gpu_min_partition_bytes = bytes;
        self
    }

    /// Evaluate pushed-down filters on the device (see [`GpqTableOptions::device_filters`]).
    pub fn with_device_filters(mut self, enabled: bool) -> Self {
        self.device_filters = enabled;
        self
    }

    /// Decode non-filter columns only where rows survive the device filters
    /// (see [`GpqTableOptions::late_materialization`]).
    pub fn with_late_materialization(mut self, enabled: bool) -> Self {
        self.late_materialization = enabled;
        self
    }

    /// Spread the GPU backend's partitions over `devices` (see
    /// [`GpqTableOptions::devices`]).
    pub fn with_devices(mut self, devices: impl IntoIterator<Item = usize>) -> Self {
        self.devices = devices.into_iter().collect();
        self
    }

    /// Spread the GPU backend's partitions over every device the driver
    /// sees (none found: `read.device` only).
    pub fn with_all_devices(mut self) -> Self {
        self.devices = gpq::cuda::device_count().map(|n| (0..n).collect()).unwrap_or_default();
        self
    }

    /// Read strings and binary as view types, or not (see [`GpqTableOptions::string_views`]).
    pub fn with_string_views(mut self, views: bool) -> Self {
        self.string_views = Some(views);
        self
    }

    /// The device partition `partition` decodes on.
    pub(crate) fn device_of(&self, partition: usize) -> usize {
        if self.devices.is_empty() { self.read.device } else { self.devices[partition % self.devices.len()] }
    }

    /// Allow (or forbid) CPU decoding of what the GPU cannot decode.
    pub fn with_gpu_fallback(mut self, enabled: bool) -> Self {
        self.gpu_fallback = enabled;
        self
    }

    /// For tests only: make the first `reads` device passes of each executed
    /// scan fail as if the GPU context had been lost (see
    /// [`GpqTableOptions::inject_gpu_context_loss`]).
    #[doc(hidden)]
    pub fn with_injected_gpu_context_loss(mut self, reads: usize) -> Self {
        self.inject_gpu_context_loss = reads;
        self
    }

    /// For tests only: the injected losses begin after `passes` device
    /// passes of the scan succeeded (a loss in the middle of a run).
    #[doc(hidden)]
    pub fn with_injected_gpu_context_loss_after(mut self, passes: usize) -> Self {
        self.inject_gpu_context_loss_after = passes;
        self
    }
}
