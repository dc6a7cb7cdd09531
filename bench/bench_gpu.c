// bench_gpu: training throughput on one GPU (the CUDA backend), as tokens/s and model FLOP/s
// against the GPU's dense bf16 tensor-core peak, for
//   1. a dense ~1B model (bench/dense_1b.json, the model bench/bench_torch_gpu.py builds), and
//   2. the largest paper MoE config one GPU holds: a configs/paper preset (default clla.json,
//      10.9B parameters, 18 bytes each for training) with num_hidden_layers lowered to the
//      most layers whose training memory fits the GPU's free memory; widths, experts and
//      routing as in the paper.
// Run from the repository root (the config paths are relative to it):
//   build/bench/bench_gpu [--dense FILE] [--moe FILE] [--steps N] [--seq T] [--batch B] [--peak-tflops X]
//                         [--only dense|moe|experts] [--json]
// --only experts: instead of training, the MoE config's grouped expert matmuls alone, timed both
// ways the CUDA backend has (per-expert cuBLASLt products; the grouped kernels) in one process.
// Without a CUDA device (or a build without the CUDA backend) it prints "skipped: no CUDA
// device (<reason>)" and exits 0. --json: one JSON object per line instead of text (the
// device, each model's result, each skip), read by bench/bench_gpu_compare.sh.
//
// Weights from model_init_weights (its transforms run on every core: tens of seconds for the MoE
// config's billions of values). Progress notes are flushed as they happen, so a run stopped by a
// timeout shows where it was.
// A step is forward + backward + global-norm clip + AdamW + the bf16 weight store, on random
// tokens (uniform over the vocabulary: MoE routing of random tokens is close to balanced).
// Two warm-up steps, then --steps timed steps (default 10), synchronized at both ends; then two
// steps with per-op CUDA-event timing (kernels/backend_cuda.h), the GPU time per op per step.
//
// Model FLOPs per token, the convention of bench/bench_train.c:
//   6 * (activated non-embedding parameters + output head V*C)   every weight matmul
// + 6 * L * NH * (Dqk + Dv) * (T + 1) / 2                        causal attention
// activated: with MoE, the router, the shared experts and K of the E routed experts per layer.
// The fraction is model FLOP/s over the peak in the table below (dense bf16, no sparsity,
// from NVIDIA's data sheets); --peak-tflops overrides it for a GPU the table lacks.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/rng.h"
#include "common/num.h"
#include "common/util.h"
#include "model/model.h"
#include "model/moe.h"
#include "train/optimizer.h"

#ifdef CLLA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bench/random_routing.h"
#include "kernels/backend_cuda.h"
#endif

