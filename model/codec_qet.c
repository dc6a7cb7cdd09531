// The qet cache codec: quant/qet.c (QET, docs/QUANTIZERS.md "QET") behind the codec interface of
// model/cache.h. A token's part of width W is one QET row: the swap tree permutes it (one flag
// bit per pair and level), stage 1 product-quantizes the permuted row in groups of `width`
// columns (k1 centroids per group), stage 2 the residual (k2, 0 = none). The centroid counts are
// given, not derived from a compression ratio, so that a token's bytes follow from the spec (the
// paper's theta sizes K from the number of rows a whole matrix has; a cache grows). The
// codebooks are the fitted state, one per cache stream, learned by `clla calibrate` (QET fits
// plain k-means: no Fisher weights); in a package one fp32 tensor per stream of shape
// [(k1 + k2) * W]: stage 1's [W / width][k1][width] then stage 2's, the values the codec uses
// (with the paper's codebook quantization, CQO at 10 bits, already applied).
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/cache.h"
#include "quant/qet.h"

static QetSettings settings(const Codec *c, int W) {
    QetSettings s = qet_settings_default(W);
    s.levels = c->levels;
    s.width = c->group;
    s.stages = c->k[1] > 0 ? 2 : 1;
    s.theta = 0;
    s.k[0] = c->k[0];
    s.k[1] = c->k[1];
    s.iters = c->iters;
    return s;
}

static const QetState *state_of(const Codec *c) {
    if (!c->fit) die("internal error: the qet codec was used before its codebooks were fitted or loaded");
    return (const QetState *)c->fit;
}

static size_t qet_codec_bytes(const Codec *c, int W) {
    QetSettings s = settings(c, W);
    return (size_t)qet_bytes_per_row_for(&s, c->k);
}

static void qet_codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    codec_refuse_non_finite(c, src, N, W);   // the nearest centroid of a NaN is centroid 0
    qet_encode(state_of(c), src, N, dst);
}

static void qet_codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    qet_decode(state_of(c), src, N, dst);
}

static int qet_codec_set_param(Codec *c, const char *key, long value, char *err, size_t errlen) {
    struct { const char *key; int *field; long lo, hi; } P[] = {
        {"levels", &c->levels, 0, 12}, {"width", &c->group, 1, QET_MAX_DIM}, {"k1", &c->k[0], 1, 65536},
        {"k2", &c->k[1], 0, 65536}, {"iters", &c->iters, 1, 100000},
    };
    for (size_t i = 0; i < sizeof(P) / sizeof(P[0]); i++) {
        if (strcmp(key, P[i].key)) continue;
        if (value < P[i].lo || value > P[i].hi) {
            snprintf(err, errlen, "qet %s=%ld: use %ld to %ld", key, value, P[i].lo, P[i].hi);
            return -1;
        }
        *P[i].field = (int)value;
        return 0;
    }
    snprintf(err, errlen, "qet has no setting '%s': it takes levels, width, k1, k2 and iters", key);
    return -1;
}

// The paper's tree and groups (l 3, width 8, 2 stages, 20 iterations); K 256 and 16: 8 + 4 bits
// per 8 columns plus 1.5 flag bits per element, 3 bits per element in all.
static void qet_codec_defaults(Codec *c) {
    c->levels = 3;
    c->group = 8;
    c->k[0] = 256;
    c->k[1] = 16;
    c->iters = 20;
}

static int qet_codec_check(const Codec *c, int W, char *err, size_t errlen) {
    QetSettings s = settings(c, W);
    return qet_settings_check(&s, err, errlen);
}

static void qet_codec_format(const Codec *c, char *buf, size_t n) {
    snprintf(buf, n, "levels=%d,width=%d,k1=%d,k2=%d,iters=%d", c->levels, c->group, c->k[0], c->k[1], c->iters);
}

// The paper's count without the codebooks (amortized over the rows a deployment stores): flag
// and code bits of a row, unpadded, per element.
static double qet_codec_bits_paper(const Codec *c, int W) {
    QetSettings s = settings(c, W);
    double bits = (double)s.levels * W / 2;
    for (int i = 0; i < s.stages; i++) {
        int b = 0;
        while ((1 << b) < c->k[i]) b++;
        bits += (double)(W / s.width) * b;
    }
    return bits / W;
}

static int qet_codec_fit(const Codec *c, int W, const float *x, int64_t n, int64_t seq_len, const float *fisher, void **state, char *err,
                         size_t errlen) {
    (void)fisher;   // QET's k-means is unweighted
    QetSettings s = settings(c, W);
    QetState *st = xcalloc(1, sizeof(QetState));
    if (qet_fit(st, &s, x, n, err, errlen) != 0) {
        free(st);
        return -1;
    }
    *state = st;
    return 0;
}

static void qet_codec_fit_free(void *state) {
    if (!state) return;
    qet_free(state);
    free(state);
}

static int qet_codec_fit_shape(const Codec *c, int W, int64_t *shape) {
    shape[0] = ((int64_t)c->k[0] + c->k[1]) * W;
    return 1;
}

static void qet_codec_fit_save(const Codec *c, int W, const void *state, float *out) {
    const QetState *st = state;
    for (int i = 0; i < st->s.stages; i++) {
        size_t n = (size_t)st->st[i].k * W;
        memcpy(out, st->st[i].codebook, n * sizeof(float));
        out += n;
    }
}

static int qet_codec_fit_load(const Codec *c, int W, const float *data, void **state, char *err, size_t errlen) {
    QetSettings s = settings(c, W);
    if (qet_settings_check(&s, err, errlen) != 0) return -1;
    // each at most half of FLT_MAX: a row decodes as stage 1 + stage 2, which stays finite (a
    // codebook scaled by 1.1e38 passed and decoded to NaN, blamed on the model's activations)
    if (codec_check_codebook(data, ((size_t)c->k[0] + c->k[1]) * W, FLT_MAX / 2, "value of at most half of FLT_MAX", err, errlen) != 0)
        return -1;
    QetState *st = xcalloc(1, sizeof(QetState));
    st->s = s;
    st->m = W / s.width;
    for (int i = 0; i < s.stages; i++) {
        QetStage *g = &st->st[i];
        g->k = c->k[i];
        while ((1 << g->code_bits) < g->k) g->code_bits++;
        size_t n = (size_t)g->k * W;
        g->codebook = xmalloc(n * sizeof(float));
        memcpy(g->codebook, data, n * sizeof(float));
        data += n;
    }
    *state = st;
    return 0;
}

const CodecTraits CODEC_QET_TRAITS = {
    .name = "qet",
    .bytes_per_token = qet_codec_bytes,
    .encode = qet_codec_encode,
    .decode = qet_codec_decode,
    .roundtrip = NULL,   // through the host encode/decode
    .set_param = qet_codec_set_param,
    .defaults = qet_codec_defaults,
    .check = qet_codec_check,
    .format = qet_codec_format,
    .bits_paper = qet_codec_bits_paper,
    .fit = qet_codec_fit,
    .fit_free = qet_codec_fit_free,
    .fit_shape = qet_codec_fit_shape,
    .fit_save = qet_codec_fit_save,
    .fit_load = qet_codec_fit_load,
};
