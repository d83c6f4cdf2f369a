//! nvCOMP in a worker process, for pages no device check can vouch for.
//!
//! ZSTD and GZIP pages cannot be proved well-formed on the device before
//! nvCOMP sees them (a validator would be a decoder), and on corrupt input
//! nvCOMP may read or write out of bounds or never finish; in this process
//! either would lose the CUDA context for every later read. So such batches
//! go to `gpq-nvcomp-worker`, a child process with a CUDA context of its own
//! on the same GPU. The pages travel through an exchange buffer the two
//! share by CUDA IPC: the parent copies the compressed pages in (on the
//! device; a v2 page's level bytes in front of its output), the worker runs
//! nvCOMP from and into it and reports the pages that failed (status, or a
//! size other than promised), and the parent decodes the pages where the
//! worker left them. Requests carry page sizes only (13 bytes a page); both
//! sides derive the slots from them (`BatchLayout`). The parent waits with
//! a deadline. A worker that faults, dies, overruns the deadline or reports
//! any failed page is killed and not reused (corrupt input may have written
//! anywhere in its memory), the exchange buffer is freed, and the batch's
//! pages go to the CPU decoder, whose verdict stands.
//!
//! The worker runs the batches it is sent side by side, each on a thread
//! and stream of its own, as nvCOMP in this process would for a read's
//! overlapped groups (one batch waits out its largest page's latency, so
//! batches one after another would add those latencies up). Requests and
//! answers carry an id; one thread here reads the answers and hands each to
//! the batch that waits for it. A failed batch stops the worker, and with it
//! every batch that ran beside it: a batch's answer stands only once every
//! batch that was still running when it came has ended well too, since a
//! corrupt page may write into any buffer the worker maps. To keep that set
//! small, the worker maps a batch's exchange buffer only while the batch
//! runs (`cuIpcOpenMemHandle` before, `cuIpcCloseMemHandle` before it
//! answers).
//!
//! An exchange buffer (a batch's compressed and decompressed bytes) is held
//! by the read until its pages are decoded (`HeldExchange`), then goes back
//! to a pool of idle buffers for later batches, so that a buffer is
//! allocated and exported once, not per batch. Buffers grow in 64 MiB steps;
//! at most `MAX_IDLE_EXCHANGES` stay idle, holding at most an eighth of the
//! device's memory; the rest are freed; all are freed with a failed batch.
//! They are not charged to a read's device-memory budget; the worker's own
//! context and nvCOMP scratch live in its process.
//!
//! The worker binary is looked for at `$GPQ_NVCOMP_WORKER` (`off` disables
//! the worker), else beside the running executable or in its parent folder
//! (where cargo puts binaries for test executables in `deps/`). Without one,
//! those pages are decompressed on the CPU, as the read's statistics say.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use tracing::{info, warn};

use super::nvcomp::{self, Batch, Codec};
use crate::cuda::{DeviceBuffer, GpuContext, GpuStream, as_bytes, from_bytes};

/// File name of the worker executable.
pub const WORKER_NAME: &str = "gpq-nvcomp-worker";

const HELLO: &[u8; 4] = b"GPQW";
const REQUEST: &[u8; 4] = b"GPQR";
const ANSWER: &[u8; 4] = b"GPQA";
const PROTOCOL: u32 = 5;
/// Exchange buffers grow in steps of this many bytes.
const EXCHANGE_STEP: u64 = 64 << 20;
/// How long a new worker may take to start, at least.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// Bytes asked for each pipe to the worker.
const PIPE_BYTES: libc::c_int = 1 << 20;
/// Exchange buffers kept idle for later batches (more are freed)...
const MAX_IDLE_EXCHANGES: usize = 8;
/// ...holding at most this fraction of the device's memory (1/8).
const IDLE_EXCHANGE_SHARE: u64 = 8;
/// Bytes of a request before its pages: magic, id, codec, page count, IPC
/// handle, exchange buffer length.
const REQUEST_HEAD: usize = 4 + 4 + 4 + 4 + 64 + 8;
/// Consecutive failed starts after which the worker is no longer tried.
const MAX_FAILED_STARTS: u32 = 3;

/// Where the exchange buffer's slots start: 256-byte boundaries.
const SLOT_ALIGN: u64 = 256;

/// One page of a batch: offsets into the exchange buffer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Slot {
    pub input: u64,
    pub input_len: u64,
    pub output: u64,
    pub output_len: u64,
}

/// The pages of a batch as a request carries them: their sizes and where
/// each input starts within 16 bytes, and the room each output keeps in
/// front of it. Both sides derive the slots from it (`slots`), so the
/// request is 13 bytes a page.
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchLayout {
    /// Per page: compressed bytes.
    pub input_lens: Vec<u32>,
    /// Per page: the bytes it must decompress to.
    pub output_lens: Vec<u32>,
    /// Per page: the input's offset past its slot's 256-byte boundary (< 16).
    pub skews: Vec<u8>,
    /// Per page: bytes kept free just in front of its output (a v2 page's
    /// level bytes go there, so the page is whole where it was decompressed).
    pub prefixes: Vec<u32>,
}

impl BatchLayout {
    /// The slots: every input (from a 256-byte boundary plus its skew), then
    /// every output (from 256-byte boundaries, its prefix's room in front);
    /// and the bytes they span.
    pub(crate) fn slots(&self) -> (Vec<Slot>, u64) {
        let align = |x: u64| x.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let mut slots = Vec::with_capacity(self.input_lens.len());
        let mut at = 0u64;
        for (k, &len) in self.input_lens.iter().enumerate() {
            let input = at + (self.skews[k] & 15) as u64;
            slots.push(Slot { input, input_len: len as u64, output: 0, output_len: self.output_lens[k] as u64 });
            at = align(input + len as u64);
        }
        for (k, s) in slots.iter_mut().enumerate() {
            s.output = align(at + self.prefixes[k] as u64);
            at = align(s.output + s.output_len);
        }
        (slots, at)
    }

