// Tokenizer core: vocabulary storage and index, BPE encoding of pieces, decoding.
#include "data/tokenizer.h"

#include <stdio.h>
#include <string.h>

#include "data/pretok.h"

typedef struct Special {
    uint32_t id;
    uint32_t len;
    uint64_t off;
} Special;

struct Tokenizer {
    Pretok *pretok;
    ByteVec arena;        // token bytes, back to back
    uint64_t *off;        // per id: offset in arena
    uint32_t *len;        // per id: byte length, 0 = id unused
    uint8_t *special;     // per id: 1 for special tokens
    uint32_t cap_ids;
    uint32_t n_ids;       // largest id + 1
    Special *specials;
    int n_specials;
    uint32_t *slots;      // open-addressing index: ordinary token bytes -> id (TOK_NONE = empty)
    uint64_t mask;
    uint64_t hash;
};

// Short keys dominate lookups (pairs of pieces); a multiplicative hash over 8-byte words
// is several times faster than FNV here and spreads well enough for open addressing.
static inline uint64_t key_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    for (size_t k = 0; i < n; i++, k++) w |= (uint64_t)p[i] << (8 * k);
    h = (h ^ w) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

Tokenizer *tok_new(const char *pattern, char *err, size_t errlen) {
    Pretok *p = pretok_new(pattern, err, errlen);
    if (!p) return NULL;
    Tokenizer *t = xcalloc(1, sizeof(*t));
    t->pretok = p;
    return t;
}

void tok_free(Tokenizer *t) {
    if (!t) return;
    pretok_free(t->pretok);
    free(t->arena.v);
    free(t->off);
    free(t->len);
    free(t->special);
    free(t->specials);
    free(t->slots);
    free(t);
}

