//! What a read did: which paths ran, how many bytes moved and where the time
//! went. Each stage fills in its part ([`IoStats`] from [`crate::io`],
//! [`DecompressStats`] from [`crate::decode`]); [`crate::reader`] puts them
//! together in [`ReadStats`].

use std::time::Duration;

use crate::options::IoPath;

/// What one read through the IO layer did.
#[derive(Debug, Clone, PartialEq)]
pub struct IoStats {
    /// The path that ran (never [`IoPath::Auto`]).
    pub path: IoPath,
    /// Bytes the plan asked for (column-chunk bytes).
    pub bytes_requested: u64,
    /// Bytes the workers read from the file (counted as the reads return),
    /// alignment and merge over-read included.
    pub bytes_read: u64,
    /// Wall time from the first read issued to the last byte on the device.
    pub wall: Duration,
    /// Worker threads used.
    pub threads: usize,
    /// Tasks executed.
    pub tasks: usize,
    /// Whether the file was opened with O_DIRECT.
    pub direct: bool,
    /// Why the path was chosen, including any fallback from a preferred path.
    pub reason: String,
}

impl IoStats {
    /// Bytes read per second of wall time.
    pub fn throughput(&self) -> f64 {
        self.bytes_read as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// What decompression did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecompressStats {
    /// Pages decompressed on the device: by nvCOMP, or by gpq's own ZSTD
    /// and SNAPPY decoders (`device_zstd_pages` and `device_snappy_pages` of them).
    pub gpu_pages: usize,
    /// Pages decompressed on the CPU.
    pub cpu_pages: usize,
    /// Compressed bytes in.
    pub compressed_bytes: u64,
    /// Bytes out.
    pub decompressed_bytes: u64,
    /// nvCOMP version used, if any.
    pub nvcomp_version: Option<String>,
    /// Why pages went to the CPU, if any did.
    pub fallback: Option<String>,
    /// Pages the device's structural check kept from nvCOMP (they went to
    /// the CPU decoder instead).
    pub check_rejected: usize,
    /// Of `gpu_pages`, those nvCOMP decompressed in the worker process
    /// (pages no device check vouches for: GZIP, and ZSTD where
    /// `GPQ_ZSTD_DECODER=nvcomp`).
    pub isolated_pages: usize,
    /// Of `gpu_pages`, the ZSTD pages gpq's own checked decoder took (those
    /// it refused went to the CPU and count in `cpu_pages` and `check_rejected`).
    pub device_zstd_pages: usize,
    /// Of `gpu_pages`, the SNAPPY pages gpq's own checked decoder took
    /// (those it refused went to the CPU likewise).
    pub device_snappy_pages: usize,
}

impl DecompressStats {
    /// Who decompressed: `none`, or `nvcomp`, `gpq` (gpq's ZSTD and SNAPPY decoders),
    /// `nvcomp+gpq` and `cpu` joined by `+` for those that took pages
    /// (e.g. `gpq+cpu`: pages the decoder refused went to the CPU).
    pub fn path(&self) -> &'static str {
        let own = self.device_zstd_pages + self.device_snappy_pages;
        let nvcomp = self.gpu_pages > own;
        let gpq = own > 0;
        match (nvcomp, gpq, self.cpu_pages > 0) {
            (false, false, false) => "none",
            (true, false, false) => "nvcomp",
            (false, true, false) => "gpq",
            (true, true, false) => "nvcomp+gpq",
            (false, false, true) => "cpu",
            (true, false, true) => "nvcomp+cpu",
            (false, true, true) => "gpq+cpu",
            (true, true, true) => "nvcomp+gpq+cpu",
        }
    }
}

/// One-time device set-up a read paid for: both times are zero once the
/// device's context exists and gpq's kernels are loaded into it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SetupStats {
    /// Creating the device's context (the first read on a device).
    pub context: Duration,
    /// Loading gpq's kernels into the context (the first read on a context).
    pub kernels: Duration,
    /// Where the kernels came from: `prebuilt sm_90 cubin`, or the fallbacks
    /// `NVRTC sm_75` and `prebuilt compute_80 PTX, compiled by the driver`.
    pub kernel_source: String,
}

