// bench_train: CPU training throughput of one config, as a fraction of the machine's own
// cblas_sgemm rate measured in the same run (docs/DESIGN.md section 8: machines are noisy, so
// only ratios measured together mean anything).
//
//   build/bench/bench_train [--config FILE] [--set key=value ...] [--steps N] [--threads N] [--json]
//
// Model FLOPs per token (forward + backward, the usual 3x of the forward):
//   6 * (activated non-embedding parameters + output head V*C)   every weight matmul
// (MoE: a token passes through num_experts_per_tok of the n_routed_experts, so the routed
// experts' parameters count k / E of them; shared experts and the router count whole)
// + 6 * L * NH * (Dqk + Dv) * (T + 1) / 2                  attention scores and P.V
// where Dqk = head_dim + qk_rope_head_dim. The attention term counts the causal half that
// is actually needed: query t attends to t+1 keys, (T+1)/2 on average; forward is
// 2 * NH * (Dqk + Dv) flops per (query, key) pair, backward twice that. PaLM's convention
// (12 * L * T * d_attn, the full square) is printed beside it. The embedding gather,
// norms, RoPE, softmax, SwiGLU and the optimizer are not counted: they are work the
// model FLOP/s rate has to absorb.
//
// Where the step goes: the backend's attention_forward and attention_backward, and its weight
// matmuls (matmul_forward, matmul_backward, MoE's moe_expert_matmul_*), are wrapped with timers
// (this program's file-level state, with their per-shape table); the matmuls' FLOPs are counted
// from their shapes, so their rate can be set against sgemm's, overall and per shape, and what
// neither takes (norms, SwiGLU, RoPE, cross-entropy, the optimizer, MoE routing) is the rest.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "bench/bench_common.h"
#include "common/args.h"
#include "common/rng.h"
#include "common/num.h"
#include "common/util.h"
#include "model/model.h"
#include "cli/device.h"
#include "train/optimizer.h"

// d_model 512, 8 layers, 8 heads of 64, SwiGLU 1408 (8/3 * 512 rounded to 64), vocab 8192,
// 4 x 512 tokens per step: a few seconds a step on 2 cores, well under 1 GiB.
static const char *DEFAULT_CONFIG =
    "{\"attention\": \"mha\", \"vocab_size\": 8192, \"hidden_size\": 512, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 8, \"intermediate_size\": 1408, \"max_position_embeddings\": 2048,"
    " \"tie_word_embeddings\": false,"
    " \"train\": {\"seq_len\": 512, \"micro_batch\": 4, \"seed\": 1}}";

static const ArgSpec SPECS[] = {
    {"config", 1, "config JSON (default: the built-in d512 x 8 layers, seq 512, vocab 8192)", "FILE"},
    {"set", 1, "override a key, as in clla train (repeatable)", "KEY=VALUE"},
    {"steps", 1, "timed training steps after one warm-up step (default 5)", "N"},
    {"threads", 1, "OpenMP/OpenBLAS threads (default: OMP_NUM_THREADS or all cores)", "N"},
    {"json", 0, "also print one JSON object with every number", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

typedef struct GemmShape { const char *what; int M, N, K; } GemmShape;

// ---- the attention op and the weight matmuls, timed: a copy of the backend whose entries add
// their wall time (and the matmuls their FLOPs) to these before calling the real ones
static const Backend *inner_backend;
static double attention_seconds, matmul_seconds, matmul_flops;

// the same totals by call shape, to say which products lag sgemm (printed after the steps)
typedef struct ShapeTime { const char *op; int N, C, OC; double seconds, flops; } ShapeTime;
enum { MAX_SHAPES = 64 };
static ShapeTime shape_times[MAX_SHAPES];
static int n_shape_times;

static void matmul_done(double t0, double flops, const char *op, int N, int C, int OC) {
    const double dt = now_seconds() - t0;
    matmul_seconds += dt;
    matmul_flops += flops;
    int i = 0;
    while (i < n_shape_times && !(shape_times[i].op == op && shape_times[i].N == N && shape_times[i].C == C &&
                                  shape_times[i].OC == OC))
        i++;
    if (i == MAX_SHAPES) return;   // more shapes than any model here has: left out of the table
    if (i == n_shape_times) shape_times[n_shape_times++] = (ShapeTime){op, N, C, OC, 0.0, 0.0};
    shape_times[i].seconds += dt;
    shape_times[i].flops += flops;
}

static void timed_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    double t0 = now_seconds();
    inner_backend->matmul_forward(out, inp, weight, N, C, OC);
    matmul_done(t0, 2.0 * N * C * OC, "forward", N, C, OC);
}

// a projection added to the residual stream: a weight matmul (its add counted in its time)
static void timed_matmul_residual_forward(float *out, const float *residual, const float *inp, const float *weight, int N,
                                          int C, int OC) {
    double t0 = now_seconds();
    inner_backend->matmul_residual_forward(out, residual, inp, weight, N, C, OC);
    matmul_done(t0, 2.0 * N * C * OC, "forward + residual", N, C, OC);
}

static void timed_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                                  int N, int C, int OC) {
    double t0 = now_seconds();
    inner_backend->matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC);
    matmul_done(t0, 2.0 * N * C * OC * ((dinp != NULL) + (dweight != NULL)), dinp ? "backward" : "backward dW only", N,
                C, OC);
}

