#include "model/cache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"
#include "backend/bf16.h"
#include "backend/int_group_math.h"
#include "common/vec.h"
#include "quant/fp16.h"

// int_group layout per token: [scales: G x bf16][codes: W values of `bits` bits, two's
// complement, packed little-endian from bit 0 of byte 0].
static size_t int_group_bytes(const Codec *c, int W) {
    // packed codes (bits per value, rounded up to whole bytes per token) + one bf16 scale per group
    return ((size_t)W * (size_t)c->bits + 7) / 8 + (size_t)(W / c->group) * 2;
}

static void int_group_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    int G = W / c->group, bits = c->bits;
    size_t tok = int_group_bytes(c, W);
    for (int n = 0; n < N; n++) {
        uint8_t *o = dst + (size_t)n * tok;
        memset(o, 0, tok);
        uint8_t *codes = o + (size_t)G * 2;
        const float *x = src + (size_t)n * W;
        size_t bit = 0;
        for (int g = 0; g < G; g++) {
            float absmax = 0.0f;
            for (int j = 0; j < c->group; j++) absmax = int_group_absmax_step(absmax, x[g * c->group + j]);
            float scale = int_group_scale(absmax, bits);
            uint16_t sb = (uint16_t)(((uint32_t)0) | sr_f32_to_bf16_rne(scale));   // exact: scale is a bf16 value
            o[2 * g] = (uint8_t)sb;
            o[2 * g + 1] = (uint8_t)(sb >> 8);
            for (int j = 0; j < c->group; j++, bit += (size_t)bits) {
                uint32_t code = (uint32_t)int_group_code(x[g * c->group + j], scale, bits) & ((1u << bits) - 1);
                for (int b = 0; b < bits; b++)
                    if (code >> b & 1u) codes[(bit + b) >> 3] |= (uint8_t)(1u << ((bit + b) & 7));
            }
        }
    }
}

// One token's 4-bit groups (two codes a byte, low nibble first; group even) from its bf16 scales
// and codes. Inlined with the group size a constant for the common sizes (int_group_decode): the
// steps of a group unrolled and its tail test gone. With the size a variable, the loop's setup
// per group cost about as much as the table form saved (docs/INFERENCE.md, "The int4 decode by
// table").
static inline __attribute__((always_inline)) void int4_token(float *y, const uint8_t *o, int G, int group) {
    const uint8_t *codes = o + (size_t)G * 2;
    for (int g = 0; g < G; g++) {
        const float scale = sr_bf16_to_f32((uint16_t)(o[2 * g] | (o[2 * g + 1] << 8)));
        vec_int4_to_f32(y + (size_t)g * group, codes + (size_t)g * group / 2, group, scale);
    }
}

static void int_group_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    int G = W / c->group, bits = c->bits;
    size_t tok = int_group_bytes(c, W), code_bytes = tok - (size_t)G * 2;
    const uint32_t mask = (1u << bits) - 1;
    if (bits == 4 && c->group % 2 == 0) {
        // the common case (CLLA-quant): 16 codes at a time (common/vec.h); it was a quarter of
        // a CLLA-quant decode step at 16k written as a scalar loop (bench/bench_decode.c under perf)
        for (int n = 0; n < N; n++) {
            const uint8_t *o = src + (size_t)n * tok;
            float *y = dst + (size_t)n * W;
            switch (c->group) {
            case 32: int4_token(y, o, G, 32); break;
            case 64: int4_token(y, o, G, 64); break;
            case 128: int4_token(y, o, G, 128); break;
            default: int4_token(y, o, G, c->group); break;
            }
        }
        return;
    }
    for (int n = 0; n < N; n++) {
        const uint8_t *o = src + (size_t)n * tok;
        const uint8_t *codes = o + (size_t)G * 2;
        float *y = dst + (size_t)n * W;
        size_t bit = 0;
        for (int g = 0; g < G; g++) {
            float scale = sr_bf16_to_f32((uint16_t)(o[2 * g] | (o[2 * g + 1] << 8)));
            for (int j = 0; j < c->group; j++, bit += (size_t)bits) {
                // a code of at most 8 bits spans at most two bytes; the second only when it exists
                size_t byte = bit >> 3;
                uint32_t window = codes[byte] | (byte + 1 < code_bytes ? (uint32_t)codes[byte + 1] << 8 : 0u);
                uint32_t code = (window >> (bit & 7)) & mask;
                int v = (code >> (bits - 1)) & 1u ? (int)code - (1 << bits) : (int)code;   // sign-extend
                y[g * c->group + j] = (float)v * scale;
            }
        }
    }
}

