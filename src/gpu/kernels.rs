//! Kernel loading: one module per context, loaded on first use. The image
//! comes from the kernels compiled ahead of time ([`super::prebuilt`]): the
//! cubin of the device's architecture. A device none of them runs gets the
//! CUDA C++ sources beside this file compiled with NVRTC for its exact
//! architecture, cached on disk (keyed by source hash, architecture, NVRTC
//! version and options) so the next process starts fast; without NVRTC, the
//! prebuilt PTX compiled by the driver. `GPQ_KERNELS=jit` always compiles
//! with NVRTC, `GPQ_KERNELS=ptx` always takes the PTX, `GPQ_KERNELS=file:PATH`
//! loads another image (to compare two versions of a kernel; see [`crate::env`],
//! which also chooses NVRTC's cache directory; a cache that cannot be
//! written is skipped).

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc;
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::cuda::{ContextKey, GpuContext, GpuStream, check};
use crate::error::{Error, Result};

/// The kernels gpq launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Position-weighted checksums of byte spans (`checksum.cu`).
    SpanChecksum,
    /// Pass 1 of page headers: count pages per chunk (`page_headers.cu`).
    CountPages,
    /// Pass 2 of page headers: fill the page table (`page_headers.cu`).
    ParsePages,
    /// Fixed-width and boolean values (`decode_values.cu`).
    DecodeFixed,
    /// (offset, length) tables of string dictionaries (`decode_strings.cu`).
    DictIndex,
    /// String lengths per row and characters per page (`decode_strings.cu`).
    StringSizes,
    /// String offsets and characters (`decode_strings.cu`).
    StringChars,
    /// Decimals stored as byte arrays (`decode_strings.cu`).
    BytesDecimal,
    /// DELTA_BINARY_PACKED values (`decode_delta.cu`).
    DecodeDelta,
    /// Lengths and sources of DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY values (`decode_delta.cu`).
    DeltaStringSizes,
    /// DELTA_BYTE_ARRAY values built from prefixes and suffixes (`decode_delta.cu`).
    DeltaByteArrayValues,
    /// Batched device-to-device copies (`copy.cu`).
    BatchedCopy,
    /// Structural checks of compressed pages before nvCOMP (`check_compressed.cu`).
    CheckCompressed,
    /// ZSTD pages' sequence list sizes (`unzstd.cu`).
    UnzstdCount,
    /// ZSTD pages' sequences, decoded into lists (`unzstd.cu`).
    UnzstdSequences,
    /// ZSTD decompression from the sequence lists, checked at every step (`unzstd.cu`).
    Unzstd,
    /// SNAPPY decompression, a block a page, checked at every tag (`unsnappy.cu`).
    Unsnappy,
    /// Repetition and definition levels of nested leaves (`nesting.cu`).
    DecodeLevels,
    /// Slots per tile of level positions (`nesting.cu`).
    NestCount,
    /// Offsets, validity and gathers of nested columns (`nesting.cu`).
    NestApply,
    /// CRC-32 of page bodies against their headers (`page_checksums.cu`).
    PageCrc,
    /// String and binary views from offsets and characters (`views.cu`).
    MakeViews,
    /// List offsets widened to `i64` (`copy.cu`).
    WidenOffsets,
    /// Prefix sums, step 1: the sum of each tile (`scan.cu`).
    ScanTileSums,
    /// Prefix sums, step 2: the tiles' bases (`scan.cu`).
    ScanTileBases,
    /// Prefix sums, step 3: each value's exclusive sum (`scan.cu`).
    ScanApply,
    /// A filter's predicate program, for every row (`filter.cu`).
    FilterEval,
    /// The rows a filter kept, in order (`filter.cu`).
    FilterRows,
    /// Fixed-width values of listed rows (`gather.cu`).
    GatherFixed,
    /// Bits (validity, booleans) of listed rows (`gather.cu`).
    GatherBits,
    /// Bytes each listed string or long view needs (`gather.cu`).
    GatherLengths,
    /// Strings and views of listed rows (`gather.cu`).
    GatherStrings,
    /// Grouped partial aggregation of rows (`aggregate.cu`).
    Aggregate,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 33] = [
        Kernel::SpanChecksum,
        Kernel::CountPages,
        Kernel::ParsePages,
        Kernel::DecodeFixed,
        Kernel::DictIndex,
        Kernel::StringSizes,
        Kernel::StringChars,
        Kernel::BytesDecimal,
        Kernel::DecodeDelta,
        Kernel::DeltaStringSizes,
        Kernel::DeltaByteArrayValues,
        Kernel::BatchedCopy,
        Kernel::CheckCompressed,
        Kernel::UnzstdCount,
        Kernel::UnzstdSequences,
        Kernel::Unzstd,
        Kernel::Unsnappy,
        Kernel::DecodeLevels,
        Kernel::NestCount,
        Kernel::NestApply,
        Kernel::PageCrc,
        Kernel::MakeViews,
        Kernel::WidenOffsets,
        Kernel::ScanTileSums,
        Kernel::ScanTileBases,
        Kernel::ScanApply,
        Kernel::FilterEval,
        Kernel::FilterRows,
        Kernel::GatherFixed,
        Kernel::GatherBits,
        Kernel::GatherLengths,
        Kernel::GatherStrings,
        Kernel::Aggregate,
    ];

    /// The `extern "C"` name of the kernel in the sources.
    pub fn symbol(self) -> &'static str {
        match self {
            Kernel::SpanChecksum => "gpq_span_checksum",
            Kernel::CountPages => "gpq_count_pages",
            Kernel::ParsePages => "gpq_parse_pages",
            Kernel::DecodeFixed => "gpq_decode_fixed",
            Kernel::DictIndex => "gpq_dict_index",
            Kernel::StringSizes => "gpq_string_sizes",
            Kernel::StringChars => "gpq_string_chars",
            Kernel::BytesDecimal => "gpq_bytes_decimal",
            Kernel::DecodeDelta => "gpq_decode_delta",
            Kernel::DeltaStringSizes => "gpq_delta_string_sizes",
            Kernel::DeltaByteArrayValues => "gpq_delta_byte_array_values",
            Kernel::BatchedCopy => "gpq_batched_copy",
            Kernel::CheckCompressed => "gpq_check_compressed",
            Kernel::UnzstdCount => "gpq_unzstd_count",
            Kernel::UnzstdSequences => "gpq_unzstd_sequences",
            Kernel::Unzstd => "gpq_unzstd",
            Kernel::Unsnappy => "gpq_unsnappy",
            Kernel::DecodeLevels => "gpq_decode_levels",
            Kernel::NestCount => "gpq_nest_count",
            Kernel::NestApply => "gpq_nest_apply",
            Kernel::PageCrc => "gpq_page_crc",
            Kernel::MakeViews => "gpq_make_views",
            Kernel::WidenOffsets => "gpq_widen_offsets",
            Kernel::ScanTileSums => "gpq_scan_tile_sums",
            Kernel::ScanTileBases => "gpq_scan_tile_bases",
            Kernel::ScanApply => "gpq_scan_apply",
            Kernel::FilterEval => "gpq_filter_eval",
            Kernel::FilterRows => "gpq_filter_rows",
            Kernel::GatherFixed => "gpq_gather_fixed",
            Kernel::GatherBits => "gpq_gather_bits",
            Kernel::GatherLengths => "gpq_gather_lengths",
            Kernel::GatherStrings => "gpq_gather_strings",
            Kernel::Aggregate => "gpq_aggregate",
        }
    }
}

