// A tensor table: named tensors with shapes, owner layer, weight-decay flag and dtype.
// It drives allocation (one buffer per category, tensors at table offsets), checkpoint
// I/O (names and shapes), the optimizer's decay mask and tests. No magic indices: code
// keeps the index that table_add returned in a named field, or looks a name up.
#ifndef CLLA_MODEL_TENSOR_TABLE_H
#define CLLA_MODEL_TENSOR_TABLE_H

#include <stddef.h>
#include <stdint.h>

enum { DT_STORE = 0, DT_F32 = 1 };   // backend storage dtype (fp32 CPU, bf16 CUDA) or always fp32

#define TENSOR_NAME_MAX 96
#define TENSOR_MAX_DIMS 4

typedef struct TensorInfo {
    char name[TENSOR_NAME_MAX];
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
    size_t numel;
    int layer;         // owner layer, -1 for model-level tensors
    int decay;         // weight decay applies (weight matrices, not norms)
    int dtype;         // DT_STORE or DT_F32
    size_t off_store;  // byte offset in a buffer laid out with the backend's storage size
    size_t off_f32;    // byte offset in an fp32 buffer of the same table (grads, masters, m, v)
    int joined;        // starts where the tensor before it ends, without padding (table_join_next)
} TensorInfo;

typedef struct TensorTable {
    TensorInfo *t;
    int n, cap;
    uint64_t *index;      // open-addressing hash of names -> table index (model/tensor_table.c)
    size_t index_cap;
    size_t bytes_store;   // total of the storage layout (after table_layout)
    size_t bytes_f32;     // total of the fp32 layout
    size_t numel;         // total elements
    // 1: no name index (and no duplicate check): for tables addressed only by the indices
    // table_add returned, such as the activations, whose names are generated per layer and
    // only read in dumps. Set before the first table_add; table_find refuses such a table.
    int unindexed;
    // Nonzero: a plan-only table (clla info, the memory check before a run): table_add counts
    // and lays out each tensor (storage elements of this many bytes) but stores no entry, so
    // a model of 100,000 layers is planned in milliseconds. Set before the first table_add;
    // the returned indices only count, and table_find, table_ptr_* and t[] must not be used.
    size_t plan_store_bytes;
    int join_next;                      // the next table_add is joined (table_join_next)
    size_t plan_raw_store, plan_raw_f32;   // a plan-only table: the last tensor's unpadded ends
} TensorTable;

// Adds a tensor; returns its index. Dies on a duplicate name.
int table_add(TensorTable *tt, const char *name, int layer, int decay, int dtype, int ndim, const int64_t *shape);
// printf-style name helpers: table_addf(tt, layer, decay, dtype, ndim, shape, "model.layers.%d.x", l)
int table_addf(TensorTable *tt, int layer, int decay, int dtype, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
int table_find(const TensorTable *tt, const char *name);   // -1 when absent; O(1) (hashed names)
// The next tensor added starts where the last one added ends, with no padding between them,
// in every layout, so that two matrices of the same input width are one matrix of their rows
// (gate_proj and up_proj: one product for both, model/forward.c). Same dtype as the last one.
void table_join_next(TensorTable *tt);
// Computes byte offsets (checked: dies rather than wrap; config_check_sizes refuses such configs first): storage elements of store_bytes (DT_F32 tensors always 4), each
// tensor aligned to 256 bytes (GPU-friendly, and harmless on the CPU) except a joined one.
void table_layout(TensorTable *tt, size_t store_bytes);
void table_free(TensorTable *tt);

// Pointers into category buffers.
static inline void *table_ptr_store(const TensorTable *tt, void *base, int i) {
    return (char *)base + tt->t[i].off_store;
}
static inline float *table_ptr_f32(const TensorTable *tt, float *base, int i) {
    return (float *)((char *)base + tt->t[i].off_f32);
}

#endif
