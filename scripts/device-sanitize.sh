#!/usr/bin/env bash
# compute-sanitizer over whole test binaries, one process per (tool, test),
# many at once: a whole binary under memcheck does not fit one device call
# when its tests run one after another (decode_gpu's parquet-testing files
# alone took over 150 s). Run through the device tool after
# scripts/device-test.sh has staged the core bundle:
#   command: bash scripts/device-sanitize.sh [DEADLINE_S] [BINARY...]
#   carry:   [".device/core"]
# Every job is killed at the deadline (default 540 s from the start); a job
# cut off is reported as `timeout`, never as clean. The summary line of each
# job and a tally go to stdout and $OUT/sanitize.txt; all logs to
# $OUT/sanitize-logs.tar.xz.
set -uo pipefail
start=$(date +%s)
deadline=$((start + ${1:-540})); shift || true
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(decode_gpu corrupt_gpu edge_files_gpu filter_gpu aggregate_gpu)
OUT=${OUT:-/tmp/gpq-out}
mkdir -p "$OUT"
timeout 120 bash .device/core/run.sh info > /dev/null 2>&1   # unpacks the payload
W=/root/gpq-work/bin
export LD_LIBRARY_PATH=/root/gpq-work/lib:/usr/local/cuda/lib64
export GPQ_REQUIRE_GPU=1 GPQ_REQUIRE_NVCOMP=1 GPQ_TESTDATA=$PWD/testdata GPQ_TEST_SMALL=1
export GPQ_PARQUET_TESTING=/root/gpq-work/data/parquet-testing GPQ_KERNEL_CACHE=/root/gpq-work/kernel-cache
# Sanitized kernels run a hundredfold slower: nvCOMP's hang deadline must not fire.
export GPQ_NVCOMP_DEADLINE_S=300
logs=/tmp/sanitize-logs; rm -rf "$logs"; mkdir -p "$logs"
jobs=$logs/jobs.txt; : > "$jobs"
for b in "${bins[@]}"; do
  [ -x "$W/test-$b" ] || { echo "missing test-$b"; continue; }
  "$W/test-$b" --list 2>/dev/null | sed -n 's/: test$//p' | while read -r t; do
    for tool in memcheck racecheck synccheck; do echo "$tool $b $t"; done
  done >> "$jobs"
done
one() {  # tool binary test
  local tool=$1 bin=$2 test=$3 left=$((deadline - $(date +%s)))
  local log=$logs/$tool-$bin-$test.log
  [ "$left" -gt 5 ] || { echo "$tool $bin $test: not started (deadline)"; return; }
  local kn=(); [ "$tool" != memcheck ] && kn=(--kernel-name kns=gpq_)
  timeout "$left" compute-sanitizer --tool "$tool" "${kn[@]}" --error-exitcode 99 --print-limit 20 \
    "$W/test-$bin" --test-threads=1 --exact "$test" > "$log" 2>&1
  local rc=$?
  local what; what=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$log" | tr '\n' ' ')
  case $rc in 124|137) what="timeout after $(( $(date +%s) - start )) s; $what" ;; esac
  echo "$tool $bin $test: rc=$rc $what"
}
export -f one; export deadline start logs W
# The slowest jobs (memcheck of whole-file tests) start first.
sort -k1,1r "$jobs" | awk '{ print ($1 == "memcheck" ? 0 : 1) " " $0 }' | sort -s -k1,1n | cut -d' ' -f2- \
  | xargs -P "${SANITIZE_JOBS:-12}" -L 1 bash -c 'one "$0" "$1" "$2"' | tee "$OUT/sanitize.txt"
{
  echo "jobs: $(wc -l < "$jobs"), rc=0: $(grep -c ': rc=0 ' "$OUT/sanitize.txt"), timeouts: $(grep -c 'timeout after' "$OUT/sanitize.txt"), not started: $(grep -c 'not started' "$OUT/sanitize.txt")"
  echo "errors reported: $(grep -E 'ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]' "$OUT/sanitize.txt" | wc -l)"
  grep -vE ': rc=0 ' "$OUT/sanitize.txt" | sed 's/^/not clean: /'
} | tee -a "$OUT/sanitize.txt"
(cd "$logs" && tar -cf - . | xz -T0 > "$OUT/sanitize-logs.tar.xz")
