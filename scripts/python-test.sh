#!/usr/bin/env bash
# The Python package's tests (crates/gpq-python): builds the extension with
# gpq's CPU emulator into a virtual environment (target/pyenv, maturin
# develop: the workspace's dev profile, so it reuses what `cargo test` built),
# then runs its pytest suite twice: without a device (import, schemas, error
# paths, a clean NoDeviceError) and on the emulator (reads, the Arrow device
# export and DLPack imported by pyarrow and NumPy, streams, releases). The
# CUDA-consumer tests (CuPy, PyTorch, nanoarrow) skip here; they run on the
# device machine (scripts/device-run.sh stage python).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/nvrtc-env.sh
venv=$PWD/target/pyenv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2" "pytest>=7" "pyarrow>=16" "numpy>=1.22"
(cd crates/gpq-python && VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH maturin develop -q --features emulator)
env -u GPQ_EMULATE "$venv/bin/python" -m pytest -q -p no:cacheprovider crates/gpq-python/tests
GPQ_EMULATE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider crates/gpq-python/tests
