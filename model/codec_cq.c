// The cq cache codec: quant/cq.c (coupled quantization, docs/QUANTIZERS.md "CQ") behind the
// codec interface of model/cache.h. A part of width W is one CQ vector: every c contiguous
// channels share one b-bit code; a group never crosses a head (c must divide the head width the
// layout gives: cq_codec_check) and each group has its own codebook. The codebooks are the
// codec's fitted state, one per cache stream (a layer's K, V, latent or k_rope), learned by
// `clla calibrate`; stored in a package as one fp32 tensor per stream of shape [W / c, 2^b, c]
// (values exact in fp16).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/cache.h"
#include "quant/cq.h"

#define CQ_DEFAULT_ITERS 25

static CqSettings settings(const Codec *c, int W) {
    CqSettings s = cq_settings_default(W);
    s.bits = c->bits;
    s.c = c->group;
    s.iters = c->iters;
    return s;
}

static const CqState *state_of(const Codec *c) {
    if (!c->fit) die("internal error: the cq codec was used before its codebooks were fitted or loaded");
    return (const CqState *)c->fit;
}

static size_t cq_codec_bytes(const Codec *c, int W) {
    CqSettings s = settings(c, W);
    return (size_t)cq_bytes_per_token(&s);
}

static void cq_codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    codec_refuse_non_finite(c, src, N, W);   // the nearest centroid of a NaN is centroid 0
    cq_encode(state_of(c), src, N, dst);
}

static void cq_codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    cq_decode(state_of(c), src, N, dst);
}

static int cq_codec_set_param(Codec *c, const char *key, long value, char *err, size_t errlen) {
    if (!strcmp(key, "bits")) {
        if (value < 1 || value > CQ_MAX_BITS) { snprintf(err, errlen, "cq bits=%ld: use 1 to %d (2^bits centroids per group)", value, CQ_MAX_BITS); return -1; }
        c->bits = (int)value;
        return 0;
    }
    if (!strcmp(key, "c")) {
        if (value < 1 || value > 65536) { snprintf(err, errlen, "cq c=%ld: use 1 to 65536 channels per code", value); return -1; }
        c->group = (int)value;
        return 0;
    }
    if (!strcmp(key, "iters")) {
        if (value < 1 || value > 100000) { snprintf(err, errlen, "cq iters=%ld: use 1 to 100000 k-means iterations", value); return -1; }
        c->iters = (int)value;
        return 0;
    }
    snprintf(err, errlen, "cq has no setting '%s': it takes bits, c and iters", key);
    return -1;
}

static void cq_codec_defaults(Codec *c) {
    c->bits = 8;
    c->group = 4;
    c->iters = CQ_DEFAULT_ITERS;
}

static int cq_codec_check(const Codec *c, int W, char *err, size_t errlen) {
    CqSettings s = settings(c, W);
    if (cq_settings_check(&s, err, errlen) != 0) return -1;
    // a group never crosses a head: the head width is the layout's (0 before it sets it)
    if (c->head > 0 && c->head % c->group != 0) {
        snprintf(err, errlen, "cq: c=%d does not divide the head width %d: a group would span two heads; use a c that divides %d",
                 c->group, c->head, c->head);
        return -1;
    }
    return 0;
}

static void cq_codec_format(const Codec *c, char *buf, size_t n) { snprintf(buf, n, "bits=%d,c=%d,iters=%d", c->bits, c->group, c->iters); }

static int cq_codec_fit(const Codec *c, int W, const float *x, int64_t n, int64_t seq_len, const float *fisher, void **state, char *err,
                        size_t errlen) {
    CqSettings s = settings(c, W);
    CqState *st = xcalloc(1, sizeof(CqState));
    if (cq_fit(st, &s, x, n, fisher, err, errlen) != 0) {
        free(st);
        return -1;
    }
    *state = st;
    return 0;
}

static void cq_codec_fit_free(void *state) {
    if (!state) return;
    cq_free(state);
    free(state);
}

static int cq_codec_fit_shape(const Codec *c, int W, int64_t *shape) {
    shape[0] = W / c->group;
    shape[1] = (int64_t)1 << c->bits;
    shape[2] = c->group;
    return 3;
}

static void cq_codec_fit_save(const Codec *c, int W, const void *state, float *out) {
    const CqState *st = state;
    memcpy(out, st->codebook, (size_t)W * ((size_t)1 << c->bits) * sizeof(float));
}

static int cq_codec_fit_load(const Codec *c, int W, const float *data, void **state, char *err, size_t errlen) {
    CqSettings s = settings(c, W);
    if (cq_settings_check(&s, err, errlen) != 0) return -1;
    size_t n = (size_t)W << c->bits;
    if (codec_check_fp16(data, n, err, errlen) != 0) return -1;
    CqState *st = xcalloc(1, sizeof(CqState));
    st->s = s;
    st->groups = W / s.c;
    st->entries = 1 << s.bits;
    st->codebook = xmalloc(n * sizeof(float));
    memcpy(st->codebook, data, n * sizeof(float));
    *state = st;
    return 0;
}

static double cq_codec_bits_paper(const Codec *c, int W) {
    CqSettings s = settings(c, W);
    return cq_bits_paper(&s);
}

const CodecTraits CODEC_CQ_TRAITS = {
    .name = "cq",
    .bytes_per_token = cq_codec_bytes,
    .encode = cq_codec_encode,
    .decode = cq_codec_decode,
    .roundtrip = NULL,   // through the host encode/decode
    .set_param = cq_codec_set_param,
    .defaults = cq_codec_defaults,
    .check = cq_codec_check,
    .format = cq_codec_format,
    .bits_paper = cq_codec_bits_paper,
    .pre_rope = 1,   // keys coded before RoPE, as the paper's
    .fit = cq_codec_fit,
    .uses_fisher = 1,
    .fit_free = cq_codec_fit_free,
    .fit_shape = cq_codec_fit_shape,
    .fit_save = cq_codec_fit_save,
    .fit_load = cq_codec_fit_load,
};
