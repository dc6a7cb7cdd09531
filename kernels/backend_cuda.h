// The CUDA backend: the op table of backend/backend.h on one NVIDIA GPU.
//
// Storage: act and weight buffers hold bf16 (act_bytes = 2); weight gradients, optimizer
// state, fp32 masters, rstd, attention probabilities and losses are fp32; tokens int32.
// Every reduction accumulates in fp32 (sumsq in double). Ops run in order on the legacy
// default stream of the current device; transfers (upload, download, act_to_host, ...) and
// sumsq synchronize. Not thread-safe: one host thread drives the backend.
#ifndef CLLA_KERNELS_BACKEND_CUDA_H
#define CLLA_KERNELS_BACKEND_CUDA_H

#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// The table. The first op that touches the GPU creates the cuBLAS handles; a missing or
// broken device then ends the process through die() with the CUDA error and what to do.
const Backend *backend_cuda(void);

// 1 when a usable CUDA device exists; 0 otherwise, with the reason written to `reason`
// (e.g. "cudaGetDeviceCount: no CUDA-capable device is detected"). Never dies.
int cuda_device_available(char *reason, size_t reason_len);

// Data parallelism: makes GPU (local_rank % device count) current and returns its index.
// Called before any CUDA allocation (train/dist.c), so that the ranks of one host spread over
// its GPUs instead of all landing on device 0. Dies when there is no device.
int cuda_select_device(int local_rank);

// Per-op GPU timing with CUDA events, for benchmarks (bench/bench_gpu.c). While enabled, an
// event is recorded after every kernel launch and cuBLAS product, and the GPU time between two
// events is added to the op (the C function of kernels/) that enqueued the work: ops run in
// order on one stream, so the times add up to the stream's busy time plus any idle gaps.
// The events cost a few microseconds each: measure throughput with timing off.
typedef struct CudaOpTime {
    const char *op;   // the kernels/ function, e.g. "cuda_matmul_forward"
    double ms;        // GPU milliseconds since the last reset
    long marks;       // events attributed (kernel launches and library calls)
} CudaOpTime;
void cuda_timing_enable(int on);
// Waits for the GPU, adds up the events so far and forgets the totals after copying up to
// `max` of them, largest first, into out; returns how many ops there were.
int cuda_timing_take(CudaOpTime *out, int max);

// Attention kernels: the tensor-core ones (kernels/cuda_attention_tc.cu) where the shape allows
// (the default; also CLLA_CUDA_ATTENTION=tc), or 0: the one-warp-per-row kernels everywhere (also
// CLLA_CUDA_ATTENTION=warp). The op tests run both against the CPU. The tensor-core kernels take
// head widths that are multiples of 16 up to these (their instantiations), the warp kernels the rest.
void cuda_attention_use_tensor_cores(int on);
#define CUDA_ATTENTION_TC_MAX_DQK 192
#define CUDA_ATTENTION_TC_MAX_DV 128

// MoE's grouped expert matmuls: 1 the tensor-core grouped kernels, which read the row offsets on
// the device (kernels/cuda_moe_grouped.cu), where the shape allows; 0 one cuBLASLt product per
// expert, the offsets copied to the host first; -1 back to CLLA_MOE_GROUPED, whose default is 1.
// The op tests run both against the CPU.
void cuda_moe_use_grouped(int on);

#ifdef __cplusplus
}
#endif

#endif
