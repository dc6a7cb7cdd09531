// The backward's reports of complete gradients (Model.grad_final, model/forward.c), which the
// data-parallel trainer trusts to send gradients to the other ranks while the backward goes on
// (train/grad_sync.c): for every attention preset, share factors that do and do not divide the
// layers, tied embeddings and an MoE model, each report's `from` falls, the last is 0, every
// layer reports once, and every gradient element at or above a report's `from` already holds
// its final value then (compared bit for bit with the gradient at the end of the backward).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "model/model.h"
#include "tests/tiny_batch.h"

typedef struct Case {
    const char *name;
    const char *json;
} Case;

#define BASE "\"vocab_size\":29,\"hidden_size\":16,\"num_attention_heads\":4,\"head_dim\":4,\"intermediate_size\":20," \
             "\"initializer_range\":0.3,\"rope_theta\":100,"
#define LATENT "\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,"
static const Case CASES[] = {
    {"mha", "{" BASE "\"attention\":\"mha\",\"num_hidden_layers\":2}"},
    {"gqa tied", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2,\"tie_word_embeddings\":true}"},
    {"mqa", "{" BASE "\"attention\":\"mqa\",\"num_hidden_layers\":2}"},
    {"cla F=2 L=3", "{" BASE "\"attention\":\"cla\",\"num_hidden_layers\":3}"},
    {"gqa_cla F=3 L=4", "{" BASE "\"attention\":\"gqa_cla\",\"num_key_value_heads\":2,\"share_factor\":3,\"num_hidden_layers\":4}"},
    {"mla q_lora", "{" BASE LATENT "\"attention\":\"mla\",\"q_lora_rank\":6,\"v_head_dim\":3,\"num_hidden_layers\":2}"},
    {"clla F=2 L=3", "{" BASE LATENT "\"attention\":\"clla\",\"num_hidden_layers\":3}"},
    {"clla_share_krope F=3", "{" BASE LATENT "\"attention\":\"clla_share_krope\",\"share_factor\":3,\"num_hidden_layers\":4}"},
    {"clla_share_kvproj F=4", "{" BASE LATENT "\"attention\":\"clla_share_kvproj\",\"share_factor\":4,\"num_hidden_layers\":5}"},
    {"clla_quant F=2 L=3", "{" BASE LATENT "\"attention\":\"clla_quant\",\"latent_quant_group\":8,\"num_hidden_layers\":3}"},
    {"clla_quant_share_kvproj", "{" BASE LATENT "\"attention\":\"clla_quant_share_kvproj\",\"latent_quant_group\":8,\"num_hidden_layers\":3}"},
    {"clla_quant + MoE", "{" BASE LATENT "\"attention\":\"clla_quant\",\"latent_quant_group\":8,\"num_hidden_layers\":3,\"n_routed_experts\":4,"
                         "\"n_shared_experts\":1,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"first_k_dense_layers\":1,"
                         "\"moe_aux_loss_coef\":0.01,\"moe_z_loss_coef\":0.001}"},
};

#define MAX_REPORTS 16

// Every report: its `from` and a copy of the gradient from there to the end.
typedef struct Reports {
    const Model *m;
    int n;
    size_t from[MAX_REPORTS];
    float *copy[MAX_REPORTS];
} Reports;

static void record(void *ctx, size_t from) {
    Reports *r = ctx;
    if (r->n == MAX_REPORTS) die("test_grad_final: more than %d reports", MAX_REPORTS);
    size_t total = r->m->params.bytes_f32 / sizeof(float);
    r->from[r->n] = from;
    r->copy[r->n] = xmalloc((total - from + 1) * sizeof(float));
    memcpy(r->copy[r->n], r->m->grad + from, (total - from) * sizeof(float));
    r->n++;
}

int main(void) {
    const int B = 2, T = 7;
    int passed = 0, failed = 0;
    for (size_t ci = 0; ci < sizeof(CASES) / sizeof(CASES[0]); ci++) {
        Config cfg;
        Model m;
        int32_t in[14], tg[14];
        Rng rng;
        rng_seed(&rng, 99 + ci);
        tiny_batch(&m, &cfg, CASES[ci].json, CASES[ci].name, 7 + ci, B, T, 29, &rng, in, tg);
        // a nonzero gradient to start from, as a micro-step after the first adds to it
        Reports r = {.m = &m};
        model_zero_grad(&m);
        model_forward(&m, in, tg);
        model_backward(&m, 1.0f);
        m.grad_final = record;
        m.grad_final_ctx = &r;
        model_forward(&m, in, tg);
        model_backward(&m, 0.5f);
        m.grad_final = NULL;
        const size_t total = m.params.bytes_f32 / sizeof(float);
        const int L = cfg.model.num_hidden_layers, want = m.grad_final_by_layer ? L + 2 : 2;
        char why[200] = "";
        if (!m.grad_final_by_layer) snprintf(why, sizeof(why), "no per-layer reports (a layer writes a later layer's tensors)");
        else if (r.n != want) snprintf(why, sizeof(why), "%d reports, expected %d", r.n, want);
        else if (r.from[r.n - 1] != 0) snprintf(why, sizeof(why), "the last report is from %zu, not 0", r.from[r.n - 1]);
        for (int i = 0; !why[0] && i < r.n; i++) {
            if (i && r.from[i] >= r.from[i - 1]) snprintf(why, sizeof(why), "report %d from %zu does not fall", i, r.from[i]);
            for (size_t e = r.from[i]; !why[0] && e < total; e++)
                if (memcmp(&r.copy[i][e - r.from[i]], &m.grad[e], sizeof(float)))
                    snprintf(why, sizeof(why), "report %d (from %zu): element %zu was %g then, %g at the end", i, r.from[i], e,
                             (double)r.copy[i][e - r.from[i]], (double)m.grad[e]);
        }
        if (why[0]) {
            printf("FAIL %s: %s\n", CASES[ci].name, why);
            failed++;
        } else {
            printf("ok   %s: %d reports, each from's gradients final when reported\n", CASES[ci].name, r.n);
            passed++;
        }
        for (int i = 0; i < r.n; i++) free(r.copy[i]);
        model_free(&m);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
