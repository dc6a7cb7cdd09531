// Sliding-window perplexity of one token sequence (`clla eval --ppl`, docs/COMMANDS.md), as the
// usual perplexity scripts compute it (Hugging Face's "perplexity of fixed-length models"):
// windows of up to T inputs start every `stride` tokens; each window scores only the targets no
// earlier window scored (in all windows but the first, the first T - stride positions are
// context only); the last window ends at the last token. Every token but the first is scored
// exactly once. stride = T: windows that do not overlap (each token sees only its own window);
// smaller strides give every scored token at least T - stride tokens of context, for T / stride
// times the compute.
#ifndef CLLA_EVAL_PERPLEXITY_H
#define CLLA_EVAL_PERPLEXITY_H

#include <stdint.h>

#include "eval/evaluate.h"
#include "eval/through_cache.h"
#include "model/model.h"

// The windows of n tokens for T and stride (1 <= stride <= T): how many there are.
long long ppl_num_windows(long long n, int T, int stride);
// Scores ids[0, n) (n >= 2) in batches of B full windows (the last, shorter window alone).
// r.windows counts windows, r.tokens the scored targets (n - 1). The model's batch shape is
// restored afterwards when it had one.
EvalResult eval_strided(Model *model, const int32_t *ids, long long n, int B, int T, int stride, EvalProgress progress, void *ctx);
// The same windows scored through the KV cache with the codecs of layout (eval/through_cache.h):
// every batch's full pass and token-by-token decode add into *acc (zeroed by the caller); r.loss is
// the full pass's, acc->decode_sum / acc->count the decoded one's.
EvalResult eval_strided_cache(Model *model, const CacheLayout *layout, const int32_t *ids, long long n, int B, int T, int stride,
                              EvalProgress progress, void *ctx, CacheLoss *acc);

#endif
