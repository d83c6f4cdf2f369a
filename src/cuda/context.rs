//! One [`GpuContext`] per device and process: the primary context, device
//! properties and the stream-ordered memory pool; streams and events. What
//! stages keep per device (compiled kernels, the bounce path's staging
//! buffers, the pinned host pool) lives with those stages, keyed by the
//! context's [`GpuContext::key`].
//!
//! With the `emulator` feature a context can also be the CPU emulator
//! ([`GpuContext::emulated`]): device memory is host memory and kernels run
//! on the CPU. It exists for testing kernel logic without a GPU.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use tracing::{error, info};

use super::check;
use super::memory::MemoryBudget;
use crate::error::{Error, Result};

/// The `call` of the [`Error::GpuContextLost`] a missed deadline reports.
pub const DEADLINE: &str = "deadline";

/// Identifies a context among all of the process: (ordinal, emulated,
/// generation). A device whose context was lost and reset gets a new
/// generation, so per-device state of the old one is never reused.
pub type ContextKey = (usize, bool, u64);

/// Memory the device's pool keeps for reuse after reads free it, as a share
/// of the device's memory (the rest goes back to the driver at the next
/// synchronization).
const POOL_KEEP_FRACTION: u64 = 2;

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Devices whose primary context holds a kernel that never finished: it
/// cannot be reset (a reset waits for the kernel), so later reads run in a
/// context of gpq's own on that device.
static WEDGED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn primary_wedged(ordinal: usize) -> bool {
    WEDGED.lock().unwrap_or_else(|p| p.into_inner()).contains(&ordinal)
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Backend {
    Cuda { ctx: sys::CUcontext, pool: sys::CUmemoryPool },
    Emulated,
}

/// A CUDA device with its primary context (or the CPU emulator).
pub struct GpuContext {
    ordinal: usize,
    device: sys::CUdevice,
    /// A context gpq created (not the device's primary context).
    owned: bool,
    generation: u64,
    lost: AtomicBool,
    /// Bytes of gpq's device buffers alive now on this context.
    pub(crate) live_bytes: AtomicU64,
    pub(crate) backend: Backend,
    /// Device name as the driver reports it.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sm_count: i32,
    /// Total device memory in bytes.
    pub total_memory: u64,
}

// The context handle and pool are process-wide driver objects that may be used
// from any thread once made current there (which `bind` does).
unsafe impl Send for GpuContext {}
unsafe impl Sync for GpuContext {}

static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<GpuContext>>>> = OnceLock::new();
static DRIVER: OnceLock<Result<i32, String>> = OnceLock::new();
static EMULATE: AtomicBool = AtomicBool::new(false);
static EMULATED: OnceLock<Arc<GpuContext>> = OnceLock::new();

/// Memory the emulated device pretends to have.
const EMULATED_MEMORY: u64 = 8 << 30;

/// The scheduling bits of a context's flags.
const SCHED_MASK: u32 = sys::CUctx_flags::CU_CTX_SCHED_MASK as u32;

/// The scheduling flag `GPQ_CUDA_WAIT` asks for, if it is set (and valid).
fn wait_flags() -> Option<u32> {
    use crate::env::CudaWait;
    use sys::CUctx_flags::*;
    let wait = crate::env::cuda_wait().unwrap_or_else(|e| {
        tracing::warn!("{e}; the context's way of waiting for the GPU is left as it is");
        None
    })?;
    Some(match wait {
        CudaWait::Auto => CU_CTX_SCHED_AUTO,
        CudaWait::Spin => CU_CTX_SCHED_SPIN,
        CudaWait::Yield => CU_CTX_SCHED_YIELD,
        CudaWait::Blocking => CU_CTX_SCHED_BLOCKING_SYNC,
    } as u32)
}

/// Loads the driver library and initialises it once; returns the device count.
fn driver() -> Result<i32> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: probing for the library has no preconditions.
            if !unsafe { sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda.so) is not installed or not on the library path".into());
            }
            // SAFETY: cuInit may be called any number of times.
            let r = unsafe { sys::cuInit(0) };
            check("cuInit", r).map_err(|e| e.to_string())?;
            let mut n = 0;
            // SAFETY: n is a valid out pointer.
            check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) }).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the driver found no CUDA device".into());
            }
            Ok(n)
        })
        .clone()
        .map_err(|reason| Error::NoCudaDevice { reason })
}

