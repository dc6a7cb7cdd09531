// KIVI: asymmetric min-max quantization, keys per channel in token groups, values per token in
// channel groups, a recent fp16 window. The layout is documented in quant/kivi.h and
// docs/QUANTIZERS.md.
#include "quant/kivi.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/num.h"
#include "quant/qpack.h"

KiviSettings kivi_defaults(void) {
    KiviSettings s = {KIVI_DEFAULT_BITS, KIVI_DEFAULT_GROUP, KIVI_DEFAULT_RESIDUAL};
    return s;
}

int kivi_settings_parse(const char *spec, KiviSettings *s, char *err, size_t errlen) {
    char key[32], val[64];
    int rc;
    while ((rc = qp_spec_next(&spec, key, sizeof(key), val, sizeof(val), err, errlen)) == 1) {
        if (!strcmp(key, "bits")) rc = qp_spec_int(key, val, 1, 8, &s->bits, err, errlen);
        else if (!strcmp(key, "group")) rc = qp_spec_int(key, val, 1, 1 << 20, &s->group, err, errlen);
        else if (!strcmp(key, "residual")) rc = qp_spec_int(key, val, 0, 1 << 24, &s->residual, err, errlen);
        else {
            snprintf(err, errlen, "kivi: unknown setting '%s' (known: bits, group, residual)", key);
            return -1;
        }
        if (rc) return qp_prefix_err("kivi", err, errlen);
    }
    return rc ? qp_prefix_err("kivi", err, errlen) : 0;
}

int kivi_settings_check(const KiviSettings *s, KiviPart part, int64_t H, char *err, size_t errlen) {
    if (s->bits < 1 || s->bits > 8) {
        snprintf(err, errlen, "kivi: bits=%d is not supported: use 1..8 (the reference code runs 2 and 4)", s->bits);
        return -1;
    }
    if (s->group < 1) {
        snprintf(err, errlen, "kivi: group=%d: use a group of at least 1 (the default is 32)", s->group);
        return -1;
    }
    if (s->residual < 0 || s->residual % s->group) {
        snprintf(err, errlen, "kivi: residual=%d is not a multiple of group=%d: keys are flushed from the "
                 "fp16 window a whole number of token groups at a time", s->residual, s->group);
        return -1;
    }
    if (H < 1 || H > (1 << 24)) {
        snprintf(err, errlen, "kivi: width %lld outside 1..16777216", (long long)H);
        return -1;
    }
    if (part == KIVI_VALUES && H % s->group) {
        snprintf(err, errlen, "kivi: group=%d does not divide the value width %lld: values are quantized "
                 "per token in groups of that many channels", s->group, (long long)H);
        return -1;
    }
    return 0;
}

int64_t kivi_quantized_tokens(const KiviSettings *s, KiviPart part, int64_t T) {
    if (part == KIVI_VALUES) return T > s->residual ? T - s->residual : 0;
    const int64_t chunk = s->residual > 0 ? s->residual : s->group;
    return T - T % chunk;
}

// Bytes of one quantized block: a token group of keys, or one token of values.
static int block_bytes(const KiviSettings *s, KiviPart part, int64_t H, int64_t *out) {
    int64_t codes, bits, groups = part == KIVI_KEYS ? H : H / s->group, head;
    if (ck_mul(H, part == KIVI_KEYS ? s->group : 1, &codes) || ck_mul(codes, s->bits, &bits)
        || ck_mul(groups, 4, &head)) return -1;
    return ck_add(head, (bits + 7) / 8, out);
}

int kivi_bytes(const KiviSettings *s, KiviPart part, int64_t T, int64_t H, int64_t *bytes) {
    const int64_t nq = kivi_quantized_tokens(s, part, T);
    const int64_t nblocks = part == KIVI_KEYS ? nq / s->group : nq;
    int64_t blk, q, win, total;
    if (block_bytes(s, part, H, &blk) || ck_mul(blk, nblocks, &q) || ck_mul(T - nq, H, &win)
        || ck_mul(win, 2, &win) || ck_add(q, win, &total)) return -1;
    *bytes = total;
    return 0;
}