static void int_group_roundtrip(const Codec *c, const Backend *be, float *out, const float *in, int N, int W) {
    be->int_group_roundtrip(out, in, N, W, c->bits, c->group);
}

static int int_group_set_param(Codec *c, const char *key, long value, char *err, size_t errlen) {
    if (!strcmp(key, "bits")) {
        if (value < 2 || value > 8) { snprintf(err, errlen, "int_group bits=%ld: use 2 to 8", value); return -1; }
        c->bits = (int)value;
        return 0;
    }
    if (!strcmp(key, "group")) {
        if (value < 1 || value > 65536) { snprintf(err, errlen, "int_group group=%ld: use 1 to 65536", value); return -1; }
        c->group = (int)value;
        return 0;
    }
    snprintf(err, errlen, "int_group has no setting '%s': it takes bits and group", key);
    return -1;
}

static int int_group_check(const Codec *c, int W, char *err, size_t errlen) {
    if (c->bits < 2 || c->bits > 8 || c->group < 1) {
        snprintf(err, errlen, "int_group needs bits (2 to 8) and group, e.g. int_group:bits=4,group=32");
        return -1;
    }
    if (W % c->group) {
        snprintf(err, errlen, "int_group group=%d does not divide the part's width %d", c->group, W);
        return -1;
    }
    return 0;
}

static void int_group_format(const Codec *c, char *buf, size_t n) { snprintf(buf, n, "bits=%d,group=%d", c->bits, c->group); }

// ---------------------------------------------------------------- fp32 and bf16

static size_t fp32_bytes(const Codec *c, int W) { return (size_t)W * 4; }
static void fp32_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) { memcpy(dst, src, (size_t)N * W * 4); }
static void fp32_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) { memcpy(dst, src, (size_t)N * W * 4); }
static void fp32_roundtrip(const Codec *c, const Backend *be, float *out, const float *in, int N, int W) {
    if (out != in) be->copy_cols(out, W, 0, in, W, 0, N, W, 0);
}

static size_t bf16_bytes(const Codec *c, int W) { return (size_t)W * 2; }
static void bf16_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    size_t n = (size_t)N * W;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = sr_f32_to_bf16_rne(src[i]);
        dst[2 * i] = (uint8_t)h;
        dst[2 * i + 1] = (uint8_t)(h >> 8);
    }
}
static void bf16_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    for (int n = 0; n < N; n++) vec_bf16_to_f32(dst + (size_t)n * W, src + (size_t)n * W * 2, W);
}

static int no_params(Codec *c, const char *key, long value, char *err, size_t errlen) {
    snprintf(err, errlen, "codec %s takes no settings (got '%s')", codec_traits(c->kind)->name, key);
    return -1;
}
static int fits_any(const Codec *c, int W, char *err, size_t errlen) { return 0; }
static void no_format(const Codec *c, char *buf, size_t n) { if (n) buf[0] = 0; }

static void int_group_defaults(Codec *c) { c->bits = 4; c->group = 32; }   // CLLA-quant's setting

extern const CodecTraits CODEC_CQ_TRAITS;    // model/codec_cq.c
extern const CodecTraits CODEC_QET_TRAITS;   // model/codec_qet.c
extern const CodecTraits CODEC_KIVI_TRAITS;  // model/codec_kivi.c
extern const CodecTraits CODEC_QJL_TRAITS;   // model/codec_qjl.c
extern const CodecTraits CODEC_KVQUANT_TRAITS;   // model/codec_kvquant.c

static const CodecTraits CODECS_SIMPLE[] = {
    [CODEC_FP32] = {.name = "fp32", .bytes_per_token = fp32_bytes, .encode = fp32_encode, .decode = fp32_decode,
                    .roundtrip = fp32_roundtrip, .set_param = no_params, .check = fits_any, .format = no_format},
    // bf16 round trips through the host codec in evaluation, so it is exactly what encode/decode give
    [CODEC_BF16] = {.name = "bf16", .bytes_per_token = bf16_bytes, .encode = bf16_encode, .decode = bf16_decode,
                    .set_param = no_params, .check = fits_any, .format = no_format},
    [CODEC_INT_GROUP] = {.name = "int_group", .bytes_per_token = int_group_bytes, .encode = int_group_encode,
                         .decode = int_group_decode, .roundtrip = int_group_roundtrip, .set_param = int_group_set_param,
                         .defaults = int_group_defaults, .check = int_group_check, .format = int_group_format},
};

