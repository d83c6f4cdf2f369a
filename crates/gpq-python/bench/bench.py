"""Times the Python binding against the Rust library on the same file and
machine, and the zero-copy handover.

    python bench.py FILE [--repeat 5] [--rounds 3] [--gpq PATH-OF-THE-CLI]

1. Whole-file reads: the Rust CLI's ``gpq read FILE --repeat N`` (median of
   the library's own total, one table alive at a time) and, in this process,
   the wall time of ``gpq.read_parquet(FILE)`` around the call (median of N
   after one warm-up, one table alive at a time), in alternating rounds.
2. The export of the whole table as an ``ArrowDeviceArray`` and its import
   by a consumer (nanoarrow's device module, else pyarrow's schema import
   only), and DLPack handovers to PyTorch/CuPy where they are installed:
   medians of many, in microseconds.

Prints one line per figure; nothing is asserted (this is a benchmark).
"""

import argparse
import gc
import re
import statistics
import subprocess
import time

import gpq


def rust_total_ms(cli: str, path: str, repeat: int) -> float:
    out = subprocess.run([cli, "read", path, "--repeat", str(repeat)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"total ([0-9.]+)", out)
    if not m:
        raise RuntimeError(f"no total in the CLI's output:\n{out}")
    return float(m.group(1))


def python_wall_ms(path: str, repeat: int) -> tuple[float, float]:
    kept = gpq.read_parquet(path)  # warm-up
    walls, totals = [], []
    for _ in range(repeat):
        del kept
        t0 = time.perf_counter()
        kept = gpq.read_parquet(path)
        walls.append((time.perf_counter() - t0) * 1e3)
        totals.append(kept.stats["total_s"] * 1e3)
    del kept
    gc.collect()
    return statistics.median(walls), statistics.median(totals)


def micro(f, n: int = 200) -> float:
    f()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpq", default="gpq", help="the gpq CLI (the Rust side)")
    a = ap.parse_args()

    rust, py_wall, py_total = [], [], []
    for r in range(a.rounds):
        rust.append(rust_total_ms(a.gpq, a.file, a.repeat))
        w, t = python_wall_ms(a.file, a.repeat)
        py_wall.append(w)
        py_total.append(t)
        print(f"round {r + 1}: rust total {rust[-1]:.2f} ms | python wall {w:.2f} ms (library total inside it {t:.2f} ms)")
    rm, pm = statistics.median(rust), statistics.median(py_wall)
    print(f"whole file: rust {rm:.2f} ms, python {pm:.2f} ms, python/rust {pm / rm:.3f} (median of {a.rounds} rounds of {a.repeat})")

    t = gpq.read_parquet(a.file)
    print(f"table: {len(t)} rows, {t.num_columns} columns, {t.device_bytes / 2**20:.1f} MiB on the device")
    print(f"export __arrow_c_device_array__: {micro(lambda: t.__arrow_c_device_array__()):.1f} us (median of 200)")
    try:
        import nanoarrow.device as nd

        print(f"export + nanoarrow import (c_device_array): {micro(lambda: nd.c_device_array(t)):.1f} us")
    except ImportError:
        print("nanoarrow not installed: no import timing")
    key = t.column_names[0]
    try:
        import torch

        print(f"torch.from_dlpack({key}): {micro(lambda: torch.from_dlpack(t[key])):.1f} us")
    except ImportError:
        pass
    try:
        import cupy

        print(f"cupy.from_dlpack({key}): {micro(lambda: cupy.from_dlpack(t[key])):.1f} us")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
