#include "model/tensor_table.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int table_add(TensorTable *tt, const char *name, int layer, int decay, int dtype, int ndim, const int64_t *shape) {
    if (strlen(name) >= TENSOR_NAME_MAX) die("internal: tensor name too long: %s", name);
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS) die("internal: tensor %s has %d dims", name, ndim);
    if (table_find(tt, name) >= 0) die("internal: duplicate tensor name %s", name);
    if (tt->n == tt->cap) {
        tt->cap = tt->cap ? 2 * tt->cap : 64;
        TensorInfo *nt = realloc(tt->t, (size_t)tt->cap * sizeof(TensorInfo));
        if (!nt) die("out of memory growing the tensor table");
        tt->t = nt;
    }
    TensorInfo *ti = &tt->t[tt->n];
    memset(ti, 0, sizeof(*ti));
    snprintf(ti->name, sizeof(ti->name), "%s", name);
    ti->ndim = ndim;
    ti->numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) die("internal: tensor %s has a non-positive dim", name);
        ti->shape[d] = shape[d];
        ti->numel *= (size_t)shape[d];
    }
    ti->layer = layer;
    ti->decay = decay;
    ti->dtype = dtype;
    tt->numel += ti->numel;
    return tt->n++;
}

int table_addf(TensorTable *tt, int layer, int decay, int dtype, int ndim, const int64_t *shape, const char *fmt, ...) {
    char name[TENSOR_NAME_MAX + 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    return table_add(tt, name, layer, decay, dtype, ndim, shape);
}

int table_find(const TensorTable *tt, const char *name) {
    for (int i = 0; i < tt->n; i++)
        if (!strcmp(tt->t[i].name, name)) return i;
    return -1;
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

void table_layout(TensorTable *tt, size_t store_bytes) {
    size_t s = 0, f = 0;
    for (int i = 0; i < tt->n; i++) {
        TensorInfo *ti = &tt->t[i];
        size_t eb = ti->dtype == DT_F32 ? 4 : store_bytes;
        ti->off_store = s;
        ti->off_f32 = f;
        s = align256(s + ti->numel * eb);
        f = align256(f + ti->numel * 4);
    }
    tt->bytes_store = s;
    tt->bytes_f32 = f;
}

void table_free(TensorTable *tt) {
    free(tt->t);
    memset(tt, 0, sizeof(*tt));
}
