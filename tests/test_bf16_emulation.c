// The CPU bf16 emulation backend (layers/backend_cpu_bf16.c, --device cpu-bf16):
//  1. every stored act buffer (activations and activation gradients, DT_STORE entries of the
//     activation tables) holds bf16-representable values after a forward and a backward, for
//     every attention preset and an MoE model; the fp32 buffers are left alone (at least one
//     of them, att or rstd, holds values that are not bf16);
//  2. the weight storage equals the host prediction of backend/bf16.h bit for bit, after
//     initialization and after AdamW steps (the seed adamw_store_seed(seed, t));
//  3. the masters are separate fp32 buffers (not the storage) and the gradients fp32; the
//     one-pass update (adamw_step_fused through adamw_update_store) leaves masters, moments and
//     storage bit for bit as the update and the refresh in two passes do;
//  4. a 50-step training run of a tiny model on cpu-bf16 against the same run on the fp32 CPU
//     backend: the loss curves agree within TOL_LOSS (below), both learn, the bf16 run is
//     not secretly fp32 (its losses differ), and it is deterministic (two runs bitwise equal).
// Prints one line per check, then "N passed, M failed".
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "backend/bf16.h"
#include "model/model.h"
#include "train/optimizer.h"
#include "tests/train_curve.h"

static int n_passed, n_failed;

static void result(const char *name, int ok, const char *detail) {
    ok ? n_passed++ : n_failed++;
    printf("%s %-58s %s\n", ok ? "ok  " : "FAIL", name, detail);
}

static int is_bf16(float x) { return sr_bf16_to_f32(sr_f32_to_bf16_rne(x)) == x || x != x; }

// Values of a table's entries of one dtype (DT_STORE or DT_F32) that are not bf16 (int32
// buffers in DT_F32 slots skipped); *first names the first tensor holding one.
static size_t count_not_bf16(const TensorTable *tt, void *base, int dtype, const char **first) {
    size_t bad = 0;
    for (int i = 0; i < tt->n; i++) {
        const TensorInfo *ti = &tt->t[i];
        if (ti->dtype != dtype) continue;
        if (dtype == DT_F32 && (strstr(ti->name, "idx") || strstr(ti->name, "counts") || strstr(ti->name, "off") ||
                                strstr(ti->name, "row")))
            continue;   // int32 buffers in DT_F32 slots
        const float *p = (const float *)((char *)base + (dtype == DT_STORE ? ti->off_store : ti->off_f32));
        for (size_t k = 0; k < ti->numel; k++)
            if (!is_bf16(p[k])) {
                if (!bad && first) *first = ti->name;
                bad++;
            }
    }
    return bad;
}

// Weight storage against the host prediction for master values and a store seed: tensor i
// with the stream model_weight_seed(seed, i), element k of the tensor with hash index k.
static size_t count_weight_mismatch(const Model *m, unsigned long long seed) {
    size_t bad = 0;
    for (int i = 0; i < m->params.n; i++) {
        const float *w = table_ptr_f32(&m->params, (float *)m->w, i), *ms = table_ptr_f32(&m->params, m->master, i);
        for (size_t k = 0; k < m->params.t[i].numel; k++) {
            const float want = sr_bf16_to_f32(sr_round_weight(ms[k], model_weight_seed(seed, i), k));
            if (memcmp(&w[k], &want, sizeof want) != 0) bad++;
        }
    }
    return bad;
}

static void random_batch(int32_t *in, int32_t *tg, int n, int V, unsigned long long seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(rng_next(&r) % (unsigned)V);
        tg[i] = (int32_t)(rng_next(&r) % (unsigned)V);
    }
    tg[1] = IGNORE_INDEX;   // an ignored target on the way, as real batches have
}

#define BASE "\"vocab_size\":61,\"hidden_size\":24,\"num_attention_heads\":4,\"head_dim\":6,\"intermediate_size\":40," \
             "\"initializer_range\":0.1,\"rope_theta\":100,"
