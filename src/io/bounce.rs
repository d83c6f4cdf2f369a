//! gpq's own storage-to-device path, in the spirit of KvikIO's POSIX mode.
//!
//! Each worker thread owns a [`StagingSlot`]: two pinned buffers, two events
//! and a stream. It takes the next task from a shared counter, waits until the
//! copy that last used the buffer has finished, `pread`s the task into the
//! buffer and queues an asynchronous host-to-device copy on its stream. With
//! two buffers per worker, the read of task k+1 overlaps the PCIe copy of task
//! k. Slots are pooled per device (outside the context, as the pinned host
//! pool of [`crate::arrow`] is), because allocating pinned memory costs far
//! more than a read of a few megabytes.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::cuda::{ContextKey, DeviceBuffer, GpuContext, GpuEvent, GpuStream, PinnedBuffer};
use crate::error::{Error, Result};
use crate::options::IO_ALIGNMENT;
use crate::plan::IoLayout;

/// One worker's staging resources.
struct StagingSlot {
    buffers: [PinnedBuffer; 2],
    events: [GpuEvent; 2],
    stream: Arc<GpuStream>,
}

impl StagingSlot {
    fn new(ctx: &Arc<GpuContext>, size: usize) -> Result<StagingSlot> {
        Ok(StagingSlot {
            buffers: [PinnedBuffer::new(ctx, size)?, PinnedBuffer::new(ctx, size)?],
            events: [GpuEvent::new(ctx, false)?, GpuEvent::new(ctx, false)?],
            stream: ctx.new_stream()?,
        })
    }

    fn size(&self) -> usize {
        self.buffers[0].len()
    }
}

type Pools = Mutex<HashMap<ContextKey, Vec<StagingSlot>>>;

/// Idle slots of every device, by context key.
fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(Default::default)
}

/// Takes `n` slots of at least `size` bytes from the device's pool, creating what is missing.
fn take_slots(ctx: &Arc<GpuContext>, n: usize, size: usize) -> Result<Vec<StagingSlot>> {
    let mut pooled = {
        let mut pools = pools().lock().unwrap_or_else(|p| p.into_inner());
        let key = ctx.key();
        // Slots of a lost (reset) context of this device are dead.
        pools.retain(|k, _| (k.0, k.1) != (key.0, key.1) || k.2 == key.2);
        let pool = pools.entry(key).or_default();
        pool.retain(|s| s.size() >= size);
        let keep = pool.len().saturating_sub(n);
        pool.split_off(keep)
    };
    while pooled.len() < n {
        pooled.push(StagingSlot::new(ctx, size)?);
    }
    Ok(pooled)
}

fn return_slots(ctx: &GpuContext, slots: Vec<StagingSlot>) {
    let mut pools = pools().lock().unwrap_or_else(|p| p.into_inner());
    pools.entry(ctx.key()).or_default().extend(slots);
}

fn open(path: &Path, direct: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map_err(|source| Error::Open { file: path.to_path_buf(), source })
}

/// Reads all tasks of `layout` into `dst` with `threads` workers; returns the bytes read.
pub(crate) fn read(
    ctx: &Arc<GpuContext>,
    path: &Path,
    layout: &IoLayout,
    dst: &DeviceBuffer,
    threads: usize,
    task_size: u64,
    direct: bool,
) -> Result<u64> {
    if layout.tasks.is_empty() {
        return Ok(0);
    }
    let max_task = layout.tasks.iter().map(|t| t.len).max().unwrap_or(0).max(task_size);
    let slot_size = max_task.div_ceil(IO_ALIGNMENT) * IO_ALIGNMENT;
    let file = open(path, direct)?;
    let mut slots = take_slots(ctx, threads, slot_size as usize)?;
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let bytes_read = AtomicU64::new(0);

    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = slots
            .iter_mut()
            .map(|slot| {
                let (file, next, failed, bytes_read) = (&file, &next, &failed, &bytes_read);
                scope.spawn(move || {
                    let r = worker(ctx, path, file, layout, dst, slot, next, failed, bytes_read, direct);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    // Whatever happened, nothing may still be copying out of the slot.
                    let synced = slot.stream.synchronize();
                    r.and(synced)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(Error::worker_panicked("bounce IO", p)))).collect()
    });
    return_slots(ctx, slots);
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(bytes_read.into_inner())
}

#[allow(clippy::too_many_arguments)]
fn worker(
    ctx: &GpuContext,
    path: &Path,
    file: &File,
    layout: &IoLayout,
    dst: &DeviceBuffer,
    slot: &mut StagingSlot,
    next: &AtomicUsize,
    failed: &AtomicBool,
    bytes_read: &AtomicU64,
    direct: bool,
) -> Result<()> {
    ctx.bind()?;
    let mut turn = 0usize;
    loop {
        if failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(task) = layout.tasks.get(i) else { return Ok(()) };
        let b = turn % 2;
        turn += 1;
        slot.events[b].synchronize()?;
        let len = task.len as usize;
        // O_DIRECT wants whole blocks; the tail of the file comes back short.
        let want = if direct { len.div_ceil(IO_ALIGNMENT as usize) * IO_ALIGNMENT as usize } else { len };
        let buf = &mut slot.buffers[b].as_mut_slice()[..want];
        let got = super::pread_full(file, path, buf, task.file_offset, len)?;
        bytes_read.fetch_add(got.min(len) as u64, Ordering::Relaxed);
        debug_assert!(task.device_offset + task.len <= dst.len());
        // SAFETY: the source stays untouched until events[b] completes; the
        // destination range lies inside `dst`, which outlives the scope.
        unsafe { slot.stream.copy_htod_async(dst.ptr() + task.device_offset, buf.as_ptr(), len)? };
        slot.events[b].record(&slot.stream)?;
    }
}
