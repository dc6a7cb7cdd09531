// Eight-lane float vectors (GCC/Clang vector extensions: AVX with -march=native, pairs of SSE
// registers or NEON otherwise) for the CPU kernels of layers/ (the decode-time kernels,
// layers/cpu_matmul.c and layers/cpu_paged_attention.c; the exponentials of the attention,
// SwiGLU and cross-entropy) and the cache codecs' decode (model/cache.c): in common/ so that
// both may include it (tests/test_layering.sh). The decode-time kernels are compiled with
// -ffp-contract=fast (CMakeLists.txt), so a += b * c is one fused multiply-add, as in
// OpenBLAS's kernels.
// Every reduction here has a fixed order: results never depend on threads or batch neighbours.
#ifndef CLLA_COMMON_VEC_H
#define CLLA_COMMON_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define VEC_LANES 8
typedef float vecf __attribute__((vector_size(VEC_LANES * sizeof(float))));
// the same vector at any float address (unaligned, and allowed to alias float arrays)
typedef float vecf_u __attribute__((vector_size(VEC_LANES * sizeof(float)), aligned(4), may_alias));

static inline vecf vec_load(const float *p) { return *(const vecf_u *)p; }
static inline void vec_store(float *p, vecf v) { *(vecf_u *)p = v; }
static inline vecf vec_splat(float x) { return (vecf){x, x, x, x, x, x, x, x}; }

typedef int32_t veci __attribute__((vector_size(VEC_LANES * sizeof(int32_t))));

// lane i: a[i] where mask[i] (all ones), else b[i]; masks come from vector comparisons
static inline vecf vec_select(veci mask, vecf a, vecf b) { return (vecf)(((veci)a & mask) | ((veci)b & ~mask)); }

