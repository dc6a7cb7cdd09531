// Optimizer-side ops: the global gradient norm's sum of squares and the AdamW step.
#include "layers/cpu_ops.h"

#include <math.h>
#include <stdlib.h>

#include "common/sumsq.h"
#include "common/util.h"

double cpu_sumsq(const float *g, size_t n) {
    if (n == 0) return 0.0;
    const size_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    if (nb == 1) return sumsq_block(g, n);   // same arithmetic as the general path
    double *part = xmalloc(nb * sizeof(double));
    #pragma omp parallel for schedule(static) if (nb >= 8)
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * SUMSQ_BLOCK;
        const size_t len = n - i0 < SUMSQ_BLOCK ? n - i0 : SUMSQ_BLOCK;
        part[b] = sumsq_block(g + i0, len);
    }
    double s = 0.0;
    for (size_t b = 0; b < nb; b++) s += part[b];
    free(part);
    return s;
}

double cpu_sumsq_stripes(const float *g, size_t lo, size_t stripe, size_t period, size_t end) {
    double s = 0.0;
    for (size_t a = lo; a < end; a += period) s += cpu_sumsq(g + a, end - a < stripe ? end - a : stripe);
    return s;
}

// AdamW step t (1-based), in the order torch.optim.AdamW (single-tensor path) evaluates it,
// so that the two agree to fp32 rounding (torch forms m with lerp, m + (1-b1)(g - m), which
// differs from the form below only in the last bit):
//   p *= 1 - lr wd                                   (decoupled decay, on the old p)
//   m = b1 m + (1 - b1) g ; v = b2 v + (1 - b2) g^2  (g = grad * grad_scale)
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// which is p -= lr (mhat / (sqrt(vhat) + eps) + wd p_old). The scalar factors are formed in
// double, as torch does in Python, then rounded once to fp32.
void cpu_adamw_update(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                      float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    const double bc1 = 1.0 - pow((double)beta1, (double)t);
    const double bc2 = 1.0 - pow((double)beta2, (double)t);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    // simd: element-wise, so the vector form gives the scalar form's bits (C11 leaves a * b + c
    // unfused, and this file is built with -fno-math-errno so that sqrtf has a vector form)
    #pragma omp parallel for simd schedule(static) if (n >= ((size_t)1 << 14))
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + omb1 * g;
        const float vi = beta2 * v[i] + omb2 * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = param[i] * decay - step_size * (mi / denom);
    }
}