    fn len(&self) -> usize {
        self.input_lens.len()
    }
}

/// What the worker said about a batch: how long it took (its own clock), and
/// how much of that nvCOMP's launch and wait.
pub(crate) struct Answer {
    pub worker_time: Duration,
    pub nvcomp_time: Duration,
    /// The worker's breakdown of its time (`name=value` words), for the debug log.
    pub phases: String,
}

/// A running worker, shared by the batches in flight on it. Requests go out
/// on `to` under its lock; one thread (`read_answers`) reads every answer
/// and files it in `link` for the batch that waits for it.
struct Worker {
    child: Mutex<Child>,
    to: Mutex<ChildStdin>,
    link: Mutex<Link>,
    answered: Condvar,
    /// nvCOMP's version in the worker.
    version: String,
}

/// What the parent knows of the worker's batches.
#[derive(Default)]
struct Link {
    next_id: u32,
    /// Requests sent and not answered yet, with their deadlines.
    pending: BTreeMap<u32, Instant>,
    /// Answers their batches have not taken yet, each with the requests
    /// that were still running in the worker when it came.
    answers: HashMap<u32, (WireAnswer, Vec<u32>)>,
    /// Requests that failed, or were running when the worker stopped.
    failed: HashSet<u32>,
    /// Why the worker stopped, once it has.
    stopped: Option<String>,
}

impl Link {
    /// The worker stopped (the first reason stays): every batch still
    /// running fails.
    fn stop(&mut self, why: String) {
        self.stopped.get_or_insert(why);
        let running = std::mem::take(&mut self.pending).into_keys();
        self.failed.extend(running);
    }
}

/// One answer as the worker sent it.
enum WireAnswer {
    /// The batch ran: the worker's times (text), and the pages that failed
    /// (index, nvCOMP status, size).
    Ran { text: String, failed: Vec<(usize, i32, u64)> },
    /// The batch could not run: why.
    Refused(String),
}

impl Worker {
    fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_stopped(&self) -> bool {
        self.link().stopped.is_some()
    }

    /// Kills the process and waits for it to be gone (its mappings of the
    /// exchange buffers with it); every batch still running fails.
    fn kill(&self, why: &str) {
        {
            let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
            let _ = child.kill();
            let _ = child.wait();
        }
        self.link().stop(why.to_string());
        self.answered.notify_all();
    }
}

/// The answer reader of a worker: files each answer for its batch until the
/// pipe closes (the worker exited or was killed), then fails every batch
/// still running.
fn read_answers(worker: Arc<Worker>, mut from: ChildStdout) {
    let why = loop {
        match read_answer(&mut from) {
            Ok((id, answer)) => {
                let mut link = worker.link();
                link.pending.remove(&id);
                let bad = match &answer {
                    WireAnswer::Ran { failed, .. } => !failed.is_empty(),
                    WireAnswer::Refused(_) => true,
                };
                if bad {
                    // Its pages may have written anywhere in the worker's
                    // memory: the batches running beside it fail with it.
                    link.failed.insert(id);
                }
                let running: Vec<u32> = link.pending.keys().copied().collect();
                link.answers.insert(id, (answer, running));
                drop(link);
                worker.answered.notify_all();
            }
            Err(e) => break e,
        }
    };
    worker.link().stop(why);
    worker.answered.notify_all();
}

/// Reads one answer: its request's id and what it says.
fn read_answer(from: &mut ChildStdout) -> std::result::Result<(u32, WireAnswer), String> {
    let garbage = || "the nvCOMP worker answered garbage".to_string();
    let read = |from: &mut ChildStdout, buf: &mut [u8]| {
        from.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => "the nvCOMP worker exited (a fault on corrupt input?)".to_string(),
            _ => format!("reading from the nvCOMP worker: {e}"),
        })
    };
    let mut head = [0u8; 16];
    read(from, &mut head)?;
    if &head[..4] != ANSWER {
        return Err(garbage());
    }
    let word = |k: usize| u32::from_le_bytes(head[4 * k..4 * k + 4].try_into().unwrap());
    let (id, status, text_len) = (word(1), word(2), word(3) as usize);
    if text_len > 1 << 16 {
        return Err(garbage());
    }
    let mut text = vec![0u8; text_len];
    read(from, &mut text)?;
    let text = String::from_utf8_lossy(&text).into_owned();
    if status != 0 {
        return Ok((id, WireAnswer::Refused(text)));
    }
    let mut count = [0u8; 4];
    read(from, &mut count)?;
    let count = u32::from_le_bytes(count) as usize;
    if count > 1 << 24 {
        return Err(garbage());
    }
    let mut body = vec![0u8; 16 * count];
    read(from, &mut body)?;
    let failed = body
        .chunks_exact(16)
        .map(|e| {
            let index = u32::from_le_bytes(e[0..4].try_into().unwrap()) as usize;
            (index, i32::from_le_bytes(e[4..8].try_into().unwrap()), u64::from_le_bytes(e[8..16].try_into().unwrap()))
        })
        .collect();
    Ok((id, WireAnswer::Ran { text, failed }))
}

struct Exchange {
    buffer: DeviceBuffer,
    handle: sys::CUipcMemHandle,
}

#[derive(Default)]
struct Client {
    worker: Option<Arc<Worker>>,
    /// Exchange buffers no batch or read holds.
    idle: Vec<Exchange>,
    /// Bytes the idle buffers may hold together (set at the first batch).
    idle_cap: u64,
    failed_starts: u32,
}

impl Client {
    /// Takes back an exchange buffer a batch or read is done with: into the
    /// idle pool where there is room, else freed (the worker maps a buffer
    /// only while its batch runs).
    fn give_back(&mut self, exchange: Exchange) {
        if idle_has_room(self.idle.iter().map(|x| x.buffer.len()), exchange.buffer.len(), self.idle_cap) {
            self.idle.push(exchange);
        }
    }

