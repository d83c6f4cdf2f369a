//! nvCOMP in a worker process, for pages no device check can vouch for.
//!
//! ZSTD and GZIP pages cannot be proved well-formed on the device before
//! nvCOMP sees them (a validator would be a decoder), and on corrupt input
//! nvCOMP may read or write out of bounds or never finish; in this process
//! either would lose the CUDA context for every later read. So such batches
//! go to `gpq-nvcomp-worker`, a child process with a CUDA context of its own
//! on the same GPU. The pages travel through an exchange buffer the two
//! share by CUDA IPC: the parent copies the compressed pages in (on the
//! device), the worker runs nvCOMP from and into it and reports each page's
//! size and status, and the parent copies the results out. The parent waits
//! with a deadline. A worker that faults, dies, overruns the deadline or
//! reports any failed page is killed and not reused (corrupt input may have
//! written anywhere in its memory), the exchange buffer is freed, and the
//! batch's pages go to the CPU decoder, whose verdict stands.
//!
//! The exchange buffer (the batch's compressed and decompressed bytes) is
//! kept for the next batch, grows in 64 MiB steps, is freed with a failed
//! batch, and is not charged to a read's device-memory budget; the worker's
//! own context and nvCOMP scratch live in its process.
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
use crate::cuda::{DeviceBuffer, GpuContext, as_bytes, from_bytes};

/// File name of the worker executable.
pub const WORKER_NAME: &str = "gpq-nvcomp-worker";

const HELLO: &[u8; 4] = b"GPQW";
const REQUEST: &[u8; 4] = b"GPQR";
const ANSWER: &[u8; 4] = b"GPQA";
const PROTOCOL: u32 = 1;
/// Exchange buffers grow in steps of this many bytes.
const EXCHANGE_STEP: u64 = 64 << 20;
/// How long a new worker may take to start, at least.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// Consecutive failed starts after which the worker is no longer tried.
const MAX_FAILED_STARTS: u32 = 3;

/// One page of a batch: offsets into the exchange buffer.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Slot {
    pub input: u64,
    pub input_len: u64,
    pub output: u64,
    pub output_len: u64,
}

/// What the worker said about a batch.
pub(crate) struct Answer {
    /// Per page: bytes written.
    pub sizes: Vec<u64>,
    /// Per page: nvCOMP's status (0 is success).
    pub statuses: Vec<i32>,
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
    exchange: Option<Exchange>,
    generation: u64,
    failed_starts: u32,
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

/// The worker of one device, held for one batch: an exchange buffer of at
/// least the bytes asked for, and a running worker.
pub(crate) struct Lease {
    guard: MutexGuard<'static, HashMap<usize, Client>>,
    ordinal: usize,
    /// Exchange buffers the worker may still have mapped (freed after its answer).
    retired: Vec<DeviceBuffer>,
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
        let mut retired = Vec::new();
        if client.exchange.as_ref().is_none_or(|x| x.buffer.len() < bytes) {
            let len = bytes.max(1).div_ceil(EXCHANGE_STEP) * EXCHANGE_STEP;
            let buffer = DeviceBuffer::alloc_plain(ctx, len, "nvCOMP worker exchange").map_err(|e| e.to_string())?;
            let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: `buffer` is a live cuMemAlloc allocation of this context; valid out pointer.
            let r = unsafe { sys::cuIpcGetMemHandle(&mut handle, buffer.ptr()) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuIpcGetMemHandle: {r:?}"));
            }
            client.generation += 1;
            if let Some(old) = client.exchange.replace(Exchange { buffer, handle, generation: client.generation }) {
                retired.push(old.buffer);
            }
        }
        Ok(Lease { guard, ordinal, retired })
    }

    fn client(&mut self) -> &mut Client {
        self.guard.get_mut(&self.ordinal).expect("the lease's client exists")
    }

    /// Device address of the exchange buffer.
    pub(crate) fn base(&mut self) -> u64 {
        self.client().exchange.as_ref().map_or(0, |x| x.buffer.ptr())
    }

    /// nvCOMP's version in the worker.
    pub(crate) fn version(&mut self) -> String {
        self.client().worker.as_ref().map(|w| w.version.clone()).unwrap_or_default()
    }