/// The kernel sources, in the order they are concatenated into one translation unit.
pub(crate) const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("checksum.cu", include_str!("kernels/checksum.cu")),
    ("page_headers.cu", include_str!("kernels/page_headers.cu")),
    ("page_checksums.cu", include_str!("kernels/page_checksums.cu")),
    ("rle.cuh", include_str!("kernels/rle.cuh")),
    ("page_decode.cuh", include_str!("kernels/page_decode.cuh")),
    ("delta.cuh", include_str!("kernels/delta.cuh")),
    ("decode_values.cu", include_str!("kernels/decode_values.cu")),
    ("decode_strings.cu", include_str!("kernels/decode_strings.cu")),
    ("decode_delta.cu", include_str!("kernels/decode_delta.cu")),
    ("copy.cu", include_str!("kernels/copy.cu")),
    ("check_compressed.cu", include_str!("kernels/check_compressed.cu")),
    ("unzstd.cu", include_str!("kernels/unzstd.cu")),
    ("unsnappy.cu", include_str!("kernels/unsnappy.cu")),
    ("nesting.cu", include_str!("kernels/nesting.cu")),
    ("views.cu", include_str!("kernels/views.cu")),
    ("scan.cu", include_str!("kernels/scan.cu")),
    ("filter.cu", include_str!("kernels/filter.cu")),
    ("gather.cu", include_str!("kernels/gather.cu")),
    ("aggregate.cu", include_str!("kernels/aggregate.cu")),
];