    /// The running worker, started if there is none (or it stopped).
    fn running_worker(&mut self, path: &PathBuf, ordinal: usize) -> std::result::Result<Arc<Worker>, String> {
        if let Some(w) = &self.worker {
            if !w.is_stopped() {
                return Ok(w.clone());
            }
            // Stopped: killed and waited for by whoever saw it fail, or
            // exited on its own; either way it maps nothing any more.
            w.kill("stopped");
            self.worker = None;
        }
        if self.failed_starts >= MAX_FAILED_STARTS {
            return Err(format!("the nvCOMP worker failed to start {MAX_FAILED_STARTS} times"));
        }
        match start(path, ordinal) {
            Ok(w) => {
                self.failed_starts = 0;
                self.worker = Some(w.clone());
                Ok(w)
            }
            Err(e) => {
                self.failed_starts += 1;
                Err(e)
            }
        }
    }
}

fn clients() -> &'static Mutex<HashMap<usize, Client>> {
    static CLIENTS: OnceLock<Mutex<HashMap<usize, Client>>> = OnceLock::new();
    CLIENTS.get_or_init(Default::default)
}

fn lock_clients() -> MutexGuard<'static, HashMap<usize, Client>> {
    clients().lock().unwrap_or_else(|p| p.into_inner())
}
/// Where the worker executable is, or why there is none.
pub(crate) fn worker_path() -> std::result::Result<PathBuf, String> {
    static PATH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(v) = crate::env::nvcomp_worker() {
            if matches!(v.trim().to_ascii_lowercase().as_str(), "off" | "0" | "false" | "no") {
                return Err("the nvCOMP worker is turned off (GPQ_NVCOMP_WORKER)".into());
            }
            let p = PathBuf::from(v);
            return if p.is_file() { Ok(p) } else { Err(format!("GPQ_NVCOMP_WORKER={} is not a file", p.display())) };
        }
        let exe = std::env::current_exe().map_err(|e| format!("no nvCOMP worker: the running executable is unknown ({e})"))?;
        let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
        for d in [Some(dir.clone()), dir.parent().map(PathBuf::from)].into_iter().flatten() {
            let p = d.join(WORKER_NAME);
            if p.is_file() {
                return Ok(p);
            }
        }
        Err(format!("no nvCOMP worker ({WORKER_NAME} is not beside {} and GPQ_NVCOMP_WORKER is not set)", exe.display()))
    })
    .clone()
}

/// The fixed part of the worker's deadline: `GPQ_NVCOMP_WORKER_DEADLINE_MS`,
/// else `GPQ_NVCOMP_DEADLINE_S` where set (tools like compute-sanitizer slow
/// the worker too), else 250 ms (a healthy batch of a few megabytes takes
/// milliseconds once the worker has warmed up).
fn deadline_base() -> Duration {
    crate::env::nvcomp_worker_deadline_base().unwrap_or(Duration::from_millis(250))
}

/// How long a new worker may take to set up CUDA and nvCOMP and warm up.
fn start_deadline() -> Duration {
    START_DEADLINE.max(deadline_base() * 4)
}

/// How long the worker may take for a batch producing `output_bytes`: the
/// base plus 1 s per GB, far below any GPU's rate.
pub(crate) fn deadline(output_bytes: u64) -> Duration {
    deadline_base() + Duration::from_secs_f64(output_bytes as f64 / 1e9)
}

/// Starts the worker of `ctx`'s device on a background thread if it is not
/// running, so that it is ready by the time a read's pages are (a start
/// takes a few hundred milliseconds: a CUDA context and nvCOMP's kernels).
/// The first batch waits for it.
pub(crate) fn prestart(ctx: &Arc<GpuContext>) {
    if ctx.is_emulated() || worker_path().is_err() {
        return;
    }
    let ordinal = ctx.ordinal();
    let ready = lock_clients().get(&ordinal).and_then(|c| c.worker.as_ref()).is_some_and(|w| !w.is_stopped());
    if ready {
        return;
    }
    // The thread takes the lock before this function returns, so a batch
    // that follows waits for the start instead of racing it.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new().name("gpq-nvcomp-worker-start".into()).spawn(move || {
        let mut guard = lock_clients();
        let _ = tx.send(());
        let Ok(path) = worker_path() else { return };
        let _ = guard.entry(ordinal).or_default().running_worker(&path, ordinal);
    });
    if spawned.is_ok() {
        let _ = rx.recv();
    }
}

/// Whether an idle pool of buffers of `idle` bytes each may keep one more of
/// `len` bytes, within `MAX_IDLE_EXCHANGES` and `cap` bytes.
fn idle_has_room(idle: impl ExactSizeIterator<Item = u64>, len: u64, cap: u64) -> bool {
    idle.len() < MAX_IDLE_EXCHANGES && idle.fold(len, u64::saturating_add) <= cap
}

/// Which idle buffer (by index, from their sizes) a batch of `bytes` takes:
/// the smallest that fits (`Ok`); else none, and the largest idle one, if
/// any, makes way for a new buffer (`Err`): it is too small too.
fn pick_idle(idle: &[u64], bytes: u64) -> std::result::Result<usize, Option<usize>> {
    let fit = idle.iter().enumerate().filter(|(_, len)| **len >= bytes).min_by_key(|(_, len)| **len).map(|(k, _)| k);
    fit.ok_or_else(|| idle.iter().enumerate().max_by_key(|(_, len)| **len).map(|(k, _)| k))
}

/// A batch's hold on the worker of one device: an exchange buffer of at
/// least the bytes asked for, and the running worker, which other batches
/// share meanwhile (it runs them side by side, each on a stream of its own).
/// Dropped without [`Lease::hold`], its buffer goes back to the pool.
pub(crate) struct Lease {
    ordinal: usize,
    worker: Arc<Worker>,
    exchange: Option<Exchange>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(x) = self.exchange.take() {
            lock_clients().entry(self.ordinal).or_default().give_back(x);
        }
    }
}

