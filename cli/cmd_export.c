// clla export: an inference package from a checkpoint, a run directory or another package
// (docs/INFERENCE.md, "clla export"); the writing is cli/package_out.c's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/util.h"
#include "model/model_dir.h"
#include "cli/commands.h"
#include "cli/package_out.h"

static const ArgSpec SPECS[] = {
    {"out", 1, "the package directory to write (required; must not exist unless --overwrite)", "PACKAGE"},
    {"dtype", 1, "weights in the package: fp32 (default) or bf16 (round to nearest even)", "fp32|bf16"},
    {"cache-codec", ARG_REPEAT, "cache codec, CODEC or PART=CODEC (repeatable): fp32, bf16, int_group:bits=B,group=G, kivi:bits=B,group=G,residual=R, qjl:m=M,... (cq, qet, kvquant: clla calibrate)", "SPEC"},
    {"tokenizer", 1, "tokenizer file to include (default: the model's train.tokenizer)", "FILE"},
    {"overwrite", 0, "replace an existing package at --out", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

int cmd_export(int argc, char **argv) {
    Args a;
    char *pos[1];
    int n_pos = 0;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla export MODEL_DIR --out PACKAGE [--dtype fp32|bf16] [--cache-codec SPEC ...] [--tokenizer FILE] [--overwrite]\n"
               "Writes an inference package (config.json with the cache codecs, model.safetensors, the tokenizer) from a\n"
               "checkpoint (<run>/checkpoints/step_N), a finished run directory or another package.",
               pos, &n_pos, 1);
    const char *out_arg = args_get(&a, SPECS, N_SPECS, "out");
    if (n_pos != 1 || !out_arg) die("clla export needs a model directory and --out PACKAGE: see clla export --help");
    const char *src = pos[0];
    const char *dtype = args_get(&a, SPECS, N_SPECS, "dtype");
    if (!dtype) dtype = "fp32";
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("--dtype '%s' is not a package dtype: use fp32 or bf16", dtype);

    // ---- read and check everything first
    const char *specs[ARGS_MAX_REPEATS];
    int n_specs = args_get_all(&a, SPECS, N_SPECS, "cache-codec", specs, ARGS_MAX_REPEATS);
    Config cfg;
    Model model;
    ModelDir md;
    package_load_source(&md, &model, &cfg, src, specs, n_specs);
    const CacheLayout *layout = &md.cache;
    char err[1024];
    if (cache_layout_check_fitted(layout, err, sizeof(err)) != 0) die("%s", err);
    PackageOut po;
    package_out_begin(&po, out_arg, args_get(&a, SPECS, N_SPECS, "overwrite") != NULL, args_get(&a, SPECS, N_SPECS, "tokenizer"),
                      md.tokenizer, cfg.model.vocab_size, cfg.train.tokenizer_hash);
    package_out_write(&po, &model, &cfg, layout, dtype);
    char codecs[512];
    model_dir_describe_cache(layout, codecs, sizeof(codecs));
    printf("wrote %s: %s %s weights (%lld parameters) from %s %s, cache %s, tokenizer %s\n", po.out, dtype,
           cfg.model.attention, model_num_params(&model), model_dir_kind_name(md.kind), src, codecs,
           po.tok_text ? PACKAGE_TOKENIZER : "none");
    package_out_free(&po);
    model_dir_free(&md);
    model_free(&model);
    return 0;
}