// a * b + c rounded once, and lane i: a[i] > b[i] ? a[i] : b[i], in one instruction each where
// the target has them (x86-64 with FMA and AVX: -march=native or x86-64-v3, CMakeLists.txt).
// Written out, not left to -ffp-contract: C11's a * b + c is unfused in the files that keep it
// (CMakeLists.txt), and the polynomial of vec_exp below is a chain of multiply-adds whose
// latency doubled unfused (docs/ATTENTION.md). Elsewhere: a * b + c (fused where the file is
// contracted) and a compare with a select, the same values up to the fused rounding.
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
static inline vecf vec_fma(vecf a, vecf b, vecf c) { return (vecf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline vecf vec_max(vecf a, vecf b) { return (vecf)_mm256_max_ps((__m256)a, (__m256)b); }
#else
static inline vecf vec_fma(vecf a, vecf b, vecf c) { return a * b + c; }
static inline vecf vec_max(vecf a, vecf b) { return vec_select(a > b, a, b); }
#endif

// the lanes summed pairwise
static inline float vec_sum(vecf a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// max(init, x[0], ..., x[n-1]) as the loop `m = x[j] > m ? x[j] : m` gives it (NaNs skipped), 8
// lanes at a time: GCC keeps that loop scalar without -ffinite-math-only, one dependent vmaxss per
// element, which was most of the attention forward's own time (docs/ATTENTION.md). A maximum has
// no rounding, so the lane order does not change the result.
static inline float vec_max_of(const float *x, int n, float init) {
    vecf m = vec_splat(init);
    int j = 0;
    for (; j + VEC_LANES <= n; j += VEC_LANES) {
        m = vec_max(vec_load(x + j), m);
    }
    float r = init;
    for (int i = 0; i < VEC_LANES; i++) r = m[i] > r ? m[i] : r;
    for (; j < n; j++) r = x[j] > r ? x[j] : r;
    return r;
}

// Lane j of the result = vec_sum(a_j) (the same pairs, the same order), in 12 shuffles and 7
// adds instead of eight separate sums.
static inline vecf vec_sum8(vecf a0, vecf a1, vecf a2, vecf a3, vecf a4, vecf a5, vecf a6, vecf a7) {
    // (GCC 12 and Clang both have __builtin_shufflevector; indices >= 8 pick from the second)
#define LO(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11)
#define HI(a, b) __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15)
#define EVEN(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#define ODD(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
    // step 1: lanes i and i + 4 of each vector (vec_sum's innermost pairs)
    vecf b01 = LO(a0, a1) + HI(a0, a1), b23 = LO(a2, a3) + HI(a2, a3);
    vecf b45 = LO(a4, a5) + HI(a4, a5), b67 = LO(a6, a7) + HI(a6, a7);
    // step 2: (0+4) + (1+5) and (2+6) + (3+7) of each: a0's pair, a1's pair, ...
    vecf c0123 = EVEN(b01, b23) + ODD(b01, b23), c4567 = EVEN(b45, b67) + ODD(b45, b67);
    // step 3: the two halves of each
    return EVEN(c0123, c4567) + ODD(c0123, c4567);
#undef LO
#undef HI
#undef EVEN
#undef ODD
}

// e^x per lane, within 2 ulp of expf for x in [-87, 88] (tests/test_ops.c); 0 below -87.33,
// e^88 above 88
// (under the smallest normal float), NaN stays NaN. Range reduction x = n ln2 + r, |r| <= ln2/2,
// then Cephes's degree-6 polynomial for e^r and 2^n from the exponent bits. Decoding's softmax
// takes one exponential per cached token and query head: glibc's scalar expf was a tenth of a
// decode step, and its vector form is only reachable with -ffast-math.
static inline vecf vec_exp(vecf x) {
    const vecf lo = vec_splat(-87.33654f), hi = vec_splat(88.0f);   // above 88, 2^n would overflow
    veci under = x < lo;
    vecf xc = vec_select(under, lo, x);
    xc = vec_select(xc > hi, hi, xc);
    const vecf shifter = vec_splat(12582912.0f);   // 1.5 * 2^23: adding it rounds to an integer
    vecf n = vec_fma(xc, vec_splat(1.44269504088896341f), shifter) - shifter;
    vecf r = vec_fma(n, vec_splat(-0.693359375f), xc);
    r = vec_fma(n, vec_splat(2.12194440e-4f), r);
    vecf p = vec_splat(1.9875691500E-4f);
    p = vec_fma(p, r, vec_splat(1.3981999507E-3f));
    p = vec_fma(p, r, vec_splat(8.3334519073E-3f));
    p = vec_fma(p, r, vec_splat(4.1665795894E-2f));
    p = vec_fma(p, r, vec_splat(1.6666665459E-1f));
    p = vec_fma(p, r, vec_splat(5.0000001201E-1f));
    vecf y = vec_fma(p, r * r, r) + vec_splat(1.0f);
    veci e = (__builtin_convertvector(n, veci) + 127) << 23;   // 2^n; n in [-126, 128)
    vecf two_n = (vecf)e;
    return (vecf)((veci)(y * two_n) & ~under);
}

// x[j] = e^(x[j] - shift) for j < n (-inf gives 0), 8 lanes at a time, the tail through one
// vector padded with -inf; returns their sum in a fixed order (lanes accumulated, then vec_sum).
// The softmax numerators of the attention ops, training (layers/cpu_attention.c) and decoding
// (layers/cpu_paged_attention.c).
static inline float vec_exp_shifted(float *x, int n, float shift) {
    const vecf sh = vec_splat(shift);
    vecf acc = vec_splat(0.0f);
    int j = 0;
    for (; j + VEC_LANES <= n; j += VEC_LANES) {
        vecf e = vec_exp(vec_load(x + j) - sh);
        vec_store(x + j, e);
        acc += e;
    }
    if (j < n) {
        float t[VEC_LANES];
        for (int i = 0; i < VEC_LANES; i++) t[i] = j + i < n ? x[j + i] : -INFINITY;
        vecf e = vec_exp(vec_load(t) - sh);
        acc += e;
        for (int i = 0; j + i < n; i++) x[j + i] = e[i];
    }
    return vec_sum(acc);
}

// n bf16 values (their 16 bits, little-endian) -> fp32, exact: widened 8 at a time
static inline void vec_bf16_to_f32(float *restrict dst, const uint8_t *restrict src, int n) {
    typedef uint16_t vec16 __attribute__((vector_size(VEC_LANES * sizeof(uint16_t)), aligned(1), may_alias));
    typedef uint32_t vec32 __attribute__((vector_size(VEC_LANES * sizeof(uint32_t))));
    int j = 0;
    for (; j + VEC_LANES <= n; j += VEC_LANES) {
        vec32 u = __builtin_convertvector(*(const vec16 *)(src + 2 * (size_t)j), vec32) << 16;
        vecf f;
        memcpy(&f, &u, sizeof f);
        vec_store(dst + j, f);
    }
    for (; j < n; j++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)j, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(dst + j, &u, 4);
    }
}

// n 4-bit two's-complement codes (two a byte, low nibble first; n even) times scale -> fp32:
// 16 at a time, by table. The 16 values a code can take, (float)c * scale for c = 0..7 and
// -8..-1, are two vectors made once per call; lane i of a step's first vector holds byte i / 2
// (a byte shuffle copies it into all four bytes of the lane) shifted right by 4 for odd i, so
// its low four bits are element i's code, and a two-table lane permute (vpermi2ps, which reads
// only those four bits) picks its value. Without AVX-512VL (no such permute) the code is
// sign-extended from those bits and multiplied: the same product. The products are those of
// the scalar form bit for bit (tests/test_ops.c). It replaced a sign-extending shift, a
// conversion, a multiply and an interleave per half (bench_codec's int4 decode against copy,
// and the decode step, in docs/INFERENCE.md, "The int4 decode by table").
static inline void vec_int4_to_f32(float *restrict dst, const uint8_t *restrict src, int n, float scale) {
    _Static_assert(VEC_LANES == 8, "the byte masks below are written for 8 lanes of 32 bits");
    typedef uint8_t vecb __attribute__((vector_size(4 * VEC_LANES)));
    typedef uint64_t vecq __attribute__((vector_size(4 * VEC_LANES)));
    typedef uint32_t vecu32 __attribute__((vector_size(VEC_LANES * sizeof(uint32_t))));
    const vecf s = vec_splat(scale);
#if defined(__AVX512VL__) && defined(__FMA__)   // immintrin.h is included above
#define I4_TABLE 1
    const vecf pos = (vecf){0, 1, 2, 3, 4, 5, 6, 7} * s, neg = (vecf){-8, -7, -6, -5, -4, -3, -2, -1} * s;
#else
#define I4_TABLE 0
#endif
    const vecu32 odd_high = {0, 4, 0, 4, 0, 4, 0, 4};
    // byte b of the step's 8 sits at b and at 8 + b of each 16-byte half; lanes 0-3 of the first
    // vector take bytes 0, 0, 1, 1, lanes 4-7 bytes 2, 2, 3, 3; the second vector bytes 4 to 7
#define I4_FIRST 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 18, 18, 18, 18, 18, 18, 18, 18, 19, 19, 19, 19, 19, 19, 19, 19
#define I4_SECOND 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 22, 22, 22, 22, 22, 22, 22, 22, 23, 23, 23, 23, 23, 23, 23, 23
    int j = 0;
    for (; j + 2 * VEC_LANES <= n; j += 2 * VEC_LANES) {
        uint64_t w;
        memcpy(&w, src + j / 2, sizeof w);
        const vecb b = (vecb)(vecq){w, w, w, w};
        const vecu32 c0 = (vecu32)__builtin_shufflevector(b, b, I4_FIRST) >> odd_high;
        const vecu32 c1 = (vecu32)__builtin_shufflevector(b, b, I4_SECOND) >> odd_high;
#if I4_TABLE
        // the permute reads bits 0-3 of each lane: the bytes above need no mask
        vec_store(dst + j, (vecf)_mm256_permutex2var_ps((__m256)pos, (__m256i)c0, (__m256)neg));
        vec_store(dst + j + VEC_LANES, (vecf)_mm256_permutex2var_ps((__m256)pos, (__m256i)c1, (__m256)neg));
#else
        // no two-table permute: the code sign-extended from bits 0-3 and multiplied, the same
        // product as the table's entry
        vec_store(dst + j, __builtin_convertvector((veci)(c0 << 28) >> 28, vecf) * s);
        vec_store(dst + j + VEC_LANES, __builtin_convertvector((veci)(c1 << 28) >> 28, vecf) * s);
#endif
    }
#undef I4_FIRST
#undef I4_SECOND
#undef I4_TABLE
    for (; j < n; j += 2) {
        const uint8_t b = src[j / 2];
        dst[j] = (float)((int8_t)(uint8_t)(b << 4) >> 4) * scale;
        dst[j + 1] = (float)((int8_t)b >> 4) * scale;
    }
}

#endif
