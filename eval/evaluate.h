// The one evaluation of a model on token data, used by training-time validation
// (train/cmd_train.c) and by `clla eval` (eval/cmd_eval.c), so that the same settings score
// the same windows and give the same number (docs/COMMANDS.md, "Which windows are scored").
//
// Windows: the data's windows of T+1 tokens (docs/FORMAT.md) in the loader's order for a
// seed: a token file's consecutive windows; shards' windows in the epoch-0 shuffle of that
// seed. The first max_windows of them (0: all) are scored in batches of B rows; the last
// batch may be partial, so data smaller than one batch is scored whole.
#ifndef CLLA_EVAL_EVALUATE_H
#define CLLA_EVAL_EVALUATE_H

#include "data/loader.h"
#include "model/model.h"

typedef struct EvalResult {
    double loss;           // mean next-token loss over every scored target (NaN when the model gives NaN)
    long long tokens;      // targets scored
    long long windows;     // windows (rows) scored
    long long batches;     // forwards run (the last may be partial)
    int failed;            // a damaged data chunk stopped it: err says which (the numbers are partial)
    char err[512];
} EvalResult;

// Opens data for evaluate(): one window per loader step, so every window can be reached.
// tokenizer_hash: shards made with another tokenizer are refused (0: not checked).
DataLoader *eval_open(const char *path, int T, unsigned long long seed, int vocab_size,
                      unsigned long long tokenizer_hash);
// Windows the data holds (for T of eval_open).
long long eval_num_windows(const DataLoader *dl);

// Called after each batch with the windows scored so far (NULL: none).
typedef void (*EvalProgress)(long long done, long long total, void *ctx);

// The windows evaluate() scores, batch by batch: fn(in, tg, rows, fctx) with rows (B or fewer
// for the last) windows of T inputs and targets. Counts batches and windows into *r; -1 (and
// r->failed, r->err) when a damaged data chunk stopped it.
typedef void (*EvalBatchFn)(const int32_t *in, const int32_t *tg, int rows, void *ctx);
int eval_for_each_batch(DataLoader *dl, int B, int T, long long max_windows, EvalBatchFn fn, void *fctx,
                        EvalProgress progress, void *pctx, EvalResult *r);

// Scores the first max_windows windows (0 or more than there are: all) in batches of B rows.
// The model's batch shape is restored afterwards when it had one.
EvalResult evaluate(Model *model, DataLoader *dl, int B, int T, long long max_windows, EvalProgress progress, void *ctx);

#endif
