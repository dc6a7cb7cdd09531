// Hugging Face config.json keys that are not clla knobs (model/config_hf.c), and the
// "did you mean" for a misspelled key.
#ifndef CLLA_MODEL_CONFIG_HF_H
#define CLLA_MODEL_CONFIG_HF_H

#include <stddef.h>

#include <cjson/cJSON.h>

// item is a top-level key of root that is not a clla key. Returns 1 when it is an HF key whose
// value does not change the model here (the caller lists it as ignored), 0 when clla does not
// know it. Dies naming the key when its value asks for something clla does not implement
// (rope_scaling, attention_bias true, an active sliding window, ...).
int config_hf_key(const cJSON *root, const cJSON *item, const char *origin);

// The candidate closest to name by edit distance, when it is close enough to be a typo; else NULL.
const char *config_closest(const char *name, const char *const *cands, size_t n);

#endif
