"""Top stall locations of one kernel from Nsight Compute: reads the CSV of
`ncu --import R.ncu-rep --page source --csv --print-source sass` and prints
the 60 SASS instructions with the most warp-stall samples (their share,
address, text and executed count). Map addresses to source lines with
`nvdisasm -g` on the same cubin."""
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hi = next(i for i, r in enumerate(rows) if any("Address" in c for c in r))
head = rows[hi]
def col(*names):
    for n in names:
        for i, c in enumerate(head):
            if n in c:
                return i
    return None
a = col("Address"); src = col("Source"); st = col("Warp Stall Sampling (All Samples)", "Warp Stall Sampling")
ex = col("Instructions Executed")
data = []
for r in rows[hi + 1:]:
    try:
        data.append((float(r[st].replace(",", "")), r[a], r[src], r[ex] if ex is not None else ""))
    except (ValueError, IndexError, TypeError):
        pass
tot = sum(d[0] for d in data) or 1
print("columns:", head[:12])
print("total stall samples", tot)
for s, addr, text, e in sorted(data, reverse=True)[:60]:
    print(f"{s/tot*100:5.1f}% {addr} {text[:70]} exec={e}")
