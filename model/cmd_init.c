// clla init: a freshly initialized model directory (config.json + model.safetensors),
// for tests, the PyTorch twin and runs that start from a fixed initialization.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/util.h"
#include "model/model.h"
#include "train/commands.h"
#include "train/run_files.h"

static const ArgSpec SPECS[] = {
    {"config", 1, "config JSON (required)", "FILE"},
    {"out", 1, "output directory (required)", "DIR"},
    {"set", 1, "override a key (repeatable)", "KEY=VALUE"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

int cmd_init(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla init --config FILE --out DIR [--set key=value ...]\n"
               "Writes DIR/config.json and DIR/model.safetensors initialized from train.seed.",
               NULL, NULL, 0);
    const char *cfg_path = args_get(&a, SPECS, N_SPECS, "config"), *out = args_get(&a, SPECS, N_SPECS, "out");
    if (!cfg_path || !out) die("clla init needs --config FILE and --out DIR: see clla init --help");
    Config cfg;
    config_load(&cfg, cfg_path, a.n_sets, a.sets);
    Model model;
    model_build(&model, &cfg.model, backend_cpu());
    model_init_weights(&model, cfg.train.seed);
    RunFiles rf = {0};
    if (make_dirs(out) != 0) die("cannot create '%s': %s", out, strerror(errno));
    rf.dir = xstrdup(out);
    run_files_save_model(&rf, &cfg, &model, model.master);
    free(rf.dir);
    printf("wrote %s/config.json and %s/model.safetensors (%lld parameters)\n", out, out, model_num_params(&model));
    model_free(&model);
    return 0;
}