// The codec table: one row per kind (the codecs with fitted state live in files of their own).
const CodecTraits *codec_traits(CodecKind kind) {
    if ((unsigned)kind >= N_CODECS) die("internal error: codec kind %d", (int)kind);
    switch (kind) {
    case CODEC_CQ: return &CODEC_CQ_TRAITS;
    case CODEC_QET: return &CODEC_QET_TRAITS;
    case CODEC_KIVI: return &CODEC_KIVI_TRAITS;
    case CODEC_QJL: return &CODEC_QJL_TRAITS;
    case CODEC_KVQUANT: return &CODEC_KVQUANT_TRAITS;
    default: return &CODECS_SIMPLE[kind];
    }
}

int codec_has_window(const Codec *c) { return codec_traits(c->kind)->block_tokens != NULL; }

int codec_is_blocked(const Codec *c) {
    const CodecTraits *t = codec_traits(c->kind);
    return t->block_tokens != NULL || t->encode_token != NULL;
}

int codec_block_tokens(const Codec *c) {
    const CodecTraits *t = codec_traits(c->kind);
    return t->block_tokens ? t->block_tokens(c) : 1;
}

size_t codec_span_bytes(const Codec *c, int W, int N) {
    const CodecTraits *t = codec_traits(c->kind);
    if (!t->block_tokens) return (size_t)N * t->bytes_per_token(c, W);
    int bt = t->block_tokens(c);
    if (N % bt) die("internal error: %d tokens of codec %s, whose blocks are %d tokens", N, t->name, bt);
    return (size_t)(N / bt) * t->block_bytes(c, W);
}

double codec_bytes_per_token_avg(const Codec *c, int W) {
    int bt = codec_block_tokens(c);
    return (double)codec_span_bytes(c, W, bt) / bt;
}

int codec_needs_fit(const Codec *c) { return codec_traits(c->kind)->fit != NULL; }

void codec_bind(Codec *c, int W) {
    const CodecTraits *t = codec_traits(c->kind);
    if (t->bind && !c->fit) c->fit = t->bind(c, W);
}

void codec_unbind(Codec *c) {
    const CodecTraits *t = codec_traits(c->kind);
    if (t->bind && c->fit) t->unbind((void *)c->fit);
    if (t->bind) c->fit = NULL;
}

int codec_head_width(const Codec *c, int W) { return c->head > 0 ? c->head : W; }
double codec_bits_stored(const Codec *c, int W) { return 8.0 * codec_bytes_per_token_avg(c, W) / W; }
double codec_bits_paper(const Codec *c, int W) {
    const CodecTraits *t = codec_traits(c->kind);
    if (t->bits_paper) return t->bits_paper(c, W);
    return c->kind == CODEC_INT_GROUP ? (double)c->bits : codec_bits_stored(c, W);   // int_group's scales left out
}
int64_t codec_fit_elements(const Codec *c, int W) {
    const CodecTraits *t = codec_traits(c->kind);
    if (!t->fit) return 0;
    int64_t shape[4], n = 1;
    int rank = t->fit_shape(c, W, shape);
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

int codec_check_codebook(const float *data, size_t n, float max_abs, const char *what, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(data[i]) || fabsf(data[i]) > max_abs) {
            snprintf(err, errlen, "codebook value %zu is %g, not a finite %s", i, (double)data[i], what);
            return -1;
        }
    return 0;
}

int codec_check_fp16(const float *data, size_t n, char *err, size_t errlen) {
    if (codec_check_codebook(data, n, 65504.0f, "fp16 value", err, errlen) != 0) return -1;
    for (size_t i = 0; i < n; i++)
        if (fp16_round(data[i]) != data[i]) {
            snprintf(err, errlen, "codebook value %zu is %.9g, not an fp16 number", i, (double)data[i]);
            return -1;
        }
    return 0;
}

void codec_refuse_non_finite(const Codec *c, const float *src, int N, int W) {
    for (size_t i = 0; i < (size_t)N * (size_t)W; i++)
        if (!isfinite(src[i]))
            die("%s: the cached value at token %zu, channel %zu is %g: the model's activations are not finite (a diverged or "
                "damaged model), and %s would store it as a finite centroid",
                codec_name(c), i / (size_t)W, i % (size_t)W, (double)src[i], codec_name(c));
}

