//! nvCOMP's batched C API, loaded at run time.
//!
//! gpq binds nvCOMP 6.0 (`libnvcomp.so.6`, shipped in the pip wheel
//! `nvidia-libnvcomp-cu13`, which has no link-time dependency on anything
//! gpq does not already load). The library is looked for, in order, at
//! `$GPQ_NVCOMP_LIB` (an absolute path), on the dynamic loader's path, and at
//! known absolute locations: the wheel's `nvidia/libnvcomp/lib64` folder in
//! the site-packages of the active virtual or conda environment, of the
//! user and of the system, and `/usr/local/cuda/lib64`. No path relative to
//! the current directory is ever tried. The 6.0 batched decompressors take a
//! 64-byte options struct by value; every option gpq passes is the library's
//! default.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tracing::{debug, info};

use parquet::basic::Compression;

/// A codec nvCOMP decompresses for gpq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Codec {
    /// Snappy (raw).
    Snappy,
    /// Zstandard frames.
    Zstd,
    /// LZ4 raw blocks (Parquet's LZ4_RAW).
    Lz4,
    /// Gzip members.
    Gzip,
}

impl Codec {
    /// Every codec; a codec's position here is its code in the nvCOMP
    /// worker's protocol (`isolated`).
    pub(crate) const ALL: [Codec; 4] = [Codec::Snappy, Codec::Zstd, Codec::Lz4, Codec::Gzip];

    /// The nvCOMP codec for a Parquet compression, if nvCOMP handles it.
    pub(crate) fn for_parquet(c: Compression) -> Option<Codec> {
        match c {
            Compression::SNAPPY => Some(Codec::Snappy),
            Compression::ZSTD(_) => Some(Codec::Zstd),
            Compression::LZ4_RAW => Some(Codec::Lz4),
            Compression::GZIP(_) => Some(Codec::Gzip),
            _ => None,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Codec::Snappy => "Snappy",
            Codec::Zstd => "Zstd",
            Codec::Lz4 => "LZ4",
            Codec::Gzip => "Gzip",
        }
    }
}

/// nvCOMP's 64-byte decompression options; all zero means the defaults
/// (backend DEFAULT, no sorting, LZ4 data type CHAR, gzip NAIVE).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DecompressOpts {
    bytes: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<DecompressOpts>() == 64);

impl Default for DecompressOpts {
    fn default() -> Self {
        DecompressOpts { bytes: [0; 8] }
    }
}

/// Per-buffer alignment nvCOMP requires.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Alignments {
    /// Input buffers.
    pub input: usize,
    /// Output buffers.
    pub output: usize,
    /// Scratch buffer.
    pub temp: usize,
}

type GetTempSize = unsafe extern "C" fn(usize, usize, DecompressOpts, *mut usize, usize, *mut c_void) -> i32;
type GetAlignments = unsafe extern "C" fn(DecompressOpts, *mut Alignments) -> i32;
type DecompressAsync = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    DecompressOpts,
    *mut i32,
    *mut c_void,
) -> i32;
type GetProperties = unsafe extern "C" fn(*mut [u32; 2]) -> i32;

struct CodecFns {
    temp_size: GetTempSize,
    alignments: GetAlignments,
    decompress: DecompressAsync,
}

/// The loaded library.
pub struct Nvcomp {
    _lib: libloading::Library,
    /// Where it was loaded from.
    pub path: String,
    /// nvCOMP version as `major.minor.patch`.
    pub version: String,
    fns: Vec<(Codec, CodecFns)>,
}

static NVCOMP: OnceLock<Result<Nvcomp, String>> = OnceLock::new();

const SONAME: &str = "libnvcomp.so.6";

/// Where to look for nvCOMP, in order; each entry is a bare soname (for the
/// loader's search) or an absolute path.
fn candidates(errors: &mut Vec<String>) -> Vec<String> {
    let mut c = Vec::new();
    if let Some(p) = crate::env::nvcomp_lib() {
        if Path::new(&p).is_absolute() {
            c.push(p);
        } else {
            errors.push(format!("GPQ_NVCOMP_LIB={p:?} is not an absolute path (ignored)"));
        }
    }
    c.push(SONAME.into());
    for lib in crate::env::python_prefixes() {
        let Ok(entries) = std::fs::read_dir(&lib) else { continue };
        let mut pythons: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3"))).collect();
        pythons.sort();
        for py in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let p = py.join(packages).join("nvidia/libnvcomp/lib64").join(SONAME);
                if p.is_absolute() && p.exists() {
                    c.push(p.display().to_string());
                }
            }
        }
    }
    let cuda = Path::new("/usr/local/cuda/lib64").join(SONAME);
    if cuda.exists() {
        c.push(cuda.display().to_string());
    }
    c
}

