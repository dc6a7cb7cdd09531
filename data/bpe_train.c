// BPE training with incremental pair counts: each merge only revisits the words that
// contain the merged pair (found through a per-pair word list), and the most frequent
// pair comes from a max-heap with lazy invalidation.
#include "data/bpe_train.h"

#include <stdio.h>
#include <string.h>

#include "data/pretok.h"

// ---------------------------------------------------------------- byte-string -> index map

typedef struct BytesMap {
    uint32_t *slots;   // index or TOK_NONE
    uint64_t mask;
    uint32_t n;
    ByteVec arena;
    uint64_t *off;
    uint32_t *len;
    uint32_t cap;
} BytesMap;

static uint64_t bytes_hash(const uint8_t *p, size_t n) { return mix64(fnv1a64(p, n)); }

static void bmap_grow(BytesMap *m) {
    uint64_t size = m->slots ? 2 * (m->mask + 1) : 1024;
    free(m->slots);
    m->slots = xmalloc(size * sizeof(uint32_t));
    memset(m->slots, 0xff, size * sizeof(uint32_t));
    m->mask = size - 1;
    for (uint32_t k = 0; k < m->n; k++) {
        uint64_t i = bytes_hash(m->arena.v + m->off[k], m->len[k]) & m->mask;
        while (m->slots[i] != TOK_NONE) i = (i + 1) & m->mask;
        m->slots[i] = k;
    }
}

// Index of bytes in m, adding them when add is set (else TOK_NONE when absent).
static uint32_t bmap_get(BytesMap *m, const uint8_t *p, size_t n, int add) {
    if (!m->slots || (uint64_t)(m->n + 1) * 2 > m->mask + 1) bmap_grow(m);
    uint64_t i = bytes_hash(p, n) & m->mask;
    for (; m->slots[i] != TOK_NONE; i = (i + 1) & m->mask) {
        uint32_t k = m->slots[i];
        if (m->len[k] == n && !memcmp(m->arena.v + m->off[k], p, n)) return k;
    }
    if (!add) return TOK_NONE;
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 1024;
        m->off = realloc(m->off, m->cap * sizeof(*m->off));
        m->len = realloc(m->len, m->cap * sizeof(*m->len));
        if (!m->off || !m->len) die("out of memory counting tokenizer training pieces");
    }
    m->off[m->n] = m->arena.n;
    m->len[m->n] = (uint32_t)n;
    bytevec_append(&m->arena, p, n);
    m->slots[i] = m->n;
    return m->n++;
}

static void bmap_free(BytesMap *m) {
    free(m->slots); free(m->arena.v); free(m->off); free(m->len);
}

// ---------------------------------------------------------------- trainer

struct BpeTrainer {
    Pretok *pretok;
    PretokScratch *ps;
    BytesMap pieces;
    uint64_t *piece_count;
    uint32_t count_cap;
    uint64_t long_pieces, long_bytes;   // pieces over BPE_MAX_PIECE bytes, not counted
};

BpeTrainer *bpe_trainer_new(const char *pattern, char *err, size_t errlen) {
    Pretok *p = pretok_new(pattern, err, errlen);
    if (!p) return NULL;
    BpeTrainer *bt = xcalloc(1, sizeof(*bt));
    bt->pretok = p;
    bt->ps = pretok_scratch_new(p);
    return bt;
}

void bpe_trainer_free(BpeTrainer *bt) {
    if (!bt) return;
    pretok_scratch_free(bt->ps);
    pretok_free(bt->pretok);
    bmap_free(&bt->pieces);
    free(bt->piece_count);
    free(bt);
}

void bpe_trainer_add(BpeTrainer *bt, const char *text, size_t len) {
    size_t pos = 0;
    while (pos < len) {
        size_t end = pretok_next(bt->pretok, bt->ps, text, len, pos);
        size_t n = end - pos;
        // Very long pieces (whitespace runs, blobs) would dominate memory and teach nothing.
        if (n > BPE_MAX_PIECE) {
            bt->long_pieces++;
            bt->long_bytes += n;
        } else {
            uint32_t k = bmap_get(&bt->pieces, (const uint8_t *)text + pos, n, 1);
            if (k >= bt->count_cap) {
                uint32_t cap = bt->count_cap ? 2 * bt->count_cap : 1024;
                bt->piece_count = realloc(bt->piece_count, cap * sizeof(uint64_t));
                if (!bt->piece_count) die("out of memory counting tokenizer training pieces");
                memset(bt->piece_count + bt->count_cap, 0, (cap - bt->count_cap) * sizeof(uint64_t));
                bt->count_cap = cap;
            }
            bt->piece_count[k]++;
        }
        pos = end;
    }
}

uint64_t bpe_trainer_distinct_pieces(const BpeTrainer *bt) { return bt->pieces.n; }

uint64_t bpe_trainer_long_pieces(const BpeTrainer *bt, uint64_t *bytes) {
    *bytes = bt->long_bytes;
    return bt->long_pieces;
}

