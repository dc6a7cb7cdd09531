// The int_group codec's quantize-dequantize round trip on bf16 rows, with the arithmetic
// of backend/int_group_math.h (shared with the CPU op and the cache codec): per group of
// `group` contiguous values, scale = bf16_round_up(max|x| / Imax), code = rint(x / scale)
// clamped, out = code * scale. The inputs are bf16; the product code * scale is rounded to
// bf16 for storage (it has up to bits-1 + 8 significant bits, so it is not always exact in
// bf16 for bits > 1: the CPU backend keeps it exact in fp32).
#include "kernels/cuda_common.cuh"
#include "backend/int_group_math.h"

// One warp per group; lanes stride over the group's values. out may equal in: every lane
// reads and writes only its own elements, and all reads precede the write of each element.
__global__ void int_group_roundtrip_kernel(bf16 *out, const bf16 *in, size_t ngroups, int group, int bits) {
    const size_t g = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (g >= ngroups) return;
    const bf16 *x = in + g * group;
    bf16 *y = out + g * group;
    float absmax = 0.0f;
    for (int j = lane; j < group; j += 32) absmax = int_group_absmax_step(absmax, ld(x + j));
    const int nan_in_group = __any_sync(0xFFFFFFFFu, absmax != absmax);   // warp_max's fmaxf drops a NaN
    absmax = nan_in_group ? __int_as_float(0x7FC00000) : warp_max(absmax);
    const float scale = int_group_scale(absmax, bits);
    for (int j = lane; j < group; j += 32) y[j] = to_bf16((float)int_group_code(ld(x + j), scale, bits) * scale);
}

extern "C" void cuda_int_group_roundtrip(float *out, const float *in, int N, int W, int bits, int group) {
    if (N <= 0 || W <= 0) return;
    if (group <= 0 || W % group != 0 || bits < 2 || bits > 16)
        die("int_group: group %d must divide the row width %d and bits (%d) lie in [2, 16]", group, W, bits);
    // Rows are contiguous (N, W), so the groups of all rows are one contiguous sequence.
    const size_t ngroups = (size_t)N * (W / group);
    const int warps = 8;
    int_group_roundtrip_kernel<<<(unsigned)((ngroups + warps - 1) / warps), 32 * warps>>>(
        (bf16 *)out, (const bf16 *)in, ngroups, group, bits);
    CUDA_LAUNCHED();
}