impl Lease {
    /// Starts (or reuses) the worker of `ctx`'s device and takes an exchange
    /// buffer of at least `bytes`. Errors say why the worker cannot be used.
    pub(crate) fn acquire(ctx: &Arc<GpuContext>, bytes: u64) -> std::result::Result<Lease, String> {
        let path = worker_path()?;
        if ctx.is_emulated() {
            return Err("the device is the CPU emulator".into());
        }
        let ordinal = ctx.ordinal();
        let mut guard = lock_clients();
        let client = guard.entry(ordinal).or_default();
        if client.idle_cap == 0 {
            client.idle_cap = ctx.memory_info().map_or(4 << 30, |(_, total)| total / IDLE_EXCHANGE_SHARE);
        }
        let worker = client.running_worker(&path, ordinal)?;
        let sizes: Vec<u64> = client.idle.iter().map(|x| x.buffer.len()).collect();
        let reused = match pick_idle(&sizes, bytes) {
            Ok(k) => Some(client.idle.swap_remove(k)),
            Err(make_way) => {
                // Too small for this batch: freed, it makes room in the pool.
                if let Some(k) = make_way {
                    client.idle.swap_remove(k);
                }
                None
            }
        };
        drop(guard);
        let exchange = match reused {
            Some(x) => x,
            None => {
                let len = bytes.max(1).div_ceil(EXCHANGE_STEP) * EXCHANGE_STEP;
                let buffer = DeviceBuffer::alloc_plain(ctx, len, "nvCOMP worker exchange").map_err(|e| e.to_string())?;
                let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
                // SAFETY: `buffer` is a live cuMemAlloc allocation of this context; valid out pointer.
                let r = unsafe { sys::cuIpcGetMemHandle(&mut handle, buffer.ptr()) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuIpcGetMemHandle: {r:?}"));
                }
                Exchange { buffer, handle }
            }
        };
        Ok(Lease { ordinal, worker, exchange: Some(exchange) })
    }

    /// Device address of the exchange buffer.
    pub(crate) fn base(&mut self) -> u64 {
        self.exchange.as_ref().map_or(0, |x| x.buffer.ptr())
    }

    /// nvCOMP's version in the worker.
    pub(crate) fn version(&mut self) -> String {
        self.worker.version.clone()
    }

    /// Has the worker decompress the pages of `layout` (whose inputs must be
    /// in their slots of the exchange buffer: the caller synchronized its
    /// copies) with `codec`, waiting at most `limit` for the answer. Any
    /// failure, a page nvCOMP rejects or decompresses to another size than
    /// its header says included, fails the whole batch (the other pages'
    /// outputs may have been overwritten by the bad one) and stops the
    /// worker. So does a failure of any batch that ran in the worker beside
    /// this one: its pages may have written into this one's outputs.
    pub(crate) fn run(&mut self, codec: Codec, layout: &BatchLayout, limit: Duration) -> std::result::Result<Answer, String> {
        let result = self.exchange_batch(codec, layout, limit);
        if result.is_err() {
            self.abandon();
        }
        result
    }

