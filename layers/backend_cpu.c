// The CPU reference backend: fp32 storage, so act/weight elements are 4 bytes and every
// buffer is ordinary host memory. See backend/backend.h for the contract.
#include "backend/backend.h"
#include "layers/cpu_ops.h"
#include "backend/moe_routing.h"

static const Backend cpu_backend = {
    .name = "cpu",
    .act_bytes = 4,
    .host_memory = 1,

    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .store_weights = cpu_store_weights,
    .act_to_host = cpu_act_to_host,
    .act_from_host = cpu_act_from_host,

    .add_forward = cpu_add_forward,
    .accumulate = cpu_accumulate,

    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,

    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .matmul_residual_forward = cpu_matmul_residual_forward,

    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,

    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .rope_rows_forward = cpu_rope_rows_forward,
    .paged_attention = cpu_paged_attention,

    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,

    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,

    .xent_forward = cpu_xent_forward,
    .xent_backward = cpu_xent_backward,

    .sumsq = cpu_sumsq,
    .sumsq_stripes = cpu_sumsq_stripes,
    .adamw_update = cpu_adamw_update,

    .copy_cols = cpu_copy_cols,
    .int_group_roundtrip = cpu_int_group_roundtrip,

    .moe_router_forward = cpu_moe_router_forward,
    .moe_router_backward = cpu_moe_router_backward,
    .moe_topk_forward = moe_route_topk_forward,
    .moe_dispatch = moe_route_dispatch,
    .moe_aux_forward = moe_route_aux_forward,
    .moe_router_softmax_backward = moe_route_router_softmax_backward,
    .moe_gather_forward = cpu_moe_gather_forward,
    .moe_gather_backward = cpu_moe_gather_backward,
    .moe_combine_forward = cpu_moe_combine_forward,
    .moe_combine_backward = cpu_moe_combine_backward,
    .moe_expert_matmul_forward = cpu_moe_expert_matmul_forward,
    .moe_expert_matmul_backward = cpu_moe_expert_matmul_backward,
};

const Backend *backend_cpu(void) { return &cpu_backend; }
