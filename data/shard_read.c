// Shard reader: every field is validated before use, so a damaged or hostile file
// yields one message naming the file, the byte offset and the problem.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "common/util.h"
#include "data/bytes.h"
#include "data/shard.h"

struct ShardReadBuf {
    ZSTD_DCtx *dctx;
    uint8_t *comp, *raw;
    size_t comp_cap, raw_cap;
};

ShardReadBuf *shard_readbuf_new(void) {
    ShardReadBuf *rb = xcalloc(1, sizeof(*rb));
    rb->dctx = ZSTD_createDCtx();
    if (!rb->dctx) die("out of memory creating a zstd decompression context");
    return rb;
}

void shard_readbuf_free(ShardReadBuf *rb) {
    if (!rb) return;
    ZSTD_freeDCtx(rb->dctx);
    free(rb->comp);
    free(rb->raw);
    free(rb);
}

static void grow(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    free(*buf);
    *buf = xmalloc(need);
    *cap = need;
}

// Reads n bytes at off; -1 on a short read (the caller has checked off+n <= file size).
static int read_at(const Shard *s, uint64_t off, void *dst, size_t n) {
    if (s->mem) {
        memcpy(dst, s->mem + off, n);
        return 0;
    }
    return pread_full(s->fd, dst, n, off);
}

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

static int parse(Shard *s, char *err, size_t errlen) {
    const char *p = s->path;
    uint8_t h[SHARD_HEADER_BYTES];
    size_t head = s->file_bytes < SHARD_HEADER_BYTES ? (size_t)s->file_bytes : SHARD_HEADER_BYTES;
    if (read_at(s, 0, h, head)) FAIL("shard '%s': read error at offset 0", p);
    if (head < 8 || memcmp(h, SHARD_MAGIC, 8))
        FAIL("'%s' is not a token shard: wrong magic at offset 0 (expected \"%s\"; make shards with clla prep)", p, SHARD_MAGIC);
    if (head < SHARD_HEADER_BYTES)
        FAIL("shard '%s' is truncated: %llu bytes, the header alone needs %d (re-run clla prep)", p,
             (unsigned long long)s->file_bytes, SHARD_HEADER_BYTES);
    if (get_le64(h + 56) != fnv1a64(h, 56))
        FAIL("shard '%s': header checksum mismatch at offset 56: the file is damaged, re-run clla prep", p);
    s->version = get_le32(h + 8);
    s->token_bytes = get_le32(h + 12);
    s->n_tokens = get_le64(h + 16);
    s->vocab_size = get_le32(h + 24);
    s->n_chunks = get_le32(h + 28);
    s->tokenizer_hash = get_le64(h + 32);
    s->index_offset = get_le64(h + 40);
    s->chunk_tokens = get_le32(h + 48);
    if (s->version != SHARD_VERSION)
        FAIL("shard '%s': format version %u at offset 8 is not supported (this build reads version %d)", p, s->version, SHARD_VERSION);
    if (s->vocab_size == 0 || s->token_bytes != shard_token_bytes(s->vocab_size))
        FAIL("shard '%s': token width %u at offset 12 does not fit vocab size %u at offset 24", p, s->token_bytes, s->vocab_size);
    if (s->chunk_tokens == 0 || s->chunk_tokens > SHARD_MAX_CHUNK_TOKENS)
        FAIL("shard '%s': chunk size %u tokens at offset 48 is out of range (1..%u)", p, s->chunk_tokens, SHARD_MAX_CHUNK_TOKENS);
    uint64_t index_bytes = (uint64_t)s->n_chunks * SHARD_INDEX_ENTRY_BYTES + 8;
    if (s->index_offset < SHARD_HEADER_BYTES || s->index_offset > s->file_bytes ||
        s->file_bytes - s->index_offset != index_bytes)
        FAIL("shard '%s' is truncated or has trailing bytes: index of %u chunks at offset %llu needs a file of %llu bytes, found %llu",
             p, s->n_chunks, (unsigned long long)s->index_offset, (unsigned long long)(s->index_offset + index_bytes),
             (unsigned long long)s->file_bytes);
    uint8_t *idx = xmalloc(index_bytes);
    if (read_at(s, s->index_offset, idx, index_bytes)) {
        free(idx);
        FAIL("shard '%s': read error at offset %llu", p, (unsigned long long)s->index_offset);
    }
    if (get_le64(idx + index_bytes - 8) != fnv1a64(idx, index_bytes - 8)) {
        free(idx);
        FAIL("shard '%s': index checksum mismatch at offset %llu: the file is damaged, re-run clla prep", p,
             (unsigned long long)(s->index_offset + index_bytes - 8));
    }
    s->chunks = xcalloc(s->n_chunks ? s->n_chunks : 1, sizeof(ShardChunk));
    uint64_t expect_off = SHARD_HEADER_BYTES, expect_tok = 0;
    for (uint32_t c = 0; c < s->n_chunks; c++) {
        const uint8_t *e = idx + (size_t)c * SHARD_INDEX_ENTRY_BYTES;
        ShardChunk *ch = &s->chunks[c];
        ch->offset = get_le64(e);
        ch->first_token = get_le64(e + 8);
        ch->checksum = get_le64(e + 16);
        ch->comp_bytes = get_le32(e + 24);
        ch->n_tokens = get_le32(e + 28);
        uint64_t at = s->index_offset + (uint64_t)c * SHARD_INDEX_ENTRY_BYTES;
        if (ch->offset != expect_off || ch->first_token != expect_tok || ch->n_tokens == 0 ||
            ch->n_tokens > s->chunk_tokens || ch->comp_bytes == 0 || ch->offset + ch->comp_bytes > s->index_offset) {
            free(idx);
            FAIL("shard '%s': index entry %u at offset %llu is inconsistent (chunk at %llu, %u bytes, %u tokens): the file is damaged, re-run clla prep",
                 p, c, (unsigned long long)at, (unsigned long long)ch->offset, ch->comp_bytes, ch->n_tokens);
        }
        expect_off += ch->comp_bytes;
        expect_tok += ch->n_tokens;
    }
    free(idx);
    if (expect_off != s->index_offset || expect_tok != s->n_tokens)
        FAIL("shard '%s': the chunks hold %llu tokens in %llu bytes, the header at offset 16 says %llu tokens before offset %llu: the file is damaged",
             p, (unsigned long long)expect_tok, (unsigned long long)expect_off, (unsigned long long)s->n_tokens,
             (unsigned long long)s->index_offset);
    return 0;
}

