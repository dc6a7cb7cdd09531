// The elements of the flat fp32 layout (params.bytes_f32 / 4 = end elements) that one rank's
// optimizer holds, and where they sit in its packed buffers (AdamW m and v, ZeRO-1's gradient
// piece). The layout is cut into rounds of `period` elements from 0; the rank holds `stripe`
// elements of each round from `lo` into it, clipped to end, packed round after round
// (round k at k * stripe). Three cases, one description (train/grad_sync.c makes them):
//   every element (no ZeRO-1, or one rank):   lo 0, stripe = period = end
//   a contiguous ZeRO-1 piece:                 lo rank * shard, stripe shard, period world * shard (>= end)
//   striped ZeRO-1 (the overlapped sum):       lo rank * stripe, period world * stripe: every rank
//                                              holds a stripe of every gradient bucket (Megatron's layout)
// In the last two the packed buffers keep the full rounds (rounds * stripe floats): the parts past
// end are padding, so that every rank's buffers have the same size.
#ifndef CLLA_MODEL_SHARD_H
#define CLLA_MODEL_SHARD_H

#include <stddef.h>
#include <string.h>

typedef struct Shard {
    size_t lo, stripe, period, end;
} Shard;

// Rounds of the layout: ceil(end / period), at least 1.
static inline size_t shard_rounds(const Shard *s) {
    size_t r = s->period ? (s->end + s->period - 1) / s->period : 1;
    return r ? r : 1;
}

// Floats of the packed buffers.
static inline size_t shard_count(const Shard *s) { return shard_rounds(s) * s->stripe; }

// The own elements of round k: [*a, *b) of the layout (empty when *a == *b), packed from *off.
static inline void shard_range(const Shard *s, size_t k, size_t *a, size_t *b, size_t *off) {
    size_t x = k * s->period + s->lo, y = x + s->stripe;
    *a = x < s->end ? x : s->end;
    *b = y < s->end ? y : s->end;
    *off = k * s->stripe;
}

// The own elements between the packed buffer and their places in the flat layout, round by
// round, with `copy` (dst, src, bytes): memcpy for host memory, or a backend's copy, upload or
// download. into_packed 1: dst is the packed buffer (shard_count floats) and src the layout;
// 0: the other way, the rest of the layout left as it is.
static inline void shard_copy(const Shard *s, void (*copy)(void *dst, const void *src, size_t bytes), float *dst, const float *src,
                              int into_packed) {
    const size_t rounds = shard_rounds(s);
    for (size_t k = 0; k < rounds; k++) {
        size_t a, b, off;
        shard_range(s, k, &a, &b, &off);
        if (b <= a) continue;
        if (into_packed) copy(dst + off, src + a, (b - a) * sizeof(float));
        else copy(dst + a, src + off, (b - a) * sizeof(float));
    }
}

static inline void shard_memcpy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

// The packed elements (shard_count floats, host memory) into their places of the flat layout
// `whole` (host memory); the rest of whole is left as it is.
static inline void shard_unpack(const Shard *s, float *whole, const float *packed) { shard_copy(s, shard_memcpy, whole, packed, 0); }

// 1 when the rank holds one range only (every element, or a contiguous piece)
static inline int shard_is_contiguous(const Shard *s) { return shard_rounds(s) == 1; }

// 1 when the rank holds every element (no ZeRO-1, or ZeRO-1 on one rank)
static inline int shard_is_all(const Shard *s) { return s->lo == 0 && s->stripe >= s->end; }

#endif
