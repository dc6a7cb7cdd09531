// The kvquant cache codec: quant/kvquant.c (KVQuant, docs/QUANTIZERS.md "KVQuant") behind the
// codec interface of model/cache.h. Keys (K, k_rope, a consumer's own k_rope) and the latent of
// MLA/CLLA are quantized per channel against calibrated zero and range, values per token; codes
// index a per-stream non-uniform datatype from Fisher-weighted k-means (Q-Norm at 2 bits by
// default); dense-and-sparse outliers per vector stored exactly in fp16 with their channel and a
// per-token pointer (variable length); the first `sink` tokens of a sequence kept in fp16.
//
// In the cache it codes each token on its own as it comes (token_size / encode_token /
// record_size / decode_token), at its position: quant/kvquant.h's layout of one token (a sink row;
// or a dense row, its pointer and its entries), appended to its block, so a block is exactly the
// bytes its tokens need, there is no full-precision window (as in the paper) and streaming is
// block coding (the paper's rows are independent). Keys are coded before RoPE (pre_rope): the
// decoder rotates them back before encoding and forward after decoding; the latent is RoPE-free.
//
// Fitted state, one per stream, by `clla calibrate` (pre-RoPE keys and their Fisher information):
// one fp32 tensor [2^b] (values: the datatype) or [2^b + 2 W] (keys: the datatype, then each
// channel's zero, then its range).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/cache.h"
#include "quant/fp16.h"
#include "quant/kvquant.h"

static KvqPart part_of(const Codec *c) { return c->use == CODEC_USE_VALUES ? KVQ_VALUES : KVQ_KEYS; }

static KvqSettings settings(const Codec *c) {
    KvqSettings s = kvq_defaults();
    s.bits = c->bits;
    s.outliers = c->permille / 1000.0;
    s.sink = c->sink;
    s.qnorm = c->qnorm;
    s.kmeans_iters = c->iters;
    s.value_group = c->group;
    return s;
}

static const KvqCodec *state_of(const Codec *c) {
    if (!c->fit) die("internal error: the kvquant codec was used before its datatype was fitted or loaded");
    return (const KvqCodec *)c->fit;
}

// A nominal figure for the printed per-token bytes (layout sizes, `clla info`): one dense row,
// its pointer, and its 4-byte entries: a value token's exactly (ceil(f Gv / 2) per side of each
// group), a key token's as many as the outlier fraction expects (f W, whose bytes are rounded up
// to a whole byte: the count varies per token). What a cache holds is measured
// (decoder_seq_bytes).
static size_t kvq_nominal_bytes(const Codec *c, int W) {
    KvqSettings s = settings(c);
    const size_t dense = ((size_t)W * (size_t)c->bits + 7) / 8 + 4;
    if (part_of(c) == KVQ_VALUES) {
        const int64_t groups = W / kvq_value_group(&s, W);
        return dense + (size_t)groups * 4 + (size_t)(groups * 2 * kvq_value_outliers_per_side(&s, W)) * 4;
    }
    return dense + (size_t)ceil(s.outliers * W * 4 - 1e-9);
}

// One token at position pos is quant/kvquant.h's layout of T = 1: a sink row (2W bytes), or a
// dense row, its pointer (its entry count) and its entries.
static size_t kvq_token_size(const Codec *c, const float *x, int W, int64_t pos) {
    const KvqCodec *st = state_of(c);
    int64_t nnz;
    KvqLayout L;
    char err[256];
    if (kvq_count(st, x, 1, pos, &nnz, err, sizeof(err)) != 0)
        die("%s (a cached activation KVQuant's fp16 entries cannot hold: serve this model with another codec)", err);
    if (kvq_layout(st, 1, pos, nnz, &L) != 0) die("kvquant: a token of width %d overflows", W);
    return (size_t)L.total;
}

static void kvq_encode_token(const Codec *c, uint8_t *dst, size_t size, const float *x, int W, int64_t pos) {
    char err[256];
    if (kvq_encode(state_of(c), x, 1, pos, dst, (int64_t)size, err, sizeof(err)) != (int64_t)size) die("internal error: %s", err);
}

