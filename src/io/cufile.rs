//! The cuFile paths: true GPUDirect Storage (`gds`, needs the nvidia-fs
//! kernel module) and cuFile's compatibility mode (`cufile-compat`).
//!
//! libcufile is loaded at run time (its soname is `libcufile.so.0`, which
//! cudarc's loader does not look for, so gpq opens it itself and uses
//! cudarc's `cufile::sys` types). Error codes are read as plain integers so an
//! unexpected code cannot be misread.
//!
//! Compatibility mode needs cuFile's `allow_compat_mode` property. Unless the
//! application chose a configuration file (`CUFILE_ENV_PATH_JSON`), gpq sets
//! that property through `cuFileSetParameterBool` (CUDA 12.9 and later)
//! before it opens the driver; it never writes configuration files or sets
//! environment variables. With an older cuFile the property comes from the
//! configuration file, and the error says so.

use std::ffi::c_void;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::cufile::sys::CUfileDrvProps;
use tracing::{info, warn};

use crate::cuda::{DeviceBuffer, GpuContext};
use crate::error::{Error, Result};
use crate::plan::IoLayout;

/// Which cuFile mode a read asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// nvidia-fs present: O_DIRECT file, registered device buffer, DMA.
    Gds,
    /// No nvidia-fs: cuFile's POSIX compatibility mode.
    Compat,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Gds => "gds",
            Mode::Compat => "cufile-compat",
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RawError {
    err: i32,
    cu_err: i32,
}

#[repr(C)]
struct Descr {
    kind: i32,
    fd: u64,
    fs_ops: *const c_void,
}

const CU_FILE_HANDLE_TYPE_OPAQUE_FD: i32 = 1;

type FnVoid = unsafe extern "C" fn() -> RawError;
type FnProps = unsafe extern "C" fn(*mut CUfileDrvProps) -> RawError;
type FnHandleRegister = unsafe extern "C" fn(*mut *mut c_void, *mut Descr) -> RawError;
type FnHandleDeregister = unsafe extern "C" fn(*mut c_void);
type FnBufRegister = unsafe extern "C" fn(*const c_void, usize, i32) -> RawError;
type FnBufDeregister = unsafe extern "C" fn(*const c_void) -> RawError;
type FnRead = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;
type FnSetParameterBool = unsafe extern "C" fn(u32, bool) -> RawError;

/// `CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE` of `CUFileBoolConfigParameter_t`.
const PARAM_ALLOW_COMPAT_MODE: u32 = 1;

struct Lib {
    _lib: libloading::Library,
    path: String,
    driver_open: FnVoid,
    get_properties: FnProps,
    handle_register: FnHandleRegister,
    handle_deregister: FnHandleDeregister,
    buf_register: FnBufRegister,
    buf_deregister: FnBufDeregister,
    read: FnRead,
    set_parameter_bool: Option<FnSetParameterBool>,
}

/// Names of cuFile error codes (from cufile.h), for messages.
fn op_error_name(code: i32) -> String {
    let name = match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        _ => return format!("cuFile error {code}"),
    };
    format!("{name} ({code})")
}

fn describe(e: RawError) -> String {
    if e.cu_err != 0 {
        format!("{} (CUDA error {})", op_error_name(e.err), e.cu_err)
    } else {
        op_error_name(e.err)
    }
}

