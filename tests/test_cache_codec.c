// The cache layer's codecs: int_group codes stay in [-Imax, Imax], the per-element error is
// at most scale/2, a zero group decodes to zeros, decode(encode(x)) equals the backend's
// round trip bit for bit (so the inference cache serves exactly the training-time values),
// and bytes_per_token counts the scales. Also the CLLA-quant forward: the latent a model
// attends with is exactly the codec's round trip of its normalized latent. The cq codec (fitted
// state): through the codec table it stores what quant/cq.c encodes, its bytes per token are the
// accounting it prints, its state survives the package tensor (save, load) bit for bit, a bad
// tensor is refused, and a layout without its state says to calibrate.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "backend/int_group_math.h"
#include "model/cache.h"
#include "model/model.h"
#include "quant/cq.h"
#include "quant/qet.h"
#include "tests/lib/death.h"

static int passed, failed;
static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

static void test_int_group(int bits, int group, int W, int N) {
    char name[128];
    Codec c = {.kind = CODEC_INT_GROUP, .bits = bits, .group = group};
    Rng r;
    rng_seed(&r, (uint64_t)bits * 1000 + group);
    float *x = malloc(sizeof(float) * N * W), *rt = malloc(sizeof(float) * N * W), *dec = malloc(sizeof(float) * N * W);
    for (int i = 0; i < N * W; i++) x[i] = (float)(rng_normal(&r) * (1 + i % 7));
    for (int j = 0; j < group; j++) x[j] = 0.0f;   // row 0, group 0: all zeros
    x[group] = 1e-30f;                               // a tiny group must not blow up
    for (int j = 1; j < group; j++) x[group + j] = 0.0f;
    const Backend *be = backend_cpu();
    codec_roundtrip(&c, be, rt, x, N, W);
    size_t tok = codec_bytes_per_token(&c, W);
    unsigned char *bytes = malloc(tok * N);
    codec_encode(&c, bytes, x, N, W);
    codec_decode(&c, dec, bytes, N, W);
    int imax = int_group_imax(bits), in_range = 1, err_ok = 1, zero_ok = 1, finite = 1;
    for (int n = 0; n < N; n++)
        for (int g = 0; g < W / group; g++) {
            const float *xg = x + n * W + g * group;
            float absmax = 0;
            for (int j = 0; j < group; j++) absmax = int_group_absmax_step(absmax, xg[j]);
            float scale = int_group_scale(absmax, bits);
            for (int j = 0; j < group; j++) {
                int code = int_group_code(xg[j], scale, bits);
                if (code < -imax || code > imax) in_range = 0;
                float y = rt[n * W + g * group + j];
                if (!isfinite(y)) finite = 0;
                if (fabsf(y - xg[j]) > scale / 2 * (1 + 1e-6f)) err_ok = 0;
                if (absmax == 0 && y != 0) zero_ok = 0;
            }
        }
    snprintf(name, sizeof(name), "int_group b=%d g=%d: codes in [-%d, %d]", bits, group, imax, imax);
    check(in_range, name);
    snprintf(name, sizeof(name), "int_group b=%d g=%d: |error| <= scale/2, finite, zero group -> 0", bits, group);
    check(err_ok && finite && zero_ok, name);
    snprintf(name, sizeof(name), "int_group b=%d g=%d: decode(encode(x)) == roundtrip(x) bitwise", bits, group);
    check(memcmp(rt, dec, sizeof(float) * N * W) == 0, name);
    snprintf(name, sizeof(name), "int_group b=%d g=%d W=%d: %zu bytes/token = codes + bf16 scales", bits, group, W, tok);
    check(tok == (size_t)(W * bits + 7) / 8 + (size_t)(W / group) * 2, name);
    free(x); free(rt); free(dec); free(bytes);
}

