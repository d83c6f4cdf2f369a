#!/usr/bin/env bash
# Runs on the GPU machine (copied to .device/<bundle>/run.sh by scripts/device-test.sh).
# Usage: bash .device/<bundle>/run.sh STAGE...
#   stages: info data-sf10 tests sanitizer sanitizer-races cufile-diag cufile-udev bench-io bench-decode
#           verify-sf10 suite criterion tpch-bench tpch-sf30 tpch-profile tpch-explain tpch-cpu-time tpch-gpus ballista-gpus context-loss page-checks regressions sanitizer-core
#           sanitizer-filter fuzz agg-quick agg-groups q6-knobs
#           bench-coverage batches check-kernel small-reads first-read kernel-paths overlap kernel-times many-files sorted-selection debug-read snappy-decoder
#           python (bundle .device/python: the Python package's tests and benchmark)
# Logs go to $OUT (the device tool returns them); a summary prints last.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpq-out}
mkdir -p "$OUT"
work=/root/gpq-work
mkdir -p "$work"
if ! cmp -s "$here/payload.tar.xz" "$work/.payload" 2>/dev/null; then
  rm -rf "$work/bin" "$work/lib" "$work/wheels" "$work/data/parquet-testing" "$work/data/regressions"
  cp "$here/payload.tar.xz" "$work/.payload"
  (cd "$work" && (tar -xJf "$here/payload.tar.xz" 2>/dev/null || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('$here/payload.tar.xz')).extractall('.')"))
fi
export PATH=$work/bin:$PATH
export LD_LIBRARY_PATH=$work/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export GPQ_REQUIRE_GPU=1
export GPQ_REQUIRE_NVCOMP=1
export GPQ_KERNEL_CACHE=$work/kernel-cache
# compute-sanitizer slows kernels a hundredfold: nvCOMP's hang deadline must not fire under it.
sanitize() { GPQ_NVCOMP_DEADLINE_S=120 compute-sanitizer "$@"; }
export GPQ_PARQUET_TESTING=${GPQ_PARQUET_TESTING:-$work/data/parquet-testing}
data=$work/data
# The regression corpus travels with the working tree (testdata/ at the repo root).
[ -d testdata/regressions ] && export GPQ_TESTDATA=$PWD/testdata
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
# SF10 lineitem under $data/sf10 (SNAPPY; not with SF10_NO_SNAPPY=1, which
# saves a call its generation), and with "zstd" also under $data/sf10-zstd
# (ZSTD level 1), each made only where missing.
sf10_lineitem() {
  mkdir -p "$data/sf10"
  [ -e "$data/sf10/lineitem.parquet" ] || [ "${SF10_NO_SNAPPY:-0}" = 1 ] || gpq gen -s 10 --tables lineitem --out "$data/sf10" > /dev/null 2>&1
  if [ "${1:-}" = zstd ]; then
    mkdir -p "$data/sf10-zstd"
    [ -e "$data/sf10-zstd/lineitem.parquet" ] || gpq gen -s 10 --tables lineitem --compression 'zstd(1)' --out "$data/sf10-zstd" > /dev/null 2>&1
  fi
}

stage_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$summary"
  nproc; free -g | head -2; df -h "$work" | tail -1; uname -r
}

stage_tests() {
  for t in "$work"/bin/test-*; do
    name=$(basename "$t")
    extra=(); case $name in test-tpch) extra=(--nocapture) ;; esac
    GPQ_TPCH_SF=${GPQ_TPCH_SF:-1} timeout "${TEST_TIMEOUT:-300}" "$t" --test-threads=1 "${extra[@]}" > "$OUT/$name.log" 2>&1
    rc=$?
    note "$name: rc=$rc $(grep -E '^test result' "$OUT/$name.log" | tail -1)"
    grep -E "^test .* FAILED|panicked at|^parquet-testing: " "$OUT/$name.log" | head -8 | tee -a "$summary"
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
  {
    gpq bench io "$f" --paths bounce,cufile-compat --threads 1,4,8,16,32 --repeat 5
    gpq bench io "$f" --paths bounce --threads 8,12,16,24 --task-sizes 1M,2M,4M,8M --repeat 5 | tail -16
  } 2>&1 | tee "$OUT/bench-io.md" | tee -a "$summary"
}

stage_bench_decode() {
  f=${GPQ_SF10_LINEITEM:-$data/sf10/lineitem.parquet}
  gpq bench decode "$f" --repeat 5 2>&1 | tee "$OUT/bench-decode.md" | tee -a "$summary"
  GPQ_DECOMPRESS=cpu gpq read "$f" --repeat 1 2>&1 | tail -4 | tee -a "$summary"
}

stage_verify_sf10() {
  f=${GPQ_SF10_LINEITEM:-$data/sf10/lineitem.parquet}
  gpq read "$f" --verify 2>&1 | tee "$OUT/verify-sf10.txt" | tee -a "$summary"
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
  # Variants: forced compat mode; a config that asks for compat mode; a udev record for the disk.
  CUFILE_FORCE_COMPAT_MODE=true gpq read "$data/diag/orders.parquet" --io cufile-compat --io-only --verify >> "$OUT/cufile-diag.txt" 2>&1
  note "CUFILE_FORCE_COMPAT_MODE=true: rc=$?"
  printf '{ "logging": { "dir": "%s", "level": "INFO" }, "properties": { "allow_compat_mode": true, "use_compat_mode": true } }\n' "$work" > "$work/cufile-compat.json"
  CUFILE_ENV_PATH_JSON=$work/cufile-compat.json gpq read "$data/diag/orders.parquet" --io cufile-compat --io-only --verify >> "$OUT/cufile-diag.txt" 2>&1
  note "use_compat_mode config: rc=$?"
  dev=$(stat -c '%d' "$work"); maj=$((dev >> 8)); min=$((dev & 255))
  ls -la /run/udev/data 2>&1 | head -3 >> "$OUT/cufile-diag.txt"
  mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' > /run/udev/data/b$maj:$min
  gpq read "$data/diag/orders.parquet" --io cufile-compat --io-only --verify >> "$OUT/cufile-diag.txt" 2>&1
  note "with a udev record for b$maj:$min: rc=$?"
  rm -f /run/udev/data/b$maj:$min
  find / -name "cufile.log" -newer "$here/run.sh" 2>/dev/null | head -3 | while read -r l; do echo "--- $l"; tail -20 "$l"; done >> "$OUT/cufile-diag.txt"
  tail -40 "$OUT/cufile-diag.txt"
}

# cuFile's compat mode needs the udev record of the data's block device
# (absent in this VM; see cufile-diag). With one in place: the IO tests with
# cufile-compat required, and its throughput.
udev_record() { dev=$(stat -c '%d' "$work"); echo "/run/udev/data/b$((dev >> 8)):$((dev & 255))"; }
stage_cufile_udev() {
  rec=$(udev_record); mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' > "$rec"
  GPQ_EXPECT_CUFILE_COMPAT=1 GPQ_SF10_LINEITEM=${GPQ_SF10_LINEITEM:-$data/sf10/lineitem.parquet} \
    "$work/bin/test-io_gpu" --test-threads=1 --nocapture > "$OUT/test-io_gpu-cufile.log" 2>&1
  note "test-io_gpu with udev record, cufile-compat required: rc=$? $(grep -E '^test result' "$OUT/test-io_gpu-cufile.log")"
  grep -E "GB/s, .* mismatches" "$OUT/test-io_gpu-cufile.log" | tee -a "$summary"
  f=${GPQ_SF10_LINEITEM:-$data/sf10/lineitem.parquet}
  gpq bench io "$f" --paths cufile-compat --threads 1,4,8,16,32 --repeat 5 2>&1 | tee "$OUT/bench-io-cufile.md" | tail -6 | tee -a "$summary"
  rm -f "$rec"
}

