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
//! An exchange buffer (a batch's compressed and decompressed bytes) is held
//! by the read until its pages are decoded (`HeldExchange`), then goes back
//! to a pool of idle buffers for later batches. Batches that run while
//! others are held (a read's overlapped groups, concurrent reads) take other
//! buffers from the pool or new ones. The worker keeps every buffer of the
//! pool mapped (each request names the live ones), so a buffer is allocated
//! and mapped once, not per batch. Buffers grow in 64 MiB steps; at most
//! `MAX_IDLE_EXCHANGES` stay idle, holding at most an eighth of the
//! device's memory; the rest are freed once the worker no longer maps them;
//! all are freed with a failed batch. They are not charged to a read's
//! device-memory budget; the worker's own context and nvCOMP scratch live
//! in its process.
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
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
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
const PROTOCOL: u32 = 4;
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
/// The most exchange buffers a request may name as live (the worker maps them all).
const MAX_LIVE_EXCHANGES: usize = 4096;
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

struct Worker {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
    /// nvCOMP's version in the worker.
    version: String,
}

struct Exchange {
    buffer: DeviceBuffer,
    handle: sys::CUipcMemHandle,
    generation: u64,
}

#[derive(Default)]
struct Client {
    worker: Option<Worker>,
    /// Exchange buffers no batch or read holds (the worker keeps them mapped).
    idle: Vec<Exchange>,
    /// Generations of the exchange buffers reads hold (`HeldExchange`).
    held: Vec<u64>,
    /// Bytes the idle buffers may hold together (set at the first batch).
    idle_cap: u64,
    generation: u64,
    failed_starts: u32,
    /// Exchange buffers the worker may still have mapped: freed after its
    /// next answer (it unmaps every buffer a request does not name as live
    /// before it answers).
    retired: Vec<DeviceBuffer>,
}

impl Client {
    /// Takes back an exchange buffer a batch or read is done with: into the
    /// idle pool where there is room, else freed (after the worker's next
    /// answer while it may still map it).
    fn give_back(&mut self, exchange: Exchange) {
        self.held.retain(|&g| g != exchange.generation);
        if idle_has_room(self.idle.iter().map(|x| x.buffer.len()), exchange.buffer.len(), self.idle_cap) {
            self.idle.push(exchange);
        } else if self.worker.is_some() {
            self.retired.push(exchange.buffer);
        }
    }

    /// Generations of every exchange buffer still in use or kept: the worker
    /// may unmap any other.
    fn live_generations(&self, current: u64) -> Vec<u64> {
        let mut live: Vec<u64> = self.idle.iter().map(|x| x.generation).chain(self.held.iter().copied()).collect();
        live.push(current);
        live
    }
}

fn clients() -> &'static Mutex<HashMap<usize, Client>> {
    static CLIENTS: OnceLock<Mutex<HashMap<usize, Client>>> = OnceLock::new();
    CLIENTS.get_or_init(Default::default)
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
    let ready = clients().lock().unwrap_or_else(|p| p.into_inner()).get(&ordinal).is_some_and(|c| c.worker.is_some());
    if ready {
        return;
    }
    // The thread takes the lock before this function returns, so a batch
    // that follows waits for the start instead of racing it.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new().name("gpq-nvcomp-worker-start".into()).spawn(move || {
        let mut guard = clients().lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(());
        let client = guard.entry(ordinal).or_default();
        if client.worker.is_some() || client.failed_starts >= MAX_FAILED_STARTS {
            return;
        }
        let Ok(path) = worker_path() else { return };
        match start(&path, ordinal) {
            Ok(w) => {
                client.failed_starts = 0;
                client.worker = Some(w);
            }
            Err(_) => client.failed_starts += 1,
        }
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

/// The worker of one device, held for one batch: an exchange buffer of at
/// least the bytes asked for, and a running worker. Dropped without
/// [`Lease::hold`], its buffer goes back to the pool.
pub(crate) struct Lease {
    guard: MutexGuard<'static, HashMap<usize, Client>>,
    ordinal: usize,
    exchange: Option<Exchange>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(x) = self.exchange.take() {
            self.client().give_back(x);
        }
    }
}

