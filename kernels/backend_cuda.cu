// The CUDA backend's op table (layers/backend.h): bf16 storage, fp32 everything else.
#include "kernels/backend_cuda.h"
#include "kernels/cuda_ops.h"

static const Backend g_backend_cuda = {
    /* name */ "cuda",
    /* act_bytes */ 2,
    cuda_alloc,
    cuda_release,
    cuda_zero,
    cuda_upload,
    cuda_download,
    cuda_store_weights,
    cuda_act_to_host,
    cuda_act_from_host,
    cuda_add_forward,
    cuda_accumulate,
    cuda_embedding_forward,
    cuda_embedding_backward,
    cuda_matmul_forward,
    cuda_matmul_backward,
    cuda_rmsnorm_forward,
    cuda_rmsnorm_backward,
    cuda_rope_forward,
    cuda_rope_backward,
    cuda_attention_forward,
    cuda_attention_backward,
    cuda_swiglu_forward,
    cuda_swiglu_backward,
    cuda_xent_forward,
    cuda_xent_backward,
    cuda_sumsq,
    cuda_adamw_update,
};

extern "C" const Backend *backend_cuda(void) { return &g_backend_cuda; }
