#!/usr/bin/env bash
# One device call's worth of checks for the hostile-input work (issue 10) and
# the kernels it touches: GPU tests, then compute-sanitizer (memcheck,
# racecheck, synccheck) on the decode, corruption and encoding tests, each
# bounded. Run through the device tool after scripts/device-test.sh:
#   command: bash scripts/device-check-issue10.sh   carry: [".device/core"]
set -uo pipefail
. "$(dirname "$0")/device-env.sh"
for t in hostile encodings_gpu edge_files_gpu corrupt_gpu decode_gpu plan footer_hostile; do
  GPQ_TPCH_SF=1 timeout 150 "$W/test-$t" --test-threads=1 --skip lost_context > "$OUT/t-$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^test result' "$OUT/t-$t.log" | tail -1)"
  grep -E "FAILED|panicked|parquet-testing:" "$OUT/t-$t.log" | head -4 | cut -c1-250
done
san() {   # tool, binary, limit, extra test arguments
  local tool=$1 bin=$2 limit=$3; shift 3
  local kn=(); [ "$tool" != memcheck ] && kn=(--kernel-name kns=gpq_)
  GPQ_TEST_SMALL=1 GPQ_NVCOMP_DEADLINE_S=120 timeout "$limit" compute-sanitizer --tool "$tool" "${kn[@]}" --error-exitcode 99 \
    --print-limit 20 "$W/test-$bin" --test-threads=1 "$@" > "$OUT/$tool-$bin.log" 2>&1
  echo "$tool $bin rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$OUT/$tool-$bin.log" | tr '\n' ' ')"
}
for b in decode_gpu corrupt_gpu encodings_gpu edge_files_gpu; do san memcheck $b 150; done
for b in corrupt_gpu encodings_gpu edge_files_gpu; do san racecheck $b 200; san synccheck $b 100; done
san racecheck decode_gpu 100 --exact matrix_matches_arrow_rs
san synccheck decode_gpu 100 --exact matrix_matches_arrow_rs
