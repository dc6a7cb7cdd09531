// NCCL and the CUDA runtime calls of kernels/nccl_comm.c, emulated over MPI on host memory,
// for testing the trainer's device-collective path (train/grad_sync.c with NCCL) on a machine
// without GPUs (tests/nccl_emu/README.md). Not a general NCCL: float only, sum and avg,
// synchronous (a collective is complete when its call returns, on any stream), and every
// contract NCCL states but does not check is checked here:
//  - every rank passes the same count to a collective;
//  - buffers overlap only in NCCL's in-place forms (reduce-scatter: recvbuff == sendbuff +
//    rank * recvcount; all-gather: sendbuff == recvbuff + rank * sendcount; all-reduce:
//    sendbuff == recvbuff);
//  - an in-place collective's world * count floats lie inside one live CPU backend allocation
//    (the trainer's gradient buffer, the test's buffer; cpu_alloc, layers/cpu_memory.c, whose
//    calls the binaries' link wraps so that this file sees every allocation: CMakeLists.txt), so
//    an unpadded buffer that NCCL would read past is refused, not read, also where the
//    collective starts inside it (a round of stripes, model/shard.h);
//  - ncclCommInitRank gets the same unique id on every rank, made by ncclGetUniqueId, and the
//    rank and size MPI gives the process.
// A broken contract is an error result with the reason in ncclGetLastError, as NCCL reports
// invalid usage.
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "layers/cpu_ops.h"
#include "nccl.h"

static const char ID_MAGIC[] = "clla-nccl-emu";

struct ncclComm_emu {
    int rank, world;
    long n_allreduce, n_reduce_scatter, n_allgather;
    double bytes;   // payload bytes this rank sent into collectives
    char last[256];
};

// ---------------------------------------------------------------- the live allocations

// The link passes -Wl,--wrap=cpu_alloc,--wrap=cpu_release: every call of the CPU backend's
// allocator, the backend tables' included, comes here first.
void *__real_cpu_alloc(size_t bytes);
void __real_cpu_release(void *p);
void *__wrap_cpu_alloc(size_t bytes);
void __wrap_cpu_release(void *p);

typedef struct Live {
    const char *p;
    size_t bytes;
} Live;

static Live *live;
static size_t n_live, cap_live;
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

void *__wrap_cpu_alloc(size_t bytes) {
    void *p = __real_cpu_alloc(bytes);
    pthread_mutex_lock(&live_mu);
    if (n_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 64;
        live = realloc(live, cap_live * sizeof(*live));
        if (!live) {
            fprintf(stderr, "nccl-emu: out of memory for the allocation list\n");
            abort();
        }
    }
    live[n_live++] = (Live){p, bytes};
    pthread_mutex_unlock(&live_mu);
    return p;
}

void __wrap_cpu_release(void *p) {
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < n_live; i++)
        if (live[i].p == p) {
            live[i] = live[--n_live];
            break;
        }
    pthread_mutex_unlock(&live_mu);
    __real_cpu_release(p);
}

// 1 when [p, p + bytes) lies inside one live allocation
static int inside_allocation(const void *p, size_t bytes) {
    const char *x = p;
    int in = 0;
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < n_live && !in; i++) in = x >= live[i].p && bytes <= live[i].bytes && (size_t)(x - live[i].p) <= live[i].bytes - bytes;
    pthread_mutex_unlock(&live_mu);
    return in;
}

// ---------------------------------------------------------------- CUDA runtime on the host

// A stream or event made here carries its magic until destroyed, so a stale or foreign handle
// is refused.
enum { STREAM_MAGIC = 0x5743, EVENT_MAGIC = 0x4576 };
struct CUstream_emu { int magic; };
struct CUevent_emu { int magic, recorded; };

static int stream_ok(cudaStream_t s) { return !s || s->magic == STREAM_MAGIC; }