impl Lease {
    /// Starts (or reuses) the worker of `ctx`'s device and an exchange
    /// buffer of at least `bytes`. Errors say why the worker cannot be used.
    pub(crate) fn acquire(ctx: &Arc<GpuContext>, bytes: u64) -> std::result::Result<Lease, String> {
        let path = worker_path()?;
        if ctx.is_emulated() {
            return Err("the device is the CPU emulator".into());
        }
        let ordinal = ctx.ordinal();
        let mut guard = clients().lock().unwrap_or_else(|p| p.into_inner());
        let client = guard.entry(ordinal).or_default();
        if client.idle_cap == 0 {
            client.idle_cap = ctx.memory_info().map_or(4 << 30, |(_, total)| total / IDLE_EXCHANGE_SHARE);
        }
        if client.failed_starts >= MAX_FAILED_STARTS {
            return Err(format!("the nvCOMP worker failed to start {MAX_FAILED_STARTS} times"));
        }
        if client.worker.is_none() {
            match start(&path, ordinal) {
                Ok(w) => {
                    client.failed_starts = 0;
                    client.worker = Some(w);
                }
                Err(e) => {
                    client.failed_starts += 1;
                    return Err(e);
                }
            }
        }
        let sizes: Vec<u64> = client.idle.iter().map(|x| x.buffer.len()).collect();
        let exchange = match pick_idle(&sizes, bytes) {
            Ok(k) => client.idle.swap_remove(k),
            Err(make_way) => {
                if let Some(k) = make_way {
                    let old = client.idle.swap_remove(k);
                    client.retired.push(old.buffer);
                }
                let len = bytes.max(1).div_ceil(EXCHANGE_STEP) * EXCHANGE_STEP;
                let buffer = DeviceBuffer::alloc_plain(ctx, len, "nvCOMP worker exchange").map_err(|e| e.to_string())?;
                let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
                // SAFETY: `buffer` is a live cuMemAlloc allocation of this context; valid out pointer.
                let r = unsafe { sys::cuIpcGetMemHandle(&mut handle, buffer.ptr()) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuIpcGetMemHandle: {r:?}"));
                }
                client.generation += 1;
                Exchange { buffer, handle, generation: client.generation }
            }
        };
        Ok(Lease { guard, ordinal, exchange: Some(exchange) })
    }

    fn client(&mut self) -> &mut Client {
        self.guard.get_mut(&self.ordinal).expect("the lease's client exists")
    }

    /// Device address of the exchange buffer.
    pub(crate) fn base(&mut self) -> u64 {
        self.exchange.as_ref().map_or(0, |x| x.buffer.ptr())
    }

    /// nvCOMP's version in the worker.
    pub(crate) fn version(&mut self) -> String {
        self.client().worker.as_ref().map(|w| w.version.clone()).unwrap_or_default()
    }

    /// Has the worker decompress the pages of `layout` (whose inputs must be
    /// in their slots of the exchange buffer: the caller synchronized its
    /// copies) with `codec`, waiting at most `limit`. Any failure, a page
    /// nvCOMP rejects or decompresses to another size than its header says
    /// included, fails the whole batch (the other pages' outputs may have
    /// been overwritten by the bad one) and stops the worker.
    pub(crate) fn run(&mut self, codec: Codec, layout: &BatchLayout, limit: Duration) -> std::result::Result<Answer, String> {
        let result = self.exchange_batch(codec, layout, limit);
        self.client().retired.clear();
        if result.is_err() {
            self.abandon();
        }
        result
    }

