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
use crate::plan::{IoLayout, IoTask};

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

/// Idle slots kept per device: what two reads of the most IO threads use
/// (reads that run at once, passes decoded ahead say, take more, and give
/// the rest back to the system).
const MAX_IDLE_SLOTS: usize = 32;

fn return_slots(ctx: &GpuContext, slots: Vec<StagingSlot>) {
    let mut pools = pools().lock().unwrap_or_else(|p| p.into_inner());
    let pool = pools.entry(ctx.key()).or_default();
    let room = MAX_IDLE_SLOTS.saturating_sub(pool.len());
    pool.extend(slots.into_iter().take(room));
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
    read_jobs(ctx, path, &[Job { layout, dst: dst.ptr(), dst_len: dst.len() }], threads, task_size, direct, &|_| {})
}

/// One layout's tasks and the device memory they land in.
pub(crate) struct Job<'a> {
    pub layout: &'a IoLayout,
    /// Address and length of the device buffer; it must stay allocated
    /// until the job is reported done (or the read returns).
    pub dst: u64,
    pub dst_len: u64,
}

/// Reads the tasks of every job, in job order, through one set of workers
/// (no pause between jobs); calls `done(j)` as soon as every byte of job `j`
/// is in device memory (from a worker thread, at most once per job, never
/// after a failure). Returns the bytes read.
pub(crate) fn read_jobs(
    ctx: &Arc<GpuContext>,
    path: &Path,
    jobs: &[Job<'_>],
    threads: usize,
    task_size: u64,
    direct: bool,
    done: &(dyn Fn(usize) + Sync),
) -> Result<u64> {
    // Every task as (job, task), in job order.
    let tasks: Vec<(usize, &IoTask)> = jobs.iter().enumerate().flat_map(|(j, job)| job.layout.tasks.iter().map(move |t| (j, t))).collect();
    for (j, job) in jobs.iter().enumerate() {
        if job.layout.tasks.is_empty() {
            done(j);
        }
    }
    if tasks.is_empty() {
        return Ok(0);
    }
    let max_task = tasks.iter().map(|(_, t)| t.len).max().unwrap_or(0).max(task_size);
    let slot_size = max_task.div_ceil(IO_ALIGNMENT) * IO_ALIGNMENT;
    let file = open(path, direct)?;
    let mut slots = take_slots(ctx, threads.min(tasks.len()).max(1), slot_size as usize)?;
    let progress = Progress {
        next: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        left: jobs.iter().map(|j| AtomicUsize::new(j.layout.tasks.len())).collect(),
        bytes: jobs.iter().map(|_| AtomicU64::new(0)).collect(),
        done,
    };

    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = slots
            .iter_mut()
            .map(|slot| {
                let (file, tasks, progress) = (&file, &tasks, &progress);
                scope.spawn(move || {
                    let mut pending: [Option<usize>; 2] = [None, None];
                    let r = worker(ctx, path, file, tasks, jobs, slot, progress, &mut pending, direct);
                    if r.is_err() {
                        progress.failed.store(true, Ordering::Relaxed);
                    }
                    // Whatever happened, nothing may still be copying out of the slot.
                    let synced = slot.stream.synchronize();
                    if r.is_ok() && synced.is_ok() {
                        pending.iter().flatten().for_each(|&j| progress.finish_task(j, jobs));
                    }
                    r.and(synced)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(Error::worker_panicked("bounce IO", p)))).collect()
    });
    return_slots(ctx, slots);
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(progress.bytes.iter().map(|b| b.load(Ordering::Relaxed)).sum())
}

/// What the workers of one read share.
struct Progress<'a> {
    /// The next task to take.
    next: AtomicUsize,
    failed: AtomicBool,
    /// Per job: tasks not yet known to be in device memory.
    left: Vec<AtomicUsize>,
    /// Per job: bytes read from the file.
    bytes: Vec<AtomicU64>,
    done: &'a (dyn Fn(usize) + Sync),
}

impl Progress<'_> {
    /// Notes that one of job `j`'s copies has completed; the last one
    /// reports the job done, if its bytes are all there.
    fn finish_task(&self, j: usize, jobs: &[Job<'_>]) {
        if self.left[j].fetch_sub(1, Ordering::AcqRel) == 1
            && !self.failed.load(Ordering::Relaxed)
            && self.bytes[j].load(Ordering::Acquire) == jobs[j].layout.bytes_read
        {
            (self.done)(j);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn worker(
    ctx: &GpuContext,
    path: &Path,
    file: &File,
    tasks: &[(usize, &IoTask)],
    jobs: &[Job<'_>],
    slot: &mut StagingSlot,
    progress: &Progress<'_>,
    pending: &mut [Option<usize>; 2],
    direct: bool,
) -> Result<()> {
    ctx.bind()?;
    let mut turn = 0usize;
    loop {
        if progress.failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let i = progress.next.fetch_add(1, Ordering::Relaxed);
        let Some(&(j, task)) = tasks.get(i) else { return Ok(()) };
        let b = turn % 2;
        turn += 1;
        slot.events[b].synchronize()?;
        if let Some(earlier) = pending[b].take() {
            progress.finish_task(earlier, jobs);
        }
        let len = task.len as usize;
        // O_DIRECT wants whole blocks; the tail of the file comes back short.
        let want = if direct { len.div_ceil(IO_ALIGNMENT as usize) * IO_ALIGNMENT as usize } else { len };
        let buf = &mut slot.buffers[b].as_mut_slice()[..want];
        let got = super::pread_full(file, path, buf, task.file_offset, len)?;
        progress.bytes[j].fetch_add(got.min(len) as u64, Ordering::Release);
        let dst = &jobs[j];
        if task.device_offset + task.len > dst.dst_len {
            return Err(Error::Internal(format!("an IO task ends at {} of a {}-byte buffer", task.device_offset + task.len, dst.dst_len)));
        }
        // SAFETY: the source stays untouched until events[b] completes; the
        // destination range lies inside the job's buffer, which stays
        // allocated until the job is reported done.
        unsafe { slot.stream.copy_htod_async(dst.dst + task.device_offset, buf.as_ptr(), len)? };
        slot.events[b].record(&slot.stream)?;
        pending[b] = Some(j);
        // The other buffer's copy was queued a read ago and has most likely
        // finished: noting it now tells its job's reader without waiting
        // for this buffer's turn to come round again.
        if let Some(earlier) = pending[1 - b] {
            slot.events[1 - b].synchronize()?;
            pending[1 - b] = None;
            progress.finish_task(earlier, jobs);
        }
    }
}