#define MOE "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":12,\"n_shared_experts\":1," \
            "\"first_k_dense_layers\":1,\"moe_capacity_factor\":1.5,\"moe_z_loss_coef\":0.001,"
typedef struct Case { const char *name, *json; } Case;
static const Case CASES[] = {
    {"mha", "{" BASE "\"attention\":\"mha\",\"num_hidden_layers\":2}"},
    {"gqa", "{" BASE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":2}"},
    {"cla", "{" BASE "\"attention\":\"cla\",\"num_hidden_layers\":3}"},
    {"mla", "{" BASE "\"attention\":\"mla\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,\"q_lora_rank\":6,\"v_head_dim\":5,\"num_hidden_layers\":2}"},
    {"clla", "{" BASE "\"attention\":\"clla\",\"kv_lora_rank\":8,\"qk_rope_head_dim\":4,\"num_hidden_layers\":3}"},
    {"clla_quant", "{" BASE "\"attention\":\"clla_quant\",\"kv_lora_rank\":32,\"qk_rope_head_dim\":4,\"num_hidden_layers\":3}"},
    {"gqa + moe", "{" BASE MOE "\"attention\":\"gqa\",\"num_key_value_heads\":2,\"num_hidden_layers\":3}"},
};

// The same AdamW step taken from the same state twice, fused (one pass) and as the update of
// the whole range then model_sync_weights: masters, moments and storage compared bitwise.
static void check_fused_update(Model *m, AdamW *opt, const TrainConfig *tc, const char *label) {
    const size_t nm = m->params.bytes_f32 / 4, ns = m->params.bytes_store;
    float *state = malloc(3 * nm * sizeof(float)), *fused = malloc(3 * nm * sizeof(float));
    unsigned char *w0 = malloc(ns), *wf = malloc(ns);
    if (!state || !fused || !w0 || !wf) { fprintf(stderr, "out of memory\n"); exit(1); }
    memcpy(state, m->master, nm * sizeof(float));
    memcpy(state + nm, opt->m, nm * sizeof(float));
    memcpy(state + 2 * nm, opt->v, nm * sizeof(float));
    memcpy(w0, m->w, ns);
    const int t0 = opt->t;
    const int took = adamw_step_fused(opt, m, tc, tc->lr, 0.5f);
    memcpy(fused, m->master, nm * sizeof(float));
    memcpy(fused + nm, opt->m, nm * sizeof(float));
    memcpy(fused + 2 * nm, opt->v, nm * sizeof(float));
    memcpy(wf, m->w, ns);
    memcpy(m->master, state, nm * sizeof(float));   // back to the state before, then two passes
    memcpy(opt->m, state + nm, nm * sizeof(float));
    memcpy(opt->v, state + 2 * nm, nm * sizeof(float));
    memcpy(m->w, w0, ns);
    opt->t = t0;
    adamw_update_range(opt, m, tc, tc->lr, 0.5f);
    model_sync_weights(m, adamw_store_seed(tc->seed, opt->t));
    size_t diff = 0;
    for (size_t i = 0; i < nm; i++)
        diff += memcmp(&fused[i], &m->master[i], 4) != 0 || memcmp(&fused[nm + i], &opt->m[i], 4) != 0 ||
                memcmp(&fused[2 * nm + i], &opt->v[i], 4) != 0;
    const int w_same = memcmp(wf, m->w, ns) == 0;
    char name[96], d[128];
    snprintf(d, sizeof d, "%s; %zu of %zu masters/moments differ, storage %s", took ? "fused" : "NOT fused", diff, nm,
             w_same ? "equal" : "differs");
    snprintf(name, sizeof name, "%s: one-pass AdamW + store = two passes, bitwise", label);
    result(name, took && diff == 0 && w_same, d);
    free(state);
    free(fused);
    free(w0);
    free(wf);
}