int shard_open(Shard *s, const char *path, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    s->fd = open(path, O_RDONLY);
    if (s->fd < 0) FAIL("cannot open shard '%s': %s (check the data path)", path, strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(s->fd);
        s->fd = -1;
        FAIL("'%s' is not a regular file: give a shard file, a directory of *.bin shards or a glob", path);
    }
    s->file_bytes = (uint64_t)st.st_size;
    s->path = xstrdup(path);
    int rc = parse(s, err, errlen);
    if (rc) shard_close(s);
    return rc;
}

int shard_open_mem(Shard *s, const uint8_t *mem, size_t len, const char *name, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    s->mem = mem;
    s->file_bytes = len;
    s->path = xstrdup(name);
    int rc = parse(s, err, errlen);
    if (rc) shard_close(s);
    return rc;
}

void shard_close(Shard *s) {
    if (s->fd >= 0) close(s->fd);
    free(s->path);
    free(s->chunks);
    memset(s, 0, sizeof(*s));
    s->fd = -1;
}

int shard_has_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char m[8];
    int ok = fread(m, 1, 8, f) == 8 && !memcmp(m, SHARD_MAGIC, 8);
    fclose(f);
    return ok;
}

int shard_read_chunk(const Shard *s, uint32_t c, ShardReadBuf *rb, uint32_t *out, char *err, size_t errlen) {
    const ShardChunk *ch = &s->chunks[c];
    unsigned long long off = (unsigned long long)ch->offset;
    grow(&rb->comp, &rb->comp_cap, ch->comp_bytes);
    if (read_at(s, ch->offset, rb->comp, ch->comp_bytes))
        FAIL("shard '%s': read error in chunk %u at offset %llu (file changed or truncated?)", s->path, c, off);
    if (fnv1a64(rb->comp, ch->comp_bytes) != ch->checksum)
        FAIL("shard '%s': checksum mismatch in chunk %u at offset %llu: the file is damaged, re-run clla prep", s->path, c, off);
    size_t raw = (size_t)ch->n_tokens * s->token_bytes;
    unsigned long long content = ZSTD_getFrameContentSize(rb->comp, ch->comp_bytes);
    if (content != raw)
        FAIL("shard '%s': chunk %u at offset %llu is not a zstd frame of %zu bytes", s->path, c, off, raw);
    grow(&rb->raw, &rb->raw_cap, raw);
    size_t got = ZSTD_decompressDCtx(rb->dctx, rb->raw, raw, rb->comp, ch->comp_bytes);
    if (ZSTD_isError(got) || got != raw)
        FAIL("shard '%s': chunk %u at offset %llu does not decompress (%s)", s->path, c, off,
             ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size");
    for (uint32_t i = 0; i < ch->n_tokens; i++) {
        uint32_t id = s->token_bytes == 2 ? get_le16(rb->raw + 2 * (size_t)i) : get_le32(rb->raw + 4 * (size_t)i);
        if (id >= s->vocab_size)
            FAIL("shard '%s': token id %u >= vocab size %u in chunk %u (compressed at offset %llu), token %llu of the shard: re-run clla prep with the right tokenizer",
                 s->path, id, s->vocab_size, c, off, (unsigned long long)(ch->first_token + i));
        out[i] = id;
    }
    return 0;
}