/// Options every compile uses (the architecture is added per device).
pub(crate) const NVRTC_OPTIONS: &[&str] = &["-std=c++17", "-lineinfo", "-DGPQ_NVRTC=1", "--device-int128"];

/// The whole translation unit, with `#line` markers so compiler messages name the right file.
pub(crate) fn translation_unit() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// Whether the NVRTC library can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: probing for the library has no preconditions.
    unsafe { nvrtc::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(Error::Kernel { stage: "nvrtc", log: "libnvrtc is not installed or not on the library path".into() });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out pointers.
    let r = unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) };
    if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Kernel { stage: "nvrtc", log: format!("nvrtcVersion failed: {r:?}") });
    }
    Ok((major, minor))
}

/// Compiles the kernels to a cubin for `arch` (e.g. `sm_90`). Needs NVRTC but no GPU.
pub fn compile_cubin(arch: &str) -> Result<Vec<u8>> {
    compile_source(&translation_unit(), arch)
}

/// Compiles the kernels to PTX for the virtual architecture `arch` (e.g.
/// `compute_80`), NUL-terminated as the driver takes it. Needs NVRTC but no GPU.
pub fn compile_ptx(arch: &str) -> Result<Vec<u8>> {
    compile(&translation_unit(), arch, Output::Ptx)
}

/// Compiles `source` (one translation unit) to a cubin for `arch`; a failure
/// carries NVRTC's log.
#[cfg(feature = "test-util")]
pub fn compile_source_for_test(source: &str, arch: &str) -> Result<Vec<u8>> {
    compile_source(source, arch)
}

fn compile_source(source: &str, arch: &str) -> Result<Vec<u8>> {
    compile(source, arch, Output::Cubin)
}

/// What NVRTC hands back.
#[derive(Clone, Copy)]
enum Output {
    Cubin,
    Ptx,
}

fn compile(source: &str, arch: &str, output: Output) -> Result<Vec<u8>> {
    nvrtc_version()?;
    let src = CString::new(source).map_err(|_| Error::Kernel { stage: "nvrtc", log: "kernel source holds a NUL byte".into() })?;
    let name = CString::new("gpq_kernels.cu").unwrap();
    let mut opts: Vec<CString> = NVRTC_OPTIONS.iter().map(|o| CString::new(*o).unwrap()).collect();
    opts.push(CString::new(format!("--gpu-architecture={arch}")).unwrap());
    let opt_ptrs: Vec<*const i8> = opts.iter().map(|o| o.as_ptr()).collect();
    let fail = |what: &str, r: nvrtc::nvrtcResult| Error::Kernel { stage: "nvrtc", log: format!("{what}: {r:?}") };
    // SAFETY: all pointers are valid C strings that outlive the calls; the
    // program is destroyed on every path.
    unsafe {
        let mut prog = std::ptr::null_mut();
        let r = nvrtc::nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null());
        if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("nvrtcCreateProgram", r));
        }
        let compiled = nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut log_len = 0usize;
        nvrtc::nvrtcGetProgramLogSize(prog, &mut log_len);
        let mut log = vec![0u8; log_len.max(1)];
        nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
        let log = String::from_utf8_lossy(&log[..log_len.saturating_sub(1)]).into_owned();
        if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            nvrtc::nvrtcDestroyProgram(&mut prog);
            return Err(Error::Kernel { stage: "nvrtc", log: format!("{compiled:?} for {arch}:\n{log}") });
        }
        if !log.trim().is_empty() {
            debug!(%log, "NVRTC messages");
        }
        let mut size = 0usize;
        let (size_call, r) = match output {
            Output::Cubin => ("nvrtcGetCUBINSize", nvrtc::nvrtcGetCUBINSize(prog, &mut size)),
            Output::Ptx => ("nvrtcGetPTXSize", nvrtc::nvrtcGetPTXSize(prog, &mut size)),
        };
        if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            nvrtc::nvrtcDestroyProgram(&mut prog);
            return Err(fail(size_call, r));
        }
        let mut image = vec![0u8; size];
        let (call, r) = match output {
            Output::Cubin => ("nvrtcGetCUBIN", nvrtc::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast())),
            Output::Ptx => ("nvrtcGetPTX", nvrtc::nvrtcGetPTX(prog, image.as_mut_ptr().cast())),
        };
        nvrtc::nvrtcDestroyProgram(&mut prog);
        if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail(call, r));
        }
        Ok(image)
    }
}

