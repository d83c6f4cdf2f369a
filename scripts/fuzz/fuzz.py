#!/usr/bin/env python3
"""The device driver of gpq's mutation fuzzer (crates/gpq-fuzz).

1. Writes seed files with pyarrow: every flat type, with nulls, in every
   codec x data page version x dictionary on/off (one file each), plus a few
   single-column files, all with small pages; and a separate known-good file.
2. Runs `gpq-fuzz mutate` to make --count mutants of the seeds.
3. Feeds the seeds, then the mutants, to long-lived `gpq-fuzz read`
   processes (--jobs of them), one path at a time, and watches their output:
   a BEGIN without an END within --timeout seconds is a hang (the process is
   killed and a fresh one takes the remaining files), a process that exits
   without an END is a crash, an END marked UNHEALTHY (the known-good file no
   longer reads right) restarts the process too. Each finding is then tried
   again alone in a fresh process ("confirmed" when it fails again).
4. Writes --out/summary.md and --out/results.tsv, and copies the inputs of
   hangs, crashes, panics, lost contexts, unhealthy ends and sanitizer
   errors (at most 50) to --out/findings/ to become regression tests.
5. With --sanitize K: reads K files (findings first, then a sample) under
   `compute-sanitizer --tool memcheck` and records, per file, the memory
   and API errors it reports, and each run's ERROR SUMMARY line.

Exit code 0 if there was no hang, crash, panic, lost context, unhealthy end
or sanitizer memory error; 1 otherwise; 2 if the fuzzer itself could not run.

Python 3.12, standard library and pyarrow only. Typical use (scripts/device-run.sh's `fuzz` stage):

    python3 fuzz.py --bin gpq-fuzz --out /tmp/fuzz-out --count 10000 --jobs 4 --sanitize 100
"""

from __future__ import annotations

import argparse
import collections
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Outcomes that fail the run (besides UNHEALTHY ends and sanitizer memory errors).
FAILURES = ("hang", "crash", "panic", "context-lost")
# Outcomes put down to arrow-rs, the reference reader, rather than gpq.
ARROW_TROUBLE = ("arrow-hang", "arrow-crash")
MAX_FINDINGS = 50

CODECS = ["none", "snappy", "zstd", "gzip", "lz4", "brotli"]
VERSIONS = ["1.0", "2.0"]


# ---------------------------------------------------------------- seeds

def all_types_table(rows: int, seed: int, only: list[str] | None = None):
    """A table with one column per flat type, about 10% nulls in each."""
    import datetime
    import decimal

    import pyarrow as pa

    rng = random.Random(seed)

    def nullable(gen):
        return [None if rng.random() < 0.1 else gen(i) for i in range(rows)]

    words = ["alpha", "beta", "gamma", "delta", "", "a somewhat longer string value", "ünïcödé", "x" * 40]
    cols = {
        "bool": (pa.bool_(), lambda i: rng.random() < 0.5),
        "int8": (pa.int8(), lambda i: rng.randint(-128, 127)),
        "int16": (pa.int16(), lambda i: rng.randint(-(2**15), 2**15 - 1)),
        "int32": (pa.int32(), lambda i: rng.randint(-(2**31), 2**31 - 1)),
        "int64": (pa.int64(), lambda i: rng.randint(-(2**63), 2**63 - 1)),
        "uint8": (pa.uint8(), lambda i: rng.randint(0, 255)),
        "uint16": (pa.uint16(), lambda i: rng.randint(0, 2**16 - 1)),
        "uint32": (pa.uint32(), lambda i: rng.randint(0, 2**32 - 1)),
        "uint64": (pa.uint64(), lambda i: rng.randint(0, 2**64 - 1)),
        "float32": (pa.float32(), lambda i: rng.uniform(-1e6, 1e6)),
        "float64": (pa.float64(), lambda i: rng.uniform(-1e12, 1e12)),
        "decimal_small": (pa.decimal128(9, 2), lambda i: decimal.Decimal(rng.randint(-(10**9) + 1, 10**9 - 1)).scaleb(-2)),
        "decimal_large": (pa.decimal128(38, 10), lambda i: decimal.Decimal(rng.randint(-(10**38) + 1, 10**38 - 1)).scaleb(-10)),
        "date32": (pa.date32(), lambda i: datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randint(-20000, 20000))),
        "ts_ms": (pa.timestamp("ms"), lambda i: rng.randint(-(2**40), 2**40)),
        "ts_us": (pa.timestamp("us"), lambda i: rng.randint(-(2**50), 2**50)),
        "ts_ns": (pa.timestamp("ns"), lambda i: rng.randint(-(2**62), 2**62)),
        # Low cardinality, so dictionary pages pay off.
        "string": (pa.string(), lambda i: rng.choice(words) + str(rng.randint(0, 20))),
        "large_string": (pa.large_string(), lambda i: rng.choice(words) * rng.randint(0, 3)),
        "binary": (pa.binary(), lambda i: bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 24)))),
        "fsb16": (pa.binary(16), lambda i: bytes(rng.randint(0, 3) for _ in range(16))),
    }
    names = only or list(cols)
    arrays = [pa.array(nullable(cols[n][1]), type=cols[n][0]) for n in names]
    return pa.table(arrays, names=names)


