#!/usr/bin/env bash
# The project's test command (README, CI): every crate of the workspace.
# Installs NVRTC (pip, no GPU needed) so every kernel is compiled, and runs
# the GPU tests on gpq's CPU emulator of the kernels where no GPU is present.
# Extra arguments go to `cargo test` (e.g. `-p gpq`).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GPQ_TEST_VENV:-target/nvrtc-venv}
if [ ! -e "$venv/.installed-13.0" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "nvidia-cuda-nvrtc==13.0.*"
  touch "$venv/.installed-13.0"
fi
nvrtc_lib=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13/lib | head -1)
export LD_LIBRARY_PATH="$nvrtc_lib:${LD_LIBRARY_PATH:-}"
export GPQ_REQUIRE_NVRTC=1
if [ $# -eq 0 ]; then set -- --workspace; fi
cargo test --features gpq/emulator "$@"