    fn exchange_batch(&mut self, codec: Codec, layout: &BatchLayout, limit: Duration) -> std::result::Result<Answer, String> {
        let (handle, len) = match &self.exchange {
            Some(x) => (x.handle, x.buffer.len()),
            None => return Err("no exchange buffer".into()),
        };
        let n = u32::try_from(layout.len()).map_err(|_| "too many pages for one batch".to_string())?;
        let worker = self.worker.clone();
        let until = Instant::now() + limit;
        let id = {
            let mut link = worker.link();
            if let Some(why) = &link.stopped {
                return Err(format!("the nvCOMP worker stopped: {why}"));
            }
            let id = link.next_id;
            link.next_id = id.wrapping_add(1);
            link.pending.insert(id, until);
            id
        };
        let mut msg = Vec::with_capacity(REQUEST_HEAD + 13 * layout.len());
        msg.extend_from_slice(REQUEST);
        msg.extend_from_slice(&id.to_le_bytes());
        msg.extend_from_slice(&codec_code(codec).to_le_bytes());
        msg.extend_from_slice(&n.to_le_bytes());
        msg.extend(handle.reserved.iter().map(|&b| b as u8));
        msg.extend_from_slice(&len.to_le_bytes());
        msg.extend_from_slice(as_bytes(&layout.input_lens));
        msg.extend_from_slice(as_bytes(&layout.output_lens));
        msg.extend_from_slice(&layout.skews);
        msg.extend_from_slice(as_bytes(&layout.prefixes));
        {
            let mut to = worker.to.lock().unwrap_or_else(|p| p.into_inner());
            to.write_all(&msg).and_then(|_| to.flush()).map_err(|e| format!("writing to the nvCOMP worker: {e}"))?;
        }
        let mut link = worker.link();
        let (answer, beside) = loop {
            if let Some(a) = link.answers.remove(&id) {
                break a;
            }
            if link.failed.contains(&id) {
                return Err(format!("the nvCOMP worker stopped: {}", link.stopped.as_deref().unwrap_or("no answer")));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("the nvCOMP worker did not answer in time (hung kernels?)".into());
            }
            link = worker.answered.wait_timeout(link, left).unwrap_or_else(|p| p.into_inner()).0;
        };
        let text = match answer {
            WireAnswer::Refused(why) => return Err(format!("nvCOMP worker: {why}")),
            WireAnswer::Ran { failed, .. } if !failed.is_empty() => {
                let rejected: Vec<_> = failed.iter().filter(|&&(_, status, _)| status != 0).collect();
                return Err(match (rejected.first(), failed[0]) {
                    (Some(&&(_, status, _)), _) => {
                        format!("nvCOMP in the worker rejected {} of {n} pages (first: {})", rejected.len(), nvcomp::status_name(status))
                    }
                    (None, (index, _, size)) => {
                        let promised = layout.output_lens.get(index).copied().unwrap_or(0);
                        format!("nvCOMP {codec:?} in the worker decompressed a page to {size} bytes, its header says {promised}")
                    }
                });
            }
            WireAnswer::Ran { text, .. } => text,
        };
        // The batches that ran beside this one must end well too. Each has a
        // deadline of its own, which its reader enforces; past the latest of
        // them (and a grace) this batch gives up on them.
        loop {
            if beside.iter().any(|b| link.failed.contains(b)) {
                return Err("a batch that ran beside this one in the nvCOMP worker failed (its pages may have written into this one's)".into());
            }
            let Some(latest) = beside.iter().filter_map(|b| link.pending.get(b)).max().copied() else { break };
            let left = (latest + deadline_base()).saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("a batch that ran beside this one in the nvCOMP worker did not answer in time".into());
            }
            link = worker.answered.wait_timeout(link, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        drop(link);
        // The worker's times in microseconds (all, and nvCOMP's part), then
        // its phases as `name=value` words.
        let mut words = text.split_whitespace();
        let mut us = || Duration::from_micros(words.next().and_then(|t| t.parse().ok()).unwrap_or(0));
        let (worker_time, nvcomp_time) = (us(), us());
        let phases = words.collect::<Vec<_>>().join(" ");
        Ok(Answer { worker_time, nvcomp_time, phases })
    }

    /// Stops the worker (waiting until it is gone) and frees the batch's
    /// exchange buffer and the idle ones (for a batch whose answer the
    /// caller finds wrong). Batches running beside it fail; buffers reads
    /// hold are freed when they let go.
    pub(crate) fn abandon(&mut self) {
        self.worker.kill("a batch failed");
        let mut guard = lock_clients();
        if let Some(client) = guard.get_mut(&self.ordinal) {
            if client.worker.as_ref().is_some_and(|w| Arc::ptr_eq(w, &self.worker)) {
                client.worker = None;
            }
            client.idle.clear();
        }
        drop(guard);
        self.exchange = None;
    }

    /// Ends the lease keeping the exchange buffer, with the outputs of the
    /// batch just run, for the reader's decoders: the worker no longer maps
    /// it, and it returns to the pool when the [`HeldExchange`] is dropped.
    pub(crate) fn hold(mut self, stream: &Arc<GpuStream>) -> HeldExchange {
        HeldExchange { ordinal: self.ordinal, exchange: self.exchange.take(), stream: stream.clone() }
    }
}

/// An exchange buffer taken out of the pool while a read's decoders use
/// the pages the worker decompressed into it (so they need not be copied
/// out). Dropping it waits for the reading stream (its kernels may still
/// read the pages), then gives the buffer back to the pool.
pub(crate) struct HeldExchange {
    ordinal: usize,
    exchange: Option<Exchange>,
    stream: Arc<GpuStream>,
}

impl Drop for HeldExchange {
    fn drop(&mut self) {
        let Some(exchange) = self.exchange.take() else { return };
        if self.stream.synchronize().is_ok() {
            lock_clients().entry(self.ordinal).or_default().give_back(exchange);
        }
        // (Else the context is lost, and the buffer goes with it.)
    }
}

fn codec_code(c: Codec) -> u32 {
    Codec::ALL.iter().position(|&k| k == c).unwrap_or(0) as u32
}

fn codec_of(code: u32) -> Option<Codec> {
    Codec::ALL.get(code as usize).copied()
}

/// Reads exactly `buf.len()` bytes, failing once `until` has passed.
fn read_exact_by(from: &mut ChildStdout, buf: &mut [u8], until: Instant) -> std::result::Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the nvCOMP worker did not answer in time (hung kernels?)".into());
        }
        let mut pfd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("waiting for the nvCOMP worker: {e}"));
        }
        if r == 0 {
            continue;
        }
        match from.read(&mut buf[got..]) {
            Ok(0) => return Err("the nvCOMP worker exited (a fault on corrupt input?)".into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading from the nvCOMP worker: {e}")),
        }
    }
    Ok(())
}

fn start(path: &PathBuf, ordinal: usize) -> std::result::Result<Arc<Worker>, String> {
    let t = Instant::now();
    let mut child = Command::new(path)
        .arg(ordinal.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", path.display()))?;
    let (to, mut from) = match (child.stdin.take(), child.stdout.take()) {
        (Some(i), Some(o)) => {
            // Room for a whole request or answer of tens of thousands of
            // pages without waking the other side every 64 KiB (best effort).
            for fd in [i.as_raw_fd(), o.as_raw_fd()] {
                // SAFETY: fcntl on a pipe this process owns.
                unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BYTES) };
            }
            (i, o)
        }
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the nvCOMP worker has no pipes".into());
        }
    };
    let hello = (|| {
        let mut head = [0u8; 16];
        read_exact_by(&mut from, &mut head, Instant::now() + start_deadline())?;
        if &head[..4] != HELLO || u32::from_le_bytes(head[4..8].try_into().unwrap()) != PROTOCOL {
            return Err(format!("{} is not a gpq nvCOMP worker of this version", path.display()));
        }
        let status = u32::from_le_bytes(head[8..12].try_into().unwrap());
        let len = (u32::from_le_bytes(head[12..16].try_into().unwrap()) as usize).min(1 << 16);
        let mut text = vec![0u8; len];
        read_exact_by(&mut from, &mut text, Instant::now() + start_deadline())?;
        let text = String::from_utf8_lossy(&text).into_owned();
        if status != 0 { Err(format!("the nvCOMP worker cannot start: {text}")) } else { Ok(text) }
    })();
    match hello {
        Ok(version) => {
            info!(ms = t.elapsed().as_secs_f64() * 1e3, %version, "nvCOMP worker started");
            let worker = Arc::new(Worker {
                child: Mutex::new(child),
                to: Mutex::new(to),
                link: Mutex::new(Link::default()),
                answered: Condvar::new(),
                version,
            });
            let reader = worker.clone();
            let spawned = std::thread::Builder::new().name("gpq-nvcomp-answers".into()).spawn(move || read_answers(reader, from));
            if let Err(e) = spawned {
                worker.kill("no answer thread");
                return Err(format!("no thread for the nvCOMP worker's answers: {e}"));
            }
            Ok(worker)
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            warn!(error = %e, "nvCOMP worker did not start");
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------
// The worker's side.

/// The worker process's main loop (`gpq-nvcomp-worker ORDINAL`): sets up a
/// CUDA context on the device and nvCOMP, says hello on stdout, then answers
/// batches from stdin until it closes. Returns the exit code. Not for use
/// outside the worker binary.
#[doc(hidden)]
pub fn worker_main() -> i32 {
    let ordinal: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let stdin = std::io::stdin();
    let stdout = Mutex::new(std::io::stdout());
    match serve(ordinal, &mut stdin.lock(), &stdout) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{WORKER_NAME}: {e}");
            1
        }
    }
}

