#!/usr/bin/env bash
# compute-sanitizer over whole test binaries, one process per (tool, test,
# shard), many at once: a whole binary under memcheck does not fit one device
# call when its tests run one after another. Run through the device tool
# after scripts/device-test.sh has staged the core bundle:
#   command: bash scripts/device-sanitize.sh [DEADLINE_S] [BINARY...]
#   carry:   [".device/core"]
# Environment:
#   SANITIZE_SHARDS  tests split into shards, as "binary/test=n ..." (the test
#                    takes GPQ_TEST_SHARD=k/n: see tests/common/mod.rs);
#                    default: the slow whole-corpus and random-flip tests
#   SANITIZE_ONLY    an extended regex over "tool binary test": only the jobs
#                    it matches run (default: all)
#   SANITIZE_JOBS    processes at once (default 12)
# Every job is killed at the deadline (default 540 s from the start); a job
# cut off is reported as `timeout`, never as clean, with the last item it
# reached (tests print their progress). The summary line of each job and a
# tally go to stdout and $OUT/sanitize.txt; all logs to
# $OUT/sanitize-logs.tar.xz.
set -uo pipefail
start=$(date +%s)
deadline=$((start + ${1:-540})); shift || true
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(decode_gpu corrupt_gpu edge_files_gpu filter_gpu aggregate_gpu)
. "$(dirname "$0")/device-env.sh"
export GPQ_TEST_SMALL=1 GPQ_TEST_PROGRESS=1
# Sanitized kernels run a hundredfold slower: nvCOMP's hang deadline must not fire.
export GPQ_NVCOMP_DEADLINE_S=300
shards=${SANITIZE_SHARDS:-decode_gpu/parquet_testing_files=8 corrupt_gpu/random_byte_flips_are_errors_or_right_answers=8 corrupt_gpu/random_byte_flips_in_delta_and_split_pages=8 filter_gpu/random_predicates_match_arrow=4}
shards_of() {  # binary test -> the shard count (1: unsharded)
  local s
  for s in $shards; do [ "${s%=*}" = "$1/$2" ] && { echo "${s#*=}"; return; }; done
  echo 1
}
logs=/tmp/sanitize-logs; rm -rf "$logs"; mkdir -p "$logs"
jobs=$logs/jobs.txt; : > "$jobs"
for b in "${bins[@]}"; do
  [ -x "$W/test-$b" ] || { echo "missing test-$b"; continue; }
  "$W/test-$b" --list 2>/dev/null | sed -n 's/: test$//p' | while read -r t; do
    n=$(shards_of "$b" "$t")
    for tool in memcheck racecheck synccheck; do
      echo "$tool $b $t" | grep -Eq "${SANITIZE_ONLY:-.}" || continue
      if [ "$n" = 1 ]; then echo "$tool $b $t -"; else for k in $(seq 0 $((n - 1))); do echo "$tool $b $t $k/$n"; done; fi
    done
  done >> "$jobs"
done
one() {  # tool binary test shard
  local tool=$1 bin=$2 test=$3 shard=$4 left=$((deadline - $(date +%s)))
  local name="$tool $bin $test"; [ "$shard" != - ] && name="$name [shard $shard]"
  local log=$logs/$tool-$bin-$test-${shard/\//of}.log
  [ "$left" -gt 5 ] || { echo "$name: not started (deadline)"; return; }
  local kn=(); [ "$tool" != memcheck ] && kn=(--kernel-name kns=gpq_)
  local env=(); [ "$shard" != - ] && env=(GPQ_TEST_SHARD="$shard")
  env "${env[@]}" timeout "$left" compute-sanitizer --tool "$tool" "${kn[@]}" --error-exitcode 99 --print-limit 20 \
    "$W/test-$bin" --test-threads=1 --exact "$test" > "$log" 2>&1
  local rc=$?
  local what; what=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$log" | tr '\n' ' ')
  case $rc in 124|137) what="timeout after $(( $(date +%s) - start )) s, last reached: $(grep -E '^\[ *[0-9.]+ s\]' "$log" | tail -1); $what" ;; esac
  echo "$name: rc=$rc $what"
}
export -f one; export deadline start logs W
# The slowest jobs (memcheck of whole-file tests) start first.
sort -k1,1r "$jobs" | awk '{ print ($1 == "memcheck" ? 0 : 1) " " $0 }' | sort -s -k1,1n | cut -d' ' -f2- \
  | xargs -P "${SANITIZE_JOBS:-12}" -L 1 bash -c 'one "$0" "$1" "$2" "$3"' | tee "$OUT/sanitize.txt"
# (The tally is made from the job lines alone before it is appended to them.)
tally=$(
  echo "jobs: $(wc -l < "$jobs"), rc=0: $(grep -c ': rc=0 ' "$OUT/sanitize.txt"), timeouts: $(grep -c 'timeout after' "$OUT/sanitize.txt"), not started: $(grep -c 'not started' "$OUT/sanitize.txt")"
  echo "errors reported: $(grep -E 'ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]' "$OUT/sanitize.txt" | wc -l)"
  grep -vE ': rc=0 ' "$OUT/sanitize.txt" | sed 's/^/not clean: /'
)
echo "$tally" | tee -a "$OUT/sanitize.txt"
(cd "$logs" && tar -cf - . | xz -T0 > "$OUT/sanitize-logs.tar.xz")
