//! Device buffers (stream-ordered pool allocations, or plain `cuMemAlloc`
//! where a buffer must be registered with cuFile) and pinned host buffers.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys;

use super::check;
use super::context::{Backend, GpuContext, GpuStream};
use crate::error::{Error, Result};

enum Alloc {
    /// From the device's memory pool, ordered on a stream.
    Pool(Arc<GpuStream>),
    /// Host memory standing in for device memory on the emulator.
    Emulated,
    /// `cuMemAlloc`: needed for cuFile buffer registration.
    Plain,
    /// Zero bytes: no allocation.
    Empty,
}

/// A device allocation, freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: u64,
    alloc: Alloc,
    ctx: Arc<GpuContext>,
    budget: Option<Arc<MemoryBudget>>,
}

/// The device memory one read may hold at once. Buffers allocated on a
/// stream that carries a budget are charged to it until they are dropped; a
/// request that would exceed it fails with [`Error::OverBudget`] before the
/// driver is asked.
#[derive(Debug)]
pub struct MemoryBudget {
    file: PathBuf,
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes for reading `file` (named in errors).
    pub fn new(file: impl Into<PathBuf>, limit: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget { file: file.into(), limit, used: AtomicU64::new(0), peak: AtomicU64::new(0) })
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The most bytes charged at once so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Charges `len` more bytes, or fails (charging nothing) when they do not fit.
    fn charge(&self, len: u64, what: &str) -> Result<()> {
        let mut used = self.used();
        loop {
            let total = used.checked_add(len).filter(|t| *t <= self.limit).ok_or_else(|| Error::OverBudget {
                file: self.file.clone(),
                what: what.to_string(),
                requested: used.saturating_add(len),
                budget: self.limit,
            })?;
            match self.used.compare_exchange_weak(used, total, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(total, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, len: u64) {
        self.used.fetch_sub(len, Ordering::Relaxed);
    }
}

// Device pointers may be used from any thread with the context current.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

fn out_of_memory(ctx: &GpuContext, requested: u64, what: &'static str) -> Error {
    let (free, total) = ctx.memory_info().unwrap_or((0, ctx.total_memory));
    Error::OutOfDeviceMemory { requested, free, total, what }
}

impl DeviceBuffer {
    /// Stops charging this buffer to the budget it was allocated under (a
    /// batch handed to the caller is the caller's memory, not the read's).
    pub(crate) fn detach_budget(&mut self) {
        if let Some(b) = self.budget.take() {
            b.release(self.len);
        }
    }

    /// Allocates `len` bytes from the pool, ordered on `stream`. The memory is
    /// usable by work queued on `stream` at once, and by other streams once
    /// they wait for it (or `stream` is synchronized). A budget the stream
    /// carries is charged before the driver is asked, until the buffer drops.
    pub fn alloc(stream: &Arc<GpuStream>, len: u64, what: &'static str) -> Result<DeviceBuffer> {
        Self::charged(stream, len, what, || Self::alloc_from_pool(stream, len, what))
    }

    /// Charges `len` bytes to `stream`'s budget (if any), then allocates
    /// with `alloc`; the buffer carries the charge until it drops, and a
    /// failed allocation gives it back.
    fn charged(
        stream: &Arc<GpuStream>,
        len: u64,
        what: &'static str,
        alloc: impl FnOnce() -> Result<DeviceBuffer>,
    ) -> Result<DeviceBuffer> {
        let budget = stream.budget().filter(|_| len > 0);
        if let Some(b) = budget {
            b.charge(len, what)?;
        }
        match alloc() {
            Ok(mut buf) => {
                buf.budget = budget.cloned();
                Ok(buf)
            }
            Err(e) => {
                if let Some(b) = budget {
                    b.release(len);
                }
                Err(e)
            }
        }
    }

    fn alloc_from_pool(stream: &Arc<GpuStream>, len: u64, what: &'static str) -> Result<DeviceBuffer> {
        let ctx = stream.context().clone();
        if len == 0 {
            return Ok(DeviceBuffer { ptr: 0, len: 0, alloc: Alloc::Empty, ctx, budget: None });
        }
        let pool = match ctx.backend {
            Backend::Cuda { pool, .. } => pool,
            Backend::Emulated => return emulated_alloc(&ctx, len, what),
        };
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: valid out pointer; pool and stream belong to this context.
        let r = unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, len as usize, pool, stream.raw()) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(out_of_memory(&ctx, len, what));
        }
        check("cuMemAllocFromPoolAsync", r)?;
        ctx.live_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(DeviceBuffer { ptr, len, alloc: Alloc::Pool(stream.clone()), ctx, budget: None })
    }

    /// Allocates `len` bytes with `cuMemAlloc` (synchronous, registrable with cuFile).
    pub fn alloc_plain(ctx: &Arc<GpuContext>, len: u64, what: &'static str) -> Result<DeviceBuffer> {
        if len == 0 {
            return Ok(DeviceBuffer { ptr: 0, len: 0, alloc: Alloc::Empty, ctx: ctx.clone(), budget: None });
        }
        if ctx.is_emulated() {
            return emulated_alloc(ctx, len, what);
        }
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: valid out pointer; context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, len as usize) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(out_of_memory(ctx, len, what));
        }
        check("cuMemAlloc", r)?;
        ctx.live_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(DeviceBuffer { ptr, len, alloc: Alloc::Plain, ctx: ctx.clone(), budget: None })
    }

    /// [`Self::alloc_plain`] charged to the budget `stream` carries, if any.
    pub fn alloc_plain_for(stream: &Arc<GpuStream>, len: u64, what: &'static str) -> Result<DeviceBuffer> {
        Self::charged(stream, len, what, || Self::alloc_plain(stream.context(), len, what))
    }

    /// Allocates and copies `data` in, ordered on `stream` (synchronous with respect to `data`).
    pub fn from_host(stream: &Arc<GpuStream>, data: &[u8], what: &'static str) -> Result<DeviceBuffer> {
        let buf = Self::alloc(stream, data.len() as u64, what)?;
        // SAFETY: buf holds data.len() bytes; the stream is synchronized before `data` may go away.
        unsafe { stream.copy_htod_async(buf.ptr, data.as_ptr(), data.len())? };
        stream.synchronize()?;
        Ok(buf)
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The owning context.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Copies `len` bytes starting at `offset` to a new host vector (waits for the copy).
    pub fn copy_range_to_host(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len as usize];
        self.copy_range_into(offset, &mut out)?;
        Ok(out)
    }

    /// Copies `out.len()` bytes starting at `offset` into `out` (waits for the copy).
    pub fn copy_range_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::Internal(format!(
                "copy of {len} bytes at {offset} is outside a device buffer of {} bytes",
                self.len
            )));
        }
        if len == 0 {
            return Ok(());
        }
        if let Alloc::Emulated = self.alloc {
            // SAFETY: range checked above; emulated device memory is host memory.
            unsafe { std::ptr::copy_nonoverlapping((self.ptr + offset) as *const u8, out.as_mut_ptr(), out.len()) };
            return Ok(());
        }
        self.ctx.bind()?;
        if let Alloc::Pool(s) = &self.alloc {
            s.synchronize()?;
        }
        // SAFETY: range checked above; synchronous copy into `out`.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset, len as usize)
        })
    }

    /// Queues a copy of `len` bytes at `offset` into host memory at `dst`,
    /// ordered after the work of the stream the buffer was allocated on, and
    /// returns that stream (wait on it before reading `dst`). Buffers not
    /// tied to a stream are copied at once and `None` is returned.
    ///
    /// # Safety
    /// `dst..dst+len` must be writable host memory that stays valid, and is
    /// not read, until the returned stream is synchronized; for the copy to
    /// be asynchronous it must be pinned.
    pub unsafe fn copy_range_to_host_async(&self, offset: u64, dst: *mut u8, len: usize) -> Result<Option<Arc<GpuStream>>> {
        if offset.checked_add(len as u64).is_none_or(|end| end > self.len) {
            return Err(Error::Internal(format!(
                "copy of {len} bytes at {offset} is outside a device buffer of {} bytes",
                self.len
            )));
        }
        if len == 0 {
            return Ok(None);
        }
        match &self.alloc {
            Alloc::Pool(stream) => {
                self.ctx.bind()?;
                // SAFETY: range checked above; `dst` is the caller's promise.
                check("cuMemcpyDtoHAsync", unsafe {
                    sys::cuMemcpyDtoHAsync_v2(dst.cast(), self.ptr + offset, len, stream.raw())
                })?;
                Ok(Some(stream.clone()))
            }
            _ => {
                // SAFETY: `dst` holds `len` writable bytes (the caller's promise).
                self.copy_range_into(offset, unsafe { std::slice::from_raw_parts_mut(dst, len) })?;
                Ok(None)
            }
        }
    }

    /// Copies the whole buffer to the host.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        self.copy_range_to_host(0, self.len)
    }

    /// Sets every byte to `value`, ordered on `stream`.
    pub fn fill(&self, stream: &GpuStream, value: u8) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        if let Alloc::Emulated = self.alloc {
            // SAFETY: the buffer is alive; the memset stays inside it.
            unsafe { std::ptr::write_bytes(self.ptr as *mut u8, value, self.len as usize) };
            return Ok(());
        }
        // SAFETY: the buffer is alive; the memset stays inside it.
        check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(self.ptr, value, self.len as usize, stream.raw()) })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.len);
        }
        if !matches!(self.alloc, Alloc::Empty) {
            self.ctx.live_bytes.fetch_sub(self.len, Ordering::Relaxed);
        }
        if self.ctx.is_lost() {
            // The context's reset freed the memory with everything else.
            return;
        }
        // Buffers drop on any thread (a consumer's release of an export): its
        // current context is put back afterwards.
        let _bound = self.ctx.bind_scoped();
        // SAFETY: the pointer came from the matching allocator and is not used again.
        unsafe {
            match &self.alloc {
                Alloc::Pool(stream) => {
                    sys::cuMemFreeAsync(self.ptr, stream.raw());
                }
                Alloc::Plain => {
                    sys::cuMemFree_v2(self.ptr);
                }
                Alloc::Emulated => std::alloc::dealloc(self.ptr as *mut u8, emulated_layout(self.len as usize)),
                Alloc::Empty => {}
            }
        }
    }
}