fn say(out: &mut impl Write, magic: &[u8; 4], a: u32, b: Option<u32>, text: &str) -> std::io::Result<()> {
    let mut m = Vec::with_capacity(16 + text.len());
    m.extend_from_slice(magic);
    m.extend_from_slice(&a.to_le_bytes());
    if let Some(b) = b {
        m.extend_from_slice(&b.to_le_bytes());
    }
    m.extend_from_slice(&(text.len() as u32).to_le_bytes());
    m.extend_from_slice(text.as_bytes());
    out.write_all(&m)
}

/// Runs one nvCOMP batch on the worker's stream and returns its results
/// (sizes, u64 each, then statuses, i32 each). `args` holds the four
/// argument arrays of `Batch::packed` (input addresses, input sizes, output
/// capacities, output addresses), `n` entries each.
///
/// # Safety
/// Every input and output address in `args` must lie in live device memory
/// of the stated size until this returns.
unsafe fn run_batch(
    lib: &nvcomp::Nvcomp,
    stream: &Arc<crate::cuda::GpuStream>,
    codec: Codec,
    args: &[u64],
    n: usize,
) -> std::result::Result<(Vec<u8>, BatchPhases), String> {
    let e = |e: crate::error::Error| e.to_string();
    let capacities = &args[2 * n..3 * n];
    let max_chunk = capacities.iter().copied().max().unwrap_or(0) as usize;
    let total = capacities.iter().sum::<u64>() as usize;
    let mut phases = BatchPhases::default();
    let t = Instant::now();
    let d_in = DeviceBuffer::from_host(stream, as_bytes(args), "nvCOMP arguments").map_err(e)?;
    phases.upload = t.elapsed();
    let t = Instant::now();
    let d_out = DeviceBuffer::alloc(stream, 12 * n as u64, "nvCOMP results").map_err(e)?;
    d_out.fill(stream, 0xff).map_err(e)?;
    let temp_bytes = lib.temp_size(codec, n, max_chunk, total, stream.raw().cast())?;
    let temp = DeviceBuffer::alloc(stream, temp_bytes as u64, "nvCOMP scratch").map_err(e)?;
    phases.setup = t.elapsed();
    phases.temp_bytes = temp_bytes as u64;
    let batch = Batch::packed(d_in.ptr(), d_out.ptr(), n);
    let t = Instant::now();
    // SAFETY: the argument and result arrays hold n entries in device memory;
    // the pages' memory is the caller's promise; everything lives until the
    // synchronize below.
    unsafe { lib.decompress(codec, &batch, temp.ptr(), temp_bytes, stream.raw().cast())? };
    phases.launch = t.elapsed();
    stream.synchronize().map_err(e)?;
    phases.nvcomp = t.elapsed();
    let t = Instant::now();
    let results = d_out.to_host().map_err(e)?;
    phases.download = t.elapsed();
    let t = Instant::now();
    drop((d_in, d_out, temp));
    // The frees are queued on the stream: let them finish before answering,
    // so that the worker's context is idle while the reader decodes.
    stream.synchronize().map_err(e)?;
    phases.release = t.elapsed();
    Ok((results, phases))
}

/// Where a worker batch's time went (reported to the reader's debug log).
#[derive(Debug, Default, Clone, Copy)]
struct BatchPhases {
    /// The exchange buffer mapped into the worker.
    map: Duration,
    /// The argument arrays to the device.
    upload: Duration,
    /// Result arrays, nvCOMP's scratch size and its allocation.
    setup: Duration,
    temp_bytes: u64,
    /// nvCOMP's call until it returns (its launches).
    launch: Duration,
    /// nvCOMP's call until the stream is idle (launch included).
    nvcomp: Duration,
    /// The results to the host.
    download: Duration,
    /// Frees, and the stream idle again.
    release: Duration,
}

/// Decompresses one tiny ZSTD frame (a raw block holding "x") with nvCOMP.
fn warm_up(lib: &nvcomp::Nvcomp, stream: &Arc<crate::cuda::GpuStream>) -> std::result::Result<(), String> {
    if !lib.supports(Codec::Zstd) {
        return Ok(());
    }
    let e = |e: crate::error::Error| e.to_string();
    let frame = [0x28u8, 0xB5, 0x2F, 0xFD, 0x20, 0x01, 0x09, 0x00, 0x00, b'x'];
    let src = DeviceBuffer::from_host(stream, &frame, "nvCOMP warm-up input").map_err(e)?;
    let dst = DeviceBuffer::alloc(stream, 256, "nvCOMP warm-up output").map_err(e)?;
    // SAFETY: one well-formed frame of 10 bytes in `src`, a 1-byte capacity
    // in `dst` (256 allocated); both live until run_batch returns.
    let (r, _) = unsafe { run_batch(lib, stream, Codec::Zstd, &[src.ptr(), frame.len() as u64, 1, dst.ptr()], 1)? };
    let status = i32::from_le_bytes(r[8..12].try_into().unwrap());
    if status != 0 {
        return Err(format!("nvCOMP's warm-up frame failed: {}", nvcomp::status_name(status)));
    }
    Ok(())
}

