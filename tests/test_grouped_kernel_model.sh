#!/bin/bash
# The index arithmetic of the CUDA grouped expert kernels (kernels/cuda_moe_grouped.cu), modelled
# in numpy with the PTX fragment layouts (tests/gpu/grouped_kernel_model.py), against numpy
# products: forward, dinp and dW over experts with no rows, several 128-row tiles, widths past one
# 128 tile and K past one 32 slab. The compiled kernels are tested on a GPU (tests/gpu/test_gpu_ops).
set -u
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
/usr/bin/python3 -c 'import numpy' 2> /dev/null || { echo "skipped: /usr/bin/python3 has no numpy (scripts/setup.sh installs it with python3-torch)"; exit 77; }
exec /usr/bin/python3 "$SRC/tests/gpu/grouped_kernel_model.py"