static const ArgSpec SPECS[] = {
    {"dense", 1, "dense model config (default bench/dense_1b.json)", "FILE"},
    {"moe", 1, "MoE paper config whose layers are reduced to fit (default configs/paper/clla.json)", "FILE"},
    {"steps", 1, "timed steps per model (default 10)", "N"},
    {"seq", 1, "sequence length for both models (default: each config's train.seq_len)", "T"},
    {"peak-tflops", 1, "dense bf16 peak of this GPU in TFLOP/s (default: from the built-in table)", "TFLOPS"},
    {"only", 1, "dense or moe: run one of the two; experts: the MoE config's grouped expert matmuls alone, both ways",
     "dense|moe|experts"},
    {"set", 1, "override a key of both configs, e.g. train.micro_batch=2 (repeatable)", "KEY=VALUE"},
    {"batch", 1, "dense model: this micro-batch instead of the config's, halved only if it does not fit", "B"},
    {"json", 0, "print one JSON object per line (device, results, skips) instead of text", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// One line of output: the text, or with --json an object {"bench": "bench_gpu", <key>: <text>}.
static void say(int json, const char *key, const char *text) {
    if (!json) {
        const int tagged = !strcmp(key, "skipped") || !strcmp(key, "warning");
        printf("%s%s%s\n", tagged ? key : "", tagged ? ": " : "", text);
        fflush(stdout);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "bench", "bench_gpu");
    cJSON_AddStringToObject(o, key, text);
    char *s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
    fflush(stdout);   // a run stopped by a timeout still shows how far it got
}

#ifdef CLLA_HAVE_CUDA

// Dense bf16 tensor-core peaks (TFLOP/s, without sparsity). Matched by substring of the
// device name, the more specific names first; then by compute capability.
typedef struct Peak { const char *name; double tflops; } Peak;
static const Peak PEAKS[] = {
    {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4}, {"H200", 989.4}, {"GH200", 989.4},
    {"A100", 312.0}, {"A800", 312.0}, {"L40S", 362.0}, {"L4", 121.0}, {"A10", 125.0},
};

static double peak_tflops(const struct cudaDeviceProp *p, const char **how) {
    for (size_t i = 0; i < sizeof PEAKS / sizeof PEAKS[0]; i++)
        if (strstr(p->name, PEAKS[i].name)) { *how = "device name"; return PEAKS[i].tflops; }
    *how = "compute capability";
    if (p->major == 9 && p->minor == 0) return 989.4;   // H100 SXM class
    if (p->major == 8 && p->minor == 0) return 312.0;   // A100 class
    *how = "unknown";
    return 0.0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Training memory of cfg at (B, T) with bf16 storage: weights, fp32 masters, gradients and
// AdamW moments, activations and their gradients, and 256 MiB for cuBLASLt, the dinp chunk and
// the other scratch (attention keeps no T x T buffer).
static double train_bytes(const ModelConfig *c, int B, int T) {
    Model m;
    model_build_table(&m, c, 2);
    double b = (double)m.params.bytes_store + 4.0 * (double)m.params.bytes_f32;
    model_layout_acts(&m, B, T, 2);
    b += (double)m.acts.bytes_store + (double)m.gacts.bytes_store;
    b += 256.0 * 1024 * 1024;
    model_free(&m);
    return b;
}

static double flops_per_token(const Model *m, int T) {
    const ModelConfig *c = &m->cfg;
    long long embedding = 0;
    for (int i = 0; i < m->params.n; i++)
        if (!strcmp(m->params.t[i].name, "model.embed_tokens.weight") || !strcmp(m->params.t[i].name, "lm_head.weight"))
            embedding += (long long)m->params.t[i].numel;
    const long long activated = model_num_params(m) - embedding - moe_inactive_params(m);
    const double head = (double)c->vocab_size * c->hidden_size;
    const double attn = 6.0 * c->num_hidden_layers * c->num_attention_heads *
                        (double)(c->head_dim + c->qk_rope_head_dim + c->v_head_dim) * (T + 1) / 2.0;
    return 6.0 * ((double)activated + head) + attn;
}

static void run(const char *label, const char *path, const Config *cfg, int B, int T, int steps, double peak, int json) {
    Model m;
    char line[256];
    const double t_build = now_s();
    model_build(&m, &cfg->model, backend_cuda());
    model_init_weights(&m, cfg->train.seed);
    snprintf(line, sizeof line, "%s: %lld parameters built and initialized in %.1f s; %d warm-up and %d timed steps next",
             label, model_num_params(&m), now_s() - t_build, 2, steps);
    say(json, "note", line);
    model_set_batch(&m, B, T);
    AdamW opt;
    adamw_init(&opt, &m);
    const int N = B * T, V = cfg->model.vocab_size;
    int32_t *in = xmalloc((size_t)N * sizeof(int32_t)), *tg = xmalloc((size_t)N * sizeof(int32_t));
    Rng r;
    rng_seed(&r, 1);
    const TrainConfig *tc = &cfg->train;
    double t0 = 0;
    float loss = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) {
            cudaDeviceSynchronize();
            t0 = now_s();
        }
        for (int i = 0; i < N; i++) {
            in[i] = (int32_t)(rng_next(&r) % (unsigned)V);
            tg[i] = (int32_t)(rng_next(&r) % (unsigned)V);
        }
        model_zero_grad(&m);
        loss = model_forward(&m, in, tg);
        model_backward(&m, 1.0f);
        adamw_step(&opt, &m, tc, tc->lr, clip_scale(grad_global_norm(&m), tc->grad_clip));
    }
    cudaDeviceSynchronize();
    const double dt = now_s() - t0;
    // Per-op GPU time: two more steps with an event after every op (kernels/backend_cuda.h),
    // apart from the timed steps above, whose throughput the events would lower.
    enum { PROFILE_STEPS = 2, TOP_OPS = 64 };
    cuda_timing_enable(1);
    for (int s = 0; s < PROFILE_STEPS; s++) {
        model_zero_grad(&m);
        model_forward(&m, in, tg);
        model_backward(&m, 1.0f);
        adamw_step(&opt, &m, tc, tc->lr, clip_scale(grad_global_norm(&m), tc->grad_clip));
    }
    CudaOpTime ops[TOP_OPS];
    const int n_ops = cuda_timing_take(ops, TOP_OPS), shown = n_ops < TOP_OPS ? n_ops : TOP_OPS;
    cuda_timing_enable(0);
    double op_ms = 0.0;
    for (int i = 0; i < shown; i++) op_ms += ops[i].ms;
    const double tok_s = (double)N * steps / dt, fpt = flops_per_token(&m, T), fl = tok_s * fpt;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "bench", "bench_gpu");
        cJSON_AddStringToObject(o, "model", label);
        cJSON_AddStringToObject(o, "config", path);
        cJSON_AddNumberToObject(o, "params", (double)model_num_params(&m));
        cJSON_AddNumberToObject(o, "layers", cfg->model.num_hidden_layers);
        cJSON_AddNumberToObject(o, "B", B);
        cJSON_AddNumberToObject(o, "T", T);
        cJSON_AddNumberToObject(o, "steps", steps);
        cJSON_AddNumberToObject(o, "s_per_step", dt / steps);
        cJSON_AddNumberToObject(o, "tokens_per_s", tok_s);
        cJSON_AddNumberToObject(o, "flops_per_token", fpt);
        cJSON_AddNumberToObject(o, "model_tflops", fl * 1e-12);
        if (peak > 0) cJSON_AddNumberToObject(o, "fraction_of_peak", fl / (peak * 1e12));
        cJSON_AddNumberToObject(o, "last_loss", loss);
        cJSON *arr = cJSON_AddArrayToObject(o, "op_ms_per_step");
        for (int i = 0; i < shown; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "op", ops[i].op);
            cJSON_AddNumberToObject(e, "ms", ops[i].ms / PROFILE_STEPS);
            cJSON_AddNumberToObject(e, "marks", (double)ops[i].marks / PROFILE_STEPS);
            cJSON_AddNumberToObject(e, "share", op_ms > 0 ? ops[i].ms / op_ms : 0.0);
            cJSON_AddItemToArray(arr, e);
        }
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
    } else {
        printf("%-6s %lld params (%d layers) | B=%d T=%d | %.3f s/step | %.0f tokens/s | %.4g FLOPs/token | "
               "model %.1f TFLOP/s",
               label, model_num_params(&m), cfg->model.num_hidden_layers, B, T, dt / steps, tok_s, fpt, fl * 1e-12);
        if (peak > 0) printf(" = %.1f%% of bf16 peak", 100.0 * fl / (peak * 1e12));
        printf(" | last loss %.3f\n", loss);
        printf("  GPU time per step by op (CUDA events, %d profiled steps; %.1f ms in all):\n", PROFILE_STEPS,
               op_ms / PROFILE_STEPS);
        for (int i = 0; i < shown && i < 20; i++)
            printf("  %8.2f ms %5.1f%%  %6.0f marks  %s\n", ops[i].ms / PROFILE_STEPS,
                   op_ms > 0 ? 100.0 * ops[i].ms / op_ms : 0.0, (double)ops[i].marks / PROFILE_STEPS, ops[i].op);
    }
    fflush(stdout);
    free(in);
    free(tg);
    adamw_free(&opt, &m);
    model_free(&m);
}

