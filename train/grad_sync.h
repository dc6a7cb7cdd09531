// Data-parallel gradients (docs/DISTRIBUTED.md): accumulation of a rank's micro-steps,
// the sum over ranks, the global norm and, with ZeRO-1, the parameter all-gather.
//
// The flat fp32 layout of the parameter table (params.bytes_f32 / 4 = n elements, padding
// between tensors included and always 0) is the unit of sharding. ZeRO-1 cuts it into
// world pieces of `shard` elements (ceil(n / world) rounded up to GRAD_NORM_BLOCK; the last
// pieces may reach past n or be empty: padding, never a refusal). Rank r owns
// [r * shard, (r + 1) * shard) clipped to n: AdamW m and v exist only for it, and so do the
// fp32 masters where the backend keeps them apart from the storage (cuda, cpu-bf16): each rank
// updates its masters, copies them into its range of the (spent) gradient buffer, all-gathers
// that buffer and rounds the storage copy from it. The fp32 CPU backend's masters are its
// storage, which every rank needs whole: they are all-gathered in place and not sharded.
// With the sum overlapped with the backward (a bucket given to grad_sync_init), on the CPU and
// over NCCL, the shard is stripes instead of a piece: one stripe of every gradient bucket per
// rank (own, model/shard.h), so that each bucket is reduce-scattered over every rank's links
// while the backward runs; the optimizer's state and the sharded masters follow the stripes.
//
// One step:  for k < micro: begin_micro, forward, backward(1 / (world * micro)), end_micro
//            reduce -> norm -> adamw_update_range (own elements) -> gather_params
#ifndef CLLA_TRAIN_GRAD_SYNC_H
#define CLLA_TRAIN_GRAD_SYNC_H

#include <stddef.h>

#include "common/sumsq.h"
#include "model/model.h"
#include "train/dist.h"
#include "model/shard.h"

// Block of the gradient norm's sum of squares, the CPU backends' (common/sumsq.h): block sums
// added in index order, so ZeRO-1's norm, formed from the blocks of each shard, is bitwise the
// norm of the whole buffer.
#define GRAD_NORM_BLOCK SUMSQ_BLOCK

typedef struct GradSync {
    Dist *dist;
    const Backend *be;
    int zero;             // ZeRO stage: 0 (replicated optimizer) or 1 (sharded m, v)
    int host_mem;         // the backend's buffers are host memory (CPU): no staging copies
    int dev_coll;         // device buffers reduced in place by NCCL (dist_*_dev_f32): no staging
    int tree;             // micro-steps summed in the pairwise tree (CPU); else in backward
    int micro;            // micro-steps per rank and optimizer step
    int shard_masters;    // ZeRO-1 over several ranks with separate masters: every rank holds only
                          // its piece of them (the same on all ranks, unlike model_masters_sharded,
                          // which is 0 on a rank whose piece happens to be everything)
    size_t n;             // fp32 elements of the flat layout
    size_t shard;         // ZeRO-1: floats of a rank's piece (shard_count of own); n when not sharded
    Shard own;            // the elements this rank's optimizer holds (model/shard.h): all of them,
                          // a contiguous piece [rank shard, (rank + 1) shard) clipped to n, or
                          // stripes of every bucket (the sum overlapped)
    // pairwise tree of micro-gradients: a stack of partial sums with their levels
    float **stack, **pool;
    int *level, sp, n_pool, n_bufs;
    float *host;          // staging copy on device backends without NCCL (n floats), else NULL
    float *piece;         // reduce-scatter result (shard floats), host paths only
    // the sum over ranks overlapped with the last micro-step's backward
    size_t bucket;        // elements per bucket; 0: reduced after the backward
    DistBuckets *flight;  // during that backward: the buckets sent so far
    // ZeRO-1 in stripes: the all-gather of the updated weights, started with the next forward
    int gather_pending;   // the update is done, the gather not started
    DistBuckets *gathering;   // during that forward: the rounds sent so far
    Model *gather_model;
    size_t frontier;      // [frontier, n) of the gradient is complete and handed to flight
    float *cur;           // the buffer that last backward writes (model->grad then)
} GradSync;

