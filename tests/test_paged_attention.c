// The paged_attention op (layers/cpu_paged_attention.c) against a naive double-precision loop:
// grouped heads, a shared second key part (the rope key of the absorbed latent form), the value
// stream being the key stream, lengths of 1 token to several chunks (so the chunk merge runs),
// blocks scattered in storage, an int_group-coded stream through its decode callback; and the
// same bits for 1 and 2 threads. (No backward: decoding has none.)
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "layers/cpu_ops.h"
#include "model/cache.h"

#define BT 16

static int passed, failed;

static float urand(Rng *r) { return (float)((double)(rng_next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

typedef struct Stream {
    PagedStream ps;
    uint8_t **blocks;
    Codec codec;
    float *values;   // (n_blocks * BT, width) decoded values by block id, what attention must see
} Stream;

static void codec_cb(const void *ctx, float *dst, int block_id, int n) {
    const Stream *s = ctx;
    codec_decode(&s->codec, dst, s->blocks[block_id], n, s->ps.width);
}

static void stream_make(Stream *s, int n_blocks, int width, const Codec *c, Rng *r) {
    s->codec = *c;
    size_t tb = codec_bytes_per_token(c, width);
    s->blocks = malloc((size_t)n_blocks * sizeof(uint8_t *));
    s->values = malloc((size_t)n_blocks * BT * width * sizeof(float));
    float *x = malloc((size_t)BT * width * sizeof(float));
    for (int b = 0; b < n_blocks; b++) {
        for (int i = 0; i < BT * width; i++) x[i] = 2.0f * urand(r);
        s->blocks[b] = malloc(tb * BT);
        codec_encode(c, s->blocks[b], x, BT, width);
        codec_decode(c, s->values + (size_t)b * BT * width, s->blocks[b], BT, width);
    }
    free(x);
    int kind = c->kind == CODEC_FP32 ? PAGED_F32 : c->kind == CODEC_BF16 ? PAGED_BF16 : PAGED_INT_GROUP;
    s->ps = (PagedStream){width, tb, BT, s->blocks, n_blocks, s, codec_cb, 0, NULL, NULL, kind == PAGED_F32, kind, c->bits, c->group};
}

static void stream_free(Stream *s, int n_blocks) {
    for (int b = 0; b < n_blocks; b++) free(s->blocks[b]);
    free(s->blocks);
    free(s->values);
}

static const float *tok(const Stream *s, const int *table, int t) {
    return s->values + ((size_t)table[t / BT] * BT + t % BT) * s->ps.width;
}

static void run_v(const char *name, int NH, int NKV, int DK, int DK2, int DV, int v_is_k, const Codec *kc, const Codec *vc) {
    const int n = 4, lens[4] = {1, 17, 300, 700}, max_blocks = (700 + BT - 1) / BT, n_blocks = n * max_blocks;
    Rng r;
    rng_seed(&r, 11);
    Stream k, k2, v;
    Codec fp32 = {.kind = CODEC_FP32};
    stream_make(&k, n_blocks, NKV * DK, kc, &r);
    if (DK2) stream_make(&k2, n_blocks, DK2, &fp32, &r);
    if (!v_is_k) stream_make(&v, n_blocks, NKV * DV, vc ? vc : &fp32, &r);
    const Stream *vs = v_is_k ? &k : &v;
    // a scattered block table: a random permutation of the ids
    int *table = malloc((size_t)n * max_blocks * sizeof(int));
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rng_next(&r) % (uint64_t)(i + 1)), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    int DQ = DK + DK2;
    float *q = malloc((size_t)n * NH * DQ * sizeof(float));
    for (int i = 0; i < n * NH * DQ; i++) q[i] = urand(&r);
    float *out = malloc((size_t)n * NH * DV * sizeof(float)), *out1 = malloc((size_t)n * NH * DV * sizeof(float));
    float scale = 1.0f / sqrtf((float)DQ);
    omp_set_num_threads(2);
    cpu_paged_attention(out, q, &k.ps, DK2 ? &k2.ps : NULL, &vs->ps, table, max_blocks, lens, n, NH, NKV, DK, DK2, DV, scale);
    omp_set_num_threads(1);
    cpu_paged_attention(out1, q, &k.ps, DK2 ? &k2.ps : NULL, &vs->ps, table, max_blocks, lens, n, NH, NKV, DK, DK2, DV, scale);
    omp_set_num_threads(2);
    // each sequence alone gives the same bits as in the batch
    float *alone = malloc((size_t)NH * DV * sizeof(float));
    int independent = 1;
    for (int i = 0; i < n; i++) {
        cpu_paged_attention(alone, q + (size_t)i * NH * DQ, &k.ps, DK2 ? &k2.ps : NULL, &vs->ps, table + (size_t)i * max_blocks,
                            max_blocks, lens + i, 1, NH, NKV, DK, DK2, DV, scale);
        independent &= !memcmp(alone, out + (size_t)i * NH * DV, (size_t)NH * DV * sizeof(float));
    }
    // rows of one sequence (a prefill chunk: one block table, growing lengths) share their decoded
    // blocks (layers/cpu_paged_attention.c, SharedDecode): each row gives the bits it gives alone
    const int sl[3] = {650, 690, 700};
    int *st3 = malloc((size_t)3 * max_blocks * sizeof(int));
    for (int r3 = 0; r3 < 3; r3++) memcpy(st3 + (size_t)r3 * max_blocks, table + (size_t)3 * max_blocks, (size_t)max_blocks * sizeof(int));
    float *o3 = malloc((size_t)3 * NH * DV * sizeof(float));
    cpu_paged_attention(o3, q, &k.ps, DK2 ? &k2.ps : NULL, &vs->ps, st3, max_blocks, sl, 3, NH, NKV, DK, DK2, DV, scale);
    for (int r3 = 0; r3 < 3; r3++) {
        cpu_paged_attention(alone, q + (size_t)r3 * NH * DQ, &k.ps, DK2 ? &k2.ps : NULL, &vs->ps, st3 + (size_t)r3 * max_blocks,
                            max_blocks, sl + r3, 1, NH, NKV, DK, DK2, DV, scale);
        independent &= !memcmp(alone, o3 + (size_t)r3 * NH * DV, (size_t)NH * DV * sizeof(float));
    }
    free(st3);
    free(o3);
    free(alone);
    double worst = 0;
    double *p = malloc(700 * sizeof(double));
    for (int i = 0; i < n; i++) {
        const int *ti = table + (size_t)i * max_blocks;
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            const float *qh = q + ((size_t)i * NH + h) * DQ;
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t < lens[i]; t++) {
                double s = 0;
                for (int d = 0; d < DK; d++) s += (double)qh[d] * tok(&k, ti, t)[g * DK + d];
                for (int d = 0; d < DK2; d++) s += (double)qh[DK + d] * tok(&k2, ti, t)[d];
                p[t] = s * scale;
                mx = p[t] > mx ? p[t] : mx;
            }
            for (int t = 0; t < lens[i]; t++) { p[t] = exp(p[t] - mx); sum += p[t]; }
            for (int d = 0; d < DV; d++) {
                double o = 0;
                for (int t = 0; t < lens[i]; t++) o += p[t] * tok(vs, ti, t)[g * DV + d];
                double e = fabs(o / sum - out[((size_t)i * NH + h) * DV + d]);
                worst = e > worst ? e : worst;
            }
        }
    }
    int ok = worst <= 2e-6, same = !memcmp(out, out1, (size_t)n * NH * DV * sizeof(float));
    printf("%s paged_attention %-34s max |op - double| %.2e, 1 vs 2 threads %s, alone vs batched (and rows of one sequence) %s\n",
           ok && same && independent ? "ok  " : "FAIL", name, worst, same ? "identical" : "DIFFER", independent ? "identical" : "DIFFER");
    passed += ok + same + independent;
    failed += !ok + !same + !independent;
    free(p); free(q); free(out); free(out1); free(table);
    stream_free(&k, n_blocks);
    if (DK2) stream_free(&k2, n_blocks);
    if (!v_is_k) stream_free(&v, n_blocks);
}

