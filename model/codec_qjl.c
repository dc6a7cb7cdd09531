// The qjl cache codec: quant/qjl.c (QJL, docs/QUANTIZERS.md "qjl") behind the codec interface
// of model/cache.h, as a block codec with a scores path. Per attention head of the part (d =
// Codec.head channels; K holds num_key_value_heads of them, the latent and a rope key are one):
//   keys (K, k_rope, own k_rope): the signs of an orthogonalized JL projection and the norms,
//     outlier channels per token group split off (quant/qjl.h's key block); attention scores them
//     with the asymmetric estimator (scores), never decoding them. decode gives the vector whose
//     dot product with any query is that estimate (qjl_decode_keys), which is what a rope key read
//     as the second key part of a latent model needs;
//   values (V): per token, asymmetric min-max in channel groups (quant/qjl.h's value records);
//   the latent of MLA/CLLA, which absorbed attention scores and sums: both, the keys' signs for
//     the scores and the value records for the sum (its bits are the two added).
// One block is `buffer` tokens (the reference's full-precision buffer): the decoder keeps the
// block being filled in fp16 and encodes it once the sequence moves past it (model/decode.c).
// Layout of a block: [keys: head 0's qjl key block, head 1's, ...][values: head 0's `buffer`
// value records, head 1's, ...]. The projection is regenerated from the seed (codec_bind): it
// is derived state, nothing stored.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/cache.h"
#include "quant/qjl.h"

static int has_keys(const Codec *c) { return c->use != CODEC_USE_VALUES; }
static int has_values(const Codec *c) { return c->use != CODEC_USE_KEYS; }

// The quant/qjl.h settings of one head of the part. o, mo < 0 choose the reference's outlier
// split (8 channels, 256 bits) when the head has at least 32 channels, none below that;
// value_group 0 the reference's 32 when it divides the head, else the head.
static QjlSettings settings(const Codec *c, int W) {
    int d = codec_head_width(c, W);
    QjlSettings s = qjl_settings_default(d);
    s.proj_dim = c->m;
    s.outlier_count = c->o >= 0 ? c->o : d >= 32 ? 8 : 0;
    s.outlier_proj_dim = c->mo >= 0 ? c->mo : s.outlier_count ? 256 : 0;
    if (!s.outlier_independent && s.outlier_proj_dim > s.proj_dim && c->mo < 0) s.outlier_proj_dim = s.proj_dim;
    s.group_tokens = c->gk;
    s.buffer_tokens = c->window;
    s.value_bits = c->bits;
    if (c->group > 0) s.value_group = c->group;
    s.seed = c->seed;
    return s;
}

static const QjlState *state_of(const Codec *c) {
    if (!c->fit) die("internal error: the qjl codec was used before codec_bind made its projection");
    return (const QjlState *)c->fit;
}

static int heads_of(const Codec *c, int W) { return W / codec_head_width(c, W); }

static size_t key_bytes(const Codec *c, int W) {
    if (!has_keys(c)) return 0;
    QjlSettings s = settings(c, W);
    return (size_t)qjl_key_bytes(&s, c->window) * heads_of(c, W);
}

static size_t qjl_block_bytes(const Codec *c, int W) {
    QjlSettings s = settings(c, W);
    size_t values = has_values(c) ? (size_t)qjl_value_token_bytes(&s) * c->window * heads_of(c, W) : 0;
    return key_bytes(c, W) + values;
}

static int qjl_block_tokens(const Codec *c) { return c->window; }

// One head's columns of n tokens of width W, gathered (dst n x d) or scattered back.
static void gather(float *dst, const float *src, int n, int W, int d, int h) {
    for (int t = 0; t < n; t++) memcpy(dst + (size_t)t * d, src + (size_t)t * W + (size_t)h * d, (size_t)d * sizeof(float));
}
static void scatter(float *dst, const float *src, int n, int W, int d, int h) {
    for (int t = 0; t < n; t++) memcpy(dst + (size_t)t * W + (size_t)h * d, src + (size_t)t * d, (size_t)d * sizeof(float));
}

static void qjl_codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    const QjlState *st = state_of(c);
    const int d = codec_head_width(c, W), H = heads_of(c, W), n = c->window;
    const size_t kb = (size_t)qjl_key_bytes(&st->set, n), vb = (size_t)qjl_value_token_bytes(&st->set) * n;
    const size_t bb = qjl_block_bytes(c, W);
    float *x = xmalloc((size_t)n * d * sizeof(float));
    char err[256];
    for (int b = 0; b < N / n; b++) {
        uint8_t *o = dst + (size_t)b * bb, *ov = o + key_bytes(c, W);
        for (int h = 0; h < H; h++) {
            gather(x, src + (size_t)b * n * W, n, W, d, h);
            if ((has_keys(c) && qjl_encode_keys(st, x, n, o + (size_t)h * kb, err, sizeof(err)) != 0) ||
                (has_values(c) && qjl_encode_values(&st->set, x, n, ov + (size_t)h * vb, err, sizeof(err)) != 0))
                die("%s (a cached activation QJL's fp16 norms and scales cannot hold: serve this model with another codec)", err);
        }
    }
    free(x);
}

