#!/usr/bin/env bash
# Builds gpq's release test, bench and CLI binaries here, stages them with
# what the GPU machine lacks (nvCOMP) into the git-ignored folder .device/,
# and prints how to run them on the device machine.
#
#   scripts/device-test.sh            # build and stage
#   then, with the device tool:  run  command: "bash .device/core/run.sh tests"   carry: [".device/core"]
#
# The device tool carries at most 64 MiB per call, and the DataFusion binaries
# are large, so there are three bundles, each with the CLI and nvCOMP:
#   .device/core  the core test binaries, the criterion benches, parquet-testing
#   .device/df    the DataFusion test binary (for the tpch stages)
#   .device/check the decode and DataFusion test binaries: the GPU-to-host
#                 copy path in one call (about 61 MiB)
# run.sh takes stages (see scripts/device-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stage=$root/.device
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"

echo "== building release binaries"
# One feature set for everything (tests pull in dev-dependencies): `cargo test`
# builds the CLI binary too, so the bin, tests and benches share artifacts.
cargo test --release --no-run
cargo test --release --no-run --message-format=json 2>/dev/null > "$stage/test.json"
cargo bench --no-run --message-format=json 2>/dev/null > "$stage/bench.json" || true

copy() { # copy and strip an executable into .device/bin under a stable name
  local src=$1 name=$2
  cp "$src" "$stage/bin/$name"
  strip --strip-all "$stage/bin/$name" 2>/dev/null || true
}
copy target/release/gpq gpq
python3 - "$stage/test.json" "$stage/bench.json" <<'PY' > "$stage/executables.txt"
import json, sys
for path, kind in ((sys.argv[1], "test"), (sys.argv[2], "bench")):
    for line in open(path):
        try:
            m = json.loads(line)
        except ValueError:
            continue
        kinds = m.get("target", {}).get("kind", [])
        wanted = kinds == ["bench"] if kind == "bench" else kinds != ["bin"]
        if m.get("reason") == "compiler-artifact" and m.get("executable") and wanted:
            print(kind, m["target"]["name"], m["executable"])
PY
while read -r kind name exe; do
  copy "$exe" "$kind-$name"
done < "$stage/executables.txt"
rm -f "$stage/test.json" "$stage/bench.json"

echo "== staging nvCOMP (pip wheel nvidia-libnvcomp-cu13) and NVRTC (already on the device)"
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
bundle() { # bundle NAME FILE... : .device/NAME/{run.sh,payload.tar.xz}
  local name=$1; shift
  mkdir -p "$stage/$name"
  cp scripts/device-run.sh "$stage/$name/run.sh"
  ( cd "$stage" && tar -cf - "$@" | xz -9e -T0 > "$name/payload.tar.xz" )
  du -sh "$stage/$name/payload.tar.xz"
}
core=(bin/gpq $(cd "$stage" && ls bin/test-* bin/bench-* | grep -v datafusion) lib)
bundle core "${core[@]}"
bundle df bin/gpq $(cd "$stage" && ls bin/test-*datafusion*) lib
bundle check bin/gpq bin/test-decode_gpu $(cd "$stage" && ls bin/test-*datafusion*) lib
if [ -d ../shared/parquet-testing/data ]; then
  mkdir -p "$stage/core/parquet-testing" && cp ../shared/parquet-testing/data/* "$stage/core/parquet-testing/"
fi
rm -rf "$stage/bin" "$stage/lib"
echo
echo "Staged. Run on the device with:  command: bash .device/core/run.sh tests   carry: [\".device/core\"]"
echo "                          or:  command: bash .device/df/run.sh tests tpch-bench   carry: [\".device/df\"]"
echo "                          or:  command: bash .device/check/run.sh tests   carry: [\".device/check\"]"
