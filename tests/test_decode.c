// Incremental decoding through the cache (model/decode.c) against the full-sequence forward.
//
// For every attention preset, share factors that do not divide the layer count, every share
// mode, int_group latents of 2, 4 and 8 bits, and MoE on and off: a batch of three sequences
// of different lengths (crossing at least three cache blocks) is prefilled to different
// points, then decoded token by token with the same tokens (teacher forcing). Every position's
// logits must equal the full forward's (which applies the same codecs where the cache holds a
// value) within 1e-4 (1e-3 with bf16 parts: a rounding flip, see CASES). Also: the cached
// CLLA-quant codes decode bit for bit to the latent the training forward used; the bytes the
// decoder holds are the tokens stored times the per-token figure of `clla info`
// (model/cache.c), rounded up to whole blocks; codecs encode their own
// round trip to the same bytes except int_group at 8 bits (why prefill encodes the value before
// its round trip, model/decode.c); released blocks are reused; decoder_extend (chunked
// prefill through the cache) gives the same logits; forked sequences share full blocks and
// decode as if each had been prefilled alone.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "eval/through_cache.h"
#include "model/decode.h"
#include "tests/lib/death.h"

static int passed, failed;

static void check(int ok, const char *what, const char *name) {
    if (ok) passed++;
    else { failed++; printf("FAIL %s: %s\n", name, what); }
}

typedef struct Case {
    const char *name;
    const char *json;
    const char *codecs;   // cache_layout_apply_spec specs, ';'-separated (NULL: all fp32 but a quantized latent)
    double tol;           // |decode - full| allowed (0: 1e-4)
} Case;

#define BASE "\"vocab_size\":37,\"hidden_size\":24,\"num_attention_heads\":4,\"head_dim\":6,\"intermediate_size\":20," \
             "\"initializer_range\":0.25,\"rope_theta\":100,\"max_position_embeddings\":256,"
