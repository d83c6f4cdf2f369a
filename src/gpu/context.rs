//! One [`GpuContext`] per device and process: the primary context, device
//! properties, the stream-ordered memory pool, the compiled kernels and the
//! pinned staging buffers the bounce IO path reuses between reads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use tracing::{debug, info};

use super::check;
use super::kernels::Kernels;
use crate::error::{Error, Result};

/// A CUDA device with its primary context.
pub struct GpuContext {
    ordinal: usize,
    ctx: sys::CUcontext,
    pool: sys::CUmemoryPool,
    /// Device name as the driver reports it.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sm_count: i32,
    /// Total device memory in bytes.
    pub total_memory: u64,
    kernels: OnceLock<Result<Arc<Kernels>, String>>,
    pub(crate) staging: Mutex<Vec<crate::io::bounce::StagingSlot>>,
}

// The context handle and pool are process-wide driver objects that may be used
// from any thread once made current there (which `bind` does).
unsafe impl Send for GpuContext {}
unsafe impl Sync for GpuContext {}

static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<GpuContext>>>> = OnceLock::new();
static DRIVER: OnceLock<Result<i32, String>> = OnceLock::new();

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

/// Whether a CUDA device can be used, without creating a context.
pub fn device_available() -> bool {
    driver().is_ok()
}

impl GpuContext {
    /// The context of device `ordinal`, created on first use.
    pub fn get(ordinal: usize) -> Result<Arc<GpuContext>> {
        let count = driver()?;
        if ordinal >= count as usize {
            return Err(Error::NoCudaDevice { reason: format!("device {ordinal} requested, {count} present") });
        }
        let map = CONTEXTS.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ctx) = map.get(&ordinal) {
            ctx.bind()?;
            return Ok(ctx.clone());
        }
        let ctx = Arc::new(Self::create(ordinal)?);
        map.insert(ordinal, ctx.clone());
        Ok(ctx)
    }

    fn create(ordinal: usize) -> Result<GpuContext> {
        // SAFETY: out pointers are valid; the driver is initialised.
        unsafe {
            let mut dev = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
            let mut ctx = std::ptr::null_mut();
            check("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
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
            let mut pool = std::ptr::null_mut();
            check("cuDeviceGetDefaultMemPool", sys::cuDeviceGetDefaultMemPool(&mut pool, dev))?;
            let mut threshold: u64 = u64::MAX;
            check(
                "cuMemPoolSetAttribute",
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
            )?;
            info!(device = ordinal, %name, cc = format!("{major}.{minor}"), sm_count, total, "CUDA device ready");
            Ok(GpuContext {
                ordinal,
                ctx,
                pool,
                name,
                compute_capability: (major, minor),
                sm_count,
                total_memory: total as u64,
                kernels: OnceLock::new(),
                staging: Mutex::new(Vec::new()),
            })
        }
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of the process.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    pub(crate) fn pool(&self) -> sys::CUmemoryPool {
        self.pool
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out pointers; context is current.
        check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// Creates a new non-blocking stream.
    pub fn new_stream(self: &Arc<Self>) -> Result<Arc<GpuStream>> {
        self.bind()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out pointer; context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Arc::new(GpuStream { stream: s, ctx: self.clone() }))
    }

    /// The compiled kernels, built (or loaded from the disk cache) on first use.
    pub fn kernels(&self) -> Result<Arc<Kernels>> {
        self.bind()?;
        self.kernels
            .get_or_init(|| {
                let t = std::time::Instant::now();
                let k = Kernels::load(self.compute_capability).map(Arc::new).map_err(|e| e.to_string());
                debug!(elapsed_ms = t.elapsed().as_secs_f64() * 1e3, ok = k.is_ok(), "kernels loaded");
                k
            })
            .clone()
            .map_err(|log| Error::Kernel { stage: "load", log })
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

/// A CUDA stream, destroyed when the last reference goes.
pub struct GpuStream {
    stream: sys::CUstream,
    ctx: Arc<GpuContext>,
}

// A stream handle may be used from any thread with the context current.
unsafe impl Send for GpuStream {}
unsafe impl Sync for GpuStream {}

impl GpuStream {
    /// The raw handle.
    pub fn raw(&self) -> sys::CUstream {
        self.stream
    }

    /// The owning context.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Blocks until all work queued on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
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
        // SAFETY: both handles are alive.
        check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, event.raw, 0) })
    }
}

impl Drop for GpuStream {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: the stream is not used after this; pending work completes first.
        unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

/// A CUDA event.
pub struct GpuEvent {
    raw: sys::CUevent,
    _ctx: Arc<GpuContext>,
}

unsafe impl Send for GpuEvent {}
unsafe impl Sync for GpuEvent {}

impl GpuEvent {
    /// Creates an event; `timing` enables elapsed-time queries.
    pub fn new(ctx: &Arc<GpuContext>, timing: bool) -> Result<GpuEvent> {
        ctx.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut raw, flags as u32) })?;
        Ok(GpuEvent { raw, _ctx: ctx.clone() })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &GpuStream) -> Result<()> {
        // SAFETY: both handles are alive.
        check("cuEventRecord", unsafe { sys::cuEventRecord(self.raw, stream.raw()) })
    }

    /// Blocks until the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is alive.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(self.raw) })
    }

    /// Milliseconds between `start` and this event (both completed).
    pub fn elapsed_ms_since(&self, start: &GpuEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both events were recorded with timing enabled.
        check("cuEventElapsedTime", unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw) })?;
        Ok(ms)
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        // SAFETY: not used after this.
        unsafe {
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}
