//! Every environment variable the library reads, in one place.
//!
//! Per-read settings are read only when asked for, by
//! [`ReadOptions::from_env`](crate::ReadOptions::from_env). The process-wide
//! settings below have documented defaults and are read when the resource
//! they configure is first used:
//!
//! | variable | what | default |
//! | --- | --- | --- |
//! | `GPQ_IO`, `GPQ_IO_THREADS`, `GPQ_IO_TASK_SIZE`, `GPQ_IO_DIRECT`, `GPQ_DECOMPRESS`, `GPQ_DEVICE` | per-read options, only through `ReadOptions::from_env` | see [`IoOptions`](crate::IoOptions) |
//! | `GPQ_DEVICE_MEMORY_LIMIT` (bytes, `k`/`M`/`G` suffixes), `GPQ_SKIP_PAGE_CHECKS=1` | [`ReadOptions::device_memory_limit`](crate::ReadOptions::device_memory_limit), [`ReadOptions::skip_compressed_page_checks`](crate::ReadOptions::skip_compressed_page_checks) (for measuring only) | none, off |
//! | `GPQ_VERIFY_PAGE_CHECKSUMS=1` | [`ReadOptions::verify_page_checksums`](crate::ReadOptions::verify_page_checksums) | off |
//! | `GPQ_ZSTD_DECODER`, `GPQ_SNAPPY_DECODER` (`gpq`, `nvcomp`) | [`ReadOptions::zstd_decoder`](crate::ReadOptions::zstd_decoder), [`ReadOptions::snappy_decoder`](crate::ReadOptions::snappy_decoder) | ZSTD: `gpq`; SNAPPY: nvCOMP behind the device check |
//! | `GPQ_KERNELS` | where the kernels come from: `auto` (the prebuilt cubin of the device's architecture, else NVRTC, else the prebuilt PTX), `jit` (always NVRTC, for kernel development), `ptx` (always the prebuilt PTX, for testing that path) or `file:PATH` (the cubin or PTX in that file, `.zst`-compressed or not: another version of the kernels, for comparing two in one run) | `auto` |
//! | `GPQ_KERNEL_CACHE` | directory of kernels compiled by NVRTC | `$XDG_CACHE_HOME/gpq/kernels`, else `$HOME/.cache/gpq/kernels`, else no cache |
//! | `GPQ_NVCOMP_LIB` | absolute path of `libnvcomp.so.6` | the loader path, then known install locations (see [`crate::decode`]) |
//! | `GPQ_CUFILE_LIB` | absolute path of `libcufile.so.0` | the loader path, then `/usr/local/cuda/lib64` |
//! | `GPQ_PINNED_HOST_BYTES` | most bytes of page-locked host slabs per device (`0`: none) | a quarter of host memory, at most 16 GiB |
//! | `GPQ_NVCOMP_DEADLINE_S` | seconds nvCOMP may run before its kernels count as hung (plus 1 s per GB of output) | 1 |
//! | `GPQ_NVCOMP_WORKER` | path of the `gpq-nvcomp-worker` executable that runs nvCOMP on unchecked (ZSTD, GZIP) pages in a process of its own; `off` turns it off | beside the running executable or in its parent folder |
//! | `GPQ_NVCOMP_WORKER_DEADLINE_MS` | milliseconds the worker may take for a batch (plus 1 s per GB of output) | 250, or `GPQ_NVCOMP_DEADLINE_S` where that is set |
//! | `GPQ_UNZSTD_PROFILE=1` | gpq's ZSTD decoder sums its warps' clock cycles per phase and logs them at `info`, with each of its kernels' time (a measuring aid) | off |
//! | `GPQ_UNZSTD_LIST_BYTES` (bytes, `k`/`M`/`G` suffixes) | most device memory for the sequence lists of gpq's ZSTD decoder; a batch whose lists need more is decoded in rounds | 1G |
//! | `GPQ_UNZSTD_LIST_BLOCKS` | blocks an SM for the ZSTD decoder's sequence kernel (16 threads and 45 KB of shared memory each) | 5 |
//! | `GPQ_UNZSTD_APART=0` | the ZSTD decoder's sequence kernel decodes every page as one chain, instead of each compressed block on a thread of its own (a measuring aid) | apart |
//! | `GPQ_EMULATE=1` | route every device to the CPU emulator (builds with the `emulator` feature) | off |
//! | `GPQ_EMU_ORDER` (`forward`, `reverse`, `alternating`; another value is reported on stderr) | the order the CPU emulator runs a block's threads in between barriers (read by the emulator itself, `src/gpu/emu/emu.cpp`) | alternating: index order in one block, reverse in the next, so a kernel that depends on an order CUDA does not promise fails a test |
//! | `GPQ_CUDA_WAIT` | how threads wait for the GPU in the contexts gpq uses: `auto` (the driver's heuristic: spin while the process has fewer contexts than cores), `spin`, `yield` or `blocking` (sleep until the driver wakes them); set on the device's primary context whenever gpq takes it, also where another library made it first | unset: the primary context's flags are left as they are (the driver's `auto` unless the application chose) |
//! | `GPQ_FOOTER_CACHE=0` | decode every file's footer on every read, instead of keeping decoded footers for the next read of a file whose footer bytes are unchanged (see [`crate::clear_footer_cache`]) | on |
//!
//! gpq also looks at whether `CUFILE_ENV_PATH_JSON` (cuFile's own
//! configuration file) is set: then it leaves cuFile's settings alone. The
//! library never sets an environment variable.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::options::{ReadOptions, parse_size};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn invalid(name: &str, value: &str, expected: &str) -> Error {
    Error::InvalidOptions(format!("{name}={value:?}: expected {expected}"))
}

