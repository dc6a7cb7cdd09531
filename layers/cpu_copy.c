// Column copies: split a projection's output into parts (kv_a -> latent | k_rope), build
// per-head keys from parts (k_nope | broadcast k_rope), and their accumulating backward.
#include "layers/cpu_ops.h"

// dst (N, dst_ld)[dst_off : dst_off + width] (=|+=) src (N, src_ld)[src_off : src_off + width]
void cpu_copy_cols(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off,
                   int N, int width, int accumulate) {
    #pragma omp parallel for schedule(static) if ((long long)N * width > 32768)
    for (int n = 0; n < N; n++) {
        float *d = dst + (size_t)n * dst_ld + dst_off;
        const float *s = src + (size_t)n * src_ld + src_off;
        if (accumulate)
            for (int j = 0; j < width; j++) d[j] += s[j];
        else
            for (int j = 0; j < width; j++) d[j] = s[j];
    }
}
