// Which ops a backend's table fills, checked when a model starts (backend/backend.h).
#include "backend/backend.h"

#include <stddef.h>
#include <string.h>

typedef struct OpEntry {
    const char *name;
    size_t offset;
    int group;
} OpEntry;

// Every entry of the Backend table, with the feature that needs it.
static const OpEntry OPS[] = {
    {"alloc", offsetof(Backend, alloc), BACKEND_OPS_CORE},
    {"release", offsetof(Backend, release), BACKEND_OPS_CORE},
    {"zero", offsetof(Backend, zero), BACKEND_OPS_CORE},
    {"upload", offsetof(Backend, upload), BACKEND_OPS_CORE},
    {"download", offsetof(Backend, download), BACKEND_OPS_CORE},
    {"copy", offsetof(Backend, copy), BACKEND_OPS_CORE},
    {"store_weights", offsetof(Backend, store_weights), BACKEND_OPS_CORE},
    {"act_to_host", offsetof(Backend, act_to_host), BACKEND_OPS_CORE},
    {"act_from_host", offsetof(Backend, act_from_host), BACKEND_OPS_CORE},
    {"add_forward", offsetof(Backend, add_forward), BACKEND_OPS_CORE},
    {"accumulate", offsetof(Backend, accumulate), BACKEND_OPS_CORE},
    {"embedding_forward", offsetof(Backend, embedding_forward), BACKEND_OPS_CORE},
    {"embedding_backward", offsetof(Backend, embedding_backward), BACKEND_OPS_CORE},
    {"matmul_forward", offsetof(Backend, matmul_forward), BACKEND_OPS_CORE},
    {"matmul_backward", offsetof(Backend, matmul_backward), BACKEND_OPS_CORE},
    {"matmul_residual_forward", offsetof(Backend, matmul_residual_forward), BACKEND_OPS_CORE},
    {"rmsnorm_forward", offsetof(Backend, rmsnorm_forward), BACKEND_OPS_CORE},
    {"rmsnorm_backward", offsetof(Backend, rmsnorm_backward), BACKEND_OPS_CORE},
    {"rope_forward", offsetof(Backend, rope_forward), BACKEND_OPS_CORE},
    {"rope_backward", offsetof(Backend, rope_backward), BACKEND_OPS_CORE},
    {"rope_rows_forward", offsetof(Backend, rope_rows_forward), BACKEND_OPS_DECODE},
    {"attention_forward", offsetof(Backend, attention_forward), BACKEND_OPS_CORE},
    {"attention_backward", offsetof(Backend, attention_backward), BACKEND_OPS_CORE},
    {"paged_attention", offsetof(Backend, paged_attention), BACKEND_OPS_DECODE},
    {"swiglu_forward", offsetof(Backend, swiglu_forward), BACKEND_OPS_CORE},
    {"swiglu_backward", offsetof(Backend, swiglu_backward), BACKEND_OPS_CORE},
    {"xent_forward", offsetof(Backend, xent_forward), BACKEND_OPS_CORE},
    {"xent_backward", offsetof(Backend, xent_backward), BACKEND_OPS_CORE},
    {"sumsq", offsetof(Backend, sumsq), BACKEND_OPS_CORE},
    {"sumsq_stripes", offsetof(Backend, sumsq_stripes), BACKEND_OPS_CORE},
    {"adamw_update", offsetof(Backend, adamw_update), BACKEND_OPS_CORE},
    {"adamw_update_store", offsetof(Backend, adamw_update_store), 0},   // optional: no feature needs it
    {"copy_cols", offsetof(Backend, copy_cols), BACKEND_OPS_CORE},
    {"int_group_roundtrip", offsetof(Backend, int_group_roundtrip), BACKEND_OPS_CORE},
    {"moe_router_forward", offsetof(Backend, moe_router_forward), BACKEND_OPS_MOE},
    {"moe_router_backward", offsetof(Backend, moe_router_backward), BACKEND_OPS_MOE},
    {"moe_topk_forward", offsetof(Backend, moe_topk_forward), BACKEND_OPS_MOE},
    {"moe_dispatch", offsetof(Backend, moe_dispatch), BACKEND_OPS_MOE},
    {"moe_aux_forward", offsetof(Backend, moe_aux_forward), BACKEND_OPS_MOE},
    {"moe_router_softmax_backward", offsetof(Backend, moe_router_softmax_backward), BACKEND_OPS_MOE},
    {"moe_gather_forward", offsetof(Backend, moe_gather_forward), BACKEND_OPS_MOE},
    {"moe_gather_backward", offsetof(Backend, moe_gather_backward), BACKEND_OPS_MOE},
    {"moe_combine_forward", offsetof(Backend, moe_combine_forward), BACKEND_OPS_MOE},
    {"moe_combine_backward", offsetof(Backend, moe_combine_backward), BACKEND_OPS_MOE},
    {"moe_expert_matmul_forward", offsetof(Backend, moe_expert_matmul_forward), BACKEND_OPS_MOE},
    {"moe_expert_matmul_backward", offsetof(Backend, moe_expert_matmul_backward), BACKEND_OPS_MOE},
};

const char *backend_missing_op(const Backend *be, int groups) {
    for (size_t i = 0; i < sizeof(OPS) / sizeof(OPS[0]); i++) {
        if (!(OPS[i].group & groups)) continue;
        void (*fn)(void);
        memcpy(&fn, (const char *)be + OPS[i].offset, sizeof(fn));
        if (!fn) return OPS[i].name;
    }
    return NULL;
}
