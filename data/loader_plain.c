// The plain token file: headerless little-endian uint32 token ids.
// Batches are consecutive: a micro-batch reads B*T+1 tokens at the cursor, row b being
// tokens[pos + b*T, pos + b*T + T], then the cursor advances by B*T and wraps to 0 when
// fewer than B*T+1 tokens remain. The PyTorch twin reproduces exactly this order.
// (rank/world and seed do not apply: every rank reads the same batches.)
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/bytes.h"
#include "data/loader_internal.h"

struct PlainLoader {
    char *path;
    uint32_t *tokens;
    long long n;
    long long pos;
    int B, T;
    unsigned long long fingerprint;   // plain_fingerprint(pl, 1), taken once at open
};

static unsigned long long plain_fingerprint(const PlainLoader *pl, int content);

PlainLoader *plain_open(const char *path, const LoaderOptions *opt) {
    size_t bytes = 0;
    char *buf = read_file(path, &bytes);
    if (!buf) die("cannot read token file '%s': %s (train.data / --data)", path, strerror(errno));
    if (bytes % 4 != 0)
        die("token file '%s' has %zu bytes, not a multiple of 4: expected raw little-endian uint32 token ids", path, bytes);
    long long n = (long long)(bytes / 4);
    long long need = (long long)opt->B * opt->T + 1;
    if (n < need)
        die("token file '%s' holds %lld tokens, fewer than one batch of %d sequence%s of %d needs (%lld, with the last target): use more data or a smaller batch/sequence",
            path, n, opt->B, opt->B == 1 ? "" : "s", opt->T, need);
    uint32_t *tok = (uint32_t *)buf;
    for (long long i = 0; i < n; i++)
        if (tok[i] >= (uint32_t)opt->vocab_size)
            die("token file '%s': token %u at offset %lld is >= vocab_size %d: raise vocab_size or re-tokenize", path, tok[i], i * 4, opt->vocab_size);
    PlainLoader *pl = xcalloc(1, sizeof(*pl));
    pl->path = xstrdup(path);
    pl->tokens = tok;
    pl->n = n;
    pl->B = opt->B;
    pl->T = opt->T;
    pl->fingerprint = plain_fingerprint(pl, 1);
    return pl;
}

void plain_next(PlainLoader *pl, int32_t *inputs, int32_t *targets) {
    long long bt = (long long)pl->B * pl->T;
    if (pl->pos + bt + 1 > pl->n) pl->pos = 0;
    for (int b = 0; b < pl->B; b++)
        for (int t = 0; t < pl->T; t++) {
            long long i = pl->pos + (long long)b * pl->T + t;
            inputs[b * pl->T + t] = (int32_t)pl->tokens[i];
            targets[b * pl->T + t] = (int32_t)pl->tokens[i + 1];
        }
    pl->pos += bt;
}

long long plain_num_batches(const PlainLoader *pl) { return (pl->n - 1) / ((long long)pl->B * pl->T); }

// Of the token count and batch shape (content = 0: the fingerprint of checkpoints before
// 2026-11-28), then of the tokens themselves, so that another file of as many tokens does not take
// the position.
static unsigned long long plain_fingerprint(const PlainLoader *pl, int content) {
    unsigned long long f[3] = {(unsigned long long)pl->n, (unsigned long long)pl->B, (unsigned long long)pl->T};
    const uint64_t h = fnv1a64(f, sizeof(f));
    return content ? fnv1a64_update(h, pl->tokens, (size_t)pl->n * sizeof(uint32_t)) : h;
}

void plain_get_state(const PlainLoader *pl, LoaderState *st) {
    st->epoch = 0;
    st->position = (unsigned long long)pl->pos;
    st->fingerprint = pl->fingerprint;
}

void plain_set_state(PlainLoader *pl, const LoaderState *st) {
    const int counts_only = st->fingerprint == plain_fingerprint(pl, 0);
    if (counts_only)
        warn("token file '%s': the checkpoint's data fingerprint is of the token count only (written before 2026-11-28): it "
             "matches, the content could not be compared",
             pl->path);
    if (!counts_only && st->fingerprint != pl->fingerprint)
        die("token file '%s': the saved data position does not belong to this file and batch shape (B=%d, T=%d): resume with the same data and batch size",
            pl->path, pl->B, pl->T);
    // the cursor moves by B*T from 0 and stays below the file's end (the shard loader's check)
    const unsigned long long bt = (unsigned long long)pl->B * (unsigned long long)pl->T;
    if (st->position >= (unsigned long long)pl->n || st->position % bt)
        die("token file '%s': saved data position %llu is not a batch start (a multiple of B*T = %llu) below %lld: the "
            "checkpoint's state is damaged", pl->path, st->position, bt, pl->n);
    pl->pos = (long long)st->position;
}

void plain_close(PlainLoader *pl) {
    if (!pl) return;
    free(pl->tokens);
    free(pl->path);
    free(pl);
}