stage_sanitizer_races() {
  # racecheck (shared-memory hazards) and synccheck (barrier use) on the decode tests, small sizes,
  # on gpq's own kernels (--kernel-name kns=gpq_): nvCOMP 6.0's unsnap_kernel reports
  # racecheck hazards of its own (BENCHMARKS.md), which would hide ours behind the display cap.
  # (libtest takes one name filter per run.)
  for tool in racecheck synccheck; do
    for test in matrix_matches_arrow_rs tpch_tables_match; do
      GPQ_TEST_SMALL=1 sanitize --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/test-decode_gpu" --test-threads=1 \
        --exact "$test" > "$OUT/sanitizer-$tool-$test.log" 2>&1
      note "$tool test-decode_gpu $test: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitizer-$tool-$test.log" | tr '\n' ' ')"
    done
    for t in test-corrupt_gpu test-hostile; do
      GPQ_TEST_SMALL=1 sanitize --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/$t" --test-threads=1 --skip regressions_are \
        > "$OUT/sanitizer-$tool-$t.log" 2>&1
      note "$tool $t: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitizer-$tool-$t.log" | tr '\n' ' ')"
    done
  done
}

stage_regressions() {
  # The regression corpus (testdata/regressions) and the memory checks, alone,
  # each read bounded in time: a typed error in well under a second.
  timeout 90 "$work/bin/test-hostile" --test-threads=1 --nocapture --exact regressions_are_quick_typed_errors \
    > "$OUT/regressions.log" 2>&1
  note "regressions: rc=$? $(grep -E 'parquet: |test result' "$OUT/regressions.log" | cut -c1-400 | tr '\n' ' ')"
  for t in memory_budget_is_enforced failed_read_returns_its_memory; do
    timeout 60 "$work/bin/test-hostile" --test-threads=1 --nocapture --exact $t > "$OUT/hostile-$t.log" 2>&1
    note "$t: rc=$? $(grep -E 'free device memory|test result' "$OUT/hostile-$t.log" | tr '\n' ' ')"
  done
}

stage_sanitizer_core() {
  # memcheck, racecheck and synccheck on the decode, corruption and edge-file tests (gpq's kernels), each bounded.
  for t in test-decode_gpu test-corrupt_gpu test-edge_files_gpu; do
    GPQ_TEST_SMALL=1 GPQ_NVCOMP_DEADLINE_S=120 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 "$work/bin/$t" --test-threads=1 > "$OUT/memcheck-$t.log" 2>&1
    note "memcheck $t: rc=$? $(grep -E 'ERROR SUMMARY|test result' "$OUT/memcheck-$t.log" | tr '\n' ' ')"
  done
  for tool in racecheck synccheck; do
    GPQ_TEST_SMALL=1 GPQ_NVCOMP_DEADLINE_S=120 timeout 60 compute-sanitizer --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/test-corrupt_gpu" --test-threads=1 > "$OUT/$tool-corrupt.log" 2>&1
    note "$tool test-corrupt_gpu: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/$tool-corrupt.log" | tr '\n' ' ')"
    GPQ_TEST_SMALL=1 GPQ_NVCOMP_DEADLINE_S=120 timeout 60 compute-sanitizer --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/test-decode_gpu" --test-threads=1 --exact matrix_matches_arrow_rs > "$OUT/$tool-matrix.log" 2>&1
    note "$tool test-decode_gpu matrix: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/$tool-matrix.log" | tr '\n' ' ')"
    GPQ_TEST_SMALL=1 GPQ_NVCOMP_DEADLINE_S=120 timeout 60 compute-sanitizer --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/test-edge_files_gpu" --test-threads=1 > "$OUT/$tool-edge.log" 2>&1
    note "$tool test-edge_files_gpu: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/$tool-edge.log" | tr '\n' ' ')"
  done
  stage_sanitizer_filter
}

stage_sanitizer_filter() {
  # The filter, scan and gather kernels (issue 15): every tool on the fixed predicates and the sliced columns.
  for tool in memcheck racecheck synccheck; do
    GPQ_TEST_SMALL=1 timeout 120 compute-sanitizer --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/test-filter_gpu" --test-threads=1 --skip random > "$OUT/$tool-filter.log" 2>&1
    note "$tool test-filter_gpu: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/$tool-filter.log" | tr '\n' ' ')"
    # The aggregation kernel (issue 15's device partial aggregation).
    GPQ_TEST_SMALL=1 timeout 120 compute-sanitizer --tool $tool --kernel-name kns=gpq_ --error-exitcode 99 "$work/bin/test-aggregate_gpu" --test-threads=1 > "$OUT/$tool-aggregate.log" 2>&1
    note "$tool test-aggregate_gpu: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/$tool-aggregate.log" | tr '\n' ' ')"
  done
}

stage_context_loss() {
  # A fault inside nvCOMP on purpose (the SNAPPY reproducer with the device
  # check off): gpq must report GpuContextLost, reset the device, and read
  # the next file (also through nvCOMP) correctly in the same process.
  GPQ_TEST_CONTEXT_LOSS=1 timeout 60 "$work/bin/test-hostile" --test-threads=1 --nocapture --exact lost_context_is_reset_and_the_next_read_works \
    > "$OUT/context-loss.log" 2>&1
  note "context-loss: rc=$? $(grep -E 'unchecked read|NOTE|test result' "$OUT/context-loss.log" | tr '\n' ' ')"
}

stage_first_read() {
  # Issue 13: `gpq demo` in fresh processes with no kernel cache and no
  # writable home (prebuilt kernels), then with NVRTC (GPQ_KERNELS=jit) on an
  # empty and on a filled cache, for comparison. Each run is a new process:
  # its first read pays for the context and the kernels.
  local d=$work/demo
  gpq demo --out "$d" > "$OUT/first-read-gen.log" 2>&1   # generates the data (kept for the runs below)
  local t=$OUT/first-read.time
  for run in 1 2 3; do
    note "$(python3 scripts/cuda_floor.py 2>&1)"
    /usr/bin/time -f '%e' -o "$t" env -u GPQ_KERNEL_CACHE -u XDG_CACHE_HOME HOME=/nonexistent RUST_LOG=gpq=info \
      gpq demo --out "$d" > "$OUT/first-read-$run.log" 2>&1
    note "first-read prebuilt run $run: demo wall $(cat "$t") s; $(grep -E '^\| (nation|region) ' "$OUT/first-read-$run.log" | tr '\n' ' ')"
    note "  $(grep -E 'made the device ready' "$OUT/first-read-$run.log")"
    note "  nvCOMP's load: $(sed 's/\x1b\[[0-9;]*m//g' "$OUT/first-read-$run.log" | grep -E 'nvCOMP loaded' | grep -oE ' ms=[0-9.]+' | head -1)"
  done
  rm -rf "$work/jit-cache"
  for run in empty-cache filled-cache; do
    /usr/bin/time -f '%e' -o "$t" env GPQ_KERNELS=jit GPQ_KERNEL_CACHE="$work/jit-cache" gpq demo --out "$d" > "$OUT/first-read-jit-$run.log" 2>&1
    note "first-read jit $run: demo wall $(cat "$t") s; $(grep -E '^\| (nation|region) ' "$OUT/first-read-jit-$run.log" | tr '\n' ' ')"
    note "  $(grep -E 'made the device ready' "$OUT/first-read-jit-$run.log")"
  done
}

