// Optimizer ops, all fp32: the global-norm sum of squares (double, fixed order) and AdamW, alone
// or with the bf16 store of its result in the same pass.
#include "kernels/cuda_common.cuh"

#include <math.h>

#include "backend/bf16.h"

// Fixed grid: the partition of g into per-thread strides, and so the summation order, is
// the same on every GPU and every call of the same n.
#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256

// The elements [k period + lo, k period + lo + stripe) clipped to end of every round k < rounds
// (ZeRO-1's stripes, model/shard.h; the whole buffer is one round of n): thread i of the grid
// adds the elements i, i + grid, ... of each round in round order.
__global__ void sumsq_partial_kernel(double *partial, const float *g, size_t lo, size_t stripe, size_t period, size_t end,
                                     size_t rounds) {
    __shared__ double sh[SUMSQ_THREADS / 32];
    double acc = 0.0;
    for (size_t k = 0; k < rounds; k++) {
        const size_t a = k * period + lo, len = a >= end ? 0 : end - a < stripe ? end - a : stripe;
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (size_t)gridDim.x * blockDim.x) {
            const double x = (double)g[a + i];
            acc += x * x;
        }
    }
    acc = warp_sum_d(acc);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < SUMSQ_THREADS / 32; w++) s += sh[w];
        partial[blockIdx.x] = s;
    }
}

// One block sums the SUMSQ_BLOCKS partials: thread t adds partials t, t + 256, ...; then the
// warp and block trees as above.
__global__ void sumsq_final_kernel(double *out, const double *partial, int np) {
    __shared__ double sh[SUMSQ_THREADS / 32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) acc += partial[i];
    acc = warp_sum_d(acc);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < SUMSQ_THREADS / 32; w++) s += sh[w];
        *out = s;
    }
}

extern "C" double cuda_sumsq_stripes(const float *g, size_t lo, size_t stripe, size_t period, size_t end) {
    if (lo >= end || stripe == 0) return 0.0;
    double *partial = (double *)cuda_scratch(SCRATCH_PARTIAL, (SUMSQ_BLOCKS + 1) * sizeof(double));
    sumsq_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS>>>(partial, g, lo, stripe, period, end, (end - lo + period - 1) / period);
    CUDA_LAUNCHED();
    sumsq_final_kernel<<<1, SUMSQ_THREADS>>>(partial + SUMSQ_BLOCKS, partial, SUMSQ_BLOCKS);
    CUDA_LAUNCHED();
    double result = 0.0;
    CUDA_CHECK(cudaMemcpy(&result, partial + SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost));
    return result;
}

extern "C" double cuda_sumsq(const float *g, size_t n) { return cuda_sumsq_stripes(g, 0, n, n, n); }

// AdamW in the evaluation order of torch.optim.AdamW (and of the CPU reference), so the
// backends agree to fp32 rounding (nvcc may contract a * b + c into an fma; the CPU does not):
//   p *= 1 - lr wd ; m = b1 m + (1 - b1) g ; v = b2 v + (1 - b2) g^2
//   p -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps),  step_size = lr / (1 - b1^t)
// The scalar factors are formed in double on the host and rounded once to fp32.
// With store (the fused form): the updated master is also stored as the bf16 weight, as
// cuda_store_weights would store it (sr_round_weight, backend/bf16.h), in the same pass.
__global__ void adamw_kernel(float *param, float *m, float *v, const float *grad, size_t n, float beta1,
                             float beta2, float omb1, float omb2, float eps, float grad_scale,
                             float step_size, float bc2_sqrt, float decay, uint16_t *store, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + omb1 * g;
        const float vi = beta2 * v[i] + omb2 * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        const float p = param[i] * decay - step_size * (mi / denom);
        param[i] = p;
        if (store) store[i] = sr_round_weight(p, seed, i);
    }
}

// op: the public function, which names the launch in errors and per-op timing
static void adamw_launch(const char *op, float *param, float *m, float *v, const float *grad, size_t n, float lr,
                         float beta1, float beta2, float eps, float wd, float grad_scale, int t, uint16_t *store,
                         uint64_t seed) {
    if (!n) return;
    if (t < 1) die("adamw: step t = %d; steps count from 1", t);
    const double bc1 = 1.0 - pow((double)beta1, (double)t);
    const double bc2 = 1.0 - pow((double)beta2, (double)t);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    adamw_kernel<<<ew_blocks(n, 256), 256>>>(param, m, v, grad, n, beta1, beta2, 1.0f - beta1, 1.0f - beta2, eps,
                                             grad_scale, step_size, bc2_sqrt, decay, store, seed);
    cuda_after_launch(__FILE__, __LINE__, op);
}

extern "C" void cuda_adamw_update(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                                  float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    adamw_launch(__func__, param, m, v, grad, n, lr, beta1, beta2, eps, wd, grad_scale, t, NULL, 0);
}

extern "C" void cuda_adamw_update_store(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                                        float beta1, float beta2, float eps, float wd, float grad_scale, int t,
                                        float *store, unsigned long long seed) {
    adamw_launch(__func__, param, m, v, grad, n, lr, beta1, beta2, eps, wd, grad_scale, t, (uint16_t *)store,
                 (uint64_t)seed);
}