/// Whether a real CUDA device can be used, without creating a context.
pub fn device_available() -> bool {
    driver().is_ok()
}

/// How many CUDA devices the driver sees (1 on the CPU emulator).
pub fn device_count() -> Result<usize> {
    if emulation_requested() {
        return Ok(1);
    }
    driver().map(|n| n as usize)
}

/// Whether this build carries the CPU emulator.
pub fn emulator_compiled() -> bool {
    cfg!(feature = "emulator")
}

/// Routes every later [`GpuContext::get`] in this process to the CPU emulator
/// (also enabled by `GPQ_EMULATE=1`). Fails without the `emulator` feature.
pub fn use_emulator() -> Result<()> {
    if !emulator_compiled() {
        return Err(Error::NoCudaDevice { reason: "gpq was built without the `emulator` feature".into() });
    }
    EMULATE.store(true, Ordering::SeqCst);
    Ok(())
}

fn emulation_requested() -> bool {
    EMULATE.load(Ordering::SeqCst) || (emulator_compiled() && crate::env::emulate())
}

impl GpuContext {
    /// The context of device `ordinal`, created on first use.
    pub fn get(ordinal: usize) -> Result<Arc<GpuContext>> {
        Self::get_timed(ordinal).map(|(ctx, _)| ctx)
    }

