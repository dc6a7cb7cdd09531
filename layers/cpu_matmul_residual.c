// A projection added to the residual stream (backend/backend.h, matmul_residual_forward).
#include "layers/cpu_ops.h"

#include <stddef.h>

// out (N, OC) = residual + inp @ weight^T: the product, then the add. In fp32 on the CPU a GEMM
// with the residual as its accumulate input saves no pass over memory (it reads the copy it
// would need), and these are the bits of matmul_forward followed by add_forward. Kept apart from
// layers/cpu_matmul.c, which bench/ab.sh compiles on its own.
void cpu_matmul_residual_forward(float *out, const float *residual, const float *inp, const float *weight, int N, int C,
                                 int OC) {
    if (N <= 0 || OC <= 0) return;
    cpu_matmul_forward(out, inp, weight, N, C, OC);
    cpu_add_forward(out, residual, out, (size_t)N * OC);
}
