// clla init: a freshly initialized model directory (config.json + model.safetensors),
// for tests, the PyTorch twin and runs that start from a fixed initialization.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/args.h"
#include "common/unfinished.h"
#include "common/util.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "cli/commands.h"
#include "train/run_files.h"

static const ArgSpec SPECS[] = {
    {"config", 1, "config JSON (required)", "FILE"},
    {"out", 1, "output directory (required)", "DIR"},
    {"set", 1, "override a key (repeatable)", "KEY=VALUE"},
    {"shard-size", 1, "write the weights as HF shards of at most this size (2GB, 500MB, 64MiB) with model.safetensors.index.json", "SIZE"},
    {"overwrite", 0, "DIR may hold a model or a run: clear what a run wrote there (model, config, metrics, checkpoints/) first", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

int cmd_init(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla init --config FILE --out DIR [--set key=value ...] [--shard-size SIZE] [--overwrite]\n"
               "Writes DIR/config.json and DIR/model.safetensors (or its shards) initialized from train.seed.\n"
               "A DIR that already holds a model or a run is refused unless --overwrite.",
               NULL, NULL, 0);
    const char *cfg_path = args_get(&a, SPECS, N_SPECS, "config"), *out = args_get(&a, SPECS, N_SPECS, "out");
    if (!cfg_path || !out) die("clla init needs --config FILE and --out DIR: see clla init --help");
    const char *shard = args_get(&a, SPECS, N_SPECS, "shard-size");
    unsigned long long shard_bytes = 0;
    if (shard && parse_byte_size(shard, &shard_bytes) != 0)
        die("--shard-size '%s' is not a size: give a whole number with a unit, e.g. 2GB, 500MB or 64MiB", shard);
    Config cfg;
    config_load(&cfg, cfg_path, a.n_sets, a.sets);
    config_set_out_dir(&cfg, out);   // the config.json written names the directory it is in
    // a training that runs in out holds its lock: nothing is written beside it, also while its
    // directory is still empty (a training that had not written yet got this model in its
    // directory, and removed the temporary of an init writing into it as one a killed run left)
    run_lock_acquire(out);
    // a trained run's files are never replaced by a fresh initialization without a word
    RunDirContents c;
    run_dir_inspect(out, NULL, &c);
    run_dir_refuse_foreign(&c, out, NULL);
    if (!run_dir_is_empty(&c) && !args_get(&a, SPECS, N_SPECS, "overwrite")) {
        char what[1024];
        run_dir_describe(&c, what, sizeof(what));
        die("'%s' already holds a model or a run (%s): give another --out, or replace it with --overwrite", out, what);
    }
    if (!run_dir_is_empty(&c)) run_dir_check_clearable(out, NULL);   // before the new model replaces the old one
    Model model;
    model_build(&model, &cfg.model, backend_cpu());
    model_init_weights(&model, cfg.train.seed);
    RunFiles rf = {.metrics_fd = -1};
    struct stat st;
    const int created = stat(out, &st) != 0;
    if (make_dirs(out) != 0) die("cannot create '%s': %s", out, strerror(errno));
    const int out_slot = created ? unfinished_add(out, UNFINISHED_EMPTY_DIR) : -1;   // removed if left empty
    rf.dir = xstrdup(out);
    rf.shard_bytes = shard_bytes;
    // the model, its config.json and (--overwrite) the clearing of the earlier run are one commit:
    // a Ctrl-C between them left a trained run's config and checkpoints beside the new weights
    sigset_t before;
    unfinished_hold_stops(&before);
    run_files_save_model(&rf, &cfg, &model, model.master, NULL);
    free(rf.dir);
    unfinished_done(out_slot);
    // --overwrite: the earlier run's metrics and checkpoints go once the new model replaced its
    // (a failed write above leaves that run as it was)
    if (!run_dir_is_empty(&c)) run_dir_clear(out, NULL, 1);
    unfinished_release_stops(&before);
    char *index = path_join(out, ST_INDEX_FILE);
    printf("wrote %s/config.json and %s/%s (%lld parameters)\n", out, out,
           access(index, F_OK) == 0 ? ST_INDEX_FILE " and its shards" : ST_SINGLE_FILE, model_num_params(&model));
    free(index);
    model_free(&model);
    return 0;
}
