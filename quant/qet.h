// QET, quantum entanglement trees (docs/QUANTIZERS.md "QET"): a row-local swap tree permutes each
// vector (l levels of min/max pairing of adjacent columns, one flag bit per pair and level), the
// permuted vectors are product-quantized in column groups (one k-means codebook of K entries per
// group), the codebook itself is quantized to a' bits with one global minimum and step (CQO), and
// further stages quantize the residual without swapping (RQO). Decoding looks the codes up, undoes
// the permutation exactly from the flags, and adds the stages.
//
// Rows are tokens, so a fitted state encodes new tokens one at a time (the swap and the
// nearest-centroid search are row-local). Byte layout of one row (qet_encode), a little-endian
// bitstream (quant/bitpack.h) padded to a whole byte:
//   [stage-1 flags: levels * dim/2 bits; level 1 first, within a level the blocks left to right,
//    within a block pair t = 0, 1, ...; bit = 1 iff left < right]
//   [stage 1 codes: m = dim/width codes of ceil(log2 K_1) bits, group 0 first] [stage 2 codes] ...
// Codebook bytes (qet_codebook_write), per stage: with CQO, the minimum and the step at `in_bits`
// (fp16 or fp32, little-endian), then K*dim codes of a' bits as a bitstream padded to a byte;
// without CQO, K*dim values at in_bits. Values ordered [group][entry][column].
#ifndef CLLA_QUANT_QET_H
#define CLLA_QUANT_QET_H

#include <stddef.h>
#include <stdint.h>

#include "quant/kmeans.h"

#define QET_MAX_STAGES 4
#define QET_MAX_DIM 4096

typedef struct QetSettings {
    int dim;         // d: columns per row (a head's K or V)
    int levels;      // l: swap-tree levels of stage 1, 0..log2(dim), 2^l divides dim (paper: 3)
    int width;       // d/m: columns per product-quantization group (paper: 8)
    int stages;      // r: stage 1 plus residual stages (paper: 2)
    int in_bits;     // a: input precision, 16 (KV cache, fp16) or 32; the precision of the CQO
                     //    minimum and step, and of the codebook without CQO
    int cb_bits;     // a': CQO codebook bits (paper: 10); 0 = no CQO (codebook stored at a bits)
    double theta;    // compression ratio: the budget is a/theta bits per element and K_i is the
                     //    largest that fits (bisection); 0 = take K_i from k[]
    double share[QET_MAX_STAGES];   // R_i: stage shares of the budget left after the flags (0.7, 0.3)
    int k[QET_MAX_STAGES];          // K_i when theta == 0
    int iters;       // k-means iterations (paper: 20)
    int init;        // k-means seeding: KMEANS_INIT_POINTS, random distinct rows (the reference
                     //    code's scipy minit='points'), or KMEANS_INIT_PLUSPLUS, which also seeds
                     //    the rare outlier rows a random draw misses (docs/QUANTIZERS.md "QET")
    uint64_t seed;   // k-means seeding (paper: 123)
} QetSettings;

// The paper's defaults (its 4.1): l = 3, width 8, r = 2, a' = 10, R = (0.7, 0.3), 20 iterations
// seeded with random points, seed 123; a = 16 (KV) and theta = 4 (4 bits per element).
QetSettings qet_settings_default(int dim);
// 0, or -1 with one line in err naming the bad setting and the accepted values.
int qet_settings_check(const QetSettings *s, char *err, size_t errlen);

typedef struct QetStage {
    int k;              // K_i centroids per group
    int code_bits;      // ceil(log2 K_i)
    float cb_min, cb_step;   // CQO: codebook value = cb_min + q * cb_step (both exact at in_bits)
    uint16_t *cb_q;     // CQO codes [m][k][width] (NULL without CQO)
    float *codebook;    // [m][k][width]: the values encode and decode use (dequantized with CQO)
} QetStage;

typedef struct QetState {
    QetSettings s;
    int m;              // groups per row: dim / width
    QetStage st[QET_MAX_STAGES];
} QetState;

// The largest K in [1, n] with K*dim*a'' + (2a with CQO) + n*m*ceil(log2 K) <= budget, the
// paper's constraint (its B3) for stage `stage` of an n-row matrix (a'' = a' with CQO, else a);
// budget = (n*dim*a/theta - levels*n*dim/2) * R_stage. 0 when not even K = 1 fits.
int qet_choose_k(const QetSettings *s, int64_t n, int stage);

// Fits the stages to n rows x[n][dim] (the matrix itself, or calibration rows whose codebook new
// tokens are then encoded against). 0, or -1 with one line in err: bad settings, a budget with no
// room for the codebooks (theta too high for the flags of l levels), n < K (a calibration set
// smaller than the codebook), non-finite data.
int qet_fit(QetState *st, const QetSettings *s, const float *x, int64_t n, char *err, size_t errlen);
void qet_free(QetState *st);

// The swap tree on one row: xs <- the row permuted, flags[levels * dim / 2] <- 0/1 (may be NULL),
// and its exact inverse.
void qet_swap_row(const float *x, int dim, int levels, float *xs, uint8_t *flags);
void qet_unswap_row(const float *xs, int dim, int levels, const uint8_t *flags, float *x);

int64_t qet_bytes_per_row(const QetState *st);
// The same from the settings and the K of every stage (no fitted state needed).
int64_t qet_bytes_per_row_for(const QetSettings *s, const int *k);
// out[n * qet_bytes_per_row] <- the rows' records. Returns the bytes written, -1 on overflow.
int64_t qet_encode(const QetState *st, const float *x, int64_t n, uint8_t *out);
void qet_decode(const QetState *st, const uint8_t *codes, int64_t n, float *x);

int64_t qet_codebook_bytes(const QetState *st);
void qet_codebook_write(const QetState *st, uint8_t *out);
// A state from stored codebook bytes, with the settings and the K of every stage they were
// written with (a package records both). 0, or -1 with one line in err: bad settings, a size that
// does not match, a CQO code beyond 2^a' - 1, a value that is not finite.
int qet_codebook_read(QetState *st, const QetSettings *s, const int *k, const uint8_t *buf,
                      int64_t nbytes, char *err, size_t errlen);

// Bits per element counting everything stored: `rows` row records (flags, codes, byte padding)
// plus the codebook bytes, amortized over those rows.
double qet_bits_everything(const QetState *st, int64_t rows);
// The paper's convention (its B3): (levels*n*d/2 + sum_i K_i*d*a' + 2a + n*m*ceil(log2 K_i)) / (n*d),
// codebooks counted in bits without padding.
double qet_bits_paper(const QetState *st, int64_t rows);

#endif