stage_kernel_paths() {
  # The two ways to kernels other than the prebuilt cubin, each through the
  # decode and corruption tests (small sizes): the prebuilt PTX compiled by
  # the driver (GPQ_KERNELS=ptx), and NVRTC (GPQ_KERNELS=jit).
  for source in ptx jit; do
    for t in test-decode_gpu test-corrupt_gpu; do
      GPQ_KERNELS=$source GPQ_TEST_SMALL=1 timeout "${TEST_TIMEOUT:-300}" "$work/bin/$t" --test-threads=1 > "$OUT/kernels-$source-$t.log" 2>&1
      note "GPQ_KERNELS=$source $t: rc=$? $(grep -E '^test result' "$OUT/kernels-$source-$t.log" | tail -1)"
      grep -E "^test .* FAILED|panicked at .*gpq" "$OUT/kernels-$source-$t.log" | head -5 | tee -a "$summary"
    done
  done
}

stage_page_checks() {
  # What the device's check of compressed pages costs on SF10 lineitem
  # (SNAPPY and ZSTD): reads with and without it, alternating, same process
  # state; PAGE_CHECK_ROUNDS rounds (3), and the group counts of
  # PAGE_CHECK_GROUPS beside the default grouping; each setting of
  # PAGE_CHECK_ENVS (e.g. "GPQ_ZSTD_DECODER=nvcomp,GPQ_SKIP_PAGE_CHECKS=1",
  # variables joined by commas; or GPQ_KERNELS=file:PATH, another version of
  # the kernels: DEVICE_KERNELS_FROM in scripts/device-test.sh) adds reads of
  # the same groupings with those variables set; PAGE_CHECK_DATA: the
  # data sets (sf10 sf10-zstd).
  sf10_lineitem zstd
  for d in ${PAGE_CHECK_DATA:-sf10 sf10-zstd}; do
    f=$data/$d/lineitem.parquet
    cat "$f" > /dev/null
    gpq read "$f" --repeat 2 > /dev/null 2>&1   # warm-up: kernels, pools
    for round in $(seq 1 "${PAGE_CHECK_ROUNDS:-3}"); do
      # The default grouping, then each count in PAGE_CHECK_GROUPS (e.g. "1").
      for g in default ${PAGE_CHECK_GROUPS:-}; do
        groups=(); [ "$g" = default ] || groups=(--groups "$g")
        for skip in 0 1; do
          line=$(GPQ_SKIP_PAGE_CHECKS=$skip timeout 60 gpq read "$f" --repeat 5 "${groups[@]}" 2>&1 | grep -E 'stages \(ms\)')
          note "page-checks $(basename "$(dirname "$f")") round $round groups=$g checks=$([ $skip = 0 ] && echo on || echo off): $line"
        done
      done
      for setting in ${PAGE_CHECK_ENVS:-}; do
        for g in default ${PAGE_CHECK_GROUPS:-}; do
          groups=(); [ "$g" = default ] || groups=(--groups "$g")
          # shellcheck disable=SC2046  # one setting may be several VAR=value joined by commas
          line=$(env $(echo "$setting" | tr ',' ' ') timeout 60 gpq read "$f" --repeat 5 "${groups[@]}" 2>&1 | grep -E 'stages \(ms\)')
          note "page-checks $(basename "$(dirname "$f")") round $round groups=$g $setting: $line"
        done
      done
    done
  done
}

stage_sanitizer() {
  for t in "$work"/bin/test-decode* "$work"/bin/test-corrupt* "$work"/bin/test-io* "$work"/bin/test-hostile; do
    [ -e "$t" ] || continue
    name=$(basename "$t")
    # (the regression inputs may make nvCOMP loop until its deadline: they run in `tests`)
    skip=(); [ "$name" = test-hostile ] && skip=(--skip regressions_are --skip failed_read)
    GPQ_TEST_SMALL=1 GPQ_SF10_LINEITEM= sanitize --tool memcheck --error-exitcode 99 "$t" --test-threads=1 "${skip[@]}" > "$OUT/sanitizer-$name.log" 2>&1
    note "memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY|test result' "$OUT/sanitizer-$name.log" | tr '\n' ' ')"
    note "  memory access errors: $(grep -cE 'Invalid __(global|shared|local)__|out of bounds|misaligned' "$OUT/sanitizer-$name.log"); API errors: $(grep 'Program hit' "$OUT/sanitizer-$name.log" | sed 's/.*Program hit //' | sort | uniq -c | tr '\n' ';')"
  done
}

stage_suite() {
  # The side-by-side suite: tables x layouts, warm and cold, at SF10
  # (SUITE_LAYOUTS and SUITE_TABLES narrow it; default all; SUITE_COLD=0: warm only).
  cold=(--cold); [ "${SUITE_COLD:-1}" = 0 ] && cold=()
  gpq bench -s 10 --data "$data/suite" "${cold[@]}" --repeat 3 --out "$OUT/suite" \
    --layouts "${SUITE_LAYOUTS:-default,gpu,zstd}" ${SUITE_TABLES:+--tables "$SUITE_TABLES"} > "$OUT/suite.log" 2>&1
  note "suite: rc=$?"
  cat "$OUT/suite.md" 2>/dev/null | tee -a "$summary" || tail -20 "$OUT/suite.log" | tee -a "$summary"
}

stage_criterion() {
  f=${GPQ_SF10_LINEITEM:-$data/sf10/lineitem.parquet}
  for b in "$work"/bin/bench-*; do
    [ -e "$b" ] || continue
    GPQ_BENCH_FILE=$f "$b" --bench --warm-up-time 1 --measurement-time 4 --sample-size 10 > "$OUT/criterion-$(basename "$b").log" 2>&1
    note "criterion $(basename "$b"): rc=$?"
    grep -E "^[a-z_/]+ +time:|thrpt:" -A0 "$OUT/criterion-$(basename "$b").log" | tee -a "$summary"
  done
}

