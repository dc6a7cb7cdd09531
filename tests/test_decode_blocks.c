// Block codecs in the decoder (model/decode.c, "Block codecs"): kivi and qjl on the K/V caches of
// MHA and GQA models and on the latent of CLLA and MLA models.
//
// Storage, against quant/kivi.c and quant/qjl.c directly (one-layer models, so a token's cached
// value does not depend on what earlier tokens' attention read):
//  - while a token's block is open, decoder_read gives the fp16 rounding of what the layer wrote
//    (the full-precision window), within fp16 of the full forward's value;
//  - once the sequence has moved past the block, every token of it reads back exactly as the
//    quantizer's encode + decode of the window's fp16 values (kivi: keys per channel, values per
//    token; qjl: value records, or for keys the estimator's vectors), head by head;
//  - the bytes a sequence stores, read from its blocks' state (decoder_seq_bytes: what eval
//    prints), equal a count made here from quant/'s sizes at every length.
// Paths (models of 2 to 3 layers, several presets): a prompt prefilled at any split point, then
// stepped, gives the logits of stepping from the first token (prefill goes through the cache a
// block per forward); forked sequences (a full open block shared, or a partial one copied) decode
// as if alone; eval_through_cache's two passes agree, and a 2-bit cache changes the loss many
// times more than an 8-bit one.
// Scores: the paged attention op's scores path (qjl's estimator) equals attention over the
// decoded estimator vectors; over an open block the decoder scores the fp16 window exactly.
// Tolerance 1e-3 on logits across paths: a step computes k and v in a one-row matmul, a prefill
// chunk in a many-row one; their last bits can differ and flip an fp16 rounding of the window
// (test_decode.c gives bf16 caches the same allowance for the same reason).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "eval/through_cache.h"
#include "model/decode.h"
#include "quant/fp16.h"
#include "quant/kivi.h"
#include "quant/kvquant.h"
#include "quant/qjl.h"

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

// quant/qjl.c's round trip of one block of fp16 values x [BT, W], head by head: value records
// (values, latent) or the keys' estimator vectors (keys), and its size
static void qjl_block_roundtrip(const Codec *given, const float *x, int W, float *out, int64_t *bytes) {
    Codec c = *given;
    c.fit = NULL;
    codec_bind(&c, W);
    const QjlState *st = c.fit;
    const int d = st->set.head_dim, H = W / d, keys = c.use != CODEC_USE_VALUES, values = c.use != CODEC_USE_KEYS;
    float *xh = malloc((size_t)BT * d * sizeof(float)), *yh = malloc((size_t)BT * d * sizeof(float));
    uint8_t *enc = malloc((size_t)qjl_key_bytes(&st->set, BT) + (size_t)qjl_value_token_bytes(&st->set) * BT);
    char err[256];
    *bytes = 0;
    for (int h = 0; h < H; h++) {
        for (int t = 0; t < BT; t++) memcpy(xh + (size_t)t * d, x + (size_t)t * W + (size_t)h * d, (size_t)d * sizeof(float));
        if (keys) {
            if (qjl_encode_keys(st, xh, BT, enc, err, sizeof(err))) check(0, err, "qjl storage");
            if (!values) qjl_decode_keys(st, enc, BT, yh);
            *bytes += qjl_key_bytes(&st->set, BT);
        }
        if (values) {
            if (qjl_encode_values(&st->set, xh, BT, enc, err, sizeof(err))) check(0, err, "qjl storage");
            qjl_decode_values(&st->set, enc, BT, yh);
            *bytes += (int64_t)qjl_value_token_bytes(&st->set) * BT;
        }
        for (int t = 0; t < BT; t++) memcpy(out + (size_t)t * W + (size_t)h * d, yh + (size_t)t * d, (size_t)d * sizeof(float));
    }
    free(xh);
    free(yh);
    free(enc);
    codec_unbind(&c);
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
                if (c->kind == CODEC_KIVI) kivi_block_roundtrip(c, win[p] + (size_t)(t - BT) * W, W, want, &closed_bytes[p]);
                else qjl_block_roundtrip(c, win[p] + (size_t)(t - BT) * W, W, want, &closed_bytes[p]);
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
        if (mine != decoder_seq_bytes(d, 0)) {
            if (bytes_ok) printf("%s at %lld tokens: decoder %zu, quant/ %zu\n", cs->name, (long long)len, decoder_seq_bytes(d, 0), mine);
            bytes_ok = 0;
        }
    }
    check(window_ok, "the open block reads as the fp16 rounding of what the layer wrote", cs->name);
    check(closed_ok, "a closed block reads as quant/'s round trip of its fp16 window, bit for bit", cs->name);
    check(bytes_ok, "bytes stored (what eval prints) = quant/'s sizes, at every length", cs->name);
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