    fn exchange_batch(&mut self, codec: Codec, layout: &BatchLayout, limit: Duration) -> std::result::Result<Answer, String> {
        let (handle, generation, len) = match &self.exchange {
            Some(x) => (x.handle, x.generation, x.buffer.len()),
            None => return Err("no exchange buffer".into()),
        };
        let client = self.client();
        let live = client.live_generations(generation);
        if live.len() > MAX_LIVE_EXCHANGES {
            return Err(format!("{} exchange buffers in use at once", live.len()));
        }
        let worker = client.worker.as_mut().ok_or("no worker")?;
        let n = u32::try_from(layout.len()).map_err(|_| "too many pages for one batch".to_string())?;
        let mut msg = Vec::with_capacity(96 + 13 * layout.len() + 8 * live.len());
        msg.extend_from_slice(REQUEST);
        msg.extend_from_slice(&codec_code(codec).to_le_bytes());
        msg.extend_from_slice(&n.to_le_bytes());
        msg.extend_from_slice(&generation.to_le_bytes());
        msg.extend(handle.reserved.iter().map(|&b| b as u8));
        msg.extend_from_slice(&len.to_le_bytes());
        msg.extend_from_slice(&(live.len() as u32).to_le_bytes());
        msg.extend_from_slice(as_bytes(&layout.input_lens));
        msg.extend_from_slice(as_bytes(&layout.output_lens));
        msg.extend_from_slice(&layout.skews);
        msg.extend_from_slice(as_bytes(&layout.prefixes));
        msg.extend_from_slice(as_bytes(&live));
        worker.to.write_all(&msg).and_then(|_| worker.to.flush()).map_err(|e| format!("writing to the nvCOMP worker: {e}"))?;
        let until = Instant::now() + limit;
        let mut head = [0u8; 12];
        read_exact_by(&mut worker.from, &mut head, until)?;
        if &head[..4] != ANSWER {
            return Err("the nvCOMP worker answered garbage".into());
        }
        let status = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let text_len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        if text_len > 1 << 16 {
            return Err("the nvCOMP worker answered garbage".into());
        }
        let mut text = vec![0u8; text_len];
        read_exact_by(&mut worker.from, &mut text, until)?;
        if status != 0 {
            return Err(format!("nvCOMP worker: {}", String::from_utf8_lossy(&text)));
        }
        // Then the pages that failed: how many, and each one's index, status and size.
        let mut count = [0u8; 4];
        read_exact_by(&mut worker.from, &mut count, until)?;
        let failed = u32::from_le_bytes(count) as usize;
        if failed > layout.len() {
            return Err("the nvCOMP worker answered garbage".into());
        }
        let mut body = vec![0u8; 16 * failed];
        read_exact_by(&mut worker.from, &mut body, until)?;
        if failed > 0 {
            let entry = |k: usize| {
                let e = &body[16 * k..16 * (k + 1)];
                let index = u32::from_le_bytes(e[0..4].try_into().unwrap()) as usize;
                (index, i32::from_le_bytes(e[4..8].try_into().unwrap()), u64::from_le_bytes(e[8..16].try_into().unwrap()))
            };
            let rejected: Vec<_> = (0..failed).map(entry).filter(|&(_, status, _)| status != 0).collect();
            return Err(match (rejected.first(), entry(0)) {
                (Some(&(_, status, _)), _) => {
                    format!("nvCOMP in the worker rejected {} of {n} pages (first: {})", rejected.len(), nvcomp::status_name(status))
                }
                (None, (index, _, size)) => {
                    let promised = layout.output_lens.get(index).copied().unwrap_or(0);
                    format!("nvCOMP {codec:?} in the worker decompressed a page to {size} bytes, its header says {promised}")
                }
            });
        }
        // On success the text is the worker's times in microseconds (all, and
        // nvCOMP's part), then its phases as `name=value` words.
        let text = String::from_utf8_lossy(&text);
        let mut words = text.split_whitespace();
        let mut us = || Duration::from_micros(words.next().and_then(|t| t.parse().ok()).unwrap_or(0));
        let (worker_time, nvcomp_time) = (us(), us());
        let phases = words.collect::<Vec<_>>().join(" ");
        Ok(Answer { worker_time, nvcomp_time, phases })
    }