    /// Like [`GpuContext::get`], with the time spent creating the context
    /// (the driver's initialisation included): zero when it existed.
    pub fn get_timed(ordinal: usize) -> Result<(Arc<GpuContext>, Duration)> {
        let t = Instant::now();
        if emulation_requested() {
            return Self::emulated().map(|ctx| (ctx, Duration::ZERO));
        }
        let count = driver()?;
        if ordinal >= count as usize {
            return Err(Error::NoCudaDevice { reason: format!("device {ordinal} requested, {count} present") });
        }
        let map = CONTEXTS.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ctx) = map.get(&ordinal) {
            if !ctx.is_lost() {
                ctx.bind()?;
                return Ok((ctx.clone(), Duration::ZERO));
            }
            map.remove(&ordinal);
        }
        let ctx = Arc::new(Self::create(ordinal)?);
        map.insert(ordinal, ctx.clone());
        Ok((ctx, t.elapsed()))
    }

    /// The CPU emulator as a device (needs the `emulator` feature).
    pub fn emulated() -> Result<Arc<GpuContext>> {
        if !emulator_compiled() {
            return Err(Error::NoCudaDevice { reason: "gpq was built without the `emulator` feature".into() });
        }
        Ok(EMULATED
            .get_or_init(|| {
                Arc::new(GpuContext {
                    ordinal: 0,
                    device: 0,
                    owned: false,
                    generation: 0,
                    lost: AtomicBool::new(false),
                live_bytes: AtomicU64::new(0),
                    backend: Backend::Emulated,
                    name: "gpq CPU emulator".into(),
                    compute_capability: (9, 0),
                    sm_count: 4,
                    total_memory: EMULATED_MEMORY,
                })
            })
            .clone())
    }

    fn create(ordinal: usize) -> Result<GpuContext> {
        // SAFETY: out pointers are valid; the driver is initialised.
        unsafe {
            let mut dev = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
            let mut ctx = std::ptr::null_mut();
            let owned = primary_wedged(ordinal);
            let wait = wait_flags();
            if owned {
                check("cuCtxCreate", sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), wait.unwrap_or(0), dev))?;
            } else {
                // Applied each time the context is taken, so also after a reset of a lost one.
                if let Some(wait) = wait {
                    let (mut flags, mut active) = (0u32, 0i32);
                    check("cuDevicePrimaryCtxGetState", sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active))?;
                    if flags & SCHED_MASK != wait {
                        let r = sys::cuDevicePrimaryCtxSetFlags_v2(dev, (flags & !SCHED_MASK) | wait);
                        if let Err(e) = check("cuDevicePrimaryCtxSetFlags", r) {
                            tracing::warn!(device = ordinal, active, "GPQ_CUDA_WAIT not applied: {e}");
                        }
                    }
                }
                check("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
            }
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
                let mut v = 0;
                check("cuDeviceGetAttribute", sys::cuDeviceGetAttribute(&mut v, a, dev))?;
                Ok(v)
            };
            use sys::CUdevice_attribute::*;
            let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let mut total = 0usize;
            check("cuDeviceTotalMem", sys::cuDeviceTotalMem_v2(&mut total, dev))?;
            let mut name_buf = [0i8; 256];
            check("cuDeviceGetName", sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, dev))?;
            let name = std::ffi::CStr::from_ptr(name_buf.as_ptr()).to_string_lossy().into_owned();

            // Keep freed memory in the pool: reads allocate gigabytes and give
            // them back, and going to the driver each time costs milliseconds.
            // But not without bound: what a read freed beyond the threshold
            // goes back to the driver (and to other processes).
            let mut pool = std::ptr::null_mut();
            check("cuDeviceGetDefaultMemPool", sys::cuDeviceGetDefaultMemPool(&mut pool, dev))?;
            let mut threshold: u64 = total as u64 / POOL_KEEP_FRACTION;
            check(
                "cuMemPoolSetAttribute",
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
            )?;
            info!(device = ordinal, %name, cc = format!("{major}.{minor}"), sm_count, total, sched_flags = ?wait, "CUDA device ready");
            Ok(GpuContext {
                ordinal,
                device: dev,
                owned,
                generation: GENERATION.fetch_add(1, Ordering::Relaxed) + 1,
                lost: AtomicBool::new(false),
                live_bytes: AtomicU64::new(0),
                backend: Backend::Cuda { ctx, pool },
                name,
                compute_capability: (major, minor),
                sm_count,
                total_memory: total as u64,
            })
        }
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whether this is the CPU emulator rather than a GPU.
    pub fn is_emulated(&self) -> bool {
        matches!(self.backend, Backend::Emulated)
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        match self.backend {
            // SAFETY: the context is retained for the life of the process.
            Backend::Cuda { ctx, .. } => check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) }),
            Backend::Emulated => Ok(()),
        }
    }

    /// Makes this context current on the calling thread until the guard
    /// drops, then the one that was current before: for threads gpq does not
    /// own (a consumer's release callback, a Python caller), whose current
    /// context belongs to their own CUDA code.
    pub fn bind_scoped(&self) -> Result<BoundContext> {
        match self.backend {
            Backend::Cuda { ctx, .. } => {
                let mut previous = std::ptr::null_mut();
                // SAFETY: valid out pointer.
                check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut previous) })?;
                if previous == ctx {
                    return Ok(BoundContext { previous: None });
                }
                // SAFETY: the context is retained for the life of the process.
                check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
                Ok(BoundContext { previous: Some(previous) })
            }
            Backend::Emulated => Ok(BoundContext { previous: None }),
        }
    }

    /// Waits for all work queued in the context: gpq's, and that of any
    /// other library using it (the consumers of exported columns).
    pub fn synchronize(&self) -> Result<()> {
        if self.is_emulated() || self.is_lost() {
            return Ok(());
        }
        let _bound = self.bind_scoped()?;
        // SAFETY: the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        if self.is_emulated() {
            return Ok((self.total_memory, self.total_memory));
        }
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out pointers; context is current.
        check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// Whether this context was lost (and the device reset): its memory,
    /// streams and modules are gone, and [`GpuContext::get`] hands out a
    /// fresh context instead.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Declares the context lost after `call` failed with an error that
    /// poisons it, or after a kernel never finished (`hung`), and returns
    /// the error to report; [`GpuContext::get`] then hands out a fresh
    /// context. A poisoned context is destroyed (the primary one reset),
    /// which frees its memory. A context with a kernel that never finishes
    /// cannot be: destroying it waits for the kernel. It is left to the
    /// driver (the kernel keeps a share of the GPU until the process ends)
    /// and later reads on the device run in a context gpq creates. Objects
    /// of the lost context stay safe to drop.
    pub fn lose(&self, call: &'static str, detail: impl Into<String>, hung: bool) -> Error {
        let detail = detail.into();
        let recovered = match self.backend {
            Backend::Emulated => true,
            Backend::Cuda { ctx, .. } => {
                if self.lost.swap(true, Ordering::SeqCst) {
                    true
                } else {
                    if let Some(map) = CONTEXTS.get() {
                        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                        if map.get(&self.ordinal).is_some_and(|c| c.generation == self.generation) {
                            map.remove(&self.ordinal);
                        }
                    }
                    if hung {
                        if !self.owned {
                            WEDGED.lock().unwrap_or_else(|p| p.into_inner()).push(self.ordinal);
                        }
                        error!(device = self.ordinal, call, %detail, "a kernel never finished; the device gets a fresh context");
                        true
                    } else {
                        // SAFETY: every handle of this context is treated as dead
                        // from here on (drops skip them).
                        let r = unsafe {
                            if self.owned { sys::cuCtxDestroy_v2(ctx) } else { sys::cuDevicePrimaryCtxReset_v2(self.device) }
                        };
                        // Whether a context can be had again: on the H200 with
                        // driver 580 an illegal address stays sticky for the
                        // process even after the reset.
                        let usable = r == sys::CUresult::CUDA_SUCCESS && self.probe_new_context();
                        error!(device = self.ordinal, call, %detail, reset = ?r, usable, "GPU context lost; context destroyed");
                        usable
                    }
                }
            }
        };
        Error::GpuContextLost { device: self.ordinal, call, detail, recovered }
    }

    /// Whether a context of this device can be created now (made and released again).
    fn probe_new_context(&self) -> bool {
        let mut c = std::ptr::null_mut();
        // SAFETY: retains and releases the primary context of a valid device.
        unsafe {
            if sys::cuDevicePrimaryCtxRetain(&mut c, self.device) != sys::CUresult::CUDA_SUCCESS {
                return false;
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
        true
    }

    /// Bytes of gpq's device buffers alive now on this device (read
    /// results, exports not yet released by their consumers, buffers of
    /// reads in flight), as gpq counts its allocations and frees. Memory the
    /// pool keeps for reuse after a free is not counted.
    pub fn live_buffer_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// Returns the pool's unused memory to the driver (after a failed read,
    /// so that it leaves device memory as it found it).
    pub fn trim_pool(&self) {
        if let Backend::Cuda { pool, .. } = self.backend {
            if self.is_lost() || self.bind().is_err() {
                return;
            }
            // SAFETY: the pool belongs to this live context.
            unsafe {
                sys::cuMemPoolTrimTo(pool, 0);
            }
        }
    }

    /// Creates a new non-blocking stream.
    pub fn new_stream(self: &Arc<Self>) -> Result<Arc<GpuStream>> {
        self.new_stream_with_budget(None)
    }

    /// Creates a new non-blocking stream whose allocations are charged to `budget`.
    pub fn new_stream_with_budget(self: &Arc<Self>, budget: Option<Arc<MemoryBudget>>) -> Result<Arc<GpuStream>> {
        if self.is_emulated() {
            return Ok(Arc::new(GpuStream { stream: std::ptr::null_mut(), ctx: self.clone(), budget }));
        }
        self.bind()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out pointer; context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Arc::new(GpuStream { stream: s, ctx: self.clone(), budget }))
    }

    /// Identifies the context among all of the process. Stages key their
    /// per-device state by it.
    pub fn key(&self) -> ContextKey {
        (self.ordinal, self.is_emulated(), self.generation)
    }

    /// Architecture name for NVRTC, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .field("sm_count", &self.sm_count)
            .finish()
    }
}

