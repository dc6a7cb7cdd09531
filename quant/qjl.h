// QJL: 1-bit quantized Johnson-Lindenstrauss keys (Zandieh et al., arXiv 2406.03482), with the
// outlier-channel split, the full-precision buffer and the per-token value quantizer of the
// reference code. docs/QUANTIZERS.md (section "## qjl") has the byte layouts, the readings of
// the paper's ambiguities and the bits accounting.
//
// A key k in R^d is stored as the signs of S k (m bits, S the m x d projection) and its norm;
// a score against a query q is estimated without ever decoding k (the asymmetric estimator):
//     <q,k> ~ (C/m) * |k| * sum_i (S q)_i * sign((S k)_i)
// which is unbiased with the constant C of qjl_estimator_constant. Keys come in token groups of
// group_tokens; each group's outlier_count channels of largest norm over the group are split off
// (k = k_in + k_out, disjoint supports) and get their own signs (the first outlier_proj_dim rows
// of S, or an independent projection), so <q,k> = <q_in,k_in> + <q_out,k_out> is estimated in
// two unbiased parts. Values are quantized per token, asymmetric min-max in channel groups.
//
// Everything here is one KV head of one layer; plain C over float arrays, no globals.
#ifndef CLLA_QUANT_QJL_H
#define CLLA_QUANT_QJL_H

#include <stddef.h>
#include <stdint.h>

// The projection S (docs/QUANTIZERS.md, "Projection").
enum {
    QJL_PROJ_ORTHO = 0,     // reference: rows orthonormal within blocks of d rows (QR of a Gaussian
                            // block), scaled to norm sqrt(d); unbiased with the corrected constant
    QJL_PROJ_GAUSSIAN = 1,  // Definition 3.1: i.i.d. N(0,1) entries; constant sqrt(pi/2)
    QJL_PROJ_ORTHO_CHI = 2, // orthonormal blocks, each row scaled by an independent chi_d sample
                            // (the norm of a d-dim Gaussian); constant sqrt(pi/2)
};

typedef struct QjlSettings {
    int head_dim;          // d: channels per key/value vector (1..4096)
    int proj_dim;          // m: sign bits per key for the inlier part (multiple of 8)
    int outlier_count;     // o: outlier channels per token group (0 .. d-1)
    int outlier_proj_dim;  // m_o: sign bits per key for the outlier part (multiple of 8; 0 iff o = 0)
    int group_tokens;      // g_k: tokens sharing one set of outlier channels
    int buffer_tokens;     // full-precision (fp16) window: keys quantized in chunks of this many
                           // tokens (a multiple of g_k), values once older than this many tokens
    int value_bits;        // b_v: bits per value code (1..8)
    int value_group;       // g_v: channels per value group (divides d)
    int proj_kind;         // QJL_PROJ_*
    int outlier_independent; // 0: outlier part uses rows 0..m_o-1 of S (reference; m_o <= m);
                             // 1: an independent projection of m_o rows drawn after S
    uint64_t seed;         // S is a deterministic function of (settings, seed)
} QjlSettings;

// The reference code's defaults for a head of dimension d (its "general layers": m = 256,
// o = 8, m_o = 256, g_k = 32, buffer 128, b_v = 2, g_v = 32, seed 42; its first 15 layers use
// m = 512, m_o = 128). value_group is 32 when 32 divides d, else d.
QjlSettings qjl_settings_default(int head_dim);

// Sets one setting from text (the codec spec of the command line): keys d, m, o, mo, group,
// buffer, vbits, vgroup, proj (ortho|gaussian|chi), outliers (shared|independent), seed. Numbers
// go through the strict parser (common/num.h). 0, or -1 with one line in msg.
int qjl_settings_set(QjlSettings *s, const char *key, const char *value, char *msg, size_t cap);

// 0 when the settings are usable, else -1 with one line in msg naming the setting and the fix.
int qjl_settings_check(const QjlSettings *s, char *msg, size_t cap);

