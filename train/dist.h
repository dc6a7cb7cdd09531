// The process group of data-parallel training (docs/DISTRIBUTED.md): rank, world and local
// rank from MPI when this clla was built with MPI and launched by mpirun/srun, otherwise a
// group of one. The collectives the trainer needs work on HOST fp32/f64 buffers; callers on
// a device backend stage through the host (train/grad_sync.c).
//
// Determinism: every sum over ranks is formed by this code in one fixed order, never by
// MPI_Allreduce/MPI_Reduce_scatter (whose association order depends on the algorithm MPI
// picks, the message size and the number of ranks). A reduce-scatter sends each rank's
// piece of its buffer to the piece's owner with point-to-point messages; the owner adds
// the world pieces in the bottom-up pairwise tree over rank indices:
//   level s = 1, 2, 4, ...: piece[j] += piece[j + s] for j = 0, 2s, 4s, ... (j + s < world)
// which is the tree that splits [0, n) at the largest power of two below n. The trainer
// accumulates its micro-steps in the same tree (train/grad_sync.h), so the global gradient
// of M = world * micro micro-batches is one pairwise tree over the M micro-gradients,
// whatever the split into ranks when micro-steps per rank is a power of two: 1, 2 and 4
// ranks give bitwise identical gradients, losses and weights.
//
// CUDA (docs/DISTRIBUTED.md, NCCL): dist_attach_device makes GPU (local_rank % device count)
// current before anything is allocated on it and, in builds with NCCL (CLLA_HAVE_NCCL), opens
// an NCCL communicator from rank 0's unique id (broadcast with dist_bcast). The dist_*_dev_f32
// collectives then work on device buffers. NCCL's reduction order is fixed for a given
// topology and rank count but is not the pairwise tree above: on the GPU, results across rank
// counts agree to rounding, not bitwise. Without NCCL train/grad_sync.c stages device buffers
// through the host for the MPI collectives above.
#ifndef CLLA_TRAIN_DIST_H
#define CLLA_TRAIN_DIST_H

#include <stddef.h>

#include "model/config.h"

typedef struct DistWatchdog DistWatchdog;
struct NcclComm;   // kernels/nccl_comm.h
struct Backend;    // backend/backend.h

typedef struct Dist {
    int rank, world;               // this process, number of processes
    int local_rank, local_world;   // among the processes of this host (GPU choice)
    int mpi;                       // 1: MPI was initialized by dist_init (finalized by dist_finalize)
    int mpi_serialized;            // 1: MPI may be called from any thread, one at a time
    double comm_seconds;           // wall time spent in collectives (the trainer reads and resets it)
    float *scratch;                // reduce-scatter receive pieces: world * DIST_PIECE floats
    DistWatchdog *watchdog;        // NULL when off
    struct NcclComm *nccl;         // device collectives (CUDA + NCCL, world > 1), else NULL
} Dist;

// Elements per point-to-point message of a reduce-scatter: bounds the scratch memory to
// world * 4 MiB whatever the model size.
#define DIST_PIECE ((size_t)1 << 20)

// Builds the group. With MPI: initializes MPI only when the environment shows a launcher
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK/PMI_SIZE), so a plain `clla train` never
// touches MPI. timeout_s > 0 starts a watchdog: a collective that waits longer than that
// for the other ranks (a hung network, a rank stuck in I/O) prints a line naming this rank
// and ends the process with status 3, and mpirun then ends the job.
// The number of ranks the launcher started (1 when none says more), from the environment, with
// the variable that said so in *var: for the commands that run as one process (cli/one_process.c).
int dist_launched_ranks(const char **var);
void dist_init(Dist *d, double timeout_s);
void dist_finalize(Dist *d);
// Ends the whole job with status code (MPI_Abort under MPI, exit otherwise).
void dist_abort(Dist *d, int code) __attribute__((noreturn));

// A description for logs: "rank 1/4 (local 1/2)" or "single process".
const char *dist_describe(const Dist *d, char *buf, size_t len);