// A group holding a NaN or an inf (activations that diverged): every value of that group is NaN,
// in the cache's decode as in the round trip, and the other groups are untouched. The NaN was
// dropped by the group's maximum and then converted to int (undefined): 0 in the cache, -2^31
// scale in the round trip.
static void test_int_group_non_finite(int bits, int group) {
    enum { N = 2, W = 64 };
    Codec c = {.kind = CODEC_INT_GROUP, .bits = bits, .group = group};
    float x[N * W], rt[N * W], dec[N * W];
    for (int i = 0; i < N * W; i++) x[i] = 0.25f * (float)((i * 37) % 11) - 1.0f;
    x[3] = NAN;                 // row 0, group 0
    x[W + group + 1] = INFINITY;   // row 1, group 1
    unsigned char bytes[N * 128];
    codec_roundtrip(&c, backend_cpu(), rt, x, N, W);
    codec_encode(&c, bytes, x, N, W);
    codec_decode(&c, dec, bytes, N, W);
    int ok = 1;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < W; j++) {
            const int bad_group = (n == 0 && j / group == 0) || (n == 1 && j / group == 1);
            const float a = rt[n * W + j], b = dec[n * W + j];
            if (bad_group ? !(isnan(a) && isnan(b)) : !(isfinite(a) && a == b)) ok = 0;
        }
    char name[160];
    snprintf(name, sizeof(name), "int_group b=%d g=%d: a group with a NaN or an inf decodes to NaN in the cache and the round trip alike", bits, group);
    check(ok, name);
}

// A finite group near the top of the float range decodes finite, within 1% of its values, in the
// cache and the round trip alike (its scale rounded past FLT_MAX / Imax: inf, or NaN at 2 bits).
static void test_int_group_huge(int bits) {
    enum { W = 8 };
    Codec c = {.kind = CODEC_INT_GROUP, .bits = bits, .group = 4};
    const float x[W] = {3.4e38f, 1.0f, 2.0f, 3.0f, -3.39e38f, 3.0e38f, -1.0e38f, 0.0f};
    float rt[W], dec[W];
    unsigned char bytes[64];
    codec_roundtrip(&c, backend_cpu(), rt, x, 1, W);
    codec_encode(&c, bytes, x, 1, W);
    codec_decode(&c, dec, bytes, 1, W);
    int ok = memcmp(rt, dec, sizeof(rt)) == 0;
    for (int i = 0; i < W; i++) {
        ok &= isfinite(dec[i]);
        if (fabsf(x[i]) > 1e37f) ok &= fabsf(dec[i] - x[i]) <= 0.01f * fabsf(x[i]) + 0.5f * (float)int_group_scale(3.4e38f, bits);
    }
    char name[160];
    snprintf(name, sizeof(name), "int_group b=%d: finite groups up to 3.4e38 decode finite and close, cache = round trip", bits);
    check(ok, name);
}

static void test_bf16_fp32(void) {
    float x[5] = {1.0f, -3.14159f, 1e-20f, 65504.0f, 0.0f}, y[5];
    unsigned char b[20];
    Codec f = {.kind = CODEC_FP32}, h = {.kind = CODEC_BF16};
    codec_encode(&f, b, x, 1, 5);
    codec_decode(&f, y, b, 1, 5);
    check(memcmp(x, y, sizeof(x)) == 0 && codec_bytes_per_token(&f, 5) == 20, "fp32 codec is exact, 4 bytes/value");
    codec_encode(&h, b, x, 1, 5);
    codec_decode(&h, y, b, 1, 5);
    int ok = codec_bytes_per_token(&h, 5) == 10;
    for (int i = 0; i < 5; i++) ok &= fabsf(y[i] - x[i]) <= fabsf(x[i]) * (1.0f / 256);
    check(ok, "bf16 codec: relative error <= 2^-8, 2 bytes/value");
}