fn load() -> Result<Nvcomp, String> {
    let started = std::time::Instant::now();
    let mut errors = Vec::new();
    for path in candidates(&mut errors) {
        // SAFETY: loading nvCOMP runs its initialisers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(&path) } {
            Ok(l) => l,
            Err(e) => {
                errors.push(format!("{path}: {e}"));
                continue;
            }
        };
        // SAFETY: each symbol is cast to the signature nvCOMP 6.0's headers declare.
        unsafe {
            let sym = |name: &str| -> Result<*const c_void, String> {
                lib.get::<*const c_void>(name.as_bytes()).map(|s| *s).map_err(|e| format!("{path}: {name}: {e}"))
            };
            let mut version = String::from("?");
            if let Ok(p) = sym("nvcompGetProperties") {
                let get: GetProperties = std::mem::transmute(p);
                let mut props = [0u32; 2];
                if get(&mut props) == 0 {
                    let v = props[0];
                    version = format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
                    if v / 1000 != 6 {
                        errors.push(format!("{path}: nvCOMP {version}, gpq needs 6.x"));
                        continue;
                    }
                }
            }
            let mut fns = Vec::new();
            for codec in [Codec::Snappy, Codec::Zstd, Codec::Lz4, Codec::Gzip] {
                let p = codec.prefix();
                let f = (|| -> Result<CodecFns, String> {
                    Ok(CodecFns {
                        temp_size: std::mem::transmute::<*const c_void, GetTempSize>(sym(&format!("nvcompBatched{p}DecompressGetTempSize"))?),
                        alignments: std::mem::transmute::<*const c_void, GetAlignments>(sym(&format!("nvcompBatched{p}DecompressGetRequiredAlignments"))?),
                        decompress: std::mem::transmute::<*const c_void, DecompressAsync>(sym(&format!("nvcompBatched{p}DecompressAsync"))?),
                    })
                })();
                match f {
                    Ok(f) => fns.push((codec, f)),
                    Err(e) => debug!("nvCOMP codec unavailable: {e}"),
                }
            }
            let ms = started.elapsed().as_secs_f64() * 1e3;
            info!(%path, %version, ms, codecs = ?fns.iter().map(|f| f.0).collect::<Vec<_>>(), "nvCOMP loaded");
            return Ok(Nvcomp { _lib: lib, path, version, fns });
        }
    }
    Err(format!("nvCOMP 6 not found ({})", errors.join("; ")))
}

/// The process-wide nvCOMP, loaded on first use.
pub fn nvcomp() -> Result<&'static Nvcomp, String> {
    NVCOMP.get_or_init(load).as_ref().map_err(|e| e.clone())
}

/// Arrays of one batched decompression, all in device memory.
pub struct Batch {
    /// Compressed chunk addresses (device array of pointers).
    pub in_ptrs: u64,
    /// Compressed sizes (device array of usize).
    pub in_sizes: u64,
    /// Output capacities (device array of usize).
    pub out_capacity: u64,
    /// Actual output sizes, written by nvCOMP (device array of usize).
    pub out_sizes: u64,
    /// Output addresses (device array of pointers).
    pub out_ptrs: u64,
    /// Per-chunk statuses, written by nvCOMP (device array of i32).
    pub statuses: u64,
    /// Number of chunks.
    pub count: usize,
}

impl Batch {
    /// The layout gpq uses for `count` chunks: `args` holds four device
    /// arrays of `count` u64 each (input addresses, input sizes, output
    /// capacities, output addresses), `results` the output sizes (u64 each)
    /// then the statuses (i32 each).
    pub fn packed(args: u64, results: u64, count: usize) -> Batch {
        let n = count as u64;
        Batch {
            in_ptrs: args,
            in_sizes: args + 8 * n,
            out_capacity: args + 16 * n,
            out_ptrs: args + 24 * n,
            out_sizes: results,
            statuses: results + 8 * n,
            count,
        }
    }
}

impl Nvcomp {
    fn codec(&self, c: Codec) -> Option<&CodecFns> {
        self.fns.iter().find(|f| f.0 == c).map(|f| &f.1)
    }