fn load_lib() -> std::result::Result<Lib, String> {
    let mut candidates: Vec<String> = Vec::new();
    if let Some(p) = crate::env::cufile_lib() {
        if !Path::new(&p).is_absolute() {
            return Err(format!("GPQ_CUFILE_LIB={p:?} is not an absolute path"));
        }
        candidates.push(p);
    }
    for name in ["libcufile.so.0", "libcufile.so", "libcufile.so.1"] {
        candidates.push(name.to_string());
    }
    for dir in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"] {
        candidates.push(format!("{dir}/libcufile.so.0"));
    }
    let mut errors = Vec::new();
    for c in &candidates {
        // SAFETY: loading libcufile runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => {
                // SAFETY: the symbol types match cufile.h.
                let sym = |name: &[u8]| -> std::result::Result<*const c_void, String> {
                    unsafe { lib.get::<*const c_void>(name) }
                        .map(|s| *s)
                        .map_err(|e| format!("{c}: missing {}: {e}", String::from_utf8_lossy(name)))
                };
                // SAFETY: transmuting symbol addresses to their C signatures.
                unsafe {
                    let l = Lib {
                        path: c.clone(),
                        driver_open: std::mem::transmute::<*const c_void, FnVoid>(sym(b"cuFileDriverOpen")?),
                        get_properties: std::mem::transmute::<*const c_void, FnProps>(sym(b"cuFileDriverGetProperties")?),
                        handle_register: std::mem::transmute::<*const c_void, FnHandleRegister>(sym(b"cuFileHandleRegister")?),
                        handle_deregister: std::mem::transmute::<*const c_void, FnHandleDeregister>(sym(b"cuFileHandleDeregister")?),
                        buf_register: std::mem::transmute::<*const c_void, FnBufRegister>(sym(b"cuFileBufRegister")?),
                        buf_deregister: std::mem::transmute::<*const c_void, FnBufDeregister>(sym(b"cuFileBufDeregister")?),
                        read: std::mem::transmute::<*const c_void, FnRead>(sym(b"cuFileRead")?),
                        set_parameter_bool: sym(b"cuFileSetParameterBool")
                            .ok()
                            .map(|p| std::mem::transmute::<*const c_void, FnSetParameterBool>(p)),
                        _lib: lib,
                    };
                    return Ok(l);
                }
            }
            Err(e) => errors.push(format!("{c}: {e}")),
        }
    }
    Err(format!("libcufile not found (tried {})", errors.join("; ")))
}

/// The opened cuFile driver.
pub(crate) struct Driver {
    lib: Lib,
    /// How compatibility mode was allowed, for messages.
    pub(crate) compat: String,
}

static DRIVER: OnceLock<std::result::Result<Arc<Driver>, String>> = OnceLock::new();

/// Whether the nvidia-fs kernel module is loaded (true GDS possible).
pub fn nvidia_fs_loaded() -> bool {
    Path::new("/proc/driver/nvidia-fs/stats").exists() || Path::new("/dev/nvidia-fs0").exists()
}

/// Allows compatibility mode before the driver opens, unless the application
/// chose a configuration file; says what was done.
fn allow_compat_mode(lib: &Lib) -> String {
    if crate::env::cufile_config_chosen() {
        return "from the configuration file in CUFILE_ENV_PATH_JSON".into();
    }
    let Some(set) = lib.set_parameter_bool else {
        return "from cuFile's configuration file (this cuFile has no cuFileSetParameterBool; allow_compat_mode must be set there)".into();
    };
    // SAFETY: called before cuFileDriverOpen, as the API requires.
    let r = unsafe { set(PARAM_ALLOW_COMPAT_MODE, true) };
    if r.err == 0 {
        "allowed by gpq through cuFileSetParameterBool".into()
    } else {
        warn!("cuFileSetParameterBool(allow_compat_mode) failed: {}", describe(r));
        format!("cuFileSetParameterBool(allow_compat_mode) failed: {}", describe(r))
    }
}

/// Opens the cuFile driver once per process.
pub(crate) fn driver() -> std::result::Result<Arc<Driver>, String> {
    DRIVER
        .get_or_init(|| {
            let lib = load_lib()?;
            let compat = allow_compat_mode(&lib);
            // SAFETY: no preconditions.
            let r = unsafe { (lib.driver_open)() };
            if r.err != 0 {
                return Err(format!("cuFileDriverOpen failed: {}", describe(r)));
            }
            let mut props = std::mem::MaybeUninit::<CUfileDrvProps>::zeroed();
            // SAFETY: valid out pointer.
            let r = unsafe { (lib.get_properties)(props.as_mut_ptr()) };
            // SAFETY: zeroed is a valid value of this plain struct.
            let properties = unsafe { props.assume_init() };
            if r.err != 0 {
                warn!("cuFileDriverGetProperties failed: {}", describe(r));
            }
            info!(lib = %lib.path, %compat, nvfs = format!("{}.{}", properties.nvfs.major_version, properties.nvfs.minor_version), "cuFile driver open");
            Ok(Arc::new(Driver { lib, compat }))
        })
        .clone()
}

/// Whether `mode` can be used, and if not, why.
pub(crate) fn check_available(mode: Mode) -> std::result::Result<(), String> {
    if mode == Mode::Gds && !nvidia_fs_loaded() {
        return Err("the nvidia-fs kernel module is not loaded (no /proc/driver/nvidia-fs), so cuFile cannot DMA from storage".into());
    }
    driver().map(|_| ())
}

struct Handle<'a> {
    driver: &'a Driver,
    raw: *mut c_void,
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once.
        unsafe { (self.driver.lib.handle_deregister)(self.raw) };
    }
}