int tok_special_text_ok(const char *s, size_t n) {
    if (n == 0) return 0;
    // no white space and no control byte (a NUL cut the file's "#special" line short when written,
    // which then hashed to another tokenizer than the shards were made with)
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

int tok_add(Tokenizer *t, uint32_t id, const uint8_t *bytes, size_t len, int special, char *err, size_t errlen) {
    if (id >= TOK_MAX_ID) {
        snprintf(err, errlen, "rank %u is too large (limit %u)", id, TOK_MAX_ID - 1);
        return -1;
    }
    if (len == 0 || len > TOK_MAX_TOKEN_BYTES) {
        snprintf(err, errlen, "token of rank %u has %zu bytes (must be 1..%d)", id, len, TOK_MAX_TOKEN_BYTES);
        return -1;
    }
    if (id >= t->cap_ids) {
        uint32_t cap = t->cap_ids ? t->cap_ids : 512;
        while (cap <= id) cap *= 2;
        t->off = realloc(t->off, cap * sizeof(*t->off));
        t->len = realloc(t->len, cap * sizeof(*t->len));
        t->special = realloc(t->special, cap);
        if (!t->off || !t->len || !t->special) die("out of memory growing the vocabulary to %u ids", cap);
        memset(t->len + t->cap_ids, 0, (cap - t->cap_ids) * sizeof(*t->len));
        memset(t->special + t->cap_ids, 0, cap - t->cap_ids);
        t->cap_ids = cap;
    }
    if (t->len[id]) {
        snprintf(err, errlen, "rank %u appears twice", id);
        return -1;
    }
    t->off[id] = t->arena.n;
    t->len[id] = (uint32_t)len;
    t->special[id] = special ? 1 : 0;
    bytevec_append(&t->arena, bytes, len);
    if (id + 1 > t->n_ids) t->n_ids = id + 1;
    if (special) {
        t->specials = realloc(t->specials, (size_t)(t->n_specials + 1) * sizeof(*t->specials));
        if (!t->specials) die("out of memory adding a special token");
        t->specials[t->n_specials++] = (Special){id, (uint32_t)len, t->off[id]};
    }
    return 0;
}

static uint32_t lookup(const Tokenizer *t, const uint8_t *p, size_t n) {
    for (uint64_t i = key_hash(p, n) & t->mask;; i = (i + 1) & t->mask) {
        uint32_t id = t->slots[i];
        if (id == TOK_NONE) return TOK_NONE;
        if (t->len[id] == n && !memcmp(t->arena.v + t->off[id], p, n)) return id;
    }
}

uint32_t tok_lookup(const Tokenizer *t, const uint8_t *bytes, size_t len) {
    return t->slots ? lookup(t, bytes, len) : TOK_NONE;
}

int tok_finish(Tokenizer *t, char *err, size_t errlen) {
    uint64_t size = 1024;
    while (size < 2ull * t->n_ids) size *= 2;
    free(t->slots);
    t->slots = xmalloc(size * sizeof(*t->slots));
    memset(t->slots, 0xff, size * sizeof(*t->slots));
    t->mask = size - 1;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!t->len[id] || t->special[id]) continue;
        const uint8_t *p = t->arena.v + t->off[id];
        uint64_t i = key_hash(p, t->len[id]) & t->mask;
        for (; t->slots[i] != TOK_NONE; i = (i + 1) & t->mask) {
            uint32_t o = t->slots[i];
            if (t->len[o] == t->len[id] && !memcmp(t->arena.v + t->off[o], p, t->len[id])) {
                snprintf(err, errlen, "ranks %u and %u have the same bytes", o, id);
                return -1;
            }
        }
        t->slots[i] = id;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if (lookup(t, &c, 1) == TOK_NONE) {
            snprintf(err, errlen, "byte 0x%02x has no rank: a byte-level vocabulary needs all 256 single bytes", b);
            return -1;
        }
    }
    for (int i = 0; i < t->n_specials; i++)
        for (int j = 0; j < i; j++)
            if (t->specials[i].len == t->specials[j].len &&
                !memcmp(t->arena.v + t->specials[i].off, t->arena.v + t->specials[j].off, t->specials[i].len)) {
                snprintf(err, errlen, "special tokens %u and %u have the same text", t->specials[j].id, t->specials[i].id);
                return -1;
            }
    // The hash covers everything that changes ids: pattern, and every (id, bytes, kind).
    uint64_t h = fnv1a64(pretok_name(t->pretok), strlen(pretok_name(t->pretok)) + 1);
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!t->len[id]) continue;
        uint8_t rec[9];
        put_le32(rec, id);
        put_le32(rec + 4, t->len[id]);
        rec[8] = t->special[id];
        h = fnv1a64_update(h, rec, sizeof(rec));
        h = fnv1a64_update(h, t->arena.v + t->off[id], t->len[id]);
    }
    t->hash = h;
    return 0;
}

uint32_t tok_vocab_size(const Tokenizer *t) { return t->n_ids; }
uint64_t tok_hash(const Tokenizer *t) { return t->hash; }
const char *tok_pattern(const Tokenizer *t) { return pretok_name(t->pretok); }
int tok_n_special(const Tokenizer *t) { return t->n_specials; }

uint32_t tok_special_id(const Tokenizer *t, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < t->n_specials; i++)
        if (t->specials[i].len == n && !memcmp(t->arena.v + t->specials[i].off, text, n)) return t->specials[i].id;
    return TOK_NONE;
}

const uint8_t *tok_bytes(const Tokenizer *t, uint32_t id, size_t *len, int *special) {
    if (id >= t->n_ids || !t->len[id]) return NULL;
    *len = t->len[id];
    if (special) *special = t->special[id];
    return t->arena.v + t->off[id];
}

// ---------------------------------------------------------------- encoding

struct TokEncoder {
    const Tokenizer *t;
    PretokScratch *ps;
    size_t cap;           // capacity of the arrays below, in bytes of piece
    uint32_t *pos, *rank; // short pieces: part boundaries and pair ranks
    uint32_t *next, *prev;  // long pieces: linked parts and a heap of pairs
    uint64_t *heap_key;
    uint8_t *alive;
};

TokEncoder *tok_encoder_new(const Tokenizer *t) {
    TokEncoder *e = xcalloc(1, sizeof(*e));
    e->t = t;
    e->ps = pretok_scratch_new(t->pretok);
    return e;
}