    /// Whether this library can decompress `c`.
    pub fn supports(&self, c: Codec) -> bool {
        self.codec(c).is_some()
    }

    /// Required alignments for `c`.
    pub fn alignments(&self, c: Codec) -> Result<Alignments, String> {
        let f = self.codec(c).ok_or("codec not in this nvCOMP")?;
        let mut a = Alignments::default();
        // SAFETY: valid out pointer; default options.
        let s = unsafe { (f.alignments)(DecompressOpts::default(), &mut a) };
        if s != 0 {
            return Err(format!("nvcompBatched{}DecompressGetRequiredAlignments: status {s}", c.prefix()));
        }
        Ok(a)
    }

    /// Scratch bytes a batch needs.
    pub fn temp_size(&self, c: Codec, count: usize, max_chunk: usize, total: usize, stream: *mut c_void) -> Result<usize, String> {
        let f = self.codec(c).ok_or("codec not in this nvCOMP")?;
        let mut t = 0usize;
        // SAFETY: valid out pointer; default options.
        let s = unsafe { (f.temp_size)(count, max_chunk, DecompressOpts::default(), &mut t, total, stream) };
        if s != 0 {
            return Err(format!("nvcompBatched{}DecompressGetTempSize: status {s}", c.prefix()));
        }
        Ok(t)
    }

    /// Queues the batch on `stream`.
    ///
    /// # Safety
    /// Every array of `batch` must hold `batch.count` entries in device memory,
    /// every pointer in them must address live device memory of the stated
    /// size, and `temp` must hold `temp_bytes` bytes; all must stay alive until
    /// the stream passes this point.
    pub unsafe fn decompress(&self, c: Codec, batch: &Batch, temp: u64, temp_bytes: usize, stream: *mut c_void) -> Result<(), String> {
        let f = self.codec(c).ok_or("codec not in this nvCOMP")?;
        // SAFETY: delegated to the caller.
        let s = unsafe {
            (f.decompress)(
                batch.in_ptrs as *const *const c_void,
                batch.in_sizes as *const usize,
                batch.out_capacity as *const usize,
                batch.out_sizes as *mut usize,
                batch.count,
                temp as *mut c_void,
                temp_bytes,
                batch.out_ptrs as *const *mut c_void,
                DecompressOpts::default(),
                batch.statuses as *mut i32,
                stream,
            )
        };
        if s != 0 {
            return Err(format!("nvcompBatched{}DecompressAsync: status {s}", c.prefix()));
        }
        Ok(())
    }
}

/// The `CheckCodec` code of `gpq_check_compressed` for `codec`, and a
/// well-formed stream of that codec that decodes to nothing (what a page
/// that fails the check is replaced with); `None` for codecs without a check.
pub(crate) fn empty_stream(codec: Codec) -> Option<(u32, Vec<u8>)> {
    match codec {
        // Preamble: uncompressed length 0.
        Codec::Snappy => Some((0, vec![0x00])),
        // One sequence of zero literals.
        Codec::Lz4 => Some((1, vec![0x00])),
        // A single-segment frame of content size 0 holding one empty raw block.
        Codec::Zstd => Some((2, vec![0x28, 0xB5, 0x2F, 0xFD, 0x20, 0x00, 0x01, 0x00, 0x00])),
        Codec::Gzip => None,
    }
}

/// Describes a `CheckReason` of `gpq_check_compressed`.
pub(crate) fn check_reason(code: u32) -> &'static str {
    match code {
        0 => "well-formed",
        1 => "a header or length runs past the end of the page",
        2 => "decoding would write past the size the page header promises",
        3 => "a back-reference points before the start of the output",
        4 => "it decodes to another size than the page header says",
        5 => "a frame, block or section header is malformed",
        6 => "a feature gpq does not hand to nvCOMP (dictionary or skippable frame)",
        _ => "unknown verdict",
    }
}

/// Describes an nvCOMP status code.
pub fn status_name(s: i32) -> &'static str {
    match s {
        0 => "success",
        10 => "invalid value",
        11 => "not supported",
        12 => "cannot decompress",
        13 => "bad checksum",
        14 => "cannot verify checksums",
        15 => "output buffer too small",
        16 => "wrong header length",
        17 => "alignment",
        18 => "chunk size too large",
        20 => "wrong input length",
        1000 => "CUDA error",
        10000 => "internal error",
        _ => "unknown status",
    }
}