static void check_storage(const Case *cs) {
    Config cfg;
    config_from_json(&cfg, cs->json, cs->name, 0, NULL);
    Model m;
    model_build(&m, &cfg.model, backend_cpu_bf16());
    char name[96], d[160];
    snprintf(name, sizeof name, "%s: masters separate from the storage", cs->name);
    result(name, (void *)m.master != m.w, "");

    const unsigned long long init_seed = 11;
    model_init_weights(&m, init_seed);
    size_t bad = count_weight_mismatch(&m, init_seed);
    snprintf(d, sizeof d, "%zu of %zu differ", bad, m.params.bytes_f32 / 4);
    snprintf(name, sizeof name, "%s: init weights = sr_hash prediction", cs->name);
    result(name, bad == 0, d);

    const int B = 2, T = 9, N = B * T;
    model_set_batch(&m, B, T);
    int32_t in[18], tg[18];
    TrainConfig tc = cfg.train;
    tc.lr = 1e-2f;
    AdamW opt;
    adamw_init(&opt, &m);
    size_t bad_fwd = 0, bad_all = 0, bad_w = 0, f32_not_bf16 = 0;
    const char *first = "";
    for (int step = 0; step < 2; step++) {
        random_batch(in, tg, N, cfg.model.vocab_size, 100 + (unsigned)step);
        model_zero_grad(&m);
        model_forward(&m, in, tg);
        bad_fwd += count_not_bf16(&m.acts, m.act, DT_STORE, &first);
        model_backward(&m, 1.0f);
        bad_all += count_not_bf16(&m.acts, m.act, DT_STORE, &first) + count_not_bf16(&m.gacts, m.gact, DT_STORE, &first);
        f32_not_bf16 += count_not_bf16(&m.acts, m.act, DT_F32, NULL);
        adamw_step(&opt, &m, &tc, tc.lr, 1.0f);
        bad_w += count_weight_mismatch(&m, adamw_store_seed(tc.seed, opt.t));
    }
    snprintf(d, sizeof d, "%zu not bf16 after forward, %zu after backward%s%s", bad_fwd, bad_all,
             bad_all ? ", first in " : "", bad_all ? first : "");
    snprintf(name, sizeof name, "%s: every stored act / act-grad value is bf16", cs->name);
    result(name, bad_fwd == 0 && bad_all == 0, d);
    snprintf(d, sizeof d, "%zu fp32 values not bf16", f32_not_bf16);
    snprintf(name, sizeof name, "%s: fp32 buffers (att, rstd, losses) not rounded", cs->name);
    result(name, f32_not_bf16 > 0, d);
    snprintf(d, sizeof d, "%zu differ", bad_w);
    snprintf(name, sizeof name, "%s: weights after AdamW = sr_hash prediction", cs->name);
    result(name, bad_w == 0, d);
    // the masters moved by less than a bf16 ulp in places: they must not all be bf16 values
    size_t nm = m.params.bytes_f32 / 4, master_not_bf16 = 0, grad_not_bf16 = 0;
    for (size_t i = 0; i < nm; i++) {
        master_not_bf16 += !is_bf16(m.master[i]);
        grad_not_bf16 += !is_bf16(m.grad[i]);
    }
    snprintf(d, sizeof d, "%zu masters, %zu gradients of %zu are not bf16 values", master_not_bf16, grad_not_bf16, nm);
    snprintf(name, sizeof name, "%s: masters and weight gradients stay fp32", cs->name);
    result(name, master_not_bf16 > 0 && grad_not_bf16 > 0, d);
    check_fused_update(&m, &opt, &tc, cs->name);
    adamw_free(&opt, &m);
    model_free(&m);
}

// ---------------------------------------------------------------- 50-step loss curves

#define STEPS 50