// The fitted state: the projection (data-oblivious: only the settings and the seed).
typedef struct QjlState {
    QjlSettings set;
    float *S;          // m x d, row-major: row i is projection direction s_i
    float *S_out;      // m_o x d rows used for the outlier part (points into S when shared)
    double c_est;      // the estimator's constant C (qjl_estimator_constant); tests may change it
} QjlState;

// Builds S from the settings (checked; -1 with msg when they are bad). Deterministic.
int qjl_fit(QjlState *st, const QjlSettings *s, char *msg, size_t cap);
void qjl_free(QjlState *st);

// The constant C that makes the estimator unbiased for a projection kind: sqrt(pi/2) for
// Gaussian and chi-scaled rows; for rows of fixed norm sqrt(d) uniform on the sphere,
// 1/E|s.u| = sqrt(pi/d) * Gamma((d+1)/2) / Gamma(d/2) (1.250869 at d = 128, sqrt(pi/2) = 1.253314).
double qjl_estimator_constant(int proj_kind, int head_dim);

// ---- keys
// Bytes of one encoded key block of n tokens (groups of g_k tokens, the last one partial):
// per group, o outlier channel indices (1 byte each when d <= 256, else 2, little-endian,
// ascending), then per token [nu fp16][nu_out fp16 when o > 0][m/8 bytes inlier signs]
// [m_o/8 bytes outlier signs]. -1 on overflow.
int64_t qjl_key_bytes(const QjlSettings *s, int64_t n_tokens);
// Bytes of one token's key record (norms and signs, without the group's indices).
int qjl_key_record_bytes(const QjlSettings *s);

// Encodes n keys (n x d row-major) into out (qjl_key_bytes). Signs: bit i = 1 iff (S k)_i > 0
// (so sign(0) = -1), LSB first (byte i/8, bit i%8). -1 with msg when a key is not finite or its
// norm exceeds fp16 (65504): nothing is promised about out then.
int qjl_encode_keys(const QjlState *st, const float *K, int64_t n_tokens, uint8_t *out, char *msg, size_t cap);

// Doubles of scratch qjl_scores needs: S q, per group S q_in and S_out q_out (2m + m_o), and the
// per-group nibble tables ((m + m_o)/4 x 16 floats; 8 KiB at m = m_o = 256).
int64_t qjl_score_work(const QjlSettings *s);
// Estimates <q, k_j> for the n keys of an encoded block (scores[j], not divided by sqrt(d)),
// from the signs and norms only: S q once (m d), per group the outlier columns (m o + m_o o);
// per key (m + m_o)/4 table lookups (groups of >= 8 keys: tables of the group's 4-bit sums,
// built per group) or m + m_o signed adds. work: qjl_score_work doubles.
void qjl_scores(const QjlState *st, const float *q, const uint8_t *enc, int64_t n_tokens, float *scores, double *work);
// The same in two steps, so that a query scored against many blocks is projected once: S q (m
// doubles) by qjl_project, then qjl_scores_projected with it (work: qjl_score_work doubles, of
// which the first m are not used).
void qjl_project(const QjlState *st, const float *q, double *sq);
void qjl_scores_projected(const QjlState *st, const float *q, const double *sq, const uint8_t *enc, int64_t n_tokens,
                          float *scores, double *work);

// The only key "decode" QJL defines: the vector khat_j with <q, khat_j> equal to the score
// estimate for EVERY q (the estimator is linear in q):
//     khat = P_in (C nu_in / m) S^T b_in + P_out (C nu_out / m_o) S_out^T b_out,   b = 2 bit - 1.
// It is unbiased (E khat = k over S) but is no reconstruction: its error is of the order of
// |k| sqrt(d/m) per vector. K is n x d.
void qjl_decode_keys(const QjlState *st, const uint8_t *enc, int64_t n_tokens, float *K);

