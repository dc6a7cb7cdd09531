#include "cli/model_source.h"

#include <sys/stat.h>

#include "common/util.h"
#include "model/model_dir.h"
#include "train/checkpoint.h"

void model_source_check(const char *dir) {
    char err[1024];
    if (model_dir_kind(dir) == MODEL_DIR_CHECKPOINT && ckpt_validate(dir, err, sizeof(err)) != 0) {
        // a checkpoint a running training pruned (--keep) while it was read is gone, not damaged
        struct stat sb;
        if (stat(dir, &sb) != 0)
            die("checkpoint '%s' was removed while it was read (a training keeping only its newest checkpoints pruned it): "
                "pass a newer one, or the run directory",
                dir);
        die("checkpoint '%s' is damaged: %s", dir, err);
    }
}

void model_source_load(ModelDir *md, Model *model, Config *cfg, const char *dir, const Backend *be) {
    model_source_check(dir);
    model_dir_load(md, model, cfg, dir, be, 0, NULL);
}