cudaError_t cudaStreamSynchronize(cudaStream_t s) { return stream_ok(s) ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (!s || flags != cudaStreamNonBlocking) return cudaErrorInvalidValue;   // a blocking one would overlap nothing
    *s = calloc(1, sizeof(**s));
    if (!*s) return cudaErrorInvalidValue;
    (*s)->magic = STREAM_MAGIC;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || s->magic != STREAM_MAGIC) return cudaErrorInvalidValue;
    s->magic = 0;
    free(s);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!e || flags != cudaEventDisableTiming) return cudaErrorInvalidValue;
    *e = calloc(1, sizeof(**e));
    if (!*e) return cudaErrorInvalidValue;
    (*e)->magic = EVENT_MAGIC;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e || e->magic != EVENT_MAGIC) return cudaErrorInvalidValue;
    e->magic = 0;
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e || e->magic != EVENT_MAGIC || !stream_ok(s)) return cudaErrorInvalidValue;
    e->recorded = 1;
    return cudaSuccess;
}

// Waiting for an event never recorded is allowed by CUDA but here means the wrong event.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    return e && e->magic == EVENT_MAGIC && e->recorded && stream_ok(s) && !flags ? cudaSuccess : cudaErrorInvalidValue;
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (nccl-emu: an unknown stream or event, or flags it does not emulate)";
    }
    return "unknown error";
}

// ---------------------------------------------------------------- NCCL over MPI

static ncclResult_t usage(ncclComm_t c, const char *what) {
    snprintf(c->last, sizeof(c->last), "nccl-emu: %s", what);
    fprintf(stderr, "%s (rank %d)\n", c->last, c->rank);   // also where no comm reaches nccl_comm.c's message
    return ncclInvalidUsage;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->last : ""; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
    (void)comm;
    *async = ncclSuccess;   // every emulated collective completes synchronously
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, ID_MAGIC, sizeof(ID_MAGIC));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v[3] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec};
    memcpy(id->internal + 32, v, sizeof(v));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    int init = 0, mr, mw;
    MPI_Initialized(&init);
    if (!init) return ncclSystemError;
    MPI_Comm_rank(MPI_COMM_WORLD, &mr);
    MPI_Comm_size(MPI_COMM_WORLD, &mw);
    ncclComm_t c = calloc(1, sizeof(*c));
    if (!c) return ncclSystemError;
    c->rank = rank;
    c->world = nranks;
    *comm = c;
    // every rank must hold rank 0's id: the trainer broadcasts it over MPI before this call
    ncclUniqueId root = id;
    MPI_Bcast(&root, (int)sizeof(root), MPI_BYTE, 0, MPI_COMM_WORLD);
    int same = memcmp(&root, &id, sizeof(id)) == 0 && memcmp(id.internal, ID_MAGIC, sizeof(ID_MAGIC)) == 0, all = 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (nranks != mw || rank != mr) return usage(c, "rank or rank count differs from MPI's");
    if (!all) return usage(c, "the ranks passed different unique ids, or one not made by ncclGetUniqueId");
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    // the test reads this line to know that the emulated NCCL carried the collectives
    fprintf(stderr, "nccl-emu: rank %d of %d: %ld all-reduce, %ld reduce-scatter, %ld all-gather, %.0f bytes\n",
            comm->rank, comm->world, comm->n_allreduce, comm->n_reduce_scatter, comm->n_allgather, comm->bytes);
    free(comm);
    return ncclSuccess;
}

// Common checks: stream, type, a count MPI can carry and that every rank passed.
static ncclResult_t check_call(ncclComm_t c, size_t count, ncclDataType_t type, cudaStream_t s) {
    if (!c) return ncclInvalidArgument;
    if (!stream_ok(s)) return usage(c, "a stream that cudaStreamCreateWithFlags did not make");
    if (type != ncclFloat) return usage(c, "a data type other than ncclFloat");
    if (count > (size_t)INT_MAX / (size_t)c->world) return usage(c, "count too large for the MPI emulation");
    long long mine[2] = {(long long)count, -(long long)count}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (all[0] != (long long)count || -all[1] != (long long)count) return usage(c, "the ranks passed different counts");
    return ncclSuccess;
}

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
    const char *x = a, *y = b;
    return abytes && bbytes && x < y + bbytes && y < x + abytes;
}

