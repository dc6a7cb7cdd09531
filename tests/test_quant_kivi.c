// KIVI (quant/kivi.h): every quantized element within scale/2 of its decoded value, with the
// scale and minimum of ITS group recomputed here from the data (so keys really are grouped per
// channel over G tokens and values per token over G channels); the fp16 window decodes to
// exactly fp16(x); the split between quantized tokens and the window follows the residual
// rules; bytes written == kivi_bytes == the stored bits per element; appending tokens never
// rewrites earlier blocks; bad settings and inputs are refused with a message.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "quant/kivi.h"
#include "quant/qpack.h"

static int passed, failed;
static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

// Keys with a few large-magnitude channels (the outlier channels KIVI's key grouping is for).
static float *make_data(int64_t T, int64_t H, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < H; c++)
            x[t * H + c] = (float)(rng_normal(&r) * (c % 13 == 0 ? 20.0 : 1.0) + (c % 5) * 0.5);
    return x;
}

// The stored (fp16 scale, fp16 min) of the group holding token t, channel c, read from the
// layout of quant/kivi.h.
static void stored_group(const KiviSettings *s, KiviPart part, const uint8_t *buf, int64_t H, int64_t t, int64_t c,
                         float *scale, float *mn) {
    const int64_t G = s->group;
    const uint8_t *head;
    if (part == KIVI_KEYS) {
        const int64_t blk = 4 * H + (H * G * s->bits + 7) / 8;
        head = buf + (t / G) * blk + 4 * c;
    } else {
        const int64_t blk = 4 * (H / G) + (H * s->bits + 7) / 8;
        head = buf + t * blk + 4 * (c / G);
    }
    *scale = qp_f16_to_f32(qp_get_u16(head));
    *mn = qp_f16_to_f32(qp_get_u16(head + 2));
}

// Checks every quantized element against its group: the stored minimum is at most the group's
// minimum (and the fp16 just below it at worst), the stored scale at least (max - min)/(2^b - 1)
// and at most 2^-10 above it, and the element is within scale/2 of its decoded value.
static int within_bound(const KiviSettings *s, KiviPart part, const float *x, const float *y, const uint8_t *buf,
                        int64_t T, int64_t H, double *max_rel) {
    const int64_t nq = kivi_quantized_tokens(s, part, T), G = s->group;
    const int levels = (1 << s->bits) - 1;
    int ok = 1;
    *max_rel = 0;
    for (int64_t t = 0; t < nq; t++)
        for (int64_t c = 0; c < H; c++) {
            float mn = INFINITY, mx = -INFINITY;
            if (part == KIVI_KEYS) {
                const int64_t t0 = t - t % G;
                for (int64_t j = t0; j < t0 + G; j++) {
                    mn = fminf(mn, x[j * H + c]);
                    mx = fmaxf(mx, x[j * H + c]);
                }
            } else {
                const int64_t c0 = c - c % G;
                for (int64_t j = c0; j < c0 + G; j++) {
                    mn = fminf(mn, x[t * H + j]);
                    mx = fmaxf(mx, x[t * H + j]);
                }
            }
            float sc, smn;
            stored_group(s, part, buf, H, t, c, &sc, &smn);
            const double need = ((double)mx - smn) / levels;
            if (smn > mn || smn < mn - fabsf(mn) / 1024 - 6e-8f) ok = 0;
            if (sc < need || sc > need * (1 + 1.0 / 1024) + 6e-8) ok = 0;
            const double e = fabs((double)x[t * H + c] - y[t * H + c]);
            if (e > sc / 2.0 * (1 + 1e-6) + 1e-7 * fabs(x[t * H + c])) ok = 0;
            if (sc > 0 && e / sc > *max_rel) *max_rel = e / sc;
        }
    for (int64_t i = nq * H; i < T * H; i++)
        if (y[i] != qp_f16_round(x[i])) ok = 0;
    return ok;
}