const char *codec_name(const Codec *c) { return codec_traits(c->kind)->name; }
size_t codec_bytes_per_token(const Codec *c, int W) {
    const CodecTraits *t = codec_traits(c->kind);
    if (!t->bytes_per_token) die("internal error: codec %s stores blocks, not tokens (codec_span_bytes)", t->name);
    return t->bytes_per_token(c, W);
}
void codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) { codec_traits(c->kind)->encode(c, dst, src, N, W); }
void codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) { codec_traits(c->kind)->decode(c, dst, src, N, W); }

void codec_roundtrip(const Codec *c, const Backend *be, float *out, const float *in, int N, int W) {
    const CodecTraits *t = codec_traits(c->kind);
    if (t->roundtrip) { t->roundtrip(c, be, out, in, N, W); return; }
    if (codec_is_blocked(c))
        die("internal error: codec %s is stored in blocks at their positions, so it has no full-sequence round trip: read it through the decoder", t->name);
    // through the host codec, exactly what the cache would store and give back
    size_t n = (size_t)N * W;
    float *h = xmalloc(n * sizeof(float));
    uint8_t *bytes = xmalloc((size_t)N * t->bytes_per_token(c, W));
    be->act_to_host(h, in, n);
    t->encode(c, bytes, h, N, W);
    t->decode(c, h, bytes, N, W);
    be->act_from_host(out, h, n);
    free(bytes);
    free(h);
}

void codec_roundtrip_seq(const Codec *c, const Backend *be, float *out, const float *in, int B, int T, int W) {
    const CodecTraits *t = codec_traits(c->kind);
    if (!t->encode_token) { codec_roundtrip(c, be, out, in, B * T, W); return; }
    // one token at a time at its position, as the cache codes it (model/decode.c)
    size_t n = (size_t)B * T * W;
    float *h = xmalloc(n * sizeof(float));
    be->act_to_host(h, in, n);
    uint8_t *rec = NULL;
    size_t cap = 0;
    for (int b = 0; b < B; b++)
        for (int pos = 0; pos < T; pos++) {
            float *x = h + ((size_t)b * T + pos) * W;
            size_t size = t->token_size(c, x, W, pos);
            if (size > cap) { rec = xrealloc(rec, size); cap = size; }
            t->encode_token(c, rec, size, x, W, pos);
            t->decode_token(c, x, rec, size, W, pos);
        }
    be->act_from_host(out, h, n);
    free(rec);
    free(h);
}

// ---------------------------------------------------------------- specs

int codec_parse(Codec *c, const char *spec, char *err, size_t errlen) {
    memset(c, 0, sizeof(*c));
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    int kind = -1;
    for (int k = 0; k < N_CODECS; k++)
        if (strlen(codec_traits((CodecKind)k)->name) == nlen && !strncmp(codec_traits((CodecKind)k)->name, spec, nlen)) kind = k;
    if (kind < 0) {
        snprintf(err, errlen, "unknown cache codec '%.*s': use fp32, bf16, int_group:bits=B,group=G, cq:bits=B,c=C, "
                 "qet:levels=L,width=W,k1=K,k2=K, kivi:bits=B,group=G,residual=R, qjl:m=M,o=O,mo=MO,group=G,buffer=B,bits=VB,vgroup=VG "
                 "or kvquant:bits=B,outliers_permille=P,sink=S", (int)nlen, spec);
        return -1;
    }
    c->kind = (CodecKind)kind;
    if (codec_traits(c->kind)->defaults) codec_traits(c->kind)->defaults(c);
    if (!colon) return 0;
    char buf[256];
    if (strlen(colon + 1) >= sizeof(buf)) { snprintf(err, errlen, "codec spec '%s' is too long", spec); return -1; }
    const size_t sl = strlen(colon + 1);
    if (sl == 0 || colon[1] == ',' || colon[sl] == ',' || strstr(colon + 1, ",,")) {
        snprintf(err, errlen, "codec spec '%s' has an empty setting: give key=value pairs separated by single commas, or the name alone for the defaults",
                 spec);
        return -1;
    }
    strcpy(buf, colon + 1);
    const char *seen[32];
    int n_seen = 0;
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) { snprintf(err, errlen, "codec setting '%s' in '%s' is not key=value", kv, spec); return -1; }
        *eq = 0;
        for (int i = 0; i < n_seen; i++)
            if (!strcmp(seen[i], kv)) {
                snprintf(err, errlen, "codec setting '%s' appears twice in '%s': give it once", kv, spec);
                return -1;
            }
        if (n_seen < 32) seen[n_seen++] = kv;
        int64_t v;
        const int rc = num_parse_i64(eq + 1, INT32_MIN, INT32_MAX, &v);
        if (rc != NUM_OK) {
            snprintf(err, errlen, rc == NUM_RANGE ? "codec setting %s=%s in '%s' is out of range (beyond a 32-bit integer)"
                                                  : "codec setting %s=%s in '%s' is not a whole number",
                     kv, eq + 1, spec);
            return -1;
        }
        if (codec_traits(c->kind)->set_param(c, kv, v, err, errlen) != 0) return -1;
    }
    return 0;
}

