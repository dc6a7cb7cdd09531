#include "model/tensor_table.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"

// FNV-1a, finalized: the table is built once per model, so a simple hash with a half-full index suffices.
static size_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    // FNV's low bits (the ones the mask keeps) mix poorly: fold the high bits in (murmur3's finalizer)
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h;
}

// An index slot holds (hash's high 32 bits << 32) | (table index + 1); 0 is empty. The tag
// spares most probes a string compare (and a cache miss into the table) in big tables.
static uint64_t slot_of(size_t h, int i) { return ((uint64_t)h & 0xffffffff00000000ull) | (uint64_t)(uint32_t)(i + 1); }

static void index_insert(TensorTable *tt, size_t h, int i) {
    size_t mask = tt->index_cap - 1, k = h & mask;
    while (tt->index[k]) k = (k + 1) & mask;
    tt->index[k] = slot_of(h, i);
}

// Keeps the index at most half full (capacity a power of two), rebuilding it (all n entries)
// on growth: returns 1 when it did.
static int index_grow(TensorTable *tt) {
    if ((size_t)tt->n * 2 < tt->index_cap) return 0;
    size_t cap = tt->index_cap ? tt->index_cap : 128;
    while ((size_t)tt->n * 2 >= cap) cap *= 2;
    free(tt->index);
    tt->index = xcalloc(cap, sizeof(uint64_t));
    tt->index_cap = cap;
    for (int i = 0; i < tt->n; i++) index_insert(tt, name_hash(tt->t[i].name), i);
    return 1;
}

static int find_hashed(const TensorTable *tt, const char *name, size_t h) {
    if (!tt->index_cap) return -1;
    size_t mask = tt->index_cap - 1;
    uint64_t tag = (uint64_t)h & 0xffffffff00000000ull;
    for (size_t k = h & mask; tt->index[k]; k = (k + 1) & mask) {
        if ((tt->index[k] & 0xffffffff00000000ull) != tag) continue;
        int i = (int)(uint32_t)tt->index[k] - 1;
        if (!strcmp(tt->t[i].name, name)) return i;
    }
    return -1;
}

// x + bytes (raw) and that rounded up to 256 (end); 0 (refused) when it would overflow: the
// layout sizes real allocations.
static int place_ok(size_t x, size_t numel, size_t elem_bytes, size_t *raw, size_t *end) {
    int64_t bytes, e, r;
    if (ck_mul((int64_t)numel, (int64_t)elem_bytes, &bytes) || ck_add((int64_t)x, bytes, &r) || ck_add(r, 255, &e)) return 0;
    *raw = (size_t)r;
    *end = (size_t)e & ~(size_t)255;
    return 1;
}

void table_join_next(TensorTable *tt) {
    if (tt->n == 0) die("internal: table_join_next on an empty table");
    tt->join_next = 1;
}

// A plan-only table's add, same arithmetic as table_add + table_layout: -1 when anything is
// out of range (the caller then goes the named way, which dies naming the tensor).
static int plan_add(TensorTable *tt, int dtype, int ndim, const int64_t *shape) {
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS || tt->n == INT_MAX) return -1;
    int64_t numel = 1, total;
    for (int d = 0; d < ndim; d++)
        if (shape[d] <= 0 || ck_mul(numel, shape[d], &numel)) return -1;
    size_t s, f, rs, rf;
    const int join = tt->join_next;   // starts at the last one's unpadded ends
    if (ck_add((int64_t)tt->numel, numel, &total) ||
        !place_ok(join ? tt->plan_raw_store : tt->bytes_store, (size_t)numel, dtype == DT_F32 ? 4 : tt->plan_store_bytes, &rs, &s) ||
        !place_ok(join ? tt->plan_raw_f32 : tt->bytes_f32, (size_t)numel, 4, &rf, &f))
        return -1;
    tt->join_next = 0;
    tt->numel = (size_t)total;
    tt->bytes_store = s;
    tt->bytes_f32 = f;
    tt->plan_raw_store = rs;
    tt->plan_raw_f32 = rf;
    return tt->n++;
}

