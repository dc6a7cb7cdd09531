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

#ifdef __cplusplus
}
#endif

#endif