fn emulated_layout(len: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(len.max(1), 4096).expect("valid layout")
}

fn emulated_alloc(ctx: &Arc<GpuContext>, len: u64, what: &'static str) -> Result<DeviceBuffer> {
    if len > ctx.total_memory {
        return Err(out_of_memory(ctx, len, what));
    }
    // SAFETY: non-zero size; freed with the same layout on drop.
    let p = unsafe { std::alloc::alloc(emulated_layout(len as usize)) };
    if p.is_null() {
        return Err(out_of_memory(ctx, len, what));
    }
    ctx.live_bytes.fetch_add(len, Ordering::Relaxed);
    Ok(DeviceBuffer { ptr: p as u64, len, alloc: Alloc::Emulated, ctx: ctx.clone(), budget: None })
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.len)
    }
}

/// Page-locked host memory, so copies to the device run by DMA at full speed.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<GpuContext>,
}

unsafe impl Send for PinnedBuffer {}
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of pinned memory (page-aligned).
    pub fn new(ctx: &Arc<GpuContext>, len: usize) -> Result<PinnedBuffer> {
        if ctx.is_emulated() {
            // SAFETY: non-zero size; freed with the same layout on drop.
            let p = unsafe { std::alloc::alloc(emulated_layout(len)) };
            if p.is_null() {
                return Err(Error::OutOfHostMemory { requested: len as u64, what: "pinned buffer" });
            }
            return Ok(PinnedBuffer { ptr: p, len, ctx: ctx.clone() });
        }
        ctx.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out pointer; portable so any context may use it.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfHostMemory { requested: len as u64, what: "pinned buffer" });
        }
        check("cuMemHostAlloc", r)?;
        Ok(PinnedBuffer { ptr: p.cast(), len, ctx: ctx.clone() })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer to the first byte.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: we own `len` bytes at `ptr`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: we own `len` bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.is_emulated() {
            // SAFETY: allocated with this layout in `new`.
            unsafe { std::alloc::dealloc(self.ptr, emulated_layout(self.len)) };
            return;
        }
        if self.ctx.is_lost() {
            return;
        }
        let _ = self.ctx.bind();
        // SAFETY: allocated by cuMemHostAlloc and not used again.
        unsafe {
            sys::cuMemFreeHost(self.ptr.cast());
        }
    }
}

/// Views a slice of plain-old-data values (no padding bytes) as bytes, for
/// copies to the device.
pub(crate) fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: callers pass integers or repr(C) descriptors with explicit
    // padding fields, so every byte is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Reads plain-old-data values back from bytes copied off the device; a
/// trailing partial value is ignored.
pub(crate) fn from_bytes<T: Copy + Default>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut out = vec![T::default(); n];
    // SAFETY: T is plain old data; the copy stays within both buffers.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) };
    out
}
