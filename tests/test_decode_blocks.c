// Block codecs in the decoder (model/decode.c, "Block codecs"): kivi on the K/V caches of MHA and
// GQA models and on the latent of CLLA and MLA models.
//
// Storage, against quant/kivi.c directly (one-layer models, so a token's cached value does not
// depend on what earlier tokens' attention read):
//  - while a token's block is open, decoder_read gives the fp16 rounding of what the layer wrote
//    (the full-precision window), within fp16 of the full forward's value;
//  - once the sequence has moved past the block, every token of it reads back exactly as
//    kivi_encode + kivi_decode of the window's fp16 values (keys per channel, values per token);
//  - the bytes a sequence stores, read from its blocks' state (decoder_seq_bytes), equal the
//    printed accounting (cache_layout_seq_bytes) and a count made here from quant/kivi.c's sizes.
// Paths (models of 2 to 3 layers, several presets): a prompt prefilled at any split point, then
// stepped, gives the logits of stepping from the first token (prefill goes through the cache a
// block per forward; a chunk crossing a block boundary would let its earlier rows read their own
// block encoded); forked sequences (a full open block shared, or a partial one copied) decode as
// if alone; eval_through_cache's two passes agree, and a 2-bit cache changes the loss many times
// more than an 8-bit one.
// Tolerance 1e-3 on logits: a step computes k and v in a one-row matmul, a prefill chunk in a
// many-row one; their last bits can differ and flip an fp16 rounding of the window (test_decode.c
// gives bf16 caches the same allowance for the same reason).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "eval/through_cache.h"
#include "model/decode.h"
#include "quant/fp16.h"
#include "quant/kivi.h"

static int passed, failed;

static void check(int ok, const char *what, const char *name) {
    if (ok) passed++;
    else { failed++; printf("FAIL %s: %s\n", name, what); }
}

#define BASE "\"vocab_size\":37,\"hidden_size\":24,\"num_attention_heads\":4,\"head_dim\":8,\"intermediate_size\":20," \
             "\"initializer_range\":0.25,\"rope_theta\":100,\"max_position_embeddings\":256,"
#define LAT "\"kv_lora_rank\":16,\"qk_rope_head_dim\":4,"
#define BT 32   // the cache block of the specs below (residual=32)

typedef struct Case {
    const char *name, *json, *specs;   // specs: ';'-separated cache_layout_apply_spec
} Case;

static Model *model_new(const char *json, const char *name, uint64_t seed) {
    Config cfg;
    config_from_json(&cfg, json, name, 0, NULL);
    Model *m = calloc(1, sizeof(Model));
    model_build(m, &cfg.model, backend_cpu());
    model_init_weights(m, seed);
    return m;
}

static void layout_for(CacheLayout *cl, const Model *m, const char *specs) {
    cache_layout(cl, &m->cfg);
    char buf[256], err[256];
    snprintf(buf, sizeof(buf), "%s", specs);
    for (char *save = NULL, *s = strtok_r(buf, ";", &save); s; s = strtok_r(NULL, ";", &save))
        if (cache_layout_apply_spec(cl, s, err, sizeof(err)) != 0) { printf("bad spec %s: %s\n", s, err); exit(1); }
}

// quant/kivi.c's round trip of one block of fp16 values x [BT, W], and its size
static void kivi_block_roundtrip(const Codec *c, const float *x, int W, float *out, int64_t *bytes) {
    KiviSettings s = {c->bits, c->group, 0};
    KiviPart part = c->use == CODEC_USE_VALUES ? KIVI_VALUES : KIVI_KEYS;
    char err[256];
    if (kivi_bytes(&s, part, BT, W, bytes) != 0) { check(0, "kivi_bytes", "storage"); return; }
    uint8_t *enc = malloc((size_t)*bytes);
    if (kivi_encode(&s, part, x, BT, W, enc, *bytes, err, sizeof(err)) != *bytes ||
        kivi_decode(&s, part, enc, *bytes, BT, W, out, err, sizeof(err)) != 0)
        check(0, err, "storage");
    free(enc);
}

// The model buffer the decoder encodes for stream s of layer 0 (model/decode.c stream_source).
static int source_of(const Model *m, int part) {
    const SlotActs *sa = &m->sa[0];
    return part == PART_K ? sa->k : part == PART_V ? sa->v : part == PART_LATENT ? sa->c : sa->k_rope;
}