#define LAT "\"kv_lora_rank\":16,\"qk_rope_head_dim\":4,"
#define MOE "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":12,\"n_shared_experts\":1,\"moe_capacity_factor\":1.0,"
static const Case CASES[] = {
    {"mha", "{" BASE "\"attention\":\"mha\",\"num_hidden_layers\":2}", NULL, 0},
    {"gqa", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", NULL, 0},
    {"mqa moe", "{" BASE MOE "\"attention\":\"mqa\",\"num_hidden_layers\":2}", NULL, 0},
    {"cla F=2 L=3", "{" BASE "\"attention\":\"cla\",\"num_hidden_layers\":3}", NULL, 0},
    {"gqa_cla F=3 L=4", "{" BASE "\"attention\":\"gqa_cla\",\"num_key_value_heads\":2,\"share_factor\":3,\"num_hidden_layers\":4}", NULL, 0},
    {"mla q_lora dv!=d", "{" BASE LAT "\"attention\":\"mla\",\"q_lora_rank\":8,\"v_head_dim\":5,\"num_hidden_layers\":2}", NULL, 0},
    {"clla F=2 L=3", "{" BASE LAT "\"attention\":\"clla\",\"num_hidden_layers\":3}", NULL, 0},
    {"clla_share_krope F=3 L=4", "{" BASE LAT "\"attention\":\"clla_share_krope\",\"share_factor\":3,\"num_hidden_layers\":4}", NULL, 0},
    {"clla_share_kvproj F=4 L=5", "{" BASE LAT "\"attention\":\"clla_share_kvproj\",\"share_factor\":4,\"num_hidden_layers\":5}", NULL, 0},
    {"clla_quant 4 bits moe", "{" BASE LAT MOE "\"attention\":\"clla_quant\",\"latent_quant_group\":8,\"num_hidden_layers\":3}", NULL, 0},
    {"clla_quant 2 bits", "{" BASE LAT "\"attention\":\"clla_quant\",\"latent_quant_bits\":2,\"latent_quant_group\":8,\"num_hidden_layers\":3}", NULL, 0},
    {"clla_quant 8 bits F=3", "{" BASE LAT "\"attention\":\"clla_quant\",\"latent_quant_bits\":8,\"latent_quant_group\":16,\"share_factor\":3,\"num_hidden_layers\":4}", NULL, 0},
    {"clla_quant_share_kvproj", "{" BASE LAT "\"attention\":\"clla_quant_share_kvproj\",\"latent_quant_group\":16,\"num_hidden_layers\":3}", NULL, 0},
    // the served defaults: bf16 parts (both paths apply the same bf16 rounding, but a value
    // within an ulp of a rounding boundary may round the other way: a step computes k and v in
    // a one-row matmul, the full forward in a many-row one, and their fp32 sums can differ in
    // the last bit; one flipped bf16 element moves the logits by ~1e-4, a wrong cache by 1e-1)
    {"gqa bf16 cache", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "bf16", 1e-3},
    {"clla bf16 krope, int4 latent", "{" BASE LAT "\"attention\":\"clla\",\"num_hidden_layers\":3}", "bf16;latent=int_group:bits=4,group=8", 1e-3},
};

#define NSEQ 3
#define TMAX 250
static const int LENS[NSEQ] = {250, 44, 53};         // 23 blocks of 16: past a slab of 16 blocks (model/decode.c)
static const int SPLITS[][NSEQ] = {{1, 5, 17}, {33, 1, 16}, {60, 43, 52}};   // prompt lengths

static void layout_for(CacheLayout *cl, const Model *m, const char *specs) {
    cache_layout(cl, &m->cfg);
    char err[256];
    // fp32 everywhere unless told: the comparison is exact up to summation order; a quantized
    // latent keeps its trained int_group codec
    for (int p = 0; p < N_PARTS; p++)
        if (cl->part[p].present && !(p == PART_LATENT && cl->part[p].codec.kind == CODEC_INT_GROUP))
            cl->part[p].codec = (Codec){.kind = CODEC_FP32};
    if (!specs) return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", specs);
    for (char *save = NULL, *s = strtok_r(buf, ";", &save); s; s = strtok_r(NULL, ";", &save))
        if (cache_layout_apply_spec(cl, s, err, sizeof(err)) != 0) { printf("bad spec %s: %s\n", s, err); exit(1); }
}

// Forks: the prefix tok[0][..p) prefilled once in sequence 0, forked into 1 and 2, 0 released;
// 1 goes on with tok[0] (its logits must equal the full forward's row 0) and 2 with tok[1]'s
// tokens after the prefix (its logits must equal a decoder that prefilled that mix itself).
// Full blocks are shared, the partial last one copied (p = 37) or there is none (p = 32).
static double check_fork(Model *m, const CacheLayout *cl, int32_t tok[NSEQ][TMAX], const float *full, const char *name) {
    int V = m->cfg.vocab_size, n0 = LENS[0] < LENS[1] ? LENS[0] : LENS[1];
    double worst = 0;
    float *lg = malloc((size_t)2 * V * sizeof(float)), *ref = malloc((size_t)TMAX * V * sizeof(float));
    static const int PREFIX[] = {37, 32};
    for (int k = 0; k < 2; k++) {
        int p = PREFIX[k], zero = 0, rest = p % DECODE_BLOCK_TOKENS ? 1 : 0;
        int32_t mix[TMAX];
        for (int t = 0; t < n0; t++) mix[t] = t < p ? tok[0][t] : tok[1][t];
        // the reference: the mix prefilled and stepped by a decoder of its own
        Decoder *d = decoder_new(m, cl, 1, TMAX);
        const int32_t *pm = mix;
        decoder_prefill(d, 1, &zero, &pm, &p, NULL);
        for (int t = p; t < n0; t++) decoder_step(d, 1, &zero, &mix[t], ref + (size_t)t * V);
        decoder_free(d);

        d = decoder_new(m, cl, 3, TMAX);
        const int32_t *p0 = tok[0];
        decoder_prefill(d, 1, &zero, &p0, &p, NULL);
        decoder_fork(d, 0, 1);
        decoder_fork(d, 0, 2);
        check(decoder_blocks_in_use(d) == (size_t)(p / DECODE_BLOCK_TOKENS + 3 * rest), "a fork shares the full blocks", name);
        decoder_release(d, 0);
        check(decoder_blocks_in_use(d) == (size_t)(p / DECODE_BLOCK_TOKENS + 2 * rest), "a released fork source keeps the shared blocks", name);
        check(decoder_seq_len(d, 1) == p && decoder_seq_len(d, 2) == p, "a fork has the source's length", name);
        int ids[2] = {1, 2};
        for (int t = p; t < n0; t++) {
            int32_t next[2] = {tok[0][t], mix[t]};
            decoder_step(d, 2, ids, next, lg);
            for (int v = 0; v < V; v++) {
                double e1 = fabs(lg[v] - full[(size_t)t * V + v]);
                double e2 = fabs(lg[(size_t)V + v] - ref[(size_t)t * V + v]);
                if (e1 > worst) worst = e1;
                if (e2 > worst) worst = e2;
            }
        }
        decoder_release(d, 1);
        decoder_release(d, 2);
        check(decoder_blocks_in_use(d) == 0, "every block free after the forks are released", name);
        decoder_free(d);
    }
    free(lg);
    free(ref);
    return worst;
}

static void run_case(const Case *cs, int ci) {
    Config cfg;
    config_from_json(&cfg, cs->json, cs->name, 0, NULL);
    Model m;
    model_build(&m, &cfg.model, backend_cpu());
    model_init_weights(&m, 100 + ci);
    int V = cfg.model.vocab_size;
    CacheLayout cl;
    layout_for(&cl, &m, cs->codecs);

    int32_t tok[NSEQ][TMAX];
    Rng r;
    rng_seed(&r, 7 + ci);
    for (int i = 0; i < NSEQ; i++)
        for (int t = 0; t < TMAX; t++) tok[i][t] = t < LENS[i] ? (int32_t)(rng_next(&r) % (uint64_t)V) : 0;

    // the full forward, with the same codecs where the cache would hold a value
    m.inference = 1;
    model_use_cache_codecs(&m, &cl);
    m.apply_codecs = 1;
    model_set_batch(&m, NSEQ, TMAX);
    model_forward(&m, &tok[0][0], NULL);
    float *full = malloc((size_t)NSEQ * TMAX * V * sizeof(float));
    m.be->act_to_host(full, table_ptr_store(&m.acts, m.act, m.logits), (size_t)NSEQ * TMAX * V);
    // the latent the training forward used (first slot), for the bit-for-bit check
    int R = cfg.model.kv_lora_rank;
    float *slot_c = NULL;
    if (R) {
        slot_c = malloc((size_t)NSEQ * TMAX * R * sizeof(float));
        m.be->act_to_host(slot_c, table_ptr_store(&m.acts, m.act, m.sa[0].c), (size_t)NSEQ * TMAX * R);
    }
    m.apply_codecs = 0;
    // the model's own codecs now differ from the decoder's (the served bf16 layout): prefill
    // must attend with the decoder's, or its logits leave the full forward's
    if (!cs->codecs) {
        CacheLayout served;
        cache_layout(&served, &cfg.model);
        model_use_cache_codecs(&m, &served);
        cache_layout_free(&served);
    }

    double worst = 0;
    float *lg = malloc((size_t)NSEQ * V * sizeof(float));
    for (size_t sp = 0; sp < sizeof(SPLITS) / sizeof(SPLITS[0]); sp++) {
        // the first split with the usual 2 MiB slabs (one slab a stream here), the others with
        // slabs of 16 blocks, which the sequences' 23 blocks cross
        Decoder *d = sp == 0 ? decoder_new(&m, &cl, NSEQ, TMAX) : decoder_new_slabs(&m, &cl, NSEQ, TMAX, 0);
        int ids[NSEQ] = {0, 1, 2};
        const int32_t *prompts[NSEQ] = {tok[0], tok[1], tok[2]};
        decoder_prefill(d, NSEQ, ids, prompts, SPLITS[sp], lg);
        for (int i = 0; i < NSEQ; i++)
            for (int v = 0; v < V; v++) {
                double e = fabs(lg[(size_t)i * V + v] - full[((size_t)i * TMAX + SPLITS[sp][i] - 1) * V + v]);
                if (e > worst) worst = e;
            }
        // step every sequence that still has tokens, a shrinking batch
        for (;;) {
            int n = 0, sid[NSEQ];
            int32_t next[NSEQ];
            for (int i = 0; i < NSEQ; i++) {
                int len = decoder_seq_len(d, i);
                if (len < LENS[i]) { sid[n] = i; next[n] = tok[i][len]; n++; }
            }
            if (!n) break;
            decoder_step(d, n, sid, next, lg);
            for (int k = 0; k < n; k++) {
                int pos = decoder_seq_len(d, sid[k]) - 1;
                for (int v = 0; v < V; v++) {
                    double e = fabs(lg[(size_t)k * V + v] - full[((size_t)sid[k] * TMAX + pos) * V + v]);
                    if (e > worst) worst = e;
                }
            }
        }
        if (sp == 0) {
            // bytes: tokens stored times the per-token figure, whole blocks
            size_t blocks = 0;
            for (int i = 0; i < NSEQ; i++) blocks += (size_t)(LENS[i] + DECODE_BLOCK_TOKENS - 1) / DECODE_BLOCK_TOKENS;
            check(decoder_cache_bytes(d) == blocks * DECODE_BLOCK_TOKENS * decoder_bytes_per_token(d),
                  "cache bytes = whole blocks x bytes per token", cs->name);
            check(decoder_bytes_per_token(d) == cache_layout_bytes_per_token(&cl), "bytes per token = the layout's", cs->name);
            // released blocks are reused: a new sequence after a release allocates nothing
            size_t before = decoder_cache_bytes(d);
            decoder_release(d, 1);
            int one = 1, l1 = 40;
            const int32_t *p1[1] = {tok[1]};
            decoder_prefill(d, 1, &one, p1, &l1, NULL);
            check(decoder_cache_bytes(d) == before, "released blocks reused", cs->name);
        }
        decoder_free(d);
    }
    // extend (chunked prefill without the full forward): in two pieces from empty, the logits
    // after the last token of each piece equal the full forward's
    {
        Decoder *d = decoder_new(&m, &cl, NSEQ, TMAX);
        for (int i = 0; i < NSEQ; i++) {
            int cut = SPLITS[1][i];
            decoder_extend(d, i, tok[i], cut, lg);
            for (int v = 0; v < V; v++) {
                double e = fabs(lg[v] - full[((size_t)i * TMAX + cut - 1) * V + v]);
                if (e > worst) worst = e;
            }
            decoder_extend(d, i, tok[i] + cut, LENS[i] - cut, lg);
            for (int v = 0; v < V; v++) {
                double e = fabs(lg[v] - full[((size_t)i * TMAX + LENS[i] - 1) * V + v]);
                if (e > worst) worst = e;
            }
        }
        decoder_free(d);
    }
    double fork_err = check_fork(&m, &cl, tok, full, cs->name);
    double tol = cs->tol > 0 ? cs->tol : 1e-4;
    check(fork_err <= tol, "forked sequences decode as if prefilled alone", cs->name);
    if (fork_err > worst) worst = fork_err;
    // a prefill of the whole rows, padding tokens included: equal lengths, so one forward of the
    // full forward's shape (decoder_prefill groups prompts by length, and a matmul's bits depend
    // on its rows): the cached latent decodes bit for bit to the latent the training forward used
    // (CLLA-quant: its int_group codes)
    if (R) {
        Decoder *d = decoder_new(&m, &cl, NSEQ, TMAX);
        int ids[NSEQ] = {0, 1, 2}, whole[NSEQ] = {TMAX, TMAX, TMAX};
        const int32_t *prompts[NSEQ] = {tok[0], tok[1], tok[2]};
        decoder_prefill(d, NSEQ, ids, prompts, whole, NULL);
        int s_lat = decoder_layout(d)->role[0].stream[PART_LATENT];
        float *v = malloc((size_t)R * sizeof(float));
        int exact = 1;
        for (int i = 0; i < NSEQ; i++)
            for (int t = 0; t < TMAX; t++) {
                decoder_read(d, s_lat, i, t, v);
                if (memcmp(v, slot_c + ((size_t)i * TMAX + t) * R, (size_t)R * sizeof(float))) exact = 0;
            }
        check(exact, "cached latent decodes bit for bit to the forward's", cs->name);
        free(v);
        decoder_free(d);
    }
    check(worst <= tol, "decoded logits equal the full forward's", cs->name);
    printf("%-32s bytes/token %5.10g  max |decode - full| %.2e\n", cs->name, cache_layout_bytes_per_token(&cl), worst);
    free(lg);
    free(full);
    free(slot_c);
    cache_layout_free(&cl);
    model_free(&m);
}

// Encoding a round-tripped value gives the same bytes for these codecs; int_group at 8 bits is
// the counterexample (a bf16 scale rounded up by up to 2^-8 can leave the largest code at
// Imax - 1, and the next scale is smaller), which is why prefill encodes before the round trip.
static void check_idempotent(void) {
    const char *specs[] = {"fp32", "bf16", "int_group:bits=2,group=8", "int_group:bits=4,group=32"};
    int W = 64, N = 50;
    Rng r;
    rng_seed(&r, 3);
    float *x = malloc((size_t)N * W * sizeof(float)), *y = malloc((size_t)N * W * sizeof(float));
    for (int i = 0; i < N * W; i++) x[i] = (float)((rng_next(&r) % 20001) - 10000) * 1e-3f * (i % 7 == 0 ? 30.0f : 1.0f);
    for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
        Codec c;
        char err[128];
        if (codec_parse(&c, specs[k], err, sizeof(err))) { check(0, err, specs[k]); continue; }
        size_t tb = codec_bytes_per_token(&c, W);
        uint8_t *a = malloc(tb * N), *b = malloc(tb * N);
        codec_encode(&c, a, x, N, W);
        codec_decode(&c, y, a, N, W);
        codec_encode(&c, b, y, N, W);
        check(!memcmp(a, b, tb * N), "encode(decode(encode(x))) == encode(x)", specs[k]);
        char back[64];
        codec_format(&c, back, sizeof(back));
        check(!strcmp(back, specs[k]), "spec formats back to itself", specs[k]);
        free(a);
        free(b);
    }
    free(x);
    free(y);
}

