//! One guarded read of a file by gpq, compared with arrow-rs and classified.
//!
//! Panics are caught (and their message and location kept, without the
//! default hook's noise on stderr); errors keep their [`gpq::Error::kind`].
//! The caller (the `read` subcommand, the tests) decides what to do with the
//! [`Outcome`]; hangs and crashes are for the process outside to see.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Mutex, Once};
use std::time::Instant;

use arrow::array::RecordBatch;

use crate::compare::{compare, one_line, read_arrow_rs};

/// How the read of one file ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// gpq and arrow-rs both read it, with the same values.
    Equal,
    /// Both read it, with different values (or gpq's types do not cast).
    Differs,
    /// gpq returned an error, and arrow-rs failed too.
    GpqError,
    /// gpq returned an error for a file arrow-rs reads.
    GpqErrorArrowOk,
    /// gpq read a file arrow-rs rejects.
    GpqOkArrowError,
    /// gpq panicked.
    Panic,
    /// gpq reported a lost CUDA context ([`gpq::Error::is_context_lost`]).
    ContextLost,
    /// gpq read it; not compared (`--no-compare`).
    GpqOk,
}

impl Outcome {
    /// Every outcome, in report order.
    pub const ALL: [Outcome; 8] = [
        Outcome::Equal,
        Outcome::Differs,
        Outcome::GpqError,
        Outcome::GpqErrorArrowOk,
        Outcome::GpqOkArrowError,
        Outcome::Panic,
        Outcome::ContextLost,
        Outcome::GpqOk,
    ];

    /// The name printed in `END` lines and summaries.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Equal => "equal",
            Outcome::Differs => "differs",
            Outcome::GpqError => "gpq-error",
            Outcome::GpqErrorArrowOk => "gpq-error-arrow-ok",
            Outcome::GpqOkArrowError => "gpq-ok-arrow-error",
            Outcome::Panic => "panic",
            Outcome::ContextLost => "context-lost",
            Outcome::GpqOk => "gpq-ok",
        }
    }

    /// Whether the outcome is a bug in gpq whatever the input (a panic or a lost context).
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Panic | Outcome::ContextLost)
    }
}

/// The result of [`check_file`].
#[derive(Clone, Debug)]
pub struct Checked {
    /// How it ended.
    pub outcome: Outcome,
    /// Milliseconds the gpq read took (with the copy back to the host).
    pub millis: u128,
    /// gpq's error kind, where gpq returned an error.
    pub gpq_kind: Option<&'static str>,
    /// What happened, on one line: the error, the panic, the first difference.
    pub detail: String,
}

/// What a guarded gpq read gave.
#[derive(Debug)]
pub enum GpqRead {
    /// The decoded table, copied to the host.
    Ok(RecordBatch),
    /// gpq's error.
    Err(gpq::Error),
    /// gpq panicked, with this message and location.
    Panicked(String),
}

thread_local! {
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);
static HOOK: Once = Once::new();

/// Runs `f`, catching a panic: `Err` holds its message and location. While
/// `f` runs on this thread, panics are not printed by the default hook
/// (panics elsewhere still are).
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(|g| g.get()) {
                let msg = gpq::error::panic_message(info.payload());
                let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{msg}{at}"));
            } else {
                default(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(was));
    r.map_err(|_| LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_else(|| "(no message)".into()))
}

/// Reads `path` with gpq (default options) and copies the result to the
/// host, catching panics.
pub fn read_gpq(path: &Path) -> GpqRead {
    let r = guarded(|| gpq::read_parquet_to_device(path, &gpq::ReadOptions::default()).and_then(|t| t.to_record_batch()));
    match r {
        Ok(Ok(batch)) => GpqRead::Ok(batch),
        Ok(Err(e)) => GpqRead::Err(e),
        Err(panic) => GpqRead::Panicked(panic),
    }
}

/// Reads `path` with gpq and, when `compare_with_arrow`, with arrow-rs, and
/// classifies the result. `step` is called with `"gpq"` and `"arrow"` before
/// each reader starts (so a crash can be put down to the right one).
pub fn check_file(path: &Path, compare_with_arrow: bool, mut step: impl FnMut(&str)) -> Checked {
    step("gpq");
    let started = Instant::now();
    let got = read_gpq(path);
    let millis = started.elapsed().as_millis();
    let checked = |outcome, gpq_kind, detail: String| Checked { outcome, millis, gpq_kind, detail: one_line(&detail, 600) };
    let err = match got {
        GpqRead::Panicked(msg) => return checked(Outcome::Panic, None, format!("gpq panicked: {msg}")),
        GpqRead::Err(e) if e.is_context_lost() => return checked(Outcome::ContextLost, Some(e.kind()), e.to_string()),
        GpqRead::Err(e) => Err(e),
        GpqRead::Ok(batch) => Ok(batch),
    };
    if !compare_with_arrow {
        return match err {
            Ok(b) => checked(Outcome::GpqOk, None, format!("{} rows", b.num_rows())),
            Err(e) => checked(Outcome::GpqError, Some(e.kind()), e.to_string()),
        };
    }
    // What gpq said goes out before arrow-rs starts, so that a file on which
    // arrow-rs then hangs or crashes still has gpq's outcome in the report.
    let gpq_said = match &err {
        Ok(b) => format!("ok {} rows", b.num_rows()),
        Err(e) => format!("error kind={} {}", e.kind(), one_line(&e.to_string(), 300)),
    };
    step(&format!("gpq-done {millis} {gpq_said}"));
    step("arrow");
    let expected = read_arrow_rs(path);
    match (err, expected) {
        (Ok(got), Ok(expected)) => match compare(&expected, &got) {
            Ok(()) => checked(Outcome::Equal, None, format!("{} rows", got.num_rows())),
            Err(d) => checked(Outcome::Differs, None, d),
        },
        (Ok(got), Err(a)) => checked(Outcome::GpqOkArrowError, None, format!("gpq read {} rows; arrow-rs: {a}", got.num_rows())),
        (Err(e), Ok(_)) => checked(Outcome::GpqErrorArrowOk, Some(e.kind()), e.to_string()),
        (Err(e), Err(a)) => checked(Outcome::GpqError, Some(e.kind()), format!("{e}; arrow-rs: {a}")),
    }
}

/// Whether gpq still reads `good` right: `Err` says why not.
pub fn health_check(good: &Path, expected: &RecordBatch) -> Result<(), String> {
    match read_gpq(good) {
        GpqRead::Ok(got) => compare(expected, &got),
        GpqRead::Err(e) => Err(format!("[{}] {e}", e.kind())),
        GpqRead::Panicked(p) => Err(format!("panicked: {p}")),
    }
    .map_err(|e| one_line(&e, 400))
}
