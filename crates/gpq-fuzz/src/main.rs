//! The `gpq-fuzz` command.
//!
//! ```text
//! gpq-fuzz mutate --seeds DIR --out DIR --count N [--rng-seed S]
//! gpq-fuzz read --good FILE [--no-compare]      (paths on stdin, one a line)
//! ```
//!
//! `read` is one long-lived process for many files: for each path it prints
//! `BEGIN <path>` (and `STEP gpq`, `STEP gpq-done <millis> <ok N rows | error
//! kind=<kind> <message>>`, `STEP arrow`, `STEP health` as it goes),
//! then `END <path> <outcome> <millis> kind=<gpq error kind or -> <detail>`,
//! flushing after every line so a driver can tell a hang or a crash and which
//! file caused it. After each file it reads the known-good file `--good` and
//! compares it with arrow-rs's result: if that fails, the `END` line ends in
//! ` UNHEALTHY` and the process exits with code 3. At startup it prints
//! `READY` once the good file has read right (the first read compiles or
//! loads the kernels), or `FATAL <why>` and exits with code 2. At the end:
//! `SUMMARY files=N equal=.. differs=.. ...`. With `GPQ_EMULATE=1` (and the
//! `emulator` feature) reads run on gpq's CPU emulator.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use gpq_fuzz::check::{Outcome, check_file, health_check};
use gpq_fuzz::compare::read_arrow_rs;
use gpq_fuzz::mutate::mutate_dir;

const USAGE: &str = "usage:
  gpq-fuzz mutate --seeds DIR --out DIR --count N [--rng-seed S]
  gpq-fuzz read --good FILE [--no-compare]     (Parquet paths on stdin, one a line)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("mutate") => run_mutate(&args[1..]),
        Some("read") => run_read(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(format!("expected a subcommand\n{USAGE}")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpq-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--name value` options and bare `--flag`s.
struct Args {
    values: BTreeMap<String, String>,
    flags: Vec<String>,
}

impl Args {
    fn parse(args: &[String], with_value: &[&str], flags: &[&str]) -> Result<Args, String> {
        let mut values = BTreeMap::new();
        let mut set = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            if with_value.contains(&name) {
                let v = match inline {
                    Some(v) => v,
                    None => it.next().ok_or_else(|| format!("{name} needs a value"))?.clone(),
                };
                values.insert(name.to_string(), v);
            } else if flags.contains(&name) && inline.is_none() {
                set.push(name.to_string());
            } else {
                return Err(format!("unexpected argument {a:?}\n{USAGE}"));
            }
        }
        Ok(Args { values, flags: set })
    }

    fn required(&self, name: &str) -> Result<&str, String> {
        self.values.get(name).map(String::as_str).ok_or_else(|| format!("{name} is required\n{USAGE}"))
    }

    fn number(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => {
                let v = v.replace('_', "");
                let parsed = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => v.parse(),
                };
                parsed.map_err(|e| format!("{name}: {e}"))
            }
        }
    }

    fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }
}

fn run_mutate(args: &[String]) -> Result<ExitCode, String> {
    let a = Args::parse(args, &["--seeds", "--out", "--count", "--rng-seed"], &[])?;
    let seeds = PathBuf::from(a.required("--seeds")?);
    let out = PathBuf::from(a.required("--out")?);
    let count = a.number("--count", 1000)? as usize;
    let rng_seed = a.number("--rng-seed", 1)?;
    let written = mutate_dir(&seeds, &out, count, rng_seed).map_err(|e| format!("mutate: {e}"))?;
    let mut by_class: BTreeMap<&str, usize> = BTreeMap::new();
    for w in &written {
        *by_class.entry(w.class.name()).or_default() += 1;
    }
    let classes: Vec<String> = by_class.iter().map(|(c, n)| format!("{c}={n}")).collect();
    println!("wrote {} mutants to {} (rng seed {rng_seed}): {}", written.len(), out.display(), classes.join(" "));
    Ok(ExitCode::SUCCESS)
}

fn emit(out: &mut impl Write, line: &str) {
    // A driver that went away ends the run.
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(4);
    }
}

fn summary(counts: &BTreeMap<&'static str, usize>, kinds: &BTreeMap<&'static str, usize>, files: usize, unhealthy: usize) -> String {
    let mut s = format!("SUMMARY files={files}");
    for o in Outcome::ALL {
        s += &format!(" {}={}", o.name(), counts.get(o.name()).copied().unwrap_or(0));
    }
    s += &format!(" unhealthy={unhealthy}");
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    s += &format!(" gpq-error-kinds={}", if kinds.is_empty() { "-".to_string() } else { kinds.join(",") });
    s
}

fn run_read(args: &[String]) -> Result<ExitCode, String> {
    let a = Args::parse(args, &["--good"], &["--no-compare"])?;
    let good = PathBuf::from(a.required("--good")?);
    let compare_with_arrow = !a.flag("--no-compare");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();

    // The reference, and a first read that builds or loads the kernels.
    let reference = match read_arrow_rs(&good) {
        Ok(b) => b,
        Err(e) => {
            emit(&mut out, &format!("FATAL arrow-rs cannot read the good file {}: {e}", good.display()));
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(e) = health_check(&good, &reference) {
        emit(&mut out, &format!("FATAL gpq does not read the good file {} right: {e}", good.display()));
        return Ok(ExitCode::from(2));
    }
    emit(&mut out, "READY");

    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut files = 0;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let path = line.trim_end_matches(['\r', '\n']);
        if path.trim().is_empty() {
            continue;
        }
        files += 1;
        emit(&mut out, &format!("BEGIN {path}"));
        let checked = check_file(path.as_ref(), compare_with_arrow, |s| emit(&mut out, &format!("STEP {s}")));
        *counts.entry(checked.outcome.name()).or_default() += 1;
        if let Some(k) = checked.gpq_kind {
            *kinds.entry(k).or_default() += 1;
        }
        emit(&mut out, "STEP health");
        let health = health_check(&good, &reference);
        let mut end = format!(
            "END {path} {} {} kind={} {}",
            checked.outcome.name(),
            checked.millis,
            checked.gpq_kind.unwrap_or("-"),
            checked.detail
        );
        if let Err(why) = &health {
            end += &format!(" | health: {why} UNHEALTHY");
        }
        emit(&mut out, &end);
        if health.is_err() {
            emit(&mut out, &summary(&counts, &kinds, files, 1));
            return Ok(ExitCode::from(3));
        }
    }
    emit(&mut out, &summary(&counts, &kinds, files, 0));
    Ok(ExitCode::SUCCESS)
}