static void average(float *x, size_t n, ncclRedOp_t op, int world) {
    if (op == ncclAvg)
        for (size_t i = 0; i < n; i++) x[i] /= (float)world;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = check_call(c, recvcount, type, s);
    if (r != ncclSuccess) return r;
    if (op != ncclSum && op != ncclAvg) return usage(c, "a reduction other than sum or avg");
    const size_t total = recvcount * (size_t)c->world;
    if (overlaps(sendbuff, total * 4, recvbuff, recvcount * 4) &&
        (const float *)recvbuff != (const float *)sendbuff + (size_t)c->rank * recvcount)
        return usage(c, "reduce-scatter buffers overlap but recvbuff != sendbuff + rank * recvcount");
    if (recvbuff == (const float *)sendbuff + (size_t)c->rank * recvcount && !inside_allocation(sendbuff, total * 4))
        return usage(c, "in-place reduce-scatter past the end of its buffer's world * recvcount floats (pad it)");
    float *tmp = malloc(total * 4 + 4);
    if (!tmp) return ncclSystemError;
    memcpy(tmp, sendbuff, total * 4);
    MPI_Reduce_scatter_block(tmp, recvbuff, (int)recvcount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    free(tmp);
    average(recvbuff, recvcount, op, c->world);
    c->n_reduce_scatter++;
    c->bytes += (double)total * 4;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t type, ncclComm_t c,
                           cudaStream_t s) {
    ncclResult_t r = check_call(c, sendcount, type, s);
    if (r != ncclSuccess) return r;
    const size_t total = sendcount * (size_t)c->world;
    if (overlaps(sendbuff, sendcount * 4, recvbuff, total * 4) &&
        (const float *)sendbuff != (const float *)recvbuff + (size_t)c->rank * sendcount)
        return usage(c, "all-gather buffers overlap but sendbuff != recvbuff + rank * sendcount");
    if (sendbuff == (const float *)recvbuff + (size_t)c->rank * sendcount && !inside_allocation(recvbuff, total * 4))
        return usage(c, "in-place all-gather past the end of its buffer's world * sendcount floats (pad it)");
    float *tmp = malloc(sendcount * 4 + 4);
    if (!tmp) return ncclSystemError;
    memcpy(tmp, sendbuff, sendcount * 4);
    MPI_Allgather(tmp, (int)sendcount, MPI_FLOAT, recvbuff, (int)sendcount, MPI_FLOAT, MPI_COMM_WORLD);
    free(tmp);
    c->n_allgather++;
    c->bytes += (double)sendcount * 4;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t s) {
    ncclResult_t r = check_call(c, count, type, s);
    if (r != ncclSuccess) return r;
    if (op != ncclSum && op != ncclAvg) return usage(c, "a reduction other than sum or avg");
    if (sendbuff != recvbuff && overlaps(sendbuff, count * 4, recvbuff, count * 4))
        return usage(c, "all-reduce buffers overlap but are not the same");
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, count * 4);
    MPI_Allreduce(MPI_IN_PLACE, recvbuff, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    average(recvbuff, count, op, c->world);
    c->n_allreduce++;
    c->bytes += (double)count * 4;
    return ncclSuccess;
}

static int group_depth;   // ncclGroupStart minus ncclGroupEnd calls (collectives inside run at once)

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) {
        fprintf(stderr, "nccl-emu: ncclGroupEnd without ncclGroupStart\n");
        return ncclInvalidUsage;
    }
    group_depth--;
    return ncclSuccess;
}
