#!/usr/bin/env bash
# Runs on the GPU machine (copied to .device/run.sh by scripts/device-test.sh).
# Usage: bash .device/run.sh STAGE...   stages: info tests sanitizer data-sf10 bench-io bench-decode tpch cufile-diag
# Logs go to $OUT (the device tool returns them); a summary prints last.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpq-out}
mkdir -p "$OUT"
work=/root/gpq-work
mkdir -p "$work"
if [ ! -d "$work/bin" ]; then
  (cd "$work" && (tar -xJf "$here/payload.tar.xz" 2>/dev/null || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('$here/payload.tar.xz')).extractall('.')"))
fi
export PATH=$work/bin:$PATH
export LD_LIBRARY_PATH=$work/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export GPQ_REQUIRE_GPU=1
export GPQ_KERNEL_CACHE=$work/kernel-cache
export GPQ_PARQUET_TESTING=${GPQ_PARQUET_TESTING:-$here/parquet-testing}
data=$work/data
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

stage_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$summary"
  nproc; free -g | head -2; df -h "$work" | tail -1; uname -r
}

stage_tests() {
  for t in "$work"/bin/test-*; do
    name=$(basename "$t")
    "$t" --test-threads=1 > "$OUT/$name.log" 2>&1
    rc=$?
    note "$name: rc=$rc $(grep -E '^test result' "$OUT/$name.log" | tail -1)"
    grep -E "^test .* FAILED|panicked at" "$OUT/$name.log" | head -5 | tee -a "$summary"
  done
}

stage_data_sf10() {
  mkdir -p "$data/sf10"
  /usr/bin/time -v gpq gen -s 10 --tables lineitem --out "$data/sf10" 2> "$OUT/gen-sf10.log" | tail -3
  note "gen sf10: $(grep -E 'lineitem|Elapsed' "$OUT/gen-sf10.log" | tr '\n' ' ')"
  export GPQ_SF10_LINEITEM=$data/sf10/lineitem.parquet
  cat "$GPQ_SF10_LINEITEM" > /dev/null  # warm the page cache
}

stage_bench_io() {
  f=${GPQ_SF10_LINEITEM:-$data/sf10/lineitem.parquet}
  gpq bench io "$f" --paths bounce,cufile-compat --threads 1,4,8,16 --repeat 5 2>&1 | tee "$OUT/bench-io.md" | tee -a "$summary"
}

stage_cufile_diag() {
  { echo "--- /etc/cufile.json"; grep -v '^\s*//' /etc/cufile.json 2>/dev/null | grep -E 'allow_compat|use_compat|"dir"|level' ;
    echo "--- nvidia-fs"; ls /proc/driver/nvidia-fs 2>&1; lsmod 2>/dev/null | grep -i nvidia;
    echo "--- fs of $work"; stat -f -c '%T' "$work"; mount | grep -E " / | /root" ;
    echo "--- libcufile"; ls -la /usr/local/cuda/lib64/libcufile* 2>&1 | head; } > "$OUT/cufile-diag.txt" 2>&1
  f=$data/diag.parquet
  gpq gen -s 0.01 --tables orders --out "$data/diag" >/dev/null 2>&1
  for mode in cufile-compat gds; do
    RUST_LOG=gpq=debug gpq read "$data/diag/orders.parquet" --io $mode --io-only --verify >> "$OUT/cufile-diag.txt" 2>&1
    note "read --io $mode: rc=$?"
  done
  find / -name "cufile.log" -newer "$here/run.sh" 2>/dev/null | head -3 | while read -r l; do echo "--- $l"; tail -20 "$l"; done >> "$OUT/cufile-diag.txt"
  tail -40 "$OUT/cufile-diag.txt"
}

stage_sanitizer() {
  for t in "$work"/bin/test-decode*; do
    [ -e "$t" ] || continue
    name=$(basename "$t")
    compute-sanitizer --tool memcheck --error-exitcode 99 "$t" --test-threads=1 > "$OUT/sanitizer-$name.log" 2>&1
    note "memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY|test result' "$OUT/sanitizer-$name.log" | tr '\n' ' ')"
  done
}

for s in "$@"; do
  echo "=== stage $s"
  "stage_${s//-/_}"
done
echo "=== summary"
cat "$summary"
