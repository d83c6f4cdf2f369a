"""Where one kernel's warps stall, from Nsight Compute's source page.

    python3 scripts/ncu_top_stalls.py SOURCE.csv[.xz]
    python3 scripts/ncu_top_stalls.py SOURCE.csv[.xz] CUBIN KERNEL

SOURCE.csv is `ncu --import R.ncu-rep --page source --csv --print-source
sass` (xz-compressed or not). With one argument: the 60 SASS instructions
with the most warp-stall samples (share, address, text, executions). With
a cubin (plain, not zstd-compressed: `zstd -d src/gpu/prebuilt/sm_90.cubin.zst`)
and a kernel name: the same samples summed per source line, with the share
of warp instructions, the threads active per instruction (where warps
diverge or idle) and the two main stall reasons, then the 30 instructions
with the most samples. Lines come from `nvdisasm -g` (the kernels are
built with -lineinfo); nvdisasm is taken from $NVDISASM, else PATH (the
pip wheel `nvidia-cuda-nvdisasm` has one for machines without CUDA)."""
import collections
import csv
import lzma
import os
import re
import subprocess
import sys


def rows_of(path):
    f = lzma.open(path, "rt", errors="replace") if path.endswith(".xz") else open(path, errors="replace")
    rows = list(csv.reader(f))
    hi = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[hi], [r for r in rows[hi + 1:] if r and r[0].startswith("0x")]


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def line_map(cubin, kernel):
    """Offset within the kernel -> (source line, SASS text), from nvdisasm -g."""
    tool = os.environ.get("NVDISASM", "nvdisasm")
    text = subprocess.run([tool, "-g", "-c", cubin], capture_output=True, text=True, check=True).stdout
    lines, inside, cur = {}, False, "?"
    for l in text.splitlines():
        if l.startswith("//----"):
            inside = re.search(r"\.text\.%s\s" % re.escape(kernel), l + " ") is not None
            continue
        if not inside:
            continue
        m = re.search(r'//## File "([^"]*)", line (\d+)', l)
        if m:
            cur = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/", l)
        if m:
            lines[int(m.group(1), 16)] = cur
    return lines


def main():
    head, data = rows_of(sys.argv[1])
    col = {n: i for i, n in enumerate(head)}
    samples = col["Warp Stall Sampling (All Samples)"]
    total = sum(num(r[samples]) for r in data) or 1
    if len(sys.argv) < 4:
        ex = col.get("Instructions Executed")
        print("total stall samples", total)
        for r in sorted(data, key=lambda r: -num(r[samples]))[:60]:
            print(f"{num(r[samples]) / total * 100:5.1f}% {r[0]} {r[1].strip()[:70]} exec={r[ex] if ex is not None else ''}")
        return
    lines = line_map(sys.argv[2], sys.argv[3])
    base = min(int(r[0], 16) for r in data)
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    warp_i, thread_i = col["Instructions Executed"], col["Thread Instructions Executed"]
    per = collections.defaultdict(lambda: [0.0, 0.0, 0.0, collections.Counter()])
    warp_total = sum(num(r[warp_i]) for r in data) or 1
    thread_total = sum(num(r[thread_i]) for r in data)
    for r in data:
        g = per[lines.get(int(r[0], 16) - base, "?")]
        g[0] += num(r[samples])
        g[1] += num(r[warp_i])
        g[2] += num(r[thread_i])
        for h in reasons:
            g[3][h[6:]] += num(r[col[h]])
    print(f"{sys.argv[3]}: {total:.0f} stall samples, {warp_total:.3g} warp instructions, "
          f"{thread_total / warp_total:.2f} threads active an instruction; {len(lines)} SASS lines mapped")
    print(" stall%  instr%  threads  line        main stall reasons")
    for line, (s, w, t, why) in sorted(per.items(), key=lambda kv: -kv[1][0])[:45]:
        top = ", ".join(f"{k} {v / max(s, 1) * 100:.0f}%" for k, v in why.most_common(2))
        print(f"{s / total * 100:6.1f} {w / warp_total * 100:6.1f} {t / max(w, 1):8.2f}  {line:11s} {top}")
    print("instructions with the most samples:")
    for r in sorted(data, key=lambda r: -num(r[samples]))[:30]:
        at = int(r[0], 16) - base
        print(f"{num(r[samples]) / total * 100:5.1f}% {at:6x} {lines.get(at, '?'):11s} "
              f"threads {num(r[col['Avg. Threads Executed']]):5.2f}  {r[1].strip()[:56]}")


main()
