// clla train: the training loop. AdamW with warmup + cosine schedule, gradient
// accumulation to a global batch in tokens, global-norm clipping, validation, metrics.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/util.h"
#include "data/loader.h"
#include "model/model.h"
#include "model/moe.h"
#include "train/commands.h"
#include "train/device.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/run_files.h"

static const ArgSpec SPECS[] = {
    {"config", 1, "config JSON (required)"},
    {"set", 1, "override a key: --set hidden_size=256, --set train.lr=1e-3 (repeatable)"},
    {"device", 1, "cpu (default) or cuda"},
    {"out", 1, "run directory (overrides train.out_dir)"},
    {"quiet", 0, "no per-step lines on stderr (metrics are still written)"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// Mean loss over n batches of a loader (no gradients).
static double evaluate(Model *model, DataLoader *dl, int n, int32_t *in, int32_t *tg) {
    double sum = 0;
    loader_reset(dl);
    for (int i = 0; i < n; i++) {
        loader_next(dl, in, tg);
        sum += model_forward(model, in, tg);
    }
    return n ? sum / n : 0.0;
}

static void print_curve_summary(const float *losses, int n) {
    if (n == 0) return;
    fprintf(stderr, "loss curve:");
    int points = n < 10 ? n : 10;
    for (int k = 0; k < points; k++) {
        int i = (int)((long long)k * (n - 1) / (points > 1 ? points - 1 : 1));
        fprintf(stderr, " %d:%.4f", i + 1, losses[i]);
    }
    float best = losses[0];
    for (int i = 1; i < n; i++) if (losses[i] < best) best = losses[i];
    fprintf(stderr, "\nfirst %.4f  last %.4f  best %.4f  (%d steps)\n", losses[0], losses[n - 1], best, n);
}

int cmd_train(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla train --config FILE [--set key=value ...] [--device cpu|cuda] [--out DIR]\n"
               "Trains the model the config describes on train.data and writes DIR/config.json,\n"
               "DIR/model.safetensors and DIR/metrics.jsonl (one JSON object per step).",
               NULL, NULL, 0);
    const char *cfg_path = args_get(&a, SPECS, N_SPECS, "config");
    if (!cfg_path) die("clla train needs --config FILE: see clla train --help");
    Config cfg;
    config_load(&cfg, cfg_path, a.n_sets, a.sets);
    TrainConfig *tc = &cfg.train;
    const char *out = args_get(&a, SPECS, N_SPECS, "out");
    if (out) snprintf(tc->out_dir, sizeof(tc->out_dir), "%s", out);
    if (!tc->data[0]) die("%s: train.data is not set: point it at a token file (--set train.data=FILE)", cfg_path);
    int quiet = args_get(&a, SPECS, N_SPECS, "quiet") != NULL;
    if (tc->threads > 0) omp_set_num_threads(tc->threads);

    const Backend *be = device_backend(args_get(&a, SPECS, N_SPECS, "device"));
    int B = tc->micro_batch, T = tc->seq_len;
    long long bt = (long long)B * T;
    int n_micro = tc->global_batch_tokens ? (int)(tc->global_batch_tokens / bt) : 1;

    LoaderOptions lo = {.B = B, .T = T, .seed = tc->seed, .rank = 0, .world = 1, .vocab_size = cfg.model.vocab_size};
    DataLoader *train_dl = loader_open(tc->data, &lo);
    DataLoader *val_dl = tc->val_data[0] ? loader_open(tc->val_data, &lo) : NULL;
    int val_batches = 0;
    if (val_dl) {
        long long avail = loader_num_batches(val_dl);
        val_batches = tc->val_batches < avail ? tc->val_batches : (int)avail;
    }

    RunFiles rf;
    run_files_open(&rf, tc->out_dir, tc->metrics);

    Model model;
    model_build(&model, &cfg.model, be);
    if (tc->init_from[0]) model_load(&model, tc->init_from);
    else model_init_weights(&model, tc->seed);
    model_set_batch(&model, B, T);
    AdamW opt;
    adamw_init(&opt, &model);

    fprintf(stderr, "clla train: %s | %lld params | device %s | %d threads | B=%d T=%d x %d micro-steps = %lld tokens/step | %d steps\n",
            cfg.model.attention, model_num_params(&model), be->name, omp_get_max_threads(), B, T, n_micro, bt * n_micro, tc->max_steps);

    int32_t *in = xmalloc((size_t)bt * sizeof(int32_t)), *tg = xmalloc((size_t)bt * sizeof(int32_t));
    float *curve = xcalloc((size_t)tc->max_steps + 1, sizeof(float));
    double t_start = now_seconds(), tok_per_s = 0;
    for (int step = 0; step < tc->max_steps; step++) {
        double t0 = now_seconds();
        model_zero_grad(&model);
        // loss = LM loss + the MoE layers' aux (+ z) losses: what the backward differentiates
        double loss = 0, lm_loss = 0, aux_loss = 0, max_share = 0, min_share = 0;
        long long assigned = 0, dropped = 0;
        for (int k = 0; k < n_micro; k++) {
            loader_next(train_dl, in, tg);
            double lm = model_forward(&model, in, tg);
            MoeStats ms;
            moe_last_stats(&model, &ms);
            lm_loss += lm / n_micro;
            aux_loss += (ms.aux_loss + ms.z_loss) / n_micro;
            loss += (lm + ms.aux_loss + ms.z_loss) / n_micro;
            max_share += ms.max_share / n_micro;
            min_share += ms.min_share / n_micro;
            assigned += ms.assignments;
            dropped += ms.dropped;
            model_backward(&model, 1.0f / (float)n_micro);
        }
        double norm = grad_global_norm(&model);
        float lr = lr_at(tc, step);
        int finite = isfinite(loss) && isfinite(norm);
        if (finite) adamw_step(&opt, &model, tc, lr, clip_scale(norm, tc->grad_clip));
        else warn("step %d: non-finite loss or gradient norm (loss %g, norm %g): update skipped", step + 1, loss, norm);
        double dt = now_seconds() - t0;
        tok_per_s = (double)bt * n_micro / dt;
        curve[step] = (float)loss;

        cJSON *rec = cJSON_CreateObject();
        cJSON_AddNumberToObject(rec, "step", step + 1);
        cJSON_AddNumberToObject(rec, "loss", loss);
        if (model.moe) {   // expert shares: mean over MoE layers and micro-batches; drops: over all of them
            cJSON_AddNumberToObject(rec, "lm_loss", lm_loss);
            cJSON_AddNumberToObject(rec, "aux_loss", aux_loss);
            cJSON_AddNumberToObject(rec, "expert_share_max", max_share);
            cJSON_AddNumberToObject(rec, "expert_share_min", min_share);
            cJSON_AddNumberToObject(rec, "dropped_frac", assigned ? (double)dropped / (double)assigned : 0.0);
        }
        cJSON_AddNumberToObject(rec, "grad_norm", norm);
        cJSON_AddNumberToObject(rec, "lr", lr);
        cJSON_AddNumberToObject(rec, "ms", dt * 1e3);
        cJSON_AddNumberToObject(rec, "tokens_per_s", tok_per_s);
        cJSON_AddNumberToObject(rec, "tokens", (double)bt * n_micro * (step + 1));
        if (!finite) cJSON_AddBoolToObject(rec, "skipped", 1);
        int last = step + 1 == tc->max_steps;
        if (val_dl && ((tc->val_every && (step + 1) % tc->val_every == 0) || last)) {
            double vl = evaluate(&model, val_dl, val_batches, in, tg);
            cJSON_AddNumberToObject(rec, "val_loss", vl);
            if (!quiet) fprintf(stderr, "step %d: val loss %.4f (ppl %.2f)\n", step + 1, vl, exp(vl));
        }
        metrics_write(rf.metrics, rec);
        cJSON_Delete(rec);
        if (!quiet && ((step + 1) % tc->log_every == 0 || last)) {
            char eta[32];
            double elapsed = now_seconds() - t_start;
            format_duration(eta, sizeof(eta), elapsed / (step + 1) * (tc->max_steps - step - 1));
            char moe[128] = "";
            if (model.moe)
                snprintf(moe, sizeof(moe), " | aux %.4f | experts max %.3f min %.3f | dropped %.1f%%", aux_loss,
                         max_share, min_share, assigned ? 100.0 * (double)dropped / (double)assigned : 0.0);
            fprintf(stderr, "step %5d/%d | loss %.4f%s | norm %.3f | lr %.2e | %.0f ms | %.0f tok/s | ETA %s\n",
                    step + 1, tc->max_steps, loss, moe, norm, lr, dt * 1e3, tok_per_s, eta);
        }
    }
    print_curve_summary(curve, tc->max_steps);
    run_files_save_model(&rf, &cfg, &model);
    fprintf(stderr, "saved %s/model.safetensors and config.json\n", tc->out_dir);

    run_files_close(&rf);
    free(curve); free(in); free(tg);
    adamw_free(&opt, &model);
    model_free(&model);
    loader_close(train_dl);
    if (val_dl) loader_close(val_dl);
    return 0;
}
