// KV-cache bytes per token, counted from what the cache layer stores for a config:
// per producing layer K and V per kv-head (MHA/GQA/CLA), or the latent plus k_rope
// (MLA/CLLA; consumers that keep their own k_rope store it too), quantization scales
// included. Storage is bf16 except a quantized latent (b-bit codes + one bf16 scale per group).
#ifndef CLLA_MODEL_CACHE_BYTES_H
#define CLLA_MODEL_CACHE_BYTES_H

#include "model/config.h"

typedef struct CacheBytes {
    double total;            // bytes per token, whole model, everything stored
    double per_layer;        // total / num_hidden_layers
    double paper_elements;   // the paper's Table 4 way: cached elements per token per layer,
                             // without k_rope of consumers and without scales (see docs/CACHE.md)
    double mha_total;        // the same model with plain MHA, bf16 (for ratios)
} CacheBytes;

void cache_bytes_per_token(const ModelConfig *m, CacheBytes *out);

#endif
