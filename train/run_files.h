// The files of a run directory: metrics.jsonl (appended per step), config.json and
// model.safetensors (written atomically at the end).
#ifndef CLLA_TRAIN_RUN_FILES_H
#define CLLA_TRAIN_RUN_FILES_H

#include <stdio.h>

#include "model/config.h"
#include "model/model.h"

typedef struct RunFiles {
    char *dir;
    FILE *metrics;
    unsigned long long shard_bytes;   // the model's shard size (0: one model.safetensors)
} RunFiles;

// Creates dir; opens metrics_path (or dir/metrics.jsonl when empty) for writing.
void run_files_open(RunFiles *rf, const char *dir, const char *metrics_path);
// Resuming at step `resumed_step`: keeps the metrics file's records of steps <= resumed_step
// (a run killed after its last checkpoint logged steps that will now run again) and opens it
// for appending.
void run_files_open_resume(RunFiles *rf, const char *dir, const char *metrics_path, int resumed_step);
// Writes dir/config.json and dir/model.safetensors (or HF shards of rf->shard_bytes each).
// masters: the whole fp32 masters in a backend buffer (model->master unless ZeRO-1 sharded them).
void run_files_save_model(RunFiles *rf, const Config *cfg, Model *model, const float *masters);
// Writes a config.json (model keys + train) atomically; dies on failure.
void write_config_json(const char *path, const Config *cfg);
void run_files_close(RunFiles *rf);
// Opens a saved model directory (config.json + model.safetensors or its HF shards) on a backend.
void load_model_dir(Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets);

#endif
