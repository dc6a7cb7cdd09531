// Attention of one query row per sequence over a paged KV cache (decoding). Semantics:
// backend/backend.h, paged_attention.
//
// The cache is read block by block: a block's tokens are decoded into a small fp32 scratch (or
// read in place for fp32 streams), never the whole cache at once. The tokens of a sequence are
// cut into chunks of CHUNK_BLOCKS blocks; each (sequence, chunk) is one work item with its own
// online-softmax state (running max, sum, weighted values), so a long context at batch 1 still
// spreads over the cores ("split-K" decoding). The chunks of a sequence are then merged in
// chunk order: the chunking depends only on the lengths, so results do not depend on the
// number of threads.
#include "layers/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define CHUNK_BLOCKS 16

typedef struct ChunkState {
    float *m, *l, *acc;   // per query head: running max, sum of exp, (DV) weighted values
} ChunkState;

// Pointer to the fp32 values of tokens [t0, t0 + n) of block b (n <= block_tokens), decoded
// into buf unless the stream is fp32.
static const float *read_block(const PagedStream *s, int b, int t0, int n, float *buf) {
    const uint8_t *src = s->blocks[b] + (size_t)t0 * s->token_bytes;
    if (s->is_f32) return (const float *)src;
    s->decode(s->codec, buf, src, n, s->width);
    return buf;
}

void cpu_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                         const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                         int n, int NH, int NKV, int DK, int DK2, int DV, float scale) {
    const int BT = k->block_tokens, group = NH / NKV, DQ = DK + DK2;
    const int same_v = v == k;
    // work items: (sequence, chunk)
    int *item_seq = NULL, *item_chunk = NULL, n_items = 0;
    int *first_item = xmalloc(((size_t)n + 1) * sizeof(int));
    for (int i = 0; i < n; i++) {
        first_item[i] = n_items;
        int blocks = (lens[i] + BT - 1) / BT, chunks = (blocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
        n_items += chunks;
    }
    first_item[n] = n_items;
    item_seq = xmalloc((size_t)(n_items ? n_items : 1) * sizeof(int));
    item_chunk = xmalloc((size_t)(n_items ? n_items : 1) * sizeof(int));
    for (int i = 0; i < n; i++)
        for (int it = first_item[i]; it < first_item[i + 1]; it++) { item_seq[it] = i; item_chunk[it] = it - first_item[i]; }
    const size_t per_item = (size_t)NH * (2 + DV);
    float *state = xcalloc((size_t)(n_items ? n_items : 1) * per_item, sizeof(float));

    #pragma omp parallel
    {
        float *kbuf = xmalloc((size_t)BT * k->width * sizeof(float));
        float *k2buf = k2 ? xmalloc((size_t)BT * k2->width * sizeof(float)) : NULL;
        float *vbuf = same_v ? NULL : xmalloc((size_t)BT * v->width * sizeof(float));
        float *sc = xmalloc((size_t)BT * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; it++) {
            const int i = item_seq[it], len = lens[i];
            float *st = state + (size_t)it * per_item;
            ChunkState cs = {st, st + NH, st + 2 * NH};
            for (int h = 0; h < NH; h++) cs.m[h] = -INFINITY;
            const int b0 = item_chunk[it] * CHUNK_BLOCKS;
            for (int bj = b0; bj < b0 + CHUNK_BLOCKS && bj * BT < len; bj++) {
                const int b = block_table[(size_t)i * max_blocks + bj];
                const int nt = len - bj * BT < BT ? len - bj * BT : BT;
                const float *kb = read_block(k, b, 0, nt, kbuf);
                const float *k2b = k2 ? read_block(k2, b, 0, nt, k2buf) : NULL;
                const float *vb = same_v ? kb : read_block(v, b, 0, nt, vbuf);
                for (int h = 0; h < NH; h++) {
                    const int g = h / group;
                    const float *qh = q + ((size_t)i * NH + h) * DQ;
                    float mx = cs.m[h];
                    for (int t = 0; t < nt; t++) {
                        const float *kt = kb + (size_t)t * k->width + (size_t)g * DK;
                        float dot = 0.0f;
                        for (int d = 0; d < DK; d++) dot += qh[d] * kt[d];
                        if (k2b) {
                            const float *k2t = k2b + (size_t)t * k2->width;
                            for (int d = 0; d < DK2; d++) dot += qh[DK + d] * k2t[d];
                        }
                        sc[t] = dot * scale;
                        if (sc[t] > mx) mx = sc[t];
                    }
                    // rescale what was accumulated to the new max, then add this block
                    const float corr = cs.m[h] == -INFINITY ? 0.0f : expf(cs.m[h] - mx);
                    float *acc = cs.acc + (size_t)h * DV;
                    cs.l[h] *= corr;
                    for (int d = 0; d < DV; d++) acc[d] *= corr;
                    for (int t = 0; t < nt; t++) {
                        const float p = expf(sc[t] - mx);
                        const float *vt = vb + (size_t)t * v->width + (size_t)g * DV;
                        cs.l[h] += p;
                        for (int d = 0; d < DV; d++) acc[d] += p * vt[d];
                    }
                    cs.m[h] = mx;
                }
            }
        }
        free(kbuf);
        free(k2buf);
        free(vbuf);
        free(sc);
    }

    // merge the chunks of each sequence in order
    #pragma omp parallel for schedule(static) if (n > 1)
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < NH; h++) {
            float mx = -INFINITY;
            for (int it = first_item[i]; it < first_item[i + 1]; it++) {
                const float m = state[(size_t)it * per_item + h];
                if (m > mx) mx = m;
            }
            float *o = out + ((size_t)i * NH + h) * DV;
            memset(o, 0, (size_t)DV * sizeof(float));
            float l = 0.0f;
            for (int it = first_item[i]; it < first_item[i + 1]; it++) {
                const float *st = state + (size_t)it * per_item;
                if (st[h] == -INFINITY) continue;
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
    free(item_chunk);
    free(first_item);
}