static void test_roundtrip(KiviPart part, int bits, int G, int R, int64_t T, int64_t H) {
    char name[200], err[256];
    KiviSettings s = {bits, G, R};
    const char *pn = part == KIVI_KEYS ? "keys" : "values";
    float *x = make_data(T, H, (uint64_t)(bits * 7 + G + R + T + part)), *y = calloc((size_t)(T * H), sizeof(float));
    int64_t bytes = -1;
    check(kivi_bytes(&s, part, T, H, &bytes) == 0, "kivi_bytes computes");
    uint8_t *buf = malloc((size_t)bytes + 16);
    int64_t wrote = kivi_encode(&s, part, x, T, H, buf, bytes + 16, err, sizeof(err));
    int dec = kivi_decode(&s, part, buf, wrote, T, H, y, err, sizeof(err));
    double rel;
    int ok = wrote >= 0 && dec == 0 && within_bound(&s, part, x, y, buf, T, H, &rel);
    snprintf(name, sizeof(name), "kivi %s b=%d G=%d R=%d T=%lld H=%lld: stored scale/min fit its own group, |x - x'| <= scale/2 "
             "(max %.3f scale), window == fp16(x)", pn, bits, G, R, (long long)T, (long long)H, ok ? rel : -1.0);
    check(ok, name);
    const double stored = kivi_bits_stored(&s, part, T, H);
    snprintf(name, sizeof(name), "kivi %s b=%d G=%d R=%d T=%lld: bytes written %lld == kivi_bytes %lld == "
             "%.4f bits/elem (paper %.0f)", pn, bits, G, R, (long long)T, (long long)wrote, (long long)bytes,
             stored, kivi_bits_paper(&s));
    check(wrote == bytes && fabs(stored * (double)(T * H) / 8 - (double)bytes) < 1e-6, name);
    // the split: keys flush R tokens at a time, values slide
    const int64_t nq = kivi_quantized_tokens(&s, part, T);
    const int64_t want = part == KIVI_KEYS ? T - T % (R ? R : G) : (T > R ? T - R : 0);
    snprintf(name, sizeof(name), "kivi %s G=%d R=%d T=%lld: %lld tokens quantized, %lld in the fp16 window", pn, G, R,
             (long long)T, (long long)nq, (long long)(T - nq));
    check(nq == want && (part == KIVI_VALUES || nq % G == 0), name);
    // the exact byte count from the layout of quant/kivi.h
    const int64_t blk = part == KIVI_KEYS ? 4 * H + (H * G * bits + 7) / 8 : 4 * (H / G) + (H * bits + 7) / 8;
    const int64_t layout = (part == KIVI_KEYS ? nq / G : nq) * blk + (T - nq) * H * 2;
    snprintf(name, sizeof(name), "kivi %s b=%d G=%d: %lld bytes = blocks of (fp16 scale, fp16 min) + packed codes "
             "+ fp16 window", pn, bits, G, (long long)layout);
    check(layout == bytes, name);
    // streaming: the quantized blocks of every prefix are a prefix of the whole's
    int prefix_ok = 1;
    for (int64_t t = 1; t <= T && prefix_ok; t += 1 + t / 7) {
        int64_t b2, nq2 = kivi_quantized_tokens(&s, part, t);
        kivi_bytes(&s, part, t, H, &b2);
        uint8_t *buf2 = malloc((size_t)b2 + 1);
        if (kivi_encode(&s, part, x, t, H, buf2, b2, err, sizeof(err)) != b2) prefix_ok = 0;
        const int64_t qbytes = (part == KIVI_KEYS ? nq2 / G : nq2) * blk;
        if (memcmp(buf2, buf, (size_t)qbytes) != 0) prefix_ok = 0;
        free(buf2);
    }
    snprintf(name, sizeof(name), "kivi %s G=%d R=%d: appending tokens never rewrites earlier quantized blocks", pn, G, R);
    check(prefix_ok, name);
    free(x); free(y); free(buf);
}