static void fit_kvquant(CacheLayout *cl);

static double max_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

static void check_paths(const Case *cs) {
    Model *m = model_new(cs->json, cs->name, 5);
    CacheLayout cl;
    layout_for(&cl, m, cs->specs);
    fit_kvquant(&cl);
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

// While every token is in the window (fewer than a block), a qjl key stream is scored exactly
// over fp16 keys (the decoder's score callback on an open block, head by head under GQA): the
// logits equal those of a kivi stream, whose window is fp16 too, to summation order.
static void check_window_exact(void) {
    Model *m = model_new("{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "window", 8);
    enum { T = 40 };
    int V = m->cfg.vocab_size, seq = 0;
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 7 + 3) % V);
    float *lg[2];
    const char *specs[2] = {"fp32;k=qjl:m=64,o=2,mo=32,group=8,buffer=64", "fp32;k=kivi:bits=2,group=8,residual=64"};
    for (int k = 0; k < 2; k++) {
        CacheLayout cl;
        layout_for(&cl, m, specs[k]);
        Decoder *d = decoder_new(m, &cl, 1, T);
        lg[k] = malloc((size_t)T * V * sizeof(float));
        decoder_extend_all(d, seq, tok, T, lg[k]);
        decoder_free(d);
        cache_layout_free(&cl);
    }
    double w = max_diff(lg[0], lg[1], (size_t)T * V);
    printf("%-28s all in the window: qjl vs kivi logits differ by %.2e\n", "gqa", w);
    check(w < 1e-5, "qjl over its fp16 window = kivi over its fp16 window", "window");
    free(lg[0]);
    free(lg[1]);
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
    const char *specs[4] = {"fp32", "kivi:bits=8,group=8,residual=32", "kivi:bits=2,group=8,residual=32", "kvquant:bits=2"};
    double loss[4];
    for (int k = 0; k < 4; k++) {
        CacheLayout cl;
        layout_for(&cl, m, specs[k]);
        fit_kvquant(&cl);
        CacheLoss acc = {0};
        eval_through_cache(m, &cl, in, tg, B, T, &acc);
        loss[k] = acc.full_sum / acc.count;
        printf("through the cache, %-32s loss: full pass %.6f, decoded %.6f over %lld tokens\n", specs[k], loss[k],
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
        {"qjl:m=12", "multiple of 8"},
        {"qjl:o=2,mo=0", "set mo to 0 exactly when o is 0"},
        {"qjl:o=8", "below the head dimension"},
        {"v=qjl:vgroup=3", "must divide the head dimension"},
        {"qjl:buffer=36,group=8", "multiple of group=8"},
        {"qjl:bits=9", "qjl bits=9"},
        {"qjl:proj=1", "no setting 'proj'"},
        {"k=qet:levels=0,width=2,k1=1,k2=0", "stores 0 bytes a token"},   // one constant whatever was written
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
    // a kivi window of one token makes blocks of one token (it was taken for no block codec: 16)
    cache_layout(&cl, &m->cfg);
    ok = cache_layout_apply_spec(&cl, "kivi:bits=2,group=1,residual=1", err, sizeof(err)) == 0;
    check(ok && cache_layout_block_tokens(&cl, err, sizeof(err)) == 1, "kivi residual=1: blocks of 1 token", "refusals");
    cache_layout_free(&cl);
    model_free(m);
    free(m);
}

// The scores path of the paged attention op (backend/backend.h, PagedStream.score): a qjl key
// stream scored by the codec's estimator gives the attention of the same stream decoded to the
// estimator's vectors (qjl_decode_keys: their dot product with any query is the estimate), with
// GQA head mapping, a second key part (the rope key of latent models), a partial last block and
// values in the same stream (the latent: scored keys, values decoded from the same stream). Tolerance 1e-4 of the output's scale: the two sum in
// different orders.
typedef struct ScoreStream {
    Codec c;
    int W;
    uint8_t **blocks;
} ScoreStream;
static void ss_decode(const void *ctx, float *dst, int id, int n) {
    const ScoreStream *s = ctx;
    float *all = malloc((size_t)BT * s->W * sizeof(float));
    codec_decode(&s->c, all, s->blocks[id], BT, s->W);
    memcpy(dst, all, (size_t)n * s->W * sizeof(float));
    free(all);
}
static void ss_prep(const void *ctx, double *out, const float *q) {
    const ScoreStream *s = ctx;
    codec_traits(s->c.kind)->query_prep(&s->c, q, out);
}
static void ss_score(const void *ctx, float *sc, const float *q, const double *prep, int head, int id, int n) {
    const ScoreStream *s = ctx;
    float *all = malloc((size_t)BT * sizeof(float));
    codec_traits(s->c.kind)->scores(&s->c, all, q, prep, head, s->blocks[id], BT, s->W);
    memcpy(sc, all, (size_t)n * sizeof(float));
    free(all);
}

static void check_score_path(const char *name, int NH, int NKV, int DK, int DK2, int latent, int rope_qjl) {
    enum { NB = 3, LEN = NB * BT - 5 };
    const int W = NKV * DK, DV = latent ? DK : DK, DQ = DK + DK2;
    Rng r;
    rng_seed(&r, 99);
    char err[256];
    ScoreStream ks = {{0}, W, malloc(NB * sizeof(uint8_t *))}, k2s = {{0}, DK2, NULL}, vs = {{0}, NKV * DV, malloc(NB * sizeof(uint8_t *))};
    if (codec_parse(&ks.c, "qjl:m=64,o=2,mo=32,group=8,buffer=32", err, sizeof(err))) { check(0, err, name); return; }
    ks.c.use = latent ? CODEC_USE_LATENT : CODEC_USE_KEYS;
    ks.c.head = DK;
    codec_bind(&ks.c, W);
    vs.c = (Codec){.kind = CODEC_FP32};
    k2s.c = (Codec){.kind = CODEC_FP32};
    if (rope_qjl) {   // the rope key scored too (one head of DK2 for every query head)
        if (codec_parse(&k2s.c, "qjl:m=32,o=0,mo=0,group=8,buffer=32", err, sizeof(err))) { check(0, err, name); return; }
        k2s.c.use = CODEC_USE_KEYS;
        k2s.c.head = DK2;
        codec_bind(&k2s.c, DK2);
    }
    k2s.blocks = malloc(NB * sizeof(uint8_t *));
    float *x = malloc((size_t)BT * W * sizeof(float));
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < BT * W; i++) x[i] = (float)rng_normal(&r) * (i % DK == 1 ? 6.0f : 1.0f);   // an outlier channel
        ks.blocks[b] = malloc(codec_span_bytes(&ks.c, W, BT));
        codec_encode(&ks.c, ks.blocks[b], x, BT, W);
        vs.blocks[b] = malloc((size_t)BT * NKV * DV * 4);
        k2s.blocks[b] = malloc((size_t)BT * (DK2 ? DK2 : 1) * 4);
        for (int i = 0; i < BT * NKV * DV; i++) ((float *)vs.blocks[b])[i] = (float)rng_normal(&r);
        for (int i = 0; i < BT * DK2; i++) x[i] = (float)rng_normal(&r);
        if (rope_qjl) codec_encode(&k2s.c, k2s.blocks[b], x, BT, DK2);
        else memcpy(k2s.blocks[b], x, (size_t)BT * DK2 * 4);
    }
    PagedStream kp = {W, 0, BT, ks.blocks, NB, &ks, ss_decode, codec_traits(CODEC_QJL)->query_prep_doubles(&ks.c, W), ss_prep, ss_score, 0,
                      PAGED_OTHER, 0, 0};
    // the same bytes, decoded to the estimator's vectors (a keys-only view: the keys come first in a block)
    ScoreStream keys_view = ks;
    keys_view.c.use = CODEC_USE_KEYS;
    PagedStream kd = kp, vd = kp;
    kd.ctx = &keys_view;
    kd.score = vd.score = NULL;   // vd: the latent's values, decoded to their records
    kd.prep = vd.prep = NULL;
    PagedStream k2p = {DK2, (size_t)DK2 * 4, BT, k2s.blocks, NB, &k2s, NULL, 0, NULL, NULL, 1, PAGED_F32, 0, 0}, k2d = k2p;
    if (rope_qjl) {
        k2p = (PagedStream){DK2, 0, BT, k2s.blocks, NB, &k2s, ss_decode, codec_traits(CODEC_QJL)->query_prep_doubles(&k2s.c, DK2), ss_prep,
                            ss_score, 0, PAGED_OTHER, 0, 0};
        k2d = k2p;
        k2d.score = NULL;   // decoded to the estimator's vectors
        k2d.prep = NULL;
    }
    PagedStream vp = {NKV * DV, (size_t)NKV * DV * 4, BT, vs.blocks, NB, &vs, NULL, 0, NULL, NULL, 1, PAGED_F32, 0, 0};
    float *q = malloc((size_t)NH * DQ * sizeof(float)), *o1 = malloc((size_t)NH * DV * sizeof(float)), *o2 = malloc((size_t)NH * DV * sizeof(float));
    for (int i = 0; i < NH * DQ; i++) q[i] = (float)rng_normal(&r) * 0.3f;
    int table[NB] = {2, 0, 1}, len = LEN;
    const Backend *be = backend_cpu();
    // the latent: values are the same stream (decoded to the value records)
    be->paged_attention(o1, q, &kp, DK2 ? &k2p : NULL, latent ? &kp : &vp, table, NB, &len, 1, NH, NKV, DK, DK2, DV, 0.3f);
    be->paged_attention(o2, q, &kd, DK2 ? &k2d : NULL, latent ? &vd : &vp, table, NB, &len, 1, NH, NKV, DK, DK2, DV, 0.3f);
    double worst = 0, mag = 0;
    for (int i = 0; i < NH * DV; i++) { worst = fmax(worst, fabs(o1[i] - o2[i])); mag = fmax(mag, fabs(o2[i])); }
    printf("%-28s scores path vs decoded estimator vectors: max |diff| %.2e (outputs up to %.2f)\n", name, worst, mag);
    check(worst <= 1e-4 * fmax(mag, 1.0) && mag > 0, "the codec's scores = attention over the decoded estimator vectors", name);
    for (int b = 0; b < NB; b++) { free(ks.blocks[b]); free(vs.blocks[b]); free(k2s.blocks[b]); }
    free(ks.blocks); free(vs.blocks); free(k2s.blocks); free(x); free(q); free(o1); free(o2);
    codec_unbind(&ks.c);
    codec_unbind(&k2s.c);
}