stage_tpch_bench() {
  # 22 TPC-H queries through DataFusion at SF10: built-in Parquet vs gpq's provider (issue 5),
  # and gpq with device filters vs without (issue 15: times, MB copied to the host; TPCH_FILTERS=0: skip).
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  cat "$d"/*.parquet > /dev/null
  compare=(--compare-device-filters); [ "${TPCH_FILTERS:-1}" = 0 ] && compare=()
  # TPCH_BACKEND: auto (the default: scans under gpu_min_scan_bytes on the CPU) or gpu (every scan on the GPU).
  gpq bench tpch --data "$d" --repeat "${TPCH_REPEAT:-3}" --backend "${TPCH_BACKEND:-auto}" "${compare[@]}" 2>&1 | tee "$OUT/tpch-sf10-${TPCH_BACKEND:-auto}.md" | tail -30 | tee -a "$summary"
  note "tpch-bench: rc=${PIPESTATUS[0]}"
}

stage_tpch_joins() {
  # Issue 15: gpq's scans report their output's size in bytes and DataFusion's built-in scan
  # does not, so DataFusion's join selection broadcasts a build side over gpq only under its
  # 1 MiB byte threshold, and over the built-in scan under its 128k-row one: at SF1, q3, q4,
  # q8, q9, q10, q17, q19 and q20 repartition their probe side (lineitem) over gpq's GPU scans
  # and not over the built-in's (plans compared on the CPU emulator, 2026-12-05). The queries
  # with the default thresholds, then with a 16 MiB byte threshold (DATAFUSION_* variables
  # reach both sessions; the built-in plans have no byte sizes and keep theirs).
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  cat "$d"/*.parquet > /dev/null
  local qs=3,4,8,9,10,17,19,20
  gpq bench tpch --data "$d" --queries $qs --repeat "${TPCH_REPEAT:-3}" --backend auto 2>&1 | tee "$OUT/tpch-joins-default.md" | tail -12 | tee -a "$summary"
  note "tpch-joins default thresholds: rc=${PIPESTATUS[0]}"
  DATAFUSION_OPTIMIZER_HASH_JOIN_SINGLE_PARTITION_THRESHOLD=16777216 gpq bench tpch --data "$d" --queries $qs --repeat "${TPCH_REPEAT:-3}" --backend auto 2>&1 | tee "$OUT/tpch-joins-16M.md" | tail -12 | tee -a "$summary"
  note "tpch-joins 16 MiB byte threshold: rc=${PIPESTATUS[0]}"
}

stage_tpch_sf30() {
  # Issue 15: the 22 TPC-H queries at SF30 (generated here: about 11 GB of Parquet on the 64 GB
  # disk, kept while the machine is), one timed run per query after a warm-up, built-in Parquet
  # vs gpq (TPCH_BACKEND, default auto), same results checked. Generation alone may need a call
  # of its own: a marker says the set is complete, so a later call goes straight to the queries.
  d=$data/sf30
  if [ ! -e "$d/.complete" ]; then
    rm -rf "$d"
    t0=$(date +%s)
    gpq gen -s 30 --out "$d" > "$OUT/tpch-sf30-gen.log" 2>&1 && touch "$d/.complete"
    note "tpch-sf30: gen rc=$? in $(( $(date +%s) - t0 )) s, $(du -sh "$d" | cut -f1)"
  fi
  [ -e "$d/.complete" ] || return
  cat "$d"/*.parquet > /dev/null
  gpq bench tpch --data "$d" --repeat 1 --backend "${TPCH_BACKEND:-auto}" 2>&1 | tee "$OUT/tpch-sf30-${TPCH_BACKEND:-auto}.md" | tail -27 | tee -a "$summary"
  note "tpch-sf30: rc=${PIPESTATUS[0]}"
}

stage_ballista_gpus() {
  # Issue 16 (the nvidia-h200-x2 kind): the 22 TPC-H queries at SF10 on one local process with
  # one GPU, then on a Ballista cluster in this process (a scheduler and 2 executors, one per GPU)
  # over gpq tables and over DataFusion's built-in Parquet scan; same results checked each time.
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  cat "$d"/*.parquet > /dev/null
  nvidia-smi -L | tee -a "$summary"
  gpq bench tpch --data "$d" --repeat "${TPCH_REPEAT:-1}" --backend auto --devices 0 2>&1 | tee "$OUT/ballista-local.md" | tail -26 | tee -a "$summary"
  note "ballista-gpus local one GPU: rc=${PIPESTATUS[0]}"
  gpq bench tpch --data "$d" --repeat "${TPCH_REPEAT:-1}" --backend auto --cluster local:2 2>&1 | tee "$OUT/ballista-cluster.md" | tail -27 | tee -a "$summary"
  note "ballista-gpus cluster local:2: rc=${PIPESTATUS[0]}"
}

stage_tpch_profile() {
  # Where the provider's time goes (issue 15's SF10 regression): q1 and q6 over SF10 lineitem
  # with `gpq sql` (each query twice in one process, the second one warm; the scan's metrics
  # print after it), in configurations that isolate one cause each: late materialization,
  # device filters, page index, decompressor, partitions, pinned copies; and the core reader
  # alone on the same columns.
  d=$data/profile
  mkdir -p "$d"
  [ -e "$d/lineitem.parquet" ] || gpq gen -s 10 --tables lineitem --out "$d" > /dev/null 2>&1
  cat "$d/lineitem.parquet" > /dev/null
  q1=$(gpq_tpch_query 1); q6=$(gpq_tpch_query 6)
  run() {  # NAME ENV... -- ARGS...
    local name=$1; shift
    local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    for q in q1 q6; do
      env "${envs[@]}" RUST_LOG=${PROFILE_LOG:-gpq=info} timeout 120 gpq sql --data "$d" --backend "${PROFILE_BACKEND:-gpu}" "$@" "${!q}; ${!q}" > "$OUT/profile-$name-$q.log" 2>&1
      note "profile $name $q: rc=$? $(grep -E ' rows in ' "$OUT/profile-$name-$q.log" | tr '\n' ' ')"
      grep -E '^ +metrics:' "$OUT/profile-$name-$q.log" | tail -1 | tr ',' '\n' | grep -E 'device_reads|bytes_read|bytes_to_host|pageable|_time|fallback|late_rows|output_batches' | tr '\n' ' ' | tee -a "$summary"; echo | tee -a "$summary"
      note "  log: $(grep -c 'on the CPU' "$OUT/profile-$name-$q.log") lines 'on the CPU', $(grep -c 'pageable memory' "$OUT/profile-$name-$q.log") 'pageable memory'"
    done
  }
  run default GPQ_X=1 --
  run late GPQ_X=1 -- --late-materialization
  run no-filters GPQ_X=1 -- --no-device-filters
  run no-filters-no-index GPQ_X=1 -- --no-device-filters --no-page-index
  run no-filters-nvcomp GPQ_X=1 -- --no-device-filters --decompress nvcomp
  run no-filters-cpu-decompress GPQ_X=1 -- --no-device-filters --decompress cpu
  run no-filters-4-partitions GPQ_X=1 -- --no-device-filters --partitions 4
  run no-filters-pageable GPQ_PINNED_HOST_BYTES=0 -- --no-device-filters
  run no-filters-io2 GPQ_IO_THREADS=2 -- --no-device-filters
  PROFILE_BACKEND=cpu run cpu-backend GPQ_X=1 --
  for cols in l_quantity,l_extendedprice,l_discount,l_shipdate l_returnflag,l_linestatus,l_quantity,l_extendedprice,l_discount,l_tax,l_shipdate; do
    gpq read "$d/lineitem.parquet" --columns "$cols" --repeat 5 > "$OUT/profile-read-$cols.log" 2>&1
    note "profile core read $cols: rc=$? $(grep -iE 'median|total' "$OUT/profile-read-$cols.log" | head -3 | tr '\n' ' ')"
  done
}

stage_tpch_explain() {
  # Where a query's time goes, scan against DataFusion (issue 15): EXPLAIN ANALYZE of q1 and
  # q6 over SF10 lineitem with the GPU backend (one pass a partition, then EXPLAIN_PASSES,
  # default 4) and the CPU backend, each query three times first (the later ones warm); then
  # the small-table queries q2, q16 and q22 twice each with their scans' metrics. Few log
  # files (the device tool brings back only so many): explain-lineitem.log, explain-small.log.
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  cat "$d"/*.parquet > /dev/null
  local l=$data/explain; mkdir -p "$l"; ln -sf "$d/lineitem.parquet" "$l/lineitem.parquet"
  local q1 q6
  q1=$(gpq_tpch_query 1); q6=$(gpq_tpch_query 6)
  explain() {  # NAME LOG ARGS...
    local name=$1 log=$OUT/$2; shift 2
    echo "##### $name" >> "$log"
    timeout 120 "$@" >> "$log" 2>&1
    note "explain $name: rc=$? $(sed -n "/^##### $name\$/,\$p" "$log" | grep -E ' rows in ' | tr '\n' ' ')"
  }
  for q in q1 q6; do
    local sql=${!q}
    explain "gpu-$q" explain-lineitem.log gpq sql --data "$l" --backend gpu "$sql; $sql; $sql; explain analyze $sql"
    explain "gpu-passes-$q" explain-lineitem.log gpq sql --data "$l" --backend gpu --min-passes "${EXPLAIN_PASSES:-4}" "$sql; $sql; $sql; explain analyze $sql"
    explain "cpu-$q" explain-lineitem.log gpq sql --data "$l" --backend cpu "$sql; $sql; $sql; explain analyze $sql"
  done
  for b in gpu cpu; do
    explain "$b-small" explain-small.log gpq tpch --data "$d" --backend "$b" --query 2,2,16,16,22,22
  done
}

sf10_lineitem_dir() {
  # Prints a folder holding SF10 lineitem alone (a table of its own for `gpq sql`):
  # the suite's file where stage tpch-bench made it, else $data/sf10's, else one
  # generated; page cache warm.
  local l=$data/agg-quick; mkdir -p "$l"
  local made
  for made in "$data/suite/default/lineitem.parquet" "$data/sf10/lineitem.parquet"; do
    [ -e "$l/lineitem.parquet" ] || { [ -e "$made" ] && ln -sf "$made" "$l/lineitem.parquet"; }
  done
  [ -e "$l/lineitem.parquet" ] || gpq gen -s 10 --tables lineitem --out "$l" > /dev/null 2>&1
  cat "$l/lineitem.parquet" > /dev/null
  echo "$l"
}
stage_agg_quick() {
  # Issue 15, the device partial aggregation in a few minutes of device time:
  # SF10 lineitem alone, q1 and q6 four times each in one process (the first
  # cold) on the CPU backend, the GPU backend, and the GPU backend without
  # the device aggregation.
  local l; l=$(sf10_lineitem_dir)
  local n q
  for n in 1 6; do
    q=$(gpq_tpch_query $n)
    for run in "cpu --backend cpu" "gpu --backend gpu" "gpu-no-device-aggregation --backend gpu --no-device-aggregation"; do
      set -- $run
      local name=$1; shift
      timeout 60 gpq sql --data "$l" "$@" "$q; $q; $q; $q" > "$OUT/agg-quick.tmp" 2>&1
      note "agg-quick q$n $name: rc=$? runs: $(grep -E ' rows in ' "$OUT/agg-quick.tmp" | sed 's/.* rows in //' | tr '\n' ' ')"
    done
  done
  rm -f "$OUT/agg-quick.tmp"
}
stage_agg_groups() {
  # Issue 15: q15, q17, q18 and q20 aggregate lineitem by keys of many groups
  # (supplier; part; order; part and supplier). By default (4096 groups) the
  # rule leaves them to DataFusion, their keys spanning more values than that;
  # with the earlier limit of 2^17, q15's suppliers go to the device and the
  # others' batches try it and then go to the host. q10 (no aggregation over
  # a scan) is the control. The five queries with the default, with 2^17
  # groups, and without the device aggregation; then q15, q17, q18 and q20
  # once each with their scans' metrics (agg-groups-metrics.log: the
  # device_aggregate_* counters).
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  cat "$d"/*.parquet > /dev/null
  local qs=10,15,17,18,20 name
  for run in "default" "max-131072 --device-aggregation-max-groups 131072" "off --no-device-aggregation"; do
    set -- $run; name=$1; shift
    gpq bench tpch --data "$d" --queries $qs --repeat "${TPCH_REPEAT:-3}" --backend auto "$@" 2>&1 | tee "$OUT/agg-groups-$name.md" | tail -9 | tee -a "$summary"
    note "agg-groups $name: rc=${PIPESTATUS[0]}"
  done
  timeout 200 gpq tpch --data "$d" --backend auto --query 15,17,18,20 > "$OUT/agg-groups-metrics.log" 2>&1
  note "agg-groups metrics: rc=$? $(grep -E ' rows in ' "$OUT/agg-groups-metrics.log" | tr '\n' ' ')"
  grep -oE 'device_aggregate_[a-z_]+=[^,]+' "$OUT/agg-groups-metrics.log" | sort | uniq -c | head -20 | tee -a "$summary"
}
stage_q6_knobs() {
  # Issue 15's q6 target (3x the built-in reader): q6 over SF10 lineitem, four
  # runs in one process (the first cold) with the defaults, fewer and larger
  # device reads (--gpu-min-partition-bytes), and blocking waits for the GPU.
  local l; l=$(sf10_lineitem_dir)
  local q; q=$(gpq_tpch_query 6)
  for run in "default" "partition-64M --gpu-min-partition-bytes 64M" "partition-256M --gpu-min-partition-bytes 256M" "blocking" "cpu --backend cpu"; do
    set -- $run; local name=$1; shift
    local wait=(); [ "$name" = blocking ] && wait=(GPQ_CUDA_WAIT=blocking)
    env "${wait[@]}" timeout 60 gpq sql --data "$l" "$@" "$q; $q; $q; $q" > "$OUT/q6-knobs.tmp" 2>&1
    note "q6 $name: rc=$? runs: $(grep -E ' rows in ' "$OUT/q6-knobs.tmp" | sed 's/.* rows in //' | tr '\n' ' ')"
  done
  rm -f "$OUT/q6-knobs.tmp"
}
stage_tpch_cpu_time() {
  # Issue 15, q1 and q6: does the GPU backend leave cores idle, or does something of gpq's
  # keep them busy? Each query six times in one process (the first cold), with the
  # process's user and system CPU seconds beside its wall time: CPU backend; GPU with one
  # pass, 4 passes, blocking waits, 8 and 32 partitions, and GPU scans of at least 64 and
  # 128 MiB a partition (gpu_min_partition_bytes); and GPU without the device partial
  # aggregation (the others have it). 16 cores x wall time against user +
  # system time says how busy the cores were.
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  local l=$data/explain; mkdir -p "$l"; ln -sf "$d/lineitem.parquet" "$l/lineitem.parquet"
  cat "$l/lineitem.parquet" > /dev/null
  cpu_time() {  # NAME ENV... -- ARGS...
    local name=$1; shift
    local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    env "${envs[@]}" /usr/bin/time -f "cpu-time $name: user %U s, system %S s, wall %e s" timeout 120 gpq sql --data "$l" "$@" "$all" > "$OUT/cpu-time.tmp" 2>&1
    note "$(grep '^cpu-time' "$OUT/cpu-time.tmp") | runs: $(grep -E ' rows in ' "$OUT/cpu-time.tmp" | sed 's/.* rows in //' | tr '\n' ' ')"
  }
  local n q all
  for n in 1 6; do
    q=$(gpq_tpch_query $n); all="$q; $q; $q; $q; $q; $q"
    cpu_time q$n-cpu GPQ_X=1 -- --backend cpu
    cpu_time q$n-gpu GPQ_X=1 -- --backend gpu
    cpu_time q$n-gpu-no-device-aggregation GPQ_X=1 -- --backend gpu --no-device-aggregation
    cpu_time q$n-gpu-4-passes GPQ_X=1 -- --backend gpu --min-passes 4
    cpu_time q$n-gpu-blocking GPQ_CUDA_WAIT=blocking -- --backend gpu
    cpu_time q$n-gpu-8-partitions GPQ_X=1 -- --backend gpu --partitions 8
    cpu_time q$n-gpu-32-partitions GPQ_X=1 -- --backend gpu --partitions 32
    cpu_time q$n-gpu-64M-a-partition GPQ_X=1 -- --backend gpu --gpu-min-partition-bytes 64M
    cpu_time q$n-gpu-128M-a-partition GPQ_X=1 -- --backend gpu --gpu-min-partition-bytes 128M
  done
  rm -f "$OUT/cpu-time.tmp"
}

# TPC-H query N's text as gpq's benchmarks run it (q1 and q6 have one statement).
gpq_tpch_query() {
  case $1 in
    1) echo "select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price, sum(l_extendedprice * (1 - l_discount)) as sum_disc_price, sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, avg(l_quantity) as avg_qty, avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc, count(*) as count_order from lineitem where l_shipdate <= date '1998-12-01' - interval '90' day group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus" ;;
    6) echo "select sum(l_extendedprice * l_discount) as revenue from lineitem where l_shipdate >= date '1994-01-01' and l_shipdate < date '1995-01-01' and l_discount between 0.05 and 0.07 and l_quantity < 24" ;;
  esac
}

stage_tpch_gpus() {
  # Issue 15 part 5 (the nvidia-h200-x2 kind): the 22 TPC-H queries at SF10 with the GPU
  # backend's partitions on one GPU, then spread over every GPU; same results checked.
  d=$data/suite/default
  if [ ! -e "$d/supplier.parquet" ]; then gpq gen -s 10 --out "$d" > /dev/null 2>&1; fi
  cat "$d"/*.parquet > /dev/null
  nvidia-smi -L | tee -a "$summary"
  for devices in 0 all; do
    gpq bench tpch --data "$d" --repeat "${TPCH_REPEAT:-3}" --backend gpu --devices "$devices" 2>&1 | tee "$OUT/tpch-sf10-devices-$devices.md" | tail -26 | tee -a "$summary"
    note "tpch-bench devices=$devices: rc=${PIPESTATUS[0]}"
  done
}

# The mutation fuzzer (crates/gpq-fuzz, scripts/fuzz/fuzz.py): seeds written with pyarrow,
# FUZZ_COUNT mutants (default 10000) read by FUZZ_JOBS gpq-fuzz processes (default 4), each file
# within FUZZ_TIMEOUT seconds (default 5), all within FUZZ_BUDGET seconds (default 300; what is
# left is reported as not run). FUZZ_SANITIZE=K (default 0) also reads K files (findings first)
# under compute-sanitizer memcheck, within FUZZ_SANITIZE_BUDGET seconds (default 120); one device
# command has 10 minutes. Back in $OUT: fuzz-summary.md and fuzz.tar.gz (results.tsv,
# mutations.tsv, sanitizer.tsv, the findings' input files, logs).
stage_fuzz() {
  local fo=$work/fuzz-out
  rm -rf "$fo" && mkdir -p "$fo"
  python3 "$work/bin/fuzz.py" --bin "$work/bin/gpq-fuzz" --out "$fo" --work "$work/fuzz-work" \
    --count "${FUZZ_COUNT:-10000}" --timeout "${FUZZ_TIMEOUT:-5}" --jobs "${FUZZ_JOBS:-4}" \
    --budget "${FUZZ_BUDGET:-300}" --sanitize "${FUZZ_SANITIZE:-0}" \
    --sanitize-budget "${FUZZ_SANITIZE_BUDGET:-120}" --rng-seed "${FUZZ_RNG_SEED:-1}" > "$fo/fuzz.log" 2>&1
  local rc=$?
  cp "$fo/summary.md" "$OUT/fuzz-summary.md" 2>/dev/null || tail -20 "$fo/fuzz.log" | tee -a "$summary"
  tar -czf "$OUT/fuzz.tar.gz" -C "$fo" .
  note "fuzz: rc=$rc (0: no hang, crash, panic, lost context, unhealthy read or memcheck error)"
  grep -E '^- (outcomes|[0-9]+ files read|\*\*|ERROR SUMMARY|per-file errors)' "$fo/summary.md" 2>/dev/null | tee -a "$summary"
  rm -rf "$work/fuzz-work"
}

# Issue 11's performance rows: SF10 lineitem with the default encodings,
# with DELTA and with BYTE_STREAM_SPLIT, and TPC-H orders with their line
# items as a list<struct> column (COVERAGE_NESTED_SF, default 10), each read
# whole by `gpq bench decode` (median of 5 after a warm-up) in one process
# state, page cache warm.
stage_bench_coverage() {
  local sf=${COVERAGE_SF:-10} nsf=${COVERAGE_NESTED_SF:-10}
  for enc in default delta byte-stream-split; do
    d=$data/sf$sf-$enc; mkdir -p "$d"
    [ -e "$d/lineitem.parquet" ] || timeout 300 gpq gen -s "$sf" --tables lineitem --encoding "$enc" --out "$d" > /dev/null 2>&1
    note "gen lineitem sf$sf $enc: rc=$? $(du -h "$d/lineitem.parquet" 2>/dev/null | cut -f1)"
  done
  d=$data/sf$nsf-nested; mkdir -p "$d"
  [ -e "$d/orders_lineitems.parquet" ] || timeout 300 gpq gen -s "$nsf" --tables orders_lineitems --out "$d" > /dev/null 2>&1
  note "gen orders_lineitems sf$nsf: rc=$? $(du -h "$d/orders_lineitems.parquet" 2>/dev/null | cut -f1)"
  for f in "$data/sf$sf-default/lineitem.parquet" "$data/sf$sf-delta/lineitem.parquet" \
           "$data/sf$sf-byte-stream-split/lineitem.parquet" "$data/sf$nsf-nested/orders_lineitems.parquet"; do
    [ -e "$f" ] || continue
    cat "$f" > /dev/null
    # COVERAGE_SETS (lineitem files only; default "all"): column sets as
    # `gpq bench decode --sets` takes them, to see where a difference lies.
    sets=all; case $f in */lineitem.parquet) sets=${COVERAGE_SETS:-all} ;; esac
    timeout 120 gpq bench decode "$f" --sets "$sets" --repeat 5 2>&1 | tee -a "$OUT/bench-coverage.md" \
      | grep -E '^\| [a-z]|^file' | grep -v '^| columns' | tee -a "$summary"
  done
}