// MoE's grouped expert products count as weight matmuls too (their rows: the offsets, host
// memory on the CPU backends this bench runs)
static void timed_expert_forward(float *out, const float *inp, const float *const *weights, const int *expert_off, int E,
                                 int R, int C, int OC) {
    double t0 = now_seconds();
    inner_backend->moe_expert_matmul_forward(out, inp, weights, expert_off, E, R, C, OC);
    matmul_done(t0, 2.0 * (expert_off[E] - expert_off[0]) * C * OC, "experts forward", -1, C, OC);
}

static void timed_expert_backward(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                  const float *const *weights, const int *expert_off, int E, int R, int C, int OC) {
    double t0 = now_seconds();
    inner_backend->moe_expert_matmul_backward(dinp, dweights, dout, inp, weights, expert_off, E, R, C, OC);
    matmul_done(t0, 2.0 * (expert_off[E] - expert_off[0]) * C * OC * ((dinp != NULL) + (dweights != NULL)),
                dinp ? "experts backward" : "experts backward dW only", -1, C, OC);
}

static void timed_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                    int T, int NH, int NKV, int DQK, int DV, float scale) {
    double t0 = now_seconds();
    inner_backend->attention_forward(out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
    attention_seconds += now_seconds() - t0;
}

static void timed_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                     const float *out, const float *lse, const float *q, const float *k,
                                     const float *v, int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    double t0 = now_seconds();
    inner_backend->attention_backward(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
    attention_seconds += now_seconds() - t0;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// The best rate over the model's shapes; prints each when verbose.
static double measure_sgemm(const GemmShape *shapes, int n, int verbose) {
    double best = 0;
    for (int i = 0; i < n; i++) {
        double r = bench_sgemm_rate(shapes[i].M, shapes[i].N, shapes[i].K, 3);
        if (verbose)
            printf("sgemm %-52s M=%d N=%d K=%d: %7.1f GFLOP/s\n", shapes[i].what, shapes[i].M, shapes[i].N, shapes[i].K, r / 1e9);
        if (r > best) best = r;
    }
    return best;
}

int main(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: bench_train [--config FILE] [--set key=value ...] [--steps N] [--threads N] [--json]\n"
               "Measures cblas_sgemm FLOP/s on the model's matmul shapes, then CPU training steps\n"
               "(forward + backward + AdamW) on random tokens; prints tokens/s, model FLOP/s and their ratio.",
               NULL, NULL, 0);
    const char *steps_s = args_get(&a, SPECS, N_SPECS, "steps"), *thr_s = args_get(&a, SPECS, N_SPECS, "threads");
    int steps = steps_s ? (int)opt_i64("--steps", steps_s, 1, 1000000) : 5;
    if (thr_s) {
        int th = (int)opt_i64("--threads", thr_s, 1, CLLA_MAX_THREADS);
        omp_set_num_threads(th);
        openblas_set_num_threads(th);
    }
    Config cfg;
    const char *path = args_get(&a, SPECS, N_SPECS, "config");
    if (path) config_load(&cfg, path, a.n_sets, a.sets);
    else config_from_json(&cfg, DEFAULT_CONFIG, "built-in bench config", a.n_sets, a.sets);
    const ModelConfig *c = &cfg.model;
    const TrainConfig *tc = &cfg.train;
    int B = tc->micro_batch, T = tc->seq_len, N = B * T;
    int L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size, NH = c->num_attention_heads;
    int Dqk = c->head_dim + c->qk_rope_head_dim, Dv = c->v_head_dim;
    int FF = c->intermediate_size > 0 ? c->intermediate_size : c->moe_intermediate_size;

    // ---- the machine's sgemm rate, on the shapes this model multiplies
    GemmShape shapes[] = {
        {"tokens x d_model x d_model (attention projections)", N, C, C},
        {"tokens x d_ff x d_model (MLP up)", N, FF, C},
        {"tokens x d_model x d_ff (MLP down)", N, C, FF},
        {"tokens x vocab x d_model (output head)", N, V, C},
    };
    int n_shapes = (int)(sizeof(shapes) / sizeof(shapes[0]));
    printf("bench_train: %d threads | config %s\n", omp_get_max_threads(), path ? path : "(built-in)");
    // Other processes on the cores turn the ratio into noise (OpenMP barriers wait for
    // descheduled threads): say so rather than print a number that looks meaningful.
    double load[1];
    if (getloadavg(load, 1) == 1 && load[0] > 0.5)
        printf("warning: load average %.2f before the run: other processes share the cores, expect noisy numbers\n", load[0]);
    // measured before and again after the training steps, best of both: a burst of noise on
    // a shared machine then lowers neither the rate nor (falsely) raises the ratio
    double sgemm_best = measure_sgemm(shapes, n_shapes, 1);
    // ---- the model
    Model model;
    inner_backend = device_backend("cpu");
    Backend timed = *inner_backend;
    timed.attention_forward = timed_attention_forward;
    timed.attention_backward = timed_attention_backward;
    timed.matmul_forward = timed_matmul_forward;
    timed.matmul_residual_forward = timed_matmul_residual_forward;
    timed.matmul_backward = timed_matmul_backward;
    if (inner_backend->moe_expert_matmul_forward) timed.moe_expert_matmul_forward = timed_expert_forward;
    if (inner_backend->moe_expert_matmul_backward) timed.moe_expert_matmul_backward = timed_expert_backward;
    model_build(&model, c, &timed);
    model_init_weights(&model, tc->seed);
    model_set_batch(&model, B, T);
    AdamW opt;
    adamw_init(&opt, &model);
    long long total = model_num_params(&model), embed = 0, head_untied = 0, routed = 0;
    for (int i = 0; i < model.params.n; i++) {
        const char *name = model.params.t[i].name;
        if (!strcmp(name, "model.embed_tokens.weight")) embed = (long long)model.params.t[i].numel;
        if (!strcmp(name, "lm_head.weight")) head_untied = (long long)model.params.t[i].numel;
        if (strstr(name, ".mlp.experts.")) routed += (long long)model.params.t[i].numel;
    }
    long long non_embedding = total - embed - head_untied, head = (long long)V * C;
    long long activated = non_embedding;
    if (c->n_routed_experts > 0)
        activated = non_embedding - routed + routed / c->n_routed_experts * c->num_experts_per_tok;
    double attn_causal = 6.0 * L * NH * (double)(Dqk + Dv) * (T + 1) / 2.0;
    double attn_palm = 12.0 * L * T * (double)NH * (Dqk + Dv) / 2.0;
    double flops_per_token = 6.0 * (double)(activated + head) + attn_causal;
    printf("model %s: L=%d C=%d NH=%d Dqk=%d Dv=%d FF=%d V=%d | B=%d T=%d (%d tokens/step)\n",
           c->attention, L, C, NH, Dqk, Dv, FF, V, B, T, N);
    printf("params %lld total | %lld non-embedding | %lld activated per token | output head %lld\n", total,
           non_embedding, activated, head);
    printf("FLOPs/token = 6*(%lld + %lld) + attention %.3g (causal; PaLM's full-square count: %.3g) = %.4g\n",
           activated, head, attn_causal, attn_palm, flops_per_token);

    // ---- training steps on random tokens (the trainer's loop body, minus data loading)
    int32_t *in = xmalloc((size_t)N * sizeof(int32_t)), *tg = xmalloc((size_t)N * sizeof(int32_t));
    Rng rng;
    rng_seed(&rng, tc->seed);
    double t_fwd = 0, t_bwd = 0, t_opt = 0, t_total = 0, t_attn = 0, t_mm = 0, f_mm = 0;
    double *step_s = xmalloc((size_t)steps * sizeof(double));
    float loss = 0;
    for (int s = 0; s < steps + 1; s++) {
        for (int i = 0; i < N; i++) {
            in[i] = (int32_t)(rng_next(&rng) % (uint64_t)V);
            tg[i] = (int32_t)(rng_next(&rng) % (uint64_t)V);
        }
        double t0 = now_seconds(), attn0 = attention_seconds, mm0 = matmul_seconds, mmf0 = matmul_flops;
        model_zero_grad(&model);
        loss = model_forward(&model, in, tg);
        double t1 = now_seconds();
        model_backward(&model, 1.0f);
        double t2 = now_seconds();
        double norm = grad_global_norm(&model);
        adamw_step(&opt, &model, tc, tc->lr, clip_scale(norm, tc->grad_clip));
        double t3 = now_seconds();
        printf("step %d%s: %.3f s (forward %.3f, backward %.3f, optimizer %.3f) loss %.4f\n", s,
               s == 0 ? " (warm-up, not counted)" : "", t3 - t0, t1 - t0, t2 - t1, t3 - t2, loss);
        if (s == 0) {
            n_shape_times = 0;   // the per-shape table counts the timed steps only
            continue;
        }
        t_fwd += t1 - t0; t_bwd += t2 - t1; t_opt += t3 - t2; t_total += t3 - t0;
        t_attn += attention_seconds - attn0;
        t_mm += matmul_seconds - mm0;
        f_mm += matmul_flops - mmf0;
        step_s[s - 1] = t3 - t0;
    }
    double sgemm_after = measure_sgemm(shapes, n_shapes, 0);
    if (sgemm_after > sgemm_best) sgemm_best = sgemm_after;
    // the median step is the headline: a shared machine's bursts of noise move the mean
    qsort(step_s, (size_t)steps, sizeof(double), cmp_double);
    double median = steps % 2 ? step_s[steps / 2] : 0.5 * (step_s[steps / 2 - 1] + step_s[steps / 2]);
    double tok_s = (double)N / median, tok_s_mean = (double)N * steps / t_total, tok_s_best = (double)N / step_s[0];
    double model_flops = tok_s * flops_per_token;
    double ratio = model_flops / sgemm_best;
    printf("\ntraining: %.1f tokens/s (median of %d steps; mean %.1f, best %.1f)\n", tok_s, steps, tok_s_mean, tok_s_best);
    printf("time split: forward %.1f%% | backward %.1f%% | optimizer %.1f%% | attention op (forward + backward) %.1f%%\n",
           100 * t_fwd / t_total, 100 * t_bwd / t_total, 100 * t_opt / t_total, 100 * t_attn / t_total);
    printf("sgemm %.1f GFLOP/s (best of the shapes above, measured before and after the steps)\n", sgemm_best / 1e9);
    // the gap to sgemm, by where the time goes (attention at its counted causal FLOPs)
    const double attn_flops = (double)N * attn_causal * steps;
    printf("weight matmuls %.1f%% of the step at %.1f GFLOP/s (%.3f of sgemm) | attention %.1f%% at %.1f GFLOP/s (%.3f) | "
           "the rest %.1f%%\n", 100 * t_mm / t_total, t_mm > 0 ? f_mm / t_mm / 1e9 : 0.0,
           t_mm > 0 ? f_mm / t_mm / sgemm_best : 0.0, 100 * t_attn / t_total, t_attn > 0 ? attn_flops / t_attn / 1e9 : 0.0,
           t_attn > 0 ? attn_flops / t_attn / sgemm_best : 0.0, 100 * (t_total - t_mm - t_attn) / t_total);
    for (int i = 0; i < n_shape_times; i++) {
        const ShapeTime *st = &shape_times[i];
        if (st->seconds <= 0) continue;   // too fast for the clock: no rate to show
        char rows[32];
        if (st->N < 0) snprintf(rows, sizeof(rows), "routed rows");
        else snprintf(rows, sizeof(rows), "N=%d", st->N);
        printf("  %-24s %-11s C=%-5d OC=%-5d %5.1f%% of the step at %6.1f GFLOP/s (%.3f of sgemm)\n", st->op, rows,
               st->C, st->OC, 100 * st->seconds / t_total, st->flops / st->seconds / 1e9,
               st->flops / st->seconds / sgemm_best);
    }
    printf("model FLOP/s %.1f GFLOP/s | ratio to sgemm %.3f (target >= 0.8) | mean step %.3f, best step %.3f\n",
           model_flops / 1e9, ratio, tok_s_mean * flops_per_token / sgemm_best, tok_s_best * flops_per_token / sgemm_best);
    if (args_get(&a, SPECS, N_SPECS, "json"))
        printf("{\"threads\":%d,\"tokens_per_step\":%d,\"steps\":%d,\"tokens_per_s\":%.2f,\"flops_per_token\":%.6g,"
               "\"model_flops\":%.6g,\"sgemm_flops\":%.6g,\"ratio\":%.4f,\"forward_s\":%.4f,\"backward_s\":%.4f,\"optimizer_s\":%.4f,\"attention_s\":%.4f,\"attention_share\":%.4f,"
               "\"matmul_s\":%.4f,\"matmul_share\":%.4f,\"matmul_flops_per_s\":%.6g,\"activated_params\":%lld}\n",
               omp_get_max_threads(), N, steps, tok_s, flops_per_token, model_flops, sgemm_best, ratio,
               t_fwd / steps, t_bwd / steps, t_opt / steps, t_attn / steps, t_attn / t_total, t_mm / steps, t_mm / t_total,
               t_mm > 0 ? f_mm / t_mm : 0.0, activated);

    free(in); free(tg); free(step_s);
    adamw_free(&opt, &model);
    model_free(&model);
    return 0;
}
