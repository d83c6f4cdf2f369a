//! Who decompresses a batch of pages when the caller lets gpq choose
//! ([`DecompressMode::Auto`](crate::DecompressMode::Auto)): the device
//! (nvCOMP, or gpq's own SNAPPY decoder where the read asks for it) or the
//! CPU, by an estimate of each one's time.
//!
//! nvCOMP gives each page one warp, so a batch takes at least as long as its
//! largest page at one warp's pace (about 64 MB/s of output on the H200 for
//! SNAPPY: a 1 MiB page costs 16 ms however few pages there are), and for
//! many pages it runs at the device's throughput. The CPU decoders run one
//! page per thread, at a few hundred MB/s to a few GB/s a core, but pay the
//! copies of the compressed bytes to the host and of the output back. So a
//! batch of a few large pages (a small table, the first pages of a
//! `--limit`) is faster on the CPU, and a batch of thousands is faster on
//! the GPU. The CPU is chosen only where its estimate is well under nvCOMP's
//! and nvCOMP's is long enough to matter. Measured on the device machine:
//! SNAPPY's one-warp rate and the supplier batch (BENCHMARKS.md, sections
//! 8.1 and 8.2); the other codecs' rates are assumed, not yet measured.

use super::nvcomp::Codec;

/// What the estimate needs to know of a batch of one codec's pages.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BatchShape {
    /// Pages in the batch.
    pub pages: usize,
    /// Compressed bytes in.
    pub input_bytes: u64,
    /// Bytes out.
    pub output_bytes: u64,
    /// Output bytes of the largest page.
    pub largest_output: u64,
}

/// How fast a device decoder goes: one page's output per second (a batch
/// takes at least its largest page's time) and the whole device's over many
/// pages, bytes per second; and what a batch costs beyond its kernels, seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceRates {
    /// Output rate of one page.
    pub page: f64,
    /// Output rate over many pages.
    pub device: f64,
    /// Fixed cost of a batch.
    pub fixed: f64,
}

/// nvCOMP's rates: one warp a page; the fixed cost is the device check
/// before it, or the worker process's round trip for codecs decompressed there.
fn nvcomp_rates(codec: Codec, isolated: bool) -> DeviceRates {
    let page = match codec {
        Codec::Snappy | Codec::Lz4 => 64e6,
        Codec::Zstd | Codec::Gzip => 80e6,
    };
    DeviceRates { page, device: 100e9, fixed: if isolated { 3e-3 } else { 0.5e-3 } }
}

/// gpq's own SNAPPY decoder (`unsnappy.cu`, a block a page): its first
/// version's rates on the H100 over SF10 supplier's largest page and
/// lineitem's pages (BENCHMARKS.md 5.16); the current version is not yet timed.
pub(crate) const GPQ_SNAPPY: DeviceRates = DeviceRates { page: 25e6, device: 55e9, fixed: 0.1e-3 };

/// A CPU decoder's output rate on one core, bytes per second.
fn cpu_rate(codec: Codec) -> f64 {
    match codec {
        Codec::Snappy => 0.8e9,
        Codec::Lz4 => 1.5e9,
        Codec::Zstd => 0.7e9,
        Codec::Gzip => 0.25e9,
    }
}

/// Host-device copies of the CPU path (pageable memory), bytes per second.
const COPY_RATE: f64 = 5e9;

/// The CPU path's own start-up (threads, host buffers), seconds.
const CPU_FIXED: f64 = 0.3e-3;

/// Device kernels below this estimate are kept whatever the CPU's: too short to matter.
const WORTH_MOVING: f64 = 2e-3;

/// Estimated seconds of a device decoder's kernels over `batch`.
fn kernel_seconds(rates: DeviceRates, batch: &BatchShape) -> f64 {
    let latency = batch.largest_output as f64 / rates.page;
    let throughput = batch.output_bytes as f64 / rates.device;
    latency.max(throughput)
}

/// Estimated seconds for nvCOMP to decompress `batch`.
#[cfg(test)]
fn nvcomp_seconds(codec: Codec, isolated: bool, batch: &BatchShape) -> f64 {
    let rates = nvcomp_rates(codec, isolated);
    kernel_seconds(rates, batch) + rates.fixed
}

/// Estimated seconds for `threads` CPU threads to decompress `batch`,
/// copies included.
pub(crate) fn cpu_seconds(codec: Codec, threads: usize, batch: &BatchShape) -> f64 {
    let rate = cpu_rate(codec);
    let threads = threads.clamp(1, batch.pages.max(1)) as f64;
    let latency = batch.largest_output as f64 / rate;
    let throughput = batch.output_bytes as f64 / (rate * threads);
    let copies = (batch.input_bytes + batch.output_bytes) as f64 / COPY_RATE;
    latency.max(throughput) + copies + CPU_FIXED
}