/// Statistics of one read: where the bytes came from and where time went.
#[derive(Debug, Clone, Default)]
pub struct ReadStats {
    /// One-time device set-up (context, kernels) this read paid for; counted in `total`.
    pub setup: SetupStats,
    /// The IO layer's report (path, bytes, wall time).
    pub io: Option<IoStats>,
    /// Footer and planning.
    pub plan: Duration,
    /// Page headers on the device.
    pub page_headers: Duration,
    /// Decompression.
    pub decompress: Duration,
    /// Value decoding (levels, dictionaries, values, strings).
    pub decode: Duration,
    /// Whole read, planning to last kernel.
    pub total: Duration,
    /// Decompression report.
    pub decompression: DecompressStats,
    /// Pages decoded (data and dictionary).
    pub pages: usize,
    /// Bytes of the decoded device columns.
    pub decoded_bytes: u64,
    /// Pages whose CRC-32 was verified on the device
    /// ([`ReadOptions::verify_page_checksums`](crate::ReadOptions::verify_page_checksums); 0 when off).
    pub checksummed_pages: usize,
    /// How the stages overlapped, if the read was split into groups
    /// ([`ReadOptions::overlap_groups`](crate::ReadOptions::overlap_groups)).
    /// Then `page_headers`, `decompress` and `decode` add up the groups'
    /// times (and `decode` the last pass's), which ran beside the IO and
    /// beside each other: only `total` is wall time.
    pub overlap: Option<OverlapStats>,
    /// The device filter applied to this table, if any
    /// ([`DeviceTable::filter`](crate::DeviceTable::filter)).
    pub filter: Option<FilterStats>,
}

/// What a device filter did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilterStats {
    /// Rows evaluated.
    pub rows_in: usize,
    /// Rows kept.
    pub rows_out: usize,
    /// Wall time: evaluation and gathers, to the last kernel's end.
    pub time: Duration,
}

/// How an overlapped read's stages overlapped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverlapStats {
    /// Groups of row groups read.
    pub groups: usize,
    /// Wall time from the end of the IO to the end of the last group's page
    /// headers, decompression and values (before the last pass, the
    /// strings' characters): the part of the groups' work the IO did not hide.
    pub after_io: Duration,
}

impl ReadStats {
    /// One line per stage, for logs and the CLI.
    pub fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let io = self.io.as_ref();
        let checksums =
            if self.checksummed_pages > 0 { format!(", {} page checksums verified", self.checksummed_pages) } else { String::new() };
        let d = &self.decompression;
        let mut by: Vec<String> = Vec::new();
        if d.isolated_pages > 0 {
            by.push(format!("{} in the nvCOMP worker", d.isolated_pages));
        }
        if d.device_zstd_pages > 0 {
            by.push(format!("{} by gpq's ZSTD decoder", d.device_zstd_pages));
        }
        if d.device_snappy_pages > 0 {
            by.push(format!("{} by gpq's SNAPPY decoder", d.device_snappy_pages));
        }
        let isolated = if by.is_empty() { String::new() } else { format!(", {} of them", by.join(", ")) };
        let setup = if self.setup.context.is_zero() && self.setup.kernels.is_zero() {
            String::new()
        } else {
            format!(
                "device set-up: context {:.1} ms, kernels {:.1} ms ({}); ",
                ms(self.setup.context),
                ms(self.setup.kernels),
                self.setup.kernel_source
            )
        };
        let overlap = match &self.overlap {
            Some(o) => format!(", in {} overlapped groups (their work {:.1} ms past the IO)", o.groups, ms(o.after_io)),
            None => String::new(),
        };
        format!(
            "{setup}io path {} ({:.2} GB read, {:.1} ms), decompression {} ({} GPU{isolated} / {} CPU pages), plan {:.1} ms, page headers {:.1} ms, decompress {:.1} ms, decode {:.1} ms, total {:.1} ms{checksums}{overlap}",
            io.map(|s| s.path.name()).unwrap_or("-"),
            io.map(|s| s.bytes_read as f64 / 1e9).unwrap_or(0.0),
            io.map(|s| ms(s.wall)).unwrap_or(0.0),
            self.decompression.path(),
            self.decompression.gpu_pages,
            self.decompression.cpu_pages,
            ms(self.plan),
            ms(self.page_headers),
            ms(self.decompress),
            ms(self.decode),
            ms(self.total),
        )
    }
}