fn flag(name: &str) -> Result<Option<bool>> {
    match var(name) {
        None => Ok(None),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(invalid(name, &v, "1 or 0")),
        },
    }
}

fn size(name: &str) -> Result<Option<u64>> {
    var(name).map(|v| parse_size(&v).ok_or_else(|| invalid(name, &v, "a size such as 4096, 64k or 8M"))).transpose()
}

impl ReadOptions {
    /// The defaults with every knob set in the environment applied:
    /// `GPQ_IO` (auto, gds, cufile-compat, bounce), `GPQ_IO_THREADS`,
    /// `GPQ_IO_TASK_SIZE` (e.g. `4M`), `GPQ_IO_DIRECT=1`, `GPQ_DECOMPRESS`
    /// (auto, nvcomp, cpu) and `GPQ_DEVICE` (ordinal). A variable that does
    /// not parse is an error, never silently ignored.
    pub fn from_env() -> Result<ReadOptions> {
        read_options()
    }
}

/// [`ReadOptions::default`] with the per-read variables applied.
fn read_options() -> Result<ReadOptions> {
    let mut o = ReadOptions::default();
    if let Some(v) = var("GPQ_IO") {
        o.io.path = v.parse()?;
    }
    if let Some(n) = size("GPQ_IO_THREADS")? {
        o.io.threads = Some(usize::try_from(n).map_err(|_| invalid("GPQ_IO_THREADS", &n.to_string(), "a thread count"))?);
    }
    if let Some(t) = size("GPQ_IO_TASK_SIZE")? {
        o.io.task_size = t;
    }
    if let Some(d) = flag("GPQ_IO_DIRECT")? {
        o.io.direct = d;
    }
    if let Some(v) = var("GPQ_DECOMPRESS") {
        o.decompress = v.parse()?;
    }
    if let Some(v) = var("GPQ_DEVICE") {
        o.device = v.trim().parse().map_err(|_| invalid("GPQ_DEVICE", &v, "a device ordinal"))?;
    }
    if let Some(b) = size("GPQ_DEVICE_MEMORY_LIMIT")? {
        o.device_memory_limit = Some(b);
    }
    if let Some(d) = flag("GPQ_SKIP_PAGE_CHECKS")? {
        o.skip_compressed_page_checks = d;
    }
    if let Some(d) = flag("GPQ_VERIFY_PAGE_CHECKSUMS")? {
        o.verify_page_checksums = d;
    }
    if let Some(v) = var("GPQ_ZSTD_DECODER") {
        o.zstd_decoder = v.parse()?;
    }
    if let Some(v) = var("GPQ_SNAPPY_DECODER") {
        o.snappy_decoder = Some(v.parse()?);
    }
    Ok(o)
}

/// `GPQ_NVCOMP_DEADLINE_S`: the fixed part of nvCOMP's deadline (tools such
/// as compute-sanitizer slow kernels down a hundredfold).
pub(crate) fn nvcomp_deadline_base() -> std::time::Duration {
    var("GPQ_NVCOMP_DEADLINE_S")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(std::time::Duration::from_secs(1), std::time::Duration::from_secs_f64)
}