/// The context that was current on a thread before
/// [`GpuContext::bind_scoped`]; made current again when this drops.
#[must_use = "the previous context is restored when the guard drops"]
pub struct BoundContext {
    previous: Option<sys::CUcontext>,
}

impl Drop for BoundContext {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: restores what the driver reported as current (possibly none).
            unsafe {
                sys::cuCtxSetCurrent(previous);
            }
        }
    }
}

/// Runs `f`, then makes the CUDA context that was current on the calling
/// thread before it current again. gpq binds its context to the threads it
/// reads on; a caller that shares its thread with other CUDA code (Python,
/// with CuPy or PyTorch; a host application) wraps its calls in this so
/// that their current device does not change under them.
pub fn keeping_current_context<T>(f: impl FnOnce() -> T) -> T {
    let previous = driver().ok().and_then(|_| {
        let mut c = std::ptr::null_mut();
        // SAFETY: valid out pointer; the driver is initialised.
        (unsafe { sys::cuCtxGetCurrent(&mut c) } == sys::CUresult::CUDA_SUCCESS).then_some(c)
    });
    let out = f();
    if let Some(c) = previous {
        // SAFETY: restores what the driver reported as current (possibly none).
        unsafe {
            sys::cuCtxSetCurrent(c);
        }
    }
    out
}

