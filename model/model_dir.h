// Reading a model directory, whichever kind it is (docs/INFERENCE.md, "Model directories"):
//  - a run directory or `clla init` output: config.json (model keys + "train") and
//    model.safetensors (fp32);
//  - a checkpoint, <run>/checkpoints/step_N: the same pair plus state.json and the optimizer;
//  - an inference package (`clla export`): config.json with a "package" object (format,
//    tokenizer file) and a "cache" object (codec per payload part), model.safetensors in
//    fp32 or bf16, and the tokenizer file.
// One loader for all three, so `generate`, `export` and `eval` read them alike.
#ifndef CLLA_MODEL_MODEL_DIR_H
#define CLLA_MODEL_MODEL_DIR_H

#include <cjson/cJSON.h>

#include "model/cache.h"
#include "model/config.h"
#include "model/model.h"

#define PACKAGE_FORMAT "clla-package"
#define PACKAGE_VERSION 1
#define MODEL_DIR_CONFIG "config.json"
#define MODEL_DIR_WEIGHTS "model.safetensors"
#define PACKAGE_TOKENIZER "tokenizer.tok"
// The fitted states of the cache codecs that have them (cq's codebooks), one fp32 tensor per
// stream named layers.<layer>.<part>.<codec> (docs/FORMATS.md)
#define PACKAGE_CACHE_CODECS "cache_codecs.safetensors"

typedef enum { MODEL_DIR_RUN = 0, MODEL_DIR_CHECKPOINT, MODEL_DIR_PACKAGE } ModelDirKind;

typedef struct ModelDir {
    ModelDirKind kind;
    char *dir;
    // The tokenizer file: the package's own, or the run's train.tokenizer as written in its
    // config (NULL when neither names one). Not opened here: the caller decides.
    char *tokenizer;
    // The cache layout to serve with: the package's "cache" section, else the training-time
    // layout of the config (cache_layout()).
    CacheLayout cache;
} ModelDir;

// Which kind dir is, from its files (dies with one line when it is none of them).
ModelDirKind model_dir_kind(const char *dir);
const char *model_dir_kind_name(ModelDirKind k);
// Reads config (with --set overrides), builds the model on be and loads the weights.
// Dies with one line on any problem: a missing file, a config the weights do not fit,
// a bad "cache" or "package" section.
void model_dir_load(ModelDir *md, Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets);
void model_dir_free(ModelDir *md);
// The config in a model directory's config.json at config_path, without the weights: a run's or a
// checkpoint's as config_load reads it, a package's with its "package" and "cache" sections taken
// out first (train.init_from may name a package; the config reader refuses those sections).
void model_dir_read_config(Config *cfg, const char *config_path);

// The layout's fitted states into path (PACKAGE_CACHE_CODECS); 0, or -1 with err. Nothing to
// write (no fitted codec) is 0 with no file.
int model_dir_save_cache_fits(const CacheLayout *cl, const char *path, char *err, size_t errlen);

// "part=codec" for every present part of the layout, space-separated (for messages).
void model_dir_describe_cache(const CacheLayout *cl, char *buf, size_t n);

// The config.json object of a package: the whole config (model keys + "train", kept as the
// record of how the model was trained), "cache" from the layout and "package":
// {"format", "version", "dtype", "tokenizer" (file name in the package, or null)}.
cJSON *model_dir_package_json(const Config *cfg, const CacheLayout *cache, const char *dtype, int has_tokenizer);

#endif
