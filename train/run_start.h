// Where a training starts, decided before it writes anything: which checkpoint it continues
// from, whether the run directory may be used, and which tokenizer its data must come from
// (docs/CHECKPOINTS.md, "Run directories").
#ifndef CLLA_TRAIN_RUN_START_H
#define CLLA_TRAIN_RUN_START_H

#include <stddef.h>

#include "model/config.h"

// Rank 0, holding the run directory's lock: the checkpoint this run continues from in ckpt
// ("" for step 0), for --resume auto|DIR (resume NULL: a new run). Dies with one line on what
// would overwrite or mix another run's files: a new run into a directory holding one (unless
// overwrite), a finished run without a checkpoint to continue from, every checkpoint damaged,
// a foreign checkpoint into a non-empty directory. Returns 1 when --overwrite must clear the
// directory: the caller does it once the data and the model have checked out, so a refused
// start costs nothing.
int run_start_choose(const TrainConfig *tc, const char *resume, int overwrite, char *ckpt, size_t ckpt_len);

// The config.json of the model train.init_from names: inside it when it is a directory, beside
// it when a weights file or an index (a new string), or NULL when there is none.
char *run_start_init_config_path(const TrainConfig *tc);
// Warns naming every model key in which that config.json differs from cfg (rope_theta,
// rms_norm_eps, ...: the weights are used with cfg's values).
void run_start_compare_init_config(const Config *cfg);

// The tokenizer hash the run's data must have (0: not known): train.tokenizer_hash (set by a
// resumed checkpoint's config or by the user), else the one recorded in the config.json beside
// train.init_from. from names where it came from, for the message.
unsigned long long run_start_tokenizer_hash(const TrainConfig *tc, char *from, size_t from_len);

#endif