// ---- values (per token, asymmetric min-max in groups of g_v channels)
// Bytes per token: per group [min fp16][scale fp16][ceil(g_v b_v / 8) bytes codes, LSB first].
// The min is rounded down and the scale up to fp16, so the group's range is covered and
// |x - xhat| <= scale/2 for every element (code = round((x - min)/scale), xhat = code*scale + min).
int qjl_value_token_bytes(const QjlSettings *s);
// -1 with msg when a value is not finite or beyond fp16.
int qjl_encode_values(const QjlSettings *s, const float *V, int64_t n_tokens, uint8_t *out, char *msg, size_t cap);
void qjl_decode_values(const QjlSettings *s, const uint8_t *enc, int64_t n_tokens, float *V);

// ---- the cache of one head (the reference's buffers), for tests and the later cache codec
// Keys: the newest (n mod buffer_tokens) tokens in fp16, older ones encoded in chunks of
// buffer_tokens. Values: the newest min(n, buffer_tokens) tokens in fp16, older ones encoded one
// token at a time. Buffered vectors are rounded to fp16 and encoded from that rounding.
typedef struct QjlHead {
    const QjlState *st;
    int64_t n;          // tokens appended
    int64_t n_kq;       // keys encoded (a multiple of buffer_tokens)
    int64_t n_vq;       // values encoded (max(0, n - buffer_tokens))
    int64_t cap;        // tokens the arrays hold
    uint8_t *kq;        // encoded keys, n_kq tokens (chunks of buffer_tokens)
    uint8_t *vq;        // encoded values, n_vq tokens
    uint16_t *kbuf;     // fp16 keys of tokens n_kq .. n-1 (buffer_tokens x d)
    uint16_t *vbuf;     // fp16 values of tokens n_vq .. n-1, ring indexed by token % buffer_tokens
} QjlHead;

void qjl_head_init(QjlHead *h, const QjlState *st);
void qjl_head_free(QjlHead *h);
// Appends one token's key and value (d floats each). -1 with msg on a value encode refuses
// (then the head is unchanged) or on a size overflow.
int qjl_head_append(QjlHead *h, const float *k, const float *v, char *msg, size_t cap);
// Attention output for one query: softmax over the logits (score / sqrt(d); estimated for
// encoded keys, exact on the fp16 buffer), times the values (decoded or buffered). out: d floats.
// Allocates its scratch (n + d floats); a head with no tokens gives zeros.
void qjl_head_attend(const QjlHead *h, const float *q, float *out);
// Bytes this head holds: encoded keys, fp16 key buffer (its filled part), encoded values, fp16
// value buffer (filled part). Equals qjl_cache_bytes(settings, n).
int64_t qjl_head_bytes(const QjlHead *h);

// ---- softmax used by qjl_head_attend: p = softmax(x) over n entries (max-subtracted, double sums)
void qjl_softmax(const float *x, int64_t n, float *p);

// ---- bits accounting
typedef struct QjlBits {
    double key;    // bits per key element
    double value;  // bits per value element
    double total;  // bits per cached element, keys and values together
} QjlBits;
// Everything stored by a head cache holding n tokens: signs, norms, outlier indices, value codes,
// mins and scales, and the fp16 buffers (the projection is regenerated from the seed: 0 bytes
// per head). qjl_cache_bytes gives the key and value bytes (their sum is qjl_head_bytes);
// both return -1 on overflow or n < 1 (qjl_cache_bytes: n < 0).
int qjl_cache_bytes(const QjlSettings *s, int64_t n_tokens, int64_t *key_bytes, int64_t *value_bytes);
int qjl_bits_stored(const QjlSettings *s, int64_t n_tokens, QjlBits *out);
// The paper's convention, read as the sign-bits-only figure: keys (m + m_o)/d and values b_v,
// with no norms, indices, scales or buffers (the paper calls its keys "zero overhead" and does
// not derive its 3 / 4.3 / 5 bits; the reference defaults give exactly 3.00 this way).
QjlBits qjl_bits_paper(const QjlSettings *s);

#endif