// The latent a CLLA-quant model stores in its cache slot is the codec round trip of the
// normalized latent: recompute it from the model's own activations.
static void test_model_latent_is_codec_output(void) {
    Config cfg;
    config_from_json(&cfg, "{\"attention\":\"clla_quant\",\"vocab_size\":31,\"hidden_size\":32,\"num_attention_heads\":2,"
                           "\"head_dim\":8,\"intermediate_size\":24,\"num_hidden_layers\":3,\"kv_lora_rank\":64,"
                           "\"qk_rope_head_dim\":4,\"initializer_range\":0.2}", "test", 0, NULL);
    Model m;
    model_build(&m, &cfg.model, backend_cpu());
    model_init_weights(&m, 5);
    model_set_batch(&m, 1, 6);
    int32_t in[6] = {1, 5, 9, 30, 2, 2}, tg[6] = {5, 9, 30, 2, 2, 7};
    model_forward(&m, in, tg);
    int R = cfg.model.kv_lora_rank, N = 6;
    const float *c_raw = table_ptr_store(&m.acts, m.act, m.la[0].c_raw);
    const float *slot_c = table_ptr_store(&m.acts, m.act, m.sa[0].c);
    const float *nw = table_ptr_store(&m.params, m.w, m.lp[0].kv_a_norm);
    float *want = malloc(sizeof(float) * N * R), rstd[6];
    backend_cpu()->rmsnorm_forward(want, rstd, c_raw, nw, N, R, cfg.model.rms_norm_eps);
    Codec c = {.kind = CODEC_INT_GROUP, .bits = 4, .group = 32};
    unsigned char *bytes = malloc(codec_bytes_per_token(&c, R) * N);
    codec_encode(&c, bytes, want, N, R);
    codec_decode(&c, want, bytes, N, R);
    check(memcmp(want, slot_c, sizeof(float) * N * R) == 0, "clla_quant: the slot latent equals decode(encode(RMSNorm(latent))) bitwise");
    // the group's largest code is +-Imax (|x|max / scale >= Imax (1 - 2^-8) rounds to Imax), so
    // max|value| / Imax recovers the stored scale and every value must be a multiple of it
    int distinct_ok = 1;
    float s = 0;
    for (int j = 0; j < 32; j++) s = fmaxf(s, fabsf(slot_c[j]));
    for (int j = 0; j < 32; j++) {
        float q = slot_c[j] / (s / 7.0f);
        if (s > 0 && fabsf(q - rintf(q)) > 1e-3f) distinct_ok = 0;
    }
    check(distinct_ok, "clla_quant: slot latent values are integer multiples of the group scale");
    free(want); free(bytes);
    model_free(&m);
}

// A fitted codec (cq, qet) encoding a row that holds a NaN dies naming the value, instead of
// storing its nearest centroid (centroid 0) as if the value were finite.
typedef struct EncodeArgs {
    const Codec *c;
    const float *x;
    int N, W;
} EncodeArgs;

static void encode_in_child(const void *arg) {
    const EncodeArgs *a = arg;
    uint8_t *bytes = malloc(codec_bytes_per_token(a->c, a->W) * (size_t)a->N);
    codec_encode(a->c, bytes, a->x, a->N, a->W);
    free(bytes);
}

static void check_non_finite_refused(const Codec *c, float *x, int N, int W) {
    const float keep = x[W + 3];
    x[W + 3] = NAN;   // token 1, channel 3
    char msg[1024], name[1200];
    const EncodeArgs a = {c, x, N, W};
    const int ok = died_with(encode_in_child, &a, "token 1, channel 3 is nan", "not finite", msg, sizeof(msg));
    x[W + 3] = keep;
    snprintf(name, sizeof(name), "%s: a NaN to encode is refused: %s", codec_name(c), msg);
    check(ok, name);
}

