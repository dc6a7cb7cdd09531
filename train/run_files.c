#include "train/run_files.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void run_files_open(RunFiles *rf, const char *dir, const char *metrics_path) {
    if (make_dirs(dir) != 0) die("cannot create run directory '%s': %s", dir, strerror(errno));
    rf->dir = xstrdup(dir);
    char *mp = metrics_path && metrics_path[0] ? xstrdup(metrics_path) : path_join(dir, "metrics.jsonl");
    rf->metrics = fopen(mp, "w");
    if (!rf->metrics) die("cannot write metrics file '%s': %s", mp, strerror(errno));
    free(mp);
}

void write_config_json(const char *path, const Config *cfg) {
    cJSON *j = config_to_json(cfg);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    AtomicFile af;
    if (atomic_open(&af, path) != 0) die("cannot write '%s': %s", path, strerror(errno));
    int ok = fputs(text, af.f) >= 0 && fputc('\n', af.f) != EOF;
    free(text);
    if (!ok) { atomic_abort(&af); die("writing '%s' failed", path); }
    if (atomic_commit(&af) != 0) die("writing '%s' failed: %s", path, strerror(errno));
}

void run_files_save_model(RunFiles *rf, const Config *cfg, Model *model) {
    char *cp = path_join(rf->dir, "config.json"), *mp = path_join(rf->dir, "model.safetensors");
    model_save(model, mp);
    write_config_json(cp, cfg);
    free(cp);
    free(mp);
}

void run_files_close(RunFiles *rf) {
    if (rf->metrics) fclose(rf->metrics);
    free(rf->dir);
    memset(rf, 0, sizeof(*rf));
}

void load_model_dir(Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets) {
    char *cp = path_join(dir, "config.json"), *mp = path_join(dir, "model.safetensors");
    config_load(cfg, cp, n_sets, sets);
    model_build(model, &cfg->model, be);
    model_load(model, mp);
    free(cp);
    free(mp);
}
