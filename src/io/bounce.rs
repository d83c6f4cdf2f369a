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

type Pools = Mutex<HashMap<ContextKey, SlotPool<StagingSlot>>>;

/// Idle slots of every device, by context key.
fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(Default::default)
}

/// Takes `n` slots of at least `size` bytes from the device's pool, creating what is missing.
fn take_slots(ctx: &Arc<GpuContext>, n: usize, size: usize) -> Result<Vec<StagingSlot>> {
    let (mut pooled, stale) = {
        let mut pools = pools().lock().unwrap_or_else(|p| p.into_inner());
        let key = ctx.key();
        // Slots of a lost (reset) context of this device are dead.
        pools.retain(|k, _| (k.0, k.1) != (key.0, key.1) || k.2 == key.2);
        pools.entry(key).or_default().take(n, |s| s.size() >= size)
    };
    // Freeing pinned memory waits for the device: never under the lock.
    drop(stale);
    while pooled.len() < n {
        match StagingSlot::new(ctx, size) {
            Ok(slot) => pooled.push(slot),
            Err(e) => {
                return_slots(ctx, pooled, n);
                return Err(e);
            }
        }
    }
    Ok(pooled)
}

/// Gives back the slots of a read that took `taken` (see [`SlotPool::give_back`]).
fn return_slots(ctx: &GpuContext, slots: Vec<StagingSlot>, taken: usize) {
    let excess = {
        let mut pools = pools().lock().unwrap_or_else(|p| p.into_inner());
        pools.entry(ctx.key()).or_default().give_back(slots, taken)
    };
    drop(excess);
}

/// Idle slots a device keeps at least: what two reads of the most IO
/// threads use.
const MIN_IDLE_SLOTS: usize = 32;

/// The idle slots of one device, and how many reads took at once.
///
/// A pool keeps as many idle slots as were ever in use at once (at least
/// [`MIN_IDLE_SLOTS`]): reads that run together again (the partitions of a
/// DataFusion scan, sixteen reads of sixteen IO threads each) find theirs
/// waiting. Keeping fewer made every such scan page-lock and free hundreds
/// of buffers again, and freeing pinned memory waits for the whole device.
#[derive(Debug)]
struct SlotPool<T> {
    idle: Vec<T>,
    /// Slots taken and not yet given back.
    in_use: usize,
    /// The most slots ever in use at once.
    peak: usize,
}

impl<T> Default for SlotPool<T> {
    fn default() -> Self {
        SlotPool { idle: Vec::new(), in_use: 0, peak: 0 }
    }
}

impl<T> SlotPool<T> {
    /// Up to `n` idle slots that `fits` (fewer where the pool has fewer;
    /// the caller creates the rest) and the idle slots that do not fit,
    /// which leave the pool. Counts `n` slots in use.
    fn take(&mut self, n: usize, fits: impl Fn(&T) -> bool) -> (Vec<T>, Vec<T>) {
        let (fit, stale): (Vec<T>, Vec<T>) = std::mem::take(&mut self.idle).into_iter().partition(|s| fits(s));
        self.idle = fit;
        let keep = self.idle.len().saturating_sub(n);
        let taken = self.idle.split_off(keep);
        self.in_use += n;
        self.peak = self.peak.max(self.in_use);
        (taken, stale)
    }

    /// Takes back `slots` of a read that counted `taken` in use; returns
    /// those beyond what the pool keeps.
    fn give_back(&mut self, mut slots: Vec<T>, taken: usize) -> Vec<T> {
        self.in_use = self.in_use.saturating_sub(taken);
        let room = self.peak.max(MIN_IDLE_SLOTS).saturating_sub(self.idle.len());
        let excess = slots.split_off(slots.len().min(room));
        self.idle.extend(slots);
        excess
    }
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
    let taken = threads.min(tasks.len()).max(1);
    let mut slots = take_slots(ctx, taken, slot_size as usize)?;
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
    return_slots(ctx, slots, taken);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands for a slot: its size.
    #[derive(Debug, PartialEq)]
    struct Slot(usize);

    fn take(pool: &mut SlotPool<Slot>, n: usize, size: usize) -> Vec<Slot> {
        let (mut got, _stale) = pool.take(n, |s| s.0 >= size);
        while got.len() < n {
            got.push(Slot(size));
        }
        got
    }

    #[test]
    fn reads_at_once_find_their_slots_again() {
        let mut pool = SlotPool::default();
        // Sixteen reads of sixteen slots at once, twice over: the second
        // time every slot is an idle one, none is created or dropped.
        for round in 0..2 {
            let reads: Vec<Vec<Slot>> = (0..16).map(|_| take(&mut pool, 16, 8)).collect();
            if round == 1 {
                assert!(pool.idle.is_empty(), "all 256 slots were idle and taken");
            }
            for r in reads {
                assert!(pool.give_back(r, 16).is_empty(), "round {round}: slots dropped");
            }
            assert_eq!(pool.idle.len(), 256);
            assert_eq!(pool.in_use, 0);
        }
        assert_eq!(pool.peak, 256);
    }

    #[test]
    fn a_pool_keeps_at_least_two_reads_and_drops_what_does_not_fit() {
        let mut pool = SlotPool::default();
        // One read at a time never needs more than its own slots, but a
        // pool keeps MIN_IDLE_SLOTS anyway; beyond that slots are dropped.
        let r = take(&mut pool, 40, 8);
        assert_eq!(pool.give_back(r, 40).len(), 0);
        assert_eq!(pool.idle.len(), 40);
        let (got, stale) = pool.take(4, |s| s.0 >= 16);
        assert!(got.is_empty() && stale.len() == 40, "slots too small leave the pool");
        assert_eq!(pool.give_back((0..4).map(|_| Slot(16)).collect(), 4).len(), 0);
        // A read whose slot creation failed gives back what it had.
        let (got, _) = pool.take(10, |s| s.0 >= 16);
        assert_eq!(got.len(), 4);
        assert_eq!(pool.give_back(got, 10).len(), 0);
        assert_eq!(pool.in_use, 0);
    }
}
