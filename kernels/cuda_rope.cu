// RoPE, rotate-half (HF) form, in place on bf16 (B, T, H, S) with the rotated dims
// [off, off + D) of each head. The cos/sin table (T, D/2) is formed in double, as the CPU
// reference does (an fp32 angle (pos0 + t) * f is off by ~pos * 6e-8 rad), then rounded
// to fp32; the rotation itself is fp32 with one bf16 rounding per output.
#include "kernels/cuda_common.cuh"

__global__ void rope_table_kernel(float2 *cs, int T, int half, int D, int pos0, float theta, float sign) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * half) return;
    const int t = idx / half, i = idx % half;
    const double f = pow((double)theta, -2.0 * i / D);
    const double a = (double)(pos0 + t) * f;
    cs[idx] = make_float2((float)cos(a), sign * (float)sin(a));
}

// One thread per (b, t, h, i) with i < D/2: the pair (i, i + D/2).
__global__ void rope_rotate_kernel(bf16 *x, const float2 *cs, int T, int H, int S, int off, int half,
                                   size_t total) {
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const size_t bth = idx / half;            // (b * T + t) * H + h
        const int t = (int)((bth / H) % T);
        const float2 c = cs[(size_t)t * half + i];
        bf16 *p = x + bth * S + off;
        const float x0 = ld(p + i), x1 = ld(p + i + half);
        p[i] = to_bf16(x0 * c.x - x1 * c.y);
        p[i + half] = to_bf16(x1 * c.x + x0 * c.y);
    }
}

static void rope_rotate(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta, float sign) {
    if (D % 2 != 0 || off < 0 || off + D > S)
        die("rope: rotated dims [%d, %d) must be even in number and lie inside the head's %d elements", off, off + D, S);
    const int half = D / 2;
    if (B <= 0 || T <= 0 || H <= 0 || half <= 0) return;
    float2 *cs = (float2 *)cuda_scratch(SCRATCH_ROPE, (size_t)T * half * sizeof(float2));
    rope_table_kernel<<<(T * half + 255) / 256, 256>>>(cs, T, half, D, pos0, theta, sign);
    CUDA_LAUNCHED();
    const size_t total = (size_t)B * T * H * half;
    rope_rotate_kernel<<<ew_blocks(total, 256), 256>>>((bf16 *)x, cs, T, H, S, off, half, total);
    CUDA_LAUNCHED();
}

extern "C" void cuda_rope_forward(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    rope_rotate(x, B, T, H, S, off, D, pos0, theta, 1.0f);
}

// The transpose rotation (angle -a), rewriting dx (not accumulating, as the contract says).
extern "C" void cuda_rope_backward(float *dx, int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    rope_rotate(dx, B, T, H, S, off, D, pos0, theta, -1.0f);
}
