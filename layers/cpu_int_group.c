// The int_group codec's quantize-dequantize round trip (CLLA-quant's latent), fp32 rows.
#include <math.h>

#include "layers/cpu_ops.h"
#include "backend/int_group_math.h"

// out, in (N, W); groups of `group` contiguous values per row (group divides W).
void cpu_int_group_roundtrip(float *out, const float *in, int N, int W, int bits, int group) {
    int G = W / group;
    #pragma omp parallel for schedule(static) if ((long long)N * W > 32768)
    for (int n = 0; n < N; n++) {
        for (int g = 0; g < G; g++) {
            const float *x = in + (size_t)n * W + (size_t)g * group;
            float *y = out + (size_t)n * W + (size_t)g * group;
            float absmax = 0.0f;
            for (int j = 0; j < group; j++) absmax = int_group_absmax_step(absmax, x[j]);
            float scale = int_group_scale(absmax, bits);
            for (int j = 0; j < group; j++) y[j] = (float)int_group_code(x[j], scale, bits) * scale;
        }
    }
}
