// The model directory a command reads (generate, eval, export, calibrate, debug-step): a run
// directory, a checkpoint or a package (model/model_dir.h). A checkpoint is first checked
// against its state.json's sizes and checksums (train/checkpoint.c), so that every command
// refuses a damaged one in the same line instead of some of them computing with it.
#ifndef CLLA_CLI_MODEL_SOURCE_H
#define CLLA_CLI_MODEL_SOURCE_H

#include "backend/backend.h"
#include "model/model_dir.h"

// Dies with one line when dir is a checkpoint whose files do not match its state.json.
void model_source_check(const char *dir);
// model_source_check, then model_dir_load (no --set overrides).
void model_source_load(ModelDir *md, Model *model, Config *cfg, const char *dir, const Backend *be);

#endif
