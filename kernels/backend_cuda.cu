// The CUDA backend's op table (backend/backend.h): bf16 storage, fp32 everything else.
// Filled by member name (C++17 has no designated initializers), so that ops added to the
// struct elsewhere stay NULL here until implemented rather than shifting every pointer.
#include "kernels/backend_cuda.h"
#include "kernels/cuda_ops.h"

static Backend make_backend_cuda(void) {
    Backend b = Backend();
    b.name = "cuda";
    b.act_bytes = 2;
    b.max_head_width = CUDA_ATT_MAX_D;
    b.alloc = cuda_alloc;
    b.release = cuda_release;
    b.zero = cuda_zero;
    b.upload = cuda_upload;
    b.download = cuda_download;
    b.copy = cuda_copy;
    b.store_weights = cuda_store_weights;
    b.act_to_host = cuda_act_to_host;
    b.act_from_host = cuda_act_from_host;
    b.add_forward = cuda_add_forward;
    b.accumulate = cuda_accumulate;
    b.embedding_forward = cuda_embedding_forward;
    b.embedding_backward = cuda_embedding_backward;
    b.matmul_forward = cuda_matmul_forward;
    b.matmul_residual_forward = cuda_matmul_residual_forward;
    b.matmul_backward = cuda_matmul_backward;
    b.rmsnorm_forward = cuda_rmsnorm_forward;
    b.rmsnorm_backward = cuda_rmsnorm_backward;
    b.rope_forward = cuda_rope_forward;
    b.rope_backward = cuda_rope_backward;
    b.rope_rows_forward = cuda_rope_rows_forward;
    b.paged_attention = cuda_paged_attention;
    b.attention_forward = cuda_attention_forward;
    b.attention_backward = cuda_attention_backward;
    b.swiglu_forward = cuda_swiglu_forward;
    b.swiglu_backward = cuda_swiglu_backward;
    b.xent_forward = cuda_xent_forward;
    b.xent_backward = cuda_xent_backward;
    b.sumsq = cuda_sumsq;
    b.sumsq_stripes = cuda_sumsq_stripes;
    b.adamw_update = cuda_adamw_update;
    b.adamw_update_store = cuda_adamw_update_store;
    b.copy_cols = cuda_copy_cols;
    b.int_group_roundtrip = cuda_int_group_roundtrip;
    b.moe_router_forward = cuda_moe_router_forward;
    b.moe_router_backward = cuda_moe_router_backward;
    b.moe_topk_forward = cuda_moe_topk_forward;
    b.moe_dispatch = cuda_moe_dispatch;
    b.moe_aux_forward = cuda_moe_aux_forward;
    b.moe_router_softmax_backward = cuda_moe_router_softmax_backward;
    b.moe_gather_forward = cuda_moe_gather_forward;
    b.moe_gather_backward = cuda_moe_gather_backward;
    b.moe_combine_forward = cuda_moe_combine_forward;
    b.moe_combine_backward = cuda_moe_combine_backward;
    b.moe_expert_matmul_forward = cuda_moe_expert_matmul_forward;
    b.moe_expert_matmul_backward = cuda_moe_expert_matmul_backward;
    return b;
}

static const Backend g_backend_cuda = make_backend_cuda();

extern "C" const Backend *backend_cuda(void) { return &g_backend_cuda; }
