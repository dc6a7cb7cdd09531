// Process-wide CUDA state: cuBLAS handles, the cuBLASLt workspace and scratch buffers.
// Created on first use on the current device; never freed (they live as long as the process).
#include "kernels/cuda_common.cuh"
#include "kernels/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// 32 MiB: what cuBLASLt's Hopper kernels ask for at most; Ampere needs less.
#define LT_WORKSPACE_BYTES ((size_t)32 << 20)

static cublasHandle_t g_cublas;
static cublasLtHandle_t g_cublaslt;
static void *g_lt_workspace;
static void *g_scratch[SCRATCH_NSLOTS];
static size_t g_scratch_bytes[SCRATCH_NSLOTS];

static int g_sync_debug = -1;   // -1: CLLA_CUDA_SYNC not read yet

int cuda_sync_debug(void) {
    if (g_sync_debug < 0) {
        g_sync_debug = env_switch("CLLA_CUDA_SYNC", 0, "no synchronization between ops",
                                  "synchronize after every op, to find a faulting one");
    }
    return g_sync_debug;
}

// The hint for an error: only a missing device or driver is about visibility.
static const char *error_hint(cudaError_t err) {
    switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
        return "check that a CUDA GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES) and that its driver supports this CUDA version";
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: use a smaller batch or sequence (clla info --device cuda shows the plan)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
        return "a kernel faulted, and errors are reported late unless synchronized: rerun with CLLA_CUDA_SYNC=1 to "
               "name the op that faulted, or under compute-sanitizer (scripts/gpu_check.sh does both)";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "this build has no kernels for this GPU: rebuild with its architecture in CMAKE_CUDA_ARCHITECTURES";
    default:
        return "see the CUDA error above";
    }
}

void cuda_fail(cudaError_t err, const char *what, const char *file, int line, const char *func) {
    die("CUDA error in %s (%s:%d, %s): %s: %s", what, file, line, func, cudaGetErrorString(err), error_hint(err));
}

void cuda_after_launch(const char *file, int line, const char *func) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) cuda_fail(err, "a kernel launch", file, line, func);
    if (cuda_sync_debug()) {
        err = cudaDeviceSynchronize();
        if (err != cudaSuccess) cuda_fail(err, "the op launched here (CLLA_CUDA_SYNC=1)", file, line, func);
    }
    cuda_timing_mark(func);
}

// ---- per-op timing (backend_cuda.h): a ring of events, folded into per-op totals when full
// or when the totals are taken. Slot 0 after a fold is the last event, the next interval's start.

#define TIMING_EVENTS 4096
#define TIMING_OPS 256

typedef struct Timing {
    int on;
    const char *label;                   // cuda_timing_label: marks go to it while set
    int n;                               // events recorded, slot 0 included
    cudaEvent_t ev[TIMING_EVENTS];
    const char *name[TIMING_EVENTS];     // the op that enqueued the work before event i
    CudaOpTime op[TIMING_OPS];
    int n_ops;
} Timing;
static Timing g_timing;   // process-wide, like the handles above

static CudaOpTime *timing_find(const char *name) {
    Timing *t = &g_timing;
    for (int i = 0; i < t->n_ops; i++)
        if (t->op[i].op == name || strcmp(t->op[i].op, name) == 0) return &t->op[i];
    return NULL;
}

static void timing_add(const char *name, double ms) {
    Timing *t = &g_timing;
    CudaOpTime *o = timing_find(name);
    if (!o) {
        if (t->n_ops >= TIMING_OPS - 1) {   // the last slot collects the ops past the table
            name = "(other ops)";
            o = timing_find(name);
        }
        if (!o) {
            o = &t->op[t->n_ops++];
            o->op = name;
            o->ms = 0.0;
            o->marks = 0;
        }
    }
    o->ms += ms;
    o->marks++;
}

static void timing_fold(void) {
    Timing *t = &g_timing;
    if (t->n < 2) return;
    CUDA_CHECK(cudaEventSynchronize(t->ev[t->n - 1]));
    for (int i = 1; i < t->n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, t->ev[i - 1], t->ev[i]));
        timing_add(t->name[i], ms);
    }
    cudaEvent_t last = t->ev[t->n - 1];
    t->ev[t->n - 1] = t->ev[0];
    t->ev[0] = last;
    t->n = 1;
}

const char *cuda_timing_label(const char *op) {
    const char *prev = g_timing.label;
    g_timing.label = op;
    return prev;
}

void cuda_timing_mark(const char *op) {
    Timing *t = &g_timing;
    if (!t->on) return;
    if (t->n == TIMING_EVENTS) timing_fold();
    t->name[t->n] = t->label ? t->label : op;
    CUDA_CHECK(cudaEventRecord(t->ev[t->n], 0));
    t->n++;
}

