// The plain token file: headerless little-endian uint32 token ids.
// Batches are consecutive: a batch reads B*T+1 tokens at the cursor, row b being
// tokens[pos + b*T, pos + b*T + T], then the cursor advances by B*T and wraps to 0 when
// fewer than B*T+1 tokens remain. clla train's batch is a whole step (B = micro_batch x the
// micro-steps, cli/cmd_train.c), so a wrap falls between steps, never inside one. The PyTorch
// twin reproduces exactly this order (tests/reference/twin.py, TokenCursor).
// (rank/world and seed do not apply: every rank reads the same batches.)
// The file is not held in memory: opening streams it once (token range check and content
// fingerprint), and each batch reads its B*T+1 tokens at the cursor, so a file larger than
// the machine's memory trains like a shard set does (data/loader_shards.c).
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "data/bytes.h"
#include "data/loader_internal.h"

struct PlainLoader {
    char *path;
    int fd;
    int vocab_size;
    long long n;
    long long pos;
    int B, T;
    uint32_t *window;                 // [B*T+1] the batch being read, host order
    unsigned long long fingerprint;   // of the count, batch shape and content, taken once at open
    unsigned long long count_fingerprint;   // of the count and batch shape only (checkpoints before 2026-11-28)
};

#define PLAIN_CHUNK_TOKENS (1 << 20)

// Reads count tokens at token index first into dst (host order) and checks each is below
// vocab_size; dies naming the file on a short read (the file shrank) or a bad id. With hash,
// continues *hash over the file's bytes read.
static void plain_read(const PlainLoader *pl, long long first, size_t count, uint32_t *dst, uint64_t *hash) {
    if (pread_full(pl->fd, dst, count * sizeof(uint32_t), (unsigned long long)first * 4))
        die("token file '%s': cannot read %zu tokens at offset %lld (%s): was it changed or truncated while in use?",
            pl->path, count, first * 4, errno ? strerror(errno) : "short read");
    if (hash) *hash = fnv1a64_update(*hash, dst, count * sizeof(uint32_t));
    for (size_t i = 0; i < count; i++) {
        dst[i] = get_le32((const uint8_t *)&dst[i]);
        if (dst[i] >= (uint32_t)pl->vocab_size)
            die("token file '%s': token %u at offset %lld is >= vocab_size %d: raise vocab_size or re-tokenize", pl->path,
                dst[i], (first + (long long)i) * 4, pl->vocab_size);
    }
}

PlainLoader *plain_open(const char *path, const LoaderOptions *opt) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) die("cannot read token file '%s': %s (train.data / --data)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) die("token file '%s' is not a regular file: give a file of uint32 token ids (train.data / --data)", path);
    const unsigned long long bytes = (unsigned long long)st.st_size;
    if (bytes % 4 != 0)
        die("token file '%s' has %llu bytes, not a multiple of 4: expected raw little-endian uint32 token ids", path, bytes);
    long long n = (long long)(bytes / 4);
    long long need = (long long)opt->B * opt->T + 1;
    if (n < need)
        die("token file '%s' holds %lld tokens, fewer than one batch of %d sequence%s of %d needs (%lld, with the last target): use more data or a smaller batch/sequence",
            path, n, opt->B, opt->B == 1 ? "" : "s", opt->T, need);
    PlainLoader *pl = xcalloc(1, sizeof(*pl));
    pl->path = xstrdup(path);
    pl->fd = fd;
    pl->vocab_size = opt->vocab_size;
    pl->n = n;
    pl->B = opt->B;
    pl->T = opt->T;
    pl->window = xmalloc((size_t)need * sizeof(uint32_t));
    // The fingerprint: of the token count and batch shape (alone, the fingerprint of checkpoints
    // before 2026-11-28), then of the tokens themselves, so that another file of as many tokens
    // does not take the position. The bytes hashed are the file's, as on every host.
    unsigned long long f[3] = {(unsigned long long)n, (unsigned long long)opt->B, (unsigned long long)opt->T};
    uint64_t h = fnv1a64(f, sizeof(f));
    pl->count_fingerprint = h;
    uint32_t *chunk = xmalloc((size_t)PLAIN_CHUNK_TOKENS * sizeof(uint32_t));
    for (long long at = 0; at < n; at += PLAIN_CHUNK_TOKENS) {
        const size_t m = (size_t)(n - at < PLAIN_CHUNK_TOKENS ? n - at : PLAIN_CHUNK_TOKENS);
        plain_read(pl, at, m, chunk, &h);
    }
    free(chunk);
    pl->fingerprint = h;
    return pl;
}

void plain_next(PlainLoader *pl, int32_t *inputs, int32_t *targets) {
    long long bt = (long long)pl->B * pl->T;
    if (pl->pos + bt + 1 > pl->n) pl->pos = 0;
    plain_read(pl, pl->pos, (size_t)bt + 1, pl->window, NULL);
    for (long long i = 0; i < bt; i++) {
        inputs[i] = (int32_t)pl->window[i];
        targets[i] = (int32_t)pl->window[i + 1];
    }
    pl->pos += bt;
}

long long plain_num_batches(const PlainLoader *pl) { return (pl->n - 1) / ((long long)pl->B * pl->T); }

void plain_get_state(const PlainLoader *pl, LoaderState *st) {
    st->epoch = 0;
    st->position = (unsigned long long)pl->pos;
    st->fingerprint = pl->fingerprint;
}

void plain_set_state(PlainLoader *pl, const LoaderState *st) {
    const int counts_only = st->fingerprint == pl->count_fingerprint;
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
    close(pl->fd);
    free(pl->window);
    free(pl->path);
    free(pl);
}
