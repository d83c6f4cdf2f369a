//! Copying decoded tables to the host through pinned memory.
//!
//! A copy into fresh pageable memory runs far below PCIe speed: the driver
//! stages every byte through a pinned buffer of its own, and each new host
//! allocation is zeroed and faulted in page by page. That copy was most of
//! the time of gpq's DataFusion scans. [`DeviceTable::to_record_batch_pinned`]
//! instead queues asynchronous copies of all of a table's buffers into one
//! slab of page-locked memory and hands out arrow-rs buffers that point
//! into the slab, so no byte is copied twice.
//!
//! Page-locking memory is slow, so slabs come from a per-device
//! [`PinnedHostPool`] and go back to it when the last array using them is
//! dropped. The pool holds at most `GPQ_PINNED_HOST_BYTES` bytes (default: a
//! quarter of the host's memory, at most 16 GiB; `0` turns pinned copies
//! off); when a table does not fit, or page-locking fails, the copy goes to
//! pageable memory as [`DeviceTable::to_record_batch`] does, and the
//! fallback is logged.

use std::collections::HashMap;
use std::panic::RefUnwindSafe;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::buffer::Buffer;
use tracing::{debug, warn};

use super::{DeviceColumn, DeviceTable, HostBuffers};
use crate::error::Result;
use crate::cuda::{ContextKey, GpuContext, GpuStream, PinnedBuffer};

/// Slabs are sized in multiples of this, so tables of similar size share them.
const SLAB_GRANULE: usize = 32 << 20;
/// Each buffer inside a slab starts at a multiple of this (arrow-rs' alignment).
const BUFFER_ALIGN: usize = 64;
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
    fn lease(self: &Arc<Self>, len: usize) -> Option<SlabLease> {
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
                    warn!("cannot page-lock {want} bytes of host memory ({e}); copying decoded columns to pageable memory");
                }
                None
            }
        }
    }
}

/// A slab lent by a pool; it goes back when the last arrow buffer using it is dropped.
struct SlabLease {
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

/// Where one device buffer lands in the slab.
struct Placement {
    offset: usize,
    len: usize,
}

impl DeviceTable {
    /// Copies the table to the host like [`DeviceTable::to_record_batch`],
    /// but through one pinned slab from the device's [`PinnedHostPool`]: all
    /// copies are queued at once and run at PCIe speed. The arrays of the
    /// result point into the slab, which returns to the pool when the last
    /// of them is dropped. Falls back to pageable memory when the pool is
    /// full (see the module docs).
    pub fn to_record_batch_pinned(&self) -> Result<RecordBatch> {
        self.to_record_batch_staged().map(|(batch, _)| batch)
    }

    /// [`DeviceTable::to_record_batch_pinned`], also saying whether the
    /// pinned slab was used (`false`: the pageable fallback ran).
    pub fn to_record_batch_staged(&self) -> Result<(RecordBatch, bool)> {
        let Some(first) = self.columns.first() else { return Ok((self.to_record_batch()?, false)) };
        let pool = PinnedHostPool::for_context(first.values.context());
        self.to_record_batch_in(&pool)
    }

    /// [`DeviceTable::to_record_batch_staged`] with a given pool.
    pub fn to_record_batch_in(&self, pool: &Arc<PinnedHostPool>) -> Result<(RecordBatch, bool)> {
        // Nested columns are copied buffer by buffer (their sizes depend on their children).
        if self.columns.iter().any(DeviceColumn::is_nested) {
            return Ok((self.to_record_batch()?, false));
        }
        let lengths: Vec<_> = self.columns.iter().map(|c| c.host_lengths()).collect();
        let mut total = 0usize;
        let mut place = |len: usize| {
            let p = Placement { offset: total, len };
            total += len.div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
            p
        };
        // Per column: validity, offsets, values, view data.
        let placements: Vec<(Option<Placement>, Option<Placement>, Placement, Option<Placement>)> = lengths
            .iter()
            .map(|l| (l.validity.map(&mut place), l.offsets.map(&mut place), place(l.values), l.view_data.map(&mut place)))
            .collect();
        if total == 0 {
            return Ok((self.to_record_batch()?, false));
        }
        let Some(lease) = pool.lease(total) else { return Ok((self.to_record_batch()?, false)) };
        let base = lease.slab.as_ref().map(|s| s.as_mut_ptr()).expect("a lease holds its slab");

        let mut streams: Vec<Arc<GpuStream>> = Vec::new();
        let mut queue = || -> Result<()> {
            for (column, (validity, offsets, values, view_data)) in self.columns.iter().zip(&placements) {
                let parts = [
                    (column.validity.as_ref(), validity.as_ref()),
                    (column.offsets.as_ref(), offsets.as_ref()),
                    (Some(&column.values), Some(values)),
                    (column.view_data.as_ref(), view_data.as_ref()),
                ];
                for (source, place) in parts {
                    let (Some(source), Some(place)) = (source, place) else { continue };
                    // SAFETY: the placement lies inside the slab, which outlives
                    // the copy: every stream is synchronized below, also when
                    // queueing fails, before the lease can go.
                    let stream = unsafe { source.copy_range_to_host_async(0, base.add(place.offset), place.len)? };
                    if let Some(s) = stream
                        && !streams.iter().any(|t| Arc::ptr_eq(t, &s))
                    {
                        streams.push(s);
                    }
                }
            }
            Ok(())
        };
        let queued = queue();
        if let Err(e) = streams.iter().try_for_each(|s| s.synchronize()) {
            // A copy may still be writing into the slab: never hand it out again.
            std::mem::forget(lease);
            return Err(e);
        }
        queued?;

        let lease: Arc<SlabLease> = Arc::new(lease);
        let buffer = |place: &Placement| -> Buffer {
            // SAFETY: `base + offset` is non-null, inside the slab and aligned to
            // BUFFER_ALIGN; the slab lives as long as `lease`, which the buffer owns a share of.
            unsafe {
                let ptr = NonNull::new_unchecked(base.add(place.offset));
                Buffer::from_custom_allocation(ptr, place.len, Arc::clone(&lease) as _)
            }
        };
        let arrays = self
            .columns
            .iter()
            .zip(&placements)
            .map(|(column, (validity, offsets, values, view_data))| {
                column.assemble(HostBuffers {
                    validity: validity.as_ref().map(&buffer),
                    offsets: offsets.as_ref().map(&buffer),
                    values: buffer(values),
                    view_data: view_data.as_ref().map(&buffer),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.num_rows));
        Ok((RecordBatch::try_new_with_options(Arc::clone(&self.schema), arrays, &options)?, true))
    }
}
