// Whole-model gradients against central finite differences, for every attention preset
// (the quantized ones excepted: their straight-through gradient is by design not the
// derivative of the piecewise-constant forward; the PyTorch twin checks those).
// A few entries of every parameter tensor are perturbed; the difference quotient of the
// fp32 loss is compared with the analytic gradient relative to the tensor's largest
// gradient. This test needs nothing but the C library.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "model/model.h"
#include "tests/tiny_batch.h"

typedef struct Case {
    const char *name;
    const char *json;
} Case;

#define BASE "\"vocab_size\":29,\"hidden_size\":16,\"num_attention_heads\":4,\"head_dim\":4,\"intermediate_size\":20," \
             "\"initializer_range\":0.3,\"rope_theta\":100,"
static const Case CASES[] = {
    {"mha", "{" BASE "\"attention\":\"mha\",\"num_hidden_layers\":2}"},
    {"gqa tied", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2,\"tie_word_embeddings\":true}"},
    {"cla F=2 L=3", "{" BASE "\"attention\":\"cla\",\"num_hidden_layers\":3}"},
    {"gqa_cla F=3 L=4", "{" BASE "\"attention\":\"gqa_cla\",\"num_key_value_heads\":2,\"share_factor\":3,\"num_hidden_layers\":4}"},
    {"mla q_lora", "{" BASE "\"attention\":\"mla\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,\"q_lora_rank\":6,\"v_head_dim\":3,\"num_hidden_layers\":2}"},
    {"clla F=2 L=3", "{" BASE "\"attention\":\"clla\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,\"num_hidden_layers\":3}"},
    {"clla_share_krope F=3", "{" BASE "\"attention\":\"clla_share_krope\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":2,\"share_factor\":3,\"num_hidden_layers\":4}"},
    {"clla_share_kvproj F=4 q_lora", "{" BASE "\"attention\":\"clla_share_kvproj\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,\"q_lora_rank\":6,\"share_factor\":4,\"num_hidden_layers\":5}"},
};

static double loss_of(Model *m, const int32_t *in, const int32_t *tg) { return model_forward(m, in, tg); }

int main(void) {
    const int B = 2, T = 7;
    int passed = 0, failed = 0;
    for (size_t ci = 0; ci < sizeof(CASES) / sizeof(CASES[0]); ci++) {
        Config cfg;
        Model m;
        int32_t in[14], tg[14];
        Rng r;
        rng_seed(&r, 99 + ci);
        tiny_batch(&m, &cfg, CASES[ci].json, CASES[ci].name, 7 + ci, B, T, 29, &r, in, tg);
        model_zero_grad(&m);
        loss_of(&m, in, tg);
        model_backward(&m, 1.0f);
        double worst = 0;
        const char *worst_name = "";
        for (int t = 0; t < m.params.n; t++) {
            const TensorInfo *ti = &m.params.t[t];
            float *w = table_ptr_f32(&m.params, m.master, t);
            float *g = table_ptr_f32(&m.params, m.grad, t);
            double gmax = 0;
            for (size_t k = 0; k < ti->numel; k++) gmax = fmax(gmax, fabs(g[k]));
            for (int s = 0; s < 4; s++) {
                size_t k = (size_t)(rng_next(&r) % ti->numel);
                float keep = w[k];
                const float eps = 1e-2f;
                w[k] = keep + eps;
                double lp = loss_of(&m, in, tg);
                w[k] = keep - eps;
                double lm = loss_of(&m, in, tg);
                w[k] = keep;
                double fd = (lp - lm) / (2.0 * eps);
                double err = fabs(fd - g[k]) / fmax(gmax, 1e-3);
                if (err > worst) { worst = err; worst_name = ti->name; }
            }
        }
        int ok = worst < 2e-2;
        printf("%s %-30s worst rel err %.2e (%s)\n", ok ? "ok  " : "FAIL", CASES[ci].name, worst, worst_name);
        ok ? passed++ : failed++;
        model_free(&m);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
