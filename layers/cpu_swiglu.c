// SwiGLU gate: out = silu(gate) * up, silu(g) = g * sigmoid(g), elementwise over rows x cols,
// gate and up rows ld apart (the two halves of one product's rows: backend/backend.h).
// Eight lanes at a time (vec_exp, within 2 ulp of expf; common/vec.h): a training step of
// bench_train's d512 model takes 2 x 2048 x 1408 x 8 sigmoids here, the most exponentials of any
// op; the last cols % 8 elements of a row take the scalar path.
#include "layers/cpu_ops.h"

#include <math.h>

#include "common/vec.h"

#define SWIGLU_PAR_MIN ((size_t)1 << 14)

// 1 / (1 + e^-g): for g -> -inf e^-g overflows to inf and the result is a clean 0 (the vector
// form clamps e^-g at e^88 and gives 6e-39), so no special casing is needed.
static inline float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }
static inline vecf sigmoid8(vecf g) { return vec_splat(1.0f) / (vec_splat(1.0f) + vec_exp(-g)); }

// A row's columns: out[c] = silu(gate[c]) * up[c], c < cols
static void forward_row(float *out, const float *gate, const float *up, int cols) {
    int i = 0;
    for (; i + VEC_LANES <= cols; i += VEC_LANES) {
        const vecf g = vec_load(gate + i);
        vec_store(out + i, g * sigmoid8(g) * vec_load(up + i));
    }
    for (; i < cols; i++) out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

void cpu_swiglu_forward(float *out, const float *gate, const float *up, int rows, int cols, int ld) {
    #pragma omp parallel for schedule(static) if ((size_t)rows * cols >= SWIGLU_PAR_MIN)
    for (int r = 0; r < rows; r++)
        forward_row(out + (size_t)r * cols, gate + (size_t)r * ld, up + (size_t)r * ld, cols);
}

// d silu(g)/dg = s + g s (1 - s) = s (1 + g (1 - s)), s = sigmoid(g).
// dgate += dout * up * s (1 + g (1 - s)) ; dup += dout * silu(g)
static void backward_row(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int cols) {
    const vecf one = vec_splat(1.0f);
    int i = 0;
    for (; i + VEC_LANES <= cols; i += VEC_LANES) {
        const vecf g = vec_load(gate + i), s = sigmoid8(g), d = vec_load(dout + i);
        vec_store(dgate + i, vec_load(dgate + i) + d * vec_load(up + i) * s * (one + g * (one - s)));
        vec_store(dup + i, vec_load(dup + i) + d * g * s);
    }
    for (; i < cols; i++) {
        const float g = gate[i];
        const float s = sigmoidf(g);
        dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] += dout[i] * g * s;
    }
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int rows, int cols,
                         int ld) {
    #pragma omp parallel for schedule(static) if ((size_t)rows * cols >= SWIGLU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const size_t o = (size_t)r * ld;
        backward_row(dgate + o, dup + o, dout + (size_t)r * cols, gate + o, up + o, cols);
    }
}