extern "C" void cuda_timing_enable(int on) {
    Timing *t = &g_timing;
    if (on && !t->ev[0])
        for (int i = 0; i < TIMING_EVENTS; i++) CUDA_CHECK(cudaEventCreate(&t->ev[i]));
    if (on && !t->on) {
        t->on = 1;
        t->n = 0;
        cuda_timing_mark("(start)");   // slot 0: the first interval's start, never attributed
    } else if (!on && t->on) {
        timing_fold();
        t->on = 0;
    }
}

static int cmp_op_time(const void *a, const void *b) {
    const CudaOpTime *x = (const CudaOpTime *)a, *y = (const CudaOpTime *)b;
    return (x->ms < y->ms) - (x->ms > y->ms);
}

extern "C" int cuda_timing_take(CudaOpTime *out, int max) {
    Timing *t = &g_timing;
    if (t->on) timing_fold();
    qsort(t->op, (size_t)t->n_ops, sizeof(t->op[0]), cmp_op_time);
    const int n = t->n_ops;
    for (int i = 0; i < n && i < max; i++) out[i] = t->op[i];
    t->n_ops = 0;
    return n;
}

cublasHandle_t cuda_cublas(void) {
    if (!g_cublas) {
        CUBLAS_CHECK(cublasCreate(&g_cublas));
        // Tensor-core math with fp32 accumulation for bf16 inputs is chosen per call through
        // CUBLAS_COMPUTE_32F; pedantic mode would forbid it, default mode allows it.
        CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
    }
    return g_cublas;
}

cublasLtHandle_t cuda_cublaslt(void) {
    if (!g_cublaslt) CUBLAS_CHECK(cublasLtCreate(&g_cublaslt));
    return g_cublaslt;
}

void *cuda_lt_workspace(size_t *bytes) {
    if (!g_lt_workspace) CUDA_CHECK(cudaMalloc(&g_lt_workspace, LT_WORKSPACE_BYTES));
    *bytes = LT_WORKSPACE_BYTES;
    return g_lt_workspace;
}

void *cuda_scratch(enum CudaScratchSlot slot, size_t bytes) {
    if (bytes > g_scratch_bytes[slot] || !g_scratch[slot]) {
        if (g_scratch[slot]) CUDA_CHECK(cudaFree(g_scratch[slot]));
        // Grow by a quarter beyond the request so that slowly growing shapes do not
        // reallocate every call.
        size_t want = bytes + bytes / 4;
        if (want < 256) want = 256;
        cudaError_t err = cudaMalloc(&g_scratch[slot], want);
        if (err != cudaSuccess)
            die("CUDA backend: cannot allocate %zu bytes of scratch memory (%s): use a smaller "
                "batch or sequence length", want, cudaGetErrorString(err));
        g_scratch_bytes[slot] = want;
        // compute-sanitizer's initcheck does not see some cuBLASLt kernels' writes into the dinp
        // scratch and reports every read the add kernel then makes of the product (docs/GPU.md,
        // "Sanitizers": 101,400 reports on the H100); zeroed once here, it counts as written. The
        // op tests check the values that land in it.
        if (slot == SCRATCH_DINP) CUDA_CHECK(cudaMemsetAsync(g_scratch[slot], 0, want, 0));
    }
    return g_scratch[slot];
}

extern "C" int cuda_device_available(char *reason, size_t reason_len) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        if (reason && reason_len) snprintf(reason, reason_len, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
        cudaGetLastError();   // reset the last-error state so later calls start clean
        return 0;
    }
    if (count == 0) {
        if (reason && reason_len) snprintf(reason, reason_len, "cudaGetDeviceCount returned 0 devices");
        return 0;
    }
    int dev = 0;
    cudaDeviceProp prop;
    err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaGetDeviceProperties(&prop, dev);
    if (err != cudaSuccess) {
        if (reason && reason_len) snprintf(reason, reason_len, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
        cudaGetLastError();
        return 0;
    }
    if (prop.major < 8) {
        if (reason && reason_len)
            snprintf(reason, reason_len, "device %d (%s) has compute capability %d.%d; the CUDA backend needs 8.0 or newer (bf16)",
                     dev, prop.name, prop.major, prop.minor);
        return 0;
    }
    if (reason && reason_len) snprintf(reason, reason_len, "device %d: %s (sm_%d%d)", dev, prop.name, prop.major, prop.minor);
    return 1;
}

extern "C" int cuda_select_device(int local_rank) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        die("--device cuda on local rank %d: no usable CUDA device (%s): check nvidia-smi and CUDA_VISIBLE_DEVICES",
            local_rank, err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0 devices");
    int dev = local_rank % count;
    CUDA_CHECK(cudaSetDevice(dev));
    return dev;
}