static void test_cq(void) {
    const int W = 16, N = 300;
    Codec c;
    char err[512];
    check(codec_parse(&c, "cq:bits=4,c=2,iters=5", err, sizeof(err)) == 0 && c.kind == CODEC_CQ && c.bits == 4 && c.group == 2,
          "cq: spec parsed (bits=4, c=2)");
    const CodecTraits *t = codec_traits(CODEC_CQ);
    Rng r;
    rng_seed(&r, 5);
    float *x = malloc(sizeof(float) * N * W), *dec = malloc(sizeof(float) * N * W), *ref = malloc(sizeof(float) * N * W);
    for (int i = 0; i < N * W; i++) x[i] = (float)rng_normal(&r);
    void *state = NULL;
    check(t->fit(&c, W, x, N, N, NULL, &state, err, sizeof(err)) == 0, "cq: fitted on 300 vectors");
    c.fit = state;
    size_t tb = codec_bytes_per_token(&c, W);
    check(tb == 4 && codec_bits_stored(&c, W) == 2.0 && codec_bits_paper(&c, W) == 2.0,
          "cq: 8 codes of 4 bits = 4 bytes a token, 2 bits per element both ways");
    uint8_t *bytes = malloc(tb * N), *ref_bytes = malloc(tb * N);
    codec_encode(&c, bytes, x, N, W);
    codec_decode(&c, dec, bytes, N, W);
    cq_encode(state, x, N, ref_bytes);
    cq_decode(state, ref_bytes, N, ref);
    check(!memcmp(bytes, ref_bytes, tb * N) && !memcmp(dec, ref, sizeof(float) * N * W), "cq: the codec stores and gives back quant/cq.c's codes");
    check_non_finite_refused(&c, x, N, W);
    int64_t shape[4];
    int rank = t->fit_shape(&c, W, shape);
    check(rank == 3 && shape[0] == 8 && shape[1] == 16 && shape[2] == 2 && codec_fit_elements(&c, W) == 256,
          "cq: state tensor [8 groups, 16 entries, 2 channels]");
    float *saved = malloc(sizeof(float) * 256);
    t->fit_save(&c, W, state, saved);
    void *loaded = NULL;
    check(t->fit_load(&c, W, saved, &loaded, err, sizeof(err)) == 0, "cq: state loaded from its tensor");
    Codec c2 = c;
    c2.fit = loaded;
    float *dec2 = malloc(sizeof(float) * N * W);
    codec_encode(&c2, ref_bytes, x, N, W);
    codec_decode(&c2, dec2, ref_bytes, N, W);
    check(!memcmp(dec, dec2, sizeof(float) * N * W), "cq: the loaded state decodes bit for bit as the fitted one");
    saved[7] = NAN;
    void *bad = NULL;
    check(t->fit_load(&c, W, saved, &bad, err, sizeof(err)) != 0 && strstr(err, "not a finite"), "cq: a NaN in the codebook is refused");
    // a value fp16 cannot hold exactly (the codebook is stored as fp16, docs/FORMAT.md): refused,
    // as kvquant refuses it (cq used it at fp32 precision while its bytes counted fp16)
    saved[7] = 0.1f;
    check(t->fit_load(&c, W, saved, &bad, err, sizeof(err)) != 0 && strstr(err, "codebook value 7 is 0.100000001, not an fp16 number"),
          "cq: a codebook value that is not an fp16 number is refused");
    t->fit_free(loaded);
    // a layout using cq without its state
    ModelConfig mc;
    Config cfg;
    config_from_json(&cfg, "{\"attention\":\"gqa\",\"vocab_size\":16,\"hidden_size\":16,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"intermediate_size\":16,"
                     "\"max_position_embeddings\":8,\"train\":{\"seq_len\":8}}", "test", 0, NULL);
    mc = cfg.model;
    CacheLayout cl;
    cache_layout(&cl, &mc);
    check(cache_layout_apply_spec(&cl, "v=cq:bits=4,c=2", err, sizeof(err)) == 0, "cq: applied to part v");
    check(cache_layout_check_fitted(&cl, err, sizeof(err)) != 0 && strstr(err, "clla calibrate"), "cq: an unfitted layout says to calibrate");
    for (int s = 0; s < cl.n_streams; s++)
        if (cl.streams[s].part == PART_V) {
            void *st = NULL;
            t->fit(&cl.part[PART_V].codec, 8, x, N, N, NULL, &st, err, sizeof(err));
            cache_layout_set_fit(&cl, s, st);
        }
    check(cache_layout_check_fitted(&cl, err, sizeof(err)) == 0, "cq: fitted layout accepted");
    check(cache_layout_apply_spec(&cl, "v=cq:bits=3,c=2", err, sizeof(err)) == 0 && cache_layout_check_fitted(&cl, err, sizeof(err)) != 0,
          "cq: changing the settings drops the fitted states");
    // a fitted cq part switched to another codec: its states are freed as cq's (valgrind-clean)
    for (int s = 0; s < cl.n_streams; s++)
        if (cl.streams[s].part == PART_V) {
            void *st = NULL;
            t->fit(&cl.part[PART_V].codec, 8, x, N, N, NULL, &st, err, sizeof(err));
            cache_layout_set_fit(&cl, s, st);
        }
    check(cache_layout_apply_spec(&cl, "v=qet:levels=1,width=4,k1=4,k2=0", err, sizeof(err)) == 0 &&
          cache_layout_check_fitted(&cl, err, sizeof(err)) != 0 && strstr(err, "qet"), "cq -> qet: the cq states dropped, qet needs its own");
    cache_layout_free(&cl);
    t->fit_free(state);
    free(x); free(dec); free(ref); free(bytes); free(ref_bytes); free(saved); free(dec2);
}