// quant/qpack.h's fp16: every finite half survives f16 -> f32 -> f16; a value halfway between
// two halves rounds to the even one; qp_f16_down/up bracket x by adjacent halves; codes of every
// width pack and unpack.
static void test_qpack(void) {
    int rt = 1, even = 1, bracket = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 31) == 31) continue;   // inf, NaN
        const float v = qp_f16_to_f32((uint16_t)h);
        rt &= qp_f32_to_f16(v) == h;
        if ((h & 0x7fff) < 0x7bff) {            // midpoint to the next half up in magnitude
            const float w = qp_f16_to_f32((uint16_t)(h + 1));
            const float mid = (float)(((double)v + w) / 2);
            const uint16_t r = qp_f32_to_f16(mid);
            even &= (r & 1) == 0 && (r == h || r == h + 1);
            const float x = (float)((double)v + 0.3 * ((double)w - v));
            const uint16_t dn = qp_f16_down(x), up = qp_f16_up(x);
            const float fd = qp_f16_to_f32(dn), fu = qp_f16_to_f32(up);
            if (!(h & 0x8000u)) bracket &= fd <= x && fu >= x && dn == h && up == h + 1;
            else bracket &= fd <= x && fu >= x && up == h && dn == h + 1;
        }
    }
    check(rt, "qpack: every finite fp16 value survives f16 -> f32 -> f16");
    check(even, "qpack: halfway values round to the even fp16");
    check(bracket && qp_f32_to_f16(65520.0f) == 0x7c00 && qp_f32_to_f16(65519.0f) == 0x7bff,
          "qpack: f16_down/f16_up bracket x by adjacent halves; 65520 overflows, 65519 does not");
    int pack = 1;
    for (int bits = 1; bits <= 8; bits++) {
        uint8_t buf[64] = {0};
        for (int i = 0; i < 50; i++) qp_put_code(buf, i, bits, (unsigned)(i * 37 + bits) & ((1u << bits) - 1));
        for (int i = 0; i < 50; i++) pack &= qp_get_code(buf, i, bits) == ((unsigned)(i * 37 + bits) & ((1u << bits) - 1));
        pack &= bits * 50 % 8 == 0 || buf[bits * 50 / 8] >> (bits * 50 % 8) == 0;   // nothing past the last code
    }
    check(pack, "qpack: codes of 1..8 bits pack LSB first and unpack");
}

static void test_constant_and_edges(void) {
    char err[256];
    KiviSettings s = {2, 4, 0};
    float x[16], y[16];
    for (int i = 0; i < 16; i++) x[i] = 3.25f;
    x[15] = -1e-30f;   // a tiny value next to constants
    uint8_t buf[256];
    int64_t w = kivi_encode(&s, KIVI_VALUES, x, 4, 4, buf, sizeof(buf), err, sizeof(err));
    int ok = w > 0 && kivi_decode(&s, KIVI_VALUES, buf, w, 4, 4, y, err, sizeof(err)) == 0;
    for (int i = 0; i < 12 && ok; i++) ok = y[i] == 3.25f;
    check(ok && fabsf(y[15] - x[15]) < 1e-6f, "kivi: a constant group decodes exactly (scale 0), tiny values stay finite");
}

static void expect_refused(const KiviSettings *s, KiviPart part, int64_t H, const char *want, const char *what) {
    char err[256] = "", name[300];
    const int rc = kivi_settings_check(s, part, H, err, sizeof(err));
    snprintf(name, sizeof(name), "kivi refuses %s: \"%s\"", what, err);
    check(rc == -1 && strstr(err, want) != NULL && !strchr(err, '\n'), name);
}

