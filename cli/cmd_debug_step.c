// clla debug-step: one forward and backward on a batch, with logits, loss and every
// parameter gradient written to a safetensors file. The PyTorch twin
// (tests/reference/twin.py) recomputes the same in float64 and compares.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "data/loader.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/safetensors.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/model_source.h"
#include "train/run_files.h"

static const ArgSpec SPECS[] = {
    {"model", 1, "model directory with config.json and model.safetensors (required)", "DIR"},
    {"tokens", 1, "token file (required); rows are consecutive windows of seq+1 tokens", "FILE"},
    {"batch", 1, "sequences B (default 2)", "B"},
    {"seq", 1, "tokens per sequence T (default 16)", "T"},
    {"out", 1, "output safetensors file (required; an existing one is refused unless --overwrite)", "FILE"},
    {"overwrite", 0, "replace an existing --out FILE", NULL},
    {"device", 1, "cpu (default), cpu-bf16 (CPU emulating the CUDA bf16 roundings) or cuda", "cpu|cpu-bf16|cuda"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

int cmd_debug_step(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla debug-step --model DIR --tokens FILE --out FILE [--batch B] [--seq T]\n"
               "Writes logits [B,T,V], loss [1] and grad.<name> for every parameter (F32).",
               NULL, NULL, 0);
    const char *dir = args_get(&a, SPECS, N_SPECS, "model"), *tok = args_get(&a, SPECS, N_SPECS, "tokens");
    const char *out = args_get(&a, SPECS, N_SPECS, "out");
    if (!dir || !tok || !out) die("clla debug-step needs --model, --tokens and --out: see --help");
    const int overwrite = args_get(&a, SPECS, N_SPECS, "overwrite") != NULL;
    output_file_check(out, overwrite, "--out");
    output_not_input(out, "--out", dir, "--model directory");
    output_not_input(out, "--out", tok, "--tokens");
    const char *bs = args_get(&a, SPECS, N_SPECS, "batch"), *ts = args_get(&a, SPECS, N_SPECS, "seq");
    int B = bs ? (int)opt_i64("--batch", bs, 1, 2147483647) : 2, T = ts ? (int)opt_i64("--seq", ts, 1, 2147483647) : 16;
    Config cfg;
    Model model;
    model_source_check(dir);
    load_model_dir(&model, &cfg, dir, device_backend(args_get(&a, SPECS, N_SPECS, "device")), 0, NULL);
    if (T > cfg.model.max_position_embeddings)
        die("--seq %d exceeds the model's max_position_embeddings %d: give --seq %d or less", T, cfg.model.max_position_embeddings,
            cfg.model.max_position_embeddings);
    LoaderOptions lo = {.B = B, .T = T, .seed = 0, .rank = 0, .world = 1, .vocab_size = cfg.model.vocab_size};
    DataLoader *dl = loader_open(tok, &lo);
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    loader_next(dl, in, tg);
    model_set_batch(&model, B, T);
    model_zero_grad(&model);
    // "loss" is what the backward differentiates: the LM loss plus the MoE layers' aux and z losses
    float lm_loss = model_forward(&model, in, tg);
    double aux_loss = moe_aux_total(&model);
    float loss = (float)(lm_loss + aux_loss);
    model_backward(&model, 1.0f);

    const TensorTable *tt = &model.params;
    size_t nlog = (size_t)B * T * cfg.model.vocab_size;
    float *logits = xmalloc(nlog * sizeof(float));
    model.be->act_to_host(logits, table_ptr_store(&model.acts, model.act, model.logits), nlog);
    float *grads = xmalloc(tt->bytes_f32);
    model.be->download(grads, model.grad, tt->bytes_f32);
    StTensor *st = xcalloc((size_t)tt->n + 2, sizeof(StTensor));
    char **names = xcalloc((size_t)tt->n, sizeof(char *));
    st[0] = (StTensor){.name = "logits", .ndim = 3, .shape = {B, T, cfg.model.vocab_size}, .data = logits};
    st[1] = (StTensor){.name = "loss", .ndim = 1, .shape = {1}, .data = &loss};
    for (int i = 0; i < tt->n; i++) {
        names[i] = xmalloc(strlen(tt->t[i].name) + 6);
        sprintf(names[i], "grad.%s", tt->t[i].name);
        st[i + 2].name = names[i];
        st[i + 2].ndim = tt->t[i].ndim;
        for (int d = 0; d < tt->t[i].ndim; d++) st[i + 2].shape[d] = tt->t[i].shape[d];
        st[i + 2].data = (const float *)((const char *)grads + tt->t[i].off_f32);
    }
    char err[8192];
    if (st_save(out, overwrite ? OUT_REPLACE : OUT_KEEP_EXISTING, st, tt->n + 2, ST_F32, NULL, err, sizeof(err)) != 0) die("%s", err);
    if (model.moe) printf("loss %.6f (lm %.6f + moe aux %.6f)\n", loss, lm_loss, aux_loss);
    else printf("loss %.6f\n", loss);
    for (int i = 0; i < tt->n; i++) free(names[i]);
    free(names); free(st); free(grads); free(logits); free(in); free(tg);
    loader_close(dl);
    model_free(&model);
    return 0;
}
