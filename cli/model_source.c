#include "cli/model_source.h"

#include "common/util.h"
#include "model/model_dir.h"
#include "train/checkpoint.h"

void model_source_check(const char *dir) {
    char err[1024];
    if (model_dir_kind(dir) == MODEL_DIR_CHECKPOINT && ckpt_validate(dir, err, sizeof(err)) != 0)
        die("checkpoint '%s' is damaged: %s", dir, err);
}

void model_source_load(ModelDir *md, Model *model, Config *cfg, const char *dir, const Backend *be) {
    model_source_check(dir);
    model_dir_load(md, model, cfg, dir, be, 0, NULL);
}