void codec_format(const Codec *c, char *buf, size_t n) {
    char params[128];
    const CodecTraits *t = codec_traits(c->kind);
    t->format(c, params, sizeof(params));
    snprintf(buf, n, "%s%s%s", t->name, params[0] ? ":" : "", params);
}

static const char *const PART_NAMES[N_PARTS] = {"k", "v", "latent", "k_rope", "own_k_rope"};
const char *cache_part_name(int part) { return part >= 0 && part < N_PARTS ? PART_NAMES[part] : "?"; }

// What part p's vectors are to attention: the latent is both key and value (absorbed attention
// scores queries against it and sums it), the rope keys are keys.
static int part_use(int p) { return p == PART_V ? CODEC_USE_VALUES : p == PART_LATENT ? CODEC_USE_LATENT : CODEC_USE_KEYS; }

static int set_part_codec(CacheLayout *cl, int p, const Codec *given, char *err, size_t errlen) {
    char why[256];
    Codec cc = *given;
    cc.use = part_use(p);
    cc.head = cl->part[p].head;
    const Codec *c = &cc;
    if (codec_traits(c->kind)->check(c, cl->part[p].width, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "cache part %s (width %d): %s", PART_NAMES[p], cl->part[p].width, why);
        return -1;
    }
    // a codec that stores nothing gives back one constant whatever was written (qet with levels=0,
    // k1=1 and no second stage): refused, not served (a token of 0 bytes also has no place in a block)
    if (codec_bytes_per_token_avg(c, cl->part[p].width) == 0) {
        char f[160];
        codec_format(c, f, sizeof(f));
        snprintf(err, errlen, "cache part %s (width %d): %s stores 0 bytes a token, so it cannot give back what was written: "
                 "give it more bits (for qet, k1 > 1, levels > 0 or a second stage)", PART_NAMES[p], cl->part[p].width, f);
        return -1;
    }
    // compared without `iters`, which only shapes the fitting: a package's cq:bits=8,c=4 fitted with
    // iters=10, named again as cq:bits=8,c=4, is the same codec and keeps its codebooks
    Codec was = cl->part[p].codec, now = *c;
    was.iters = now.iters = 0;
    char a[160], b[160];
    codec_format(&was, a, sizeof(a));
    codec_format(&now, b, sizeof(b));
    int fitted = 0;   // the part's streams hold codebooks (a package's, not yet dropped)
    for (int s = 0; cl->fit && s < cl->n_streams; s++) fitted |= cl->streams[s].part == p && cl->fit[s] != NULL;
    const int same = !strcmp(a, b), fitted_iters = cl->part[p].codec.iters;
    // another codec: the streams' fitted states no longer apply (freed by the codec they belong
    // to, so before the part changes codec)
    if (cl->fit && !same)
        for (int s = 0; s < cl->n_streams; s++)
            if (cl->streams[s].part == p) cache_layout_set_fit(cl, s, NULL);
    cl->part[p].codec = *c;
    cl->part[p].codec.fit = NULL;
    if (fitted && same) cl->part[p].codec.iters = fitted_iters;   // what the kept codebooks were fitted with
    return 0;
}

// "PART=..." with PART before any ':' (a codec's own settings hold '=' after its ':')
static int spec_has_part(const char *spec) {
    const char *eq = strchr(spec, '='), *colon = strchr(spec, ':');
    return eq && !(colon && colon < eq);
}

int cache_spec_names_part(const CacheLayout *cl, const char *spec, int p) {
    if (!cl->part[p].present) return 0;
    if (!spec_has_part(spec)) return 1;
    size_t n = (size_t)(strchr(spec, '=') - spec);
    return strlen(PART_NAMES[p]) == n && !strncmp(PART_NAMES[p], spec, n);
}