/// Cache key: source, architecture, NVRTC version and options.
pub(crate) fn cache_key(arch: &str, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(translation_unit().as_bytes());
    h.update(arch.as_bytes());
    h.update(format!("{}.{}", nvrtc.0, nvrtc.1).as_bytes());
    for o in NVRTC_OPTIONS {
        h.update(o.as_bytes());
    }
    let digest = h.finalize();
    format!("{arch}-nvrtc{}.{}-{}", nvrtc.0, nvrtc.1, super::prebuilt::hex(&digest[..16]))
}

/// The cubin for `arch` compiled by NVRTC, from the disk cache or freshly compiled.
pub(crate) fn nvrtc_cubin(arch: &str) -> Result<Vec<u8>> {
    let version = nvrtc_version()?;
    let key = cache_key(arch, version);
    let path = crate::env::kernel_cache_dir().map(|d| d.join(format!("{key}.cubin")));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            debug!(path = %p.display(), "kernel cache hit");
            return Ok(bytes);
        }
    }
    let t = std::time::Instant::now();
    let cubin = compile_cubin(arch)?;
    info!(arch, elapsed_ms = t.elapsed().as_secs_f64() * 1e3, "compiled kernels with NVRTC");
    if let Some(p) = &path {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &cubin)?;
            std::fs::rename(&tmp, p)
        };
        if let Err(e) = write() {
            warn!(path = %p.display(), error = %e, "could not write the kernel cache");
        }
    }
    Ok(cubin)
}

/// The loaded kernel module of one context (or the emulator's kernel table).
pub(crate) struct Kernels {
    module: sys::CUmodule,
    emulated: bool,
    source: String,
    functions: Mutex<HashMap<Kernel, usize>>,
}

// The module handle belongs to a process-lifetime primary context and may be
// used from any thread with that context current.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

// Modules of a lost context stay here unused (unloading them would touch a
// reset context); a reset device gets a new key.
type Registry = Mutex<HashMap<ContextKey, Arc<Kernels>>>;

impl Kernels {
    /// The kernels of `ctx`'s device, loaded on first use (see the module
    /// doc for where they come from), then shared. A failure is not cached:
    /// the next call tries again.
    pub(crate) fn for_context(ctx: &GpuContext) -> Result<Arc<Kernels>> {
        Self::for_context_timed(ctx).map(|(k, _)| k)
    }

    /// Like [`Kernels::for_context`], with the time this call spent loading
    /// the module (zero when it was loaded already).
    pub(crate) fn for_context_timed(ctx: &GpuContext) -> Result<(Arc<Kernels>, std::time::Duration)> {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        ctx.bind()?;
        let mut registry = REGISTRY.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = registry.get(&ctx.key()) {
            return Ok((Arc::clone(k), std::time::Duration::ZERO));
        }
        let t = std::time::Instant::now();
        let k = if ctx.is_emulated() { Kernels::emulated() } else { Kernels::load(ctx.compute_capability)? };
        let elapsed = t.elapsed();
        info!(ms = elapsed.as_secs_f64() * 1e3, device = ctx.ordinal(), source = %k.source, "kernels loaded");
        let k = Arc::new(k);
        registry.insert(ctx.key(), Arc::clone(&k));
        Ok((k, elapsed))
    }