// kvquant's fitted state for every stream of a layout, learned from unit-normal samples (the
// tests need a datatype, not a good one): sequences of 32 tokens, their first tokens the sink.
static void fit_kvquant(CacheLayout *cl) {
    Rng r;
    rng_seed(&r, 5);
    for (int s = 0; s < cl->n_streams; s++) {
        const CachePart *part = &cl->part[cl->streams[s].part];
        if (part->codec.kind != CODEC_KVQUANT) continue;
        enum { N = 512 };
        float *x = malloc((size_t)N * part->width * sizeof(float));
        for (size_t i = 0; i < (size_t)N * part->width; i++) x[i] = (float)rng_normal(&r);
        void *st = NULL;
        char err[256];
        if (codec_traits(CODEC_KVQUANT)->fit(&part->codec, part->width, x, N, 32, NULL, &st, err, sizeof(err)) != 0) {
            check(0, err, "kvquant fit");
            exit(1);
        }
        cache_layout_set_fit(cl, s, st);
        free(x);
    }
}

// kvquant in the cache, against quant/kvquant.c: a sequence filled with known vectors
// (decoder_fill_synthetic's, regenerated here), every token read back as the block coding of the
// whole sequence from position 0 gives it (keys rotated back before RoPE, coded, rotated forward;
// streaming = block), the sink token within fp16 of what was written, and the bytes stored equal
// quant/kvquant.c's layout of the whole sequence (sink rows, dense rows, pointers, entries).
static void check_kvquant_storage(void) {
    const char *name = "gqa kvquant k and v";
    Model *m = model_new("{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":1}", name, 2);
    CacheLayout cl;
    layout_for(&cl, m, "kvquant:bits=3,outliers_permille=60,sink=1");
    fit_kvquant(&cl);
    enum { T = 3 * 16 + 5 };
    Decoder *d = decoder_new(m, &cl, 1, T);
    decoder_fill_synthetic(d, 0, T, 77);
    // the vectors fill_synthetic wrote: per token, per stream, W unit normals
    int Wk = cl.part[PART_K].width;
    float *x[2], *got = malloc((size_t)Wk * sizeof(float)), *want[2];
    for (int k = 0; k < 2; k++) { x[k] = malloc((size_t)T * Wk * sizeof(float)); want[k] = malloc((size_t)T * Wk * sizeof(float)); }
    Rng r;
    rng_seed(&r, 77);
    for (int t = 0; t < T; t++)
        for (int s = 0; s < cl.n_streams; s++)
            for (int j = 0; j < Wk; j++) x[s][(size_t)t * Wk + j] = (float)rng_normal(&r);
    int exact = 1, sink_ok = 1, bytes_ok = 1;
    for (int s = 0; s < cl.n_streams; s++) {
        int part = cl.streams[s].part;
        Codec c = cache_stream_codec(&cl, s);
        const KvqCodec *st = c.fit;
        float *pre = malloc((size_t)T * Wk * sizeof(float));
        memcpy(pre, x[s], (size_t)T * Wk * sizeof(float));
        if (part == PART_K) kvq_rope_rows(pre, T, 2, 8, 0, m->cfg.rope_theta, -1);
        int64_t nnz;
        char err[256];
        kvq_count(st, pre, T, 0, &nnz, err, sizeof(err));
        KvqLayout L;
        kvq_layout(st, T, 0, nnz, &L);
        uint8_t *enc = malloc((size_t)L.total);
        if (kvq_encode(st, pre, T, 0, enc, L.total, err, sizeof(err)) != L.total || kvq_decode(st, enc, L.total, T, 0, want[s], err, sizeof(err)))
            check(0, err, name);
        if (part == PART_K) kvq_rope_rows(want[s], T, 2, 8, 0, m->cfg.rope_theta, 1);
        for (int t = 0; t < T; t++) {
            decoder_read(d, s, 0, t, got);
            if (memcmp(got, want[s] + (size_t)t * Wk, (size_t)Wk * sizeof(float))) exact = 0;
            for (int j = 0; t == 0 && j < Wk; j++)
                if (fabsf(got[j] - x[s][j]) > 2e-3f * fabsf(x[s][j]) + 1e-5f) sink_ok = 0;
        }
        if ((int64_t)decoder_stream_seq_bytes(d, s, 0) != L.total) {
            printf("%s stream %d: %zu bytes stored, quant/kvquant.c's layout %lld\n", name, s, decoder_stream_seq_bytes(d, s, 0), (long long)L.total);
            bytes_ok = 0;
        }
        printf("%-28s %s: %lld sparse entries in %d tokens, %lld bytes\n", name, cache_part_name(part), (long long)nnz, T, (long long)L.total);
        check(nnz > 0, "the test has outliers", name);
        free(pre);
        free(enc);
    }
    check(exact, "every token reads as quant/kvquant.c's coding of the whole sequence (streaming = block), bit for bit", name);
    check(sink_ok, "the sink token reads within fp16 of what was written", name);
    check(bytes_ok, "bytes stored = quant/kvquant.c's layout of the sequence", name);
    decoder_free(d);
    for (int k = 0; k < 2; k++) { free(x[k]); free(want[k]); }
    free(got);
    cache_layout_free(&cl);
    model_free(m);
    free(m);
}