# Issue 12: SF10 lineitem whole (one pass) against the batch reader under
# a device-memory limit (BATCH_LIMITS, default "1GiB 4GiB"), warm page cache,
# medians of 5; the bounded reads also report their peak device memory, and
# one of them is checked against arrow-rs.
stage_batches() {
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  cat "$f" > /dev/null
  gpq read "$f" --repeat 2 > /dev/null 2>&1
  note "batches whole: $(timeout 120 gpq read "$f" --repeat 5 2>&1 | grep -E 'stages \(ms\)')"
  # Under each limit, BATCH_AHEAD passes at once (1: one at a time, the
  # next one's chunks read beside it; 4: the default).
  for limit in ${BATCH_LIMITS:-1GiB 4GiB}; do
    for ahead in ${BATCH_AHEAD:-1 4 8}; do
      out=$(timeout 300 gpq read "$f" --memory-limit "$limit" --decode-ahead "$ahead" --repeat 5 2>&1)
      note "batches limit $limit decode-ahead $ahead: $(echo "$out" | grep -E 'batches:|wall:|device memory:' | tr -s ' ' | tr '\n' ';')"
    done
  done
  out=$(timeout 300 gpq read "$f" --memory-limit "${BATCH_VERIFY_LIMIT:-1GiB}" --verify 2>&1)
  note "batches verify: $(echo "$out" | grep -E 'verify:|error' | tr -s ' ' | tr '\n' ';')"
  # Row windows: 1 % of the rows from the middle, the first 1000 rows (only their pages are read).
  for sel in "--rows 30000000..30600000" "--limit 1000"; do
    out=$(timeout 120 gpq read "$f" $sel --repeat 5 2>&1)
    note "batches $sel: $(echo "$out" | grep -E 'batches:|bytes:|wall:|error' | tr -s ' ' | tr '\n' ';')"
    out=$(timeout 300 gpq read "$f" $sel --verify 2>&1)
    note "batches $sel verify: $(echo "$out" | grep -E 'verify:|error' | tr -s ' ' | tr '\n' ';')"
  done
  # The same table as 100 files (about 25 MB each) read as one sequence, against the one file.
  d=$data/sf10-100files
  [ -d "$d/lineitem" ] || timeout 300 gpq gen -s 10 --tables lineitem --files 100 --out "$d" > /dev/null 2>&1
  cat "$d"/lineitem/*.parquet > /dev/null
  for src in "$f" "$d/lineitem"; do
    out=$(timeout 300 gpq read "$src" --memory-limit 16GiB --repeat 5 2>&1)
    note "batches $(basename "$src"): $(echo "$out" | grep -E 'batches:|wall:' | tr -s ' ' | tr '\n' ';')"
  done
}

# Small reads (issue 12, part 4): SF10 supplier and lineitem's first rows,
# with gpq's choice of decompressor against nvCOMP and the CPU forced.
stage_small_reads() {
  mkdir -p "$data/sf10"
  [ -e "$data/sf10/supplier.parquet" ] || gpq gen -s 10 --tables supplier,nation --out "$data/sf10" > /dev/null 2>&1
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  cat "$data"/sf10/*.parquet > /dev/null
  for t in supplier nation; do
    for mode in auto nvcomp cpu; do
      out=$(timeout 60 gpq read "$data/sf10/$t.parquet" --decompress $mode --repeat 9 2>&1)
      note "small $t $mode: $(echo "$out" | grep -E 'decompression:|stages \(ms\)|error' | tr -s ' ' | tr '\n' ';')"
    done
  done
  RUST_LOG=gpq=debug timeout 60 gpq read "$data/sf10/supplier.parquet" --repeat 3 > "$OUT/small-supplier-debug.log" 2>&1
  for mode in auto nvcomp; do
    for sel in "--limit 1000" "--rows 30000000..30600000"; do
      out=$(timeout 120 gpq read "$f" $sel --decompress $mode --repeat 5 2>&1)
      note "small lineitem $sel $mode: $(echo "$out" | grep -E 'bytes:|wall:|error' | tr -s ' ' | tr '\n' ';')"
    done
  done
  RUST_LOG=gpq=debug timeout 120 gpq read "$f" --memory-limit 1GiB > "$OUT/batches-1gib-debug.log" 2>&1
  note "small lineitem whole: $(timeout 120 gpq read "$f" --repeat 5 2>&1 | grep -E 'decompression:|stages \(ms\)' | tr -s ' ' | tr '\n' ';')"
}

# Issue 12 part 3 (and issue 10's cost of the SNAPPY check): SF10 lineitem
# read whole in OVERLAP_GROUPS groups of row groups (1 = no overlap), with
# the device check of compressed pages on and off, alternating rounds, medians
# of 5 reads; the same with every footer decoded anew (GPQ_FOOTER_CACHE=0);
# single columns with and without the footer cache; then the default read
# checked against arrow-rs.
stage_overlap() {
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  cat "$f" > /dev/null
  gpq read "$f" --repeat 2 > /dev/null 2>&1
  pick() { echo "$1" | grep -E 'stages \(ms\)|overlap:|error' | tr -s ' ' | tr '\n' ';'; }
  for round in $(seq 1 "${OVERLAP_ROUNDS:-3}"); do
    for g in ${OVERLAP_GROUPS:-1 8}; do
      for skip in ${OVERLAP_SKIP:-0 1}; do
        out=$(GPQ_SKIP_PAGE_CHECKS=$skip timeout 60 gpq read "$f" --groups "$g" --repeat 5 2>&1)
        note "overlap round $round groups $g checks=$([ "$skip" = 0 ] && echo on || echo off): $(pick "$out")"
      done
    done
    out=$(GPQ_FOOTER_CACHE=0 timeout 60 gpq read "$f" --repeat 5 2>&1)
    note "overlap round $round default groups, footer cache off: $(pick "$out")"
  done
  for cols in l_orderkey l_extendedprice l_shipdate l_comment; do
    for cache in 0 1; do
      out=$(GPQ_FOOTER_CACHE=$cache timeout 60 gpq read "$f" --columns $cols --repeat 5 2>&1)
      note "overlap column $cols footer cache $cache: $(pick "$out")"
    done
  done
  out=$(timeout 300 gpq read "$f" --verify 2>&1)
  note "overlap verify: $(echo "$out" | grep -E 'overlap:|verify:|error' | tr -s ' ' | tr '\n' ';')"
}

# Issue 12 part 5: SF10 lineitem as one file and as 100 files of about
# 25 MB, through the batch reader without a memory limit, with
# MANY_AHEAD passes decoded at once (medians of 5); the directory checked
# against arrow-rs.
stage_many_files() {
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  d=$data/sf10-100files
  [ -d "$d/lineitem" ] || timeout 300 gpq gen -s 10 --tables lineitem --files 100 --out "$d" > /dev/null 2>&1
  cat "$f" "$d"/lineitem/*.parquet > /dev/null
  gpq read "$f" --repeat 2 > /dev/null 2>&1
  note "many-files one file whole: $(timeout 60 gpq read "$f" --repeat 5 2>&1 | grep -E 'stages \(ms\)' | tr -s ' ')"
  for ahead in ${MANY_AHEAD:-1 4 8 16}; do
    for src in "$f" "$d/lineitem"; do
      out=$(timeout 300 gpq read "$src" --decode-ahead "$ahead" --repeat 5 2>&1)
      note "many-files $(basename "$src") decode-ahead $ahead: $(echo "$out" | grep -E 'batches:|wall:|error' | tr -s ' ' | tr '\n' ';')"
    done
  done
  out=$(timeout 300 gpq read "$d/lineitem" --decode-ahead 8 --verify 2>&1)
  note "many-files verify: $(echo "$out" | grep -E 'verify:|error' | tr -s ' ' | tr '\n' ';')"
}

# One `gpq read` with debug logging: DEBUG_READ_ARGS (evaluated, so it may
# name "$data/..."), the log in $OUT/debug-read-N.log for N = 1.. per
# argument list separated by '|' (SF10 lineitem, SNAPPY and ZSTD, made where
# missing).
stage_debug_read() {
  sf10_lineitem zstd
  IFS='|' read -ra lists <<< "${DEBUG_READ_ARGS:-$data/sf10/lineitem.parquet --repeat 2}"
  k=0
  for args in "${lists[@]}"; do
    k=$((k + 1))
    eval "RUST_LOG=\${DEBUG_LOG:-gpq=debug} timeout 120 gpq read $args" > "$OUT/debug-read-$k.log" 2>&1
    note "debug-read $k ($args): rc=$? $(grep -E 'stages \(ms\)' "$OUT/debug-read-$k.log" | tail -1)"
  done
}

# gpq's own SNAPPY decoder (opt-in) against nvCOMP behind the device check
# (BENCHMARKS.md 5.16): SF10 lineitem read whole with each, alternating,
# SNAPPY_ROUNDS rounds (medians of 5 reads); the decoder's read checked
# against arrow-rs; SF10 supplier with the device forced, each decoder,
# against the CPU decoders; the kernels' times of one read in one group.
stage_snappy_decoder() {
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  [ -e "$data/sf10/supplier.parquet" ] || gpq gen -s 10 --tables supplier --out "$data/sf10" > /dev/null 2>&1
  cat "$f" "$data/sf10/supplier.parquet" > /dev/null
  gpq read "$f" --repeat 1 > /dev/null 2>&1
  for round in $(seq 1 "${SNAPPY_ROUNDS:-3}"); do
    for s in gpq nvcomp; do
      note "snappy-decoder lineitem round $round $s: $(GPQ_SNAPPY_DECODER=$s timeout 60 gpq read "$f" --repeat 5 2>&1 | grep -E 'stages \(ms\)' | tr -s ' ')"
    done
  done
  note "snappy-decoder lineitem verify: $(GPQ_SNAPPY_DECODER=gpq timeout 120 gpq read "$f" --verify 2>&1 | grep -E 'decompression:|verify:|rror' | tr -s ' ' | tr '\n' ';')"
  for s in "gpq nvcomp" "nvcomp nvcomp" "nvcomp cpu"; do
    set -- $s
    note "snappy-decoder supplier $1 --decompress $2: $(GPQ_SNAPPY_DECODER=$1 timeout 30 gpq read "$data/sf10/supplier.parquet" --decompress "$2" --repeat 9 2>&1 | grep -E 'stages \(ms\)' | tr -s ' ')"
  done
  for s in gpq nvcomp; do
    GPQ_SNAPPY_DECODER=$s timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --kernel-name regex:"unsnap|check_compressed" gpq read "$f" --groups 1 > "$OUT/snappy-kernels-$s.csv" 2> /dev/null
    note "snappy-decoder kernels $s: $(python3 - "$OUT/snappy-kernels-$s.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("no kernels"); sys.exit()
h = rows[0]; k = h.index("Kernel Name"); v = h.index("Metric Value"); u = h.index("Metric Unit")
t = collections.defaultdict(float)
for r in rows[1:]:
    try:
        t[r[k].split("(")[0][:40]] += float(r[v].replace(",", "")) * {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3}.get(r[u], 1)
    except ValueError:
        pass
print("; ".join(f"{n} {ms:.2f} ms" for n, ms in sorted(t.items(), key=lambda x: -x[1])))
PY
)"
  done
}

# Issue 12's selection target: SF10 lineitem rewritten sorted by l_shipdate
# (DataFusion's writer: SNAPPY, page index, pages of at most 20,000 rows),
# then a query over every column whose filter keeps about 1 % of the rows
# (25 days of l_shipdate), on the GPU backend with page-index pruning and
# without it (row-group statistics only): the scan's bytes_read against the
# file's column bytes, and the query's time (SEL_RUNS runs in one process).
stage_sorted_selection() {
  mkdir -p "$data/sf10-sorted"
  s=$data/sf10-sorted/lineitem.parquet
  if [ ! -e "$s" ]; then
    /usr/bin/time -f '%e' -o "$OUT/sort-wall" timeout 500 gpq sql --backend cpu --data "$(sf10_lineitem_dir)" \
      "COPY (SELECT * FROM lineitem ORDER BY l_shipdate) TO '$s.tmp.parquet' STORED AS PARQUET OPTIONS ('format.compression' 'snappy')" > "$OUT/sort.log" 2>&1 \
      && mv "$s.tmp.parquet" "$s"
    note "sorted-selection: sorted copy written in $(cat "$OUT/sort-wall") s ($(tail -3 "$OUT/sort.log" | head -1))"
  fi
  [ -e "$s" ] || { note "sorted-selection: no sorted file"; return; }
  cat "$s" > /dev/null
  gpq inspect "$s" > "$OUT/sorted-inspect.txt" 2>&1
  note "sorted-selection file: $(grep -E '^(rows|row groups):|requested:' "$OUT/sorted-inspect.txt" | tr -s ' ' | tr '\n' ';')"
  cols="max(l_orderkey), max(l_partkey), max(l_suppkey), max(l_linenumber), sum(l_quantity), sum(l_extendedprice), max(l_discount), max(l_tax), max(l_returnflag), max(l_linestatus), max(l_commitdate), max(l_receiptdate), max(l_shipinstruct), max(l_shipmode), max(l_comment)"
  q="SELECT count(*) AS selected, $cols FROM lineitem WHERE l_shipdate >= DATE '1995-06-01' AND l_shipdate < DATE '1995-06-26'"
  qs=$q; for _ in $(seq 2 "${SEL_RUNS:-5}"); do qs="$qs; $q"; done
  for backend in gpu cpu; do
    for pi in page-index no-page-index; do
      flag=(); [ $pi = no-page-index ] && flag=(--no-page-index)
      out=$(timeout 300 gpq sql --backend $backend "${flag[@]}" --data "$data/sf10-sorted" "$qs" 2>&1)
      echo "$out" > "$OUT/sorted-selection-$backend-$pi.log"
      note "sorted-selection $backend $pi: selected $(echo "$out" | grep -oE '^\| [0-9]+ ' | head -1 | tr -d '| ') rows; times $(echo "$out" | grep -oE 'rows in [0-9.]+ s' | sed 's/rows in //' | tr '\n' ' '); $(echo "$out" | grep -oE 'row_groups=[0-9]+/[0-9]+ \([^)]*\)|bytes_read=[^,]*|page_index_rows_pruned=[0-9]+|device_reads=[^,]*' | sort -u | tr '\n' ' ')"
    done
  done
}

# Every kernel of one whole read of SF10 lineitem (one group), timed by
# Nsight Compute (kernels serialized, clocks left alone): where the GPU
# stages' time goes, per kernel name.
stage_kernel_times() {
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  cat "$f" > /dev/null
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv ${KT_ARGS:-} gpq read "$f" --groups 1 > "$OUT/kernel-times.csv" 2> "$OUT/kernel-times.err"
  note "kernel-times: rc=$?"
  python3 - "$OUT/kernel-times.csv" <<'PY' | tee -a "$summary"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; k = head.index("Kernel Name"); v = head.index("Metric Value"); u = head.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    try: x = float(r[v].replace(",", ""))
    except ValueError: continue
    scale = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "nsecond": 1e-6, "ms": 1, "msecond": 1}.get(r[u], 1)
    name = r[k].split("(")[0][:60]; tot[name] += x * scale; cnt[name] += 1
for name, ms in sorted(tot.items(), key=lambda t: -t[1]):
    print(f"kernel {name}: {ms:.2f} ms in {cnt[name]} launches")
print(f"kernels in all: {sum(tot.values()):.2f} ms")
PY
}

stage_check_kernel() {
  # gpq_check_compressed alone over SF10 lineitem's SNAPPY pages (CuPy's
  # NVRTC), with the variants in $CHECK_VARIANTS (files replacing
  # check_compressed.cu) beside the source's; CHECK_NCU=1 adds a profile of
  # the source's kernel (one launch) to the logs.
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  python3 scripts/bench_check_kernel.py "$f" src/gpu/kernels ${CHECK_VARIANTS:-} > "$OUT/check-kernel.log" 2>&1
  note "check-kernel: rc=$?"; cat "$OUT/check-kernel.log" | tee -a "$summary"
  if [ "${CHECK_NCU:-0}" = 1 ]; then
    ncu --clock-control none --kernel-name regex:gpq_check --launch-skip 2 --launch-count 1 --set detailed --import-source yes \
      -o "$OUT/check-kernel" python3 scripts/bench_check_kernel.py "$f" src/gpu/kernels > "$OUT/check-kernel-ncu.log" 2>&1
    note "check-kernel ncu: rc=$?"
    ncu --import "$OUT/check-kernel.ncu-rep" --page details > "$OUT/check-kernel-ncu.txt" 2>&1
    grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Achieved Occupancy|Registers Per|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput|Stall" "$OUT/check-kernel-ncu.txt" | head -30 | tee -a "$summary"
  fi
}

stage_python() {
  # The Python package on the device's Python: gpq's abi3 wheel, nanoarrow
  # and pytest from the bundle's wheels/; the pytest suite with CUDA
  # consumers (CuPy, PyTorch, nanoarrow) on SF10 lineitem, then the
  # Python-vs-Rust read times and the handover times (bench.py).
  py=$work/py
  rm -rf "$py"
  python3 -m pip install -q --no-deps --no-index --target "$py" "$work"/wheels/*.whl > "$OUT/python-install.log" 2>&1
  note "python install: rc=$? ($(ls "$work"/wheels | tr '\n' ' '))"
  export PYTHONPATH=$py:$PWD/crates/gpq-python/tests
  export GPQ_NVCOMP_WORKER=$work/bin/gpq-nvcomp-worker
  f=$data/sf10/lineitem.parquet
  sf10_lineitem
  cat "$f" > /dev/null
  GPQ_LINEITEM=$f timeout 900 python3 -m pytest -v -p no:cacheprovider crates/gpq-python/tests > "$OUT/python-tests.log" 2>&1
  note "python tests: $(tail -1 "$OUT/python-tests.log")"
  grep -E "FAILED|ERROR" "$OUT/python-tests.log" | head -20 | tee -a "$summary"
  timeout 600 python3 crates/gpq-python/bench/bench.py "$f" --gpq "$work/bin/gpq" 2>&1 | tee "$OUT/python-bench.txt" | tee -a "$summary"
}

for s in "$@"; do
  echo "=== stage $s"
  "stage_${s//-/_}"
done
echo "=== summary"
cat "$summary"
