// Attention of one query row per sequence over a paged KV cache (decoding). Semantics:
// backend/backend.h, paged_attention.
//
// The tokens of a sequence are cut into chunks of whole blocks (about CHUNK_BYTES of cache
// each); a chunk is one work item. In it, every query head is scored against its kv head's keys,
// softmaxed, and its weights applied to the values:
//   S (NH, ntok) = scale * Q K^T      (+ Q2 K2^T for the shared rope key)
//   acc (NH, DV) = exp(S - rowmax) V
// walking the chunk token-major, TILE_TOKENS rows at a time for all heads: memory is read front
// to back once per pass, and the heads that share a kv head find its rows in L1. The kernels
// read the cache where it lies: fp32 as is, bf16 widened in registers (a pair of bf16 read as
// one 32-bit lane gives its even element by a shift and its odd one by a mask, so the query and
// the accumulators are kept split into even and odd elements). A codec stream (int_group) is
// decoded once per chunk into a per-thread fp32 scratch and read from there, each block's bytes
// asked for while the one before it decodes (chunk_matrix). Rows read in place are prefetched a
// tile ahead (prefetch_rows), and each thread claims its next chunk when it starts one, so that
// the chunk's values pass, which reads its rows from L2, asks for the next chunk's keys: memory
// then streams through both passes instead of the scores pass alone (MHA's 16k batch-8
// attention 0.80-0.86 of the time, bench/ab.sh paged). Scores go 8 tokens
// at a time (8 accumulators, summed across lanes together by vec_sum8), for two query heads of
// one kv head together where a group has two (scores_pair), four where it has four and the build
// has AVX-512VL's 32 vector registers (scores_quad, 4 tokens at a time), weighted values up to 4 heads
// (VALUE_HEADS) x 32 values at a time, the softmax's exponentials 8 at a time (vec_exp). OpenBLAS's sgemm packs
// its operands and ran several times slower at these few rows (bench/bench_decode.c), except
// under its small-matrix bound, where it does not pack: a group of 8 or more query heads whose
// keys and values are decoded into scratch anyway (CLLA-quant) goes through it (GEMM_GROUP).
// The chunks of a sequence are merged in chunk order with their row maxima and sums (the
// split-K / flash-decoding merge). Chunking depends only on the lengths and the shapes, and every
// sum has a fixed order, so the result depends neither on the number of threads nor on the
// other sequences of the batch (tests/test_paged_attention.c).
#include "layers/cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "common/vec.h"

// A chunk is as many blocks (at most MAX_CHUNK_BLOCKS) as keep its key and value bytes within
// CHUNK_BYTES, half the L2 of the machines we measure: the values pass reads the chunk again.
#define CHUNK_BYTES ((size_t)256 << 10)
#define MAX_CHUNK_BLOCKS 16
#define TILE_TOKENS 16
// query heads that weighted_values serves from one widened value row (1 to 4)
#define VALUE_HEADS 4

typedef uint32_t vecu __attribute__((vector_size(VEC_LANES * sizeof(uint32_t))));
typedef uint32_t vecu_u __attribute__((vector_size(VEC_LANES * sizeof(uint32_t)), aligned(2), may_alias));

// 16 bf16 at p as 8 lanes of pairs: the even elements (p[0], p[2], ...) and the odd ones
static inline vecu load_pairs(const uint8_t *p) { return *(const vecu_u *)p; }
static inline vecf even_of(vecu u) { return (vecf)(u << 16); }
static inline vecf odd_of(vecu u) { return (vecf)(u & 0xffff0000u); }

