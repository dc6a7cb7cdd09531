// NCCL communicator and fp32 collectives on device buffers (kernels/nccl_comm.h). Compiled as C
// with the CUDA runtime and NCCL headers; only in builds where CMake found NCCL.
#include "kernels/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

_Static_assert(NCCL_COMM_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "nccl_comm.h's id size differs from nccl.h's");
_Static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId has padding");

struct NcclComm {
    ncclComm_t comm;
    int rank, world;
    // started collectives (nccl_comm_start_*): their stream, made on the first start
    // (non-blocking: a blocking stream would wait for the legacy one and overlap nothing), the
    // event each start waits for, and the one nccl_comm_wait_started has the legacy stream wait for
    cudaStream_t side;
    cudaEvent_t queued, done;
};

// One line, so that a failure in a many-rank job log is found and understood: the call, NCCL's error string, its last
// detailed message when the communicator has one (newlines folded), and the rank.
static void nccl_fail(const char *call, ncclResult_t r, ncclComm_t comm, int rank, int world) {
    char detail[512] = "";
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    if (last && *last) {
        snprintf(detail, sizeof(detail), " (%s)", last);
        for (char *p = detail; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
    }
    die("NCCL error in %s on rank %d of %d: %s%s: NCCL_DEBUG=WARN prints NCCL's diagnosis; check NCCL_SOCKET_IFNAME and NCCL_IB_DISABLE (docs/DISTRIBUTED.md)",
        call, rank, world, ncclGetErrorString(r), detail);
}

static void cuda_fail(const char *call, cudaError_t e, int rank, int world) {
    die("CUDA error in %s on rank %d of %d: %s", call, rank, world, cudaGetErrorString(e));
}

#define NCCL_CHECK(c, name, call)                                          \
    do {                                                                   \
        ncclResult_t r_ = (call);                                          \
        if (r_ != ncclSuccess) nccl_fail(name, r_, (c)->comm, (c)->rank, (c)->world); \
    } while (0)

// The legacy default stream: this file is compiled by the C compiler without
// CUDA_API_PER_THREAD_DEFAULT_STREAM, so 0 is the stream the backend's kernels run on.
#define COMM_STREAM ((cudaStream_t)0)

static ncclRedOp_t red_op(int avg) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    return avg ? ncclAvg : ncclSum;
#else
    if (avg) die("nccl_comm: averaging needs NCCL 2.10 or newer (this build has %d)", NCCL_VERSION_CODE);
    return ncclSum;
#endif
}

// Waits for the collective: errors of an asynchronous collective surface here, and the
// caller's timer and watchdog cover the transfer itself.
static void finish(NcclComm *c, const char *name) {
    cudaError_t e = cudaStreamSynchronize(COMM_STREAM);
    if (e != cudaSuccess) cuda_fail(name, e, c->rank, c->world);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(c, "ncclCommGetAsyncError", ncclCommGetAsyncError(c->comm, &async));
    if (async != ncclSuccess) nccl_fail(name, async, c->comm, c->rank, c->world);
}

void nccl_comm_unique_id(unsigned char id[NCCL_COMM_ID_BYTES]) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, NULL, 0, 0);
    memcpy(id, &u, sizeof(u));
}

NcclComm *nccl_comm_init(const unsigned char id[NCCL_COMM_ID_BYTES], int rank, int world) {
    NcclComm *c = xcalloc(1, sizeof(*c));
    c->rank = rank;
    c->world = world;
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    ncclResult_t r = ncclCommInitRank(&c->comm, world, u, rank);
    if (r != ncclSuccess) nccl_fail("ncclCommInitRank", r, NULL, rank, world);
    return c;
}

void nccl_comm_destroy(NcclComm *c) {
    if (!c) return;
    NCCL_CHECK(c, "ncclCommDestroy", ncclCommDestroy(c->comm));
    if (c->side) {
        cudaEventDestroy(c->queued);
        cudaEventDestroy(c->done);
        cudaStreamDestroy(c->side);
    }
    free(c);
}

#define CUDA_CHECK(c, name, call)                                          \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        if (e_ != cudaSuccess) cuda_fail(name, e_, (c)->rank, (c)->world); \
    } while (0)

// The side stream waits for what the legacy stream has queued so far.
static void after_queued(NcclComm *c) {
    if (!c->side) {
        CUDA_CHECK(c, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
        CUDA_CHECK(c, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&c->queued, cudaEventDisableTiming));
        CUDA_CHECK(c, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
    }
    CUDA_CHECK(c, "cudaEventRecord", cudaEventRecord(c->queued, COMM_STREAM));
    CUDA_CHECK(c, "cudaStreamWaitEvent", cudaStreamWaitEvent(c->side, c->queued, 0));
}

void nccl_comm_start_allreduce_f32(NcclComm *c, float *buf, size_t n) {
    after_queued(c);
    NCCL_CHECK(c, "ncclAllReduce", ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c->comm, c->side));
}

void nccl_comm_start_reduce_scatter_f32(NcclComm *c, float *buf, size_t stripe) {
    after_queued(c);
    NCCL_CHECK(c, "ncclReduceScatter", ncclReduceScatter(buf, buf + (size_t)c->rank * stripe, stripe, ncclFloat, ncclSum, c->comm, c->side));
}

void nccl_comm_wait_started(NcclComm *c) {
    if (!c->side) return;   // nothing was started
    CUDA_CHECK(c, "cudaEventRecord", cudaEventRecord(c->done, c->side));
    CUDA_CHECK(c, "cudaStreamWaitEvent", cudaStreamWaitEvent(COMM_STREAM, c->done, 0));
    CUDA_CHECK(c, "cudaStreamSynchronize", cudaStreamSynchronize(c->side));
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(c, "ncclCommGetAsyncError", ncclCommGetAsyncError(c->comm, &async));
    if (async != ncclSuccess) nccl_fail("a started collective", async, c->comm, c->rank, c->world);
}

// NCCL's in-place forms: reduce-scatter with recvbuff == sendbuff + rank * recvcount,
// all-gather with sendbuff == recvbuff + rank * sendcount.
void nccl_comm_reduce_scatter_f32(NcclComm *c, float *buf, size_t shard, int avg) {
    NCCL_CHECK(c, "ncclReduceScatter", ncclReduceScatter(buf, buf + (size_t)c->rank * shard, shard, ncclFloat, red_op(avg), c->comm, COMM_STREAM));
    finish(c, "ncclReduceScatter");
}

void nccl_comm_allgather_f32(NcclComm *c, float *buf, size_t shard, size_t rounds) {
    const size_t period = shard * (size_t)c->world;
    NCCL_CHECK(c, "ncclGroupStart", ncclGroupStart());
    for (size_t k = 0; k < rounds; k++) {
        float *block = buf + k * period;
        NCCL_CHECK(c, "ncclAllGather", ncclAllGather(block + (size_t)c->rank * shard, block, shard, ncclFloat, c->comm, COMM_STREAM));
    }
    NCCL_CHECK(c, "ncclGroupEnd", ncclGroupEnd());
    finish(c, "ncclAllGather");
}

void nccl_comm_allreduce_f32(NcclComm *c, float *buf, size_t n, int avg) {
    NCCL_CHECK(c, "ncclAllReduce", ncclAllReduce(buf, buf, n, ncclFloat, red_op(avg), c->comm, COMM_STREAM));
    finish(c, "ncclAllReduce");
}