// A backend without the decoding ops is refused by name; the CPU backends have every op.
static void check_backend_ops(void) {
    Backend b = *backend_cpu();
    check(backend_missing_op(&b, BACKEND_OPS_CORE | BACKEND_OPS_MOE | BACKEND_OPS_DECODE) == NULL, "cpu has every op", "ops");
    check(backend_missing_op(backend_cpu_bf16(), BACKEND_OPS_CORE | BACKEND_OPS_MOE | BACKEND_OPS_DECODE) == NULL,
          "cpu-bf16 has every op", "ops");
    b.paged_attention = NULL;
    const char *miss = backend_missing_op(&b, BACKEND_OPS_DECODE);
    check(miss && !strcmp(miss, "paged_attention"), "a missing decoding op is named", "ops");
    check(backend_missing_op(&b, BACKEND_OPS_CORE) == NULL, "core ops do not need decoding ops", "ops");
}

// A backend that keeps the cache in device memory (host_memory 0, as CUDA) reads fp32, bf16 and
// int_group streams itself; a codec read only through the host decode callback (kivi here) is
// refused by decoder_new, naming it, instead of at the first attention step after a prefill.
typedef struct DeviceDecoderArgs { const Backend *be; const char *spec; } DeviceDecoderArgs;

static void new_device_decoder(const void *arg) {
    const DeviceDecoderArgs *a = arg;
    Config cfg;
    config_from_json(&cfg, "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}", "device", 0, NULL);
    Model m;
    model_build(&m, &cfg.model, a->be);
    CacheLayout cl;
    cache_layout(&cl, &cfg.model);
    char err[256];
    if (cache_layout_apply_spec(&cl, a->spec, err, sizeof(err)) != 0) die("%s", err);
    decoder_free(decoder_new(&m, &cl, 1, 8));
    model_free(&m);
}