// qet: the codec stores quant/qet.c's rows, bytes per token follow from the spec, the state's
// tensor round-trips, and the codebook tensor's size is what fit_shape says.
static void test_qet(void) {
    const int W = 16, N = 400;
    Codec c;
    char err[512];
    check(codec_parse(&c, "qet:levels=1,width=4,k1=16,k2=4,iters=4", err, sizeof(err)) == 0 && c.kind == CODEC_QET &&
              c.levels == 1 && c.group == 4 && c.k[0] == 16 && c.k[1] == 4, "qet: spec parsed");
    const CodecTraits *t = codec_traits(CODEC_QET);
    float *x = malloc(sizeof(float) * N * W), *dec = malloc(sizeof(float) * N * W), *dec2 = malloc(sizeof(float) * N * W);
    Rng r;
    rng_seed(&r, 9);
    for (int i = 0; i < N * W; i++) x[i] = (float)rng_normal(&r);
    void *state = NULL;
    check(t->fit(&c, W, x, N, N, NULL, &state, err, sizeof(err)) == 0, "qet: fitted on 400 rows");
    c.fit = state;
    // 8 flag bits (1 level, 16/2 pairs) + 4 groups x (4 + 2) code bits = 32 bits
    size_t tb = codec_bytes_per_token(&c, W);
    check(tb == 4 && tb == (size_t)qet_bytes_per_row(state) && codec_bits_paper(&c, W) == 2.0,
          "qet: 4 bytes a token (flags + codes), as quant/qet.c stores a row; 2 bits per element");
    uint8_t *bytes = malloc(tb * N), *ref = malloc(tb * N);
    codec_encode(&c, bytes, x, N, W);
    codec_decode(&c, dec, bytes, N, W);
    qet_encode(state, x, N, ref);
    check(!memcmp(bytes, ref, tb * N), "qet: the codec stores quant/qet.c's rows");
    check_non_finite_refused(&c, x, N, W);
    int64_t shape[4];
    check(t->fit_shape(&c, W, shape) == 1 && shape[0] == 20 * W, "qet: state tensor [(k1 + k2) * W]");
    float *saved = malloc(sizeof(float) * 20 * W);
    t->fit_save(&c, W, state, saved);
    void *loaded = NULL;
    check(t->fit_load(&c, W, saved, &loaded, err, sizeof(err)) == 0, "qet: state loaded from its tensor");
    Codec c2 = c;
    c2.fit = loaded;
    codec_encode(&c2, ref, x, N, W);
    codec_decode(&c2, dec2, ref, N, W);
    check(!memcmp(bytes, ref, tb * N) && !memcmp(dec, dec2, sizeof(float) * N * W), "qet: the loaded state encodes and decodes as the fitted one");
    saved[3 * W + 1] = INFINITY;
    void *bad = NULL;
    check(t->fit_load(&c, W, saved, &bad, err, sizeof(err)) != 0 && strstr(err, "not a finite"), "qet: an infinity in the codebook is refused");
    // finite, but two stages of it add up past FLT_MAX (a decoded NaN, blamed on the model)
    saved[3 * W + 1] = 2e38f;
    check(t->fit_load(&c, W, saved, &bad, err, sizeof(err)) != 0 && strstr(err, "half of FLT_MAX"),
          "qet: a codebook value past half of FLT_MAX is refused");
    t->fit_free(loaded);
    t->fit_free(state);
    free(x); free(dec); free(dec2); free(bytes); free(ref); free(saved);
}