static size_t kvq_record_size(const Codec *c, const uint8_t *rec, int W, int64_t pos) {
    const KvqCodec *st = state_of(c);
    KvqLayout L;
    if (kvq_layout(st, 1, pos, 0, &L) != 0) die("kvquant: a token of width %d overflows", W);
    if (L.ns) return (size_t)L.total;
    uint32_t nnz = (uint32_t)rec[L.ptr_off] | (uint32_t)rec[L.ptr_off + 1] << 8 | (uint32_t)rec[L.ptr_off + 2] << 16 |
                   (uint32_t)rec[L.ptr_off + 3] << 24;
    return (size_t)L.total + (size_t)nnz * 4;
}

static void kvq_decode_token(const Codec *c, float *dst, const uint8_t *rec, size_t size, int W, int64_t pos) {
    char err[256];
    if (kvq_decode(state_of(c), rec, (int64_t)size, 1, pos, dst, err, sizeof(err)) != 0) die("internal error: %s", err);
}

// The per-token interface without positions is not how the cache stores kvquant (it goes
// through encode_token); tools that code loose vectors (bench_codec) are refused.
static void kvq_encode_loose(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    die("kvquant codes tokens at their positions, with a variable size: read it through the cache (codec_is_variable)");
}
static void kvq_decode_loose(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    die("kvquant codes tokens at their positions, with a variable size: read it through the cache (codec_is_variable)");
}

static int kvq_codec_fit(const Codec *c, int W, const float *x, int64_t n, int64_t seq_len, const float *fisher, void **state,
                         char *err, size_t errlen) {
    KvqSettings s = settings(c);
    if (seq_len < 1 || seq_len > n) seq_len = n;
    int64_t N = n / seq_len * seq_len;   // whole sequences (their first tokens are the sink)
    KvqCodec *st = xcalloc(1, sizeof(KvqCodec));
    if (kvq_fit(st, &s, part_of(c), x, fisher, N, W, seq_len, err, errlen) != 0) {
        free(st);
        return -1;
    }
    *state = st;
    return 0;
}

static void kvq_fit_free(void *state) {
    kvq_free(state);
    free(state);
}

static int kvq_fit_shape(const Codec *c, int W, int64_t *shape) {
    shape[0] = ((int64_t)1 << c->bits) + (part_of(c) == KVQ_KEYS ? 2 * (int64_t)W : 0);
    return 1;
}

static void kvq_fit_save(const Codec *c, int W, const void *state, float *out) {
    const KvqCodec *st = state;
    memcpy(out, st->lut, (size_t)st->k * sizeof(float));
    if (st->part == KVQ_KEYS) {
        memcpy(out + st->k, st->zero, (size_t)W * sizeof(float));
        memcpy(out + st->k + W, st->range, (size_t)W * sizeof(float));
    }
}

// A package's datatype: fp16 values, ascending (the nearest-centroid rule needs it); zeros fp16;
// ranges fp16 and not negative.
static int kvq_fit_load(const Codec *c, int W, const float *data, void **state, char *err, size_t errlen) {
    const int k = 1 << c->bits;
    const int keys = part_of(c) == KVQ_KEYS;
    const int64_t n = k + (keys ? 2 * (int64_t)W : 0);
    if (codec_check_fp16(data, (size_t)n, err, errlen) != 0) return -1;
    for (int i = 1; i < k; i++)
        if (!(data[i] > data[i - 1])) {
            snprintf(err, errlen, "kvquant datatype value %d (%g) does not exceed the one before (%g): the datatype must ascend", i,
                     (double)data[i], (double)data[i - 1]);
            return -1;
        }
    if (keys)
        for (int i = 0; i < W; i++)
            if (data[k + W + i] < 0) {
                snprintf(err, errlen, "kvquant key range of channel %d is %g: a range is not negative", i, (double)data[k + W + i]);
                return -1;
            }
    KvqCodec *st = xcalloc(1, sizeof(KvqCodec));
    st->s = settings(c);
    st->part = part_of(c);
    st->H = W;
    st->k = k;
    st->lut = xmalloc((size_t)k * sizeof(float));
    memcpy(st->lut, data, (size_t)k * sizeof(float));
    if (keys) {
        st->zero = xmalloc((size_t)W * sizeof(float));
        st->range = xmalloc((size_t)W * sizeof(float));
        memcpy(st->zero, data + k, (size_t)W * sizeof(float));
        memcpy(st->range, data + k + W, (size_t)W * sizeof(float));
    }
    *state = st;
    return 0;
}