static void check_device_codecs(void) {
    Backend dev = *backend_cpu();
    dev.host_memory = 0;
    char msg[1024];
    const DeviceDecoderArgs kivi = {&dev, "kivi:bits=2,group=4,residual=16"}, i4 = {&dev, "int_group:bits=4,group=6"};
    check(died_with(new_device_decoder, &kivi, "the kivi cache codec decodes only on the host", "--device cpu", msg, sizeof(msg)),
          msg, "device-memory backend refuses kivi at decoder_new");
    // the same layout with a codec the device reads: no error (the child exits 0)
    check(!died_with(new_device_decoder, &i4, NULL, NULL, msg, sizeof(msg)) && !msg[0], msg, "device-memory backend takes int_group");
}

// A backend's widest attention head (max_head_width; CUDA's kernels hold 256 in registers) is
// checked when a model is built on it, query/key width including a latent model's rope dims.
typedef struct NarrowArgs { const Backend *be; const char *json; } NarrowArgs;

static void build_on(const void *arg) {
    const NarrowArgs *a = arg;
    Config cfg;
    config_from_json(&cfg, a->json, "narrow", 0, NULL);
    Model m;
    model_build(&m, &cfg.model, a->be);
    model_free(&m);
}

static void check_head_width_limit(void) {
    Backend narrow = *backend_cpu();
    narrow.max_head_width = 6;
    char msg[1024];
    const NarrowArgs gqa = {&narrow, "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}"};
    const NarrowArgs mla = {&narrow, "{" BASE "\"attention\":\"mla\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":2,\"num_hidden_layers\":2}"};
    check(!died_with(build_on, &gqa, NULL, NULL, msg, sizeof(msg)) && !msg[0], msg, "heads of 6 on a backend taking 6");
    check(died_with(build_on, &mla, "takes attention heads up to 6 wide, and this model's are 8 (query/key)", NULL, msg, sizeof(msg)), msg,
          "an MLA head of 6 + 2 rope dims refused on a backend taking 6");
}