    /// Kills the worker and frees the batch's exchange buffer and the idle
    /// ones (for a batch whose answer the caller finds wrong). Buffers reads
    /// hold are freed when they let go.
    pub(crate) fn abandon(&mut self) {
        let client = self.client();
        if let Some(mut w) = client.worker.take() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
        client.idle.clear();
        client.retired.clear();
        self.exchange = None;
    }

    /// Ends the lease keeping the exchange buffer, with the outputs of the
    /// batch just run, for the reader's decoders: the worker is free for
    /// other batches (which get an exchange buffer of their own meanwhile),
    /// and the buffer returns when the [`HeldExchange`] is dropped.
    pub(crate) fn hold(mut self, stream: &Arc<GpuStream>) -> HeldExchange {
        let ordinal = self.ordinal;
        let exchange = self.exchange.take();
        if let Some(x) = &exchange {
            let generation = x.generation;
            self.client().held.push(generation);
        }
        HeldExchange { ordinal, exchange, stream: stream.clone() }
    }
}

/// An exchange buffer taken out of the worker's rotation while a read's
/// decoders use the pages the worker decompressed into it (so they need not
/// be copied out). Dropping it waits for the reading stream (its kernels
/// may still read the pages), then gives the buffer back to the pool.
pub(crate) struct HeldExchange {
    ordinal: usize,
    exchange: Option<Exchange>,
    stream: Arc<GpuStream>,
}