static void check_storage(const Case *cs) {
    Model *m = model_new(cs->json, cs->name, 3);
    CacheLayout cl;
    layout_for(&cl, m, cs->specs);
    enum { T = 3 * BT + 7 };
    int V = m->cfg.vocab_size;
    int32_t tok[T];
    Rng r;
    rng_seed(&r, 11);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(rng_next(&r) % (uint64_t)V);
    // the values the layer writes, from a full forward with exact codecs
    CacheLayout exact;
    layout_for(&exact, m, "fp32");
    m->inference = 1;
    model_use_cache_codecs(m, &exact);
    model_set_batch(m, 1, T);
    model_forward(m, tok, NULL);
    float *src[N_PARTS] = {0};
    for (int p = 0; p < N_PARTS; p++) {
        if (!cl.part[p].present || p == PART_OWN_KROPE) continue;
        size_t n = (size_t)T * cl.part[p].width;
        src[p] = malloc(n * sizeof(float));
        m->be->act_to_host(src[p], table_ptr_store(&m->acts, m->act, source_of(m, p)), n);
    }
    Decoder *d = decoder_new(m, &cl, 1, T);
    check(decoder_block_tokens(d) == BT, "the cache block is the codec's", cs->name);
    float *win[N_PARTS] = {0}, *got = malloc(64 * sizeof(float)), *want = malloc((size_t)BT * 64 * sizeof(float));
    for (int p = 0; p < N_PARTS; p++) win[p] = src[p] ? malloc((size_t)T * cl.part[p].width * sizeof(float)) : NULL;
    int seq = 0, one = 1, window_ok = 1, closed_ok = 1, bytes_ok = 1;
    int64_t closed_bytes[N_PARTS] = {0};
    for (int t = 0; t < T; t++) {
        if (t == 0) { const int32_t *p0 = tok; decoder_prefill(d, 1, &seq, &p0, &one, NULL); }
        else decoder_step(d, 1, &seq, &tok[t], NULL);
        for (int s = 0; s < cl.n_streams; s++) {
            int p = cl.streams[s].part, W = cl.part[p].width;
            const Codec *c = &cl.part[p].codec;
            // token t is in the open block: fp16 of what the layer wrote
            decoder_read(d, s, 0, t, win[p] + (size_t)t * W);
            for (int j = 0; j < W; j++) {
                float w = win[p][(size_t)t * W + j], x = src[p][(size_t)t * W + j];
                if (codec_block_tokens(c) > 1 && (fp16_round(w) != w || fabsf(w - x) > 1e-3f * fabsf(x) + 1e-5f)) window_ok = 0;
            }
            // the block before t's closed when t entered a new one: quant/kivi.c's round trip
            if (codec_block_tokens(c) > 1 && t % BT == 0 && t > 0) {
                kivi_block_roundtrip(c, win[p] + (size_t)(t - BT) * W, W, want, &closed_bytes[p]);
                for (int i = 0; i < BT; i++) {
                    decoder_read(d, s, 0, t - BT + i, got);
                    if (memcmp(got, want + (size_t)i * W, (size_t)W * sizeof(float))) closed_ok = 0;
                }
            }
        }
        // bytes: the blocks' state, the accounting, and a count from quant/kivi.c's sizes
        size_t mine = 0;
        int64_t closed = t / BT, len = t + 1;   // blocks before t's are closed
        for (int s = 0; s < cl.n_streams; s++) {
            int p = cl.streams[s].part, W = cl.part[p].width;
            const Codec *c = &cl.part[p].codec;
            if (codec_block_tokens(c) == 1) mine += (size_t)len * codec_bytes_per_token(c, W);
            else mine += (size_t)closed * (size_t)closed_bytes[p] + (size_t)(len - closed * BT) * W * 2;
        }
        if (decoder_seq_bytes(d, 0) != cache_layout_seq_bytes(&cl, len) || mine != decoder_seq_bytes(d, 0)) {
            if (bytes_ok) printf("%s at %lld tokens: decoder %zu, accounting %zu, quant/kivi.c %zu\n", cs->name, (long long)len,
                                 decoder_seq_bytes(d, 0), cache_layout_seq_bytes(&cl, len), mine);
            bytes_ok = 0;
        }
    }
    check(window_ok, "the open block reads as the fp16 rounding of what the layer wrote", cs->name);
    check(closed_ok, "a closed block reads as quant/kivi.c's round trip of its fp16 window, bit for bit", cs->name);
    check(bytes_ok, "bytes stored = the printed accounting = quant/kivi.c's sizes, at every length", cs->name);
    printf("%-28s storage: %d tokens, %zu bytes stored (%.2f bytes/token; %.4g amortized over closed blocks)\n", cs->name, T,
           decoder_seq_bytes(d, 0), (double)decoder_seq_bytes(d, 0) / T, cache_layout_bytes_per_token(&cl));
    decoder_free(d);
    for (int p = 0; p < N_PARTS; p++) { free(src[p]); free(win[p]); }
    free(got);
    free(want);
    cache_layout_free(&cl);
    cache_layout_free(&exact);
    model_free(m);
    free(m);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

static void check_paths(const Case *cs) {
    Model *m = model_new(cs->json, cs->name, 5);
    CacheLayout cl;
    layout_for(&cl, m, cs->specs);
    enum { T = 3 * BT + 9 };
    int V = m->cfg.vocab_size;
    int32_t tok[T];
    Rng r;
    rng_seed(&r, 13);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(rng_next(&r) % (uint64_t)V);
    float *ref = malloc((size_t)T * V * sizeof(float)), *lg = malloc((size_t)T * V * sizeof(float));
    int seq = 0, one = 1;
    // the reference: the first token prefilled, every other one a step
    Decoder *d = decoder_new(m, &cl, 3, T);
    const int32_t *p0 = tok;
    decoder_prefill(d, 1, &seq, &p0, &one, ref);
    for (int t = 1; t < T; t++) decoder_step(d, 1, &seq, &tok[t], ref + (size_t)t * V);
    decoder_release(d, 0);
    double worst = 0;
    static const int SPLITS[] = {BT - 1, BT, BT + 1, 2 * BT + 5, T};
    for (size_t k = 0; k < sizeof(SPLITS) / sizeof(SPLITS[0]); k++) {
        int P = SPLITS[k];
        decoder_prefill(d, 1, &seq, &p0, &P, lg + (size_t)(P - 1) * V);
        for (int t = P; t < T; t++) decoder_step(d, 1, &seq, &tok[t], lg + (size_t)t * V);
        worst = fmax(worst, max_diff(lg + (size_t)(P - 1) * V, ref + (size_t)(P - 1) * V, (size_t)(T - P + 1) * V));
        decoder_release(d, 0);
    }
    // the whole sequence extended at once: every position's logits
    decoder_extend_all(d, 0, tok, T, lg);
    double ext = max_diff(lg, ref, (size_t)T * V);
    decoder_release(d, 0);
    // forks: at a block boundary (the full block is still open and shared) and within a block
    static const int FORK[] = {2 * BT, 2 * BT + 5};
    for (int k = 0; k < 2; k++) {
        int P = FORK[k], ids[2] = {1, 2};
        decoder_prefill(d, 1, &seq, &p0, &P, NULL);
        decoder_fork(d, 0, 1);
        decoder_fork(d, 0, 2);
        decoder_release(d, 0);
        for (int t = P; t < T; t++) {
            int32_t next[2] = {tok[t], tok[t]};
            decoder_step(d, 2, ids, next, lg);
            worst = fmax(worst, fmax(max_diff(lg, ref + (size_t)t * V, V), max_diff(lg + V, ref + (size_t)t * V, V)));
        }
        decoder_release(d, 1);
        decoder_release(d, 2);
        check(decoder_blocks_in_use(d) == 0, "every block free after the forks are released", cs->name);
    }
    printf("%-28s paths: max |logit - stepped| %.2e over prefill splits and forks, %.2e extending all at once\n", cs->name, worst, ext);
    check(worst < 1e-3, "prefill at any split, then steps, and forks = stepping from the first token", cs->name);
    check(ext < 1e-3, "decoder_extend_all = stepping from the first token", cs->name);
    decoder_free(d);
    free(ref);
    free(lg);
    cache_layout_free(&cl);
    model_free(m);
    free(m);
}

static void check_through_cache(void) {
    const char *json = "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}";
    Model *m = model_new(json, "through_cache", 5);
    enum { B = 2, T = 2 * BT + 11 };
    int32_t in[B * T], tg[B * T];
    Rng r;
    rng_seed(&r, 21);
    for (int i = 0; i < B * T; i++) { in[i] = (int32_t)(rng_next(&r) % 37); tg[i] = i % 7 == 3 ? IGNORE_INDEX : (int32_t)(rng_next(&r) % 37); }
    const char *specs[3] = {"fp32", "kivi:bits=8,group=8,residual=32", "kivi:bits=2,group=8,residual=32"};
    double loss[3];
    for (int k = 0; k < 3; k++) {
        CacheLayout cl;
        layout_for(&cl, m, specs[k]);
        CacheLoss acc = {0, 0, 0};
        eval_through_cache(m, &cl, in, tg, B, T, &acc);
        loss[k] = acc.full_sum / acc.count;
        printf("through the cache, %-32s loss: block-chunked %.6f, decoded %.6f over %lld tokens\n", specs[k], loss[k],
               acc.decode_sum / acc.count, acc.count);
        check(fabs(acc.full_sum - acc.decode_sum) / acc.count < 1e-5, "the two passes agree", specs[k]);
        cache_layout_free(&cl);
    }
    // 8 bits stay near the fp16 window's rounding; 2 bits move the loss many times further
    check(fabs(loss[2] - loss[0]) > 10 * fabs(loss[1] - loss[0]), "a 2-bit kivi cache changes the loss (8 bits barely)", "through_cache");
    model_free(m);
    free(m);
}

// Settings the cache cannot use, refused with a line naming the fix.
static void check_refusals(void) {
    Model *m = model_new("{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":1}", "refusals", 1);
    static const struct { const char *spec, *says; } BAD[] = {
        {"kivi:residual=0", "residual=0"},
        {"kivi:residual=20,group=8", "not a multiple"},
        {"v=kivi:group=5,residual=40", "does not divide"},
        {"kivi:bits=9", "bits=9"},
        {"kivi:window=4", "no setting 'window'"},
    };
    for (size_t i = 0; i < sizeof(BAD) / sizeof(BAD[0]); i++) {
        CacheLayout cl;
        cache_layout(&cl, &m->cfg);
        char err[512] = "";
        int rc = cache_layout_apply_spec(&cl, BAD[i].spec, err, sizeof(err));
        check(rc != 0 && strstr(err, BAD[i].says) != NULL, BAD[i].spec, "refusals");
        cache_layout_free(&cl);
    }
    // blocks that do not divide each other
    CacheLayout cl;
    cache_layout(&cl, &m->cfg);
    char err[512] = "";
    int ok = cache_layout_apply_spec(&cl, "k=kivi:residual=32,group=8", err, sizeof(err)) == 0 &&
             cache_layout_apply_spec(&cl, "v=kivi:residual=48,group=8", err, sizeof(err)) == 0;
    check(ok && cache_layout_block_tokens(&cl, err, sizeof(err)) < 0 && strstr(err, "do not divide"), "blocks of 32 and 48 refused", "refusals");
    cache_layout_free(&cl);
    model_free(m);
    free(m);
}

int main(void) {
    static const Case STORAGE[] = {
        {"mha kivi 2 bits", "{" BASE "\"attention\":\"mha\",\"num_hidden_layers\":1}", "kivi:bits=2,group=8,residual=32"},
        {"gqa kivi 4 bits k, bf16 v", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":1}",
         "bf16;k=kivi:bits=4,group=16,residual=32"},
        {"mla kivi latent and k_rope", "{" BASE LAT "\"attention\":\"mla\",\"num_hidden_layers\":1}", "kivi:bits=3,group=8,residual=32"},
    };
    static const Case PATHS[] = {
        {"gqa kivi 3 bits", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "kivi:bits=3,group=8,residual=32"},
        {"cla F=2 L=3 kivi k32 v16", "{" BASE "\"attention\":\"cla\",\"num_hidden_layers\":3}", "fp32;v=kivi:bits=2,group=8,residual=16;k=kivi:bits=4,group=8,residual=32"},
        {"clla F=2 L=3 kivi latent", "{" BASE LAT "\"attention\":\"clla\",\"num_hidden_layers\":3}", "fp32;latent=kivi:bits=2,group=8,residual=32"},
    };
    for (size_t i = 0; i < sizeof(STORAGE) / sizeof(STORAGE[0]); i++) check_storage(&STORAGE[i]);
    for (size_t i = 0; i < sizeof(PATHS) / sizeof(PATHS[0]); i++) check_paths(&PATHS[i]);
    check_through_cache();
    check_refusals();
    printf("test_decode_blocks: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