// What a decoding step reads against what the cache stores: a slot shared by 2 layers is read
// twice; a CLLA consumer's own rope key once, by its owner.
static void test_read_bytes(void) {
    static const struct { const char *json; double read_over_stored; } cases[] = {
        {"\"attention\":\"mha\"", 1.0},
        {"\"attention\":\"cla\"", 2.0},
        // CLLA, 4 layers: producers store latent 16 + rope 8, consumers their own rope 8 (bf16, 2
        // bytes each): stored 2 x 24 + 2 x 8 = 64; read 4 x 16 + 4 x 8 = 96
        {"\"attention\":\"clla\",\"kv_lora_rank\":16,\"qk_rope_head_dim\":8,\"v_head_dim\":8", 96.0 / 64.0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char json[512];
        snprintf(json, sizeof json, "{%s,\"vocab_size\":16,\"hidden_size\":16,\"num_hidden_layers\":4,"
                 "\"num_attention_heads\":2,\"head_dim\":8,\"intermediate_size\":16,"
                 "\"max_position_embeddings\":8,\"train\":{\"seq_len\":8}}", cases[i].json);
        Config cfg;
        config_from_json(&cfg, json, "test", 0, NULL);
        CacheLayout cl;
        cache_layout(&cl, &cfg.model);
        const double ratio = cache_layout_read_bytes_per_token(&cl) / cache_layout_bytes_per_token(&cl);
        char name[128];
        snprintf(name, sizeof name, "read bytes per token = %.3f x stored (%s)", cases[i].read_over_stored, cases[i].json);
        check(fabs(ratio - cases[i].read_over_stored) < 1e-12, name);
        cache_layout_free(&cl);
    }
}

// A consumer layer's own rope key is a cache part only where there is a consumer: a one-layer
// CLLA model had the part present with no stream (its bits per element printed as -nan in eval's
// JSON); two layers have it, stored once.
static void test_own_krope_needs_a_consumer(void) {
    for (int L = 1; L <= 2; L++) {
        char json[512];
        snprintf(json, sizeof(json),
                 "{\"attention\":\"clla\",\"vocab_size\":64,\"hidden_size\":16,\"num_hidden_layers\":%d,"
                 "\"num_attention_heads\":2,\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,\"intermediate_size\":16,"
                 "\"train\":{\"seq_len\":8}}",
                 L);
        Config cfg;
        config_from_json(&cfg, json, "test", 0, NULL);
        CacheLayout cl;
        cache_layout(&cl, &cfg.model);
        int streams = 0;
        for (int s = 0; s < cl.n_streams; s++) streams += cl.streams[s].part == PART_OWN_KROPE;
        check(cl.part[PART_OWN_KROPE].present == (L > 1) && streams == (L > 1),
              L == 1 ? "clla, one layer: no own_k_rope part (no consumer)" : "clla, two layers: own_k_rope present, one stream");
        cache_layout_free(&cl);
    }
}

int main(void) {
    test_own_krope_needs_a_consumer();
    test_int_group(4, 32, 64, 9);
    test_int_group(4, 64, 128, 3);   // the group sizes int_group_decode inlines as constants (model/cache.c)
    test_int_group(4, 128, 256, 2);
    test_int_group(4, 16, 48, 5);
    test_int_group(4, 24, 48, 4);   // a 16-code vector step and an 8-code tail per group
    test_int_group(4, 8, 24, 3);    // the tail only
    test_int_group(2, 8, 24, 3);
    test_int_group(8, 32, 64, 4);
    test_int_group_non_finite(4, 32);
    test_int_group_non_finite(2, 8);
    for (int b = 2; b <= 8; b++) test_int_group_huge(b);
    test_bf16_fp32();
    test_model_latent_is_codec_output();
    test_cq();
    test_qet();
    test_read_bytes();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
