// Decoding ops of the CUDA backend (semantics: backend/backend.h): RoPE at a position per row,
// and attention of one query row per sequence over the paged KV cache (model/decode.c).
//
// The cache's blocks are device memory in the codec's byte layout; this file reads the layouts
// named by PagedStream.kind itself (fp32, bf16, int_group: model/cache.c), one element at a
// time, so the cache is never expanded into a float copy. One CUDA block per (sequence, query
// head): the scores of its tokens go to an fp32 scratch row, a block-wide max and sum (fixed
// order), then each thread owns output dims and sums p_t v_t in token order: deterministic.
// Written for correctness first; not tuned (no GPU has run it yet: tests/gpu/test_gpu_decode.c).
#include "kernels/cuda_common.cuh"

// ---------------------------------------------------------------- RoPE at per-row positions

// One thread per (n, h, i), i < D/2: the pair (i, i + D/2) of head h of row n, at pos[n].
__global__ void rope_rows_kernel(bf16 *x, const int *pos, int N, int H, int S, int off, int half, float theta) {
    const size_t total = (size_t)N * H * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const size_t nh = idx / half;
        const int n = (int)(nh / H);
        // the angle in double, as the CPU reference and the full-sequence kernel form it
        const double a = (double)pos[n] * pow((double)theta, -2.0 * i / (2 * half));
        const float c = (float)cos(a), s = (float)sin(a);
        bf16 *p = x + nh * S + off;
        const float x0 = ld(p + i), x1 = ld(p + i + half);
        p[i] = to_bf16(x0 * c - x1 * s);
        p[i + half] = to_bf16(x1 * c + x0 * s);
    }
}

extern "C" void cuda_rope_rows_forward(float *x, int N, int H, int S, int off, int D, const int *pos, float theta) {
    if (D % 2 != 0 || off < 0 || off + D > S)
        die("rope: rotated dims [%d, %d) must be even in number and lie inside the head's %d elements", off, off + D, S);
    const int half = D / 2;
    if (N <= 0 || H <= 0 || half <= 0) return;
    const size_t total = (size_t)N * H * half;
    rope_rows_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)x, pos, N, H, S, off, half, theta);
    CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- paged attention

typedef struct DevStream {
    const uint8_t *const *blocks;   // device array of block pointers
    size_t token_bytes;
    int width, block_tokens, kind, bits, group;
} DevStream;

// Element j of token t of a stream, t indexing the row's block table.
static __device__ __forceinline__ float stream_elem(const DevStream &s, const int *table, int t, int j) {
    const uint8_t *p = s.blocks[table[t / s.block_tokens]] + (size_t)(t % s.block_tokens) * s.token_bytes;
    if (s.kind == PAGED_F32) return ((const float *)p)[j];
    if (s.kind == PAGED_BF16) return __uint_as_float((uint32_t)(p[2 * j] | (p[2 * j + 1] << 8)) << 16);
    // int_group: [scales: G bf16][codes: `bits` bits each, two's complement, little-endian]
    const int G = s.width / s.group;
    const int g = j / s.group;
    const float scale = __uint_as_float((uint32_t)(p[2 * g] | (p[2 * g + 1] << 8)) << 16);
    const uint8_t *codes = p + 2 * G;
    const size_t code_bytes = s.token_bytes - 2 * (size_t)G, bit = (size_t)j * s.bits, byte = bit >> 3;
    uint32_t window = codes[byte] | (byte + 1 < code_bytes ? (uint32_t)codes[byte + 1] << 8 : 0u);
    uint32_t code = (window >> (bit & 7)) & ((1u << s.bits) - 1u);
    int v = (code >> (s.bits - 1)) & 1u ? (int)code - (1 << s.bits) : (int)code;
    return (float)v * scale;
}

