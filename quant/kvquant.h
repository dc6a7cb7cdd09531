// KVQuant (Hooper et al., "KVQuant: Towards 10 Million Context Length LLM Inference with KV Cache
// Quantization"), the algorithm of docs/QUANTIZERS.md (KVQuant):
//   keys   per channel, quantized BEFORE RoPE: the caller passes the pre-RoPE keys (k_proj's
//          output, or a latent model's RoPE-free part); RoPE is applied after decoding or fused
//          into kvq_scores. Channel c's zero and range are calibrated offline, once.
//   values per token (over the whole width H of the layer, all heads: the paper's bit counts
//          assume it; or per group of value_group channels, e.g. per head), zero and range
//          computed online per token.
//   codes  b-bit indices into a per-layer non-uniform datatype ("nuqX"): 2^b centroids from a
//          1-D k-means over the normalized calibration elements weighted by their Fisher
//          information (squared gradients of the loss, supplied by the caller), one table for
//          the keys and one for the values of a layer. Optionally Q-Norm (on by default at 2
//          bits): the centroids shifted and scaled so the quantized calibration data keeps the
//          mean and std of the normalized data.
//   sparse per vector, the dense-and-sparse outliers: keys outside the calibrated
//          [lower_c, upper_c] of their channel (about a fraction f of them, a variable count
//          per token); values: the ceil(f*Gv/2) largest and ceil(f*Gv/2) smallest of each
//          value group. Each is stored exactly in fp16 with its 16-bit channel and REPLACES the
//          dense value; a 32-bit pointer per token locates its entries (variable length).
//   sink   the first `sink` tokens of a sequence (position < sink) stored in fp16 unquantized.
//
// Byte layout of T tokens at positions pos0 .. pos0+T-1 (one layer's K or V), little-endian:
//   [sink rows: ns x H fp16, ns = tokens with position < sink]
//   [dense rows: nq = T - ns rows; values: H/Gv x (fp16 zero, fp16 range) first; then the H
//    codes packed LSB first (quant/qpack.h), padded to a byte]
//   [pointers: nq x u32, the end of each dense row's entries (cumulative count)]
//   [entries: nnz x (u16 channel, fp16 value), row by row, channels ascending]
// Every row is independent of the others (keys use the frozen calibration; values their own
// statistics), so encoding tokens one at a time yields the same rows, pointers (up to the
// running offset) and entries as encoding the block.
#ifndef CLLA_QUANT_KVQUANT_H
#define CLLA_QUANT_KVQUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KVQ_KEYS = 0, KVQ_VALUES = 1 } KvqPart;

typedef struct KvqSettings {
    int bits;             // b, 2..4 (the paper's nuq2/3/4)
    double outliers;      // f, the sparse fraction, in [0, 0.5): 0.01 by default ("-1%")
    int sink;             // tokens kept in fp16 at the start of a sequence (paper: 1)
    int qnorm;            // Q-Norm: 1 on, 0 off, -1 = the paper's default (on at 2 bits only)
    int kmeans_iters;     // Lloyd iterations of the datatype fit (the reference code: 50)
    int value_group;      // values: channels per zero/range and outlier group; 0 = the whole
                          // width H (the paper's), d_head = per head (32/d bits per element)
} KvqSettings;

KvqSettings kvq_defaults(void);   // b=4, f=0.01, sink=1, qnorm=-1, 50 iterations, whole width
// "bits=3,outliers=0.01,sink=1,qnorm=auto|on|off,iters=50,vgroup=0": 0, or -1 with a message.
int kvq_settings_parse(const char *spec, KvqSettings *s, char *err, size_t errlen);
// 0 when the settings can encode a part of width H, else -1 with one line naming the problem:
// bits outside 2..4, f outside [0, 0.5) or leaving no dense value in a value group, a negative
// sink, a value group that does not divide H, H outside 1..65536 (16-bit sparse channels).
int kvq_settings_check(const KvqSettings *s, KvqPart part, int64_t H, char *err, size_t errlen);
int kvq_qnorm_on(const KvqSettings *s);
// Values: the channels of one value group (value_group, or H when it is 0), and the outliers
// per side of one group, ceil(f*Gv/2) (0 when f == 0).
int64_t kvq_value_group(const KvqSettings *s, int64_t H);
int64_t kvq_value_outliers_per_side(const KvqSettings *s, int64_t H);

// The fitted state of one layer's K or V.
typedef struct KvqCodec {
    KvqSettings s;
    KvqPart part;
    int64_t H;
    int k;            // 2^b
    float *lut;       // k centroids in the normalized domain, ascending, fp16-representable
    float *zero;      // keys: per channel, fp16-representable (NULL for values)
    float *range;     // keys: per channel, fp16-representable, >= 0 (NULL for values)
} KvqCodec;

// Fits the codec on calibration activations x [N, H] (pre-RoPE keys, or values) with their
// Fisher information fisher [N, H] (squared gradients; NULL = unweighted k-means, the
// paper's ablation). The rows are sequences of seq_len tokens back to back (N a multiple of
// seq_len); the first `sink` tokens of each are left out of every statistic (paper §3.6).
// Steps (docs/QUANTIZERS.md): keys' per-channel thresholds at the f/2 and 1-f/2 quantiles;
// normalization; Fisher-weighted k-means over the non-outliers initialized at the uniform
// grid; Q-Norm. 0, or -1 with a message: bad settings, fewer non-outlier calibration elements
// than centroids, a non-finite or out-of-fp16-range input, negative Fisher weights or all zero.
int kvq_fit(KvqCodec *c, const KvqSettings *s, KvqPart part, const float *x, const float *fisher,
            int64_t N, int64_t H, int64_t seq_len, char *err, size_t errlen);
