// NCCL collectives on fp32 device buffers for data-parallel training (docs/DISTRIBUTED.md,
// section NCCL). Built only in the CUDA + MPI build when CMake found a working NCCL
// (CLLA_HAVE_NCCL). Plain C API: train/dist.c drives it and supplies the MPI broadcast of the
// unique id, so this file needs neither MPI nor C++.
//
// The plain calls run on the legacy default stream of the current device, the stream every op of
// the CUDA backend uses, so a collective is ordered after the backward pass that wrote the
// gradients without extra events; each call then waits for its collective to finish (the
// trainer's communication time and the hang watchdog measure the real transfer). The started
// calls (nccl_comm_start_*) run on a side stream, after an event, and are waited for together.
//
// Determinism: NCCL's reduction order is fixed for a given topology, rank count and NCCL
// version (same ring/tree, same chunking), so a GPU run is reproducible on the same machine
// and rank count. It is not the CPU path's pairwise tree over rank indices (train/dist.h), so
// GPU results across rank counts agree to rounding, not bitwise. NCCL_ALGO / NCCL_PROTO
// overrides change the order too.
//
// Errors: a failing NCCL or CUDA call ends the process through die() with one line naming the
// call, the NCCL (or CUDA) error string and the rank.
#ifndef CLLA_KERNELS_NCCL_COMM_H
#define CLLA_KERNELS_NCCL_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct NcclComm NcclComm;

// Size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES; nccl_comm.c checks they agree).
#define NCCL_COMM_ID_BYTES 128

// Rank 0 only: a fresh unique id, to be broadcast to every rank before nccl_comm_init.
void nccl_comm_unique_id(unsigned char id[NCCL_COMM_ID_BYTES]);
// Collective over all `world` ranks (ncclCommInitRank). The GPU must already be selected
// (cuda_select_device): the communicator binds to the current device.
NcclComm *nccl_comm_init(const unsigned char id[NCCL_COMM_ID_BYTES], int rank, int world);
void nccl_comm_destroy(NcclComm *c);

// In-place reduce-scatter of buf (world * shard floats, device) cut into world pieces of
// `shard` floats: afterwards elements [rank * shard, (rank + 1) * shard) hold the sum (avg: the
// mean) over ranks of that piece; the rest of buf is unspecified. The caller allocates buf
// padded to world * shard (train/grad_sync.c: model_pad_grad), so NCCL works in place and no
// second full-size buffer exists (at the paper's 10.9B parameters that copy was 44 GB).
void nccl_comm_reduce_scatter_f32(NcclComm *c, float *buf, size_t shard, int avg);
// In-place all-gather over `rounds` blocks of world * shard floats one after another (stripes,
// model/shard.h; rounds 1: one block cut into world pieces as above): piece r of every block
// is taken from rank r and copied to every rank, the blocks in one NCCL group.
void nccl_comm_allgather_f32(NcclComm *c, float *buf, size_t shard, size_t rounds);
// In-place all-reduce of n floats (sum, or the mean when avg).
void nccl_comm_allreduce_f32(NcclComm *c, float *buf, size_t n, int avg);

// Started collectives, for summing the gradients while the backward still computes
// (train/dist_buckets.c): each runs on a stream of this communicator's own, after the work the
// legacy stream had queued when it was started (an event), and returns without waiting; in
// between the caller makes no other nccl_comm call. nccl_comm_wait_started makes the legacy stream
// wait for all of them, waits for them on the host, and reports their errors.
// In-place all-reduce (sum) of n floats.
void nccl_comm_start_allreduce_f32(NcclComm *c, float *buf, size_t n);
// In-place reduce-scatter (sum) of buf (world * stripe floats): elements [rank * stripe,
// (rank + 1) * stripe) hold the sum over ranks afterwards; the rest of buf is unspecified.
void nccl_comm_start_reduce_scatter_f32(NcclComm *c, float *buf, size_t stripe);
void nccl_comm_wait_started(NcclComm *c);

#ifdef __cplusplus
}
#endif

#endif