/// An exchange buffer mapped into the worker for one batch.
struct Mapped {
    base: u64,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `base` came from cuIpcOpenMemHandle and is closed once.
        unsafe { sys::cuIpcCloseMemHandle(self.base) };
    }
}

/// One request as the worker reads it.
struct Request {
    id: u32,
    codec: u32,
    handle: sys::CUipcMemHandle,
    len: u64,
    layout: BatchLayout,
}

/// Reads the next request; `None` when the parent closed the pipe.
fn read_request(input: &mut impl Read) -> std::result::Result<Option<Request>, String> {
    let io = |e: std::io::Error| format!("pipe: {e}");
    let mut head = [0u8; REQUEST_HEAD];
    match input.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(io(e)),
    }
    if &head[..4] != REQUEST {
        return Err("not a request".into());
    }
    let word = |k: usize| u32::from_le_bytes(head[4 * k..4 * k + 4].try_into().unwrap());
    let (id, codec, n) = (word(1), word(2), word(3) as usize);
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    for (d, s) in handle.reserved.iter_mut().zip(&head[16..80]) {
        *d = *s as _;
    }
    let len = u64::from_le_bytes(head[80..88].try_into().unwrap());
    if n > 1 << 24 {
        return Err("batch too large".into());
    }
    let mut body = vec![0u8; 13 * n];
    input.read_exact(&mut body).map_err(io)?;
    let layout = BatchLayout {
        input_lens: from_bytes(&body[..4 * n]),
        output_lens: from_bytes(&body[4 * n..8 * n]),
        skews: body[8 * n..9 * n].to_vec(),
        prefixes: from_bytes(&body[9 * n..13 * n]),
    };
    Ok(Some(Request { id, codec, handle, len, layout }))
}

/// Runs one request on `stream`: maps its exchange buffer, runs nvCOMP over
/// its pages, waits, and unmaps the buffer again (so that no later batch,
/// however corrupt its pages, can write into outputs the parent is reading).
fn run_request(lib: &nvcomp::Nvcomp, stream: &Arc<crate::cuda::GpuStream>, req: &Request) -> std::result::Result<(Vec<u8>, BatchPhases), String> {
    let codec = codec_of(req.codec).ok_or("unknown codec")?;
    let n = req.layout.len();
    let t = Instant::now();
    let mut base = 0;
    // SAFETY: valid out pointer; the handle names the parent's live allocation.
    let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, req.handle, 1) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuIpcOpenMemHandle: {r:?}"));
    }
    let mapped = Mapped { base };
    let map = t.elapsed();
    let (slots, end) = req.layout.slots();
    if end > req.len {
        return Err("the batch does not fit the exchange buffer".into());
    }
    // The reader chose the skews by its nvCOMP's alignment; this one's must agree.
    let align = lib.alignments(codec)?.input.max(1) as u64;
    if slots.iter().any(|s| (mapped.base + s.input) % align != 0) {
        return Err(format!("a page's input is not aligned to the {align} bytes nvCOMP needs"));
    }
    let mut host: Vec<u64> = Vec::with_capacity(4 * n);
    host.extend(slots.iter().map(|s| mapped.base + s.input));
    host.extend(slots.iter().map(|s| s.input_len));
    host.extend(slots.iter().map(|s| s.output_len));
    host.extend(slots.iter().map(|s| mapped.base + s.output));
    // SAFETY: every slot lies inside the mapped exchange buffer (checked
    // above), mapped until `mapped` drops, after run_batch's synchronize.
    let (bytes, mut phases) = unsafe { run_batch(lib, stream, codec, &host, n)? };
    drop(mapped);
    phases.map = map;
    Ok((bytes, phases))
}

/// The answer to a batch that ran: the worker's times, then the pages that
/// failed (index, status, size).
fn ran_answer(id: u32, layout: &BatchLayout, bytes: &[u8], phases: &BatchPhases, took: Duration) -> Vec<u8> {
    let n = layout.len();
    let sizes: Vec<u64> = from_bytes(&bytes[..8 * n]);
    let statuses: Vec<i32> = from_bytes(&bytes[8 * n..12 * n]);
    let mut failed: Vec<u8> = Vec::new();
    let mut count = 0u32;
    for k in 0..n {
        if statuses[k] != 0 || sizes[k] != layout.output_lens[k] as u64 {
            failed.extend_from_slice(&(k as u32).to_le_bytes());
            failed.extend_from_slice(&statuses[k].to_le_bytes());
            failed.extend_from_slice(&sizes[k].to_le_bytes());
            count += 1;
        }
    }
    let times = format!(
        "{} {} map_us={} upload_us={} setup_us={} scratch_bytes={} launch_us={} download_us={} release_us={}",
        took.as_micros(),
        phases.nvcomp.as_micros(),
        phases.map.as_micros(),
        phases.upload.as_micros(),
        phases.setup.as_micros(),
        phases.temp_bytes,
        phases.launch.as_micros(),
        phases.download.as_micros(),
        phases.release.as_micros()
    );
    let mut m = Vec::with_capacity(32 + times.len() + failed.len());
    let _ = say(&mut m, ANSWER, id, Some(0), &times);
    m.extend_from_slice(&count.to_le_bytes());
    m.extend_from_slice(&failed);
    m
}