int cache_layout_apply_spec(CacheLayout *cl, const char *spec, char *err, size_t errlen) {
    const char *eq = strchr(spec, '=');
    Codec c;
    if (!spec_has_part(spec)) {   // one codec for every present part
        if (codec_parse(&c, spec, err, errlen) != 0) return -1;
        for (int p = 0; p < N_PARTS; p++)
            if (cl->part[p].present && set_part_codec(cl, p, &c, err, errlen) != 0) return -1;
        return 0;
    }
    int part = -1;
    for (int p = 0; p < N_PARTS; p++)
        if (strlen(PART_NAMES[p]) == (size_t)(eq - spec) && !strncmp(PART_NAMES[p], spec, (size_t)(eq - spec))) part = p;
    if (part < 0 || !cl->part[part].present) {
        char names[128] = "";
        for (int p = 0; p < N_PARTS; p++)
            if (cl->part[p].present) { strcat(names, names[0] ? ", " : ""); strcat(names, PART_NAMES[p]); }
        snprintf(err, errlen, "cache part '%.*s' is not stored by this model: its parts are %s", (int)(eq - spec), spec, names);
        return -1;
    }
    if (codec_parse(&c, eq + 1, err, errlen) != 0) return -1;
    return set_part_codec(cl, part, &c, err, errlen);
}

cJSON *cache_layout_to_json(const CacheLayout *cl) {
    cJSON *o = cJSON_CreateObject();
    char buf[160];
    for (int p = 0; p < N_PARTS; p++) {
        if (!cl->part[p].present) continue;
        codec_format(&cl->part[p].codec, buf, sizeof(buf));
        cJSON_AddStringToObject(o, PART_NAMES[p], buf);
    }
    return o;
}

int cache_layout_from_json(CacheLayout *cl, const ModelConfig *m, const cJSON *j, char *err, size_t errlen) {
    cache_layout(cl, m);
    if (!cJSON_IsObject(j)) { snprintf(err, errlen, "\"cache\" must be an object {\"part\": \"codec\"}"); return -1; }
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        if (!cJSON_IsString(it)) { snprintf(err, errlen, "cache.%s must be a codec spec string", it->string); return -1; }
        // a key is a part's name, nothing else: "int_group:bits" (a codec spec) would read as a
        // codec for every part
        int named = 0;
        for (int p = 0; p < N_PARTS; p++) named |= !strcmp(it->string, PART_NAMES[p]);
        if (!named) {
            snprintf(err, errlen, "cache key '%s' is not a cache part (k, v, latent, k_rope or own_k_rope, each naming its codec)",
                     it->string);
            return -1;
        }
        char spec[320];
        if (snprintf(spec, sizeof(spec), "%s=%s", it->string, it->valuestring) >= (int)sizeof(spec)) {
            snprintf(err, errlen, "cache.%s: a codec spec of %zu bytes (at most %zu)", it->string, strlen(it->valuestring),
                     sizeof(spec) - strlen(it->string) - 2);
            return -1;
        }
        if (cache_layout_apply_spec(cl, spec, err, errlen) != 0) return -1;
    }
    for (int p = 0; p < N_PARTS; p++)
        if (cl->part[p].present && !cJSON_GetObjectItemCaseSensitive(j, PART_NAMES[p])) {
            snprintf(err, errlen, "cache section lacks part '%s' (every stored part names its codec)", PART_NAMES[p]);
            return -1;
        }
    return 0;
}

// ---------------------------------------------------------------- layout and roles