// Values decode to their records; a keys-only part to the estimator's vectors (qjl_decode_keys).
static void qjl_codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    const QjlState *st = state_of(c);
    const int d = codec_head_width(c, W), H = heads_of(c, W), n = c->window;
    const size_t kb = (size_t)qjl_key_bytes(&st->set, n), vb = (size_t)qjl_value_token_bytes(&st->set) * n;
    const size_t bb = qjl_block_bytes(c, W);
    float *x = xmalloc((size_t)n * d * sizeof(float));
    for (int b = 0; b < N / n; b++) {
        const uint8_t *o = src + (size_t)b * bb, *ov = o + key_bytes(c, W);
        for (int h = 0; h < H; h++) {
            if (has_values(c)) qjl_decode_values(&st->set, ov + (size_t)h * vb, n, x);
            else qjl_decode_keys(st, o + (size_t)h * kb, n, x);
            scatter(dst + (size_t)b * n * W, x, n, W, d, h);
        }
    }
    free(x);
}

static size_t qjl_prep_doubles(const Codec *c, int W) { return (size_t)settings(c, W).proj_dim; }
static void qjl_query_prep(const Codec *c, const float *q, double *prep) { qjl_project(state_of(c), q, prep); }

static void qjl_codec_scores(const Codec *c, float *sc, const float *q, const double *prep, int head, const uint8_t *block, int n,
                             int W) {
    const QjlState *st = state_of(c);
    if (!has_keys(c)) die("internal error: qjl scores of a values-only part");
    if (n != c->window) die("internal error: qjl scores of %d tokens of a block of %d", n, c->window);
    double *work = xmalloc((size_t)qjl_score_work(&st->set) * sizeof(double));
    qjl_scores_projected(st, q, prep, block + (size_t)head * qjl_key_bytes(&st->set, n), n, sc, work);
    free(work);
}

static void *qjl_bind(const Codec *c, int W) {
    QjlState *st = xcalloc(1, sizeof(QjlState));
    QjlSettings s = settings(c, W);
    char err[256];
    if (qjl_fit(st, &s, err, sizeof(err)) != 0) die("%s", err);
    return st;
}

static void qjl_unbind(void *state) {
    qjl_free(state);
    free(state);
}

static int qjl_set_param(Codec *c, const char *key, long value, char *err, size_t errlen) {
    static const struct { const char *key; long lo, hi; } RANGE[] = {
        {"m", 8, 65536}, {"o", 0, 4095}, {"mo", 0, 65536}, {"group", 1, 65536}, {"buffer", 1, 1 << 20},
        {"bits", 1, 8}, {"vgroup", 1, 4096}, {"seed", 0, 2147483647},
    };
    for (size_t i = 0; i < sizeof(RANGE) / sizeof(RANGE[0]); i++) {
        if (strcmp(key, RANGE[i].key)) continue;
        if (value < RANGE[i].lo || value > RANGE[i].hi) {
            snprintf(err, errlen, "qjl %s=%ld: use %ld to %ld", key, value, RANGE[i].lo, RANGE[i].hi);
            return -1;
        }
        int v = (int)value;
        switch (i) {
        case 0: c->m = v; break;
        case 1: c->o = v; break;
        case 2: c->mo = v; break;
        case 3: c->gk = v; break;
        case 4: c->window = v; break;
        case 5: c->bits = v; break;
        case 6: c->group = v; break;
        default: c->seed = (unsigned)v; break;
        }
        return 0;
    }
    snprintf(err, errlen, "qjl has no setting '%s': it takes m, o, mo, group, buffer, bits, vgroup and seed", key);
    return -1;
}

// The reference code's general layers: m = 256, outliers chosen from the head width (settings),
// token groups of 32, a buffer of 128, 2-bit values, seed 42.
static void qjl_defaults(Codec *c) {
    c->m = 256;
    c->o = c->mo = -1;
    c->gk = 32;
    c->window = 128;
    c->bits = 2;
    c->group = 0;
    c->seed = 42;
}

static int qjl_check(const Codec *c, int W, char *err, size_t errlen) {
    int d = codec_head_width(c, W);
    if (W % d) { snprintf(err, errlen, "qjl: the head width %d does not divide the part's width %d", d, W); return -1; }
    QjlSettings s = settings(c, W);
    return qjl_settings_check(&s, err, errlen);
}

static void qjl_format(const Codec *c, char *buf, size_t n) {
    char o[32] = "", vg[32] = "";
    if (c->o >= 0) snprintf(o, sizeof(o), ",o=%d", c->o);
    if (c->mo >= 0) snprintf(o + strlen(o), sizeof(o) - strlen(o), ",mo=%d", c->mo);
    if (c->group > 0) snprintf(vg, sizeof(vg), ",vgroup=%d", c->group);
    snprintf(buf, n, "m=%d%s,group=%d,buffer=%d,bits=%d%s,seed=%u", c->m, o, c->gk, c->window, c->bits, vg, c->seed);
}

// The paper's convention: keys (m + m_o) / d sign bits, values b_v; the latent carries both.
static double qjl_codec_bits_paper(const Codec *c, int W) {
    QjlSettings s = settings(c, W);
    QjlBits b = qjl_bits_paper(&s);
    return (has_keys(c) ? b.key : 0) + (has_values(c) ? b.value : 0);
}

const CodecTraits CODEC_QJL_TRAITS = {
    .name = "qjl",
    .encode = qjl_codec_encode,
    .decode = qjl_codec_decode,
    .set_param = qjl_set_param,
    .defaults = qjl_defaults,
    .check = qjl_check,
    .format = qjl_format,
    .bits_paper = qjl_codec_bits_paper,
    .block_tokens = qjl_block_tokens,
    .block_bytes = qjl_block_bytes,
    .bind = qjl_bind,
    .unbind = qjl_unbind,
    .query_prep_doubles = qjl_prep_doubles,
    .query_prep = qjl_query_prep,
    .scores = qjl_codec_scores,
};