// Perplexity through the cache: the full forward with the codecs' round trips and token-by-token
// decoding give the same loss; a coarser codec changes it (the scored tokens do pass through it).
static void check_through_cache(void) {
    const char *json = "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}";
    Config cfg;
    config_from_json(&cfg, json, "through_cache", 0, NULL);
    Model m;
    model_build(&m, &cfg.model, backend_cpu());
    model_init_weights(&m, 5);
    int B = 3, T = 40;
    int32_t in[120], tg[120];
    Rng r;
    rng_seed(&r, 21);
    for (int i = 0; i < B * T; i++) { in[i] = (int32_t)(rng_next(&r) % 37); tg[i] = i % 7 == 3 ? IGNORE_INDEX : (int32_t)(rng_next(&r) % 37); }
    const char *specs[2] = {"fp32", "int_group:bits=2,group=2"};
    double loss[2];
    for (int k = 0; k < 2; k++) {
        CacheLayout cl;
        cache_layout(&cl, &cfg.model);
        char err[128];
        if (cache_layout_apply_spec(&cl, specs[k], err, sizeof(err))) { check(0, err, specs[k]); return; }
        CacheLoss acc = {0};
        eval_through_cache(&m, &cl, in, tg, B, T, &acc);
        loss[k] = acc.full_sum / acc.count;
        printf("through the cache, %-26s loss: full forward %.6f, decoded %.6f over %lld tokens\n", specs[k], loss[k],
               acc.decode_sum / acc.count, acc.count);
        check(fabs(acc.full_sum - acc.decode_sum) / acc.count < 1e-5, "full-forward and decoded losses agree", specs[k]);
        cache_layout_free(&cl);
    }
    check(fabs(loss[0] - loss[1]) > 1e-4, "a 2-bit cache changes the loss", "through_cache");
    model_free(&m);
}

int main(void) {
    check_through_cache();
    check_backend_ops();
    check_device_codecs();
    check_head_width_limit();
    check_idempotent();
    for (size_t ci = 0; ci < sizeof(CASES) / sizeof(CASES[0]); ci++) run_case(&CASES[ci], (int)ci);
    printf("test_decode: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
