// Token embedding: a row gather forward; a deterministic scatter-add backward.
//
// Backward without atomics: the positions 0..N-1 are sorted by token with a stable radix
// sort (CUB), so each token's positions form one run in ascending order. The block that
// finds a run start sums the run's dout rows in that order in fp32 and adds the sum to the
// token's dwte row once. The order depends only on the tokens, never on the GPU.
#include "kernels/cuda_common.cuh"

#include <cub/device/device_radix_sort.cuh>

__global__ void embedding_forward_kernel(bf16 *out, const int *tokens, const bf16 *wte, int N, int C) {
    const int n = blockIdx.x;
    const bf16 *src = wte + (size_t)tokens[n] * C;
    bf16 *dst = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

extern "C" void cuda_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C) {
    if (N <= 0 || C <= 0) return;
    embedding_forward_kernel<<<N, 256>>>((bf16 *)out, tokens, (const bf16 *)wte, N, C);
    CUDA_LAUNCHED();
}

__global__ void iota_kernel(int *p, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = i;
}

// Grid (runs_blocks, column tiles). Block x walks the sorted positions i = x, x + gridDim.x,
// ...; where i starts a run (first position or a new token), its threads sum the run for
// their columns.
__global__ void embedding_backward_kernel(float *dwte, const bf16 *dout, const int *sorted_tok,
                                          const int *sorted_pos, int N, int C) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    for (int i = blockIdx.x; i < N; i += gridDim.x) {
        const int tok = sorted_tok[i];
        if (i > 0 && sorted_tok[i - 1] == tok) continue;
        if (c >= C) continue;
        float acc = 0.0f;
        for (int j = i; j < N && sorted_tok[j] == tok; j++)
            acc += ld(dout + (size_t)sorted_pos[j] * C + c);
        dwte[(size_t)tok * C + c] += acc;
    }
}

static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

extern "C" void cuda_embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C) {
    if (N <= 0 || C <= 0) return;
    // Scratch: positions in, sorted tokens, sorted positions, CUB temporaries.
    size_t cub_bytes = 0;
    // Token ids are non-negative int32 (the loader checks them against V): sorting the
    // 31 low bits is enough. The size query uses the same bit range as the sort.
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, cub_bytes, (const int *)NULL, (int *)NULL,
                                               (const int *)NULL, (int *)NULL, N, 0, 31, (cudaStream_t)0));
    const size_t arr = align_up((size_t)N * sizeof(int));
    char *ws = (char *)cuda_scratch(SCRATCH_EMB, 3 * arr + align_up(cub_bytes));
    int *pos_in = (int *)ws, *tok_sorted = (int *)(ws + arr), *pos_sorted = (int *)(ws + 2 * arr);
    void *cub_tmp = ws + 3 * arr;

    iota_kernel<<<ew_blocks((size_t)N, 256), 256>>>(pos_in, N);
    CUDA_LAUNCHED();
    // Stable: equal tokens keep ascending positions.
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, tokens, tok_sorted, pos_in, pos_sorted,
                                               N, 0, 31, (cudaStream_t)0));
    const int threads = C < 256 ? ((C + 31) / 32) * 32 : 256;
    dim3 grid((unsigned)(N < 2048 ? N : 2048), (unsigned)((C + threads - 1) / threads));
    embedding_backward_kernel<<<grid, threads>>>(dwte, (const bf16 *)dout, tok_sorted, pos_sorted, N, C);
    CUDA_LAUNCHED();
}
