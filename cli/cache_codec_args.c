#include "cli/cache_codec_args.h"

#include "common/util.h"

void apply_cache_codec_args(CacheLayout *cl, const char *const *specs, int n) {
    char err[512];
    for (int i = 0; i < n; i++)
        if (cache_layout_apply_spec(cl, specs[i], err, sizeof(err)) != 0) die("--cache-codec '%s': %s", specs[i], err);
    if (n == 0) return;
    // the cache block is the largest block of the layout's block codecs: a part with a smaller
    // one keeps that larger window (docs/QUANTIZERS.md, "KIVI in the cache")
    const int bt = cache_layout_block_tokens(cl, err, sizeof(err));
    if (bt < 0) die("--cache-codec: %s", err);
    for (int p = 0; p < N_PARTS; p++) {
        const int b = cl->part[p].present ? codec_block_tokens(&cl->part[p].codec) : 1;
        if (b > 1 && b < bt)
            warn("--cache-codec: part %s encodes blocks of %d tokens, but the cache's blocks are %d tokens (the largest block codec's): "
                 "its full-precision window is %d tokens, its blocks encoded %d at a time",
                 cache_part_name(p), b, bt, bt, bt / b);
    }
}