// zero: 0 or 1. micro: micro-steps per rank per optimizer step. bucket: 0, or the overlap
// (train.overlap_grad_reduce) with buckets of about that many elements: the last micro-step's
// gradients go to the other ranks in buckets as the backward completes them, layer by layer from
// the last, and grad_sync_reduce only waits for the rest. On the host MPI path (the fp32 CPU
// backend) the same sums in the same order, so the same bits as without; on the NCCL path
// started NCCL collectives per bucket (the same to rounding). The staged device path without
// NCCL, and one rank, ignore it (g->bucket stays 0). ZeRO-1 with a bucket: the optimizer's shard
// (own) is stripes, one of every bucket for every rank (Megatron's layout; g->bucket becomes
// world x stripe), and sharded masters are packed in the same stripes. Call before the
// optimizer is made from own and before the masters are set.
void grad_sync_init(GradSync *g, Dist *d, Model *m, int zero, int micro, size_t bucket);
void grad_sync_free(GradSync *g, Model *m);
// Before micro-step k's backward: model->grad is ready to receive it.
void grad_sync_begin_micro(GradSync *g, Model *m, int k);
// After micro-step k's backward. After the last one model->grad holds this rank's sum of
// its micro-gradients (CPU: the pairwise tree over k, see train/dist.h).
void grad_sync_end_micro(GradSync *g, Model *m, int k);
// Sum over ranks. ZeRO 0: all of model->grad holds the global gradient on every rank;
// ZeRO 1: only own's elements do (the rest is this rank's local sum, unused).
void grad_sync_reduce(GradSync *g, Model *m);
// Global L2 norm of the gradient, the same bits on every rank and, except on the NCCL path
// (ZeRO-1 there adds one sumsq per rank's range, in rank order), for every ZeRO stage.
double grad_sync_norm(GradSync *g, Model *m);
// ZeRO 1: every rank receives every rank's updated masters, then the storage copy is
// refreshed with seed (as adamw_step does). ZeRO 0: only the refresh. With sharded masters the
// gradient buffer is overwritten (the next step's first micro-step zeroes it anyway).
// With the shard in stripes on the fp32 CPU path (the masters are the weights) the gather is only marked:
// grad_sync_begin_micro starts it before the next forward, which waits for each layer's weights
// as it reaches them (Model.param_wait); anything else that reads the weights first calls
// grad_sync_params_ready.
void grad_sync_gather_params(GradSync *g, Model *m, unsigned long long seed);
// Every weight in place: a marked or running gather completed. Collective: every rank calls it
// at the same point (before validation, before saving; grad_sync_full_masters calls it).
void grad_sync_params_ready(GradSync *g, Model *m);
// 1 when grad_sync_gather_params would only refresh the storage from this process's masters
// (no masters sharded or gathered), so that the update and the refresh may run as one pass.
int grad_sync_gather_is_refresh(const GradSync *g);
// Every master of the model in one backend buffer, for saving: m->master, or with sharded masters
// the gradient buffer after an all-gather (so only between steps). Collective: every rank calls it.
const float *grad_sync_full_masters(GradSync *g, Model *m);

// Does a trainer on this backend sum its micro-steps in a tree of fp32 gradient buffers (host
// memory only: the CPU backend; a device backend accumulates in its backward)? The memory plan
// counts the tree's buffers by this answer (model/mem_plan.h).
int grad_sync_sums_in_tree(const char *backend_name);

// Bytes of AdamW m and v one rank holds for a parameter layout of n fp32 elements.
double grad_sync_optimizer_bytes(size_t n, int world, int zero);
// Bytes of fp32 masters one rank holds: 0 where they are the storage (separate 0), else its
// piece of them under ZeRO-1, or all of them.
double grad_sync_master_bytes(size_t n, int world, int zero, int separate);

#endif
