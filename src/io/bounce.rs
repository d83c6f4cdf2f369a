//! gpq's own storage-to-device path, in the spirit of KvikIO's POSIX mode.
//!
//! Each worker thread owns a [`StagingSlot`]: two pinned buffers, two events
//! and a stream. It takes the next task from a shared counter, waits until the
//! copy that last used the buffer has finished, `pread`s the task into the
//! buffer and queues an asynchronous host-to-device copy on its stream. With
//! two buffers per worker, the read of task k+1 overlaps the PCIe copy of task
//! k. Slots are pooled in the [`GpuContext`], because allocating pinned memory
//! costs far more than a read of a few megabytes.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::gpu::context::GpuEvent;
use crate::gpu::{DeviceBuffer, GpuContext, GpuStream, PinnedBuffer};
use crate::options::IO_ALIGNMENT;
use crate::plan::IoLayout;

/// One worker's staging resources.
pub struct StagingSlot {
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

/// Takes `n` slots of at least `size` bytes from the context's pool, creating what is missing.
fn take_slots(ctx: &Arc<GpuContext>, n: usize, size: usize) -> Result<Vec<StagingSlot>> {
    let mut pooled = {
        let mut pool = ctx.staging.lock().unwrap_or_else(|p| p.into_inner());
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
    let mut pool = ctx.staging.lock().unwrap_or_else(|p| p.into_inner());
    pool.extend(slots);
}

fn open(path: &Path, direct: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map_err(|source| Error::Io { file: path.to_path_buf(), offset: 0, len: 0, source })
}

/// Reads all tasks of `layout` into `dst` with `threads` workers.
pub fn read(
    ctx: &Arc<GpuContext>,
    path: &Path,
    layout: &IoLayout,
    dst: &DeviceBuffer,
    threads: usize,
    task_size: u64,
    direct: bool,
) -> Result<()> {
    if layout.tasks.is_empty() {
        return Ok(());
    }
    let max_task = layout.tasks.iter().map(|t| t.len).max().unwrap_or(0).max(task_size);
    let slot_size = max_task.div_ceil(IO_ALIGNMENT) * IO_ALIGNMENT;
    let file = open(path, direct)?;
    let mut slots = take_slots(ctx, threads, slot_size as usize)?;
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);

    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = slots
            .iter_mut()
            .map(|slot| {
                let (file, next, failed) = (&file, &next, &failed);
                scope.spawn(move || {
                    let r = worker(ctx, path, file, layout, dst, slot, next, failed, direct);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    // Whatever happened, nothing may still be copying out of the slot.
                    let synced = slot.stream.synchronize();
                    r.and(synced)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::InvalidOptions("IO worker panicked".into())))).collect()
    });
    return_slots(ctx, slots);
    results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
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
        crate::io::pread_full(file, path, buf, task.file_offset, len)?;
        debug_assert!(task.device_offset + task.len <= dst.len());
        // SAFETY: the source stays untouched until events[b] completes; the
        // destination range lies inside `dst`, which outlives the scope.
        unsafe { slot.stream.copy_htod_async(dst.ptr() + task.device_offset, buf.as_ptr(), len)? };
        slot.events[b].record(&slot.stream)?;
    }
}
