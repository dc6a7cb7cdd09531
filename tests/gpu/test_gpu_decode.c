// Incremental decoding on the CUDA backend against the CPU bf16 emulation (layers/
// backend_cpu_bf16.c), which rounds where the CUDA kernels store bf16 and rounds the weights
// with the same stochastic hash: the same weights bit for bit, the same cache codecs (bf16 K/V
// and rope keys, CLLA-quant's int4 latent), three sequences of different lengths prefilled and
// then decoded token by token (rope_rows_forward, paged_attention: kernels/cuda_decode.cu).
// Every step's logits must agree within the logit tolerance of tests/gpu/test_gpu_train.c
// (|gpu - emu| <= 2e-2 * max|emu| + 2^-6 |emu|; an estimate, not yet measured on a GPU), and
// the CUDA decode must agree with the CUDA full forward over the same tokens (the cache path
// against the training path on one device).
//
// No usable GPU: prints "skipped: no CUDA device (<reason>)" and exits 77 (ctest: skipped).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/backend_cuda.h"
#include "model/decode.h"

#define TOL_ATOL 2e-2
#define TOL_RTOL 0x1p-6

static int n_passed, n_failed;

#define BASE "\"vocab_size\":61,\"hidden_size\":40,\"num_attention_heads\":4,\"head_dim\":10,\"intermediate_size\":72," \
             "\"initializer_range\":0.1,\"rope_theta\":100,\"max_position_embeddings\":128,\"train\":{\"seq_len\":128},"
typedef struct Case { const char *name, *json; } Case;
static const Case CASES[] = {
    {"mha", "{" BASE "\"attention\":\"mha\",\"num_hidden_layers\":2}"},
    {"gqa_cla F=3 L=4", "{" BASE "\"attention\":\"gqa_cla\",\"num_key_value_heads\":2,\"share_factor\":3,\"num_hidden_layers\":4}"},
    {"mla", "{" BASE "\"attention\":\"mla\",\"kv_lora_rank\":16,\"qk_rope_head_dim\":4,\"q_lora_rank\":12,\"v_head_dim\":6,\"num_hidden_layers\":2}"},
    {"clla_share_kvproj", "{" BASE "\"attention\":\"clla_share_kvproj\",\"kv_lora_rank\":16,\"qk_rope_head_dim\":4,\"num_hidden_layers\":3}"},
    {"clla_quant", "{" BASE "\"attention\":\"clla_quant\",\"kv_lora_rank\":32,\"qk_rope_head_dim\":4,\"num_hidden_layers\":3}"},
};

#define NSEQ 3
#define TMAX 50
static const int LENS[NSEQ] = {50, 37, 44}, PROMPT[NSEQ] = {5, 20, 1};

// Logits of every position: prefill PROMPT tokens, then steps (teacher forcing). out (NSEQ, TMAX, V).
static void decode_all(Model *m, int32_t tok[NSEQ][TMAX], float *out) {
    int V = m->cfg.vocab_size;
    Decoder *d = decoder_new(m, NULL, NSEQ, TMAX);
    int ids[NSEQ] = {0, 1, 2};
    const int32_t *prompts[NSEQ] = {tok[0], tok[1], tok[2]};
    float *lg = malloc((size_t)NSEQ * V * sizeof(float));
    decoder_prefill(d, NSEQ, ids, prompts, PROMPT, lg);
    for (int i = 0; i < NSEQ; i++) memcpy(out + ((size_t)i * TMAX + PROMPT[i] - 1) * V, lg + (size_t)i * V, (size_t)V * sizeof(float));
    for (;;) {
        int n = 0, sid[NSEQ];
        int32_t next[NSEQ];
        for (int i = 0; i < NSEQ; i++)
            if (decoder_seq_len(d, i) < LENS[i]) { sid[n] = i; next[n] = tok[i][decoder_seq_len(d, i)]; n++; }
        if (!n) break;
        decoder_step(d, n, sid, next, lg);
        for (int k = 0; k < n; k++)
            memcpy(out + ((size_t)sid[k] * TMAX + decoder_seq_len(d, sid[k]) - 1) * V, lg + (size_t)k * V, (size_t)V * sizeof(float));
    }
    free(lg);
    decoder_free(d);
}

