// Elementwise ops on act buffers. Memory-bound; the `if` clause keeps tiny calls
// (biases, per-layer scalars) off the thread pool where the fork costs more than the work.
#include "layers/cpu_ops.h"

#define CPU_EW_PAR_MIN ((size_t)1 << 15)

// out[i] = a[i] + b[i]; out may alias a or b (the residual stream adds in place).
void cpu_add_forward(float *out, const float *a, const float *b, size_t n) {
    #pragma omp parallel for schedule(static) if (n >= CPU_EW_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// dst[i] += src[i]
void cpu_accumulate(float *dst, const float *src, size_t n) {
    #pragma omp parallel for schedule(static) if (n >= CPU_EW_PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