__global__ void paged_attention_kernel(bf16 *out, const bf16 *q, DevStream k, DevStream k2, int has_k2, DevStream v,
                                       const int *table, int max_blocks, const int *lens, int NH, int NKV, int DK,
                                       int DK2, int DV, float scale, float *scores, int max_len) {
    __shared__ float sh[32];
    const int i = blockIdx.x / NH, h = blockIdx.x % NH, g = h / (NH / NKV), len = lens[i];
    const int *tab = table + (size_t)i * max_blocks;
    const bf16 *qh = q + ((size_t)i * NH + h) * (DK + DK2);
    float *sc = scores + (size_t)blockIdx.x * max_len;
    float mx = -INFINITY;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        float dot = 0.0f;
        for (int d = 0; d < DK; d++) dot += ld(qh + d) * stream_elem(k, tab, t, g * DK + d);
        if (has_k2)
            for (int d = 0; d < DK2; d++) dot += ld(qh + DK + d) * stream_elem(k2, tab, t, d);
        sc[t] = dot * scale;
        mx = fmaxf(mx, sc[t]);
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        sc[t] = expf(sc[t] - mx);
        sum += sc[t];
    }
    sum = block_sum(sum, sh);   // its __syncthreads also publishes sc to the whole block
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int d = threadIdx.x; d < DV; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < len; t++) acc += sc[t] * stream_elem(v, tab, t, g * DV + d);
        out[((size_t)i * NH + h) * DV + d] = to_bf16(acc * inv);
    }
}

// The stream's block pointers copied to device scratch at byte offset *off of buf.
static DevStream dev_stream(const PagedStream *s, char *buf, size_t *off) {
    if (s->kind == PAGED_OTHER)
        die("paged_attention: the CUDA backend reads fp32, bf16 and int_group caches; this codec decodes only on the host: use --device cpu");
    DevStream d;
    const size_t bytes = (size_t)s->n_blocks * sizeof(uint8_t *);
    CUDA_CHECK(cudaMemcpy(buf + *off, s->blocks, bytes, cudaMemcpyHostToDevice));
    d.blocks = (const uint8_t *const *)(buf + *off);
    *off += (bytes + 255) & ~(size_t)255;
    d.token_bytes = s->token_bytes;
    d.width = s->width;
    d.block_tokens = s->block_tokens;
    d.kind = s->kind;
    d.bits = s->bits;
    d.group = s->group;
    return d;
}

extern "C" void cuda_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                                     const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                                     int n, int NH, int NKV, int DK, int DK2, int DV, float scale) {
    if (n <= 0) return;
    int max_len = 1;
    for (int i = 0; i < n; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    size_t ptr_bytes = 0;
    const PagedStream *all[3] = {k, k2, v};
    for (int s = 0; s < 3; s++)
        if (all[s]) ptr_bytes += (((size_t)all[s]->n_blocks * sizeof(uint8_t *)) + 255) & ~(size_t)255;
    char *ptrs = (char *)cuda_scratch(SCRATCH_DEC_PTRS, ptr_bytes);
    size_t off = 0;
    DevStream dk = dev_stream(k, ptrs, &off);
    DevStream dk2 = k2 ? dev_stream(k2, ptrs, &off) : dk;
    DevStream dv = v == k ? dk : dev_stream(v, ptrs, &off);
    const size_t table_ints = (size_t)n * max_blocks;
    int *dtab = (int *)cuda_scratch(SCRATCH_DEC_TABLE, (table_ints + (size_t)n) * sizeof(int));
    CUDA_CHECK(cudaMemcpy(dtab, block_table, table_ints * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dtab + table_ints, lens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
    float *scores = (float *)cuda_scratch(SCRATCH_DEC_SCORES, (size_t)n * NH * max_len * sizeof(float));
    paged_attention_kernel<<<n * NH, 128>>>((bf16 *)out, (const bf16 *)q, dk, dk2, k2 != NULL, dv, dtab, max_blocks,
                                            dtab + table_ints, NH, NKV, DK, DK2, DV, scale, scores, max_len);
    CUDA_LAUNCHED();
}
