#include "cli/cache_codec_args.h"

#include "common/util.h"

void apply_cache_codec_args(CacheLayout *cl, const char *const *specs, int n) {
    for (int i = 0; i < n; i++) {
        char err[512];
        if (cache_layout_apply_spec(cl, specs[i], err, sizeof(err)) != 0) die("--cache-codec '%s': %s", specs[i], err);
    }
}
