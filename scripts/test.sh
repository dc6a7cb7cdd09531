#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 as root: install what is needed, build the CPU
# configuration, compile the CUDA configuration too when nvcc exists (compile only: the GPU
# tests need a GPU machine, see tests/gpu/), then run every test through ctest.
#
# Environment: CLLA_BUILD_DIR (default build/), CLLA_CUDA_BUILD_DIR (default build-cuda/).
# Extra arguments go to ctest, e.g. scripts/test.sh -R test_train
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${CLLA_BUILD_DIR:-$ROOT/build}
CUDA_BUILD=${CLLA_CUDA_BUILD_DIR:-$ROOT/build-cuda}

bash scripts/setup.sh
bash scripts/build.sh "$BUILD" -DCLLA_CUDA=OFF

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$NVCC" ]; then
  bash scripts/build.sh "$CUDA_BUILD" -DCLLA_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC"
else
  echo "test: nvcc not found: skipping the CUDA compile check (-DCLLA_CUDA=ON)"
fi

cd "$BUILD"
ctest --output-on-failure "$@"