/// Sets up the device and nvCOMP, says hello, then runs every request on a
/// thread and stream of its own, side by side, answering each when it ends
/// (answers carry their request's id). A batch that cannot run may have
/// left the context broken: its answer goes out, and the process exits.
fn serve(ordinal: usize, input: &mut impl Read, out: &Mutex<impl Write + Send>) -> std::result::Result<(), String> {
    let io = |e: std::io::Error| format!("pipe: {e}");
    let send = |bytes: &[u8]| -> std::result::Result<(), String> {
        let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
        out.write_all(bytes).and_then(|_| out.flush()).map_err(io)
    };
    let hello = |status: u32, text: &str| {
        let mut m = Vec::new();
        let _ = say(&mut m, HELLO, PROTOCOL, Some(status), text);
        send(&m)
    };
    let setup = (|| -> std::result::Result<_, String> {
        let ctx = GpuContext::get(ordinal).map_err(|e| e.to_string())?;
        let lib = nvcomp::nvcomp()?;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        Ok((ctx, lib, stream))
    })();
    let (ctx, lib, stream) = match setup {
        Ok(s) => s,
        Err(e) => {
            hello(1, &e)?;
            return Err(e);
        }
    };
    // The first launch of nvCOMP's kernels loads them (lazily, hundreds of
    // milliseconds); do it now, inside the start deadline, not in a batch's.
    if let Err(e) = warm_up(lib, &stream) {
        hello(1, &e)?;
        return Err(e);
    }
    hello(0, &lib.version)?;
    // Streams of finished batches, for the next ones.
    let streams: Mutex<Vec<Arc<crate::cuda::GpuStream>>> = Mutex::new(vec![stream]);
    std::thread::scope(|s| -> std::result::Result<(), String> {
        while let Some(req) = read_request(input)? {
            let (ctx, streams, send) = (&ctx, &streams, &send);
            let batch = move || {
                let started = Instant::now();
                let result = ctx.bind().map_err(|e| e.to_string()).and_then(|()| {
                    let stream = streams.lock().unwrap_or_else(|p| p.into_inner()).pop();
                    let stream = match stream {
                        Some(st) => st,
                        None => ctx.new_stream().map_err(|e| e.to_string())?,
                    };
                    let result = run_request(lib, &stream, &req);
                    if result.is_ok() {
                        streams.lock().unwrap_or_else(|p| p.into_inner()).push(stream);
                    }
                    result
                });
                match result {
                    Ok((bytes, phases)) => {
                        if send(&ran_answer(req.id, &req.layout, &bytes, &phases, started.elapsed())).is_err() {
                            std::process::exit(1);
                        }
                    }
                    Err(e) => {
                        let mut m = Vec::new();
                        let _ = say(&mut m, ANSWER, req.id, Some(1), &e);
                        let _ = send(&m);
                        // A CUDA error here may have poisoned the context: stop.
                        eprintln!("{WORKER_NAME}: {e}");
                        std::process::exit(1);
                    }
                }
            };
            std::thread::Builder::new()
                .name("gpq-nvcomp-batch".into())
                .spawn_scoped(s, batch)
                .map_err(|e| format!("no thread for a batch: {e}"))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_keep_skews_prefixes_stay_apart_and_align_outputs() {
        let layout = BatchLayout {
            input_lens: vec![10, 0, 300, 7],
            output_lens: vec![40, 1, 0, 9000],
            skews: vec![3, 15, 0, 8],
            prefixes: vec![0, 300, 5, 256],
        };
        let (slots, end) = layout.slots();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (k, s) in slots.iter().enumerate() {
            assert_eq!(s.input % SLOT_ALIGN, layout.skews[k] as u64, "slot {k}: input keeps its skew");
            assert_eq!(s.output % SLOT_ALIGN, 0, "slot {k}: output on a boundary");
            assert_eq!((s.input_len, s.output_len), (layout.input_lens[k] as u64, layout.output_lens[k] as u64));
            ranges.push((s.input, s.input + s.input_len));
            // An output with its prefix's room in front.
            ranges.push((s.output - layout.prefixes[k] as u64, s.output + s.output_len));
        }
        ranges.retain(|r| r.0 < r.1);
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "slots overlap: {ranges:?}");
        assert!(ranges.iter().all(|r| r.1 <= end) && end % SLOT_ALIGN == 0);
    }

    #[test]
    fn a_batch_takes_the_smallest_idle_buffer_that_fits() {
        assert_eq!(pick_idle(&[256, 64, 128, 64], 100), Ok(2));
        assert_eq!(pick_idle(&[256, 64, 128], 64), Ok(1));
        assert_eq!(pick_idle(&[256, 64, 128], 256), Ok(0));
        // None fits: the largest makes way for a new buffer.
        assert_eq!(pick_idle(&[256, 64, 128], 257), Err(Some(0)));
        assert_eq!(pick_idle(&[], 1), Err(None));
    }

    #[test]
    fn the_idle_pool_is_bounded_by_count_and_bytes() {
        let gib = 1u64 << 30;
        assert!(idle_has_room([].into_iter(), gib, gib));
        assert!(!idle_has_room([].into_iter(), gib + 1, gib));
        assert!(idle_has_room([gib; 3].into_iter(), gib, 4 * gib));
        assert!(!idle_has_room([gib; 4].into_iter(), 1, 4 * gib));
        assert!(!idle_has_room([1; MAX_IDLE_EXCHANGES].into_iter(), 1, u64::MAX));
        assert!(idle_has_room([1; MAX_IDLE_EXCHANGES - 1].into_iter(), 1, u64::MAX));
        assert!(!idle_has_room([u64::MAX - 1].into_iter(), 2, u64::MAX - 1), "sizes near the limit do not wrap");
    }

    #[test]
    fn codec_codes_round_trip() {
        for c in Codec::ALL {
            assert_eq!(codec_of(codec_code(c)), Some(c));
        }
        assert_eq!(codec_of(Codec::ALL.len() as u32), None);
    }
}