/// A CUDA stream, destroyed when the last reference goes.
pub struct GpuStream {
    stream: sys::CUstream,
    ctx: Arc<GpuContext>,
    budget: Option<Arc<MemoryBudget>>,
}

// A stream handle may be used from any thread with the context current.
unsafe impl Send for GpuStream {}
unsafe impl Sync for GpuStream {}

impl GpuStream {
    /// The raw handle (null on the emulator).
    pub fn raw(&self) -> sys::CUstream {
        self.stream
    }

    /// The owning context.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The memory budget its allocations are charged to, if any.
    pub fn budget(&self) -> Option<&Arc<MemoryBudget>> {
        self.budget.as_ref()
    }

    /// Waits for the stream like [`GpuStream::synchronize`], but at most
    /// `limit`: work still running then (a kernel that never finishes on
    /// corrupt input) cannot be cancelled, so the context is declared lost
    /// and a fresh context used from then on ([`GpuContext::lose`]).
    pub fn synchronize_within(&self, limit: Duration, what: &str) -> Result<()> {
        if self.ctx.is_emulated() {
            return Ok(());
        }
        self.ctx.bind()?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: the stream is alive.
            let r = unsafe { sys::cuStreamQuery(self.stream) };
            if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                return check("cuStreamQuery", r);
            }
            if start.elapsed() > limit {
                return Err(self.ctx.lose(
                    DEADLINE,
                    format!("{what} did not finish within {:.1} s", limit.as_secs_f64()),
                    true,
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Blocks until all work queued on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        if self.ctx.is_emulated() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the stream is alive.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }

    /// Records an event on this stream and returns it.
    pub fn record_event(&self) -> Result<GpuEvent> {
        let ev = GpuEvent::new(&self.ctx, true)?;
        ev.record(self)?;
        Ok(ev)
    }

    /// Makes this stream wait for `event`.
    pub fn wait(&self, event: &GpuEvent) -> Result<()> {
        match event.raw {
            EventRaw::Cuda(e) => {
                // SAFETY: both handles are alive.
                check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, e, 0) })
            }
            EventRaw::Emulated(_) => Ok(()),
        }
    }

    /// Queues a copy of `len` bytes from host memory `src` to device address `dst`.
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until the copy completes (for
    /// pinned memory: until the stream passes this point); `dst..dst+len` must
    /// lie in one live device allocation.
    pub unsafe fn copy_htod_async(&self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.ctx.is_emulated() {
            // SAFETY: delegated to the caller; emulated device memory is host memory.
            unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) };
            return Ok(());
        }
        // SAFETY: delegated to the caller.
        check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.stream) })
    }
}

