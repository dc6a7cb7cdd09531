// One loader for run directories, checkpoints and inference packages (model/model_dir.h).
#include "model/model_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "model/safetensors.h"

static int is_file(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    struct stat sb;
    int ok = stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return ok;
}

// config.json at path, parsed strictly (common/json_strict.h) as every config a user writes:
// a package's sections are read from this tree and its config keys too, so nothing of the file
// goes through a lenient parse. Dies naming the problem when it is not one JSON object.
static cJSON *parse_config_file(const char *path) {
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) die("cannot read '%s': %s: pass a run directory, a checkpoint directory or a package", path, strerror(errno));
    cJSON *root = config_parse(text, len, path);
    free(text);
    return root;
}

static cJSON *read_config(const char *dir) {
    char *cp = path_join(dir, MODEL_DIR_CONFIG);
    cJSON *root = parse_config_file(cp);
    free(cp);
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
    cJSON *root = read_config(dir);
    ModelDirKind k = kind_of(dir, root);
    cJSON_Delete(root);
    return k;
}

const char *model_dir_kind_name(ModelDirKind k) {
    return k == MODEL_DIR_PACKAGE ? "package" : k == MODEL_DIR_CHECKPOINT ? "checkpoint" : "run directory";
}

// The "package" object: format, version, dtype (into *dtype: ST_F32, ST_BF16, or -1 when absent)
// and the tokenizer file name (a plain name inside the package, or null). Returns the tokenizer
// path or NULL.
static char *read_package(const char *dir, const char *cp, const cJSON *pk, int *dtype) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(pk, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(pk, "version");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(pk, "tokenizer");
    if (!cJSON_IsObject(pk) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, PACKAGE_FORMAT) != 0)
        die("'%s': \"package\" must be an object with \"format\": \"%s\": re-export the package with clla export", cp, PACKAGE_FORMAT);
    if (!cJSON_IsNumber(ver))
        die("'%s': package.version must be a number (this build reads version %d): export it again with this clla", cp, PACKAGE_VERSION);
    if (ver->valuedouble != PACKAGE_VERSION)
        die("'%s': package version %g, this build reads version %d: export it again with this clla", cp, ver->valuedouble,
            PACKAGE_VERSION);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(pk, "dtype");
    if (dt && !(cJSON_IsString(dt) && (!strcmp(dt->valuestring, "fp32") || !strcmp(dt->valuestring, "bf16"))))
        die("'%s': package.dtype must be \"fp32\" or \"bf16\" (what clla export writes): export it again", cp);
    *dtype = !dt ? -1 : !strcmp(dt->valuestring, "bf16") ? ST_BF16 : ST_F32;
    if (!tok || cJSON_IsNull(tok)) return NULL;
    if (!cJSON_IsString(tok) || !tok->valuestring[0] || strchr(tok->valuestring, '/') || !strcmp(tok->valuestring, "..") ||
        !strcmp(tok->valuestring, "."))
        die("'%s': package.tokenizer must be the name of a file inside the package (or null)", cp);
    if (!is_file(dir, tok->valuestring))
        die("package '%s' names tokenizer '%s' but does not hold it: export it again", dir, tok->valuestring);
    return path_join(dir, tok->valuestring);
}

// package.dtype names how clla export stored the weights: every tensor of the package's files so
// (weights stored otherwise load the same, but the package says something false about itself).
static void check_package_dtype(const char *dir, const char *cp, int dtype) {
    StSet s;
    char err[512];
    if (st_set_open(&s, dir, err, sizeof(err)) != 0) die("'%s': %s", dir, err);
    for (int r = 0; r < s.n; r++) {
        const StEntry *e = st_set_entry(&s, r);
        if (e->dtype != dtype)
            die("'%s': package.dtype is \"%s\" but tensor '%s' is stored as %s: the config and the weights are not one export",
                cp, dtype == ST_BF16 ? "bf16" : "fp32", e->name, st_dtype_name(e->dtype));
    }
    st_set_close(&s);
}

// A fitted state's tensor name: layers.<layer>.<part>.<codec>
static void fit_name(const CacheLayout *cl, int s, char *buf, size_t n) {
    const CacheStream *st = &cl->streams[s];
    snprintf(buf, n, "layers.%d.%s.%s", st->layer, cache_part_name(st->part), codec_name(&cl->part[st->part].codec));
}