// ---------------------------------------------------------------- pair statistics

typedef struct Pairs {
    uint32_t *slots;
    uint64_t mask;
    uint32_t n, cap;
    uint64_t *key;     // left << 32 | right
    int64_t *count;    // occurrences weighted by piece counts
    int64_t *hi;       // the largest count among this pair's heap entries
    U32Vec *words;     // words that contain (or once contained) the pair
} Pairs;

typedef struct HeapEntry {
    int64_t count;
    uint64_t key;
} HeapEntry;

typedef struct Heap {
    HeapEntry *v;
    size_t n, cap;
} Heap;

static void pairs_rehash(Pairs *p) {
    uint64_t size = p->slots ? 2 * (p->mask + 1) : 4096;
    free(p->slots);
    p->slots = xmalloc(size * sizeof(uint32_t));
    memset(p->slots, 0xff, size * sizeof(uint32_t));
    p->mask = size - 1;
    for (uint32_t k = 0; k < p->n; k++) {
        uint64_t i = mix64(p->key[k]) & p->mask;
        while (p->slots[i] != TOK_NONE) i = (i + 1) & p->mask;
        p->slots[i] = k;
    }
}

static uint32_t pairs_get(Pairs *p, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    if (!p->slots || (uint64_t)(p->n + 1) * 2 > p->mask + 1) pairs_rehash(p);
    uint64_t i = mix64(key) & p->mask;
    for (; p->slots[i] != TOK_NONE; i = (i + 1) & p->mask)
        if (p->key[p->slots[i]] == key) return p->slots[i];
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 4096;
        p->key = realloc(p->key, p->cap * sizeof(*p->key));
        p->count = realloc(p->count, p->cap * sizeof(*p->count));
        p->hi = realloc(p->hi, p->cap * sizeof(*p->hi));
        p->words = realloc(p->words, p->cap * sizeof(*p->words));
        if (!p->key || !p->count || !p->hi || !p->words) die("out of memory counting tokenizer training pairs");
    }
    uint32_t k = p->n++;
    p->key[k] = key;
    p->count[k] = 0;
    p->hi[k] = 0;
    p->words[k] = (U32Vec){0};
    p->slots[i] = k;
    return k;
}

static int heap_before(const HeapEntry *x, const HeapEntry *y) {
    return x->count > y->count || (x->count == y->count && x->key < y->key);
}

