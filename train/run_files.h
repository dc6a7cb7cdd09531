// The files of a run directory: metrics.jsonl (appended per step), config.json and
// model.safetensors (written atomically at the end), the lock that keeps a second training
// out, and the checks that keep one run from writing over another (docs/CHECKPOINTS.md).
#ifndef CLLA_TRAIN_RUN_FILES_H
#define CLLA_TRAIN_RUN_FILES_H

#include <stddef.h>

#include "model/config.h"
#include "model/model.h"

#define RUN_LOCK_FILE "train.lock"

typedef struct RunFiles {
    char *dir;
    char *metrics_path;
    int metrics_fd;   // -1 when closed
    unsigned long long shard_bytes;   // the model's shard size (0: one model.safetensors)
} RunFiles;

// What a run already wrote into a directory.
typedef struct RunDirContents {
    int model, config, metrics;   // model.safetensors, config.json, the metrics file exist
    int foreign_metrics;          // train.metrics names a file outside dir that no run wrote (no step record first)
    int foreign_config;           // config.json without a model beside it: a run writes them together, so the user's
    int metrics_not_plain;        // the metrics path is a symbolic link, a device or a FIFO
    int checkpoints;              // entries in checkpoints/ (step_*, temporaries, abandoned-*)
    char metrics_elsewhere[512];  // the metrics file's path when train.metrics puts it outside dir, else ""
} RunDirContents;

// The metrics file of a run: metrics_path, or dir/metrics.jsonl when empty (a new string).
char *run_metrics_path(const char *dir, const char *metrics_path);
void run_dir_inspect(const char *dir, const char *metrics_path, RunDirContents *c);
// Dies naming a file in (or named for) the run directory that no run wrote: a train.metrics
// file without step records, or that is a link or a device, a config.json without a model.
// --overwrite never removes those.
void run_dir_refuse_foreign(const RunDirContents *c, const char *dir, const char *metrics_path);
int run_dir_is_empty(const RunDirContents *c);
// "model.safetensors, metrics.jsonl, 3 entries in checkpoints/" for messages.
void run_dir_describe(const RunDirContents *c, char *buf, size_t len);
// --overwrite: removes what a run writes (config.json, model.safetensors, the metrics file and
// the checkpoints/ tree); other files in dir are left alone. Dies naming what it cannot remove.
// keep_model: config.json and the weights stay (the caller has just written new ones in their
// place: an earlier run is not removed before its replacement is safely written).
void run_dir_clear(const char *dir, const char *metrics_path, int keep_model);
// The paths of dir's final model as they are there (config.json, model.safetensors, or the shard
// index and its model-NNNNN-of-NNNNN.safetensors files), NULL-terminated, for moving them aside
// with an abandoned timeline. The caller frees each path and the array.
char **run_final_model_files(const char *dir);
// The check run_dir_clear makes first, for a caller with a step to take before it (init writes
// the new model, then clears): dies naming the first directory from which a removal would fail.
void run_dir_check_clearable(const char *dir, const char *metrics_path);
// Removes the temporaries of the run's own files that a killed process left in dir (its final
// model's, config.json's, metrics.jsonl's "<name>.tmp.<pid>", a sharded save's parts): only
// while holding the run's lock, when no other process can be writing them. Returns how many,
// the first one's name in first.
int run_dir_remove_temporaries(const char *dir, char *first, size_t first_len);

// Creates dir (as mkdir -p) and takes its lock file dir/train.lock: an exclusive flock() on it,
// so a lock whose holder died (even by SIGKILL) is free again, and the holder's pid written
// into it for the message a second training gets. Dies when a live process holds it; says so
// when it takes over a lock a dead process left. Released at exit (atexit), also after die();
// a directory this call created is removed again at exit when the run left it empty.
void run_lock_acquire(const char *dir);

// Creates dir; opens metrics_path (or dir/metrics.jsonl when empty), empty, for appending.
void run_files_open(RunFiles *rf, const char *dir, const char *metrics_path);
// Dies when the run's metrics file (train.metrics, or dir/metrics.jsonl) is being written by a
// running training (which holds it locked from run_files_open to exit): called before
// --overwrite removes it or a resume rewrites it.
void run_metrics_check_free(const char *dir, const char *metrics_path);
// Resuming at step `resumed_step`: keeps the metrics file's records of steps <= resumed_step
// (a run killed after its last checkpoint logged steps that will now run again) and opens it
// for appending.
void run_files_open_resume(RunFiles *rf, const char *dir, const char *metrics_path, int resumed_step);
// Writes dir/config.json and dir/model.safetensors (or HF shards of rf->shard_bytes each),
// each atomically. Refuses (dies) when a weight is not finite: a diverged model is never written
// as the final one. A failed write dies naming the file, the cause and last_good (the
// checkpoint to continue from; NULL: none).
// masters: the whole fp32 masters in a backend buffer (model->master unless ZeRO-1 sharded them).
void run_files_save_model(RunFiles *rf, const Config *cfg, Model *model, const float *masters, const char *last_good);
// 1 when dir holds the final model of a run that ended at `step`: its weights and a config.json
// whose train.max_steps is that step (run_files_save_model writes the weights, then the config;
// a run that failed or was killed in between, or before, left the config of an earlier end or
// none). 0 otherwise: a resumed run at that step writes them again from its checkpoint.
int run_final_model_current(const char *dir, int step);
// 1 when every element of the whole fp32 masters (backend buffer) is finite; else 0 with the
// first bad element's index in *bad.
int model_masters_finite(Model *model, const float *masters, size_t *bad);
// Writes a config.json (model keys + train) atomically; -1 with one line in err on failure.
int write_config_json_checked(const char *path, const Config *cfg, char *err, size_t errlen);
void run_files_close(RunFiles *rf);
// Opens a saved model directory (config.json + model.safetensors or its HF shards) on a backend.
void load_model_dir(Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets);

#endif
