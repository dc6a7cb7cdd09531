// Writing an inference package (docs/INFERENCE.md, "clla export"), shared by clla export and
// clla calibrate: config.json with "cache" and "package" sections, model.safetensors in fp32 or
// bf16, the tokenizer, and cache_codecs.safetensors when a cache codec has fitted state.
// Everything is checked before anything is written; the package is built in PACKAGE.tmp.<pid>
// and renamed into place, and any failure removes the temporary, so PACKAGE is either complete
// or absent.
#ifndef CLLA_CLI_PACKAGE_OUT_H
#define CLLA_CLI_PACKAGE_OUT_H

#include <stddef.h>

#include "model/cache.h"
#include "model/config.h"
#include "model/model.h"

typedef struct PackageOut {
    char *out;        // the package directory, trailing slashes removed
    int exists;       // it exists and will be replaced (--overwrite)
    char *tok_text;   // the tokenizer file to include, NULL for none
    size_t tok_len;
    long long eot_id; // its <|endoftext|>, written as HF's bos/eos_token_id; -1: none
} PackageOut;

// The model a package is made from: a checkpoint is validated first; loaded on the CPU; the
// --cache-codec specs applied in order over its layout (md->cache). Dies with one line.
struct ModelDir;
void package_load_source(struct ModelDir *md, Model *model, Config *cfg, const char *src, const char *const *specs, int n_specs);

// Before any long work: refuses an existing out without overwrite (or one that is not a
// package), reads and checks the tokenizer (tok_arg, else the model's own model_tok; none with
// a warning) against vocab_size. Dies with one line.
void package_out_begin(PackageOut *po, const char *out, int overwrite, const char *tok_arg, const char *model_tok, int vocab_size,
                       const char *model_hash);
// --dtype bf16 before calibrating: the masters rounded to bf16 (nearest even) as the package will
// store them, so the codecs are fitted on the activations of the weights served. Refuses a weight
// past bf16's range as package_out_write does.
void package_round_masters_bf16(Model *model, unsigned long long seed);
// Writes the package of the model's weights (dtype "fp32" or "bf16"), its config and the cache
// layout (codecs and fitted states). Dies with one line and nothing written on failure.
void package_out_write(PackageOut *po, const Model *model, const Config *cfg, const CacheLayout *layout, const char *dtype);
void package_out_free(PackageOut *po);

#endif