static int kvq_set_param(Codec *c, const char *key, long value, char *err, size_t errlen) {
    if (!strcmp(key, "bits")) {
        if (value < 2 || value > 4) { snprintf(err, errlen, "kvquant bits=%ld: the paper's datatypes are nuq2, nuq3 and nuq4: use 2 to 4", value); return -1; }
        c->bits = (int)value;
    } else if (!strcmp(key, "outliers_permille")) {
        if (value < 0 || value >= 500) { snprintf(err, errlen, "kvquant outliers_permille=%ld: use 0 to 499 (10 = the paper's 1%%)", value); return -1; }
        c->permille = (int)value;
    } else if (!strcmp(key, "sink")) {
        if (value < 0 || value > 65536) { snprintf(err, errlen, "kvquant sink=%ld: use 0 to 65536 tokens", value); return -1; }
        c->sink = (int)value;
    } else if (!strcmp(key, "qnorm")) {
        if (value < -1 || value > 1) { snprintf(err, errlen, "kvquant qnorm=%ld: use 1 (on), 0 (off) or -1 (the paper's: on at 2 bits)", value); return -1; }
        c->qnorm = (int)value;
    } else if (!strcmp(key, "iters")) {
        if (value < 1 || value > 100000) { snprintf(err, errlen, "kvquant iters=%ld: use 1 to 100000 k-means iterations", value); return -1; }
        c->iters = (int)value;
    } else if (!strcmp(key, "vgroup")) {
        if (value < 0 || value > 65536) { snprintf(err, errlen, "kvquant vgroup=%ld: use 0 (the whole width, the paper's) to 65536", value); return -1; }
        c->group = (int)value;
    } else {
        snprintf(err, errlen, "kvquant has no setting '%s': it takes bits, outliers_permille, sink, qnorm, iters and vgroup", key);
        return -1;
    }
    return 0;
}

// The paper's nuq4-1%: 4 bits, 1% outliers, one sink token, Q-Norm as the paper (at 2 bits),
// 50 k-means iterations (the reference code), values grouped over the whole width.
static void kvq_codec_defaults(Codec *c) {
    KvqSettings s = kvq_defaults();
    c->bits = s.bits;
    c->permille = (int)lround(s.outliers * 1000);
    c->sink = s.sink;
    c->qnorm = s.qnorm;
    c->iters = s.kmeans_iters;
    c->group = s.value_group;
}

static int kvq_check(const Codec *c, int W, char *err, size_t errlen) {
    KvqSettings s = settings(c);
    return kvq_settings_check(&s, part_of(c), W, err, errlen);
}

static void kvq_format(const Codec *c, char *buf, size_t n) {
    snprintf(buf, n, "bits=%d,outliers_permille=%d,sink=%d,qnorm=%d,iters=%d,vgroup=%d", c->bits, c->permille, c->sink, c->qnorm,
             c->iters, c->group);
}

static double kvq_codec_bits_paper(const Codec *c, int W) {
    KvqSettings s = settings(c);
    return kvq_bits_paper(&s, part_of(c), W);
}

const CodecTraits CODEC_KVQUANT_TRAITS = {
    .name = "kvquant",
    .bytes_per_token = kvq_nominal_bytes,
    .encode = kvq_encode_loose,
    .decode = kvq_decode_loose,
    .set_param = kvq_set_param,
    .defaults = kvq_codec_defaults,
    .check = kvq_check,
    .format = kvq_format,
    .bits_paper = kvq_codec_bits_paper,
    .fit = kvq_codec_fit,
    .uses_fisher = 1,
    .fit_free = kvq_fit_free,
    .fit_shape = kvq_fit_shape,
    .fit_save = kvq_fit_save,
    .fit_load = kvq_fit_load,
    .token_size = kvq_token_size,
    .encode_token = kvq_encode_token,
    .record_size = kvq_record_size,
    .decode_token = kvq_decode_token,
    .pre_rope = 1,
};