static void heap_push(Heap *h, int64_t count, uint64_t key) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 4096;
        h->v = realloc(h->v, h->cap * sizeof(*h->v));
        if (!h->v) die("out of memory in tokenizer training");
    }
    HeapEntry e = {count, key};
    size_t i = h->n++;
    while (i > 0 && heap_before(&e, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = e;
}

static HeapEntry heap_pop(Heap *h) {
    HeapEntry top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && heap_before(&h->v[c + 1], &h->v[c])) c++;
        if (!heap_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

// Adds delta occurrences of (a, b) in word w; new pairs are recorded for the heap.
static void pair_add(Pairs *p, U32Vec *dirty, uint32_t a, uint32_t b, int64_t delta, uint32_t w, int record) {
    uint32_t k = pairs_get(p, a, b);
    p->count[k] += delta;
    if (record) {
        U32Vec *l = &p->words[k];
        if (!l->n || l->v[l->n - 1] != w) u32vec_push(l, w);
        u32vec_push(dirty, k);
    }
}

Tokenizer *bpe_trainer_finish(BpeTrainer *bt, uint32_t vocab_size, const char *const *specials, int n_specials,
                              int verbose, char *err, size_t errlen) {
    if (vocab_size < 256u + (uint32_t)n_specials || vocab_size > TOK_MAX_ID) {
        snprintf(err, errlen, "vocab size %u must be at least 256 + the %d special tokens (and at most %u)",
                 vocab_size, n_specials, TOK_MAX_ID);
        return NULL;
    }
    uint32_t target = vocab_size - (uint32_t)n_specials;
    // Vocabulary so far: id -> bytes (ids 0..255 are the bytes themselves).
    BytesMap vocab = {0};
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        bmap_get(&vocab, &c, 1, 1);
    }
    // Words as symbol sequences, one slot per distinct piece.
    uint32_t n_words = bt->pieces.n;
    uint64_t *wstart = xmalloc(((size_t)n_words + 1) * sizeof(uint64_t));
    uint32_t *wlen = xmalloc(((size_t)n_words + 1) * sizeof(uint32_t));
    uint32_t *sym = xmalloc(bt->pieces.arena.n * sizeof(uint32_t) + 4);
    for (uint32_t w = 0; w < n_words; w++) {
        wstart[w] = bt->pieces.off[w];
        wlen[w] = bt->pieces.len[w];
        for (uint32_t i = 0; i < wlen[w]; i++) sym[wstart[w] + i] = bt->pieces.arena.v[wstart[w] + i];
    }
    Pairs pairs = {0};
    Heap heap = {0};
    U32Vec dirty = {0};
    for (uint32_t w = 0; w < n_words; w++) {
        const uint32_t *s = sym + wstart[w];
        for (uint32_t i = 0; i + 1 < wlen[w]; i++)
            pair_add(&pairs, &dirty, s[i], s[i + 1], (int64_t)bt->piece_count[w], w, 1);
    }
    for (uint32_t k = 0; k < pairs.n; k++) {
        pairs.hi[k] = pairs.count[k];
        heap_push(&heap, pairs.count[k], pairs.key[k]);
    }
    dirty.n = 0;

    double t0 = now_seconds(), last_print = t0;
    uint8_t buf[2 * TOK_MAX_TOKEN_BYTES];
    while (vocab.n < target && heap.n) {
        HeapEntry top = heap_pop(&heap);
        uint32_t a = (uint32_t)(top.key >> 32), b = (uint32_t)top.key;
        uint32_t k = pairs_get(&pairs, a, b);
        if (pairs.count[k] <= 0) continue;
        if (top.count != pairs.count[k]) {
            // Stale: when this was the pair's highest entry, re-enter the true count.
            if (top.count == pairs.hi[k]) {
                pairs.hi[k] = pairs.count[k];
                heap_push(&heap, pairs.count[k], top.key);
            }
            continue;
        }
        size_t la = vocab.len[a], lb = vocab.len[b];
        if (la + lb > TOK_MAX_TOKEN_BYTES) { pairs.count[k] = 0; continue; }
        memcpy(buf, vocab.arena.v + vocab.off[a], la);
        memcpy(buf + la, vocab.arena.v + vocab.off[b], lb);
        // The same bytes can arise from two different pairs; they keep their first id.
        uint32_t id = bmap_get(&vocab, buf, la + lb, 1);
        // Copy the word list: pair_add may grow pairs.words (and move it) during the loop.
        U32Vec list = pairs.words[k];
        pairs.words[k] = (U32Vec){0};
        for (size_t li = 0; li < list.n; li++) {
            uint32_t w = list.v[li];
            uint32_t *s = sym + wstart[w], n = wlen[w];
            int has = 0;
            for (uint32_t i = 0; i + 1 < n && !has; i++) has = s[i] == a && s[i + 1] == b;
            if (!has) continue;
            int64_t c = (int64_t)bt->piece_count[w];
            for (uint32_t i = 0; i + 1 < n; i++) pair_add(&pairs, &dirty, s[i], s[i + 1], -c, w, 0);
            uint32_t o = 0;
            for (uint32_t i = 0; i < n;) {
                if (i + 1 < n && s[i] == a && s[i + 1] == b) { s[o++] = id; i += 2; }
                else s[o++] = s[i++];
            }
            wlen[w] = n = o;
            for (uint32_t i = 0; i + 1 < n; i++)
                pair_add(&pairs, &dirty, s[i], s[i + 1], c, w, s[i] == id || s[i + 1] == id);
        }
        free(list.v);
        for (size_t d = 0; d < dirty.n; d++) {
            uint32_t q = dirty.v[d];
            if (pairs.count[q] > pairs.hi[q]) {
                pairs.hi[q] = pairs.count[q];
                heap_push(&heap, pairs.count[q], pairs.key[q]);
            }
        }
        dirty.n = 0;
        double now = now_seconds();
        if (verbose && (now - last_print > 2.0 || vocab.n == target)) {
            fprintf(stderr, "tokenizer train: %u / %u tokens, %.1f s\n", vocab.n, target, now - t0);
            last_print = now;
        }
    }
    if (vocab.n < target)
        warn("the corpus supports only %u ordinary tokens (asked for %u): the vocabulary has %u ids", vocab.n, target,
             vocab.n + (uint32_t)n_specials);

    Tokenizer *t = tok_new(pretok_name(bt->pretok), err, errlen);
    for (uint32_t id = 0; t && id < vocab.n; id++)
        if (tok_add(t, id, vocab.arena.v + vocab.off[id], vocab.len[id], 0, err, errlen) != 0) { tok_free(t); t = NULL; }
    for (int i = 0; t && i < n_specials; i++) {
        const char *s = specials[i];
        if (!tok_special_text_ok(s, strlen(s))) {
            snprintf(err, errlen, "special token '%s' must be non-empty and without whitespace or control characters", s);
            tok_free(t);
            t = NULL;
        } else if (tok_add(t, vocab.n + (uint32_t)i, (const uint8_t *)s, strlen(s), 1, err, errlen) != 0) {
            tok_free(t);
            t = NULL;
        }
    }
    if (t && tok_finish(t, err, errlen) != 0) { tok_free(t); t = NULL; }

    for (uint32_t k = 0; k < pairs.n; k++) free(pairs.words[k].v);
    free(pairs.slots); free(pairs.key); free(pairs.count); free(pairs.hi); free(pairs.words);
    free(heap.v); free(dirty.v);
    free(wstart); free(wlen); free(sym);
    bmap_free(&vocab);
    return t;
}