int table_add(TensorTable *tt, const char *name, int layer, int decay, int dtype, int ndim, const int64_t *shape) {
    size_t name_len = strlen(name);
    if (name_len >= TENSOR_NAME_MAX) die("internal: tensor name too long: %s", name);
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS) die("internal: tensor %s has %d dims", name, ndim);
    if (tt->plan_store_bytes) {
        int i = plan_add(tt, dtype, ndim, shape);
        if (i >= 0) return i;
        if (tt->n == INT_MAX) die("tensor table: more than %d tensors: use fewer layers or experts", INT_MAX);
    }
    size_t h = tt->unindexed || tt->plan_store_bytes ? 0 : name_hash(name);
    if (!tt->unindexed && !tt->plan_store_bytes && find_hashed(tt, name, h) >= 0) die("internal: duplicate tensor name %s", name);
    if (tt->n == tt->cap) {
        if (tt->cap > INT_MAX / 2) die("tensor table: more than %d tensors: use fewer layers or experts", INT_MAX / 2);
        tt->cap = tt->cap ? 2 * tt->cap : 64;
        TensorInfo *nt = realloc(tt->t, (size_t)tt->cap * sizeof(TensorInfo));
        if (!nt) die("out of memory growing the tensor table");
        tt->t = nt;
    }
    TensorInfo *ti = &tt->t[tt->n];
    memset(ti, 0, sizeof(*ti));
    memcpy(ti->name, name, name_len + 1);
    ti->ndim = ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) die("internal: tensor %s has a non-positive dim", name);
        ti->shape[d] = shape[d];
        if (ck_mul(numel, shape[d], &numel)) die("tensor %s: its element count overflows 64 bits: the config is too large", name);
    }
    int64_t total;
    if (ck_add((int64_t)tt->numel, numel, &total)) die("tensor %s: the table's element count overflows 64 bits: the config is too large", name);
    if (tt->plan_store_bytes)   // plan_add refused it for the layout alone
        die("tensor %s: the table's byte size overflows 64 bits: the config is too large", name);
    ti->numel = (size_t)numel;
    ti->layer = layer;
    ti->decay = decay;
    ti->dtype = dtype;
    ti->joined = tt->join_next;
    if (ti->joined && tt->t[tt->n - 1].dtype != dtype) die("internal: tensor %s joined to one of another dtype", name);
    tt->join_next = 0;
    tt->numel = (size_t)total;
    tt->n++;
    if (!tt->unindexed && !index_grow(tt)) index_insert(tt, h, tt->n - 1);
    return tt->n - 1;
}

int table_addf(TensorTable *tt, int layer, int decay, int dtype, int ndim, const int64_t *shape, const char *fmt, ...) {
    if (tt->plan_store_bytes) {   // no name to format unless something is wrong
        int i = plan_add(tt, dtype, ndim, shape);
        if (i >= 0) return i;
    }
    char name[TENSOR_NAME_MAX + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    return table_add(tt, name, layer, decay, dtype, ndim, shape);
}

int table_find(const TensorTable *tt, const char *name) {
    if (tt->unindexed || tt->plan_store_bytes) die("internal: table_find on a table built without its name index");
    return find_hashed(tt, name, name_hash(name));
}

// x + bytes (raw) and that rounded up to 256 (returned), or die: the layout must never wrap (it
// sizes real allocations).
static size_t place(size_t x, size_t numel, size_t elem_bytes, const char *name, size_t *raw) {
    size_t end;
    if (!place_ok(x, numel, elem_bytes, raw, &end)) die("tensor %s: the table's byte size overflows 64 bits: the config is too large", name);
    return end;
}

void table_layout(TensorTable *tt, size_t store_bytes) {
    if (tt->plan_store_bytes) {   // laid out while it was counted
        if (store_bytes != tt->plan_store_bytes) die("internal: plan-only table laid out with %zu-byte storage, planned with %zu", store_bytes, tt->plan_store_bytes);
        return;
    }
    size_t s = 0, f = 0, rs = 0, rf = 0;   // the next offsets; the last tensor's unpadded ends
    for (int i = 0; i < tt->n; i++) {
        TensorInfo *ti = &tt->t[i];
        size_t eb = ti->dtype == DT_F32 ? 4 : store_bytes;
        ti->off_store = ti->joined ? rs : s;
        ti->off_f32 = ti->joined ? rf : f;
        s = place(ti->off_store, ti->numel, eb, ti->name, &rs);
        f = place(ti->off_f32, ti->numel, 4, ti->name, &rf);
    }
    tt->bytes_store = s;
    tt->bytes_f32 = f;
}

void table_free(TensorTable *tt) {
    free(tt->t);
    free(tt->index);
    memset(tt, 0, sizeof(*tt));
}
