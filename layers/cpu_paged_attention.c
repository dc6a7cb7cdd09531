// Attention of one query row per sequence over a paged KV cache (decoding). Semantics:
// backend/backend.h, paged_attention.
//
// The tokens of a sequence are cut into chunks of CHUNK_BLOCKS blocks. A chunk is one work item:
// its tokens are decoded into a small fp32 scratch (per thread; never the whole cache), then for
// each kv head the scores of the heads that share it and their weighted values are two
// matmuls (or, for a few heads, matrix-vector products) through OpenBLAS (single-threaded inside the OpenMP region, docs/DESIGN.md section 3):
//   S (group, ntok) = scale * Q_g K_g^T     (+ Q2_g K2^T for the shared rope key)
//   acc (group, DV) = exp(S - rowmax) V_g
// The chunks of a sequence are merged in chunk order with their row maxima and sums (the
// split-K / flash-decoding merge). Chunking depends only on the lengths, so the result does not
// depend on the number of threads, and a long context at batch 1 still spreads over the cores.
#include "layers/cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define CHUNK_BLOCKS 16
// Query heads per kv head up to which each head's products are matrix-vector products: OpenBLAS's
// sgemm with a handful of rows packs its operand and runs several times slower (bench/bench_decode.c).
#define GEMV_MAX_ROWS 4

// ---- fp32 and bf16 streams, read in place: the cache's bytes are read once, with no fp32 copy.
// Sixteen independent accumulators (lane j sums elements j, j+16, ...; a fixed order) let the
// compiler vectorize without reassociating.