void cache_layout(CacheLayout *cl, const ModelConfig *m) {
    memset(cl, 0, sizeof(*cl));
    int L = m->num_hidden_layers, F = m->share_factor, latent = config_is_latent(m);
    cl->n_layers = L;
    cl->share_factor = F;
    cl->share = m->share;
    cl->n_slots = (L - 1) / F + 1;   // ceil(L / F), no overflow at F = INT_MAX
    Codec bf16 = {.kind = CODEC_BF16};
    if (!latent) {
        cl->part[PART_K] = (CachePart){1, m->num_key_value_heads * m->head_dim, bf16, 0};
        cl->part[PART_V] = (CachePart){1, m->num_key_value_heads * m->v_head_dim, bf16, 0};
    } else {
        Codec lat = bf16;
        if (m->latent_quant_bits) lat = (Codec){.kind = CODEC_INT_GROUP, .bits = m->latent_quant_bits, .group = m->latent_quant_group};
        cl->part[PART_LATENT] = (CachePart){1, m->kv_lora_rank, lat, 0};
        cl->part[PART_KROPE] = (CachePart){1, m->qk_rope_head_dim, bf16, 0};
    }
    // consumers of share=latent and latent_kvproj project their own rope key; latent_krope and
    // MLA (F = 1) read the slot's; a model of one layer has no consumer, so no such part (it was
    // present with no stream: its bits per element came out 0/0 in eval's report)
    int consumer_krope = latent && F > 1 && L > 1 && (m->share == SHARE_LATENT || m->share == SHARE_LATENT_KVPROJ);
    if (consumer_krope) cl->part[PART_OWN_KROPE] = (CachePart){1, m->qk_rope_head_dim, bf16, 0};
    // one attention head's channels: K and V hold num_key_value_heads heads; the latent and the
    // rope keys are one vector each (one "head" for the codecs that work per head)
    cl->part[PART_K].head = m->head_dim;
    cl->part[PART_V].head = m->v_head_dim;
    for (int p = PART_LATENT; p < N_PARTS; p++) cl->part[p].head = cl->part[p].width;
    for (int p = 0; p < N_PARTS; p++) {
        cl->part[p].codec.use = part_use(p);
        cl->part[p].codec.head = cl->part[p].head;
    }

    cl->role = xcalloc((size_t)L, sizeof(LayerRole));
    cl->streams = xcalloc((size_t)L * 2, sizeof(CacheStream));
    for (int l = 0; l < L; l++) {
        LayerRole *r = &cl->role[l];
        int producer_layer = l - l % F;
        r->slot = l / F;
        r->producer = l == producer_layer;
        r->own_krope = consumer_krope && !r->producer;
        r->kv_b_layer = latent && !r->producer && m->share == SHARE_LATENT_KVPROJ ? producer_layer : l;
        for (int p = 0; p < N_PARTS; p++) r->stream[p] = -1;
        if (r->producer) {
            for (int p = 0; p < N_PARTS; p++) {
                if (!cl->part[p].present || p == PART_OWN_KROPE) continue;
                cl->streams[cl->n_streams] = (CacheStream){p, l};
                r->stream[p] = cl->n_streams++;
            }
        } else {
            memcpy(r->stream, cl->role[producer_layer].stream, sizeof(r->stream));
            if (r->own_krope) {
                cl->streams[cl->n_streams] = (CacheStream){PART_OWN_KROPE, l};
                r->stream[PART_KROPE] = cl->n_streams++;
            }
        }
    }
}

static void free_fit(CacheLayout *cl, int s) {
    if (!cl->fit || !cl->fit[s]) return;
    if (cl->owns_fit) {
        const CodecTraits *t = codec_traits(cl->part[cl->streams[s].part].codec.kind);
        if (t->fit_free) t->fit_free(cl->fit[s]);
    }
    cl->fit[s] = NULL;
}

void cache_layout_free(CacheLayout *cl) {
    if (cl->fit) {
        for (int s = 0; s < cl->n_streams; s++) free_fit(cl, s);
        free(cl->fit);
    }
    free(cl->role);
    free(cl->streams);
    cl->role = NULL;
    cl->streams = NULL;
    cl->fit = NULL;
}

Codec cache_stream_codec(const CacheLayout *cl, int s) {
    Codec c = cl->part[cl->streams[s].part].codec;
    c.fit = cl->fit ? cl->fit[s] : NULL;
    return c;
}

void cache_layout_set_fit(CacheLayout *cl, int s, void *state) {
    if (!cl->fit) {
        if (!state) return;
        cl->fit = xcalloc((size_t)cl->n_streams, sizeof(void *));
        cl->owns_fit = 1;
    }
    // a copy that shares its source's states may drop one (another codec for the part), not own one
    if (!cl->owns_fit && state) die("internal error: setting a fitted state in a layout that shares its states");
    free_fit(cl, s);
    cl->fit[s] = state;
}

int cache_layout_check_fitted(const CacheLayout *cl, char *err, size_t errlen) {
    for (int s = 0; s < cl->n_streams; s++) {
        const CachePart *part = &cl->part[cl->streams[s].part];
        if (codec_needs_fit(&part->codec) && !(cl->fit && cl->fit[s])) {
            char spec[160];
            codec_format(&part->codec, spec, sizeof(spec));
            snprintf(err, errlen, "cache part %s uses %s, whose codebooks are learned from the model's own activations: "
                     "run clla calibrate MODEL --data SHARDS --cache-codec %s=%s --out PACKAGE, then serve PACKAGE",
                     cache_part_name(cl->streams[s].part), spec, cache_part_name(cl->streams[s].part), spec);
            return -1;
        }
    }
    return 0;
}