// The settings a fitted state belongs to: the codec's spec without iters (which only shaped the
// fitting), recorded beside each tensor in the file's __metadata__ and compared on load, where a
// setting edited in config.json that keeps the tensor's shape (qet's k1 and k2 swapped, levels,
// kvquant's outliers) had been served with tables fitted for another.
static void fit_spec(const Codec *c, char *buf, size_t n) {
    Codec d = *c;
    d.iters = 0;
    codec_format(&d, buf, n);
    char *it = strstr(buf, ",iters=0");   // said without it
    if (it) memmove(it, it + 8, strlen(it + 8) + 1);
}

int model_dir_save_cache_fits(const CacheLayout *cl, const char *path, char *err, size_t errlen) {
    if (!cl->fit) return 0;
    StTensor *t = xcalloc((size_t)cl->n_streams, sizeof(StTensor));
    char (*names)[96] = xcalloc((size_t)cl->n_streams, sizeof(*names));
    float **bufs = xcalloc((size_t)cl->n_streams, sizeof(float *));
    cJSON *meta = cJSON_CreateObject();   // each tensor's codec: what it was fitted for
    int n = 0;
    for (int s = 0; s < cl->n_streams; s++) {
        if (!cl->fit[s]) continue;
        const Codec *c = &cl->part[cl->streams[s].part].codec;
        const CodecTraits *tr = codec_traits(c->kind);
        int W = cl->part[cl->streams[s].part].width;
        fit_name(cl, s, names[n], sizeof(names[n]));
        t[n].name = names[n];
        t[n].ndim = tr->fit_shape(c, W, t[n].shape);
        bufs[n] = xmalloc((size_t)codec_fit_elements(c, W) * sizeof(float));
        tr->fit_save(c, W, cl->fit[s], bufs[n]);
        t[n].data = bufs[n];
        char spec[160];
        fit_spec(c, spec, sizeof(spec));
        cJSON_AddStringToObject(meta, names[n], spec);
        n++;
    }
    char *meta_text = cJSON_PrintUnformatted(meta);
    cJSON_Delete(meta);
    int rc = n ? st_save(path, OUT_REPLACE, t, n, ST_F32, meta_text, err, errlen) : 0;
    cJSON_free(meta_text);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(names);
    free(t);
    return rc;
}

