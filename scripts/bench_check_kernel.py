#!/usr/bin/env python3
"""Times gpq_check_compressed alone over the SNAPPY pages of a Parquet file.

Usage: bench_check_kernel.py FILE.parquet KERNEL_DIR [VARIANT.cu ...]

The kernel is compiled with CuPy's NVRTC from KERNEL_DIR/common.cuh and
KERNEL_DIR/check_compressed.cu (the baseline), and from each VARIANT (a
replacement for check_compressed.cu), and run over every compressed page of
every SNAPPY column chunk, largest pages first as gpq hands them over. It
prints the median of the kernel's times (CUDA events, after a warm-up), and
checks that every variant gives the baseline's verdicts, on the file as it
is and on a copy with bytes flipped in a sample of pages. A device-side
measuring tool for kernel work (`scripts/device-run.sh` stage
`check-kernel`), not a test.
"""
import mmap
import random
import re
import sys

import cupy as cp
import numpy as np
import pyarrow.parquet as pq


def varint(b, i):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if not x & 0x80:
            return v, i


def zigzag(v):
    return (v >> 1) ^ -(v & 1)


def skip(b, i, t):
    if t in (1, 2):
        return i
    if t == 3:
        return i + 1
    if t in (4, 5, 6):
        return varint(b, i)[1]
    if t == 7:
        return i + 8
    if t == 8:
        n, i = varint(b, i)
        return i + n
    if t in (9, 10):
        h = b[i]
        i += 1
        n, et = h >> 4, h & 15
        if n == 15:
            n, i = varint(b, i)
        for _ in range(n):
            i = i + 1 if et in (1, 2) else skip(b, i, et)
        return i
    if t == 11:
        n, i = varint(b, i)
        if n:
            kv = b[i]
            i += 1
            for _ in range(n):
                i = skip(b, i, kv >> 4)
                i = skip(b, i, kv & 15)
        return i
    if t == 12:
        return struct(b, i, lambda fid, ft, i: skip(b, i, ft))
    raise ValueError(f"thrift type {t}")


def struct(b, i, on_field):
    fid = 0
    while True:
        h = b[i]
        i += 1
        if h == 0:
            return i
        d, t = h >> 4, h & 15
        if d:
            fid += d
        else:
            v, i = varint(b, i)
            fid = zigzag(v)
        i = on_field(fid, t, i)


def page_header(b, i):
    """Returns (page type, uncompressed size, compressed size, level bytes, is_compressed, end)."""
    h = {"levels": 0, "compressed": True}

    def v2(fid, t, i):
        if fid in (5, 6) and t == 5:
            v, i = varint(b, i)
            h["levels"] += zigzag(v)
            return i
        if fid == 7 and t in (1, 2):
            h["compressed"] = t == 1
            return i
        return skip(b, i, t)

    def top(fid, t, i):
        if fid in (1, 2, 3) and t == 5:
            v, i = varint(b, i)
            h[fid] = zigzag(v)
            return i
        if fid == 8 and t == 12:
            return struct(b, i, v2)
        return skip(b, i, t)

    end = struct(b, i, top)
    return h[1], h[2], h[3], h["levels"], h["compressed"], end


def snappy_pages(path):
    md = pq.ParquetFile(path).metadata
    with open(path, "rb") as f:
        b = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pages = []   # (offset of the compressed bytes in the file, compressed, uncompressed)
    for rg in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(rg).column(c)
            if col.compression != "SNAPPY":
                continue
            start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset else col.data_page_offset
            end = start + col.total_compressed_size
            i = start
            while i < end:
                ptype, unc, comp, levels, compressed, body = page_header(b, i)
                if ptype != 1 and compressed and comp > levels:   # index pages (1) are not compressed
                    pages.append((body + levels, comp - levels, unc - levels))
                i = body + comp
    return b, pages


def compile_kernel(kernel_dir, check_source):
    """The SNAPPY kernel (gpq_check_snappy where there is one) and its warps per block."""
    common = open(f"{kernel_dir}/common.cuh").read()
    text = open(check_source).read()
    warps = int(re.search(r"#define CHECK_WARPS (\d+)", text).group(1))
    mod = cp.RawModule(code=common + "\n" + text, options=("-std=c++17", "-DGPQ_NVRTC=1", "-lineinfo"), backend="nvrtc")
    try:
        return mod.get_function("gpq_check_snappy"), warps
    except Exception:
        return mod.get_function("gpq_check_compressed"), warps


def run(kernel, dev_file, base, pages, warps, reps):
    n = len(pages)
    in_ptrs = cp.asarray(np.array([base + o for o, _, _ in pages], dtype=np.uint64))
    in_sizes = cp.asarray(np.array([c for _, c, _ in pages], dtype=np.uint64))
    out_sizes = cp.asarray(np.array([u for _, _, u in pages], dtype=np.uint64))
    empty = cp.zeros(16, dtype=np.uint8)   # a SNAPPY stream of length 0: one zero byte
    reasons = cp.zeros(n, dtype=np.uint32)
    grid = ((n + warps - 1) // warps,)
    times = []
    for r in range(reps + 2):
        ptrs = in_ptrs.copy()
        sizes = in_sizes.copy()
        reasons.fill(0xFFFFFFFF)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        kernel(grid, (32 * warps,), (ptrs, sizes, out_sizes, np.uint32(0), np.uint32(n), np.uint64(empty.data.ptr), np.uint64(1), reasons))
        stop.record()
        stop.synchronize()
        if r >= 2:
            times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times)), cp.asnumpy(reasons)


def main():
    path, kernel_dir, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
    b, pages = snappy_pages(path)
    pages.sort(key=lambda p: -p[2])
    total_in = sum(c for _, c, _ in pages)
    print(f"{path}: {len(pages)} SNAPPY pages, {total_in / 2**20:.1f} MiB compressed, {sum(u for _, _, u in pages) / 2**20:.1f} MiB uncompressed")
    host = np.frombuffer(b, dtype=np.uint8)
    good = cp.asarray(host)
    bad_host = host.copy()
    rng = random.Random(7)
    for o, c, _ in rng.sample(pages, min(2000, len(pages))):
        for _ in range(rng.randint(1, 4)):
            bad_host[o + rng.randrange(c)] = rng.randrange(256)
    bad = cp.asarray(bad_host)
    sources = [f"{kernel_dir}/check_compressed.cu"] + variants
    baseline = {}
    for s in sources:
        k, warps = compile_kernel(kernel_dir, s)
        ms, v_good = run(k, good, good.data.ptr, pages, warps, 9)
        _, v_bad = run(k, bad, bad.data.ptr, pages, warps, 1)
        if not baseline:
            baseline = {"good": v_good, "bad": v_bad}
        same = np.array_equal(v_good, baseline["good"]) and np.array_equal(v_bad, baseline["bad"])
        print(f"{s}: median {ms:.3f} ms ({total_in / ms / 1e6:.1f} GB/s); good file: {int((v_good != 0).sum())} rejected; "
              f"flipped bytes: {int((v_bad != 0).sum())} rejected; verdicts {'match' if same else 'DIFFER from'} the baseline")


if __name__ == "__main__":
    main()
