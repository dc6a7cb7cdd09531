// Column copies: split a projection's output into parts (kv_a -> latent | k_rope), build
// per-head keys from parts (k_nope | broadcast k_rope), and their accumulating backward.
#include "layers/cpu_ops.h"

#include <string.h>

#include "common/vec.h"

// dst (N, dst_ld)[dst_off : dst_off + width] (=|+=) src (N, src_ld)[src_off : src_off + width]
void cpu_copy_cols(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off,
                   int N, int width, int accumulate) {
    #pragma omp parallel for schedule(static) if ((long long)N * width > 32768)
    for (int n = 0; n < N; n++) {
        float *d = dst + (size_t)n * dst_ld + dst_off;
        const float *s = src + (size_t)n * src_ld + src_off;
        // a row's piece at a time: -O2 keeps a plain element loop scalar (d and s might overlap,
        // as far as it knows; the callers copy between different tensors), and the latent
        // presets copy every key and value of every head this way
        if (accumulate) {
            int j = 0;
            for (; j + VEC_LANES <= width; j += VEC_LANES) vec_store(d + j, vec_load(d + j) + vec_load(s + j));
            for (; j < width; j++) d[j] += s[j];
        } else if (width > 0) {
            memmove(d, s, (size_t)width * sizeof(float));
        }
    }
}
