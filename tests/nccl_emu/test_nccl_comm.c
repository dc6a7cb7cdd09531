// kernels/nccl_comm.c against its header's contract, over the MPI emulation of NCCL
// (tests/nccl_emu/README.md), under mpirun with any number of ranks, on buffers of world * shard
// floats (the caller pads; nccl_comm.c works in place and allocates nothing):
//  - reduce-scatter (sum and avg): this rank's piece [rank * shard, (rank + 1) * shard) holds
//    the sum (mean) over ranks;
//  - all-gather: piece r comes from rank r, every element of buf is set; over ROUNDS blocks of
//    world * shard (stripes, model/shard.h) the same in every block;
//  - all-reduce (sum and avg): every element;
//  - the started collectives: all-reduces of parts, and reduce-scatters of each block of ROUNDS
//    (stripe rank of each the sum, in place on an interior block), then the wait.
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

#define ROUNDS 3

static void check_shape(NcclComm *c, size_t shard) {
    const size_t n = (size_t)world * shard, all = ROUNDS * n;
    // CPU backend memory, as the trainer's (nccl_emu.c checks that the collectives stay inside it)
    float *buf = cpu_alloc((all ? all : 1) * sizeof(float));
    const size_t lo = (size_t)rank * shard, hi = lo + shard;
    for (int avg = 0; avg < 2; avg++) {
        for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
        nccl_comm_reduce_scatter_f32(c, buf, shard, avg);
        int ok = 1;
        for (size_t i = lo; i < hi; i++) ok &= buf[i] == (avg ? sum_over_ranks(i) / (float)world : sum_over_ranks(i));
        result(avg ? "reduce-scatter avg: own piece = mean over ranks" : "reduce-scatter sum: own piece = sum over ranks",
               n, shard, ok);
    }
    for (size_t rounds = 1; rounds <= ROUNDS; rounds += ROUNDS - 1) {
        for (size_t i = 0; i < all; i++) buf[i] = (i < rounds * n && i % n >= lo && i % n < hi) ? input(rank, i) : -1.0f;
        nccl_comm_allgather_f32(c, buf, shard, rounds);
        int ok = 1;
        for (size_t i = 0; i < all; i++) ok &= buf[i] == (i < rounds * n ? input((int)(i % n / shard), i) : -1.0f);
        result(rounds == 1 ? "all-gather: piece r from rank r, every element set"
                           : "all-gather of 3 rounds: stripe r of every round from rank r, nothing past them written",
               n, shard, ok);
    }
    int ok;
    for (int avg = 0; avg < 2; avg++) {
        for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
        nccl_comm_allreduce_f32(c, buf, n, avg);
        ok = 1;
        for (size_t i = 0; i < n; i++) ok &= buf[i] == (avg ? sum_over_ranks(i) / (float)world : sum_over_ranks(i));
        result(avg ? "all-reduce avg" : "all-reduce sum", n, shard, ok);
    }
    // started collectives: two all-reduces of the halves, waited for once; then reduce-scatters
    // of the rounds from the last (the backward's order), waited for once
    for (size_t i = 0; i < n; i++) buf[i] = input(rank, i);
    nccl_comm_start_allreduce_f32(c, buf + n / 2, n - n / 2);
    nccl_comm_start_allreduce_f32(c, buf, n / 2);
    nccl_comm_wait_started(c);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= buf[i] == sum_over_ranks(i);
    result("started all-reduces of both halves, waited for: every element the sum", n, shard, ok);
    for (size_t i = 0; i < all; i++) buf[i] = input(rank, i);
    for (size_t k = ROUNDS; k-- > 0;) nccl_comm_start_reduce_scatter_f32(c, buf + k * n, shard);
    nccl_comm_wait_started(c);
    ok = 1;
    for (size_t i = 0; i < all; i++)
        if (i % n >= lo && i % n < hi) ok &= buf[i] == sum_over_ranks(i);
    result("started reduce-scatters of 3 rounds: stripe rank of each the sum", n, shard, ok);
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