// max over scored positions of |a - b| / (TOL_ATOL M + TOL_RTOL |b|), M = max |b|
static double worst_ratio(const float *a, const float *b, int V) {
    double M = 0, worst = 0;
    for (int i = 0; i < NSEQ; i++)
        for (int t = PROMPT[i] - 1; t < LENS[i]; t++)
            for (int v = 0; v < V; v++) M = fmax(M, fabs(b[((size_t)i * TMAX + t) * V + v]));
    for (int i = 0; i < NSEQ; i++)
        for (int t = PROMPT[i] - 1; t < LENS[i]; t++)
            for (int v = 0; v < V; v++) {
                size_t k = ((size_t)i * TMAX + t) * V + v;
                worst = fmax(worst, fabs(a[k] - b[k]) / (TOL_ATOL * M + TOL_RTOL * fabs(b[k])));
            }
    return worst;
}

static void result(const char *name, const char *what, double ratio) {
    int ok = ratio <= 1.0;
    ok ? n_passed++ : n_failed++;
    printf("%s %-20s %-44s err/tol %.3f\n", ok ? "ok  " : "FAIL", name, what, ratio);
}

int main(void) {
    // the cases' configs are checked first, so a machine without a GPU (CI) still catches one that
    // a later config rule refuses (config_from_json dies with the rule)
    for (size_t ci = 0; ci < sizeof(CASES) / sizeof(CASES[0]); ci++) {
        Config cfg;
        config_from_json(&cfg, CASES[ci].json, CASES[ci].name, 0, NULL);
    }
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason)) {
        printf("skipped: no CUDA device (%s)\n", reason);
        return 77;
    }
    for (size_t ci = 0; ci < sizeof(CASES) / sizeof(CASES[0]); ci++) {
        Config cfg;
        config_from_json(&cfg, CASES[ci].json, CASES[ci].name, 0, NULL);
        int V = cfg.model.vocab_size;
        int32_t tok[NSEQ][TMAX];
        Rng r;
        rng_seed(&r, 40 + ci);
        for (int i = 0; i < NSEQ; i++)
            for (int t = 0; t < TMAX; t++) tok[i][t] = (int32_t)(rng_next(&r) % (uint64_t)V);
        float *out[2], *full = malloc((size_t)NSEQ * TMAX * V * sizeof(float));
        const Backend *bes[2] = {backend_cpu_bf16(), backend_cuda()};
        Model m[2];
        for (int k = 0; k < 2; k++) {
            model_build(&m[k], &cfg.model, bes[k]);
            model_init_weights(&m[k], 9 + ci);   // host RNG: the same masters, the same bf16 weights
            out[k] = calloc((size_t)NSEQ * TMAX * V, sizeof(float));
            decode_all(&m[k], tok, out[k]);
        }
        // the CUDA full forward with the same codecs, for the cache path against the full path
        m[1].inference = 1;
        m[1].apply_codecs = 1;
        model_set_batch(&m[1], NSEQ, TMAX);
        model_forward(&m[1], &tok[0][0], NULL);
        bes[1]->act_to_host(full, table_ptr_store(&m[1].acts, m[1].act, m[1].logits), (size_t)NSEQ * TMAX * V);
        result(CASES[ci].name, "cuda decode vs cpu-bf16 decode", worst_ratio(out[1], out[0], V));
        result(CASES[ci].name, "cuda decode vs cuda full forward", worst_ratio(out[1], full, V));
        for (int k = 0; k < 2; k++) { model_free(&m[k]); free(out[k]); }
        free(full);
    }
    printf("test_gpu_decode: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