// --only experts: the MoE config's grouped expert matmuls alone, both ways the CUDA backend has
// (one cuBLASLt product per expert; the tensor-core grouped kernels, the default) on the
// same rows and weights, in one process: T tokens routed top-K to distinct experts uniformly at
// random, then per iteration what model/moe.c runs per layer: forward gate|up (C -> 2I) and down
// (I -> C), backward of down and of gate|up with dinp and dW. Prints each way's time, TFLOP/s,
// their ratio and how far apart their forward outputs are.
static void run_experts(const ModelConfig *c, int T, int steps, int json) {
    const Backend *be = backend_cuda();
    const int E = c->n_routed_experts, K = c->num_experts_per_tok, C = c->hidden_size, I = c->moe_intermediate_size;
    if ((long long)T * K > 2147483647LL) die("experts: %d tokens x top-%d rows exceed an int", T, K);
    const int R = T * K;
    int *off = xcalloc((size_t)E + 1, sizeof(int)), min_rows, max_rows;
    Rng rng;
    rng_seed(&rng, 7);
    random_routing_offsets(off, T, E, K, &rng, &min_rows, &max_rows);
    int *d_off = be->alloc(((size_t)E + 1) * sizeof(int));
    be->upload(d_off, off, ((size_t)E + 1) * sizeof(int));
    // row buffers (bf16) and weights (bf16, one allocation per projection), fp32 weight gradients
    const size_t nwg = (size_t)2 * I * C, nwd = (size_t)C * I;
    float *xs = be->alloc((size_t)R * C * 2), *gu = be->alloc((size_t)R * 2 * I * 2), *act = be->alloc((size_t)R * I * 2);
    float *out = be->alloc((size_t)R * C * 2), *dxs = be->alloc((size_t)R * C * 2), *dgu = be->alloc((size_t)R * 2 * I * 2);
    float *dact = be->alloc((size_t)R * I * 2), *wg = be->alloc(E * nwg * 2), *wd = be->alloc(E * nwd * 2);
    float *dwg = be->alloc(E * nwg * 4), *dwd = be->alloc(E * nwd * 4);
    const size_t most = E * nwg > (size_t)R * 2 * I ? E * nwg : (size_t)R * 2 * I;
    float *h = xmalloc(most * sizeof(float));
    float *fill[] = {xs, gu, act, out, wg, wd};
    const size_t sizes[] = {(size_t)R * C, (size_t)R * 2 * I, (size_t)R * I, (size_t)R * C, E * nwg, E * nwd};
    for (int b = 0; b < 6; b++) {
        for (size_t i = 0; i < sizes[b]; i++) h[i] = (float)(rng_uniform_of(rng_next(&rng)) - 0.5) * (b >= 4 ? 0.05f : 1.0f);
        be->act_from_host(fill[b], h, sizes[b]);
    }
    const float **pg = xmalloc((size_t)E * sizeof(float *)), **pd = xmalloc((size_t)E * sizeof(float *));
    float **pdg = xmalloc((size_t)E * sizeof(float *)), **pdd = xmalloc((size_t)E * sizeof(float *));
    for (int e = 0; e < E; e++) {   // bf16 elements: 2 bytes each
        pg[e] = (const float *)((const char *)wg + (size_t)e * nwg * 2);
        pd[e] = (const float *)((const char *)wd + (size_t)e * nwd * 2);
        pdg[e] = dwg + (size_t)e * nwg;
        pdd[e] = dwd + (size_t)e * nwd;
    }
    const double flops = 18.0 * R * (double)C * I;   // 3 products (gate|up counts twice) x forward + 2 backward
    double ms[2];
    float *fwd[2] = {xmalloc((size_t)R * 2 * I * sizeof(float)), xmalloc((size_t)R * 2 * I * sizeof(float))};
    for (int way = 0; way < 2; way++) {
        cuda_moe_use_grouped(way);
        double t0 = 0.0;
        for (int it = 0; it < steps + 2; it++) {
            if (it == 2) { cudaDeviceSynchronize(); t0 = now_s(); }
            be->moe_expert_matmul_forward(gu, xs, pg, d_off, E, R, C, 2 * I);
            be->moe_expert_matmul_forward(out, act, pd, d_off, E, R, I, C);
            be->moe_expert_matmul_backward(dact, pdd, out, act, pd, d_off, E, R, I, C);
            be->moe_expert_matmul_backward(dxs, pdg, dgu, xs, pg, d_off, E, R, C, 2 * I);
        }
        cudaDeviceSynchronize();
        ms[way] = 1e3 * (now_s() - t0) / steps;
        be->moe_expert_matmul_forward(gu, xs, pg, d_off, E, R, C, 2 * I);
        be->act_to_host(fwd[way], gu, (size_t)R * 2 * I);
    }
    cuda_moe_use_grouped(-1);
    double diff = 0.0, big = 0.0;
    for (size_t i = 0; i < (size_t)R * 2 * I; i++) {
        const double d = fabs((double)fwd[0][i] - fwd[1][i]), v = fabs((double)fwd[0][i]);
        diff = d > diff ? d : diff;
        big = v > big ? v : big;
    }
    char line[512];
    snprintf(line, sizeof line,
             "experts: E=%d top-%d C=%d I=%d, %d rows (%d to %d an expert): per expert %.3f ms (%.1f TFLOP/s), grouped "
             "kernels %.3f ms (%.1f TFLOP/s), grouped / per expert time %.3f; forward outputs differ by at most %.2g of "
             "their largest",
             E, K, C, I, R, min_rows, max_rows, ms[0], flops / ms[0] * 1e-9, ms[1], flops / ms[1] * 1e-9,
             ms[1] / ms[0], big > 0 ? diff / big : diff);
    say(json, "experts", line);
    float *bufs[] = {xs, gu, act, out, dxs, dgu, dact, wg, wd, dwg, dwd};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++) be->release(bufs[b]);
    be->release(d_off);
    free(off); free(h); free(pg); free(pd); free(pdg); free(pdd); free(fwd[0]); free(fwd[1]);
}

