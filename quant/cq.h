// CQ, coupled quantization (docs/QUANTIZERS.md "CQ"): every c contiguous channels of a d-wide
// K or V vector form a group that shares one b-bit code, an index into that group's codebook of
// 2^b centroids in R^c learned by (Fisher-weighted) k-means with k-means++ seeding. No scales,
// zero points, outliers or windows: a token is G = d/c codes. Keys are meant to be quantized
// before RoPE (the caller applies RoPE to decoded keys).
//
// Byte layout of one token (cq_encode): the G codes as a little-endian bitstream (quant/bitpack.h),
// code of group 0 first, in ceil(G b / 8) bytes; tokens follow each other, each starting on a byte.
// The codebook (cq_codebook_write): G * 2^b * c fp16 values, little-endian, ordered
// [group][entry][channel within the group].
#ifndef CLLA_QUANT_CQ_H
#define CLLA_QUANT_CQ_H

#include <stddef.h>
#include <stdint.h>

typedef struct CqSettings {
    int dim;        // d: channels per vector (a head's K or V)
    int c;          // channels coupled per code; divides dim
    int bits;       // b: bits per code, 2^b centroids per group (1..12)
    int iters;      // Lloyd iterations (paper: 100)
    uint64_t seed;  // k-means++ seeding
} CqSettings;

#define CQ_MAX_BITS 12

// CQ-4c8b (2 bits per element, the paper's ablation and Table 1 middle row), 100 iterations.
CqSettings cq_settings_default(int dim);
// 0, or -1 with one line in err naming the bad setting and the accepted values.
int cq_settings_check(const CqSettings *s, char *err, size_t errlen);

typedef struct CqState {
    CqSettings s;
    int groups;         // G = dim / c
    int entries;        // 2^b
    float *codebook;    // [groups][entries][c], every value exactly an fp16
} CqState;

// Fits the codebooks to n calibration vectors x[n][dim]. fisher[n][dim] (may be NULL: uniform,
// the paper's Eq. 5) holds the diagonal Fisher information (squared gradients of the loss) of
// every element; the weight of a group's sample is the sum over its c channels (Eq. 6).
// 0, or -1 with one line in err: bad settings, n < 2^b (a calibration set smaller than the
// codebook), non-finite data, negative or non-finite Fisher values, centroids beyond fp16.
int cq_fit(CqState *st, const CqSettings *s, const float *x, int64_t n, const float *fisher,
           char *err, size_t errlen);
void cq_free(CqState *st);

// Bytes one token takes: ceil(G b / 8).
int64_t cq_bytes_per_token(const CqSettings *s);
// out[n * cq_bytes_per_token] <- codes of x[n][dim]: each group's nearest centroid (L2, the
// lowest index on a tie). Returns the bytes written, or -1 when the size overflows.
int64_t cq_encode(const CqState *st, const float *x, int64_t n, uint8_t *out);
// x[n][dim] <- the centroids the codes name.
void cq_decode(const CqState *st, const uint8_t *codes, int64_t n, float *x);
// One code of one token (for the attention paths that read codes directly).
int cq_code(const CqState *st, const uint8_t *codes, int64_t token, int group);

// Attention over values without decoding them: out[dim] = sum_j p[j] v_j with v_j the decoded
// token j, computed as a histogram of the probabilities per (group, code) and one pass over the
// codebook (cheaper than decoding once n >> 2^b). hist: scratch of groups * entries doubles.
void cq_weighted_sum(const CqState *st, const uint8_t *codes, int64_t n, const float *p,
                     double *hist, float *out);

// Codebook storage: bytes, writing it out, and reading it back (refused with one line when
// the size does not match the settings or a value is not finite).
int64_t cq_codebook_bytes(const CqSettings *s);
void cq_codebook_write(const CqState *st, uint8_t *out);
int cq_codebook_read(CqState *st, const CqSettings *s, const uint8_t *buf, int64_t nbytes,
                     char *err, size_t errlen);

// Bits per element counting everything stored: the codes of `tokens` tokens (with the byte
// padding of every token record) plus one codebook, amortized over those tokens.
double cq_bits_everything(const CqSettings *s, int64_t tokens);
// The paper's convention (its A3): b / c, codebooks and padding excluded.
double cq_bits_paper(const CqSettings *s);
// Centroid parameters of a whole model (Table 5): layers * 2 (K, V) * kv_heads * dim * 2^b.
int64_t cq_centroid_params(int64_t layers, int64_t kv_heads, int64_t dim, int bits);

// The entropy diagnostic (Fig. 1): each of the dim channels cut into `bins` equal-width bins over
// its range in x; returns the joint entropy in bits of the bins of channels [ch0, ch0 + c), from
// the empirical frequencies (bins^c <= 2^20). -1 on bad arguments.
double cq_joint_entropy(const float *x, int64_t n, int dim, int ch0, int c, int bins);

#endif
