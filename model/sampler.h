// Next-token sampling over a row of logits (docs/INFERENCE.md, "Sampling"): temperature, then
// top-k, then top-p, then one draw from an explicit RNG state (common/rng.h), so a seed
// repeats its tokens exactly. Greedy (temperature 0, or top_k 1) is the argmax, ties to the
// lower id.
#ifndef CLLA_MODEL_SAMPLER_H
#define CLLA_MODEL_SAMPLER_H

#include <stddef.h>

#include "common/rng.h"

typedef struct SamplerParams {
    float temperature;   // 0: greedy; > 0: softmax(logits / temperature)
    int top_k;           // 0: off; else keep the k largest logits (ties: lower ids first)
    double top_p;        // in (0, 1]; 1: off; else keep the smallest prefix (by probability,
                         // descending) whose mass is >= top_p (within 1e-9 of it: 0.07 of 100
                         // equal tokens is 7 of them, though 0.07 x 100 is 7.000000000000001)
} SamplerParams;

// 0 when every setting is in range; else -1 with one line in err naming the setting.
int sampler_check(const SamplerParams *p, char *err, size_t errlen);

typedef struct Sampler {
    SamplerParams p;
    int V;
    // scratch, V entries each
    float *logit;
    int *id;
    double *w;
} Sampler;

// A sampler for rows of V logits (the settings must pass sampler_check).
void sampler_init(Sampler *s, const SamplerParams *p, int V);
void sampler_free(Sampler *s);
// The next token from logits[0, V). rng is used only when sampling (not greedy), one draw
// per call. Non-finite logits are never chosen; -1 when none is finite (the caller reports it:
// a model whose outputs are all NaN has no next token, and id 0 would pass for one).
int sampler_next(Sampler *s, const float *logits, Rng *rng);
// The argmax, ties to the lower id (non-finite logits skipped; -1 when none is finite).
int sampler_argmax(const float *logits, int V);

#endif