def write_seed(table, path: Path, codec: str, version: str, dictionary: bool, rows_per_group: int):
    import pyarrow.parquet as pq

    pq.write_table(
        table,
        str(path),
        compression=codec,
        data_page_version=version,
        use_dictionary=dictionary,
        data_page_size=4096,
        dictionary_pagesize_limit=4096,
        row_group_size=rows_per_group,
        write_statistics=True,
    )


def generate_seeds(seed_dir: Path, rows: int) -> Path:
    """Writes the seeds into seed_dir and the known-good file beside it; returns the good file."""
    seed_dir.mkdir(parents=True, exist_ok=True)
    table = all_types_table(rows, 1)
    for codec in CODECS:
        for version in VERSIONS:
            for dictionary in (False, True):
                name = f"{codec}_v{version[0]}_{'dict' if dictionary else 'plain'}.parquet"
                write_seed(table, seed_dir / name, codec, version, dictionary, rows // 2)
    singles = [
        ("int32", "snappy", "2.0", True),
        ("string", "zstd", "1.0", True),
        ("bool", "none", "2.0", False),
        ("decimal_large", "gzip", "1.0", False),
        ("fsb16", "lz4", "2.0", True),
        ("ts_ns", "brotli", "1.0", True),
        ("large_string", "snappy", "2.0", False),
        ("float64", "zstd", "2.0", False),
    ]
    for column, codec, version, dictionary in singles:
        t = all_types_table(rows, 2, [column])
        name = f"single_{column}_{codec}_v{version[0]}_{'dict' if dictionary else 'plain'}.parquet"
        write_seed(t, seed_dir / name, codec, version, dictionary, rows)
    good = seed_dir.parent / "good.parquet"
    write_seed(all_types_table(500, 3, ["int32", "int64", "float64", "string", "bool", "date32"]), good, "snappy", "1.0", True, 500)
    return good


# ---------------------------------------------------------------- reader processes

@dataclass
class Result:
    path: Path
    outcome: str
    millis: int = -1
    kind: str = "-"
    detail: str = ""
    unhealthy: bool = False
    step: str = ""
    gpq_said: str = ""  # gpq's outcome, sent before arrow-rs reads the file
    san_mem: int = 0
    san_api: int = 0
    san_first: str = ""
    confirmed: str = ""

    def stopped(self, outcome: str, why: str) -> None:
        """A read that ended without END: "hang" or "crash", "arrow-..." in arrow-rs's step."""
        self.outcome = f"arrow-{outcome}" if self.step == "arrow" else outcome
        self.detail = f"{why} (step {self.step or 'before BEGIN'})"
        if self.gpq_said:
            self.detail += f"; gpq: {self.gpq_said}"

    def is_finding(self) -> bool:
        return self.outcome in FAILURES or self.unhealthy or self.san_mem > 0

    def name_parts(self) -> tuple[str, str, str]:
        """(seed, class, op) from a mutant's name; seeds read as themselves."""
        parts = self.path.name.removesuffix(".parquet").split("-")
        if len(parts) >= 4 and parts[0].isdigit():
            return parts[1], parts[2], "-".join(parts[3:])
        return self.path.stem, "seed", "-"


SAN_ERROR = re.compile(r"^========= (?!COMPUTE-SANITIZER|ERROR SUMMARY|Target application|LEAK SUMMARY|RACECHECK|Internal Sanitizer)\S")
SAN_API = re.compile(r"^========= Program hit")


class Reader:
    """One `gpq-fuzz read` process and a thread turning its stdout into a queue of lines."""

    def __init__(self, cmd: list[str], stderr_path: Path, env: dict):
        self.stderr = open(stderr_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            env=env, start_new_session=True, bufsize=0,
        )
        self.lines: queue.Queue = queue.Queue()
        self.san_summaries: list[str] = []
        self.eof = False
        self.rc: int | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for raw in self.proc.stdout:
            self.lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
        self.lines.put(None)

    def next_line(self, deadline: float):
        """The next line, None at end of output, or "" once the deadline passed."""
        if self.eof:
            return None
        wait = deadline - time.monotonic()
        if wait <= 0:
            return ""
        try:
            line = self.lines.get(timeout=wait)
        except queue.Empty:
            return ""
        if line is None:
            self.eof = True
        elif line.startswith("========= ERROR SUMMARY"):
            self.san_summaries.append(line.removeprefix("========= ").strip())
        return line

    def send(self, path: Path) -> bool:
        try:
            self.proc.stdin.write((str(path) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def wait_ready(self, timeout: float) -> str | None:
        """None when READY came; else why not."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(deadline)
            if line == "":
                return f"no READY within {timeout:.0f} s"
            if line is None:
                return f"exited before READY ({describe_exit(self.finish())})"
            if line == "READY":
                return None
            if line.startswith("FATAL"):
                return line

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.finish()

    def finish(self, timeout: float = 30) -> int:
        """Closes stdin and waits for the exit code (killing after `timeout`)."""
        if self.rc is not None:
            return self.rc
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                rc = self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                rc = -signal.SIGKILL  # stuck in the driver: leave it behind rather than hang the run
        # Drain what is left (the sanitizer's last lines).
        deadline = time.monotonic() + 5
        while self.next_line(deadline) not in ("", None):
            pass
        self.stderr.close()
        self.rc = rc
        return rc


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


@dataclass
class Pool:
    """Runs a list of files through reader processes, restarting them as needed."""

    cmd: list[str]
    env: dict
    out: Path
    timeout: float
    startup_timeout: float
    jobs: int = 1
    deadline: float = float("inf")
    label: str = "read"
    results: list = field(default_factory=list)
    san_summaries: list = field(default_factory=list)
    restarts: int = 0
    fatal: str = ""
    not_run: int = 0

    def run(self, files: list[Path], progress_every: int = 500) -> list[Result]:
        pending = collections.deque(files)
        lock = threading.Lock()
        done = [0]
        total = len(files)
        started = time.monotonic()

        def worker(w: int):
            reader = None
            failed_starts = 0
            while True:
                with lock:
                    if not pending:
                        break
                    if self.fatal or time.monotonic() > self.deadline:
                        self.not_run += len(pending)
                        pending.clear()
                        break
                    path = pending.popleft()
                if reader is None:
                    reader = Reader(self.cmd, self.out / f"{self.label}-stderr-{w}.log", self.env)
                    why = reader.wait_ready(self.startup_timeout)
                    if why is not None:
                        reader.kill()
                        self.san_summaries.extend(reader.san_summaries)
                        reader = None
                        failed_starts += 1
                        with lock:
                            pending.appendleft(path)
                            if failed_starts >= 3:
                                self.fatal = f"gpq-fuzz read did not start 3 times: {why}"
                        print(f"[{self.label}] worker {w}: start failed: {why}", flush=True)
                        continue
                    failed_starts = 0
                r, keep = self.one(reader, path)
                if not keep:
                    if r.outcome in ("hang", "arrow-hang"):
                        reader.kill()
                    else:
                        reader.finish()
                    self.san_summaries.extend(reader.san_summaries)
                    reader = None
                    with lock:
                        self.restarts += 1
                with lock:
                    self.results.append(r)
                    done[0] += 1
                    if r.is_finding():
                        print(f"[{self.label}] {r.outcome}{' UNHEALTHY' if r.unhealthy else ''}: {r.path.name} {r.detail[:200]}", flush=True)
                    if progress_every and done[0] % progress_every == 0:
                        rate = done[0] / max(time.monotonic() - started, 1e-9)
                        print(f"[{self.label}] {done[0]}/{total} files, {rate:.0f}/s, {self.restarts} restarts", flush=True)
            if reader is not None:
                reader.finish()
                self.san_summaries.extend(reader.san_summaries)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(max(1, self.jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.results

    def one(self, reader: Reader, path: Path) -> tuple[Result, bool]:
        """Reads one file; returns its result and whether the process can go on."""
        r = Result(path, "crash")
        if not reader.send(path):
            r.detail = f"stdin closed ({describe_exit(reader.finish())})"
            return r, False
        deadline = time.monotonic() + self.timeout
        begun = False
        while True:
            line = reader.next_line(deadline)
            if line == "":
                r.stopped("hang", f"no END within {self.timeout:.0f} s")
                return r, False
            if line is None:
                rc = reader.finish()
                r.stopped("crash", describe_exit(rc))
                return r, False
            if line.startswith("========="):
                if begun and SAN_ERROR.match(line):
                    if SAN_API.match(line):
                        r.san_api += 1
                    else:
                        r.san_mem += 1
                    r.san_first = r.san_first or line.removeprefix("========= ").strip()[:300]
                continue
            if line == f"BEGIN {path}":
                begun = True
            elif line.startswith("STEP gpq-done "):
                millis, _, said = line[len("STEP gpq-done "):].partition(" ")
                r.millis = int(millis) if millis.isdigit() else -1
                r.gpq_said = said
                if said.startswith("error kind="):
                    r.kind = said[len("error kind="):].split(" ", 1)[0]
            elif line.startswith("STEP "):
                r.step = line[5:]
            elif line.startswith(f"END {path} "):
                rest = line[len(f"END {path} "):].split(" ", 3)
                r.outcome = rest[0]
                r.millis = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else -1
                r.kind = rest[2].removeprefix("kind=") if len(rest) > 2 else "-"
                r.detail = rest[3] if len(rest) > 3 else ""
                r.unhealthy = r.detail.endswith(" UNHEALTHY")
                return r, not r.unhealthy


# ---------------------------------------------------------------- reports

def write_results(path: Path, results: list[Result]):
    with open(path, "w") as f:
        f.write("file\tseed\tclass\top\toutcome\tmillis\tgpq_kind\tunhealthy\tsan_mem\tsan_api\tconfirmed\tdetail\n")
        for r in results:
            seed, cls, op = r.name_parts()
            detail = (r.detail + (f" | sanitizer: {r.san_first}" if r.san_first else "")).replace("\t", " ")
            f.write(f"{r.path.name}\t{seed}\t{cls}\t{op}\t{r.outcome}\t{r.millis}\t{r.kind}\t{int(r.unhealthy)}\t"
                    f"{r.san_mem}\t{r.san_api}\t{r.confirmed}\t{detail}\n")


def table(title: str, rows: dict, columns: list[str]) -> str:
    out = [f"### {title}", "", "| | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for key in sorted(rows):
        out.append(f"| {key} | " + " | ".join(str(rows[key].get(c, 0)) for c in columns) + " |")
    return "\n".join(out) + "\n"


def codec_of(seed: str) -> str:
    for c in CODECS:
        if seed.startswith(c + "_") or f"_{c}_" in seed:
            return c
    return "?"


def summarize(args, results: list[Result], pool: Pool, san_results: list[Result], san_pool: Pool | None,
              seeds_bad: list[Result], elapsed: float) -> str:
    outcomes = collections.Counter(r.outcome for r in results)
    unhealthy = [r for r in results if r.unhealthy]
    columns = sorted(outcomes, key=lambda o: (-outcomes[o], o))
    by_class: dict = collections.defaultdict(collections.Counter)
    by_codec: dict = collections.defaultdict(collections.Counter)
    kinds: dict = collections.defaultdict(collections.Counter)
    for r in results:
        seed, cls, _ = r.name_parts()
        by_class[cls][r.outcome] += 1
        by_codec[codec_of(seed)][r.outcome] += 1
        if r.kind != "-":
            kinds[r.kind][r.outcome] += 1
    lines = [
        "# gpq fuzz summary",
        "",
        f"- {len(results)} files read ({args.count} mutants asked for, rng seed {args.rng_seed}), "
        f"{pool.not_run} not run (time budget or fatal), in {elapsed:.0f} s with {args.jobs} reader process(es); "
        f"{pool.restarts} restarts; per-file timeout {args.timeout} s",
        "- outcomes: " + ", ".join(f"{o}={outcomes[o]}" for o in columns) + f", unhealthy={len(unhealthy)}",
    ]
    if pool.fatal:
        lines.append(f"- **FATAL**: {pool.fatal}")
    if seeds_bad:
        lines.append(f"- **{len(seeds_bad)} unmutated seeds do not read equal** (their mutants test less): "
                     + "; ".join(f"{r.path.name}: {r.outcome} {r.kind} {r.detail[:160]}" for r in seeds_bad))
    ms = sorted(r.millis for r in results if r.millis >= 0)
    if ms:
        lines.append(f"- gpq read time per file: median {ms[len(ms) // 2]} ms, p99 {ms[int(len(ms) * 0.99)]} ms, max {ms[-1]} ms")
    lines.append("")
    lines.append(table("By mutation class", by_class, columns))
    lines.append(table("By codec of the seed", by_codec, columns))
    if kinds:
        lines.append(table("By gpq error kind", kinds, [c for c in columns if c.startswith("gpq-error") or c == "context-lost"]))

    def listing(title: str, rs: list[Result], limit: int = 100):
        if not rs:
            return
        lines.append(f"### {title} ({len(rs)})")
        lines.append("")
        for r in rs[:limit]:
            conf = f" [confirmed: {r.confirmed}]" if r.confirmed else ""
            san = f" [sanitizer: {r.san_mem} memory, {r.san_api} API errors: {r.san_first}]" if r.san_first else ""
            lines.append(f"- `{r.path.name}` {r.outcome} kind={r.kind}{conf}: {r.detail[:300]}{san}")
        if len(rs) > limit:
            lines.append(f"- ... {len(rs) - limit} more in results.tsv")
        lines.append("")

    for o in FAILURES:
        listing(o, [r for r in results if r.outcome == o])
    listing("unhealthy (the good file read wrong afterwards)", unhealthy)
    listing("differs (both read, different values)", [r for r in results if r.outcome == "differs"])
    listing("gpq-ok-arrow-error (gpq read what arrow-rs rejects)", [r for r in results if r.outcome == "gpq-ok-arrow-error"], 30)
    listing("gpq-error-arrow-ok (gpq rejected what arrow-rs reads)", [r for r in results if r.outcome == "gpq-error-arrow-ok"], 30)
    listing("arrow-rs trouble (hang or crash inside the reference reader; not gpq's)",
            [r for r in results if r.outcome in ARROW_TROUBLE])
    if san_pool is not None:
        lines.append(f"## compute-sanitizer memcheck ({len(san_results)} files, {san_pool.not_run} not run)")
        lines.append("")
        if san_pool.fatal:
            lines.append(f"- **FATAL**: {san_pool.fatal}")
        for s in san_pool.san_summaries:
            lines.append(f"- {s}")
        mem = sum(r.san_mem for r in san_results)
        api = sum(r.san_api for r in san_results)
        lines.append(f"- per-file errors: {mem} memory-access, {api} CUDA API "
                     f"(files with memory errors: {sum(1 for r in san_results if r.san_mem)})")
        lines.append("- outcomes under the sanitizer: "
                     + ", ".join(f"{o}={n}" for o, n in collections.Counter(r.outcome for r in san_results).most_common()))
        lines.append("")
        listing("files with sanitizer errors", [r for r in san_results if r.san_mem or r.san_api], 50)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("GPQ_FUZZ_BIN", "gpq-fuzz"), help="the gpq-fuzz binary")
    ap.add_argument("--out", type=Path, default=Path("fuzz-out"), help="summary.md, results.tsv, findings/, logs")
    ap.add_argument("--work", type=Path, help="seeds and mutants (default OUT/work)")
    ap.add_argument("--count", type=int, default=10000, help="mutants to make and read")
    ap.add_argument("--rows", type=int, default=2000, help="rows per seed file")
    ap.add_argument("--rng-seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds one file may take")
    ap.add_argument("--startup-timeout", type=float, default=300.0, help="seconds until a reader is READY")
    ap.add_argument("--jobs", type=int, default=1, help="reader processes at once")
    ap.add_argument("--budget", type=float, default=0, help="seconds for the main read phase (0: no limit)")
    ap.add_argument("--sanitize", type=int, nargs="?", const=100, default=0,
                    help="read K files (default 100) under compute-sanitizer memcheck")
    ap.add_argument("--sanitize-timeout", type=float, default=120.0, help="seconds one file may take under the sanitizer")
    ap.add_argument("--sanitize-budget", type=float, default=0, help="seconds for the sanitizer phase (0: no limit)")
    ap.add_argument("--sanitizer", default="compute-sanitizer")
    ap.add_argument("--no-confirm", action="store_true", help="do not re-read findings alone")
    ap.add_argument("--confirm-budget", type=float, default=60.0, help="seconds for re-reading findings alone")
    args = ap.parse_args()

    started = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work: Path = args.work or out / "work"
    seeds, mutants = work / "seeds", work / "mutants"
    for d in (seeds, mutants, out / "findings"):
        shutil.rmtree(d, ignore_errors=True)
    binary = shutil.which(args.bin) or args.bin
    env = dict(os.environ)

    good = generate_seeds(seeds, args.rows)
    seed_files = sorted(seeds.glob("*.parquet"))
    print(f"[fuzz] {len(seed_files)} seeds in {seeds}, good file {good}", flush=True)
    m = subprocess.run([binary, "mutate", "--seeds", str(seeds), "--out", str(mutants), "--count", str(args.count),
                        "--rng-seed", str(args.rng_seed)], capture_output=True, text=True)
    print(m.stdout.strip() or m.stderr.strip(), flush=True)
    if m.returncode != 0:
        print(f"[fuzz] gpq-fuzz mutate failed: {m.stderr}", file=sys.stderr)
        return 2
    mutant_files = sorted(mutants.glob("*.parquet"))
    if (mutants / "mutations.tsv").exists():
        shutil.copy(mutants / "mutations.tsv", out / "mutations.tsv")

    # The main run: seeds first (they must read equal), then the mutants.
    cmd = [binary, "read", "--good", str(good)]
    deadline = started + args.budget if args.budget > 0 else float("inf")
    pool = Pool(cmd, env, out, args.timeout, args.startup_timeout, args.jobs, deadline, "read")
    pool.run(seed_files, progress_every=0)
    seeds_bad = [r for r in pool.results if r.outcome != "equal" or r.unhealthy]
    pool.run(mutant_files)
    results = sorted(pool.results, key=lambda r: r.path.name)

    # Findings, tried again alone.
    findings = [r for r in results if r.is_finding()]
    if findings and not args.no_confirm:
        confirm_deadline = time.monotonic() + args.confirm_budget
        for r in findings[:MAX_FINDINGS]:
            if time.monotonic() > confirm_deadline:
                r.confirmed = "not tried (budget)"
                continue
            again = Pool(cmd, env, out, args.timeout, args.startup_timeout, 1, float("inf"), "confirm")
            a = again.run([r.path], progress_every=0)
            if a:
                a = a[0]
                r.confirmed = ("yes" if a.is_finding() else "no") + f" ({a.outcome}{' UNHEALTHY' if a.unhealthy else ''})"

    # The sanitizer: findings first, then a sample across classes.
    san_results: list[Result] = []
    san_pool = None
    if args.sanitize > 0:
        rng = random.Random(args.rng_seed)
        chosen = [r.path for r in findings][: args.sanitize]
        taken = set(chosen)
        rest = [p for p in seed_files[:4] + mutant_files if p not in taken]
        rng.shuffle(rest)
        chosen += rest[: max(0, args.sanitize - len(chosen))]
        san_cmd = [args.sanitizer, "--tool", "memcheck", "--error-exitcode", "99", "--print-limit", "100"] + cmd
        san_deadline = time.monotonic() + args.sanitize_budget if args.sanitize_budget > 0 else float("inf")
        # The sanitizer slows kernels a hundredfold: nvCOMP's hang deadline must not fire under it.
        san_env = dict(env)
        san_env.setdefault("GPQ_NVCOMP_DEADLINE_S", "120")
        san_pool = Pool(san_cmd, san_env, out, args.sanitize_timeout, max(args.startup_timeout, 600), 1, san_deadline, "sanitize")
        print(f"[fuzz] compute-sanitizer memcheck on {len(chosen)} files", flush=True)
        san_results = sorted(san_pool.run(chosen, progress_every=20), key=lambda r: r.path.name)
        write_results(out / "sanitizer.tsv", san_results)

    # Findings to bring back.
    keep = [r for r in findings] + [r for r in san_results if r.san_mem and r not in findings]
    (out / "findings").mkdir(exist_ok=True)
    seen = set()
    for r in keep:
        if len(seen) >= MAX_FINDINGS or r.path.name in seen:
            continue
        seen.add(r.path.name)
        shutil.copy(r.path, out / "findings" / r.path.name)

    write_results(out / "results.tsv", results)
    summary = summarize(args, results, pool, san_results, san_pool, seeds_bad, time.monotonic() - started)
    (out / "summary.md").write_text(summary)
    print(summary, flush=True)
    if pool.fatal:
        return 2
    failed = any(r.is_finding() for r in results) or any(r.san_mem for r in san_results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