// The fitted states a package's codecs need, from dir/PACKAGE_CACHE_CODECS: every tensor named,
// of the shape the codec's settings give, and nothing else. Dies with one line otherwise.
static void load_cache_fits(CacheLayout *cl, const char *dir) {
    int needed = 0;
    for (int s = 0; s < cl->n_streams; s++) needed += codec_needs_fit(&cl->part[cl->streams[s].part].codec);
    int present = is_file(dir, PACKAGE_CACHE_CODECS);
    if (!needed) {
        if (present)
            die("package '%s' holds %s but its \"cache\" section names no codec with fitted state: remove the file or export again",
                dir, PACKAGE_CACHE_CODECS);
        return;
    }
    char *path = path_join(dir, PACKAGE_CACHE_CODECS), err[512];
    if (!present) die("package '%s' names a fitted cache codec but holds no %s: calibrate it again (clla calibrate)", dir, PACKAGE_CACHE_CODECS);
    StFile sf;
    if (st_open(&sf, path, err, sizeof(err)) != 0) die("'%s': %s", path, err);
    // written since 2026-11-28: each tensor's codec settings (earlier files have none: not compared)
    cJSON *meta = sf.metadata_json ? cJSON_Parse(sf.metadata_json) : NULL;
    int used = 0;
    for (int s = 0; s < cl->n_streams; s++) {
        const Codec *c = &cl->part[cl->streams[s].part].codec;
        if (!codec_needs_fit(c)) continue;
        const CodecTraits *tr = codec_traits(c->kind);
        int W = cl->part[cl->streams[s].part].width;
        char name[96];
        fit_name(cl, s, name, sizeof(name));
        int i = st_find(&sf, name);
        if (i < 0) die("'%s' lacks tensor '%s' (the %s codebooks of layer %d): calibrate the package again", path, name,
                       cache_part_name(cl->streams[s].part), cl->streams[s].layer);
        int64_t shape[ST_MAX_DIMS];
        int rank = tr->fit_shape(c, W, shape);
        int same = sf.e[i].ndim == rank;
        for (int d = 0; same && d < rank; d++) same = sf.e[i].shape[d] == shape[d];
        if (!same) {
            char want[96] = "", got[96] = "";
            for (int d = 0; d < rank; d++) snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld", d ? ", " : "", (long long)shape[d]);
            for (int d = 0; d < sf.e[i].ndim && d < ST_MAX_DIMS; d++)
                snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", d ? ", " : "", (long long)sf.e[i].shape[d]);
            die("'%s': tensor '%s' has shape [%s], but the codec %s of part %s (width %d) needs [%s]: calibrate the package again",
                path, name, got, codec_name(c), cache_part_name(cl->streams[s].part), W, want);
        }
        const cJSON *fitted_for = cJSON_GetObjectItemCaseSensitive(meta, name);
        char spec[160];
        fit_spec(c, spec, sizeof(spec));
        if (cJSON_IsString(fitted_for) && strcmp(fitted_for->valuestring, spec))
            die("'%s': tensor '%s' was fitted for %s, but the package's \"cache\" section names %s for part %s: restore the "
                "settings, or calibrate the package again", path, name, fitted_for->valuestring, spec, cache_part_name(cl->streams[s].part));
        float *buf = xmalloc((size_t)codec_fit_elements(c, W) * sizeof(float));
        if (st_read_f32(&sf, i, buf, err, sizeof(err)) != 0) die("'%s': tensor '%s': %s", path, name, err);
        void *state = NULL;
        if (tr->fit_load(c, W, buf, &state, err, sizeof(err)) != 0) die("'%s': tensor '%s': %s", path, name, err);
        free(buf);
        cache_layout_set_fit(cl, s, state);
        used++;
    }
    cJSON_Delete(meta);
    if (used != sf.n) die("'%s' holds %d tensors where the package's cache codecs use %d: calibrate the package again", path, sf.n, used);
    st_close(&sf);
    free(path);
}

void model_dir_read_config(Config *cfg, const char *config_path) {
    cJSON *root = parse_config_file(config_path);
    if (cJSON_GetObjectItemCaseSensitive(root, "package")) {
        // a package's own sections are not config keys
        cJSON_DeleteItemFromObjectCaseSensitive(root, "package");
        cJSON_DeleteItemFromObjectCaseSensitive(root, "cache");
    }
    config_from_object(cfg, root, config_path, 0, NULL);
    cJSON_Delete(root);
}

void model_dir_load(ModelDir *md, Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets) {
    memset(md, 0, sizeof(*md));
    check_dir(dir);
    char *cp = path_join(dir, MODEL_DIR_CONFIG);
    cJSON *root = read_config(dir);
    md->kind = kind_of(dir, root);
    md->dir = xstrdup(dir);
    cJSON *cache = NULL;
    int package_dtype = -1;
    if (md->kind == MODEL_DIR_PACKAGE) {
        // the package's own sections are not config keys: take them out before the config reader
        cJSON *pk = cJSON_DetachItemFromObjectCaseSensitive(root, "package");
        cache = cJSON_DetachItemFromObjectCaseSensitive(root, "cache");
        md->tokenizer = read_package(dir, cp, pk, &package_dtype);
        cJSON_Delete(pk);
        if (!cJSON_IsObject(cache)) die("'%s': a package needs a \"cache\" object (codec per payload part): export it again", cp);
    }
    config_from_object(cfg, root, cp, n_sets, sets);
    if (md->kind != MODEL_DIR_PACKAGE && cfg->train.tokenizer[0]) md->tokenizer = xstrdup(cfg->train.tokenizer);
    cJSON_Delete(root);
    model_build(model, &cfg->model, be);
    model_load(model, dir);   // model.safetensors or its HF shards (model/safetensors.h)
    if (package_dtype >= 0) check_package_dtype(dir, cp, package_dtype);
    if (cache) {
        char err[512];
        if (cache_layout_from_json(&md->cache, &cfg->model, cache, err, sizeof(err)) != 0)
            die("'%s': \"cache\": %s", cp, err);
        cJSON_Delete(cache);
        load_cache_fits(&md->cache, dir);
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
    char spec[160];
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
