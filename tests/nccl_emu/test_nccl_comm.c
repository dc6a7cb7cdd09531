// kernels/nccl_comm.c against its header's contract, over the MPI emulation of NCCL
// (tests/nccl_emu/README.md), under mpirun with any number of ranks, on buffers of world * shard
// floats (the caller pads; nccl_comm.c works in place and allocates nothing):
//  - reduce-scatter (sum and avg): this rank's piece [rank * shard, (rank + 1) * shard) holds
//    the sum (mean) over ranks;
//  - all-gather: piece r comes from rank r, every element of buf is set;
//  - all-reduce (sum and avg): every element;
//  - the started collectives: all-reduces of parts and reduces to each rank, then the wait.
// Rank r's input element i is (r + 1) * (i + 1) / 64: exact in fp32, so the sums are exact
// and compared with ==. Prints "N passed, M failed" on rank 0; exit 1 on any failure.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/nccl_comm.h"
#include "layers/cpu_ops.h"

static int rank, world, passed, failed;

static void result(const char *name, size_t n, size_t shard, int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) printf("%s %s (n %zu, shard %zu, %d ranks)\n", all ? "ok  " : "FAIL", name, n, shard, world);
    if (all) passed++;
    else failed++;
}

static float input(int r, size_t i) { return (float)(r + 1) * (float)(i + 1) / 64.0f; }
static float sum_over_ranks(size_t i) { return (float)(world * (world + 1) / 2) * (float)(i + 1) / 64.0f; }

static void check_shape(NcclComm *c, size_t shard) {
    const size_t n = (size_t)world * shard;
    float *buf = cpu_alloc((n ? n : 1) * sizeof(float));   // CPU backend memory, as the trainer's (nccl_emu.c checks its size)
    const size_t lo = (size_t)rank * shard, hi = lo + shard;
    for (int avg = 0; avg < 2; avg++) {
        for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
        nccl_comm_reduce_scatter_f32(c, buf, shard, avg);
        int ok = 1;
        for (size_t i = lo; i < hi; i++) ok &= buf[i] == (avg ? sum_over_ranks(i) / (float)world : sum_over_ranks(i));
        result(avg ? "reduce-scatter avg: own piece = mean over ranks" : "reduce-scatter sum: own piece = sum over ranks",
               n, shard, ok);
    }
    for (size_t i = 0; i < n; i++) buf[i] = (i >= lo && i < hi) ? input(rank, i) : -1.0f;
    nccl_comm_allgather_f32(c, buf, shard);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= buf[i] == input((int)(i / shard), i);
    result("all-gather: piece r from rank r, every element set", n, shard, ok);
    for (int avg = 0; avg < 2; avg++) {
        for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
        nccl_comm_allreduce_f32(c, buf, n, avg);
        ok = 1;
        for (size_t i = 0; i < n; i++) ok &= buf[i] == (avg ? sum_over_ranks(i) / (float)world : sum_over_ranks(i));
        result(avg ? "all-reduce avg" : "all-reduce sum", n, shard, ok);
    }
    // started collectives: two all-reduces of the halves, then reduces of uneven parts to
    // each rank (rank r's part: the first r + 1 elements of piece r), waited for once
    for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
    nccl_comm_start_allreduce_f32(c, buf + n / 2, n - n / 2);
    nccl_comm_start_allreduce_f32(c, buf, n / 2);
    nccl_comm_wait_started(c);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= buf[i] == sum_over_ranks(i);
    result("started all-reduces of both halves, waited for: every element the sum", n, shard, ok);
    size_t *start = calloc((size_t)world, sizeof(size_t)), *count = calloc((size_t)world, sizeof(size_t));
    for (int r = 0; r < world; r++) {
        start[r] = (size_t)r * shard;
        count[r] = (size_t)r + 1 < shard ? (size_t)r + 1 : shard;
    }
    for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
    nccl_comm_start_reduces_f32(c, buf, start, count);
    nccl_comm_wait_started(c);
    ok = 1;
    for (size_t i = 0; i < n; i++) {
        const size_t r = i / shard;
        ok &= buf[i] == ((int)r == rank && i - start[r] < count[r] ? sum_over_ranks(i) : input(rank, i));
    }
    result("started reduces to every rank: its own part the sum, the rest unchanged", n, shard, ok);
    free(start);
    free(count);
    cpu_release(buf);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    unsigned char id[NCCL_COMM_ID_BYTES] = {0};
    if (rank == 0) nccl_comm_unique_id(id);
    MPI_Bcast(id, NCCL_COMM_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD);
    NcclComm *c = nccl_comm_init(id, rank, world);
    check_shape(c, 40);
    check_shape(c, 1);
    check_shape(c, 1027);   // odd sizes: the pieces' offsets are not aligned
    nccl_comm_destroy(c);
    if (rank == 0) printf("%d passed, %d failed\n", passed, failed);
    MPI_Finalize();
    return failed ? 1 : 0;
}
