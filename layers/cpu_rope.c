// Rotary position embedding, rotate-half (HuggingFace) form, in place.
//
// x is (B, T, H, S); per head, dims [off, off + D) are rotated: pair (i, i + D/2), i < D/2,
// turns by angle a = (pos0 + t) * theta^(-2i/D). The other S - D dims of the head (e.g. the
// no-position part of a decoupled MLA key) pass through untouched.
#include "layers/cpu_ops.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "common/util.h"

// Rotates by +a (sign = +1, forward) or by -a (sign = -1, backward: a rotation's transpose
// is its inverse, so the gradient rotates back).
static void rope_rotate(float *x, int B, int T, int H, int S, int off, int D, int pos0,
                        float theta, float sign) {
    assert(D % 2 == 0 && off >= 0 && off + D <= S);
    const int half = D / 2;
    if (B <= 0 || T <= 0 || H <= 0 || half <= 0) return;
    // cos/sin table (T, half), shared by every batch row and head. Angles are formed and
    // evaluated in double: (pos0 + t) * f in fp32 would be off by ~pos * 6e-8 radians, which
    // at long positions is larger than the fp32 rounding of the result itself.
    // The table is built by all threads (T x half cos and sin in double; one thread built it
    // while the others waited, 16 times a step of an 8-layer model).
    float *cs = xmalloc((size_t)T * half * 2 * sizeof(float));
    double *freq = xmalloc((size_t)half * sizeof(double));
    for (int i = 0; i < half; i++) freq[i] = pow((double)theta, -2.0 * i / D);
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            const double a = (double)(pos0 + t) * freq[i];
            cs[((size_t)t * half + i) * 2 + 0] = (float)cos(a);
            cs[((size_t)t * half + i) * 2 + 1] = sign * (float)sin(a);
        }
    }
    free(freq);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *ct = cs + (size_t)t * half * 2;
            for (int h = 0; h < H; h++) {
                float *p = x + (((size_t)b * T + t) * H + h) * S + off;
                for (int i = 0; i < half; i++) {
                    const float c = ct[2 * i], s = ct[2 * i + 1];
                    const float x0 = p[i], x1 = p[i + half];
                    p[i] = x0 * c - x1 * s;
                    p[i + half] = x1 * c + x0 * s;
                }
            }
        }
    }
    free(cs);
}

void cpu_rope_forward(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    rope_rotate(x, B, T, H, S, off, D, pos0, theta, 1.0f);
}

// dx (B, T, H, S) in place: dx <- R(-a) dx. Not accumulating (the contract says so: the
// orchestration applies it to the gradient buffer of the rotated tensor itself).
void cpu_rope_backward(float *dx, int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    rope_rotate(dx, B, T, H, S, off, D, pos0, theta, -1.0f);
}

// N rows, each at its own position (decoding): angles per row, formed in double as above.
void cpu_rope_rows_forward(float *x, int N, int H, int S, int off, int D, const int *pos, float theta) {
    assert(D % 2 == 0 && off >= 0 && off + D <= S);
    const int half = D / 2;
    #pragma omp parallel for schedule(static) if (N > 1)
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < half; i++) {
            const double a = (double)pos[n] * pow((double)theta, -2.0 * i / D);
            const float c = (float)cos(a), s = (float)sin(a);
            for (int h = 0; h < H; h++) {
                float *p = x + ((size_t)n * H + h) * S + off;
                const float x0 = p[i], x1 = p[i + half];
                p[i] = x0 * c - x1 * s;
                p[i + half] = x1 * c + x0 * s;
            }
        }
    }
}
