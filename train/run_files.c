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

void run_files_open_resume(RunFiles *rf, const char *dir, const char *metrics_path, int resumed_step) {
    if (make_dirs(dir) != 0) die("cannot create run directory '%s': %s", dir, strerror(errno));
    rf->dir = xstrdup(dir);
    char *mp = metrics_path && metrics_path[0] ? xstrdup(metrics_path) : path_join(dir, "metrics.jsonl");
    size_t len = 0;
    char *old = read_file(mp, &len);
    if (old) {
        AtomicFile af;
        if (atomic_open(&af, mp) != 0) die("cannot write metrics file '%s': %s", mp, strerror(errno));
        int ok = 1;
        for (char *line = old, *next; ok && line < old + len; line = next) {
            char *nl = memchr(line, '\n', (size_t)(old + len - line));
            next = nl ? nl + 1 : old + len;
            if (!nl) break;   // a last line without its newline was cut off by a kill
            cJSON *rec = cJSON_ParseWithLength(line, (size_t)(nl - line));
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(rec, "step");
            if (cJSON_IsNumber(st) && st->valuedouble <= resumed_step)
                ok = fwrite(line, 1, (size_t)(next - line), af.f) == (size_t)(next - line);
            cJSON_Delete(rec);
        }
        if (!ok) { atomic_abort(&af); die("rewriting metrics file '%s' failed: %s", mp, strerror(errno)); }
        if (atomic_commit(&af) != 0) die("rewriting metrics file '%s' failed: %s", mp, strerror(errno));
        free(old);
    }
    rf->metrics = fopen(mp, "a");
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

void run_files_save_model(RunFiles *rf, const Config *cfg, Model *model, const float *masters) {
    char *cp = path_join(rf->dir, "config.json");
    model_save_dir(model, masters, rf->dir, rf->shard_bytes);
    write_config_json(cp, cfg);
    free(cp);
}

void run_files_close(RunFiles *rf) {
    if (rf->metrics) fclose(rf->metrics);
    free(rf->dir);
    memset(rf, 0, sizeof(*rf));
}

void load_model_dir(Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets) {
    char *cp = path_join(dir, "config.json");
    config_load(cfg, cp, n_sets, sets);
    model_build(model, &cfg->model, be);
    model_load(model, dir);   // model.safetensors or model.safetensors.index.json and its shards
    free(cp);
}