void tok_encoder_free(TokEncoder *e) {
    if (!e) return;
    pretok_scratch_free(e->ps);
    free(e->pos); free(e->rank); free(e->next); free(e->prev); free(e->heap_key); free(e->alive);
    free(e);
}

static void encoder_reserve(TokEncoder *e, size_t n) {
    if (n + 1 <= e->cap) return;
    size_t cap = e->cap ? e->cap : 256;
    while (cap < n + 1) cap *= 2;
    free(e->pos); free(e->rank); free(e->next); free(e->prev); free(e->heap_key); free(e->alive);
    e->pos = xmalloc(cap * sizeof(uint32_t));
    e->rank = xmalloc(cap * sizeof(uint32_t));
    e->next = xmalloc(cap * sizeof(uint32_t));
    e->prev = xmalloc(cap * sizeof(uint32_t));
    e->heap_key = xmalloc(3 * cap * sizeof(uint64_t));  // n-1 initial pairs + 2 per merge
    e->alive = xmalloc(cap);
    e->cap = cap;
}

// Short pieces: scan all pairs for the lowest rank each round (quadratic, but pieces are
// words, and this beats a heap below a few dozen bytes).
static void bpe_short(TokEncoder *e, const uint8_t *p, uint32_t n, U32Vec *out) {
    const Tokenizer *t = e->t;
    uint32_t *pos = e->pos, *rank = e->rank;
    uint32_t m = n;  // number of parts; boundaries pos[0..m]
    for (uint32_t i = 0; i <= n; i++) pos[i] = i;
    for (uint32_t i = 0; i + 1 < m; i++) rank[i] = lookup(t, p + i, 2);
    for (;;) {
        uint32_t best = TOK_NONE, bi = 0;
        for (uint32_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) { best = rank[i]; bi = i; }
        if (best == TOK_NONE) break;
        memmove(pos + bi + 1, pos + bi + 2, (m - bi - 1) * sizeof(*pos));
        if (bi + 2 < m) memmove(rank + bi + 1, rank + bi + 2, (m - bi - 2) * sizeof(*rank));
        m--;
        rank[bi] = bi + 1 < m ? lookup(t, p + pos[bi], pos[bi + 2] - pos[bi]) : TOK_NONE;
        if (bi > 0) rank[bi - 1] = lookup(t, p + pos[bi - 1], pos[bi + 1] - pos[bi - 1]);
    }
    for (uint32_t i = 0; i < m; i++) u32vec_push(out, lookup(t, p + pos[i], pos[i + 1] - pos[i]));
}

// Heap of pairs keyed by (rank << 32 | left start): the minimum is the lowest rank,
// leftmost on ties, exactly the order bpe_short() merges in.
static void heap_push(TokEncoder *e, uint32_t *hn, uint64_t key) {
    uint32_t i = (*hn)++;
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (e->heap_key[parent] <= key) break;
        e->heap_key[i] = e->heap_key[parent];
        i = parent;
    }
    e->heap_key[i] = key;
}

static uint64_t heap_pop(TokEncoder *e, uint32_t *hn) {
    uint64_t top = e->heap_key[0], last = e->heap_key[--(*hn)];
    uint32_t i = 0, n = *hn;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && e->heap_key[c + 1] < e->heap_key[c]) c++;
        if (e->heap_key[c] >= last) break;
        e->heap_key[i] = e->heap_key[c];
        i = c;
    }
    if (n) e->heap_key[i] = last;
    return top;
}

