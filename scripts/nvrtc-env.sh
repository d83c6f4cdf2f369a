# Sourced by scripts/test.sh and scripts/build-kernels.sh: installs NVRTC
# from pip (no GPU needed) into a virtual environment, once, and puts it on
# LD_LIBRARY_PATH. The version is pinned: the prebuilt kernels
# (src/gpu/prebuilt/) are checked byte for byte against what this NVRTC builds.
GPQ_NVRTC_VERSION=13.0.88
venv=${GPQ_TEST_VENV:-target/nvrtc-venv}
if [ ! -e "$venv/.installed-$GPQ_NVRTC_VERSION" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "nvidia-cuda-nvrtc==$GPQ_NVRTC_VERSION"
  touch "$venv/.installed-$GPQ_NVRTC_VERSION"
fi
# (An absolute path: NVRTC loads its builtins library when it compiles, and
# the kernel test compiles from another working directory.)
nvrtc_lib=$(cd "$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13/lib | head -1)" && pwd)
export LD_LIBRARY_PATH="$nvrtc_lib:${LD_LIBRARY_PATH:-}"