    /// Where the module came from (`prebuilt sm_90 cubin`, `NVRTC sm_75`, ...).
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Loads the kernels for a device of this compute capability: the
    /// prebuilt cubin of its architecture, else NVRTC, else the prebuilt PTX
    /// (`GPQ_KERNELS=jit`: NVRTC only; `ptx`: the PTX only). The context
    /// must be current.
    fn load(cc: (i32, i32)) -> Result<Kernels> {
        use crate::env::KernelSource;
        let arch = format!("sm_{}{}", cc.0, cc.1);
        let wanted = crate::env::kernel_source()?;
        if let KernelSource::File(path) = &wanted {
            let image = Self::image_file(path)?;
            let module = Self::load_image(&image)?;
            warn!(path = %path.display(), "kernels from GPQ_KERNELS=file: (not the ones built with this gpq)");
            return Ok(Self::loaded(module, format!("file {}", path.display())));
        }
        let mut tried: Vec<String> = Vec::new();
        if wanted == KernelSource::Auto {
            match super::prebuilt::cubin_for(cc) {
                Some(image) => {
                    if let Some(kernels) = Self::load_prebuilt(image, &mut tried) {
                        return Ok(kernels);
                    }
                }
                None => tried.push(format!("no prebuilt cubin runs on {arch}")),
            }
        }
        if wanted != KernelSource::Ptx {
            match nvrtc_cubin(&arch).and_then(|b| Self::load_image(&b)) {
                Ok(module) => {
                    if wanted == KernelSource::Auto {
                        warn!(arch, reason = %tried.join("; "), "kernels compiled with NVRTC");
                    }
                    return Ok(Self::loaded(module, format!("NVRTC {arch}")));
                }
                Err(e) if wanted == KernelSource::Jit => return Err(e),
                Err(e) => tried.push(format!("NVRTC: {e}")),
            }
        }
        match super::prebuilt::ptx_for(cc) {
            Some(image) => {
                let before = tried.join("; ");
                if let Some(kernels) = Self::load_prebuilt(image, &mut tried) {
                    if wanted == KernelSource::Auto {
                        warn!(arch, reason = %before, "kernels compiled by the driver from the prebuilt PTX");
                    }
                    return Ok(kernels);
                }
            }
            None => tried.push(format!("no prebuilt PTX runs on {arch}")),
        }
        Err(Error::Kernel { stage: "load", log: format!("no kernels for {arch}: {}", tried.join("; ")) })
    }

    /// Loads a prebuilt image (a cubin, or PTX the driver compiles), or notes
    /// in `tried` why it would not load.
    fn load_prebuilt(image: &super::prebuilt::Image, tried: &mut Vec<String>) -> Option<Kernels> {
        use super::prebuilt::ImageKind;
        let what = match image.kind {
            ImageKind::Cubin => format!("prebuilt {} cubin", image.arch),
            ImageKind::Ptx => format!("prebuilt {} PTX, compiled by the driver", image.arch),
        };
        match image.bytes().and_then(|b| Self::load_image(&b)) {
            Ok(module) => Some(Self::loaded(module, what)),
            Err(e) => {
                tried.push(format!("{what}: {e}"));
                None
            }
        }
    }

    /// The image in `path` (`GPQ_KERNELS=file:`), decompressed where its
    /// name ends in `.zst`; PTX gets the NUL the driver needs.
    fn image_file(path: &std::path::Path) -> Result<Vec<u8>> {
        let failed = |e: &dyn std::fmt::Display| Error::Kernel { stage: "load", log: format!("GPQ_KERNELS=file:{}: {e}", path.display()) };
        let bytes = std::fs::read(path).map_err(|e| failed(&e))?;
        let mut image = if path.extension().is_some_and(|x| x == "zst") {
            super::prebuilt::decompress_image(&bytes).map_err(|e| failed(&e))?
        } else {
            bytes
        };
        if !image.starts_with(b"\x7fELF") && image.last() != Some(&0) {
            image.push(0);
        }
        Ok(image)
    }

    fn loaded(module: sys::CUmodule, source: String) -> Kernels {
        Kernels { module, emulated: false, source, functions: Default::default() }
    }

