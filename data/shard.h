// Token shards (docs/FORMAT.md, "Token shards"): a 64-byte header, zstd-compressed chunks
// of little-endian uint16/uint32 token ids, and an index of the chunks at the end, each
// part protected by an FNV-1a 64 checksum. All offsets and counts are 64-bit.
// Reader functions report problems through err (naming the file and the byte offset) and
// return -1, so the fuzzer can drive them; commands turn that into die().
#ifndef CLLA_DATA_SHARD_H
#define CLLA_DATA_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC "CLLATOK1"  // 8 bytes, no NUL stored
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 64
#define SHARD_INDEX_ENTRY_BYTES 32
#define SHARD_MAX_CHUNK_TOKENS (1u << 24)
#define SHARD_DEFAULT_CHUNK_TOKENS (1u << 17)

typedef struct ShardChunk {
    uint64_t offset;       // file offset of the compressed bytes
    uint64_t first_token;  // index of the chunk's first token in the shard
    uint64_t checksum;     // FNV-1a 64 of the compressed bytes
    uint32_t comp_bytes;
    uint32_t n_tokens;
} ShardChunk;

typedef struct Shard {
    char *path;
    int fd;                  // -1 when reading from memory
    const uint8_t *mem;      // whole file in memory (fuzzing, tests)
    uint64_t file_bytes;
    uint32_t version, token_bytes, vocab_size, n_chunks, chunk_tokens;
    uint64_t n_tokens, tokenizer_hash, index_offset;
    ShardChunk *chunks;
} Shard;

// Per-thread buffers for reading chunks (zstd context, compressed and raw bytes).
typedef struct ShardReadBuf ShardReadBuf;
ShardReadBuf *shard_readbuf_new(void);
void shard_readbuf_free(ShardReadBuf *rb);

// Opens and validates header and index. 0 on success.
int shard_open(Shard *s, const char *path, char *err, size_t errlen);
// Same on a file image in memory (not copied: mem must outlive s).
int shard_open_mem(Shard *s, const uint8_t *mem, size_t len, const char *name, char *err, size_t errlen);
void shard_close(Shard *s);
// The shard files a data path names: the file itself, a directory's *.bin files (sorted),
// or the matches of a glob (sorted). Dies when there are none. Free each and the array.
char **shard_list(const char *path, int *n);
// Whether the first bytes of a file are a shard's magic (for format dispatch).
int shard_has_magic(const char *path);

// Reads chunk c into out (n_tokens ids): checksum, decompression, every id < vocab_size.
int shard_read_chunk(const Shard *s, uint32_t c, ShardReadBuf *rb, uint32_t *out, char *err, size_t errlen);

// Writing: tokens are appended, full chunks compressed as they fill; close writes the
// index and header and renames the file into place (nothing half-written is visible).
typedef struct ShardWriter ShardWriter;
ShardWriter *shard_writer_open(const char *path, uint32_t vocab_size, uint64_t tokenizer_hash, uint32_t chunk_tokens,
                               int zstd_level);
void shard_writer_add(ShardWriter *w, const uint32_t *ids, size_t n);
uint64_t shard_writer_tokens(const ShardWriter *w);
uint64_t shard_writer_bytes(const ShardWriter *w);
void shard_writer_close(ShardWriter *w);

// 2 when vocab_size <= 65536, else 4.
static inline uint32_t shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

#endif
