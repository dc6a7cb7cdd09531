// The kivi cache codec: quant/kivi.c (KIVI, docs/QUANTIZERS.md "KIVI") behind the codec
// interface of model/cache.h, as a block codec. KIVI keeps the newest tokens in fp16 and
// quantizes keys per channel over token groups, so a key's code depends on the tokens after it:
// the cache (model/decode.c, "Block codecs") keeps the block a sequence is filling in fp16 and
// encodes a block of `residual` tokens once the sequence has moved past it. One block is:
//   keys (and the latent, and rope keys): residual / group token groups, each H x (fp16 scale,
//     fp16 min) then the H x group codes channel-major (quant/kivi.h's key block);
//   values: residual tokens, each H / group x (fp16 scale, fp16 min) then H codes.
// KIVI itself flushes keys `residual` tokens at a time too; its values leave the window one token
// at a time, which the cache does a block at a time (docs/QUANTIZERS.md, "KIVI in the cache").
// Nothing is fitted.
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "model/cache.h"
#include "quant/kivi.h"

// The settings of one encoded block: its tokens all quantized (no window inside a block).
static KiviSettings block_settings(const Codec *c) { return (KiviSettings){c->bits, c->group, 0}; }
static KiviPart part_of(const Codec *c) { return c->use == CODEC_USE_VALUES ? KIVI_VALUES : KIVI_KEYS; }

static int kivi_block_tokens(const Codec *c) { return c->window; }

static size_t kivi_block_bytes(const Codec *c, int W) {
    KiviSettings s = block_settings(c);
    int64_t bytes;
    if (kivi_bytes(&s, part_of(c), c->window, W, &bytes) != 0) die("kivi: a block of %d tokens of width %d overflows", c->window, W);
    return (size_t)bytes;
}

static void kivi_codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    KiviSettings s = block_settings(c);
    const size_t bb = kivi_block_bytes(c, W);
    char err[256];
    for (int b = 0; b < N / c->window; b++)
        if (kivi_encode(&s, part_of(c), src + (size_t)b * c->window * W, c->window, W, dst + (size_t)b * bb, (int64_t)bb, err,
                        sizeof(err)) < 0)
            die("%s (a cached activation KIVI's fp16 scales cannot hold: serve this model with another codec)", err);
}

static void kivi_codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    KiviSettings s = block_settings(c);
    const size_t bb = kivi_block_bytes(c, W);
    char err[256];
    for (int b = 0; b < N / c->window; b++)
        if (kivi_decode(&s, part_of(c), src + (size_t)b * bb, (int64_t)bb, c->window, W, dst + (size_t)b * c->window * W, err,
                        sizeof(err)) != 0)
            die("internal error: %s", err);
}

static int kivi_set_param(Codec *c, const char *key, long value, char *err, size_t errlen) {
    if (!strcmp(key, "bits")) {
        if (value < 1 || value > 8) { snprintf(err, errlen, "kivi bits=%ld: use 1 to 8 (the reference code runs 2 and 4)", value); return -1; }
        c->bits = (int)value;
        return 0;
    }
    if (!strcmp(key, "group")) {
        if (value < 1 || value > 65536) { snprintf(err, errlen, "kivi group=%ld: use 1 to 65536", value); return -1; }
        c->group = (int)value;
        return 0;
    }
    if (!strcmp(key, "residual")) {
        if (value < 1 || value > 65536) {
            snprintf(err, errlen, "kivi residual=%ld: use 1 to 65536 tokens (the cache keeps the block being filled in fp16, "
                     "so a window of 0 has no meaning there)", value);
            return -1;
        }
        c->window = (int)value;
        return 0;
    }
    snprintf(err, errlen, "kivi has no setting '%s': it takes bits, group and residual", key);
    return -1;
}

static void kivi_codec_defaults(Codec *c) {
    c->bits = KIVI_DEFAULT_BITS;
    c->group = KIVI_DEFAULT_GROUP;
    c->window = KIVI_DEFAULT_RESIDUAL;
}

static int kivi_check(const Codec *c, int W, char *err, size_t errlen) {
    KiviSettings s = {c->bits, c->group, c->window};
    if (c->window < 1) { snprintf(err, errlen, "kivi needs a residual of at least one token group (e.g. kivi:residual=128)"); return -1; }
    return kivi_settings_check(&s, part_of(c), W, err, errlen);
}

static void kivi_format(const Codec *c, char *buf, size_t n) { snprintf(buf, n, "bits=%d,group=%d,residual=%d", c->bits, c->group, c->window); }

static double kivi_codec_bits_paper(const Codec *c, int W) {
    KiviSettings s = block_settings(c);
    return kivi_bits_paper(&s);
}

const CodecTraits CODEC_KIVI_TRAITS = {
    .name = "kivi",
    .encode = kivi_codec_encode,
    .decode = kivi_codec_decode,
    .set_param = kivi_set_param,
    .defaults = kivi_codec_defaults,
    .check = kivi_check,
    .format = kivi_format,
    .bits_paper = kivi_codec_bits_paper,
    .block_tokens = kivi_block_tokens,
    .block_bytes = kivi_block_bytes,
};
