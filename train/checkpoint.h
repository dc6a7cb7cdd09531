// Checkpoints (docs/DESIGN.md section 4, docs/CHECKPOINTS.md): one directory per step under
// <run>/checkpoints/, holding config.json, model.safetensors (fp32 masters),
// optimizer.rank<r>.safetensors (AdamW m and v) and state.json (step, schedule, RNG seeds,
// data position, skip counters, size and FNV-1a 64 checksum of every other file).
//
// A checkpoint is written into <run>/checkpoints/.tmp.step_NNNNNNNN.<pid>, every file and
// the directory are fsynced, and only then is it renamed to step_NNNNNNNN: a step_* directory
// that exists is complete. Leftover .tmp.* directories (a killed save) are never read and
// are removed by the next save once their writer is gone.
#ifndef CLLA_TRAIN_CHECKPOINT_H
#define CLLA_TRAIN_CHECKPOINT_H

#include <stddef.h>

#include "data/loader.h"
#include "model/config.h"
#include "model/model.h"
#include "train/dist.h"
#include "train/optimizer.h"

#define CKPT_SUBDIR "checkpoints"
#define CKPT_STATE_VERSION 1

// Everything besides weights and moments that the training loop needs to continue exactly.
typedef struct TrainState {
    int step;                      // completed optimizer steps = schedule position (next lr: lr_at(step))
    int consecutive_skips;         // non-finite steps in a row at the time of saving
    long long skipped_total;       // non-finite steps skipped over the whole run
    long long tokens;              // training tokens consumed
    unsigned long long seed;       // train.seed the run started with (init, shuffling, bf16 rounding)
    LoaderState data;              // position of the training loader before the next batch
    int saved_world;               // ckpt_load: ranks that wrote the checkpoint
    int saved_zero;                // ckpt_load: 1 when their AdamW state was sharded (ZeRO-1)
} TrainState;

// Writes a checkpoint of step st->step into <run_dir>/checkpoints/. On success returns 0 and
// the final directory in path (pathlen bytes). On failure (disk full, file-size limit,
// permissions) returns -1 with one line in err; nothing is left behind and existing
// checkpoints are untouched.
// Data parallel (dist not NULL, world > 1): every rank calls it, and every rank gets the same
// result. Rank 0 writes config, model and state.json; an optimizer covering the whole model
// (no ZeRO: the ranks hold identical copies) is written once by rank 0, a ZeRO-1 shard by each
// rank as optimizer.rank<r>.safetensors (flat slices "exp_avg"/"exp_avg_sq" of the fp32
// layout, metadata lo/hi). The run directory must be on a file system all ranks share.
// masters: every fp32 master in one backend buffer laid out like the fp32 table (model->master,
// or grad_sync_full_masters() where ZeRO-1 sharded them); rank 0 reads it.
int ckpt_save(const char *run_dir, const Config *cfg, Model *model, const float *masters, const AdamW *opt,
              const TrainState *st, Dist *dist, char *path, size_t pathlen, char *err, size_t errlen);

// The newest checkpoint of run_dir that validates (ckpt_validate); newer ones that do not are
// reported with warn() and skipped. Returns 0 with the directory in path, -1 when there is no
// step_* directory at all, or -2 when there are some and none validates (err then names the
// newest one and its damage, and how many there are).
int ckpt_find_newest(const char *run_dir, char *path, size_t pathlen, char *err, size_t errlen);

// One timeline per run: moves every step_* directory of run_dir with a step after `step`, and
// when there is any, the files named in `extra` too (paths, NULL-terminated; those that do not
// exist are skipped), into run_dir/checkpoints/abandoned-<UTC time>/ (never read by --resume). Returns how many it moved,
// with that directory in moved_to, or -1 with err.
int ckpt_abandon_after(const char *run_dir, int step, const char *const *extra, char *moved_to, size_t moved_len,
                       char *err, size_t errlen);

// Keeps the newest `keep` step_* directories of run_dir and removes the rest (keep <= 0:
// keeps all). Also removes .tmp.* directories of writers that are no longer running.
// Returns the number removed, or -1 with err.
int ckpt_prune(const char *run_dir, int keep, char *err, size_t errlen);

// Checks a checkpoint directory without loading weights: state.json well formed with every
// field, and every listed file present with the recorded size and checksum.
// Returns 0, or -1 with one line in err.
int ckpt_validate(const char *dir, char *err, size_t errlen);

// Reads the checkpoint's config.json (dies with one line on error).
void ckpt_read_config(const char *dir, Config *saved);

// The resume rules: a model key that differs between the checkpoint and the current config
// is refused (dies naming the key); each differing run setting ("train.*") is printed on
// stderr and the current value is used. Returns the number of differing run settings.
int ckpt_compare_config(const Config *saved, const Config *cur, const char *dir);

// A checkpoint directory's identity (device and inode). A resume reads its files by name, one
// after another; a directory replaced meanwhile (a resume of the same run from an earlier step
// moves it aside and saves a new one under its name) would give weights of one checkpoint and
// moments of the other. The resume takes the identity before its first read (ckpt_identity) and
// compares it after its last (ckpt_check_same: dies with one line when it changed).
typedef struct CkptId {
    unsigned long long dev, ino;
} CkptId;
void ckpt_identity(const char *dir, CkptId *id);
void ckpt_check_same(const char *dir, const CkptId *id);

// Loads a validated checkpoint into a model and optimizer built from the same model config:
// fp32 masters, m, v, t and the TrainState. Dies with one line on any problem.
// The optimizer may cover a different range than the one saved (another number of ranks, or
// ZeRO on/off): the saved moments are assembled into the whole flat layout (every rank reads
// every optimizer file) and opt's range [lo, hi) is taken from it; so are sharded masters'.
void ckpt_load(const char *dir, Model *model, AdamW *opt, TrainState *st);

#endif