// cq codes keys before RoPE (as its paper): a GQA cache filled with known vectors reads each key
// back as RoPE(cq round trip(RoPE^-1(x))) at its position, bit for bit, and not as the round trip of
// the rotated key (which a post-RoPE cache would give).
static void check_cq_pre_rope(void) {
    const char *name = "gqa cq keys pre-RoPE";
    Model *m = model_new("{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":1}", name, 2);
    CacheLayout cl;
    layout_for(&cl, m, "fp32;k=cq:bits=4,c=2,iters=4");
    int s = cl.role[0].stream[PART_K], W = cl.part[PART_K].width;
    enum { N = 256, T = 40 };
    Rng r;
    rng_seed(&r, 3);
    float *cal = malloc((size_t)N * W * sizeof(float));
    for (size_t i = 0; i < (size_t)N * W; i++) cal[i] = (float)rng_normal(&r);
    void *st = NULL;
    char err[256];
    if (codec_traits(CODEC_CQ)->fit(&cl.part[PART_K].codec, W, cal, N, N, NULL, &st, err, sizeof(err))) { check(0, err, name); return; }
    cache_layout_set_fit(&cl, s, st);
    Decoder *d = decoder_new(m, &cl, 1, T);
    decoder_fill_synthetic(d, 0, T, 5);
    // fill_synthetic's vectors: per token, K's then V's
    rng_seed(&r, 5);
    float *x = malloc((size_t)W * sizeof(float)), *pre = malloc((size_t)W * sizeof(float)), *got = malloc((size_t)W * sizeof(float));
    uint8_t *enc = malloc(codec_bytes_per_token(&cl.part[PART_K].codec, W));
    Codec c = cache_stream_codec(&cl, s);
    int exact = 1, post_differs = 0;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < W; j++) x[j] = (float)rng_normal(&r);
        for (int j = 0; j < cl.part[PART_V].width; j++) (void)rng_normal(&r);
        memcpy(pre, x, (size_t)W * sizeof(float));
        kvq_rope_rows(pre, 1, 2, 8, t, m->cfg.rope_theta, -1);
        codec_encode(&c, enc, pre, 1, W);
        codec_decode(&c, pre, enc, 1, W);
        kvq_rope_rows(pre, 1, 2, 8, t, m->cfg.rope_theta, 1);
        decoder_read(d, s, 0, t, got);
        if (memcmp(got, pre, (size_t)W * sizeof(float))) exact = 0;
        codec_encode(&c, enc, x, 1, W);   // the post-RoPE reading
        codec_decode(&c, pre, enc, 1, W);
        if (t > 0 && memcmp(got, pre, (size_t)W * sizeof(float))) post_differs = 1;
    }
    check(exact, "a key reads as RoPE(cq round trip(RoPE^-1(x))) at its position, bit for bit", name);
    check(post_differs, "and not as the round trip of the rotated key", name);
    decoder_free(d);
    free(cal); free(x); free(pre); free(got); free(enc);
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
        {"gqa qjl k and v", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":1}",
         "qjl:m=64,o=2,mo=32,group=8,buffer=32,bits=2,vgroup=4"},
        {"mla qjl latent, kivi k_rope", "{" BASE LAT "\"attention\":\"mla\",\"num_hidden_layers\":1}",
         "latent=qjl:m=64,o=2,mo=32,group=8,buffer=32,bits=3;k_rope=kivi:bits=4,group=4,residual=32"},
    };
    static const Case PATHS[] = {
        {"gqa kivi 3 bits", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "kivi:bits=3,group=8,residual=32"},
        {"cla F=2 L=3 kivi k32 v16", "{" BASE "\"attention\":\"cla\",\"num_hidden_layers\":3}", "fp32;v=kivi:bits=2,group=8,residual=16;k=kivi:bits=4,group=8,residual=32"},
        {"clla F=2 L=3 kivi latent", "{" BASE LAT "\"attention\":\"clla\",\"num_hidden_layers\":3}", "fp32;latent=kivi:bits=2,group=8,residual=32"},
        {"gqa qjl", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "qjl:m=64,o=0,mo=0,group=8,buffer=32,bits=4"},
        {"clla F=2 L=3 qjl latent", "{" BASE LAT "\"attention\":\"clla\",\"num_hidden_layers\":3}", "fp32;latent=qjl:m=64,o=2,mo=32,group=8,buffer=32,bits=4"},
        {"gqa kvquant", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "kvquant:bits=3,sink=2"},
        {"clla F=2 L=3 kvquant all", "{" BASE LAT "\"attention\":\"clla\",\"num_hidden_layers\":3}", "kvquant:bits=4"},
        {"gqa kvquant k, kivi v", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}",
         "k=kvquant:bits=2;v=kivi:bits=2,group=8,residual=32"},
    };
    for (size_t i = 0; i < sizeof(STORAGE) / sizeof(STORAGE[0]); i++) check_storage(&STORAGE[i]);
    for (size_t i = 0; i < sizeof(PATHS) / sizeof(PATHS[0]); i++) check_paths(&PATHS[i]);
    check_score_path("gqa qjl keys", 4, 2, 8, 0, 0, 0);
    check_score_path("latent qjl + fp32 rope key", 4, 1, 16, 4, 1, 0);
    check_score_path("latent qjl + qjl rope key", 4, 1, 16, 8, 1, 1);
    check_kvquant_storage();
    check_cq_pre_rope();
    check_window_exact();
    check_through_cache();
    check_refusals();
    printf("test_decode_blocks: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