    /// Has the worker decompress `slots` (offsets into the exchange buffer,
    /// whose inputs must be in place: the caller synchronized its copies)
    /// with `codec`, waiting at most `limit`. Any failure, a page nvCOMP
    /// rejects included, fails the whole batch (the other pages' outputs may
    /// have been overwritten by the bad one) and stops the worker.
    pub(crate) fn run(&mut self, codec: Codec, slots: &[Slot], limit: Duration) -> std::result::Result<Answer, String> {
        let result = self.exchange_batch(codec, slots, limit).and_then(|a| {
            match a.statuses.iter().position(|&s| s != 0) {
                Some(k) => Err(format!(
                    "nvCOMP in the worker rejected {} of {} pages (first: {})",
                    a.statuses.iter().filter(|&&s| s != 0).count(),
                    slots.len(),
                    nvcomp::status_name(a.statuses[k])
                )),
                None => Ok(a),
            }
        });
        self.retired.clear();
        if result.is_err() {
            self.abandon();
        }
        result
    }

    fn exchange_batch(&mut self, codec: Codec, slots: &[Slot], limit: Duration) -> std::result::Result<Answer, String> {
        let client = self.client();
        let (handle, generation, len) = match &client.exchange {
            Some(x) => (x.handle, x.generation, x.buffer.len()),
            None => return Err("no exchange buffer".into()),
        };
        let worker = client.worker.as_mut().ok_or("no worker")?;
        let n = u32::try_from(slots.len()).map_err(|_| "too many pages for one batch".to_string())?;
        let mut msg = Vec::with_capacity(96 + 32 * slots.len());
        msg.extend_from_slice(REQUEST);
        msg.extend_from_slice(&codec_code(codec).to_le_bytes());
        msg.extend_from_slice(&n.to_le_bytes());
        msg.extend_from_slice(&generation.to_le_bytes());
        msg.extend(handle.reserved.iter().map(|&b| b as u8));
        msg.extend_from_slice(&len.to_le_bytes());
        msg.extend_from_slice(as_bytes(slots));
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
        let mut body = vec![0u8; 12 * slots.len()];
        read_exact_by(&mut worker.from, &mut body, until)?;
        let sizes: Vec<u64> = from_bytes(&body[..8 * slots.len()]);
        let statuses: Vec<i32> = from_bytes(&body[8 * slots.len()..]);
        Ok(Answer { sizes, statuses })
    }

    /// Kills the worker and frees the exchange buffer (for a batch whose
    /// answer the caller finds wrong).
    pub(crate) fn abandon(&mut self) {
        let client = self.client();
        if let Some(mut w) = client.worker.take() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
        client.exchange = None;
    }
}

fn codec_code(c: Codec) -> u32 {
    match c {
        Codec::Snappy => 0,
        Codec::Zstd => 1,
        Codec::Lz4 => 2,
        Codec::Gzip => 3,
    }
}