impl Drop for GpuStream {
    fn drop(&mut self) {
        if self.ctx.is_emulated() || self.ctx.is_lost() {
            return;
        }
        let _bound = self.ctx.bind_scoped();
        // SAFETY: the stream is not used after this; pending work completes first.
        unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

enum EventRaw {
    Cuda(sys::CUevent),
    Emulated(Mutex<Option<Instant>>),
}

/// A CUDA event.
pub struct GpuEvent {
    raw: EventRaw,
    ctx: Arc<GpuContext>,
}

unsafe impl Send for GpuEvent {}
unsafe impl Sync for GpuEvent {}

impl GpuEvent {
    /// Creates an event; `timing` enables elapsed-time queries.
    pub fn new(ctx: &Arc<GpuContext>, timing: bool) -> Result<GpuEvent> {
        if ctx.is_emulated() {
            return Ok(GpuEvent { raw: EventRaw::Emulated(Mutex::new(None)), ctx: ctx.clone() });
        }
        ctx.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut raw, flags as u32) })?;
        Ok(GpuEvent { raw: EventRaw::Cuda(raw), ctx: ctx.clone() })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &GpuStream) -> Result<()> {
        match &self.raw {
            // SAFETY: both handles are alive.
            EventRaw::Cuda(e) => check("cuEventRecord", unsafe { sys::cuEventRecord(*e, stream.raw()) }),
            EventRaw::Emulated(t) => {
                *t.lock().unwrap() = Some(Instant::now());
                Ok(())
            }
        }
    }

    /// The address of the driver's handle of the event (a `CUevent*`, which
    /// is what the Arrow C Device Data Interface's `sync_event` and DLPack
    /// consumers expect); `None` on the emulator. Valid while the event
    /// stays where it is (keep it boxed or behind an `Arc`).
    pub fn handle_ptr(&self) -> Option<*const std::ffi::c_void> {
        match &self.raw {
            EventRaw::Cuda(e) => Some((e as *const sys::CUevent).cast()),
            EventRaw::Emulated(_) => None,
        }
    }

    /// Blocks until the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        match &self.raw {
            // SAFETY: the event is alive.
            EventRaw::Cuda(e) => check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(*e) }),
            EventRaw::Emulated(_) => Ok(()),
        }
    }

    /// Milliseconds between `start` and this event (both completed).
    pub fn elapsed_ms_since(&self, start: &GpuEvent) -> Result<f32> {
        match (&self.raw, &start.raw) {
            (EventRaw::Cuda(end), EventRaw::Cuda(begin)) => {
                let mut ms = 0f32;
                // SAFETY: both events were recorded with timing enabled.
                check("cuEventElapsedTime", unsafe { sys::cuEventElapsedTime_v2(&mut ms, *begin, *end) })?;
                Ok(ms)
            }
            (EventRaw::Emulated(end), EventRaw::Emulated(begin)) => {
                let (e, b) = (*end.lock().unwrap(), *begin.lock().unwrap());
                Ok(match (e, b) {
                    (Some(e), Some(b)) => e.saturating_duration_since(b).as_secs_f32() * 1e3,
                    _ => 0.0,
                })
            }
            _ => Err(Error::BackendMismatch { what: "elapsed time between events" }),
        }
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        if let EventRaw::Cuda(e) = self.raw {
            if self.ctx.is_lost() {
                return;
            }
            // SAFETY: not used after this.
            unsafe {
                sys::cuEventDestroy_v2(e);
            }
        }
    }
}