impl Drop for HeldExchange {
    fn drop(&mut self) {
        let Some(exchange) = self.exchange.take() else { return };
        let synchronized = self.stream.synchronize().is_ok();
        let mut guard = clients().lock().unwrap_or_else(|p| p.into_inner());
        let client = guard.entry(self.ordinal).or_default();
        if synchronized {
            client.give_back(exchange);
        } else {
            // A lost context: the buffer goes with it.
            client.held.retain(|&g| g != exchange.generation);
        }
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

fn start(path: &PathBuf, ordinal: usize) -> std::result::Result<Worker, String> {
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
            Ok(Worker { child, to, from, version })
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
    let stdout = std::io::stdout();
    match serve(ordinal, &mut stdin.lock(), &mut stdout.lock()) {
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

struct Mapped {
    generation: u64,
    base: u64,
    len: u64,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `base` came from cuIpcOpenMemHandle and is closed once.
        unsafe { sys::cuIpcCloseMemHandle(self.base) };
    }
}

fn serve(ordinal: usize, input: &mut impl Read, out: &mut impl Write) -> std::result::Result<(), String> {
    let io = |e: std::io::Error| format!("pipe: {e}");
    let setup = (|| -> std::result::Result<_, String> {
        let ctx = GpuContext::get(ordinal).map_err(|e| e.to_string())?;
        let lib = nvcomp::nvcomp()?;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        Ok((ctx, lib, stream))
    })();
    let (ctx, lib, stream) = match setup {
        Ok(s) => s,
        Err(e) => {
            say(out, HELLO, PROTOCOL, Some(1), &e).and_then(|_| out.flush()).map_err(io)?;
            return Err(e);
        }
    };
    // The first launch of nvCOMP's kernels loads them (lazily, hundreds of
    // milliseconds); do it now, inside the start deadline, not in a batch's.
    if let Err(e) = warm_up(lib, &stream) {
        say(out, HELLO, PROTOCOL, Some(1), &e).and_then(|_| out.flush()).map_err(io)?;
        return Err(e);
    }
    say(out, HELLO, PROTOCOL, Some(0), &lib.version).and_then(|_| out.flush()).map_err(io)?;
    // Every exchange buffer the parent still uses, mapped once.
    let mut mapped: Vec<Mapped> = Vec::new();
    loop {
        let mut head = [0u8; 4 + 4 + 4 + 8 + 64 + 8 + 4];
        match input.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        }
        if &head[..4] != REQUEST {
            return Err("not a request".into());
        }
        let codec = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let n = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        let generation = u64::from_le_bytes(head[12..20].try_into().unwrap());
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        for (d, s) in handle.reserved.iter_mut().zip(&head[20..84]) {
            *d = *s as _;
        }
        let len = u64::from_le_bytes(head[84..92].try_into().unwrap());
        let live_count = u32::from_le_bytes(head[92..96].try_into().unwrap()) as usize;
        if n > 1 << 24 || live_count > MAX_LIVE_EXCHANGES {
            return Err("batch too large".into());
        }
        let mut body = vec![0u8; 13 * n + 8 * live_count];
        input.read_exact(&mut body).map_err(io)?;
        let live: Vec<u64> = from_bytes(&body[13 * n..]);
        let layout = BatchLayout {
            input_lens: from_bytes(&body[..4 * n]),
            output_lens: from_bytes(&body[4 * n..8 * n]),
            skews: body[8 * n..9 * n].to_vec(),
            prefixes: from_bytes(&body[9 * n..13 * n]),
        };
        let started = Instant::now();
        let result = (|| -> std::result::Result<(Vec<u8>, BatchPhases), String> {
            let codec = codec_of(codec).ok_or("unknown codec")?;
            ctx.bind().map_err(|e| e.to_string())?;
            // Buffers the parent no longer names are unmapped before the
            // answer: it frees them after it.
            mapped.retain(|m| m.generation == generation || live.contains(&m.generation));
            let k = match mapped.iter().position(|m| m.generation == generation) {
                Some(k) => k,
                None => {
                    let mut base = 0;
                    // SAFETY: valid out pointer; the handle names the parent's live allocation.
                    let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, handle, 1) };
                    if r != sys::CUresult::CUDA_SUCCESS {
                        return Err(format!("cuIpcOpenMemHandle: {r:?}"));
                    }
                    mapped.push(Mapped { generation, base, len });
                    mapped.len() - 1
                }
            };
            let m = &mapped[k];
            let (slots, end) = layout.slots();
            if end > m.len {
                return Err("the batch does not fit the exchange buffer".into());
            }
            // The reader chose the skews by its nvCOMP's alignment; this one's must agree.
            let align = lib.alignments(codec)?.input.max(1) as u64;
            if slots.iter().any(|s| (m.base + s.input) % align != 0) {
                return Err(format!("a page's input is not aligned to the {align} bytes nvCOMP needs"));
            }
            let mut host: Vec<u64> = Vec::with_capacity(4 * n);
            host.extend(slots.iter().map(|s| m.base + s.input));
            host.extend(slots.iter().map(|s| s.input_len));
            host.extend(slots.iter().map(|s| s.output_len));
            host.extend(slots.iter().map(|s| m.base + s.output));
            // SAFETY: every slot lies inside the mapped exchange buffer
            // (checked above), mapped until a later request leaves it out.
            unsafe { run_batch(lib, &stream, codec, &host, n) }
        })();
        match result {
            Ok((bytes, phases)) => {
                // Only the pages that failed go back: index, status, size.
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
                    "{} {} upload_us={} setup_us={} scratch_bytes={} launch_us={} download_us={} release_us={}",
                    started.elapsed().as_micros(),
                    phases.nvcomp.as_micros(),
                    phases.upload.as_micros(),
                    phases.setup.as_micros(),
                    phases.temp_bytes,
                    phases.launch.as_micros(),
                    phases.download.as_micros(),
                    phases.release.as_micros()
                );
                say(out, ANSWER, 0, None, &times).map_err(io)?;
                out.write_all(&count.to_le_bytes()).and_then(|_| out.write_all(&failed)).and_then(|_| out.flush()).map_err(io)?;
            }
            Err(e) => {
                say(out, ANSWER, 1, None, &e).and_then(|_| out.flush()).map_err(io)?;
                // A CUDA error here may have poisoned the context: stop.
                return Err(e);
            }
        }
    }
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
