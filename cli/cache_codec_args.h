// The --cache-codec option (CODEC or PART=CODEC, repeatable), shared by generate, eval, export and
// calibrate: the specs applied in order over a cache layout (model/cache.h).
#ifndef CLLA_CLI_CACHE_CODEC_ARGS_H
#define CLLA_CLI_CACHE_CODEC_ARGS_H

#include "model/cache.h"

// Dies with one line naming the spec that does not apply.
void apply_cache_codec_args(CacheLayout *cl, const char *const *specs, int n);

#endif