/// Why `batch` should be decompressed on the CPU rather than by nvCOMP, if
/// it should: the CPU's estimate is under half of nvCOMP's, and nvCOMP's
/// kernels would run over 2 ms (so that small batches, whatever their fixed
/// costs, keep going through the device check or the worker).
pub(crate) fn prefer_cpu(codec: Codec, isolated: bool, threads: usize, batch: &BatchShape) -> Option<String> {
    prefer_cpu_over("nvCOMP", nvcomp_rates(codec, isolated), codec, threads, batch)
}

/// [`prefer_cpu`] against a device decoder of the given rates (`name` says which).
pub(crate) fn prefer_cpu_over(name: &str, rates: DeviceRates, codec: Codec, threads: usize, batch: &BatchShape) -> Option<String> {
    if batch.pages == 0 || kernel_seconds(rates, batch) <= WORTH_MOVING {
        return None;
    }
    let gpu = kernel_seconds(rates, batch) + rates.fixed;
    let cpu = cpu_seconds(codec, threads, batch);
    (cpu < gpu / 2.0).then(|| {
        format!(
            "{codec:?}: {} pages ({:.1} MiB out, the largest {:.0} KiB) are estimated faster on the CPU ({:.1} ms) than with {name} ({:.1} ms)",
            batch.pages,
            batch.output_bytes as f64 / (1 << 20) as f64,
            batch.largest_output as f64 / 1024.0,
            cpu * 1e3,
            gpu * 1e3
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(pages: usize, page: u64, ratio: u64) -> BatchShape {
        BatchShape { pages, input_bytes: pages as u64 * page / ratio, output_bytes: pages as u64 * page, largest_output: page }
    }

    #[test]
    fn few_large_pages_go_to_the_cpu_and_many_stay_on_the_gpu() {
        // A small table: 20 pages of 1 MiB (SF10 supplier: 60 pages, 15.5 MiB out, the largest 1 MiB).
        let small = shape(20, 1 << 20, 2);
        assert!(prefer_cpu(Codec::Snappy, false, 16, &small).is_some());
        // One pass of lineitem under a 1 GiB bound: thousands of such pages.
        let pass = shape(3000, 1 << 20, 2);
        assert!(prefer_cpu(Codec::Snappy, false, 16, &pass).is_none());
        // Small pages: nvCOMP is quick, whatever the CPU would do, also
        // where the worker's round trip is most of the time.
        let tiny = shape(8, 4 << 10, 2);
        assert!(prefer_cpu(Codec::Snappy, false, 16, &tiny).is_none());
        assert!(prefer_cpu(Codec::Zstd, true, 16, &shape(160, 132 << 10, 2)).is_none());
        // Two cores cannot keep up with many pages.
        assert!(prefer_cpu(Codec::Snappy, false, 2, &shape(400, 1 << 20, 2)).is_none());
        // GZIP is slow on the CPU: only a batch of one or two pages moves.
        assert!(prefer_cpu(Codec::Gzip, true, 16, &shape(1, 1 << 20, 3)).is_some());
        assert!(prefer_cpu(Codec::Gzip, true, 16, &shape(200, 1 << 20, 3)).is_none());
        assert!(prefer_cpu(Codec::Snappy, false, 16, &BatchShape::default()).is_none());
        // gpq's SNAPPY decoder (where the read asks for it): the same shapes.
        let gpq = |b: &BatchShape| prefer_cpu_over("gpq's SNAPPY decoder", GPQ_SNAPPY, Codec::Snappy, 16, b);
        assert!(gpq(&small).is_some_and(|why| why.contains("gpq's SNAPPY decoder")));
        assert!(gpq(&pass).is_none() && gpq(&tiny).is_none());
    }

    #[test]
    fn estimates_grow_with_the_largest_page_and_the_total() {
        let a = shape(10, 256 << 10, 2);
        let b = shape(10, 1 << 20, 2);
        assert!(nvcomp_seconds(Codec::Zstd, true, &b) > nvcomp_seconds(Codec::Zstd, true, &a));
        assert!(cpu_seconds(Codec::Zstd, 16, &b) > cpu_seconds(Codec::Zstd, 16, &a));
        assert!(nvcomp_seconds(Codec::Zstd, true, &a) > nvcomp_seconds(Codec::Zstd, false, &a));
    }
}
