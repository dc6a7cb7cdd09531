// One loader for run directories, checkpoints and inference packages (model/model_dir.h).
#include "model/model_dir.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"

static int is_file(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    struct stat sb;
    int ok = stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return ok;
}

// config.json of dir parsed (NULL when it is not a JSON object: config_from_json then names
// the problem); *text receives the file's text (caller frees).
static cJSON *read_config(const char *dir, char **text) {
    char *cp = path_join(dir, MODEL_DIR_CONFIG);
    size_t len = 0;
    *text = read_file(cp, &len);
    if (!*text) die("cannot read '%s': %s: pass a run directory, a checkpoint directory or a package", cp, strerror(errno));
    free(cp);
    cJSON *root = cJSON_ParseWithLength(*text, len);
    if (root && !cJSON_IsObject(root)) { cJSON_Delete(root); root = NULL; }
    return root;
}

static void check_dir(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0) die("model directory '%s': %s: pass a run directory, a checkpoint directory or a package", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) die("'%s' is not a directory: pass a run directory, a checkpoint directory or a package", dir);
    if (!is_file(dir, MODEL_DIR_CONFIG))
        die("'%s' has no %s: pass a run directory, a checkpoint directory (<run>/checkpoints/step_N) or a package", dir, MODEL_DIR_CONFIG);
    if (!is_file(dir, MODEL_DIR_WEIGHTS) && !is_file(dir, "model.safetensors.index.json")) {
        char *ck = path_join(dir, "checkpoints");
        struct stat cs;
        int has_ckpt = stat(ck, &cs) == 0 && S_ISDIR(cs.st_mode);
        free(ck);
        if (has_ckpt) die("'%s' has no %s (the run has not finished): pass one of its checkpoints, %s/checkpoints/step_N", dir, MODEL_DIR_WEIGHTS, dir);
        die("'%s' has no %s: pass a run directory, a checkpoint directory or a package", dir, MODEL_DIR_WEIGHTS);
    }
}

static ModelDirKind kind_of(const char *dir, const cJSON *root) {
    if (cJSON_GetObjectItemCaseSensitive(root, "package")) return MODEL_DIR_PACKAGE;
    return is_file(dir, "state.json") ? MODEL_DIR_CHECKPOINT : MODEL_DIR_RUN;
}

ModelDirKind model_dir_kind(const char *dir) {
    check_dir(dir);
    char *text;
    cJSON *root = read_config(dir, &text);
    ModelDirKind k = kind_of(dir, root);
    cJSON_Delete(root);
    free(text);
    return k;
}

const char *model_dir_kind_name(ModelDirKind k) {
    return k == MODEL_DIR_PACKAGE ? "package" : k == MODEL_DIR_CHECKPOINT ? "checkpoint" : "run directory";
}

// The "package" object: format, version, and the tokenizer file name (a plain name inside the
// package, or null). Returns the tokenizer path or NULL.
static char *read_package(const char *dir, const char *cp, const cJSON *pk) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(pk, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(pk, "version");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(pk, "tokenizer");
    if (!cJSON_IsObject(pk) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, PACKAGE_FORMAT) != 0)
        die("'%s': \"package\" must be an object with \"format\": \"%s\": re-export the package with clla export", cp, PACKAGE_FORMAT);
    if (!cJSON_IsNumber(ver) || ver->valuedouble != PACKAGE_VERSION)
        die("'%s': package version %g, this build reads version %d: export it again with this clla", cp,
            cJSON_IsNumber(ver) ? ver->valuedouble : -1.0, PACKAGE_VERSION);
    if (!tok || cJSON_IsNull(tok)) return NULL;
    if (!cJSON_IsString(tok) || !tok->valuestring[0] || strchr(tok->valuestring, '/') || !strcmp(tok->valuestring, "..") ||
        !strcmp(tok->valuestring, "."))
        die("'%s': package.tokenizer must be the name of a file inside the package (or null)", cp);
    if (!is_file(dir, tok->valuestring))
        die("package '%s' names tokenizer '%s' but does not hold it: export it again", dir, tok->valuestring);
    return path_join(dir, tok->valuestring);
}

void model_dir_load(ModelDir *md, Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets) {
    memset(md, 0, sizeof(*md));
    check_dir(dir);
    char *cp = path_join(dir, MODEL_DIR_CONFIG);
    char *text;
    cJSON *root = read_config(dir, &text);
    md->kind = kind_of(dir, root);
    md->dir = xstrdup(dir);
    cJSON *cache = NULL;
    if (md->kind == MODEL_DIR_PACKAGE) {
        // the package's own sections are not config keys: take them out before the config reader
        cJSON *pk = cJSON_DetachItemFromObjectCaseSensitive(root, "package");
        cache = cJSON_DetachItemFromObjectCaseSensitive(root, "cache");
        md->tokenizer = read_package(dir, cp, pk);
        cJSON_Delete(pk);
        if (!cJSON_IsObject(cache)) die("'%s': a package needs a \"cache\" object (codec per payload part): export it again", cp);
        char *rest = cJSON_PrintUnformatted(root);
        config_from_json(cfg, rest, cp, n_sets, sets);
        free(rest);
    } else {
        config_from_json(cfg, text, cp, n_sets, sets);   // also reports a config that is not JSON
        if (cfg->train.tokenizer[0]) md->tokenizer = xstrdup(cfg->train.tokenizer);
    }
    cJSON_Delete(root);
    free(text);
    model_build(model, &cfg->model, be);
    model_load(model, dir);   // model.safetensors or its HF shards (model/safetensors.h)
    if (cache) {
        char err[512];
        if (cache_layout_from_json(&md->cache, &cfg->model, cache, err, sizeof(err)) != 0)
            die("'%s': \"cache\": %s", cp, err);
        cJSON_Delete(cache);
    } else {
        cache_layout(&md->cache, &cfg->model);
    }
    free(cp);
}

void model_dir_free(ModelDir *md) {
    cache_layout_free(&md->cache);
    free(md->dir);
    free(md->tokenizer);
    memset(md, 0, sizeof(*md));
}

void model_dir_describe_cache(const CacheLayout *cl, char *buf, size_t n) {
    char spec[64];
    size_t used = 0;
    buf[0] = 0;
    for (int p = 0; p < N_PARTS && used < n; p++)
        if (cl->part[p].present) {
            codec_format(&cl->part[p].codec, spec, sizeof(spec));
            int w = snprintf(buf + used, n - used, "%s%s=%s", used ? " " : "", cache_part_name(p), spec);
            if (w < 0) break;
            used += (size_t)w;
        }
}

cJSON *model_dir_package_json(const Config *cfg, const CacheLayout *cache, const char *dtype, int has_tokenizer) {
    cJSON *o = config_to_json(cfg);
    cJSON_AddItemToObject(o, "cache", cache_layout_to_json(cache));
    cJSON *pk = cJSON_AddObjectToObject(o, "package");
    cJSON_AddStringToObject(pk, "format", PACKAGE_FORMAT);
    cJSON_AddNumberToObject(pk, "version", PACKAGE_VERSION);
    cJSON_AddStringToObject(pk, "dtype", dtype);
    if (has_tokenizer) cJSON_AddStringToObject(pk, "tokenizer", PACKAGE_TOKENIZER);
    else cJSON_AddNullToObject(pk, "tokenizer");
    return o;
}