/// Where the kernels come from (`GPQ_KERNELS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KernelSource {
    /// `auto` (the default): the prebuilt cubin, else NVRTC, else the prebuilt PTX.
    Auto,
    /// `jit`: NVRTC only.
    Jit,
    /// `ptx`: the prebuilt PTX only, compiled by the driver (to test that path
    /// on a device gpq ships a cubin for).
    Ptx,
    /// `file:PATH`: the image in that file only (a cubin or PTX, zstd-compressed
    /// where the name ends in `.zst`, as under `src/gpu/prebuilt/`): for
    /// comparing two versions of the kernels in one run on a device.
    File(PathBuf),
}

/// `GPQ_KERNELS`: `auto`, `jit`, `ptx` or `file:PATH`; anything else is an error.
pub(crate) fn kernel_source() -> Result<KernelSource> {
    parse_kernel_source(var("GPQ_KERNELS").as_deref())
}

fn parse_kernel_source(value: Option<&str>) -> Result<KernelSource> {
    if let Some(path) = value.and_then(|v| v.trim().strip_prefix("file:")).filter(|p| !p.is_empty()) {
        return Ok(KernelSource::File(PathBuf::from(path)));
    }
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("auto") => Ok(KernelSource::Auto),
        Some("jit") => Ok(KernelSource::Jit),
        Some("ptx") => Ok(KernelSource::Ptx),
        Some(v) => Err(invalid("GPQ_KERNELS", v, "auto, jit, ptx or file:PATH")),
    }
}

/// Where compiled kernels are cached, if anywhere.
pub(crate) fn kernel_cache_dir() -> Option<PathBuf> {
    if let Some(p) = var("GPQ_KERNEL_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(p).join("gpq/kernels"));
    }
    var("HOME").map(|h| PathBuf::from(h).join(".cache/gpq/kernels"))
}

/// `GPQ_NVCOMP_LIB`, if set.
pub(crate) fn nvcomp_lib() -> Option<String> {
    var("GPQ_NVCOMP_LIB")
}

/// Directories where Python environments keep packages: the active virtual
/// environment, the user's site-packages and the system's, all absolute.
pub(crate) fn python_prefixes() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    if let Some(venv) = var("VIRTUAL_ENV").or_else(|| var("CONDA_PREFIX")) {
        v.push(PathBuf::from(venv).join("lib"));
    }
    if let Some(home) = var("HOME") {
        v.push(PathBuf::from(home).join(".local/lib"));
    }
    for p in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        v.push(PathBuf::from(p));
    }
    v.retain(|p| p.is_absolute());
    v
}

/// `GPQ_CUFILE_LIB`, if set.
pub(crate) fn cufile_lib() -> Option<String> {
    var("GPQ_CUFILE_LIB")
}

/// `GPQ_PINNED_HOST_BYTES`, if set and valid.
pub(crate) fn pinned_host_bytes() -> Option<u64> {
    var("GPQ_PINNED_HOST_BYTES").and_then(|v| parse_size(&v))
}

/// Whether decoded footers are kept for later reads (`GPQ_FOOTER_CACHE`,
/// on unless set to a false value).
pub(crate) fn footer_cache() -> bool {
    !matches!(flag("GPQ_FOOTER_CACHE"), Ok(Some(false)))
}

/// How threads wait for the GPU (`GPQ_CUDA_WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CudaWait {
    /// The driver's heuristic (spins with fewer contexts than cores).
    Auto,
    /// Spin on the CPU.
    Spin,
    /// Spin, yielding the core between polls.
    Yield,
    /// Sleep on a synchronization primitive until the GPU is done.
    Blocking,
}

/// `GPQ_CUDA_WAIT`, `None` where unset (the context's flags are then left
/// as they are). Blocking frees the cores that
/// waiting threads would spin on for the query engine beside the reader,
/// but wakes them late when those cores are busy: in DataFusion over TPC-H
/// SF10 lineitem on an H100 (BENCHMARKS.md section 12.2) it made q6 faster
/// (0.19 to 0.12 s) and q1, which keeps every core busy, slower (0.72 to 0.90 s).
pub(crate) fn cuda_wait() -> Result<Option<CudaWait>> {
    var("GPQ_CUDA_WAIT").map(|v| parse_cuda_wait(&v)).transpose()
}

fn parse_cuda_wait(v: &str) -> Result<CudaWait> {
    match v.trim().to_ascii_lowercase().as_str() {
        "blocking" | "block" => Ok(CudaWait::Blocking),
        "spin" => Ok(CudaWait::Spin),
        "yield" => Ok(CudaWait::Yield),
        "auto" => Ok(CudaWait::Auto),
        _ => Err(invalid("GPQ_CUDA_WAIT", v, "blocking, spin, yield or auto")),
    }
}