static void test_bad_input(void) {
    KiviSettings s = kivi_defaults();
    char err[256] = "";
    check(kivi_settings_check(&s, KIVI_VALUES, 64, err, sizeof(err)) == 0, "kivi: the defaults (b=2, G=32, R=128) are valid");
    KiviSettings b = s;
    b.bits = 9;
    expect_refused(&b, KIVI_KEYS, 64, "bits=9", "bits=9");
    b.bits = 0;
    expect_refused(&b, KIVI_KEYS, 64, "bits=0", "bits=0");
    b = s;
    b.residual = 48;
    expect_refused(&b, KIVI_KEYS, 64, "residual=48", "a residual that is not a multiple of the group");
    b = s;
    expect_refused(&b, KIVI_VALUES, 48, "does not divide", "a group that does not divide the value width");
    b.group = 0;
    expect_refused(&b, KIVI_KEYS, 64, "group=0", "group 0");
    // settings strings
    KiviSettings p = kivi_defaults();
    check(kivi_settings_parse("bits=4,group=16,residual=64", &p, err, sizeof(err)) == 0 && p.bits == 4
          && p.group == 16 && p.residual == 64, "kivi: settings string parsed");
    const char *bad[] = {"bits=4abc", "bits=", "group=1e3", "bits=2,", "colour=3", "bits=99", "residual=-32", "bits"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[300];
        err[0] = 0;
        const int rc = kivi_settings_parse(bad[i], &p, err, sizeof(err));
        snprintf(name, sizeof(name), "kivi refuses the settings \"%s\": \"%s\"", bad[i], err);
        check(rc == -1 && err[0], name);
    }
    // inputs fp16 cannot hold, a short buffer, a wrong byte count at decode
    float x[64 * 2];
    for (int i = 0; i < 128; i++) x[i] = (float)i;
    uint8_t buf[1024];
    KiviSettings v = {2, 32, 0};
    x[77] = 1e6f;
    err[0] = 0;
    check(kivi_encode(&v, KIVI_VALUES, x, 2, 64, buf, sizeof(buf), err, sizeof(err)) == -1 && strstr(err, "fp16"),
          "kivi refuses a value beyond fp16's range");
    x[77] = NAN;
    check(kivi_encode(&v, KIVI_VALUES, x, 2, 64, buf, sizeof(buf), err, sizeof(err)) == -1, "kivi refuses NaN input");
    x[77] = 0;
    check(kivi_encode(&v, KIVI_VALUES, x, 2, 64, buf, 10, err, sizeof(err)) == -1 && strstr(err, "needed"),
          "kivi refuses a buffer that is too small");
    int64_t w = kivi_encode(&v, KIVI_VALUES, x, 2, 64, buf, sizeof(buf), err, sizeof(err));
    float y[128];
    check(w > 0 && kivi_decode(&v, KIVI_VALUES, buf, w - 1, 2, 64, y, err, sizeof(err)) == -1,
          "kivi decode refuses a byte count that is not the layout's");
    // 1 bit, a group spanning -40000 .. 40000 (each end within fp16): its scale, max - min, is past
    // fp16's largest; it was stored as inf and the whole group decoded to NaN
    KiviSettings one = {1, 32, 0};
    for (int i = 0; i < 128; i++) x[i] = (float)(i % 5);
    x[70] = -40000.0f, x[75] = 40000.0f;   // token 1, channels 6 and 11 (group 0 .. 31)
    for (int part = 0; part < 2; part++) {
        const KiviPart kp = part ? KIVI_VALUES : KIVI_KEYS;
        float xt[32 * 64];   // keys group over 32 tokens: 32 tokens with the two outliers in channel 5
        for (int i = 0; i < 32 * 64; i++) xt[i] = (float)(i % 3);
        xt[3 * 64 + 5] = -40000.0f, xt[9 * 64 + 5] = 40000.0f;
        uint8_t big[8192];
        err[0] = 0;
        const int64_t rc = kp == KIVI_KEYS ? kivi_encode(&one, kp, xt, 32, 64, big, sizeof(big), err, sizeof(err))
                                           : kivi_encode(&one, kp, x, 2, 64, big, sizeof(big), err, sizeof(err));
        char name[400];
        snprintf(name, sizeof(name), "kivi 1-bit %s: a group whose scale overflows fp16 is refused: \"%s\"",
                 kp == KIVI_KEYS ? "keys" : "values", err);
        check(rc == -1 && strstr(err, kp == KIVI_KEYS ? "group of channel 5 over tokens 0 to 31" : "group of token 1 over channels 0 to 31"),
              name);
    }
    x[70] = -30000.0f, x[75] = 30000.0f;   // 60000: one level still fits
    w = kivi_encode(&one, KIVI_VALUES, x, 2, 64, buf, sizeof(buf), err, sizeof(err));
    int finite = w > 0 && kivi_decode(&one, KIVI_VALUES, buf, w, 2, 64, y, err, sizeof(err)) == 0;
    for (int i = 0; finite && i < 128; i++) finite = isfinite(y[i]);
    check(finite, "kivi 1-bit: a group spanning 60000 encodes and decodes to finite values");
}

int main(void) {
    test_roundtrip(KIVI_KEYS, 2, 32, 128, 300, 64);
    test_roundtrip(KIVI_VALUES, 2, 32, 128, 300, 64);
    test_roundtrip(KIVI_KEYS, 4, 32, 64, 257, 96);
    test_roundtrip(KIVI_VALUES, 4, 32, 64, 257, 96);
    test_roundtrip(KIVI_KEYS, 3, 8, 0, 75, 40);
    test_roundtrip(KIVI_VALUES, 1, 8, 0, 75, 40);
    test_roundtrip(KIVI_KEYS, 8, 16, 32, 31, 16);   // shorter than the window: all fp16
    test_roundtrip(KIVI_KEYS, 3, 3, 6, 50, 20);     // code blocks that end inside a byte
    test_roundtrip(KIVI_VALUES, 3, 4, 0, 33, 20);
    test_qpack();
    test_constant_and_edges();
    test_bad_input();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
