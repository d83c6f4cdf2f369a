#!/usr/bin/env bash
# The project's test command (README, CI): every crate of the workspace.
# Installs NVRTC (pip, no GPU needed) so every kernel is compiled and the
# prebuilt kernels are checked against their sources, and runs the GPU tests
# on gpq's CPU emulator of the kernels where no GPU is present.
# Extra arguments go to `cargo test` (e.g. `-p gpq`) and skip the Python
# package's tests (scripts/python-test.sh runs those alone).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/nvrtc-env.sh
export GPQ_REQUIRE_NVRTC=1
if [ $# -eq 0 ]; then
  cargo test --features gpq/emulator --workspace
  # The Python package (its own script: a virtual environment and pytest).
  scripts/python-test.sh
else
  cargo test --features gpq/emulator "$@"
fi