/// Whether `GPQ_EMULATE=1` asks for the CPU emulator.
pub(crate) fn emulate() -> bool {
    matches!(flag("GPQ_EMULATE"), Ok(Some(true)))
}

/// Whether the application chose cuFile's configuration file
/// (`CUFILE_ENV_PATH_JSON`); then gpq leaves cuFile's settings alone.
pub(crate) fn cufile_config_chosen() -> bool {
    std::env::var_os("CUFILE_ENV_PATH_JSON").is_some()
}

/// `GPQ_UNZSTD_LIST_BYTES`: the most device memory for the ZSTD decoder's
/// sequence lists (default 1 GiB; an invalid value is the default).
pub(crate) fn unzstd_list_bytes() -> u64 {
    var("GPQ_UNZSTD_LIST_BYTES").and_then(|v| parse_size(&v)).filter(|&b| b > 0).unwrap_or(1 << 30)
}

/// `GPQ_UNZSTD_LIST_BLOCKS`: blocks an SM for the ZSTD decoder's sequence
/// kernel (default 5, as many as an H100's shared memory holds at once; at
/// most 32; an invalid value is the default).
pub(crate) fn unzstd_list_blocks() -> u32 {
    var("GPQ_UNZSTD_LIST_BLOCKS").and_then(|v| v.trim().parse::<u32>().ok()).filter(|b| (1..=32).contains(b)).unwrap_or(5)
}

/// Whether gpq's ZSTD decoder decodes each compressed block on a thread of
/// its own (`GPQ_UNZSTD_APART=0` keeps every page one chain, for comparison).
pub(crate) fn unzstd_apart() -> bool {
    !matches!(flag("GPQ_UNZSTD_APART"), Ok(Some(false)))
}

/// Whether `GPQ_UNZSTD_PROFILE=1` asks gpq's ZSTD decoder for its phase times.
pub(crate) fn unzstd_profile() -> bool {
    matches!(flag("GPQ_UNZSTD_PROFILE"), Ok(Some(true)))
}

/// `GPQ_NVCOMP_WORKER`: where the nvCOMP worker executable is, or `off`.
pub(crate) fn nvcomp_worker() -> Option<String> {
    var("GPQ_NVCOMP_WORKER")
}

/// `GPQ_NVCOMP_WORKER_DEADLINE_MS`, else `GPQ_NVCOMP_DEADLINE_S` where set:
/// the fixed part of the worker's deadline; `None` for the default.
pub(crate) fn nvcomp_worker_deadline_base() -> Option<std::time::Duration> {
    if let Some(ms) = var("GPQ_NVCOMP_WORKER_DEADLINE_MS").and_then(|v| v.trim().parse::<u64>().ok()) {
        return Some(std::time::Duration::from_millis(ms.max(1)));
    }
    var("GPQ_NVCOMP_DEADLINE_S").map(|_| nvcomp_deadline_base())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_wait_takes_four_words_and_refuses_the_rest() {
        assert_eq!(parse_cuda_wait("blocking").unwrap(), CudaWait::Blocking);
        assert_eq!(parse_cuda_wait(" Spin ").unwrap(), CudaWait::Spin);
        assert_eq!(parse_cuda_wait("yield").unwrap(), CudaWait::Yield);
        assert_eq!(parse_cuda_wait("auto").unwrap(), CudaWait::Auto);
        assert!(parse_cuda_wait("busy").unwrap_err().to_string().contains("GPQ_CUDA_WAIT"));
    }

    #[test]
    fn kernel_source_takes_three_words_and_refuses_the_rest() {
        assert_eq!(parse_kernel_source(None).unwrap(), KernelSource::Auto);
        assert_eq!(parse_kernel_source(Some("auto")).unwrap(), KernelSource::Auto);
        assert_eq!(parse_kernel_source(Some(" JIT ")).unwrap(), KernelSource::Jit);
        assert_eq!(parse_kernel_source(Some("ptx")).unwrap(), KernelSource::Ptx);
        assert_eq!(parse_kernel_source(Some("file:/k/sm_90.cubin.zst")).unwrap(), KernelSource::File("/k/sm_90.cubin.zst".into()));
        assert!(parse_kernel_source(Some("file:")).is_err());
        let e = parse_kernel_source(Some("cubin")).unwrap_err();
        assert!(matches!(e, Error::InvalidOptions(_)) && e.to_string().contains("GPQ_KERNELS"), "{e}");
    }
}