#endif

int main(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: bench_gpu [--dense FILE] [--moe FILE] [--steps N] [--seq T] [--batch B] [--peak-tflops X]\n"
               "                 [--only dense|moe|experts] [--json]\n"
               "GPU training throughput (tokens/s, model FLOP/s, fraction of the bf16 peak) of a dense ~1B model\n"
               "and of the largest paper MoE config (fewer layers) that fits the GPU. Run from the repository root.",
               NULL, NULL, 0);
    const int json = args_get(&a, SPECS, N_SPECS, "json") != NULL;
    // the options first: a mistyped one is refused on a machine without a GPU (or CUDA) too
    const char *steps_s = args_get(&a, SPECS, N_SPECS, "steps"), *seq_s = args_get(&a, SPECS, N_SPECS, "seq");
    const char *peak_s = args_get(&a, SPECS, N_SPECS, "peak-tflops"), *only = args_get(&a, SPECS, N_SPECS, "only");
    const char *batch_s = args_get(&a, SPECS, N_SPECS, "batch");
    const int steps = steps_s ? (int)opt_i64("--steps", steps_s, 1, 1000000) : 10;
    const int seq = seq_s ? (int)opt_i64("--seq", seq_s, 1, 2147483647) : 0, batch = batch_s ? (int)opt_i64("--batch", batch_s, 1, 2147483647) : 0;
    if (steps < 1) die("--steps must be a positive integer");
    if (batch_s && batch < 1) die("--batch must be a positive integer");
    if (seq_s && seq < 1) die("--seq must be a positive integer");
    const double peak_opt = peak_s ? opt_f64("--peak-tflops", peak_s, 1e-3, 1e9) : 0;   // checked with or without a GPU
    if (only && strcmp(only, "dense") && strcmp(only, "moe") && strcmp(only, "experts"))
        die("--only %s: use dense, moe or experts", only);
    // the configs too: a missing or bad one is refused before the device is asked for
    {
        Config probe;
        const char *dp = args_get(&a, SPECS, N_SPECS, "dense"), *mp = args_get(&a, SPECS, N_SPECS, "moe");
        if (!only || !strcmp(only, "dense")) config_load(&probe, dp ? dp : "bench/dense_1b.json", a.n_sets, a.sets);
        if (!only || strcmp(only, "dense")) config_load(&probe, mp ? mp : "configs/paper/clla.json", a.n_sets, a.sets);
    }