// Reduce-scatter of a buffer of n floats cut into world pieces of `shard` elements (n <=
// world * shard; the part past n counts as zeros): out (shard floats) receives the sum over
// ranks of piece `rank` (in the fixed tree above); entries past n are 0.
void dist_reduce_scatter_f32(Dist *d, const float *buf, size_t n, size_t shard, float *out);
// The same sums formed bucket by bucket while buf is still being written (the gradients during
// the last micro-step's backward, train/grad_sync.c), so that the messages travel while the
// backward computes (train/dist_buckets.c). buf is cut into a fixed grid of buckets of `bucket`
// elements, [j bucket, (j + 1) bucket) clipped to n, sent highest first: the grid and the order
// do not depend on when the caller reports progress, so every rank posts the same messages in
// the same order. Each element is summed in the same pairwise tree as dist_reduce_scatter_f32,
// so the results are the same bits as the collectives' formed afterwards. At most
// DIST_BUCKETS_IN_FLIGHT buckets are in flight; a further one waits for the oldest (receive
// memory: that many times world x the longest own part of a bucket: a world-th of a bucket for
// the all-reduce, see below for the reduce-scatter). buf must stay valid, and
// unchanged at and above every `from` reported, until finish. Where MPI may be called from any
// thread (mpi_serialized) a thread of its own moves the messages, and the caller makes no other
// MPI call between begin and finish.
#define DIST_BUCKETS_IN_FLIGHT 4
typedef struct DistBuckets DistBuckets;
// Reduce-scatter over stripes (world > 1, MPI): the buckets are rounds of world stripes of
// `stripe` elements (bucket = world x stripe), rank r owning stripe r of each (model/shard.h,
// Megatron's layout), so every bucket uses every rank's links. At finish, out (ceil(n / bucket) x
// stripe floats) holds rank `rank`'s stripes of the sums, round after round; entries past n are 0.
// Round by round these are the sums dist_reduce_scatter_f32(d, buf + k bucket, ..., stripe, ...)
// gives. Receive memory: DIST_BUCKETS_IN_FLIGHT x world x stripe floats.
DistBuckets *dist_buckets_begin(Dist *d, const float *buf, size_t n, size_t stripe, float *out);
// All-reduce in place: at finish, buf holds what dist_allreduce_sum_f32(d, buf, n) leaves. Each
// bucket is cut into world equal parts, each summed by one rank and sent back to all, so every
// bucket uses every rank's links.
DistBuckets *dist_buckets_begin_allreduce(Dist *d, float *buf, size_t n, size_t bucket);
// On device buffers through NCCL (dist_has_device_collectives): each bucket one started NCCL
// collective, ordered after the device work queued when it was reported. scatter 0: all-reduce
// in place; 1: the buckets are rounds of world stripes of `stripe` elements (bucket = world x
// stripe), each reduce-scattered in place, so that at finish stripe `rank` of every round holds
// the sums (model/shard.h); buf must hold every whole round (ceil(n / bucket) x bucket floats,
// padded by the caller). The sums are NCCL's, per bucket: the same as the whole buffer's to
// rounding, not bitwise.
DistBuckets *dist_buckets_begin_dev(Dist *d, float *buf, size_t n, size_t stripe, size_t bucket, int scatter);
// All-gather over the same stripes, rounds sent from the lowest (the forward's order) as soon as
// it begins: rank r's stripe of every round is in buf; at finish every stripe of every rank is.
// dist_buckets_wait(b, upto) returns when [0, upto) of buf is complete (a gather only).
DistBuckets *dist_buckets_begin_gather(Dist *d, float *buf, size_t n, size_t stripe);
void dist_buckets_wait(DistBuckets *b, size_t upto);
// Every element of buf at index >= from is final: the buckets wholly inside [from, n) not yet
// sent are sent, and the earlier ones progress. Nothing is sent before the first call.
void dist_buckets_ready(DistBuckets *b, size_t from);
// Sends what is left (as dist_buckets_ready(b, 0)), waits for every message and adds. Frees b.
void dist_buckets_finish(DistBuckets *b);
// All-gather in place: piece r of buf (elements [r*shard, (r+1)*shard) clipped to n) is
// taken from rank r and copied to every rank.
void dist_allgather_f32(Dist *d, float *buf, size_t n, size_t shard);
// All-reduce (sum) of n floats in place: reduce-scatter then all-gather, same tree.
void dist_allreduce_sum_f32(Dist *d, float *buf, size_t n);
// Gathers count doubles from every rank into all (world * count, rank-major) on every rank.
void dist_allgather_f64(Dist *d, const double *mine, int count, double *all);
// Gathers `bytes` raw bytes from every rank into all (world * bytes, rank-major).
void dist_allgather_bytes(Dist *d, const void *mine, size_t bytes, void *all);
// Sum over ranks of one double, added in rank order (the same on every rank).
double dist_sum_f64(Dist *d, double x);
// Largest value over ranks (agreement on stop requests).
int dist_max_int(Dist *d, int x);
// 0 when every rank's x equals rank 0's, else the highest rank whose x differs (collective: a
// fingerprint of what must be the same on every rank, compared before it can matter).
int dist_rank_differing(Dist *d, unsigned long long x);
// dist_rank_differing, and when a rank differs: rank 0 dies with "rank R " followed by
// differs_msg (what differs and the fix), the other ranks exit(1) without a word (said once).
void dist_agree_or_die(Dist *d, unsigned long long x, const char *differs_msg);
// A fingerprint of cfg for dist_agree_or_die: FNV-1a 64 of config_to_json's compact text, equal
// for configs that config.json would write alike.
unsigned long long dist_config_fingerprint(const Config *cfg);
void dist_bcast(Dist *d, void *buf, size_t bytes, int root);
void dist_barrier(Dist *d);

// After the backend is chosen and before anything is allocated on it: on the CUDA backend,
// selects this rank's GPU and, with NCCL and more than one rank, creates the communicator
// (collective: every rank calls it). Other backends: nothing.
void dist_attach_device(Dist *d, const struct Backend *be);
// Only the first half of that: the rank's GPU made current (CUDA; nothing on other backends), for a
// job whose ranks share no device buffers (clla eval --bench splits its items over the ranks).
// Without it every rank of the node put its context and its model on GPU 0.
void dist_select_device(const Dist *d, const struct Backend *be);
// 1 when the dist_*_dev_f32 collectives below are available (NCCL communicator open).
int dist_has_device_collectives(const Dist *d);
// The collectives of dist_reduce_scatter_f32 / dist_allgather_f32 / dist_allreduce_sum_f32 on
// DEVICE buffers, in place (kernels/nccl_comm.h), buf holding world * shard floats (padded by
// the caller): after the reduce-scatter, piece `rank` of buf holds the sum over ranks (the rest
// of buf is unspecified). The all-gather takes `rounds` such blocks of world * shard one after
// another (stripes, model/shard.h; a contiguous piece is one round). Timed and watched like the
// others.
void dist_reduce_scatter_dev_f32(Dist *d, float *buf, size_t shard);
void dist_allgather_dev_f32(Dist *d, float *buf, size_t shard, size_t rounds);
void dist_allreduce_sum_dev_f32(Dist *d, float *buf, size_t n);

// Elements per rank of a ZeRO-1 partition of n elements: ceil(n / world) rounded up to a
// multiple of align (so that fixed-size blocks of the gradient norm never straddle ranks).
size_t dist_shard_size(size_t n, int world, size_t align);

#endif
