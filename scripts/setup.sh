#!/usr/bin/env bash
# Installs what twell builds and tests with on Debian 12 (bookworm). Safe to run twice: apt-get skips
# installed packages. The CUDA toolkit is expected at /usr/local/cuda (it is not a Debian package).
set -euo pipefail
packages=(
  cmake ninja-build g++ python3 python3-venv python3-pip       # python3-venv: the .venv of the Python tests
  llvm-22-dev libmlir-22-dev mlir-22-tools libzstd-dev zstd   # MLIR 22 (bookworm-security); lit + FileCheck
  libfmt-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev       # formatting, JSON, cache keys; zlib: LLVMSupport links it
  libgtest-dev libbenchmark-dev                                # tests and benchmarks
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "twell setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "twell setup: all packages present"
fi
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "twell setup: the CUDA toolkit is expected at /usr/local/cuda (nvcc, NVRTC, cuBLASLt headers)" >&2
  exit 1
fi

# The Python package's test environment (.venv beside this folder): PyTorch from PyPI (its CUDA build:
# the CPU tests need no GPU, and one wheel serves both kinds of machine), transformers, pytest. The
# package itself is pure Python over the C API and is not installed here: the tests run it from the
# source tree (ctest python, python_gpu) and from a `pip install ./python` (ctest python_install).
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "twell setup: creating $root/.venv"
  python3 -m venv "$root/.venv"
fi
if "$root/.venv/bin/python" -c "import torch, transformers, pytest, safetensors" 2>/dev/null; then
  echo "twell setup: .venv has torch, transformers, pytest, safetensors"
else
  echo "twell setup: installing torch, transformers, pytest, safetensors into .venv (PyPI)"
  "$root/.venv/bin/pip" install -q --upgrade pip
  "$root/.venv/bin/pip" install -q -r "$root/python/requirements-test.txt"
fi