fn codec_of(code: u32) -> Option<Codec> {
    Some(match code {
        0 => Codec::Snappy,
        1 => Codec::Zstd,
        2 => Codec::Lz4,
        3 => Codec::Gzip,
        _ => return None,
    })
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
        (Some(i), Some(o)) => (i, o),
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

/// Decompresses one tiny ZSTD frame (a raw block holding "x") with nvCOMP.
fn warm_up(lib: &nvcomp::Nvcomp, stream: &Arc<crate::cuda::GpuStream>) -> std::result::Result<(), String> {
    if !lib.supports(Codec::Zstd) {
        return Ok(());
    }
    let e = |e: crate::error::Error| e.to_string();
    let frame = [0x28u8, 0xB5, 0x2F, 0xFD, 0x20, 0x01, 0x09, 0x00, 0x00, b'x'];
    let src = DeviceBuffer::from_host(stream, &frame, "nvCOMP warm-up input").map_err(e)?;
    let dst = DeviceBuffer::alloc(stream, 256, "nvCOMP warm-up output").map_err(e)?;
    let host: [u64; 4] = [src.ptr(), frame.len() as u64, 1, dst.ptr()];
    let d_in = DeviceBuffer::from_host(stream, as_bytes(&host), "nvCOMP warm-up arguments").map_err(e)?;
    let d_out = DeviceBuffer::alloc(stream, 16, "nvCOMP warm-up results").map_err(e)?;
    let temp_bytes = lib.temp_size(Codec::Zstd, 1, 1, 1, stream.raw().cast())?;
    let temp = DeviceBuffer::alloc(stream, temp_bytes as u64, "nvCOMP warm-up scratch").map_err(e)?;
    let batch = Batch::packed(d_in.ptr(), d_out.ptr(), 1);
    // SAFETY: one well-formed frame of 10 bytes in `src`, a 1-byte capacity in
    // `dst` (256 allocated); every array is live until the synchronize.
    unsafe { lib.decompress(Codec::Zstd, &batch, temp.ptr(), temp_bytes, stream.raw().cast())? };
    stream.synchronize().map_err(e)?;
    let r = d_out.to_host().map_err(e)?;
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
    let mut mapped: Option<Mapped> = None;
    loop {
        let mut head = [0u8; 4 + 4 + 4 + 8 + 64 + 8];
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
        if n > 1 << 24 {
            return Err("batch too large".into());
        }
        let mut body = vec![0u8; 32 * n];
        input.read_exact(&mut body).map_err(io)?;
        let slots: Vec<Slot> = from_bytes(&body);
        let result = (|| -> std::result::Result<Vec<u8>, String> {
            let codec = codec_of(codec).ok_or("unknown codec")?;
            if mapped.as_ref().is_none_or(|m| m.generation != generation) {
                mapped = None;
                ctx.bind().map_err(|e| e.to_string())?;
                let mut base = 0;
                // SAFETY: valid out pointer; the handle names the parent's live allocation.
                let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, handle, 1) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuIpcOpenMemHandle: {r:?}"));
                }
                mapped = Some(Mapped { generation, base, len });
            }
            let m = mapped.as_ref().expect("mapped above");
            let inside = |off: u64, l: u64| off.checked_add(l).is_some_and(|end| end <= m.len);
            if slots.iter().any(|s| !inside(s.input, s.input_len) || !inside(s.output, s.output_len)) {
                return Err("a page lies outside the exchange buffer".into());
            }
            let mut host: Vec<u64> = Vec::with_capacity(4 * n);
            host.extend(slots.iter().map(|s| m.base + s.input));
            host.extend(slots.iter().map(|s| s.input_len));
            host.extend(slots.iter().map(|s| s.output_len));
            host.extend(slots.iter().map(|s| m.base + s.output));
            let d_in = DeviceBuffer::from_host(&stream, as_bytes(&host), "nvCOMP arguments").map_err(|e| e.to_string())?;
            let d_out = DeviceBuffer::alloc(&stream, 12 * n as u64, "nvCOMP results").map_err(|e| e.to_string())?;
            d_out.fill(&stream, 0xff).map_err(|e| e.to_string())?;
            let max_chunk = slots.iter().map(|s| s.output_len as usize).max().unwrap_or(0);
            let total: usize = slots.iter().map(|s| s.output_len as usize).sum();
            let temp_bytes = lib.temp_size(codec, n, max_chunk, total, stream.raw().cast())?;
            let temp = DeviceBuffer::alloc(&stream, temp_bytes as u64, "nvCOMP scratch").map_err(|e| e.to_string())?;
            let batch = Batch::packed(d_in.ptr(), d_out.ptr(), n);
            // SAFETY: every array holds n entries in device memory; each page's
            // input and output lie inside the mapped exchange buffer (checked
            // above); all buffers live until the synchronize below.
            unsafe { lib.decompress(codec, &batch, temp.ptr(), temp_bytes, stream.raw().cast())? };
            stream.synchronize().map_err(|e| e.to_string())?;
            d_out.to_host().map_err(|e| e.to_string())
        })();
        match result {
            Ok(bytes) => {
                say(out, ANSWER, 0, None, "").map_err(io)?;
                out.write_all(&bytes).and_then(|_| out.flush()).map_err(io)?;
            }
            Err(e) => {
                say(out, ANSWER, 1, None, &e).and_then(|_| out.flush()).map_err(io)?;
                // A CUDA error here may have poisoned the context: stop.
                return Err(e);
            }
        }
    }
}
