// ab_paged: the decode step's attention over a paged bf16 cache (layers/cpu_paged_attention.c)
// of this tree against the same op of an older commit, alternated in one process, the best of
// each kept (bench/ab/ab_attention.c says why: bench_decode's two binaries, one after the other,
// move by a tenth or more between runs on the development VM). Built and run by bench/ab.sh
// paged, which compiles the older file with its entry point renamed old_*.
//
//   ab_paged SEQS CONTEXT NH NKV DK DK2 DV REPS
//
// One round calls the op once per layer over LAYERS caches of their own, as a decode step of
// bench/bench_decode.c's 8-layer model does, so a latent cache that one layer's worth would fit
// in L3 is read from memory as in the step. Each cache holds SEQS sequences of CONTEXT tokens in
// 16-token blocks laid out as model/decode.c lays a stream's (a sequence's blocks one after
// another), in the CPU backend's memory as the decoder's slabs are (cpu_alloc: huge pages where
// the kernel gives them, layers/cpu_memory.c). DK2 > 0 and DV = DK, NKV = 1: the latent form of MLA and CLLA (one stream read as
// keys and values, beside a rope key stream of width DK2); else separate key and value streams
// of NKV heads. The outputs of the two versions are compared bit for bit and the line says so.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/backend.h"
#include "layers/cpu_ops.h"
#include "bench/ab/ab_common.h"

#define ENTRY_POINTS(P)                                                                                         \
    void P##cpu_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,       \
                                const PagedStream *v, const int *block_table, int max_blocks, const int *lens, \
                                int n, int NH, int NKV, int DK, int DK2, int DV, float scale);
ENTRY_POINTS()
ENTRY_POINTS(old_)

#define LAYERS 8
#define BLOCK_TOKENS 16

// A bf16 stream of `width` values per token, n_blocks blocks one after another, random values
static PagedStream bf16_stream(int width, int n_blocks, Rng *r) {
    const size_t token_bytes = (size_t)width * 2, block_bytes = token_bytes * BLOCK_TOKENS;
    uint8_t *base = cpu_alloc(block_bytes * (size_t)n_blocks);
    uint16_t *h = (uint16_t *)base;
    for (size_t i = 0; i < block_bytes / 2 * (size_t)n_blocks; i++) {
        const float f = (float)rng_uniform(r) - 0.5f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)(u >> 16);
    }
    uint8_t **blocks = xmalloc((size_t)n_blocks * sizeof(*blocks));
    for (int b = 0; b < n_blocks; b++) blocks[b] = base + (size_t)b * block_bytes;
    return (PagedStream){.width = width, .token_bytes = token_bytes, .block_tokens = BLOCK_TOKENS, .blocks = blocks,
                         .n_blocks = n_blocks, .kind = PAGED_BF16};
}

int main(int argc, char **argv) {
    static const char *const NAMES[8] = {"SEQS", "CONTEXT", "NH", "NKV", "DK", "DK2", "DV", "REPS"};
    int64_t a[8];
    ab_args_from(argc, argv, "ab_paged SEQS CONTEXT NH NKV DK DK2 DV REPS (run through bench/ab.sh paged)", NAMES, 8, a, 0);
    for (int i = 0; i < 8; i++)
        if (a[i] == 0 && i != 5) die("ab_paged: %s is 0: only DK2 (no rope key) may be", NAMES[i]);
    const int n = (int)a[0], T = (int)a[1], NH = (int)a[2], NKV = (int)a[3], DK = (int)a[4], DK2 = (int)a[5], DV = (int)a[6],
              reps = (int)a[7];
    const int latent = DK2 > 0;
    if (NH % NKV) die("ab_paged: NH %d is not a multiple of NKV %d", NH, NKV);
    if (latent && (NKV != 1 || DV != DK)) die("ab_paged: the latent form (DK2 > 0) takes NKV = 1 and DV = DK");
    const int max_blocks = (T + BLOCK_TOKENS - 1) / BLOCK_TOKENS, n_blocks = n * max_blocks;
    Rng st;
    rng_seed(&st, 1);
    PagedStream k[LAYERS], v[LAYERS], k2[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        k[l] = bf16_stream(NKV * DK, n_blocks, &st);
        if (latent) k2[l] = bf16_stream(DK2, n_blocks, &st);
        else v[l] = bf16_stream(NKV * DV, n_blocks, &st);
    }
    int *table = xmalloc((size_t)n_blocks * sizeof(int)), *lens = xmalloc((size_t)n * sizeof(int));
    for (int b = 0; b < n_blocks; b++) table[b] = b;
    for (int i = 0; i < n; i++) lens[i] = T;
    const size_t nq = (size_t)n * NH * (DK + DK2), no = (size_t)n * NH * DV;
    float *q = ab_uniform(nq, &st), *out[2] = {ab_uniform(no * LAYERS, &st), ab_uniform(no * LAYERS, &st)};
    const float scale = 1.0f / sqrtf((float)(DK + DK2));
    double best[1][2] = {{AB_NONE, AB_NONE}};
    for (int r = 0; r < reps + 1; r++)   // the first round warms up and is not kept
        for (int slot = 0; slot < 2; slot++) {
            const int w = ab_version(r, slot);
            const double t0 = omp_get_wtime();
            for (int l = 0; l < LAYERS; l++)
                (w ? cpu_paged_attention : old_cpu_paged_attention)(out[w] + no * l, q, &k[l], latent ? &k2[l] : NULL,
                                                                    latent ? &k[l] : &v[l], table, max_blocks, lens, n, NH,
                                                                    NKV, DK, DK2, DV, scale);
            const double t[1] = {omp_get_wtime() - t0};
            ab_keep_best(best, 1, r, w, t);
        }
    // per cached token and layer: scores 2 NH (DK + DK2), weighted values 2 NH DV
    const double flops[1] = {2.0 * NH * (DK + DK2 + DV) * (double)T * n * LAYERS};
    printf("seqs %d, context %d, %d heads over %d kv heads, widths %d + %d / %d, %d layers: ", n, T, NH, NKV, DK, DK2, DV, LAYERS);
    static const char *const PART[1] = {"step's attention"};
    ab_print_parts(PART, 1, (const double (*)[2])best, flops);
    const int same = !memcmp(out[0], out[1], no * LAYERS * sizeof(float));
    printf("  outputs of old and new: %s\n", same ? "the same bits" : "DIFFERENT bits");
    return 0;
}
