// Shard writer. The header is written last (a placeholder first), so a reader that meets
// the temporary file mid-write would fail its checksum; atomic_commit() renames it into
// place only when complete.
#include <stdio.h>
#include <errno.h>
#include <string.h>

#include <zstd.h>

#include "data/bytes.h"
#include "data/shard.h"

struct ShardWriter {
    AtomicFile af;
    char *path;
    uint32_t vocab_size, token_bytes, chunk_tokens;
    uint64_t tokenizer_hash;
    ZSTD_CCtx *cctx;
    int level;
    uint32_t *pending;
    uint32_t n_pending;
    uint8_t *raw, *comp;
    size_t comp_cap;
    ByteVec index;
    uint64_t offset, n_tokens;
    uint32_t n_chunks;
};

// the cause (errno of the failed write) in the message: a full disk, a quota and an I/O error
// ask for different fixes
static void writer_fail(ShardWriter *w, const char *what) {
    const int e = errno;
    atomic_abort(&w->af);
    die("writing shard '%s' failed (%s): %s", w->path, what, e ? strerror(e) : "write error");
}

ShardWriter *shard_writer_open(const char *path, uint32_t vocab_size, uint64_t tokenizer_hash, uint32_t chunk_tokens,
                               int zstd_level) {
    if (chunk_tokens == 0 || chunk_tokens > SHARD_MAX_CHUNK_TOKENS)
        die("chunk size %u tokens is out of range: use 1..%u", chunk_tokens, SHARD_MAX_CHUNK_TOKENS);
    ShardWriter *w = xcalloc(1, sizeof(*w));
    w->path = xstrdup(path);
    if (atomic_open(&w->af, path, OUT_REPLACE) != 0) die("cannot create shard '%s': %s", path, strerror(errno));
    w->vocab_size = vocab_size;
    w->token_bytes = shard_token_bytes(vocab_size);
    w->tokenizer_hash = tokenizer_hash;
    w->chunk_tokens = chunk_tokens;
    w->level = zstd_level;
    w->cctx = ZSTD_createCCtx();
    if (!w->cctx) die("out of memory creating a zstd compression context");
    w->pending = xmalloc((size_t)chunk_tokens * sizeof(uint32_t));
    w->raw = xmalloc((size_t)chunk_tokens * w->token_bytes);
    w->comp_cap = ZSTD_compressBound((size_t)chunk_tokens * w->token_bytes);
    w->comp = xmalloc(w->comp_cap);
    uint8_t zero[SHARD_HEADER_BYTES] = {0};
    if (fwrite(zero, 1, sizeof(zero), w->af.f) != sizeof(zero)) writer_fail(w, "header");
    w->offset = SHARD_HEADER_BYTES;
    return w;
}

static void flush_chunk(ShardWriter *w) {
    if (!w->n_pending) return;
    for (uint32_t i = 0; i < w->n_pending; i++) {
        if (w->token_bytes == 2) {
            w->raw[2 * (size_t)i] = (uint8_t)w->pending[i];
            w->raw[2 * (size_t)i + 1] = (uint8_t)(w->pending[i] >> 8);
        } else {
            put_le32(w->raw + 4 * (size_t)i, w->pending[i]);
        }
    }
    size_t raw = (size_t)w->n_pending * w->token_bytes;
    size_t n = ZSTD_compressCCtx(w->cctx, w->comp, w->comp_cap, w->raw, raw, w->level);
    if (ZSTD_isError(n)) die("zstd compression failed for shard '%s': %s", w->path, ZSTD_getErrorName(n));
    if (fwrite(w->comp, 1, n, w->af.f) != n) writer_fail(w, "chunk data");
    uint8_t e[SHARD_INDEX_ENTRY_BYTES];
    put_le64(e, w->offset);
    put_le64(e + 8, w->n_tokens);
    put_le64(e + 16, fnv1a64(w->comp, n));
    put_le32(e + 24, (uint32_t)n);
    put_le32(e + 28, w->n_pending);
    bytevec_append(&w->index, e, sizeof(e));
    w->offset += n;
    w->n_tokens += w->n_pending;
    w->n_chunks++;
    w->n_pending = 0;
}

void shard_writer_add(ShardWriter *w, const uint32_t *ids, size_t n) {
    while (n > 0) {
        uint32_t k = w->chunk_tokens - w->n_pending;
        if (k > n) k = (uint32_t)n;
        for (uint32_t i = 0; i < k; i++) {
            if (ids[i] >= w->vocab_size)
                die("internal error: token id %u >= vocab size %u while writing shard '%s'", ids[i], w->vocab_size, w->path);
            w->pending[w->n_pending + i] = ids[i];
        }
        w->n_pending += k;
        ids += k;
        n -= k;
        if (w->n_pending == w->chunk_tokens) flush_chunk(w);
    }
}

uint64_t shard_writer_tokens(const ShardWriter *w) { return w->n_tokens + w->n_pending; }
uint64_t shard_writer_bytes(const ShardWriter *w) { return w->offset; }

void shard_writer_close(ShardWriter *w) {
    flush_chunk(w);
    uint64_t index_offset = w->offset;
    uint8_t sum[8];
    put_le64(sum, fnv1a64(w->index.v, w->index.n));
    if ((w->index.n && fwrite(w->index.v, 1, w->index.n, w->af.f) != w->index.n) || fwrite(sum, 1, 8, w->af.f) != 8)
        writer_fail(w, "index");
    uint8_t h[SHARD_HEADER_BYTES] = {0};
    memcpy(h, SHARD_MAGIC, 8);
    put_le32(h + 8, SHARD_VERSION);
    put_le32(h + 12, w->token_bytes);
    put_le64(h + 16, w->n_tokens);
    put_le32(h + 24, w->vocab_size);
    put_le32(h + 28, w->n_chunks);
    put_le64(h + 32, w->tokenizer_hash);
    put_le64(h + 40, index_offset);
    put_le32(h + 48, w->chunk_tokens);
    put_le64(h + 56, fnv1a64(h, 56));
    if (fseeko(w->af.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof(h), w->af.f) != sizeof(h)) writer_fail(w, "header");
    if (atomic_commit(&w->af) != 0) die("cannot finish shard '%s': %s", w->path, strerror(errno));
    ZSTD_freeCCtx(w->cctx);
    free(w->pending); free(w->raw); free(w->comp); free(w->index.v); free(w->path);
    free(w);
}