// Tolerance of the loss curves. bf16 keeps 8 significant bits: each stored value is off by up
// to 2^-9 relative. At step 0 (same masters; only the roundings differ) the losses differ by
// the rounding noise of the logits, ~1e-4 here. After the first update the two runs follow
// different trajectories (stochastically rounded weights, bf16 gradients of the
// activations) of the same optimisation, and the gap grows to the step-to-step noise of that
// difference: measured on this model, worst |diff| 0.0016 and mean 0.0005 over 50 steps.
// TOL: 0.01 absolute + 0.5% relative per step (about 0.025 at loss 3, ~15x the measured
// worst), and 0.5% on the mean of the last 10 steps: it bounds the precision policy's effect
// on the loss (what a GPU run should reproduce). It is not what catches a rounding in the
// wrong place: nearest instead of stochastic weight rounding, tried on this run, stays
// within 0.0011 (the updates here are larger than a bf16 ulp). The bit-exact checks above
// (storage values, sr_hash prediction, fp32 buffers untouched) catch those.
#define TOL_ABS 0.01
#define TOL_REL 0.005
#define TOL_TAIL 0.005

static void check_curves(void) {
    float l32[STEPS], l16[STEPS], l16b[STEPS];
    train_curve(backend_cpu(), TRAIN_CURVE_JSON, STEPS, 4, 32, l32);
    train_curve(backend_cpu_bf16(), TRAIN_CURVE_JSON, STEPS, 4, 32, l16);
    train_curve(backend_cpu_bf16(), TRAIN_CURVE_JSON, STEPS, 4, 32, l16b);
    double worst = 0, worst_ratio = 0, sum_diff = 0;
    int worst_step = 0, differ = 0;
    for (int s = 0; s < STEPS; s++) {
        const double d = fabs((double)l16[s] - l32[s]);
        const double ratio = d / (TOL_ABS + TOL_REL * fabs(l32[s]));
        if (ratio > worst_ratio) { worst_ratio = ratio; worst = d; worst_step = s; }
        sum_diff += d;
        differ += l16[s] != l32[s];
    }
    double tail32 = 0, tail16 = 0;
    for (int s = STEPS - 10; s < STEPS; s++) { tail32 += l32[s] / 10.0; tail16 += l16[s] / 10.0; }
    printf("     step  fp32      cpu-bf16  diff\n");
    for (int s = 0; s < STEPS; s += 7)
        printf("     %4d  %.5f  %.5f  %+.5f\n", s, l32[s], l16[s], (double)l16[s] - l32[s]);
    if ((STEPS - 1) % 7)
        printf("     %4d  %.5f  %.5f  %+.5f\n", STEPS - 1, l32[STEPS - 1], l16[STEPS - 1],
               (double)l16[STEPS - 1] - l32[STEPS - 1]);
    char d[200];
    snprintf(d, sizeof d, "worst |diff| %.4f at step %d (%.2f of tolerance), mean |diff| %.4f", worst, worst_step,
             worst_ratio, sum_diff / STEPS);
    result("50 steps: cpu-bf16 loss within 0.01 + 0.5% of fp32 per step", worst_ratio <= 1.0, d);
    snprintf(d, sizeof d, "fp32 %.4f, cpu-bf16 %.4f (rel %.4f)", tail32, tail16, fabs(tail16 - tail32) / tail32);
    result("50 steps: mean of the last 10 losses within 0.5%", fabs(tail16 - tail32) <= TOL_TAIL * tail32, d);
    snprintf(d, sizeof d, "fp32 %.3f -> %.3f, cpu-bf16 %.3f -> %.3f", l32[0], tail32, l16[0], tail16);
    result("50 steps: both runs learn (last-10 mean < 85% of step 0)", tail32 < 0.85 * l32[0] && tail16 < 0.85 * l16[0], d);
    snprintf(d, sizeof d, "%d of %d steps differ", differ, STEPS);
    result("50 steps: the emulation rounds (losses differ from fp32)", differ >= STEPS / 2, d);
    result("50 steps: cpu-bf16 is deterministic (two runs bitwise equal)", memcmp(l16, l16b, sizeof l16) == 0, "");
}

int main(void) {
    const Backend *be = backend_cpu_bf16();
    result("backend cpu-bf16: fp32 storage, separate masters", be->act_bytes == 4 && be->separate_master == 1,
           be->name);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_storage(&CASES[i]);
    check_curves();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
