#!/usr/bin/env bash
# Compiles the kernels (src/gpu/kernels/) ahead of time with NVRTC from pip
# (no GPU needed) into the images embedded in the library: cubins for
# sm_80, sm_90, sm_100 and sm_120 and PTX for compute_80, zstd-compressed,
# with their manifest, under src/gpu/prebuilt/. Run it after changing a
# kernel source and commit what it writes; CI fails while the images and
# the sources disagree (src/gpu/prebuilt.rs, tests/kernels_nvrtc.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/nvrtc-env.sh
GPQ_UPDATE_KERNELS=1 cargo test -p gpq --test kernels_nvrtc -- --exact prebuilt_kernels_match_the_sources --nocapture
git status --short src/gpu/prebuilt
