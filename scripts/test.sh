#!/usr/bin/env bash
# The project's test command (README, CI): every crate of the workspace.
# Installs NVRTC (pip, no GPU needed) so every kernel is compiled and the
# prebuilt kernels are checked against their sources, and runs the GPU tests
# on gpq's CPU emulator of the kernels where no GPU is present.
# Extra arguments go to `cargo test` (e.g. `-p gpq`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/nvrtc-env.sh
export GPQ_REQUIRE_NVRTC=1
if [ $# -eq 0 ]; then set -- --workspace; fi
cargo test --features gpq/emulator "$@"