static void run(const char *name, int NH, int NKV, int DK, int DK2, int DV, int v_is_k, const Codec *kc) {
    run_v(name, NH, NKV, DK, DK2, DV, v_is_k, kc, NULL);
}

int main(void) {
    Codec fp32 = {.kind = CODEC_FP32}, bf16 = {.kind = CODEC_BF16}, int4 = {.kind = CODEC_INT_GROUP, .bits = 4, .group = 8};
    run("mha NH=4 D=8", 4, 4, 8, 0, 8, 0, &fp32);
    run("gqa NH=8 NKV=2 DK=16 DV=12", 8, 2, 16, 0, 12, 0, &fp32);
    run("mqa NH=8 NKV=1, bf16 keys", 8, 1, 16, 0, 16, 0, &bf16);
    run("absorbed latent R=16 DR=4, v=k", 4, 1, 16, 4, 16, 1, &fp32);
    run("absorbed latent, int4 latent", 4, 1, 16, 4, 16, 1, &int4);
    run("gqa NH=4 NKV=2, bf16 keys", 4, 2, 16, 0, 12, 0, &bf16);
    run("absorbed latent NH=4, bf16 latent", 4, 1, 16, 4, 16, 1, &bf16);
    run("absorbed latent NH=8, bf16 latent", 8, 1, 16, 4, 16, 1, &bf16);
    // the kernels' tails: widths off the 8- and 16-element vector steps, odd groups (a head
    // left over by the 2-head value tiles), values past the 32-wide tiles, bf16 values
    run_v("gqa NH=6 NKV=2 DK=13 DV=19, bf16 k and v", 6, 2, 13, 0, 19, 0, &bf16, &bf16);
    run_v("mha NH=3 DK=40 DV=72, bf16 k and v", 3, 3, 40, 0, 72, 0, &bf16, &bf16);
    run_v("gqa NH=6 NKV=2 DK=7 DV=44, fp32 k, int4 v", 6, 2, 7, 0, 44, 0, &fp32, &int4);
    run("absorbed latent NH=3 R=37 DR=5, bf16", 3, 1, 37, 5, 37, 1, &bf16);
    run("absorbed latent NH=5 R=48 DR=24, int4", 5, 1, 48, 24, 48, 1, &int4);
    // groups of 16 and 15 query heads per kv head, widths past the 32-wide value tiles by 16 and
    // by 8 (fp32), a latent with a 16-wide rope key
    run_v("gqa NH=32 NKV=2 DK=48 DV=48, bf16 k and v", 32, 2, 48, 0, 48, 0, &bf16, &bf16);
    run_v("gqa NH=15 NKV=1 DK=24 DV=40, fp32 k and v", 15, 1, 24, 0, 40, 0, &fp32, &fp32);
    run("absorbed latent NH=8 R=80 DR=16, bf16", 8, 1, 80, 16, 80, 1, &bf16);
    // bf16 parts of the bench's head widths (64; a latent with a 32-wide rope key)
    run_v("mha NH=4 DK=64 DV=32, bf16 k and v", 4, 4, 64, 0, 32, 0, &bf16, &bf16);
    run("absorbed latent NH=8 R=64 DR=32, bf16", 8, 1, 64, 32, 64, 1, &bf16);
    // groups of 8 or more over decoded (codec) streams: the sgemm path
    run("absorbed latent NH=8 R=48 DR=16, int4", 8, 1, 48, 16, 48, 1, &int4);
    run_v("mqa NH=8 DK=24 DV=40, int4 k and v", 8, 1, 24, 0, 40, 0, &int4, &int4);
    run_v("gqa NH=32 NKV=2 DK=16 DV=8, int4 k and v", 32, 2, 16, 0, 8, 0, &int4, &int4);
    printf("test_paged_attention: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