void kvq_free(KvqCodec *c);

// Layout of T tokens from position pos0 with nnz sparse entries (section offsets in bytes).
typedef struct KvqLayout {
    int64_t ns, nq, nnz;          // sink rows, dense rows, sparse entries
    int64_t row_bytes;            // one dense row
    int64_t sink_off, dense_off, ptr_off, entry_off, total;
} KvqLayout;
int kvq_layout(const KvqCodec *c, int64_t T, int64_t pos0, int64_t nnz, KvqLayout *L);

// Counts the sparse entries of x [T, H] at positions pos0.. (a first pass, so the caller can
// size the output): 0, or -1 with a message for inputs fp16 cannot hold.
int kvq_count(const KvqCodec *c, const float *x, int64_t T, int64_t pos0, int64_t *nnz, char *err, size_t errlen);
// Encodes into out (cap bytes); returns the bytes written (== kvq_layout(..).total), or -1.
int64_t kvq_encode(const KvqCodec *c, const float *x, int64_t T, int64_t pos0, uint8_t *out, int64_t cap,
                   char *err, size_t errlen);
// Decodes nbytes (checked against the layout the pointers imply) into x [T, H].
int kvq_decode(const KvqCodec *c, const uint8_t *in, int64_t nbytes, int64_t T, int64_t pos0, float *x,
               char *err, size_t errlen);

// Attention scores against encoded pre-RoPE keys without materializing them: for each token t
// and query head h, out[t * n_q_heads + h] = q_rot[h] . RoPE_{pos0+t}(k'_t[kv head of h]),
// where k' is the decoded key, q_rot [n_q_heads, d_head] the queries already rotated at their
// own position, kv head = h / (n_q_heads / n_kv_heads) (GQA), H = n_kv_heads * d_head. RoPE is
// layers/cpu_rope.c's: rotate-half pairs (i, i + d/2), angle pos * theta^(-2i/d) in double.
// Outliers enter as their own rotated term (the dense value they replace is taken out).
int kvq_scores(const KvqCodec *c, const uint8_t *in, int64_t nbytes, int64_t T, int64_t pos0, const float *q_rot,
               int n_q_heads, int n_kv_heads, int d_head, float theta, float *out, char *err, size_t errlen);

// RoPE on pre-RoPE keys x [T, n_heads * d_head] at positions pos0 .. pos0 + T - 1, in place:
// rotate-half pairs (i, i + d/2) turned by sign * pos * theta^(-2i/d), the angles formed in double
// as layers/cpu_rope.c forms them (sign = -1 undoes it). The cache's "RoPE after decoding".
void kvq_rope_rows(float *x, int64_t T, int n_heads, int d_head, int64_t pos0, float theta, int sign);

// Bits per element counting everything stored for T tokens with nnz sparse entries: the
// encoded bytes (sink rows, codes, value zero/range, pointers, entries) plus the codec's own
// tables amortized over these T tokens (the 2^b fp16 centroids, and for keys the per-channel
// fp16 zero and range). 0 when T == 0.
double kvq_bits_stored(const KvqCodec *c, int64_t T, int64_t pos0, int64_t nnz);
// The paper's convention (App. K, as Table 6 counts): keys b + 32 f, values b + 32 f + 32/Gv;
// no pointers, no sink, no tables.
double kvq_bits_paper(const KvqSettings *s, KvqPart part, int64_t H);
// The paper's cache size in bytes for L layers of width H at T tokens (K and V together):
// T L (2 H b/8 + 4) + f 2 H T L 4, i.e. the per-element paper bits above.
double kvq_paper_cache_bytes(const KvqSettings *s, int64_t L, int64_t H, int64_t T);

// Mixed precision (App. P). The sensitivity of a fitted codec on calibration data x [N, H] in
// sequences of seq_len (each encoded from position 0, so its sink stays exact) with Fisher
// information fisher [N, H]: omega = sum F (x - x')^2, x' the codec's round trip. 0, or -1 with
// a message.
int kvq_sensitivity(const KvqCodec *c, const float *x, const float *fisher, int64_t N, int64_t seq_len,
                    double *omega, char *err, size_t errlen);
// Given each layer's omega at the lower precision, marks in low[] (1 = lower precision) the
// n_low layers with the smallest omega (ties: the lower layer index). -1 when n_low is outside
// 0..n_layers.
int kvq_mixed_precision(const double *omega, int n_layers, int n_low, int *low);

// The datatype fit, exposed for tests and for callers that pool data themselves: weighted 1-D
// Lloyd k-means of n samples x (weights w, NULL = 1) into k centroids, initialized at the
// uniform grid -1 + 2i/(k-1), iters iterations at most (stops when no centroid moves).
// Deterministic (sorted samples, prefix sums in double). Returns 0, -1 when n < k or the
// weights sum to 0.
int kvq_kmeans_1d(const float *x, const float *w, int64_t n, int k, int iters, float *centroids);
// Q-Norm (Eq. 3): with mu1/sd1 the mean/std of x and mu2/sd2 those of x rounded to its nearest
// centroid, out_i = (c_i - mu2) * sd1 / sd2 + mu1 (unweighted moments, as the paper's).
void kvq_qnorm(const float *centroids, int k, const float *x, int64_t n, float *out);
// Index of the centroid nearest to v (ascending lut; ties go to the lower index).
int kvq_nearest(const float *lut, int k, float v);

#endif