void cache_layout_copy(CacheLayout *dst, const CacheLayout *src) {
    *dst = *src;
    dst->owns_fit = 0;
    if (src->fit) {
        dst->fit = xmalloc((size_t)src->n_streams * sizeof(void *));
        memcpy(dst->fit, src->fit, (size_t)src->n_streams * sizeof(void *));
    }
    dst->role = xmalloc((size_t)src->n_layers * sizeof(LayerRole));
    memcpy(dst->role, src->role, (size_t)src->n_layers * sizeof(LayerRole));
    dst->streams = xmalloc((size_t)(src->n_streams ? src->n_streams : 1) * sizeof(CacheStream));
    memcpy(dst->streams, src->streams, (size_t)src->n_streams * sizeof(CacheStream));
}

double cache_stream_bytes_per_token(const CacheLayout *cl, int s) {
    const CachePart *part = &cl->part[cl->streams[s].part];
    return codec_bytes_per_token_avg(&part->codec, part->width);
}

double cache_layout_bytes_per_token(const CacheLayout *cl) {
    double total = 0;
    for (int s = 0; s < cl->n_streams; s++) total += cache_stream_bytes_per_token(cl, s);
    return total;
}

double cache_layout_read_bytes_per_token(const CacheLayout *cl) {
    double total = 0;
    for (int l = 0; l < cl->n_layers; l++)
        for (int p = 0; p < N_PARTS; p++)
            if (cl->role[l].stream[p] >= 0) total += cache_stream_bytes_per_token(cl, cl->role[l].stream[p]);
    return total;
}

int cache_layout_has_blocks(const CacheLayout *cl) {
    for (int p = 0; p < N_PARTS; p++)
        if (cl->part[p].present && codec_has_window(&cl->part[p].codec)) return 1;
    return 0;
}

int cache_layout_block_tokens(const CacheLayout *cl, char *err, size_t errlen) {
    // the largest block of the layout's block codecs (a kivi residual of 4 is a window of 4 tokens,
    // not of 16; kivi residual=1, one token), else CACHE_MIN_BLOCK_TOKENS
    int bt = 1;
    for (int p = 0; p < N_PARTS; p++)
        if (cl->part[p].present && codec_block_tokens(&cl->part[p].codec) > bt) bt = codec_block_tokens(&cl->part[p].codec);
    if (!cache_layout_has_blocks(cl)) bt = CACHE_MIN_BLOCK_TOKENS;
    for (int p = 0; p < N_PARTS; p++) {
        if (!cl->part[p].present) continue;
        int b = codec_block_tokens(&cl->part[p].codec);
        if (bt % b) {
            snprintf(err, errlen, "cache part %s encodes blocks of %d tokens, which do not divide the cache's blocks of %d: "
                     "give every block codec a block (kivi residual) that divides the largest, e.g. powers of two",
                     cache_part_name(p), b, bt);
            return -1;
        }
    }
    return bt;
}


void cache_bytes_per_token(const ModelConfig *m, CacheBytes *out) {
    CacheLayout cl;
    cache_layout(&cl, m);
    int L = m->num_hidden_layers;
    double paper = 0;
    for (int l = 0; l < L; l++) {
        // The paper's Table 4 figure, per layer on average: K and V in bf16 bytes for MHA/GQA;
        // elements (not bytes) of latent + k_rope for MLA/CLLA, consumers' own k_rope included;
        // for CLLA-quant only the packed latent codes (no k_rope, no scales).
        int producer = cl.role[l].producer;
        if (!config_is_latent(m)) {
            if (producer) paper += 2.0 * ((double)cl.part[PART_K].width + cl.part[PART_V].width);
        } else if (m->latent_quant_bits) {
            if (producer) paper += (double)m->kv_lora_rank * m->latent_quant_bits / 8.0;   // in double: 2^28 x 8 is past INT_MAX
        } else {
            if (producer) paper += (double)m->kv_lora_rank + m->qk_rope_head_dim;
            else if (cl.role[l].own_krope) paper += m->qk_rope_head_dim;
        }
    }
    out->total = cache_layout_bytes_per_token(&cl);
    out->per_layer = out->total / L;
    out->paper = paper / L;
    out->mha_total = (double)L * m->num_attention_heads * (m->head_dim + m->v_head_dim) * 2.0;
    cache_layout_free(&cl);
}
