// Perplexity through the KV cache (docs/INFERENCE.md): the scored tokens pass through the cache's
// codecs as a served model's would, once as the full-sequence forward with each codec applied
// as its round trip where the cache holds the value, once decoded token by token.
#ifndef CLLA_EVAL_THROUGH_CACHE_H
#define CLLA_EVAL_THROUGH_CACHE_H

#include <stdint.h>

#include "model/cache.h"
#include "model/model.h"

// -log softmax(logits)[target] in double: the loss of one token (also eval/bench.c's scores).
double eval_token_nll(const float *logits, int V, int target);

typedef struct CacheLoss {
    double full_sum;      // sum of token losses, full forward with the codecs' round trips
    double decode_sum;    // the same tokens decoded one at a time through the cache
    long long count;      // scored tokens (targets other than IGNORE_INDEX)
    // what the cache stored, measured from the decoder's blocks at the end of each window
    // (decoder_stream_seq_bytes): bytes per part over all its streams, and the tokens stored
    double stored[N_PARTS];
    long long stored_tokens;
} CacheLoss;

// B windows of T tokens (inputs, targets, as the data loader gives them), with the codecs of
// layout: each window is prefilled with its first token and decoded token by token. Adds into *acc.
// With a codec with a full-precision window (kivi, qjl), which depends on the query's position, the
// "full" pass is each window extended through the cache a block per forward (decoder_extend_all).
void eval_through_cache(Model *m, const CacheLayout *layout, const int32_t *inputs, const int32_t *targets,
                        int B, int T, CacheLoss *acc);

#endif