    /// Loads a cubin or NUL-terminated PTX into the current context.
    fn load_image(image: &[u8]) -> Result<sys::CUmodule> {
        let mut module = std::ptr::null_mut();
        // SAFETY: the image is a complete cubin or NUL-terminated PTX that
        // stays alive for the call.
        let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) };
        check("cuModuleLoadData", r).map_err(|e| Error::Kernel { stage: "load", log: e.to_string() })?;
        Ok(module)
    }

    /// The emulator's kernels (compiled into the binary with the `emulator` feature).
    fn emulated() -> Kernels {
        Kernels { module: std::ptr::null_mut(), emulated: true, source: "the CPU emulator".into(), functions: Default::default() }
    }

    fn function(&self, kernel: Kernel) -> Result<sys::CUfunction> {
        let mut map = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&f) = map.get(&kernel) {
            return Ok(f as sys::CUfunction);
        }
        let name = kernel.symbol();
        let cname = CString::new(name).map_err(|_| Error::Internal(format!("kernel name {name:?} holds a NUL")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: module is loaded; valid out pointer.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut f, self.module, cname.as_ptr()) })
            .map_err(|e| Error::Kernel { stage: "load", log: format!("kernel {name}: {e}") })?;
        map.insert(kernel, f as usize);
        Ok(f)
    }

    /// Launches `kernel` on `stream`.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and
    /// type, and every device pointer among them must stay valid until the
    /// kernel has finished.
    pub(crate) unsafe fn launch(
        &self,
        kernel: Kernel,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        stream: &GpuStream,
        args: &mut KernelArgs,
    ) -> Result<()> {
        if grid == 0 {
            return Ok(());
        }
        if self.emulated {
            return emulated_launch(kernel.symbol(), grid, block, args);
        }
        let f = self.function(kernel)?;
        let mut ptrs = args.pointers();
        // SAFETY: delegated to the caller (see above).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared_bytes, stream.raw(), ptrs.as_mut_ptr(), std::ptr::null_mut())
        })
    }
}

#[cfg(feature = "emulator")]
unsafe extern "C" {
    fn gpq_emu_launch(name: *const i8, grid: u32, block: u32, args: *mut *mut c_void, err: *mut i8, err_len: usize) -> i32;
}

#[cfg(feature = "emulator")]
fn emulated_launch(name: &'static str, grid: u32, block: u32, args: &mut KernelArgs) -> Result<()> {
    let cname = CString::new(name).map_err(|_| Error::Internal(format!("kernel name {name:?} holds a NUL")))?;
    let mut ptrs = args.pointers();
    let mut err = [0i8; 512];
    // SAFETY: the emulator reads each argument with the kernel's own types;
    // the caller guarantees they match (see `launch`).
    let rc = unsafe { gpq_emu_launch(cname.as_ptr(), grid, block, ptrs.as_mut_ptr(), err.as_mut_ptr(), err.len()) };
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the emulator wrote a NUL-terminated message.
    let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
    Err(Error::Kernel { stage: "emulator", log: msg })
}

#[cfg(not(feature = "emulator"))]
fn emulated_launch(name: &'static str, _grid: u32, _block: u32, _args: &mut KernelArgs) -> Result<()> {
    Err(Error::Kernel { stage: "emulator", log: format!("kernel {name}: built without the emulator") })
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if self.emulated {
            return;
        }
        // SAFETY: no launches are pending once the owning context drops its kernels.
        unsafe {
            sys::cuModuleUnload(self.module);
        }
    }
}

/// Kernel arguments, each kept at a stable address until the launch.
#[derive(Default)]
pub(crate) struct KernelArgs {
    values: Vec<Box<[u8; 16]>>,
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a plain-old-data argument of at most 16 bytes.
    pub fn arg<T: Copy + 'static>(mut self, v: T) -> Self {
        assert!(std::mem::size_of::<T>() <= 16, "kernel arguments are at most 16 bytes");
        let mut slot = Box::new([0u8; 16]);
        // SAFETY: T fits in the slot and is Copy (no drop glue).
        unsafe { std::ptr::write_unaligned(slot.as_mut_ptr().cast::<T>(), v) };
        self.values.push(slot);
        self
    }

    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.values.iter_mut().map(|b| b.as_mut_ptr().cast()).collect()
    }
}
