// Byte-level helpers shared by the tokenizer and the shard format: growable vectors,
// explicit little-endian packing (the shard format is little-endian on every host) and
// the FNV-1a 64-bit hash used for checksums and fingerprints (docs/FORMAT.md).
#ifndef CLLA_DATA_BYTES_H
#define CLLA_DATA_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

typedef struct U32Vec {
    uint32_t *v;
    size_t n, cap;
} U32Vec;

typedef struct ByteVec {
    uint8_t *v;
    size_t n, cap;
} ByteVec;

static inline void u32vec_reserve(U32Vec *a, size_t need) {
    if (need <= a->cap) return;
    size_t cap = a->cap ? a->cap : 64;
    while (cap < need) cap *= 2;
    uint32_t *v = realloc(a->v, cap * sizeof(*v));
    if (!v) die("out of memory growing a token buffer to %zu entries", cap);
    a->v = v;
    a->cap = cap;
}

static inline void u32vec_push(U32Vec *a, uint32_t x) {
    if (a->n == a->cap) u32vec_reserve(a, a->n + 1);
    a->v[a->n++] = x;
}

static inline void bytevec_append(ByteVec *a, const void *src, size_t n) {
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap < a->n + n) cap *= 2;
        uint8_t *v = realloc(a->v, cap);
        if (!v) die("out of memory growing a byte buffer to %zu bytes", cap);
        a->v = v;
        a->cap = cap;
    }
    if (n) memcpy(a->v + a->n, src, n);
    a->n += n;
}

#define FNV64_OFFSET 0xcbf29ce484222325ULL
#define FNV64_PRIME 0x100000001b3ULL

// FNV-1a 64: continue a running hash h over n bytes (start with FNV64_OFFSET).
static inline uint64_t fnv1a64_update(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV64_PRIME;
    }
    return h;
}

static inline uint64_t fnv1a64(const void *data, size_t n) { return fnv1a64_update(FNV64_OFFSET, data, n); }

// A strong 64-bit mixer (splitmix64's finalizer): turns seeds and counters into
// well-spread values for shuffling.
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline void put_le32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static inline void put_le64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static inline uint32_t get_le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get_le64(const uint8_t *p) { return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32; }

#endif