static inline float bf16_at(const uint8_t *p, int j) {
    uint16_t h;
    memcpy(&h, p + 2 * (size_t)j, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// One part of a key or value: token t's n elements start at row[t] + off, fp32 or bf16.
typedef struct Part {
    const uint8_t *const *row;
    size_t off;
    int n, bf16;
} Part;

static inline const uint8_t *at(const Part *p, int t) { return p->row[t] + p->off; }
static inline float elem(const Part *p, const uint8_t *r, int d) { return p->bf16 ? bf16_at(r, d) : ((const float *)r)[d]; }

// A query slice laid out for a part: as is for fp32; for bf16, the vector steps' elements split
// into even (first half) and odd (second half) of every 16, the tail as is after them.
static void query_for(float *dst, const float *q, const Part *p) {
    if (!p->bf16) { memcpy(dst, q, (size_t)p->n * sizeof(float)); return; }
    const int e = p->n / 16 * 16;
    for (int d = 0; d < e; d += 16)
        for (int i = 0; i < 8; i++) dst[d + i] = q[d + 2 * i], dst[d + 8 + i] = q[d + 2 * i + 1];
    for (int d = e; d < p->n; d++) dst[d] = q[d];
}

// a_j += (query . part) and, for a second head (two), b_j += (its query . part) over the vector
// steps, for the 8 tokens t .. t + 7; e ends where the scalar tail starts. Two heads that share a
// kv head take the same rows: each row piece is loaded and widened once for both, which halves
// the loads and the widening per multiply-add, and the 8 rows of the tile stay in flight. Each
// accumulator sees the same multiply-adds in the same order either way, so one head scored
// alone or beside another gives the same bits.
#define TILE8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define SCORE_ACC(two)                                                                            \
    if (p->bf16) {                                                                                \
        e = p->n / 16 * 16;                                                                       \
        for (int d = 0; d < e; d += 16) {                                                         \
            vecf qe = vec_load(qp + d), qo = vec_load(qp + d + 8), qe2 = qe, qo2 = qo;            \
            if (two) qe2 = vec_load(qp2 + d), qo2 = vec_load(qp2 + d + 8);                        \
            TILE8(BF16_STEP)                                                                      \
        }                                                                                         \
    } else {                                                                                      \
        e = p->n / VEC_LANES * VEC_LANES;                                                         \
        for (int d = 0; d < e; d += VEC_LANES) {                                                  \
            vecf x = vec_load(qp + d), x2 = x;                                                    \
            if (two) x2 = vec_load(qp2 + d);                                                      \
            TILE8(F32_STEP)                                                                       \
        }                                                                                         \
    }
#define BF16_STEP(j)                                                                              \
    {                                                                                             \
        vecu u = load_pairs(r##j + 2 * (size_t)d);                                                \
        vecf ev = even_of(u), od = odd_of(u);                                                     \
        a##j += qe * ev; a##j += qo * od;                                                         \
        if (two) { b##j += qe2 * ev; b##j += qo2 * od; }                                          \
    }
#define F32_STEP(j)                                                                               \
    {                                                                                             \
        vecf kv = vec_load((const float *)r##j + d);                                              \
        a##j += x * kv;                                                                           \
        if (two) b##j += x2 * kv;                                                                 \
    }

// sc[t] = scale * (q . K[t] + q2 . K2[t]) for t < nt, q and q2 laid out by query_for; k2 has
// n = 0 when absent. two: the same for a second head, whose query rows are qb, qb2 and scores scb
// (its kv head's part is k's: the caller pairs heads of one group). Inlined with two a constant,
// so that the one-head form carries no second set of accumulators.
static inline __attribute__((always_inline)) void scores_heads(int two, float *sc, float *scb, const float *q, const float *qb,
                                                               const Part *k, const float *q2, const float *qb2, const Part *k2,
                                                               int nt, float scale) {
    int t = 0;
    for (; t + 8 <= nt; t += 8) {
        vecf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
        vecf b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0}, b4 = {0}, b5 = {0}, b6 = {0}, b7 = {0};
        int tails[2];
        for (int part = 0; part < 2; part++) {
            const Part *p = part ? k2 : k;
            const float *qp = part ? q2 : q, *qp2 = part ? qb2 : qb;
            int e = 0;
            if (p->n) {
#define ROW(j) const uint8_t *r##j = at(p, t + j);
                TILE8(ROW)
#undef ROW
                SCORE_ACC(two)
            }
            tails[part] = e;
        }
        for (int head = 0; head < 1 + two; head++) {
            vecf s = head ? vec_sum8(b0, b1, b2, b3, b4, b5, b6, b7) : vec_sum8(a0, a1, a2, a3, a4, a5, a6, a7);
            for (int part = 0; part < 2; part++) {
                const Part *p = part ? k2 : k;
                const float *qp = head ? (part ? qb2 : qb) : (part ? q2 : q);
                for (int j = 0; j < 8 && tails[part] < p->n; j++) {
                    const uint8_t *r = at(p, t + j);
                    for (int d = tails[part]; d < p->n; d++) s[j] += qp[d] * elem(p, r, d);
                }
            }
            vec_store((head ? scb : sc) + t, s * vec_splat(scale));
        }
    }
    for (int head = 0; head < 1 + two; head++)
        for (int u = t; u < nt; u++) {   // one token: the same steps with one accumulator
            const float *qh = head ? qb : q, *qh2 = head ? qb2 : q2;
            vecf a = {0};
            float s = 0.0f;
            int tails[2];
            for (int part = 0; part < 2; part++) {
                const Part *p = part ? k2 : k;
                const float *qp = part ? qh2 : qh;
                const uint8_t *r = p->n ? at(p, u) : NULL;
                int e = 0;
                if (p->bf16) {
                    for (e = 0; e + 16 <= p->n; e += 16) {
                        vecu w = load_pairs(r + 2 * (size_t)e);
                        a += vec_load(qp + e) * even_of(w);
                        a += vec_load(qp + e + 8) * odd_of(w);
                    }
                } else {
                    for (e = 0; e + VEC_LANES <= p->n; e += VEC_LANES) a += vec_load(qp + e) * vec_load((const float *)r + e);
                }
                tails[part] = e;
            }
            s = vec_sum(a);
            for (int part = 0; part < 2; part++) {
                const Part *p = part ? k2 : k;
                const float *qp = part ? qh2 : qh;
                for (int d = tails[part]; d < p->n; d++) s += qp[d] * elem(p, at(p, u), d);
            }
            (head ? scb : sc)[u] = scale * s;
        }
}

static void scores(float *sc, const float *q, const Part *k, const float *q2, const Part *k2, int nt, float scale) {
    scores_heads(0, sc, NULL, q, NULL, k, q2, NULL, k2, nt, scale);
}

static void scores_pair(float *sc, float *scb, const float *q, const float *qb, const Part *k, const float *q2, const float *qb2,
                        const Part *k2, int nt, float scale) {
    scores_heads(1, sc, scb, q, qb, k, q2, qb2, k2, nt, scale);
}

// The sums of scores_heads for four query heads of one kv head, 4 tokens at a time: each row
// piece is loaded and widened once for four heads, half the loads and widening per multiply-add
// of the pair's, in 16 accumulators (AVX-512VL's 32 vector registers hold them with the 8 query
// pieces). Each accumulator sees the multiply-adds of scores_heads in the same order, and
// vec_sum8 gives lane j the sum vec_sum gives (common/vec.h), so every score has the same bits as
// when its head is scored alone or in a pair. sc[i], q[i], q2[i]: head i's scores and its query
// pieces for k and k2 (laid out by query_for). The parts' widths are whole vector steps
// (whole_steps): the scalar tails of scores_heads, which GCC contracts into multiply-adds in one
// form and not in another, would not give the same bits here.
#define QUAD(X) X(0) X(1) X(2) X(3)
// Four heads at once hold 26 vectors in registers (16 accumulators, 8 query pieces, a widened
// row): AVX-512VL has 32, AVX2 16, so only builds with AVX-512VL score four heads together
// (score_heads); the others use the pair's kernel.
#ifdef __AVX512VL__
#define QUAD_HEADS 1
// Four vectors held in registers from here on: GCC otherwise folds each query load into every
// multiply-add that reads it (a memory operand costs it nothing), 40 loads for 32 multiply-adds,
// which made this kernel slower than the pair's (bench/ab.sh paged).
#define IN_REGISTERS(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d))
#else
#define QUAD_HEADS 0
#define IN_REGISTERS(a, b, c, d) ((void)0)
#endif
#define QUAD_BF16(j)                                                                             \
    {                                                                                            \
        vecu u = load_pairs(r##j + 2 * (size_t)d);                                               \
        vecf ev = even_of(u), od = odd_of(u);                                                    \
        a0##j += qe0 * ev; a0##j += qo0 * od; a1##j += qe1 * ev; a1##j += qo1 * od;              \
        a2##j += qe2 * ev; a2##j += qo2 * od; a3##j += qe3 * ev; a3##j += qo3 * od;              \
    }
#define QUAD_F32(j)                                                                              \
    {                                                                                            \
        vecf kv = vec_load((const float *)r##j + d);                                             \
        a0##j += x0 * kv; a1##j += x1 * kv; a2##j += x2 * kv; a3##j += x3 * kv;                  \
    }
static void scores_quad(float *const sc[4], const float *const q[4], const float *const q2[4], const Part *k, const Part *k2,
                        int nt, float scale) {
    // tokens in groups of 8 as scores_heads takes them, 4 at a time; the rest, fewer than 8, by its
    // one-token steps (whose sums round differently from the tiles' in the last bit)
    const int nt8 = nt / 8 * 8;
    int t = 0;
    for (; t < nt8; t += 4) {
#define ACC(j) vecf a0##j = {0}, a1##j = {0}, a2##j = {0}, a3##j = {0};
        QUAD(ACC)
#undef ACC
        for (int part = 0; part < 2; part++) {
            const Part *p = part ? k2 : k;
            const float *const *qh = part ? q2 : q;
            if (p->n) {
#define ROW(j) const uint8_t *r##j = at(p, t + j);
                QUAD(ROW)
#undef ROW
                if (p->bf16) {
                    for (int d = 0; d < p->n; d += 16) {
                        vecf qe0 = vec_load(qh[0] + d), qo0 = vec_load(qh[0] + d + 8), qe1 = vec_load(qh[1] + d), qo1 = vec_load(qh[1] + d + 8);
                        vecf qe2 = vec_load(qh[2] + d), qo2 = vec_load(qh[2] + d + 8), qe3 = vec_load(qh[3] + d), qo3 = vec_load(qh[3] + d + 8);
                        IN_REGISTERS(qe0, qo0, qe1, qo1);
                        IN_REGISTERS(qe2, qo2, qe3, qo3);
                        QUAD(QUAD_BF16)
                    }
                } else {
                    for (int d = 0; d < p->n; d += VEC_LANES) {
                        vecf x0 = vec_load(qh[0] + d), x1 = vec_load(qh[1] + d), x2 = vec_load(qh[2] + d), x3 = vec_load(qh[3] + d);
                        IN_REGISTERS(x0, x1, x2, x3);
                        QUAD(QUAD_F32)
                    }
                }
            }
        }
        // lanes 0-3: the first head's 4 tokens, 4-7: the second's (vec_sum8's lane j = vec_sum(a_j))
        vecf s01 = vec_sum8(a00, a01, a02, a03, a10, a11, a12, a13), s23 = vec_sum8(a20, a21, a22, a23, a30, a31, a32, a33);
        typedef float vec4 __attribute__((vector_size(16), aligned(4), may_alias));
        s01 *= vec_splat(scale);
        s23 *= vec_splat(scale);
        *(vec4 *)(sc[0] + t) = __builtin_shufflevector(s01, s01, 0, 1, 2, 3);
        *(vec4 *)(sc[1] + t) = __builtin_shufflevector(s01, s01, 4, 5, 6, 7);
        *(vec4 *)(sc[2] + t) = __builtin_shufflevector(s23, s23, 0, 1, 2, 3);
        *(vec4 *)(sc[3] + t) = __builtin_shufflevector(s23, s23, 4, 5, 6, 7);
    }
    if (t < nt) {   // the last tokens: each head alone, as scores_pair takes them
        const Part ks = {k->row + t, k->off, k->n, k->bf16}, k2s = {k2->row ? k2->row + t : NULL, k2->off, k2->n, k2->bf16};
        for (int i = 0; i < 4; i++) scores(sc[i] + t, q[i], &ks, q2[i], &k2s, nt - t, scale);
    }
}
#undef QUAD_BF16
#undef QUAD_F32

// How many heads of a group to score together from head r of it on: 4 while four are left (with
// AVX-512VL), then 2, then 1; and how many kernel calls that makes for a group.
// quad: the parts suit scores_quad (whole_steps).
static int score_heads(int group, int r, int quad) { return QUAD_HEADS && quad && group - r >= 4 ? 4 : group - r >= 2 ? 2 : 1; }
static int score_steps_of(int group, int quad) {
    int n = 0;
    for (int r = 0; r < group; r += score_heads(group, r, quad)) n++;
    return n;
}

// 1 when n elements of a stream read in place are whole vector steps of the score kernels (16
// for bf16, VEC_LANES for fp32), or there is no stream.
static int whole_steps(const PagedStream *s, int n) { return !s || n % (s->kind == PAGED_BF16 ? 16 : VEC_LANES) == 0; }

// acc[r][0..n) += sum_t p[r][t] V[t][0..n) for rows r < R (1 to 4) of p (leading dim ldp), t in
// order. For a bf16 part, acc holds each 32 values split as the registers hold them (the even
// elements of the first 16, their odd ones, then the same of the second 16): the caller zeroes
// acc before the first tile and calls unsplit_values after the last. Each value row is loaded and
// widened once for the R heads (16 accumulators at R = 4); a head's sums do not depend on R.
// Inlined with R a constant (weighted_values), so that fewer rows carry no unused accumulators.
#define VAL_ROWS(X) X(0, a) X(1, b) X(2, c) X(3, g)
static inline __attribute__((always_inline)) void values_rows(const int R, float *acc, int ldacc, const float *p, int ldp,
                                                              const Part *v, int nt) {
    const int n = v->n;
    int d = 0;
    for (; d + 4 * VEC_LANES <= n; d += 4 * VEC_LANES) {
        vecf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        vecf c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, g0 = {0}, g1 = {0}, g2 = {0}, g3 = {0};
#define VAL_LOAD(r, x)                                                                       \
        if (R > r) {                                                                         \
            const float *ar = acc + (size_t)(r) * ldacc + d;                                 \
            x##0 = vec_load(ar), x##1 = vec_load(ar + 8), x##2 = vec_load(ar + 16), x##3 = vec_load(ar + 24); \
        }
        VAL_ROWS(VAL_LOAD)
#undef VAL_LOAD
        for (int t = 0; t < nt; t++) {
            vecf x0, x1, x2, x3;
            if (v->bf16) {
                const uint8_t *r = at(v, t) + 2 * (size_t)d;
                vecu u0 = load_pairs(r), u1 = load_pairs(r + 32);
                x0 = even_of(u0), x1 = odd_of(u0), x2 = even_of(u1), x3 = odd_of(u1);
            } else {
                const float *r = (const float *)at(v, t) + d;
                x0 = vec_load(r), x1 = vec_load(r + 8), x2 = vec_load(r + 16), x3 = vec_load(r + 24);
            }
#define VAL_FMA(r, y)                                                                        \
            if (R > r) {                                                                     \
                vecf w = vec_splat(p[(size_t)(r) * ldp + t]);                                \
                y##0 += w * x0; y##1 += w * x1; y##2 += w * x2; y##3 += w * x3;             \
            }
            VAL_ROWS(VAL_FMA)
#undef VAL_FMA
        }
#define VAL_STORE(r, x)                                                                      \
        if (R > r) {                                                                         \
            float *ar = acc + (size_t)(r) * ldacc + d;                                       \
            vec_store(ar, x##0), vec_store(ar + 8, x##1), vec_store(ar + 16, x##2), vec_store(ar + 24, x##3); \
        }
        VAL_ROWS(VAL_STORE)
#undef VAL_STORE
    }
    for (; d < n; d++)   // the last < 32 values, one at a time
        for (int r = 0; r < R; r++) {
            float a = acc[(size_t)r * ldacc + d];
            for (int t = 0; t < nt; t++) a += p[(size_t)r * ldp + t] * elem(v, at(v, t), d);
            acc[(size_t)r * ldacc + d] = a;
        }
}

static void weighted_values(float *acc, int ldacc, const float *p, int ldp, int rows, const Part *v, int nt) {
    switch (rows) {
    case 1: values_rows(1, acc, ldacc, p, ldp, v, nt); break;
    case 2: values_rows(2, acc, ldacc, p, ldp, v, nt); break;
    case 3: values_rows(3, acc, ldacc, p, ldp, v, nt); break;
    default: values_rows(4, acc, ldacc, p, ldp, v, nt); break;
    }
}

// weighted_values' split layout of a bf16 part back to element order
static void unsplit_values(float *acc, int n) {
    for (int d = 0; d + 32 <= n; d += 32) {
        float t[32];
        memcpy(t, acc + d, sizeof(t));
        for (int i = 0; i < 8; i++)
            acc[d + 2 * i] = t[i], acc[d + 2 * i + 1] = t[8 + i], acc[d + 16 + 2 * i] = t[16 + i], acc[d + 17 + 2 * i] = t[24 + i];
    }
}

// Bytes [p, p + bytes), bytes > 0, asked into L2 (prefetcht1): a request every 64 bytes from p
// and one for the last byte, whose line the others miss when p is not on a line's start. Every
// prefetch of this file goes through it. Always inlined: GCC deletes the calls to a function of
// prefetches alone (layers/cpu_matmul.c, prefetch_weight; tests/test_prefetch_kept.sh).
static inline __attribute__((always_inline)) void prefetch_bytes(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
    __builtin_prefetch(p + bytes - 1, 0, 2);
}

// The nt tokens of a chunk's blocks as an fp32 matrix (nt, width) in scratch: decoded (a codec),
// widened (bf16) or copied (fp32).
static const float *chunk_matrix(const PagedStream *s, const int *blocks, int nt, float *scratch) {
    const int BT = s->block_tokens;
    for (int b = 0, t0 = 0; t0 < nt; b++, t0 += BT) {
        const int n = nt - t0 < BT ? nt - t0 : BT;
        // the next block's bytes asked for while this one is decoded: the decode waited on its
        // loads (perf of CLLA-quant's step put 39% of int_group_decode on the first load of a code word)
        if (s->token_bytes && t0 + BT < nt) {
            prefetch_bytes(s->blocks[blocks[b + 1]], (size_t)(nt - t0 - BT < BT ? nt - t0 - BT : BT) * s->token_bytes);
        }
        float *dst = scratch + (size_t)t0 * s->width;
        const uint8_t *src = s->blocks[blocks[b]];
        if (s->kind == PAGED_BF16) vec_bf16_to_f32(dst, src, n * s->width);
        else if (s->kind == PAGED_F32) memcpy(dst, src, (size_t)n * s->width * sizeof(float));
        else s->decode(s->ctx, dst, blocks[b], n);
    }
    return scratch;
}

// Row pointers of tokens [0, nt) of the chunk's blocks. A stream read in place points into its
// blocks; a codec stream is decoded into scratch (nt, width) first and points there.
static int read_in_place(const PagedStream *s) { return s->kind == PAGED_F32 || s->kind == PAGED_BF16; }

static void chunk_rows(const PagedStream *s, const int *blocks, int nt, float *scratch, const uint8_t **row) {
    if (!read_in_place(s)) {
        chunk_matrix(s, blocks, nt, scratch);
        for (int t = 0; t < nt; t++) row[t] = (const uint8_t *)(scratch + (size_t)t * s->width);
        return;
    }
    const int BT = s->block_tokens;
    for (int b = 0, t0 = 0; t0 < nt; b++, t0 += BT) {
        const int n = nt - t0 < BT ? nt - t0 : BT;
        const uint8_t *src = s->blocks[blocks[b]];
        for (int j = 0; j < n; j++) row[t0 + j] = src + (size_t)j * s->token_bytes;
    }
}

// Each of the NH score rows (CT apart) of a chunk's nt tokens exponentiated in place against its
// maximum (the softmax numerators); the maxima to st[0..NH), the sums to st[NH..2 NH).
static void softmax_rows(float *st, float *sc, int CT, int NH, int nt) {
    for (int h = 0; h < NH; h++) {
        float *s = sc + (size_t)h * CT;
        const float mx = vec_max_of(s, nt, s[0]);
        st[h] = mx;
        st[NH + h] = vec_exp_shifted(s, nt, mx);
    }
}

// A scored key stream (PagedStream.score): each of the nq queries (its part at offset off of rows
// of DQ) prepared once, for every block it is scored against.
static double *prepare_queries(const PagedStream *s, const float *q, int nq, int DQ, int off) {
    double *prep = xmalloc(((size_t)nq * s->prep_doubles + 1) * sizeof(double));
    #pragma omp parallel for schedule(static) if (nq > 1)
    for (int i = 0; i < nq; i++) s->prep(s->ctx, prep + (size_t)i * s->prep_doubles, q + (size_t)i * DQ + off);
    return prep;
}

// sc[t] += scale * (q . k_t) for the nt tokens of a chunk's blocks of a scored stream, head `head`
// (raw: BT floats of scratch).
static void add_scored(float *sc, float *raw, const PagedStream *s, const float *q, const double *prep, int head, const int *blocks,
                       int nt, float scale) {
    for (int b = 0, tb = 0; tb < nt; b++, tb += s->block_tokens) {
        const int nb = nt - tb < s->block_tokens ? nt - tb : s->block_tokens;
        s->score(s->ctx, raw, q, prep, head, blocks[b], nb);
        for (int j = 0; j < nb; j++) sc[tb + j] += scale * raw[j];
    }
}

// Rows of one sequence (the rows of a prefill chunk: the same block table, growing lengths) read
// the same blocks: a decoded stream's blocks are decoded once for the group, up to its longest
// row, instead of once per row (SharedDecode); decoding is deterministic, so the values are those
// each row would have decoded. Groups of one row, and groups whose decoded copies would pass
// SHARED_BYTES in all, decode per item as before.
#define SHARED_BYTES ((size_t)512 << 20)

typedef struct SharedDecode {
    int n_groups;
    int *group_of;        // [n]: the row's group, -1: decodes per item
    int *first, *len;     // [n_groups]: the group's first row, its longest length
    float **dec[3];       // [stream k, v, k2][n_groups]: decoded tokens (len, width), NULL: not shared
} SharedDecode;

static int decoded_here(const PagedStream *s, int scored) { return s && !read_in_place(s) && !scored; }

static void shared_decode(SharedDecode *sd, const PagedStream *const st[3], const int *block_table, int max_blocks,
                          const int *lens, int n) {
    memset(sd, 0, sizeof(*sd));
    sd->group_of = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    sd->first = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    sd->len = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    size_t per_token = 0;
    for (int j = 0; j < 3; j++) per_token += st[j] ? (size_t)st[j]->width * sizeof(float) : 0;
    size_t bytes = 0;
    for (int i = 0; i < n;) {
        int e = i + 1, len = lens[i];
        while (e < n && !memcmp(block_table + (size_t)e * max_blocks, block_table + (size_t)i * max_blocks, (size_t)max_blocks * sizeof(int))) {
            len = lens[e] > len ? lens[e] : len;
            e++;
        }
        const int share = e - i > 1 && per_token && bytes + (size_t)len * per_token <= SHARED_BYTES;
        if (share) {
            sd->first[sd->n_groups] = i;
            sd->len[sd->n_groups] = len;
            bytes += (size_t)len * per_token;
        }
        for (int r = i; r < e; r++) sd->group_of[r] = share ? sd->n_groups : -1;
        sd->n_groups += share;
        i = e;
    }
    if (!sd->n_groups) return;
    // (group, stream, block) tasks, decoded in parallel
    const int BT = st[0] ? st[0]->block_tokens : (st[1] ? st[1]->block_tokens : st[2]->block_tokens);
    int n_tasks = 0;
    for (int j = 0; j < 3; j++) {
        if (!st[j]) continue;
        sd->dec[j] = xcalloc((size_t)sd->n_groups, sizeof(float *));
        for (int g = 0; g < sd->n_groups; g++) {
            sd->dec[j][g] = xmalloc(((size_t)sd->len[g] + 1) * st[j]->width * sizeof(float));
            n_tasks += (sd->len[g] + BT - 1) / BT;
        }
    }
    int (*task)[3] = xmalloc((size_t)n_tasks * sizeof(*task)), t = 0;
    for (int j = 0; j < 3; j++)
        for (int g = 0; st[j] && g < sd->n_groups; g++)
            for (int b = 0; b * BT < sd->len[g]; b++) task[t][0] = j, task[t][1] = g, task[t][2] = b, t++;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int it = 0; it < n_tasks; it++) {
        const int j = task[it][0], g = task[it][1], b = task[it][2];
        const PagedStream *s = st[j];
        const int nb = sd->len[g] - b * BT < BT ? sd->len[g] - b * BT : BT;
        s->decode(s->ctx, sd->dec[j][g] + (size_t)b * BT * s->width, block_table[(size_t)sd->first[g] * max_blocks + b], nb);
    }
    free(task);
}

static void shared_free(SharedDecode *sd) {
    for (int j = 0; j < 3; j++) {
        for (int g = 0; sd->dec[j] && g < sd->n_groups; g++) free(sd->dec[j][g]);
        free(sd->dec[j]);
    }
    free(sd->group_of);
    free(sd->first);
    free(sd->len);
}

// Row pointers of tokens [t0, t0 + nt) of a group's decoded stream.
static void shared_rows(const float *dec, int width, int t0, int nt, const uint8_t **row) {
    for (int j = 0; j < nt; j++) row[j] = (const uint8_t *)(dec + (size_t)(t0 + j) * width);
}

// Tokens [t0, t0 + nt) of stream j (k, v, k2 as in decoded[]) as an fp32 matrix: the group's
// shared decoded copy where it has one, else the chunk's blocks made fp32 in buf (chunk_matrix).
static const float *chunk_fp32(const SharedDecode *sd, const PagedStream *const decoded[3], int j, int grp,
                               const PagedStream *s, const int *blocks, int t0, int nt, float *buf) {
    return grp >= 0 && decoded[j] ? sd->dec[j][grp] + (size_t)t0 * s->width : chunk_matrix(s, blocks, nt, buf);
}

// Rows [0, n) of a stream read in place, asked into L2 (prefetcht1) ahead of their use: a tile
// reads each of its rows in head-sized pieces, one head after another, a stride the hardware
// prefetchers do not follow past a page, and perf put most of a step on the loads' stalls. The
// scores pass asks for the next tile's keys (unless the chunk's keys were asked for during the
// last chunk's values pass) and for this tile's values, so that the values pass finds its rows
// in L2 (L1, prefetcht0, measured slower: a tile's keys are already most of it).
// The requests are spread over the tile's heads, a share before each head's products: asked all
// at once (an MHA tile's 512 lines) they filled the core's miss buffers, the prefetch
// instructions waited for free ones (30% of the kernel's samples sat on them under perf), and no
// product ran meanwhile (docs/INFERENCE.md). Always inlined: a function of prefetches alone is
// dropped by GCC at -O2 where it is not inlined (layers/cpu_matmul.c, prefetch_weight;
// tests/test_prefetch_kept.sh counts the instructions).
static inline __attribute__((always_inline)) void prefetch_rows(const PagedStream *s, const uint8_t *const *row, int n) {
    if (!s || !read_in_place(s)) return;
    for (int j = 0; j < n; j++) prefetch_bytes(row[j], s->token_bytes);
}

// Tokens [t0, t1) of a chunk (its blocks) of a stream of fixed-size tokens (read in place, or a
// codec's bytes that chunk_matrix will decode), asked into L2: the next item's keys, during this
// item's values pass or its products (prefetch_rows says why always inlined)
static inline __attribute__((always_inline)) void prefetch_tokens(const PagedStream *s, const int *blocks, int t0, int t1) {
    if (!s || !s->token_bytes || t0 >= t1) return;
    const int BT = s->block_tokens;
    for (int b = t0 / BT; b * BT < t1; b++) {
        const int a = t0 > b * BT ? t0 - b * BT : 0, e = t1 < (b + 1) * BT ? t1 - b * BT : BT;
        prefetch_bytes(s->blocks[blocks[b]] + (size_t)a * s->token_bytes, (size_t)(e - a) * s->token_bytes);
    }
}

// The next item's key streams (k and k2, either NULL; none when blocks is NULL), asked into L2 in
// `pieces` equal shares of its nt tokens, one share before each step of this item's work
typedef struct Ahead {
    const PagedStream *k, *k2;
    const int *blocks;
    int nt, piece, pieces;
} Ahead;

static inline __attribute__((always_inline)) void ahead_share(Ahead *a) {
    if (!a->blocks || a->piece >= a->pieces) return;
    const int t0 = (int)((long long)a->nt * a->piece / a->pieces), t1 = (int)((long long)a->nt * (a->piece + 1) / a->pieces);
    a->piece++;
    prefetch_tokens(a->k, a->blocks, t0, t1);
    prefetch_tokens(a->k2, a->blocks, t0, t1);
}

// the next work item's index, shared counter *next (items past the last mean none left)
static int claim_item(int *next) {
    int it;
    #pragma omp atomic capture
    it = (*next)++;
    return it;
}

// ---- groups of GEMM_GROUP or more query heads per kv head whose keys and values a codec decodes
// into fp32 scratch anyway (CLLA-quant's int4 latent: 8 heads on one latent in the absorbed form;
// MQA or GQA over a codec): the chunk's products through OpenBLAS's small-matrix kernels,
// S_g (group, nt) = scale Q_g K_g^T (+ Q2_g K2^T), O_g += P_g V_g, GEMM_TOKENS tokens a call (for 8
// heads and widths up to 976, M N K under CPU_SGEMM_SMALL_MNK, layers/cpu_ops.h: OpenBLAS reads
// the operands where they lie, without packing). Against
// the tiles below, CLLA-quant's 16k batch-8 decode step went from 108-113 to 93-96 ms; over a
// bf16 cache (MLA, CLLA, MQA), where the chunk must first be widened, it was level or slower, so
// those keep the tiles (docs/INFERENCE.md has the commands). The next item's key bytes are asked
// for a share before each product (ahead_share), so that its decode finds them in L2: chunk_matrix's
// one block ahead was shorter than a load's wait for the rope key's small blocks (perf: half of
// chunk_matrix's own time on one load; with the shares, int_group_decode and chunk_matrix went
// from 22% to 16% of CLLA-quant's step).
#define GEMM_GROUP 8
#define GEMM_TOKENS 128

// S (rows, nt; lds) = alpha A (rows, K; lda) B^T, B (nt, K; ldb), or += when acc
static void gemm_scores(Ahead *ah, float *S, int lds, const float *A, int lda, const float *B, int ldb, int rows, int nt, int K, float alpha,
                        int acc) {
    for (int t0 = 0; t0 < nt; t0 += GEMM_TOKENS) {
        ahead_share(ah);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nt - t0 < GEMM_TOKENS ? nt - t0 : GEMM_TOKENS, K, alpha, A, lda,
                    B + (size_t)t0 * ldb, ldb, acc ? 1.0f : 0.0f, S + t0, lds);
    }
}

// O (rows, N; ldo) = P (rows, nt; ldp) V, V (nt, N; ldv), the tokens in order (O is written by the
// first GEMM_TOKENS, then added to: it need not be zeroed)
static void gemm_values(Ahead *ah, float *O, int ldo, const float *P, int ldp, const float *V, int ldv, int rows, int nt, int N) {
    for (int t0 = 0; t0 < nt; t0 += GEMM_TOKENS) {
        ahead_share(ah);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, N, nt - t0 < GEMM_TOKENS ? nt - t0 : GEMM_TOKENS, 1.0f,
                    P + t0, ldp, V + (size_t)t0 * ldv, ldv, t0 ? 1.0f : 0.0f, O, ldo);
    }
}

// Tokens of the tile that starts at token t of a chunk of nt: TILE_TOKENS, fewer at the end, 0 past it
static inline int tile_len(int nt, int t) { return nt - t < TILE_TOKENS ? (nt > t ? nt - t : 0) : TILE_TOKENS; }

// o[0..n) += w x[0..n), each element one fused multiply-add, in vectors
static void add_scaled(float *o, float w, const float *x, int n) {
    const vecf wv = vec_splat(w);
    int d = 0;
    for (; d + VEC_LANES <= n; d += VEC_LANES) vec_store(o + d, vec_fma(wv, vec_load(x + d), vec_load(o + d)));
    for (; d < n; d++) o[d] = fmaf(w, x[d], o[d]);
}

static Part part_of(const PagedStream *s, const uint8_t *const *row, int first, int n) {
    const int bf16 = s->kind == PAGED_BF16;
    return (Part){row, (size_t)first * (bf16 ? 2 : 4), n, bf16};
}

void cpu_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                         const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                         int n, int NH, int NKV, int DK, int DK2, int DV, float scale) {
    const int BT = k->block_tokens, group = NH / NKV, DQ = DK + DK2, same_v = v == k, k_scored = k->score != NULL;
    const int k2_scored = k2 && k2->score != NULL;
    // four heads of a group scored together (scores_quad) where the key parts have no scalar tails
    const int quad = whole_steps(k_scored ? NULL : k, DK) && whole_steps(k2_scored ? NULL : k2, DK2);
    // GEMM_GROUP query heads or more per kv head, keys and values decoded into fp32 scratch
    // anyway (a codec, as CLLA-quant's int4 latent), no scored stream: the products through sgemm
    const int gemm = group >= GEMM_GROUP && !read_in_place(k) && (same_v || !read_in_place(v)) && !k_scored && !k2_scored;
    // bytes a token brings (decoded streams count their fp32 scratch)
    size_t token = 0;
    for (int j = 0; j < 3; j++) {
        const PagedStream *s = j == 0 ? k : j == 1 ? (same_v ? NULL : v) : k2;
        if (s) token += read_in_place(s) ? s->token_bytes : (size_t)s->width * sizeof(float);
    }
    const size_t fit = CHUNK_BYTES / (token * (size_t)BT + 1);
    const int chunk_blocks = fit < 1 ? 1 : fit > MAX_CHUNK_BLOCKS ? MAX_CHUNK_BLOCKS : (int)fit, CT = chunk_blocks * BT;
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
    // streams decoded here (not read in place, not scored): shared by the rows of one sequence
    const PagedStream *decoded[3] = {decoded_here(k, k_scored && !same_v) ? k : NULL, !same_v && decoded_here(v, 0) ? v : NULL,
                                     decoded_here(k2, k2_scored) ? k2 : NULL};
    SharedDecode sd;
    shared_decode(&sd, decoded, block_table, max_blocks, lens, n);
    // a scored key stream: every query head prepared once for all its blocks
    double *prep = k_scored ? prepare_queries(k, q, n * NH, DQ, 0) : NULL;
    double *prep2 = k2_scored ? prepare_queries(k2, q, n * NH, DQ, DK) : NULL;
    // per item and query head: row max, row sum, (DV) weighted values
    const size_t per_item = (size_t)NH * (2 + DV);
    // (not zeroed here: each item zeroes its own accumulators, in parallel and into its cache)
    float *state = xmalloc((size_t)(n_items ? n_items : 1) * per_item * sizeof(float));

    // every query head laid out for its parts (query_for) once, for all the chunks it meets
    float *qlay = xmalloc(((size_t)n * NH * DQ + 1) * sizeof(float));
    for (int ih = 0; !gemm && ih < n * NH; ih++) {
        const Part kp = part_of(k, NULL, 0, DK);
        query_for(qlay + (size_t)ih * DQ, q + (size_t)ih * DQ, &kp);
        if (k2) {
            const Part kp2 = part_of(k2, NULL, 0, DK2);
            query_for(qlay + (size_t)ih * DQ + DK, q + (size_t)ih * DQ + DK, &kp2);
        }
    }

    int next_item = 0;   // the next item not yet claimed (claim_item)
    #pragma omp parallel
    {
        int claimed_keys = -1;   // the item whose keys this thread asked for ahead
        // per thread: decoded chunks of codec streams, the chunk's row pointers and the scores
        float *kbuf = read_in_place(k) ? NULL : xmalloc((size_t)CT * k->width * sizeof(float));
        float *vbuf = same_v || read_in_place(v) ? NULL : xmalloc((size_t)CT * v->width * sizeof(float));
        float *k2buf = !k2 || read_in_place(k2) ? NULL : xmalloc((size_t)CT * k2->width * sizeof(float));
        const uint8_t **rows = xmalloc((size_t)3 * CT * sizeof(*rows));
        const uint8_t **krow = rows, **vrow = same_v ? rows : rows + CT, **k2row = rows + 2 * CT;
        float *sc = xmalloc((size_t)(NH + 1) * CT * sizeof(float));   // + one row of a scored stream's raw scores
        // the gemm path's fp32 rope key (its keys and values are decoded into kbuf and vbuf)
        float *gk2 = gemm && k2 && read_in_place(k2) ? xmalloc((size_t)CT * k2->width * sizeof(float)) : k2buf;
        // items handed out one at a time (as schedule(dynamic, 1)), each thread claiming its next
        // one when it starts the current, so that the values pass can ask for the next item's keys
        for (int it = claim_item(&next_item), next; it < n_items; it = next) {
            next = claim_item(&next_item);
            const int i = item_seq[it], chunk = it - first_item[i];
            const int t0 = chunk * CT, nt = lens[i] - t0 < CT ? lens[i] - t0 : CT;
            const int *blocks = block_table + (size_t)i * max_blocks + chunk * chunk_blocks;
            // this item's keys asked for during the last one's values pass (then the scores pass
            // asks for its values only), and the next item's, when this thread has one
            const int primed = claimed_keys == it;
            const int *nblocks = NULL;
            int nnt = 0;
            if (next < n_items) {
                const int ni = item_seq[next], nchunk = next - first_item[ni];
                nblocks = block_table + (size_t)ni * max_blocks + nchunk * chunk_blocks;
                nnt = lens[ni] - nchunk * CT < CT ? lens[ni] - nchunk * CT : CT;
                claimed_keys = next;
            }
            // the next item's keys go in equal shares, one before each head step of the values pass
            // and, where the values are the keys' stream (the scores pass asks for no values), of the
            // scores pass too: a burst of the whole tile's lines filled the miss buffers (prefetch_rows)
            const int tiles = (nt + TILE_TOKENS - 1) / TILE_TOKENS;
            const int score_steps = same_v ? NKV * score_steps_of(group, quad) : 0;   // score kernel calls a tile
            Ahead ah = {k_scored ? NULL : k, k2_scored ? NULL : k2, nblocks, nnt, 0,
                        tiles * (score_steps + NKV * ((group + VALUE_HEADS - 1) / VALUE_HEADS))};
            float *st = state + (size_t)it * per_item;
            const int grp = sd.group_of[i];
            if (gemm) {   // keys and values decoded: the products through sgemm
                const float *K = chunk_fp32(&sd, decoded, 0, grp, k, blocks, t0, nt, kbuf);
                const float *V = same_v ? K : chunk_fp32(&sd, decoded, 1, grp, v, blocks, t0, nt, vbuf);
                const float *K2 = k2 ? chunk_fp32(&sd, decoded, 2, grp, k2, blocks, t0, nt, gk2) : NULL;
                const float *qi = q + (size_t)i * NH * DQ;
                // here one share before each product (the streams are neither scored nor read in place)
                ah.pieces = NKV * ((nt + GEMM_TOKENS - 1) / GEMM_TOKENS) * (2 + (k2 != NULL));
                for (int g = 0; g < NKV; g++) {
                    float *sg = sc + (size_t)g * group * CT;
                    const float *qg = qi + (size_t)g * group * DQ;
                    gemm_scores(&ah, sg, CT, qg, DQ, K + (size_t)g * DK, k->width, group, nt, DK, scale, 0);
                    if (k2) gemm_scores(&ah, sg, CT, qg + DK, DQ, K2, k2->width, group, nt, DK2, scale, 1);
                }
                softmax_rows(st, sc, CT, NH, nt);
                for (int g = 0; g < NKV; g++)   // acc: written by the first tokens' product
                    gemm_values(&ah, st + 2 * NH + (size_t)g * group * DV, DV, sc + (size_t)g * group * CT, CT, V + (size_t)g * DV,
                                same_v ? k->width : v->width, group, nt, DV);
                continue;
            }
            memset(st + 2 * NH, 0, (size_t)NH * DV * sizeof(float));   // the tiles add to acc
            // keys, or the values they share a stream with; a group's decoded copy where it has one
            if (grp >= 0 && decoded[0]) shared_rows(sd.dec[0][grp], k->width, t0, nt, krow);
            else if (!k_scored || same_v) chunk_rows(k, blocks, nt, kbuf, krow);
            if (grp >= 0 && decoded[1]) shared_rows(sd.dec[1][grp], v->width, t0, nt, vrow);
            else if (!same_v) chunk_rows(v, blocks, nt, vbuf, vrow);
            if (grp >= 0 && decoded[2]) shared_rows(sd.dec[2][grp], k2->width, t0, nt, k2row);
            else if (k2 && !k2_scored) chunk_rows(k2, blocks, nt, k2buf, k2row);
            // the chunk is walked token-major, TILE_TOKENS rows at a time for every head (the rows
            // stay in L1 while the heads that share them are scored; memory is read front to back)
            const float *qk = qlay + (size_t)i * NH * DQ;
            for (int ta = 0; ta < nt; ta += TILE_TOKENS) {
                const int m = tile_len(nt, ta);
                const Part none = {NULL, 0, 0, 0};   // a scored key stream has no part here
                const Part kp2 = k2 && !k2_scored ? part_of(k2, k2row + ta, 0, DK2) : none;
                const int ahead = tile_len(nt, ta + m);   // the next tile's rows
                for (int h = 0; h < NH;) {
                    // heads of one kv head scored together: four (scores_quad), two (scores_pair)
                    const int heads = score_heads(group, h % group, quad), h1 = h + heads;
                    // the prefetches spread over the heads, a share before each
                    const int a0 = ahead * h / NH, a1 = ahead * h1 / NH, v0 = m * h / NH, v1 = m * h1 / NH;
                    if (!k_scored && !primed) prefetch_rows(k, krow + ta + m + a0, a1 - a0);
                    if (k2 && !k2_scored && !primed) prefetch_rows(k2, k2row + ta + m + a0, a1 - a0);
                    if (!same_v) prefetch_rows(v, vrow + ta + v0, v1 - v0);
                    else ahead_share(&ah);
                    const Part kp = k_scored ? none : part_of(k, krow + ta, (h / group) * DK, DK);
                    const float *qa = qk + (size_t)h * DQ;
                    if (heads == 4) {
                        float *const sq[4] = {sc + (size_t)h * CT + ta, sc + (size_t)(h + 1) * CT + ta, sc + (size_t)(h + 2) * CT + ta,
                                              sc + (size_t)(h + 3) * CT + ta};
                        const float *const qq[4] = {qa, qa + DQ, qa + 2 * DQ, qa + 3 * DQ};
                        const float *const qq2[4] = {qa + DK, qa + DQ + DK, qa + 2 * DQ + DK, qa + 3 * DQ + DK};
                        scores_quad(sq, qq, qq2, &kp, &kp2, m, scale);
                    } else if (heads == 2)
                        scores_pair(sc + (size_t)h * CT + ta, sc + (size_t)(h + 1) * CT + ta, qa, qa + DQ, &kp, qa + DK, qa + DQ + DK,
                                    &kp2, m, scale);
                    else
                        scores(sc + (size_t)h * CT + ta, qa, &kp, qa + DK, &kp2, m, scale);
                    h = h1;
                }
            }
            // the codecs' scores of scored key parts, block by block, added scaled (the rope key is
            // one head for all query heads)
            for (int h = 0; h < NH; h++) {
                const size_t ih = (size_t)i * NH + h;
                if (k_scored) add_scored(sc + (size_t)h * CT, sc + (size_t)NH * CT, k, q + ih * DQ, prep + ih * k->prep_doubles, h / group, blocks, nt, scale);
                if (k2_scored) add_scored(sc + (size_t)h * CT, sc + (size_t)NH * CT, k2, q + ih * DQ + DK, prep2 + ih * k2->prep_doubles, 0, blocks, nt, scale);
            }
            softmax_rows(st, sc, CT, NH, nt);
            float *acc = st + 2 * NH;   // (NH, DV), zeroed above (memset)
            for (int ta = 0; ta < nt; ta += TILE_TOKENS) {
                const int m = tile_len(nt, ta), ahead = tile_len(nt, ta + m);
                for (int g = 0; g < NKV; g++) {
                    prefetch_rows(v, vrow + ta + m + ahead * g / NKV, ahead * (g + 1) / NKV - ahead * g / NKV);
                    const Part vp = part_of(v, vrow + ta, g * DV, DV);
                    for (int r = 0; r < group; r += VALUE_HEADS) {
                        const int h = g * group + r;
                        ahead_share(&ah);
                        weighted_values(acc + (size_t)h * DV, DV, sc + (size_t)h * CT + ta, CT,
                                        group - r < VALUE_HEADS ? group - r : VALUE_HEADS, &vp, m);
                    }
                }
            }
            if (v->kind == PAGED_BF16)
                for (int h = 0; h < NH; h++) unsplit_values(acc + (size_t)h * DV, DV);
        }
        if (gk2 != k2buf) free(gk2);
        free(kbuf);
        free(vbuf);
        free(k2buf);
        free(rows);
        free(sc);
    }

    // merge the chunks of each (sequence, head) in order; the pairs in parallel (a batch of one
    // has NH of them), each row's sums in vectors (element d's order is the chunks')
    #pragma omp parallel for schedule(static) if (n * NH > 1)
    for (int ih = 0; ih < n * NH; ih++) {
        const int i = ih / NH, h = ih % NH;
        float mx = -INFINITY;
        for (int it = first_item[i]; it < first_item[i + 1]; it++) {
            const float m = state[(size_t)it * per_item + h];
            mx = m > mx ? m : mx;
        }
        float *o = out + (size_t)ih * DV, l = 0.0f;
        memset(o, 0, (size_t)DV * sizeof(float));
        for (int it = first_item[i]; it < first_item[i + 1]; it++) {
            const float *st = state + (size_t)it * per_item;
            const float w = expf(st[h] - mx);
            l += w * st[NH + h];
            add_scaled(o, w, st + 2 * NH + (size_t)h * DV, DV);
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        int d = 0;
        for (; d + VEC_LANES <= DV; d += VEC_LANES) vec_store(o + d, vec_load(o + d) * vec_splat(inv));
        for (; d < DV; d++) o[d] *= inv;
    }
    free(qlay);
    free(state);
    shared_free(&sd);
    free(prep);
    free(prep2);
    free(item_seq);
    free(first_item);
}