static inline float bf16_at(const uint8_t *p, int j) {
    uint16_t h;
    memcpy(&h, p + 2 * (size_t)j, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float lanes_sum(float *acc) {
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

static inline float dot_row(const float *restrict q, const PagedStream *s, const uint8_t *restrict row, int n) {
    float acc[16] = {0};
    int d = 0;
    if (s->kind == PAGED_BF16) {
        for (; d + 16 <= n; d += 16) {
            #pragma omp simd
            for (int j = 0; j < 16; j++) acc[j] += q[d + j] * bf16_at(row, d + j);
        }
        for (; d < n; d++) acc[0] += q[d] * bf16_at(row, d);
    } else {
        const float *restrict r = (const float *)row;
        for (; d + 16 <= n; d += 16) {
            #pragma omp simd
            for (int j = 0; j < 16; j++) acc[j] += q[d + j] * r[d + j];
        }
        for (; d < n; d++) acc[0] += q[d] * r[d];
    }
    return lanes_sum(acc);
}

// acc[d] += p * row[d], d < n
// (omp simd: the elements are independent, so vector lanes change no result)
static inline void axpy_row(float *restrict acc, float p, const PagedStream *s, const uint8_t *restrict row, int n) {
    if (s->kind == PAGED_BF16) {
        #pragma omp simd
        for (int d = 0; d < n; d++) acc[d] += p * bf16_at(row, d);
    } else {
        const float *restrict r = (const float *)row;
        #pragma omp simd
        for (int d = 0; d < n; d++) acc[d] += p * r[d];
    }
}

// Token t's bytes, element offset `off` (elements of the stream's dtype).
static const uint8_t *token_at(const PagedStream *s, const int *blocks, int t, int off) {
    return s->blocks[blocks[t / s->block_tokens]] + (size_t)(t % s->block_tokens) * s->token_bytes +
           (size_t)off * (s->kind == PAGED_BF16 ? 2 : 4);
}

static int direct_kind(const PagedStream *s) { return !s || s->kind == PAGED_F32 || s->kind == PAGED_BF16; }

// One work item read in place: every token's key and value rows are read once, front to back,
// for all heads (a head's slice of a row is short; walking the rows once per kv head would
// fetch every cache line several times). Scores sc (NH, nt), then the state in st.
static void attend_direct(const PagedStream *k, const PagedStream *k2, const PagedStream *v, const int *blocks, int nt,
                          const float *qi, int NH, int NKV, int DK, int DK2, int DV, float scale, float *sc, float *st) {
    const int DQ = DK + DK2, group = NH / NKV;
    const size_t kes = k->kind == PAGED_BF16 ? 2 : 4, ves = v->kind == PAGED_BF16 ? 2 : 4;
    for (int t = 0; t < nt; t++) {
        const uint8_t *kt = token_at(k, blocks, t, 0), *k2t = k2 ? token_at(k2, blocks, t, 0) : NULL;
        for (int h = 0; h < NH; h++) {
            const float *qh = qi + (size_t)h * DQ;
            float dot = dot_row(qh, k, kt + (size_t)(h / group) * DK * kes, DK);
            if (k2t) dot += dot_row(qh + DK, k2, k2t, DK2);
            sc[(size_t)h * nt + t] = dot * scale;
        }
    }
    for (int h = 0; h < NH; h++) {
        float *srow = sc + (size_t)h * nt, mx = srow[0], sum = 0.0f;
        for (int t = 1; t < nt; t++) mx = srow[t] > mx ? srow[t] : mx;
        for (int t = 0; t < nt; t++) { srow[t] = expf(srow[t] - mx); sum += srow[t]; }
        st[h] = mx;
        st[NH + h] = sum;
    }
    float *acc = st + 2 * NH;
    memset(acc, 0, (size_t)NH * DV * sizeof(float));
    for (int t = 0; t < nt; t++) {
        const uint8_t *vt = token_at(v, blocks, t, 0);
        for (int h = 0; h < NH; h++)
            axpy_row(acc + (size_t)h * DV, sc[(size_t)h * nt + t], v, vt + (size_t)(h / group) * DV * ves, DV);
    }
}

// Tokens [0, nt) of the chunk's blocks, decoded into dst (nt, width).
static void read_chunk(const PagedStream *s, const int *blocks, int nt, float *dst) {
    const int BT = s->block_tokens;
    for (int b = 0, t0 = 0; t0 < nt; b++, t0 += BT) {
        const int n = nt - t0 < BT ? nt - t0 : BT;
        float *out = dst + (size_t)t0 * s->width;
        if (s->is_f32) memcpy(out, s->blocks[blocks[b]], (size_t)n * s->width * sizeof(float));
        else s->decode(s->codec, out, s->blocks[blocks[b]], n, s->width);
    }
}

void cpu_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                         const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                         int n, int NH, int NKV, int DK, int DK2, int DV, float scale) {
    const int BT = k->block_tokens, group = NH / NKV, DQ = DK + DK2, CT = CHUNK_BLOCKS * BT;
    const int same_v = v == k;
    // fp32/bf16 caches of a few heads per kv head: read in place (the memory-bound case);
    // otherwise decode a chunk into a scratch and score it with OpenBLAS
    const int direct = group <= GEMV_MAX_ROWS && direct_kind(k) && direct_kind(k2) && direct_kind(v);
    // work items: (sequence, chunk)
    int *first_item = xmalloc(((size_t)n + 1) * sizeof(int)), n_items = 0;
    for (int i = 0; i < n; i++) {
        first_item[i] = n_items;
        n_items += (lens[i] + CT - 1) / CT;
    }
    first_item[n] = n_items;
    int *item_seq = xmalloc((size_t)(n_items ? n_items : 1) * sizeof(int));
    for (int i = 0; i < n; i++)
        for (int it = first_item[i]; it < first_item[i + 1]; it++) item_seq[it] = i;
    // per item and query head: row max, row sum, (DV) weighted values
    const size_t per_item = (size_t)NH * (2 + DV);
    float *state = xcalloc((size_t)(n_items ? n_items : 1) * per_item, sizeof(float));

    #pragma omp parallel
    {
        float *kbuf = direct ? NULL : xmalloc((size_t)CT * k->width * sizeof(float));
        float *k2buf = k2 && !direct ? xmalloc((size_t)CT * k2->width * sizeof(float)) : NULL;
        float *vbuf = same_v || direct ? kbuf : xmalloc((size_t)CT * v->width * sizeof(float));
        float *sc = xmalloc((size_t)(direct ? NH : group) * CT * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; it++) {
            const int i = item_seq[it], chunk = it - first_item[i];
            const int t0 = chunk * CT, nt = lens[i] - t0 < CT ? lens[i] - t0 : CT;
            const int *blocks = block_table + (size_t)i * max_blocks + chunk * CHUNK_BLOCKS;
            float *st = state + (size_t)it * per_item;
            if (direct) {
                attend_direct(k, k2, v, blocks, nt, q + (size_t)i * NH * DQ, NH, NKV, DK, DK2, DV, scale, sc, st);
                continue;
            }
            read_chunk(k, blocks, nt, kbuf);
            if (k2) read_chunk(k2, blocks, nt, k2buf);
            if (!same_v) read_chunk(v, blocks, nt, vbuf);
            for (int g = 0; g < NKV; g++) {
                const float *qg = q + ((size_t)i * NH + (size_t)g * group) * DQ;
                float *acc = st + 2 * NH + (size_t)g * group * DV;
                if (group > GEMV_MAX_ROWS) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group, nt, DK, scale, qg, DQ,
                                kbuf + (size_t)g * DK, k->width, 0.0f, sc, nt);
                    if (k2)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group, nt, DK2, scale, qg + DK, DQ,
                                    k2buf, k2->width, 1.0f, sc, nt);
                } else {
                    for (int r = 0; r < group; r++) {
                        cblas_sgemv(CblasRowMajor, CblasNoTrans, nt, DK, scale, kbuf + (size_t)g * DK, k->width,
                                    qg + (size_t)r * DQ, 1, 0.0f, sc + (size_t)r * nt, 1);
                        if (k2)
                            cblas_sgemv(CblasRowMajor, CblasNoTrans, nt, DK2, scale, k2buf, k2->width,
                                        qg + (size_t)r * DQ + DK, 1, 1.0f, sc + (size_t)r * nt, 1);
                    }
                }
                for (int r = 0; r < group; r++) {
                    float *s = sc + (size_t)r * nt, mx = s[0], sum = 0.0f;
                    for (int t = 1; t < nt; t++) mx = s[t] > mx ? s[t] : mx;
                    for (int t = 0; t < nt; t++) { s[t] = expf(s[t] - mx); sum += s[t]; }
                    st[g * group + r] = mx;
                    st[NH + g * group + r] = sum;
                }
                if (group > GEMV_MAX_ROWS)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, group, DV, nt, 1.0f, sc, nt,
                                vbuf + (size_t)g * DV, v->width, 0.0f, acc, DV);
                else
                    for (int r = 0; r < group; r++)
                        cblas_sgemv(CblasRowMajor, CblasTrans, nt, DV, 1.0f, vbuf + (size_t)g * DV, v->width,
                                    sc + (size_t)r * nt, 1, 0.0f, acc + (size_t)r * DV, 1);
            }
        }
        free(kbuf);
        free(k2buf);
        if (vbuf != kbuf) free(vbuf);
        free(sc);
    }

    // merge the chunks of each sequence in order
    #pragma omp parallel for schedule(static) if (n > 1)
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < NH; h++) {
            float mx = -INFINITY;
            for (int it = first_item[i]; it < first_item[i + 1]; it++) {
                const float m = state[(size_t)it * per_item + h];
                mx = m > mx ? m : mx;
            }
            float *o = out + ((size_t)i * NH + h) * DV, l = 0.0f;
            memset(o, 0, (size_t)DV * sizeof(float));
            for (int it = first_item[i]; it < first_item[i + 1]; it++) {
                const float *st = state + (size_t)it * per_item;
                const float w = expf(st[h] - mx);
                l += w * st[NH + h];
                const float *acc = st + 2 * NH + (size_t)h * DV;
                for (int d = 0; d < DV; d++) o[d] += w * acc[d];
            }
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            for (int d = 0; d < DV; d++) o[d] *= inv;
        }
    }
    free(state);
    free(item_seq);
    free(first_item);
}
