// bench_moe: the MoE layer's time follows the work routed, not the number of experts.
//
// Builds two one-layer MoE models that differ only in n_routed_experts (16 and 64), with the
// same top-k, expert width, tokens and no capacity limit, so both route exactly N*K token-rows
// through the same-sized SwiGLU experts. Times moe_forward + moe_backward of the layer,
// alternating the two models rep by rep (the machine is noisy; the ratio comes from one run)
// and prints the median times and their ratio. No shared expert: its constant cost would only
// hide the effect measured. The target (issue: MoE) is a ratio of at most 1.3.
//
//   bench_moe [--tokens N] [--hidden C] [--inter I] [--topk K] [--reps R] [--experts-small E1] [--experts-large E2]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/moe.h"

typedef struct Bench {
    Model m;
    Config cfg;
} Bench;

static void bench_build(Bench *b, int E, int K, int C, int I, int N) {
    char json[1024];
    int T = 256 < N ? 256 : N, B = N / T;
    snprintf(json, sizeof(json),
             "{\"attention\": \"mha\", \"vocab_size\": 256, \"hidden_size\": %d, \"num_hidden_layers\": 1,"
             " \"num_attention_heads\": 4, \"intermediate_size\": %d, \"n_routed_experts\": %d,"
             " \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"n_shared_experts\": 0,"
             " \"moe_aux_loss_coef\": 0.005, \"moe_capacity_factor\": 0, \"max_position_embeddings\": %d,"
             " \"train\": {\"seq_len\": %d, \"micro_batch\": %d}}",
             C, I, E, K, I, T, T, B);
    config_from_json(&b->cfg, json, "bench_moe", 0, NULL);
    model_build(&b->m, &b->cfg.model, backend_cpu());
    model_init_weights(&b->m, 1234);
    model_set_batch(&b->m, B, T);
    int32_t *in = xmalloc((size_t)N * sizeof(int32_t)), *tg = xmalloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) { in[i] = (i * 7919) % 256; tg[i] = (i * 104729 + 1) % 256; }
    // one full step fills h_mlp (the layer's input) and d(output) for the layer timings
    model_zero_grad(&b->m);
    model_forward(&b->m, in, tg);
    model_backward(&b->m, 1.0f);
    free(in);
    free(tg);
}

static double time_layer(Bench *b) {
    double t0 = now_seconds();
    moe_forward(&b->m, 0);
    moe_backward(&b->m, 0, 1.0f);
    return now_seconds() - t0;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

static const ArgSpec SPECS[] = {
    {"tokens", 1, "tokens routed (default 4096; a multiple of 256, or below it)", "N"},
    {"hidden", 1, "model width C (default 512)", "C"},
    {"inter", 1, "expert width I (default 512)", "I"},
    {"topk", 1, "experts per token K (default 1)", "K"},
    {"reps", 1, "timed runs of each model, alternated (default 7; the median is kept)", "R"},
    {"experts-small", 1, "routed experts of the first model (default 16)", "E1"},
    {"experts-large", 1, "routed experts of the second model (default 64)", "E2"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

static int arg_int(const Args *a, const char *name, int def) {
    const char *v = args_get(a, SPECS, N_SPECS, name);
    return v ? (int)args_int(name, v, 1, 2147483647) : def;
}

// The median of n sorted values: the middle one, or the mean of the middle two.
static double median(const double *t, int n) { return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]); }

int main(int argc, char **argv) {
    Args args;
    args_parse(&args, argc, argv, SPECS, N_SPECS,
               "usage: bench_moe [--tokens N] [--hidden C] [--inter I] [--topk K] [--reps R] [--experts-small E1] [--experts-large E2]\n"
               "Times one MoE layer's forward + backward with E1 and with E2 routed experts on the same routed work,\n"
               "alternated rep by rep, and prints the medians and their ratio (target at most 1.3).",
               NULL, NULL, 0);
    int N = arg_int(&args, "tokens", 4096), C = arg_int(&args, "hidden", 512);
    int I = arg_int(&args, "inter", 512), K = arg_int(&args, "topk", 1);
    int reps = arg_int(&args, "reps", 7);
    int E1 = arg_int(&args, "experts-small", 16), E2 = arg_int(&args, "experts-large", 64);
    if (N % (256 < N ? 256 : N)) die("--tokens must be a multiple of 256 (or below it)");
    Bench a, b;
    bench_build(&a, E1, K, C, I, N);
    bench_build(&b, E2, K, C, I, N);
    time_layer(&a);   // warm-up
    time_layer(&b);
    double *ta = xcalloc((size_t)reps, sizeof(double)), *tb = xcalloc((size_t)reps, sizeof(double));
    for (int r = 0; r < reps; r++) {
        ta[r] = time_layer(&a);
        tb[r] = time_layer(&b);
    }
    qsort(ta, (size_t)reps, sizeof(double), cmp_double);
    qsort(tb, (size_t)reps, sizeof(double), cmp_double);
    double ma = median(ta, reps), mb = median(tb, reps);
    MoeStats sa, sb;
    moe_last_stats(&a.m, &sa);
    moe_last_stats(&b.m, &sb);
    double flops = 2.0 * 3.0 * 3.0 * N * K * C * I;   // 3 matmuls, forward + 2x backward
    printf("bench_moe: one MoE layer, forward+backward, %d tokens, hidden %d, expert width %d, top-%d, no shared expert, no dropping, %d reps (median)\n",
           N, C, I, K, reps);
    printf("  %3d experts: %8.2f ms  (%.1f GFLOP/s in the experts; busiest expert %.1f%% of rows)\n", E1, ma * 1e3,
           flops / ma * 1e-9, 100.0 * sa.max_share);
    printf("  %3d experts: %8.2f ms  (%.1f GFLOP/s in the experts; busiest expert %.1f%% of rows)\n", E2, mb * 1e3,
           flops / mb * 1e-9, 100.0 * sb.max_share);
    printf("ratio %d/%d experts: %.3f (target <= 1.3: %s)\n", E2, E1, mb / ma, mb / ma <= 1.3 ? "met" : "NOT met");
    free(ta);
    free(tb);
    model_free(&a.m);
    model_free(&b.m);
    return 0;
}
