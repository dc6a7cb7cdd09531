// SwiGLU gate: out = silu(gate) * up, silu(g) = g * sigmoid(g), elementwise over n.
#include "layers/cpu_ops.h"

#include <math.h>

#define SWIGLU_PAR_MIN ((size_t)1 << 14)

// 1 / (1 + e^-g): for g -> -inf e^-g overflows to inf and the result is a clean 0,
// so no special casing is needed.
static inline float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    #pragma omp parallel for schedule(static) if (n >= SWIGLU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g * sigmoidf(g) * up[i];
    }
}

// d silu(g)/dg = s + g s (1 - s) = s (1 + g (1 - s)), s = sigmoid(g).
// dgate += dout * up * s (1 + g (1 - s)) ; dup += dout * silu(g)
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, size_t n) {
    #pragma omp parallel for schedule(static) if (n >= SWIGLU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        const float s = sigmoidf(g);
        dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] += dout[i] * g * s;
    }
}