/// Reads every task of `layout` into `dst` through cuFile.
/// Returns the bytes read.
pub(crate) fn read(
    ctx: &Arc<GpuContext>,
    path: &Path,
    layout: &IoLayout,
    dst: &DeviceBuffer,
    threads: usize,
    mode: Mode,
) -> Result<u64> {
    let unavailable = |reason: String| Error::CufileUnavailable { mode: mode.name(), reason };
    check_available(mode).map_err(unavailable)?;
    if ctx.is_emulated() {
        return Err(unavailable("the device is the CPU emulator".into()));
    }
    let driver = driver().map_err(unavailable)?;
    ctx.bind()?;

    let mut opts = OpenOptions::new();
    opts.read(true);
    if mode == Mode::Gds {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(path).map_err(|source| Error::Open { file: path.to_path_buf(), source })?;
    let mut descr = Descr { kind: CU_FILE_HANDLE_TYPE_OPAQUE_FD, fd: file.as_raw_fd() as u32 as u64, fs_ops: std::ptr::null() };
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid descriptor and out pointer; the fd outlives the handle.
    let r = unsafe { (driver.lib.handle_register)(&mut raw, &mut descr) };
    if r.err != 0 {
        let log_hint = format!(" (compatibility mode: {}; cuFile's own log is cufile.log)", driver.compat);
        let udev_hint = missing_udev_record(&file).unwrap_or_default();
        return Err(unavailable(format!(
            "cuFileHandleRegister failed for {}: {}{udev_hint}{log_hint}",
            path.display(),
            describe(r)
        )));
    }
    let handle = Handle { driver: &driver, raw };

    let registered = if mode == Mode::Gds && !dst.is_empty() {
        // SAFETY: dst is a plain cuMemAlloc buffer of dst.len() bytes.
        let r = unsafe { (driver.lib.buf_register)(dst.ptr() as *const c_void, dst.len() as usize, 0) };
        if r.err != 0 {
            warn!("cuFileBufRegister failed ({}); cuFile will use its internal buffers", describe(r));
        }
        r.err == 0
    } else {
        false
    };

    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let bytes_read = AtomicU64::new(0);
    let handle_raw = handle.raw as usize;
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let (next, failed, driver, bytes_read) = (&next, &failed, &driver, &bytes_read);
                scope.spawn(move || -> Result<()> {
                    ctx.bind()?;
                    loop {
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        let Some(task) = layout.tasks.get(next.fetch_add(1, Ordering::Relaxed)) else { return Ok(()) };
                        let mut done = 0u64;
                        while done < task.len {
                            // SAFETY: the destination range lies inside dst; the handle is registered.
                            let n = unsafe {
                                (driver.lib.read)(
                                    handle_raw as *mut c_void,
                                    dst.ptr() as *mut c_void,
                                    (task.len - done) as usize,
                                    (task.file_offset + done) as i64,
                                    (task.device_offset + done) as i64,
                                )
                            };
                            if n <= 0 {
                                failed.store(true, Ordering::Relaxed);
                                let source = if n == -1 {
                                    std::io::Error::last_os_error()
                                } else if n == 0 {
                                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "cuFileRead returned 0 bytes before the end of the range")
                                } else {
                                    std::io::Error::other(format!("cuFileRead: {}", op_error_name((-n) as i32)))
                                };
                                return Err(Error::Io { file: path.to_path_buf(), offset: task.file_offset + done, len: task.len - done, source });
                            }
                            done += n as u64;
                            bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|p| Err(Error::worker_panicked("cuFile IO", p)))).collect()
    });
    if registered {
        // SAFETY: registered above.
        unsafe { (driver.lib.buf_deregister)(dst.ptr() as *const c_void) };
    }
    drop(handle);
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(bytes_read.into_inner())
}

/// cuFile identifies a file's filesystem through the udev database
/// (`ID_FS_USAGE` of the block device). Containers and micro-VMs without udev
/// lack `/run/udev/data/b<major>:<minor>`, and cuFile then refuses to register
/// any file on that device, even in compatibility mode. Returns an explanation
/// when that record is missing.
fn missing_udev_record(file: &File) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = file.metadata().ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let record = format!("/run/udev/data/b{major}:{minor}");
    if Path::new(&record).exists() {
        return None;
    }
    Some(format!(
        "; the udev record {record} of the file's block device is missing (no udev here), and cuFile needs its \
         ID_FS_USAGE property to identify the filesystem; where you may, create that file with the line \
         `E:ID_FS_USAGE=filesystem`, else use the bounce path"
    ))
}
