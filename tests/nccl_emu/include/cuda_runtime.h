// Test-only stand-in for the CUDA runtime (tests/nccl_emu/README.md): the few calls
// kernels/nccl_comm.c makes, on host memory. "Device" buffers are the cpu-bf16 backend's
// host allocations; the only stream is the legacy default stream 0.
#ifndef CLLA_NCCL_EMU_CUDA_RUNTIME_H
#define CLLA_NCCL_EMU_CUDA_RUNTIME_H

#include <stddef.h>

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 } cudaError_t;
typedef struct CUstream_emu *cudaStream_t;

cudaError_t cudaStreamSynchronize(cudaStream_t s);
const char *cudaGetErrorString(cudaError_t e);

#endif
