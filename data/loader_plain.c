// The plain token file: headerless little-endian uint32 token ids.
// Batches are consecutive: a micro-batch reads B*T+1 tokens at the cursor, row b being
// tokens[pos + b*T, pos + b*T + T], then the cursor advances by B*T and wraps to 0 when
// fewer than B*T+1 tokens remain. The PyTorch twin reproduces exactly this order.
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/loader.h"

struct DataLoader {
    char *path;
    uint32_t *tokens;
    long long n;
    long long pos;
    int B, T;
};

DataLoader *loader_open(const char *path, const LoaderOptions *opt) {
    size_t bytes = 0;
    char *buf = read_file(path, &bytes);
    if (!buf) die("cannot read token file '%s': check the path (train.data / --data)", path);
    if (bytes % 4 != 0)
        die("token file '%s' has %zu bytes, not a multiple of 4: expected raw little-endian uint32 token ids", path, bytes);
    long long n = (long long)(bytes / 4);
    long long need = (long long)opt->B * opt->T + 1;
    if (n < need)
        die("token file '%s' holds %lld tokens, fewer than one batch needs (%lld = B*T+1): use more data or a smaller batch/sequence", path, n, need);
    uint32_t *tok = (uint32_t *)buf;
    for (long long i = 0; i < n; i++)
        if (tok[i] >= (uint32_t)opt->vocab_size)
            die("token file '%s': token %u at offset %lld is >= vocab_size %d: raise vocab_size or re-tokenize", path, tok[i], i * 4, opt->vocab_size);
    DataLoader *dl = xcalloc(1, sizeof(*dl));
    dl->path = xstrdup(path);
    dl->tokens = tok;
    dl->n = n;
    dl->B = opt->B;
    dl->T = opt->T;
    return dl;
}

void loader_next(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    long long bt = (long long)dl->B * dl->T;
    if (dl->pos + bt + 1 > dl->n) dl->pos = 0;
    for (int b = 0; b < dl->B; b++)
        for (int t = 0; t < dl->T; t++) {
            long long i = dl->pos + (long long)b * dl->T + t;
            inputs[b * dl->T + t] = (int32_t)dl->tokens[i];
            targets[b * dl->T + t] = (int32_t)dl->tokens[i + 1];
        }
    dl->pos += bt;
}

long long loader_num_batches(const DataLoader *dl) { return (dl->n - 1) / ((long long)dl->B * dl->T); }

void loader_reset(DataLoader *dl) { dl->pos = 0; }

void loader_close(DataLoader *dl) {
    if (!dl) return;
    free(dl->tokens);
    free(dl->path);
    free(dl);
}
