// Test-only stand-in for the CUDA runtime (tests/nccl_emu/README.md): the few calls
// kernels/nccl_comm.c makes, on host memory. "Device" buffers are the cpu-bf16 backend's
// host allocations; streams are the legacy default stream 0 and those cudaStreamCreateWithFlags made.
#ifndef CLLA_NCCL_EMU_CUDA_RUNTIME_H
#define CLLA_NCCL_EMU_CUDA_RUNTIME_H

#include <stddef.h>

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 } cudaError_t;
typedef struct CUstream_emu *cudaStream_t;
typedef struct CUevent_emu *cudaEvent_t;
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

cudaError_t cudaStreamSynchronize(cudaStream_t s);
const char *cudaGetErrorString(cudaError_t e);
// Streams and events for nccl_comm.c's started collectives: every emulated collective completes
// when called, so the order they would impose holds already; the calls check their arguments.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

#endif