#ifndef CLLA_HAVE_CUDA
    (void)peak_opt;
    say(json, "skipped", "no CUDA device (this build has no CUDA backend: configure with -DCLLA_CUDA=ON)");
    return 0;
#else
    char reason[256], line[768];
    if (!cuda_device_available(reason, sizeof reason)) {
        snprintf(line, sizeof line, "no CUDA device (%s)", reason);
        say(json, "skipped", line);
        return 0;
    }

    int dev = 0;
    struct cudaDeviceProp prop;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    const char *how = "--peak-tflops";
    const double peak = peak_s ? peak_opt : peak_tflops(&prop, &how);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    snprintf(line, sizeof line, "%s (sm_%d%d, %.1f GiB, %.1f GiB free) | bf16 peak %.1f TFLOP/s (%s)", prop.name,
             prop.major, prop.minor, total_b / 1073741824.0, free_b / 1073741824.0, peak, how);
    if (json) say(json, "device", line);
    else printf("bench_gpu: %s\n", line);
    if (peak <= 0) say(json, "warning", "no peak known for this GPU: pass --peak-tflops to get the fraction");
    const double budget = 0.9 * (double)free_b;

    if (!only || !strcmp(only, "dense")) {
        Config cfg;
        const char *path = args_get(&a, SPECS, N_SPECS, "dense");
        config_load(&cfg, path ? path : "bench/dense_1b.json", a.n_sets, a.sets);
        const int T = seq ? seq : cfg.train.seq_len;
        int B = batch ? batch : cfg.train.micro_batch;
        while (B > 1 && train_bytes(&cfg.model, B, T) > budget) B /= 2;   // halve the batch until it fits
        if (train_bytes(&cfg.model, B, T) > budget) {
            snprintf(line, sizeof line, "dense: %.1f GiB needed at B=1 T=%d, more than 90%% of the free memory",
                     train_bytes(&cfg.model, B, T) / 1073741824.0, T);
            say(json, "skipped", line);
        } else {
            run("dense", path ? path : "bench/dense_1b.json", &cfg, B, T, steps, peak, json);
        }
    }
    if (only && !strcmp(only, "experts")) {
        Config cfg;
        const char *path = args_get(&a, SPECS, N_SPECS, "moe");
        config_load(&cfg, path ? path : "configs/paper/clla.json", a.n_sets, a.sets);
        if (cfg.model.n_routed_experts <= 0) die("--moe %s is not an MoE config", path ? path : "");
        run_experts(&cfg.model, seq ? seq : cfg.train.seq_len, steps, json);
    }
    if (!only || !strcmp(only, "moe")) {
        Config cfg;
        const char *path = args_get(&a, SPECS, N_SPECS, "moe");
        config_load(&cfg, path ? path : "configs/paper/clla.json", a.n_sets, a.sets);
        if (cfg.model.n_routed_experts <= 0) die("--moe %s is not an MoE config", path ? path : "");
        const int T = seq ? seq : cfg.train.seq_len, L0 = cfg.model.num_hidden_layers;
        // the most layers that fit at B = 1; layer-sharing presets keep whole producer groups
        int L = L0;
        const int step = cfg.model.share_factor > 0 ? cfg.model.share_factor : 1;
        for (; L >= step; L -= step) {
            cfg.model.num_hidden_layers = L;
            if (train_bytes(&cfg.model, 1, T) <= budget) break;
        }
        const char *name = path ? path : "configs/paper/clla.json";
        if (L < step) {
            snprintf(line, sizeof line, "moe: not even %d layers of %s fit at T=%d", step, name, T);
            say(json, "skipped", line);
        } else {
            snprintf(line, sizeof line, "moe: %s with %d of its %d layers (%.1f GiB of training memory at B=1 T=%d)",
                     name, L, L0, train_bytes(&cfg.model, 1, T) / 1073741824.0, T);
            say(json, "note", line);
            run("moe", name, &cfg, 1, T, steps, peak, json);
        }
    }
    return 0;
#endif
}