// One group: n values at x[i * stride]; writes (fp16 scale, fp16 min) at head and the codes at
// code indices first + i * cstride of codes. -1 (nothing written) when the scale overflows fp16:
// at 1 bit, max - min up to 2 x 65504 is one level (the stored scale was inf, and every value of
// the group decoded to NaN); from 2 bits on it cannot.
static int quantize_group(const float *x, int64_t n, int64_t stride, int bits, uint8_t *head,
                           uint8_t *codes, int64_t first, int64_t cstride) {
    float mn = x[0], mx = x[0];
    for (int64_t i = 1; i < n; i++) {
        const float v = x[i * stride];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    const int levels = (1 << bits) - 1;
    const uint16_t mn_h = qp_f16_down(mn);
    const float mnf = qp_f16_to_f32(mn_h);
    // The scale rounded up (in double, then to float upwards, then to fp16 upwards) so that
    // mnf + levels * scale >= mx and the top element needs no clamping.
    const double want = ((double)mx - mnf) / levels;
    float wf = (float)want;
    if ((double)wf < want) wf = nextafterf(wf, INFINITY);
    const uint16_t sc_h = want > 0 ? qp_f16_up(wf) : 0;
    const float sc = qp_f16_to_f32(sc_h);
    if (isinf(sc)) return -1;
    qp_put_u16(head, sc_h);
    qp_put_u16(head + 2, mn_h);
    for (int64_t i = 0; i < n; i++) {
        long q = 0;
        if (sc > 0) {
            q = lrint(((double)x[i * stride] - mnf) / sc);
            q = q < 0 ? 0 : q > levels ? levels : q;
        }
        qp_put_code(codes, first + i * cstride, bits, (unsigned)q);
    }
    return 0;
}

static void dequantize_group(float *x, int64_t n, int64_t stride, int bits, const uint8_t *head,
                             const uint8_t *codes, int64_t first, int64_t cstride) {
    const float sc = qp_f16_to_f32(qp_get_u16(head)), mn = qp_f16_to_f32(qp_get_u16(head + 2));
    for (int64_t i = 0; i < n; i++)
        x[i * stride] = mn + (float)qp_get_code(codes, first + i * cstride, bits) * sc;
}

// the error of a group whose scale overflows fp16 (quantize_group): the group named, -1
static int64_t scale_overflow(const KiviSettings *s, const char *along, int64_t at, const char *over, int64_t first,
                              char *err, size_t errlen) {
    snprintf(err, errlen, "kivi: the group of %s %lld over %s %lld to %lld spans more than fp16's largest scale "
             "(max - min > %d x 65504 at %d bit%s); use more bits",
             along, (long long)at, over, (long long)first, (long long)(first + s->group - 1), (1 << s->bits) - 1, s->bits,
             s->bits == 1 ? "" : "s");
    return -1;
}

int64_t kivi_encode(const KiviSettings *s, KiviPart part, const float *x, int64_t T, int64_t H,
                    uint8_t *out, int64_t cap, char *err, size_t errlen) {
    int64_t bytes, blk, n, bad;
    if (kivi_settings_check(s, part, H, err, errlen)) return -1;
    if (T < 0 || kivi_bytes(s, part, T, H, &bytes) || block_bytes(s, part, H, &blk) || ck_mul(T, H, &n)) {
        snprintf(err, errlen, "kivi: %lld tokens of width %lld overflow the size arithmetic", (long long)T, (long long)H);
        return -1;
    }
    if (bytes > cap) {
        snprintf(err, errlen, "kivi: output buffer of %lld bytes, %lld needed", (long long)cap, (long long)bytes);
        return -1;
    }
    if (qp_check_f16_range(x, n, &bad)) {
        snprintf(err, errlen, "kivi: value %g at token %lld, channel %lld is not finite or beyond fp16's "
                 "range (|x| <= 65504)", (double)x[bad], (long long)(bad / H), (long long)(bad % H));
        return -1;
    }
    memset(out, 0, (size_t)bytes);
    const int64_t nq = kivi_quantized_tokens(s, part, T), G = s->group;
    uint8_t *p = out;
    if (part == KIVI_KEYS) {
        for (int64_t t0 = 0; t0 < nq; t0 += G, p += blk)
            for (int64_t c = 0; c < H; c++)   // channel c over the G tokens of the group
                if (quantize_group(x + t0 * H + c, G, H, s->bits, p + 4 * c, p + 4 * H, c * G, 1))
                    return scale_overflow(s, "channel", c, "tokens", t0, err, errlen);
    } else {
        const int64_t ng = H / G;
        for (int64_t t = 0; t < nq; t++, p += blk)
            for (int64_t g = 0; g < ng; g++)
                if (quantize_group(x + t * H + g * G, G, 1, s->bits, p + 4 * g, p + 4 * ng, g * G, 1))
                    return scale_overflow(s, "token", t, "channels", g * G, err, errlen);
    }
    for (int64_t i = nq * H; i < T * H; i++, p += 2) qp_put_u16(p, qp_f32_to_f16(x[i]));
    return bytes;
}

int kivi_decode(const KiviSettings *s, KiviPart part, const uint8_t *in, int64_t nbytes, int64_t T,
                int64_t H, float *x, char *err, size_t errlen) {
    int64_t bytes, blk;
    if (kivi_settings_check(s, part, H, err, errlen)) return -1;
    if (T < 0 || kivi_bytes(s, part, T, H, &bytes) || block_bytes(s, part, H, &blk) || bytes != nbytes) {
        snprintf(err, errlen, "kivi: %lld bytes do not hold %lld tokens of width %lld", (long long)nbytes,
                 (long long)T, (long long)H);
        return -1;
    }
    const int64_t nq = kivi_quantized_tokens(s, part, T), G = s->group;
    const uint8_t *p = in;
    if (part == KIVI_KEYS) {
        for (int64_t t0 = 0; t0 < nq; t0 += G, p += blk)
            for (int64_t c = 0; c < H; c++)
                dequantize_group(x + t0 * H + c, G, H, s->bits, p + 4 * c, p + 4 * H, c * G, 1);
    } else {
        const int64_t ng = H / G;
        for (int64_t t = 0; t < nq; t++, p += blk)
            for (int64_t g = 0; g < ng; g++)
                dequantize_group(x + t * H + g * G, G, 1, s->bits, p + 4 * g, p + 4 * ng, g * G, 1);
    }
    for (int64_t i = nq * H; i < T * H; i++, p += 2) x[i] = qp_f16_to_f32(qp_get_u16(p));
    return 0;
}

double kivi_bits_stored(const KiviSettings *s, KiviPart part, int64_t T, int64_t H) {
    int64_t bytes;
    if (T <= 0 || H <= 0 || kivi_bytes(s, part, T, H, &bytes)) return 0;
    return 8.0 * (double)bytes / ((double)T * (double)H);
}

double kivi_bits_paper(const KiviSettings *s) { return s->bits; }
