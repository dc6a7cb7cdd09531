// libFuzzer target for the shard reader (built and run by tests/test_fuzz_data.sh).
// The input is a shard file image. With the first byte odd, the harness first repairs the
// header, index and chunk checksums, so that the fuzzer reaches past them into the index
// consistency checks, zstd decoding and the token range checks. Every chunk of a shard
// that opens is read; errors must come back as messages naming the file, never crash.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bytes.h"
#include "data/shard.h"

static void repair(uint8_t *b, size_t n) {
    if (n < SHARD_HEADER_BYTES) return;
    put_le64(b + 56, fnv1a64(b, 56));
    uint64_t index = get_le64(b + 40), n_chunks = get_le32(b + 28);
    if (index > n || (n - index) / SHARD_INDEX_ENTRY_BYTES < n_chunks || n - index < 8) return;
    for (uint64_t c = 0; c < n_chunks; c++) {
        uint8_t *e = b + index + c * SHARD_INDEX_ENTRY_BYTES;
        uint64_t off = get_le64(e);
        uint32_t comp = get_le32(e + 24);
        if (off <= n && comp <= n - off) put_le64(e + 16, fnv1a64(b + off, comp));
    }
    uint64_t ilen = n_chunks * SHARD_INDEX_ENTRY_BYTES;
    if (n - index >= ilen + 8) put_le64(b + index + ilen, fnv1a64(b + index, ilen));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int fix = data[0] & 1;
    uint8_t *img = malloc(size);
    memcpy(img, data + 1, size - 1);
    size_t n = size - 1;
    if (fix) repair(img, n);
    Shard s;
    char err[512];
    if (shard_open_mem(&s, img, n, "fuzz.bin", err, sizeof(err)) == 0) {
        ShardReadBuf *rb = shard_readbuf_new();
        uint32_t most = 1;  // the index is validated: n_tokens <= chunk_tokens
        for (uint32_t c = 0; c < s.n_chunks; c++) most = s.chunks[c].n_tokens > most ? s.chunks[c].n_tokens : most;
        uint32_t *out = malloc((size_t)most * sizeof(uint32_t));
        for (uint32_t c = 0; c < s.n_chunks; c++)
            if (shard_read_chunk(&s, c, rb, out, err, sizeof(err)) != 0 && !strstr(err, "fuzz.bin")) abort();
        free(out);
        shard_readbuf_free(rb);
        shard_close(&s);
    } else if (!strstr(err, "fuzz.bin")) {
        abort();
    }
    free(img);
    return 0;
}
