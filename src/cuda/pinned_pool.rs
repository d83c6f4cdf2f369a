//! A per-device pool of page-locked host slabs.
//!
//! Page-locking memory costs far more than a copy of a few megabytes, so
//! copies between host and device that want DMA speed lease a slab from the
//! device's [`PinnedHostPool`] and give it back when done: the decoded
//! columns' copies to the host (`crate::arrow`) and the CPU decompression of
//! small batches (`crate::decode`), both of which would otherwise go through
//! fresh pageable memory, zeroed and faulted in page by page and staged by
//! the driver. The pool holds at most `GPQ_PINNED_HOST_BYTES` bytes
//! (default: a quarter of the host's memory, at most 16 GiB; `0` turns
//! pinned copies off); a lease it cannot grant is `None`, and the caller
//! goes through pageable memory.

use std::collections::HashMap;
use std::panic::RefUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::{debug, warn};

use super::{ContextKey, GpuContext, PinnedBuffer};

/// Slabs are sized in multiples of this, so tables of similar size share them.
const SLAB_GRANULE: usize = 32 << 20;
/// Upper bound of the default pool size.
const DEFAULT_CAP_LIMIT: u64 = 16 << 30;

/// Page-locked host slabs of one device, reused across copies.
pub struct PinnedHostPool {
    ctx: Arc<GpuContext>,
    capacity: u64,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<PinnedBuffer>,
    /// Bytes of all slabs, idle and leased.
    allocated: u64,
    warned: bool,
}

impl std::fmt::Debug for PinnedHostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostPool")
            .field("device", &self.ctx.ordinal())
            .field("capacity", &self.capacity)
            .field("allocated", &self.allocated())
            .finish()
    }
}

/// The pool size from `GPQ_PINNED_HOST_BYTES`, else the default.
fn configured_capacity() -> u64 {
    if let Some(bytes) = crate::env::pinned_host_bytes() {
        return bytes;
    }
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let host = if pages > 0 && page > 0 { pages as u64 * page as u64 } else { 0 };
    (host / 4).min(DEFAULT_CAP_LIMIT)
}

impl PinnedHostPool {
    /// The process-wide pool of `ctx`'s device.
    pub fn for_context(ctx: &Arc<GpuContext>) -> Arc<PinnedHostPool> {
        static POOLS: OnceLock<Mutex<HashMap<ContextKey, Arc<PinnedHostPool>>>> = OnceLock::new();
        let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        let key = ctx.key();
        // The pool of a lost (reset) context of this device holds dead slabs.
        pools.retain(|k, _| (k.0, k.1) != (key.0, key.1) || k.2 == key.2);
        Arc::clone(pools.entry(key).or_insert_with(|| Self::with_capacity(ctx, configured_capacity())))
    }

    /// A private pool holding at most `capacity` bytes of slabs.
    pub fn with_capacity(ctx: &Arc<GpuContext>, capacity: u64) -> Arc<PinnedHostPool> {
        Arc::new(PinnedHostPool { ctx: Arc::clone(ctx), capacity, state: Mutex::new(PoolState::default()) })
    }

    /// Most bytes of slabs the pool holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of slabs allocated now, idle or in use.
    pub fn allocated(&self) -> u64 {
        self.lock().allocated
    }

    /// Bytes of idle slabs, ready for reuse.
    pub fn idle(&self) -> u64 {
        self.lock().idle.iter().map(|b| b.len() as u64).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slab of at least `len` bytes, or `None` when the pool is full or
    /// page-locking fails (the caller then copies to pageable memory).
    pub(crate) fn lease(self: &Arc<Self>, len: usize) -> Option<SlabLease> {
        let want = len.div_ceil(SLAB_GRANULE).max(1) * SLAB_GRANULE;
        // Slabs freed to make room; freeing pinned memory waits for the
        // device, so they are dropped after the lock is released.
        let mut freed: Vec<PinnedBuffer> = Vec::new();
        {
            let mut st = self.lock();
            let best = st.idle.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
            if let Some(i) = best {
                let slab = st.idle.swap_remove(i);
                return Some(SlabLease { slab: Some(slab), pool: Arc::clone(self) });
            }
            // Make room by freeing idle slabs too small for this copy.
            while st.allocated + want as u64 > self.capacity {
                let Some(slab) = st.idle.pop() else { break };
                st.allocated -= slab.len() as u64;
                freed.push(slab);
            }
            if st.allocated + want as u64 > self.capacity {
                debug!(len, capacity = self.capacity, allocated = st.allocated, "pinned host pool full, copying to pageable memory");
                drop(st);
                drop(freed);
                return None;
            }
            st.allocated += want as u64;
        }
        drop(freed);
        match PinnedBuffer::new(&self.ctx, want) {
            Ok(slab) => Some(SlabLease { slab: Some(slab), pool: Arc::clone(self) }),
            Err(e) => {
                let mut st = self.lock();
                st.allocated -= want as u64;
                if !std::mem::replace(&mut st.warned, true) {
                    warn!("cannot page-lock {want} bytes of host memory ({e}); copying through pageable memory");
                }
                None
            }
        }
    }
}

/// A slab lent by a pool; it goes back to the pool when dropped (for the
/// slabs behind arrow-rs buffers: when the last buffer using it is dropped).
pub(crate) struct SlabLease {
    slab: Option<PinnedBuffer>,
    pool: Arc<PinnedHostPool>,
}

// Dropping a lease only returns the slab to the pool's mutex-guarded list.
impl RefUnwindSafe for SlabLease {}

impl Drop for SlabLease {
    fn drop(&mut self) {
        if let Some(slab) = self.slab.take() {
            self.pool.lock().idle.push(slab);
        }
    }
}

impl SlabLease {
    /// The slab's first byte.
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.slab.as_ref().map(|s| s.as_mut_ptr()).expect("a lease holds its slab")
    }
}
