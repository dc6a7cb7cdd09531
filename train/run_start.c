// Where a training starts: the run directory's rules (train/run_start.h, docs/CHECKPOINTS.md
// "Run directories").
#include "train/run_start.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "model/model_dir.h"
#include "data/loader.h"
#include "train/checkpoint.h"
#include "train/run_files.h"

// Is `ckpt` a directory inside run_dir/checkpoints: directly (one of its steps, anywhere: an
// abandoned timeline's, which --overwrite would remove too)? (Paths resolved, links followed.)
static int ckpt_inside_run_at(const char *ckpt, const char *run_dir, int anywhere) {
    char a[PATH_MAX], b[PATH_MAX];
    char *cp = path_join(run_dir, CKPT_SUBDIR);
    int inside = realpath(ckpt, a) && realpath(cp, b);
    free(cp);
    if (!inside) return 0;
    const size_t n = strlen(b);
    if (anywhere) return !strncmp(a, b, n) && a[n] == '/';
    char *slash = strrchr(a, '/');
    if (slash) *slash = '\0';
    return !strcmp(a, b);
}
static int ckpt_inside_run(const char *ckpt, const char *run_dir) { return ckpt_inside_run_at(ckpt, run_dir, 0); }

int run_start_choose(const TrainConfig *tc, const char *resume, int overwrite, char *ckpt, size_t ckpt_len) {
    const char *out = tc->out_dir;
    RunDirContents c;
    run_dir_inspect(out, tc->metrics, &c);
    char what[1024], err[2048];
    run_dir_describe(&c, what, sizeof(what));
    run_dir_refuse_foreign(&c, out, tc->metrics);
    // train.metrics outside the run directory, holding step records while the directory holds
    // nothing: another run's metrics, or this run's from before its first checkpoint
    const int only_metrics_elsewhere = c.metrics && c.metrics_elsewhere[0] && !c.model && !c.config && !c.checkpoints;
    if (resume && !strcmp(resume, "auto")) {
        int r = ckpt_find_newest(out, ckpt, ckpt_len, err, sizeof(err));
        if (r == -2)
            die("--resume auto: %s; nothing was changed: resume from a checkpoint you trust with --resume DIR, or start over with --overwrite",
                err);
        if (r == 0) return 0;
        if (c.model)
            die("--resume auto: %s holds a finished model but no checkpoint to continue from (its optimizer state was not kept): start a new run from its weights with --set train.init_from=%s/model.safetensors --out NEW_DIR, or start over with --overwrite",
                out, out);
        if (only_metrics_elsewhere)
            die("--resume auto: no checkpoint in %s/%s, and train.metrics '%s' already holds step records (another run's, or this one's from before its first checkpoint): point train.metrics at a new file, or start over with --overwrite instead of --resume auto (it empties that file)",
                out, CKPT_SUBDIR, c.metrics_elsewhere);
        // a run killed before its first checkpoint left at most its metrics: they start over
        fprintf(stderr, "clla train: no checkpoint in %s/%s: starting from step 0\n", out, CKPT_SUBDIR);
        ckpt[0] = '\0';
        return 0;
    }
    int clear = 0;
    if (resume) {
        if (!ckpt_inside_run(resume, out) && !run_dir_is_empty(&c)) {
            if (!overwrite)
                die("--resume %s: that checkpoint is not one of %s/%s, and %s already holds another run (%s): resume into an empty --out, or clear it with --overwrite",
                    resume, out, CKPT_SUBDIR, out, what);
            if (ckpt_inside_run_at(resume, out, 1))   // under checkpoints/abandoned-*: cleared with the rest
                die("--overwrite would remove the checkpoint that --resume %s names (it is inside %s/%s): copy it out of the run "
                    "directory first, or drop --overwrite", resume, out, CKPT_SUBDIR);
            clear = 1;
        } else if (overwrite && !run_dir_is_empty(&c)) {
            die("--overwrite would remove the checkpoint that --resume %s names: drop --overwrite", resume);
        }
        if ((size_t)snprintf(ckpt, ckpt_len, "%s", resume) >= ckpt_len)
            die("--resume '%s' is longer than %zu bytes: give a shorter path to the checkpoint", resume, ckpt_len - 1);
        return clear;
    }
    ckpt[0] = '\0';
    if (run_dir_is_empty(&c)) return 0;
    if (!overwrite && only_metrics_elsewhere)
        die("train.metrics '%s' already holds a run's step records: point train.metrics at a new file, continue that run with --resume auto and its own --out, or start over with --overwrite (it empties that file)",
            c.metrics_elsewhere);
    if (!overwrite)
        die("run directory %s already holds a run (%s): continue it with --resume auto, start it over with --overwrite, or train into another --out",
            out, what);
    return 1;
}

char *run_start_init_config_path(const TrainConfig *tc) {
    if (!tc->init_from[0]) return NULL;
    struct stat st;
    char *cp;
    if (stat(tc->init_from, &st) == 0 && S_ISDIR(st.st_mode)) {
        cp = path_join(tc->init_from, "config.json");   // a model directory: its own config
    } else {   // a weights file or an index: the config beside it
        char *dir = xstrdup(tc->init_from), *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        cp = path_join(slash ? dir : ".", "config.json");
        free(dir);
    }
    if (access(cp, F_OK) == 0) return cp;
    free(cp);
    return NULL;
}

void run_start_compare_init_config(const Config *cfg) {
    char *cp = run_start_init_config_path(&cfg->train);
    if (!cp) return;
    Config init;
    model_dir_read_config(&init, cp);
    cJSON *a = config_model_to_json(&init.model), *b = config_model_to_json(&cfg->model);
    char diff[1024] = "";
    for (const cJSON *x = b->child; x; x = x->next) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(a, x->string);
        if (y && cJSON_Compare(x, y, 1)) continue;
        char *was = y ? cJSON_PrintUnformatted(y) : NULL, *now = cJSON_PrintUnformatted(x);
        size_t n = strlen(diff);
        if (n + 160 < sizeof(diff))
            snprintf(diff + n, sizeof(diff) - n, "%s%s (%.40s there, %.40s here)", n ? ", " : "", x->string, was ? was : "absent", now);
        free(was);
        free(now);
    }
    // rope_theta or an epsilon may change on purpose (a longer context): said, not refused; a
    // change of shape fails at the load that follows, naming the tensor
    if (diff[0])
        warn("train.init_from: the config.json of its model (%s) differs from this config in %s: the weights are used with this config's values",
             cp, diff);
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(cp);
}

unsigned long long run_start_tokenizer_hash(const TrainConfig *tc, char *from, size_t from_len) {
    unsigned long long h = 0;
    if (tc->tokenizer_hash[0]) {
        if (loader_parse_tokenizer_hash(tc->tokenizer_hash, &h) != 0)
            die("train.tokenizer_hash '%s' is not 16 hex digits", tc->tokenizer_hash);
        snprintf(from, from_len, "train.tokenizer_hash");
        return h;
    }
    char *cp = run_start_init_config_path(tc);
    if (cp) {
        Config init;
        model_dir_read_config(&init, cp);
        if (init.train.tokenizer_hash[0] && loader_parse_tokenizer_hash(init.train.tokenizer_hash, &h) != 0)
            die("'%s': train.tokenizer_hash '%s' is not 16 hex digits", cp, init.train.tokenizer_hash);
        snprintf(from, from_len, "the model train.init_from starts from (%s)", cp);
    }
    free(cp);
    return h;
}
