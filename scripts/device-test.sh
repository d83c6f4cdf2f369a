#!/usr/bin/env bash
# Builds gpq's release test, bench and CLI binaries here, stages them with
# what the GPU machine lacks (nvCOMP) into the git-ignored folder .device/,
# and prints how to run them on the device machine.
#
#   scripts/device-test.sh            # build and stage
#   then, with the device tool:  run  command: "bash .device/core/run.sh tests"   carry: [".device/core"]
#
# The device tool carries at most 64 MiB per call, so there are several
# bundles, each with nvCOMP and the run script (scripts/device-run.sh):
#   .device/core  the core crate's test binaries, the criterion benches, the
#                 parquet-testing corpus, the regression files, and the fuzzer
#                 (gpq-fuzz, fuzz.py: run.sh stage fuzz)
#   .device/python  (DEVICE_BUNDLES=python) the Python package's wheel with
#                 nanoarrow and pytest: run.sh stage python
#   .device/df    the DataFusion crate's TPC-H test binary (and, with
#                 DEVICE_DF_TESTS, .device/df2 with its other test binaries)
#   .device/bench the CLI alone, for the benchmark stages (tpch-bench,
#                 tpch-profile, suite...; tpch-gpus and ballista-gpus on the
#                 nvidia-h200-x2 kind): DEVICE_BUNDLES=bench builds only it
#   .device/combo (DEVICE_BUNDLES=combo) the CLI with CLI_FEATURES (default
#                 datafusion) and a few core test binaries (DEVICE_CORE_TESTS,
#                 default "aggregate_gpu filter_gpu decode_gpu"), so that one
#                 call can test new kernels and time the queries on them
# DEVICE_BUNDLES (default core,df; or core, python, bench, combo) picks the bundles;
# other bundles already staged are kept.
# SKIP_BENCHES=1 skips the criterion benches (a build of its own).
# CLI_FEATURES=datafusion builds the CLI without Ballista (stage ballista-gpus needs it);
# CLI_FEATURES=none without DataFusion either: `gpq read`, `gen`, `inspect`, `demo`
# and the IO benchmarks only, about 7 MB compressed (the DataFusion CLI about 28),
# so that one core bundle holds the CLI, the fuzzer and three test binaries:
#   CLI_FEATURES=none DEVICE_BUNDLES=core DEVICE_CORE_TESTS="hostile decode_gpu corrupt_gpu" \
#     DEVICE_CORE_FUZZ=1 SKIP_BENCHES=1 bash scripts/device-test.sh
# (about 40 MB: stages page-checks, debug-read, fuzz and tests, and
# scripts/device-sanitize.sh, from one bundle).
# run.sh takes stages (see scripts/device-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stage=$root/.device
bundles=${DEVICE_BUNDLES:-core,df}
for b in ${bundles//,/ }; do rm -rf "${stage:?}/$b"; done
[ "$bundles" = "core,df" ] && rm -rf "$stage/df2"
rm -rf "$stage/bin" "$stage/lib" "$stage/data" "$stage/wheels"
mkdir -p "$stage/bin" "$stage/lib"

echo "== building release binaries"
# CLI_FEATURES (e.g. "datafusion") builds the CLI with only those features
# (without Ballista: a much shorter build when only the benchmarks are needed).
# A core bundle with DEVICE_CORE_TESTS and DEVICE_CORE_NO_CLI=1 holds neither
# the CLI nor the fuzzer, so neither is built (the CLI with Ballista is most
# of a clean build).
core_only=0
[ "$bundles" = core ] && [ -n "${DEVICE_CORE_TESTS:-}" ] && [ "${DEVICE_CORE_NO_CLI:-0}" = 1 ] && core_only=1
if [ "$bundles" = combo ]; then
  CLI_FEATURES=${CLI_FEATURES:-datafusion}
  DEVICE_CORE_TESTS=${DEVICE_CORE_TESTS:-aggregate_gpu filter_gpu decode_gpu}
fi
if [ $core_only = 1 ]; then :
elif [ "${CLI_FEATURES:-}" = none ]; then
  cargo build --release -p gpq-cli --no-default-features
elif [ -n "${CLI_FEATURES:-}" ]; then
  cargo build --release -p gpq-cli --no-default-features --features "$CLI_FEATURES"
else
  cargo build --release -p gpq-cli
fi
want_fuzz=1; { [ $core_only = 1 ] || [ "$bundles" = combo ]; } && want_fuzz=0
[ "${DEVICE_CORE_FUZZ:-0}" = 1 ] && [ "$bundles" = core ] && want_fuzz=1
[ $want_fuzz = 0 ] || cargo build --release -p gpq-fuzz
cargo build --release -p gpq --bin gpq-nvcomp-worker
# DEVICE_BUNDLES=core builds and stages only the core bundle (the core crate's
# tests, the CLI and the fuzzer), skipping the DataFusion test binary.
# DEVICE_BUNDLES=python builds and stages only the Python bundle (the CLI,
# the package's wheel, nanoarrow and pytest).
if [ "$bundles" = core ]; then tests=(-p gpq); else tests=(--workspace); fi
if [ "$bundles" = combo ]; then tests=(-p gpq); for t in $DEVICE_CORE_TESTS; do tests+=(--test "$t"); done; fi
if [ "$bundles" = python ] || [ "$bundles" = bench ]; then : > "$stage/test.json"; else
  cargo test --release "${tests[@]}" --no-run --message-format=json 2>/dev/null > "$stage/test.json"
fi
# SKIP_BENCHES=1 leaves the criterion benches out (stage criterion then has nothing to run).
if [ "${SKIP_BENCHES:-0}" = 1 ] || [ "$bundles" = python ] || [ "$bundles" = bench ] || [ "$bundles" = combo ]; then : > "$stage/bench.json"; else
  cargo bench -p gpq --no-run --message-format=json 2>/dev/null > "$stage/bench.json"
fi

copy() { # copy and strip an executable into .device/bin under a stable name
  local src=$1 name=$2
  cp "$src" "$stage/bin/$name"
  strip --strip-all "$stage/bin/$name" 2>/dev/null || true
}
[ $core_only = 1 ] || copy target/release/gpq gpq
[ $want_fuzz = 0 ] || copy target/release/gpq-fuzz gpq-fuzz  # the fuzzer and its driver (run.sh stage fuzz)
# nvCOMP's worker process (ZSTD/GZIP pages), found beside the binaries that start it.
copy target/release/gpq-nvcomp-worker gpq-nvcomp-worker
cp scripts/fuzz/fuzz.py "$stage/bin/fuzz.py"
python3 - "$stage/test.json" "$stage/bench.json" <<'PY' > "$stage/executables.txt"
import json, sys
for path, kind in ((sys.argv[1], "test"), (sys.argv[2], "bench")):
    for line in open(path):
        try:
            m = json.loads(line)
        except ValueError:
            continue
        t = m.get("target", {})
        kinds = t.get("kind", [])
        # Integration tests and benches of the core and DataFusion crates; the
        # layering test needs cargo and the sources, so it runs here only.
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        # The package decides the bundle: the DataFusion crate's tests go to df.
        bundle = "df" if "gpq-datafusion" in m.get("package_id", "") else "core"
        if kind == "bench" and kinds == ["bench"]:
            print("bench", t["name"], m["executable"], bundle)
        elif kind == "test" and kinds == ["test"] and t["name"] != "layering":
            print("test", t["name"], m["executable"], bundle)
PY
while read -r kind name exe _; do
  copy "$exe" "$kind-$name"
done < "$stage/executables.txt"
rm -f "$stage/test.json" "$stage/bench.json"

echo "== staging nvCOMP (pip wheel nvidia-libnvcomp-cu13)"
whl=$(ls .whl/nvidia_libnvcomp_cu13-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .whl "nvidia-libnvcomp-cu13==6.0.*"
  whl=$(ls .whl/nvidia_libnvcomp_cu13-*.whl | head -1)
fi
python3 - "$whl" "$stage/lib" <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith("libnvcomp.so.6"):
        open(os.path.join(sys.argv[2], "libnvcomp.so.6"), "wb").write(z.read(n))
PY
mkdir -p "$stage/data"
if [ -d ../shared/parquet-testing/data ]; then
  cp -r ../shared/parquet-testing/data "$stage/data/parquet-testing"
fi
# (The regression corpus travels with the working tree: testdata/regressions.)
bundle() { # bundle NAME FILE... : .device/NAME/{run.sh,payload.tar.xz}
  local name=$1; shift
  mkdir -p "$stage/$name"
  cp scripts/device-run.sh "$stage/$name/run.sh"
  # DEVICE_KERNELS_FROM="COMMIT...": the sm_90 kernels of those commits beside
  # run.sh, for GPQ_KERNELS=file:$PWD/.device/NAME/kernels-COMMIT-sm_90.cubin.zst
  # (two versions of a kernel compared in one call: PAGE_CHECK_ENVS).
  for c in ${DEVICE_KERNELS_FROM:-}; do
    git show "$c:src/gpu/prebuilt/sm_90.cubin.zst" > "$stage/$name/kernels-$c-sm_90.cubin.zst"
  done
  ( cd "$stage" && tar -cf - "$@" | xz -9e -T0 > "$name/payload.tar.xz" )
  du -sh "$stage/$name/payload.tar.xz"
  # A device call carries at most 64 MiB: this bundle and the working tree (tracked and untracked files).
  local tree bundle
  tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2>/dev/null | awk '/total$/ {s += $1} END {print s + 0}')
  bundle=$(du -sb "$stage/$name" | cut -f1)
  if [ $((tree + bundle)) -gt $((64 << 20)) ]; then
    echo "WARNING: .device/$name ($bundle bytes) and the working tree ($tree bytes) exceed a device call's 64 MiB" >&2
  fi
}
# (test-mutations is gpq-fuzz's CPU loop; on the device the fuzz stage does its work.)
in_bundle() { awk -v b="$1" '$4 == b { print "bin/" $1 "-" $2 }' "$stage/executables.txt" | grep -v -- '-mutations$' || true; }
# DEVICE_CORE_TESTS (e.g. "decode_gpu batches_gpu") keeps only those test
# binaries and leaves the fuzzer out, for calls whose bundle would pass 64 MiB
# (DEVICE_CORE_FUZZ=1 keeps it: stage fuzz); DEVICE_CORE_NO_CLI=1 also leaves
# the CLI out (about 20 MiB compressed; the tests, sanitizer and fuzz stages
# do not use it).
if [ -n "${DEVICE_CORE_TESTS:-}" ]; then
  core=(bin/gpq-nvcomp-worker lib data); [ "${DEVICE_CORE_NO_CLI:-0}" = 1 ] || core+=(bin/gpq)
  [ "${DEVICE_CORE_FUZZ:-0}" = 1 ] && core+=(bin/gpq-fuzz bin/fuzz.py)
  for t in $DEVICE_CORE_TESTS; do core+=(bin/test-$t); done
else
  core=(bin/gpq bin/gpq-nvcomp-worker bin/gpq-fuzz bin/fuzz.py $(in_bundle core) lib data)
fi
if [ "$bundles" = python ]; then
  # The package's abi3 wheel (release, as `pip install` builds it), and the
  # pure-Python wheels the device's Python 3.12 may lack.
  echo "== building the Python wheel"
  venv=target/pyenv
  [ -x $venv/bin/python ] || python3 -m venv $venv
  $venv/bin/pip install -q --disable-pip-version-check "maturin>=1.9,<2"
  mkdir -p "$stage/wheels"
  (cd crates/gpq-python && ../../$venv/bin/maturin build --release --strip -o "$stage/wheels")
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$stage/wheels" nanoarrow pytest
  bundle python bin/gpq bin/gpq-nvcomp-worker lib wheels
elif [ "$bundles" = bench ]; then
  bundle bench bin/gpq bin/gpq-nvcomp-worker lib
elif [ "$bundles" = combo ]; then
  combo=(bin/gpq bin/gpq-nvcomp-worker lib data); for t in $DEVICE_CORE_TESTS; do combo+=(bin/test-$t); done
  bundle combo "${combo[@]}"
elif [[ ",$bundles," == *,core,* ]]; then
  bundle core "${core[@]}"
fi
# The DataFusion crate's test binaries are ~120 MB each (stripped): the df
# bundle carries the TPC-H one (22 queries, GPU backend); the others
# (DEVICE_DF_TESTS, e.g. "changed_files gpu_context_lost") go in a df2 bundle.
if [ "$bundles" = core,df ] || [ "$bundles" = df ]; then
  # Without the CLI: with it the bundle passes 64 MiB (the bench bundle has it).
  bundle df bin/gpq-nvcomp-worker bin/test-tpch lib
  df2=(); for t in ${DEVICE_DF_TESTS:-}; do df2+=(bin/test-$t); done
  if [ ${#df2[@]} -gt 0 ]; then bundle df2 bin/gpq-nvcomp-worker "${df2[@]}" lib; fi
fi
rm -rf "$stage/bin" "$stage/lib" "$stage/data" "$stage/wheels"
echo
echo "Staged. Run on the device with:  command: bash .device/core/run.sh tests   carry: [\".device/core\"]"
echo "                          or:  command: bash .device/df/run.sh tests   carry: [\".device/df\"]"
echo "                          or:  command: bash .device/bench/run.sh tpch-bench   carry: [\".device/bench\"]"
echo "                          or:  command: bash .device/combo/run.sh info tests agg-quick tpch-bench   carry: [\".device/combo\"]"