// Long pieces (runs of spaces, digits, invalid bytes): O(n log n) with lazy deletion.
static void bpe_long(TokEncoder *e, const uint8_t *p, uint32_t n, U32Vec *out) {
    const Tokenizer *t = e->t;
    uint32_t *next = e->next, *prev = e->prev, hn = 0;
    for (uint32_t i = 0; i < n; i++) { next[i] = i + 1; prev[i] = i ? i - 1 : TOK_NONE; e->alive[i] = 1; }
    for (uint32_t i = 0; i + 1 < n; i++) {
        uint32_t r = lookup(t, p + i, 2);
        if (r != TOK_NONE) heap_push(e, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t key = heap_pop(e, &hn);
        uint32_t r = (uint32_t)(key >> 32), l = (uint32_t)key;
        if (!e->alive[l] || next[l] >= n) continue;
        uint32_t m = next[l], end = next[m];
        if (lookup(t, p + l, end - l) != r) continue;  // stale entry
        e->alive[m] = 0;
        next[l] = end;
        if (end < n) prev[end] = l;
        if (end < n) {
            uint32_t r2 = lookup(t, p + l, next[end] - l);
            if (r2 != TOK_NONE) heap_push(e, &hn, (uint64_t)r2 << 32 | l);
        }
        if (prev[l] != TOK_NONE) {
            uint32_t q = prev[l];
            uint32_t r2 = lookup(t, p + q, end - q);
            if (r2 != TOK_NONE) heap_push(e, &hn, (uint64_t)r2 << 32 | q);
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) u32vec_push(out, lookup(t, p + i, next[i] - i));
}

static void encode_piece(TokEncoder *e, const uint8_t *p, size_t n, U32Vec *out) {
    uint32_t whole = lookup(e->t, p, n);
    if (whole != TOK_NONE) { u32vec_push(out, whole); return; }
    // Pieces are split at 1 MiB so the 32-bit offsets and the heap stay bounded; a piece
    // that long (a blob without spaces) has no meaningful merges across the cut anyway.
    while (n > 0) {
        uint32_t k = n > (1u << 20) ? (1u << 20) : (uint32_t)n;
        encoder_reserve(e, k);
        if (k <= 48) bpe_short(e, p, k, out);
        else bpe_long(e, p, k, out);
        p += k;
        n -= k;
    }
}

static void encode_ordinary(TokEncoder *e, const char *text, size_t len, U32Vec *out) {
    size_t pos = 0;
    while (pos < len) {
        size_t end = pretok_next(e->t->pretok, e->ps, text, len, pos);
        encode_piece(e, (const uint8_t *)text + pos, end - pos, out);
        pos = end;
    }
}

void tok_encode(TokEncoder *e, const char *text, size_t len, int allow_special, U32Vec *out) {
    const Tokenizer *t = e->t;
    if (!allow_special || t->n_specials == 0) { encode_ordinary(e, text, len, out); return; }
    // next[i]: where special i next occurs at or after pos (len: nowhere). A search starts where
    // the last one of the same special left off, so the text is scanned once per special: asking
    // every special again from each hit was quadratic in the text for a special that is absent.
    size_t *next = xmalloc((size_t)t->n_specials * sizeof(size_t));
    for (int i = 0; i < t->n_specials; i++) next[i] = SIZE_MAX;   // not searched yet
    size_t pos = 0;
    while (pos < len) {
        // The earliest occurrence of any special token (longest on a tie) ends the ordinary run.
        size_t best = len;
        int bi = -1;
        for (int i = 0; i < t->n_specials; i++) {
            const Special *s = &t->specials[i];
            if (next[i] == SIZE_MAX || (next[i] < pos && next[i] != len)) {
                const char *hit = memmem(text + pos, len - pos, t->arena.v + s->off, s->len);
                next[i] = hit ? (size_t)(hit - text) : len;
            }
            const size_t at = next[i];
            if (at == len) continue;
            if (at < best || (at == best && bi >= 0 && s->len > t->specials[bi].len)) { best = at; bi = i; }
        }
        encode_ordinary(e, text + pos, best - pos, out);
        if (bi < 0) break;
        u32vec_push(out, t->specials[bi].id);
        pos = best + t->specials[bi].len;
    }
    free(next);
}

int tok_decode(const Tokenizer *t, const uint32_t *ids, size_t n, ByteVec *out, size_t *bad) {
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= t->n_ids || !t->len[id]) {
            if (bad) *bad = i;
            return -1;
        }
        bytevec_append(out, t->arena.v + t->off[id], t->len[id]);
    }
    return 0;
}
