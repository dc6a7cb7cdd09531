// Data-parallel gradients: micro-step tree, reduce(-scatter), norm, ZeRO-1 gather
// (train/grad_sync.h).
#include "train/grad_sync.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/mem_plan.h"

static void add_into(float *dst, const float *src, size_t n) {
    #pragma omp parallel for schedule(static) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

// The stripes of the overlapped ZeRO-1 sum (model/shard.h): ceil(bucket / world) elements rounded
// up to the norm's block (so that the norm's blocks lie within one rank's stripe), a bucket = a
// round of world stripes; at most the contiguous piece `shard` (one round then covers the model)
// and what keeps a round within MPI's int counts (train.grad_bucket_elements' bound, on every
// path). On the host also at most DIST_PIECE / DIST_BUCKETS_IN_FLIGHT elements (the buckets in
// flight then receive at most world x DIST_PIECE floats, as the plain reduce-scatter's scratch
// holds); NCCL reduces in place, with no scratch.
static size_t stripe_elements(size_t bucket, size_t world, size_t shard, int host) {
    const size_t per = (bucket + world - 1) / world, mpi = (size_t)2147483647 / world / GRAD_NORM_BLOCK;
    size_t most = shard / GRAD_NORM_BLOCK;   // (shard: a multiple of the block, dist_shard_size)
    if (most > mpi) most = mpi;
    if (host && most > DIST_PIECE / DIST_BUCKETS_IN_FLIGHT / GRAD_NORM_BLOCK) most = DIST_PIECE / DIST_BUCKETS_IN_FLIGHT / GRAD_NORM_BLOCK;
    if (most == 0) die("grad_sync: %zu ranks leave no stripe of %zu elements within MPI's int counts", world, (size_t)GRAD_NORM_BLOCK);
    const size_t blocks = (per + GRAD_NORM_BLOCK - 1) / GRAD_NORM_BLOCK;
    return (blocks < most ? blocks : most) * GRAD_NORM_BLOCK;
}

void grad_sync_init(GradSync *g, Dist *d, Model *m, int zero, int micro, size_t bucket) {
    memset(g, 0, sizeof(*g));
    g->dist = d;
    g->be = m->be;
    g->zero = zero;
    g->micro = micro;
    g->host_mem = m->be == backend_cpu();
    // One trainer path, the collective chosen by backend: NCCL on the device buffers when the
    // process group opened a communicator (CUDA build with NCCL), else MPI on host memory.
    g->dev_coll = !g->host_mem && d->world > 1 && dist_has_device_collectives(d);
    g->n = m->params.bytes_f32 / 4;
    // the sum overlapped with the backward: on host memory (MPI) and over NCCL; the device path
    // staged through host memory sums after the backward
    if ((g->host_mem || g->dev_coll) && d->world > 1) g->bucket = bucket;   // (ZeRO-0 sums in place)
    if (!zero) {
        g->shard = g->n;
        g->own = (Shard){0, g->n, g->n, g->n};
    } else {
        const size_t W = (size_t)d->world;
        g->shard = dist_shard_size(g->n, d->world, GRAD_NORM_BLOCK);
        if (g->bucket) {
            // overlapped: stripes, every rank one of every bucket, so that each bucket is
            // reduce-scattered over every rank's links (Megatron's layout)
            const size_t stripe = stripe_elements(g->bucket, W, g->shard, g->host_mem);
            g->own = (Shard){(size_t)d->rank * stripe, stripe, stripe * W, g->n};
            g->bucket = stripe * W;
            g->shard = shard_count(&g->own);
        } else {
            g->own = (Shard){(size_t)d->rank * g->shard, g->shard, g->shard * W, g->n};   // one round: world * shard >= n
        }
        if (!g->dev_coll) g->piece = xmalloc(g->shard * sizeof(float));
        g->shard_masters = d->world > 1 && (void *)m->master != m->w;
        if (g->shard_masters) model_shard_masters(m, &g->own);
        if (g->dev_coll) {
            // NCCL works in place on whole rounds of world equal parts: the gradient buffer (which
            // also carries the all-gather of the sharded masters) is allocated padded to the
            // rounds, instead of copying it into a second padded buffer at every collective.
            // Masters that are the storage would need the same; no device backend has them
            // (checked, not assumed).
            if (!g->shard_masters)
                die("grad_sync: ZeRO-1 over NCCL needs fp32 masters apart from the storage; backend '%s' has none (internal error)",
                    g->be->name);
            size_t padded;
            if (__builtin_mul_overflow(shard_rounds(&g->own), g->own.period, &padded))
                die("grad_sync: %d ranks x %zu elements overflow a size (internal error)", d->world, g->shard);
            model_pad_grad(m, padded);
        }
    }
    if (!g->host_mem && !g->dev_coll && d->world > 1) g->host = xmalloc(g->n * sizeof(float));
    // The tree needs an fp32 add of gradient buffers, which only host memory has here; a
    // device backend accumulates in backward (results then agree across rank counts to
    // rounding, not bitwise).
    g->tree = grad_sync_sums_in_tree(g->be->name) && micro > 1;
    if (g->tree) {
        // the stack before micro-step k+1 holds popcount(k+1) partial sums: at most the plan's count
        g->n_bufs = mem_grad_tree_buffers(micro);
        g->stack = xcalloc((size_t)g->n_bufs + 1, sizeof(float *));
        g->pool = xcalloc((size_t)g->n_bufs + 1, sizeof(float *));
        g->level = xcalloc((size_t)g->n_bufs + 1, sizeof(int));
        for (int i = 0; i < g->n_bufs; i++) g->pool[g->n_pool++] = g->be->alloc(m->params.bytes_f32);
    }
}

int grad_sync_sums_in_tree(const char *backend_name) { return !strcmp(backend_name, "cpu"); }

void grad_sync_free(GradSync *g, Model *m) {
    grad_sync_params_ready(g, m);
    for (int i = 0; i < g->sp; i++) g->pool[g->n_pool++] = g->stack[i];
    for (int i = 0; i < g->n_pool; i++) g->be->release(g->pool[i]);
    free(g->stack);
    free(g->pool);
    free(g->level);
    free(g->host);
    free(g->piece);
    memset(g, 0, sizeof(*g));
}

// Model.grad_final during the last micro-step's backward: [from, frontier) of the gradient is
// complete. With the micro-step tree it is first folded as grad_sync_end_micro folds the whole
// buffer at the last micro-step (the stack's nodes added into it from the newest down), then its
// buckets go to the other ranks.
static void on_grad_final(void *ctx, size_t from) {
    GradSync *g = ctx;
    if (g->gathering) die("grad_sync: the backward began before the forward's weights all arrived (internal error)");
    if (from >= g->frontier) return;
    for (int i = g->sp - 1; i >= 0; i--) add_into(g->cur + from, g->stack[i] + from, g->frontier - from);
    dist_buckets_ready(g->flight, from);
    g->frontier = from;
}

// Model.param_wait during the forward after a striped update: [0, upto) must be in place.
static void on_param_wait(void *ctx, size_t upto) {
    GradSync *g = ctx;
    dist_buckets_wait(g->gathering, upto);
    if (upto >= g->n) {   // the forward's last wait: done before its backward reports anything
        dist_buckets_finish(g->gathering);
        g->gathering = NULL;
        g->gather_model->param_wait = NULL;
        g->gather_model->param_wait_ctx = NULL;
    }
}

void grad_sync_begin_micro(GradSync *g, Model *m, int k) {
    if (g->tree || k == 0) model_zero_grad(m);
    if (g->gather_pending && k == 0) {
        // the rounds in the forward's order; its progress thread, like the sum's below, calls MPI
        // only while it has work, and the forward's last wait ends it before the backward's reports
        g->gathering = dist_buckets_begin_gather(g->dist, m->master, g->n, g->own.stripe);
        g->gather_pending = 0;
        g->gather_model = m;
        m->param_wait = on_param_wait;
        m->param_wait_ctx = g;
    }
    if (g->bucket && k == g->micro - 1) {
        g->flight = g->dev_coll ? dist_buckets_begin_dev(g->dist, m->grad, g->n, g->own.stripe, g->bucket, g->zero)
                    : g->zero   ? dist_buckets_begin(g->dist, m->grad, g->n, g->own.stripe, g->piece)
                                : dist_buckets_begin_allreduce(g->dist, m->grad, g->n, g->bucket);
        g->frontier = g->n;
        g->cur = m->grad;
        m->grad_final = on_grad_final;
        m->grad_final_ctx = g;
    }
}

void grad_sync_end_micro(GradSync *g, Model *m, int k) {
    if (g->flight && k == g->micro - 1) {
        on_grad_final(g, 0);   // whatever the backward did not report (it may return early)
        m->grad_final = NULL;
        m->grad_final_ctx = NULL;
        while (g->sp > 0) g->pool[g->n_pool++] = g->stack[--g->sp];   // folded into m->grad already
        return;
    }
    if (!g->tree) return;
    // Binary-counter merge: equal levels combine at once, so the partial sums are the nodes of
    // the bottom-up pairwise tree; the last micro-step folds the stack from its smallest
    // (newest) node up, which completes that tree for any count (train/dist.h).
    float *cur = m->grad;
    int lv = 0;
    while (g->sp > 0 && g->level[g->sp - 1] == lv) {
        add_into(cur, g->stack[g->sp - 1], g->n);
        g->pool[g->n_pool++] = g->stack[--g->sp];
        lv++;
    }
    if (k < g->micro - 1) {
        g->stack[g->sp] = cur;
        g->level[g->sp++] = lv;
        if (g->n_pool == 0) die("grad_sync: no free gradient buffer at micro-step %d (internal error)", k);
        m->grad = g->pool[--g->n_pool];
    } else {
        while (g->sp > 0) {
            add_into(cur, g->stack[g->sp - 1], g->n);
            g->pool[g->n_pool++] = g->stack[--g->sp];
        }
        m->grad = cur;
    }
}

void grad_sync_reduce(GradSync *g, Model *m) {
    Dist *d = g->dist;
    if (d->world == 1) return;
    if (g->flight) {   // summed during the backward: what is left, and the wait
        dist_buckets_finish(g->flight);   // ZeRO-0: m->grad holds the sum; ZeRO-1 on NCCL: its own stripes
        g->flight = NULL;
        if (g->zero && !g->dev_coll) shard_copy(&g->own, g->be->upload, m->grad, g->piece, 0);   // (host memory here)
        return;
    }
    if (g->dev_coll) {
        // in place on the GPU; ZeRO-1 leaves the sum in [lo, hi) only, as the host path does
        if (g->zero) dist_reduce_scatter_dev_f32(d, m->grad, g->shard);
        else dist_allreduce_sum_dev_f32(d, m->grad, g->n);
        return;
    }
    float *buf = m->grad;
    if (!g->host_mem) {
        g->be->download(g->host, m->grad, g->n * sizeof(float));
        buf = g->host;
    }
    if (!g->zero) {
        dist_allreduce_sum_f32(d, buf, g->n);
        if (!g->host_mem) g->be->upload(m->grad, g->host, g->n * sizeof(float));
        return;
    }
    if (!shard_is_contiguous(&g->own)) die("grad_sync: a striped shard summed without its buckets (internal error)");
    dist_reduce_scatter_f32(d, buf, g->n, g->shard, g->piece);
    shard_copy(&g->own, g->be->upload, m->grad, g->piece, 0);   // the CPU backend's upload is a memcpy
}

double grad_sync_norm(GradSync *g, Model *m) {
    Dist *d = g->dist;
    if (!g->zero || d->world == 1) return sqrt(m->be->sumsq(m->grad, g->n));
    if (g->dev_coll) {
        // The shard is on the GPU (no host piece): one device sumsq of the own range, the ranks'
        // values added in rank order. Deterministic, the same on every rank, but not the bits of
        // the ZeRO-0 norm (different blocking): GPU runs agree across settings to rounding.
        // (Stripes: one pass over them, backend/backend.h sumsq_stripes.)
        const double mine = m->be->sumsq_stripes(m->grad, g->own.lo, g->own.stripe, g->own.period, g->own.end);
        return sqrt(dist_sum_f64(d, mine));
    }
    // Block sums of the own shard, gathered, then added in block order: the arithmetic of the
    // CPU backend's sumsq over the whole buffer. Packed block p of rank r is block
    // (p / sb) * W * sb + r * sb + p % sb of the buffer (sb blocks a stripe; a contiguous piece is
    // one stripe, so rank-major order is block order there).
    const size_t W = (size_t)d->world, per = g->shard / GRAD_NORM_BLOCK, sb = g->own.stripe / GRAD_NORM_BLOCK;
    const size_t total = (g->n + GRAD_NORM_BLOCK - 1) / GRAD_NORM_BLOCK;
    double *mine = xcalloc(per ? per : 1, sizeof(double)), *all = xmalloc((per ? per : 1) * W * sizeof(double));
    double *ordered = xcalloc(total ? total : 1, sizeof(double));
    for (size_t p = 0; p < per; p++) {
        size_t a0, b0, off;
        shard_range(&g->own, p / sb, &a0, &b0, &off);
        const size_t a = a0 + (p % sb) * GRAD_NORM_BLOCK;
        if (a >= b0) continue;
        const size_t len = b0 - a < GRAD_NORM_BLOCK ? b0 - a : GRAD_NORM_BLOCK;
        if (g->host_mem) {
            mine[p] = m->be->sumsq(m->grad + a, len);
        } else {
            mine[p] = sumsq_block(g->piece + off + (a - a0), len);   // the host piece, summed as sumsq does
        }
    }
    if (per > (size_t)2147483647) die("gradient norm: %zu blocks per rank exceed MPI's int counts", per);
    dist_allgather_f64(d, mine, (int)per, all);
    for (size_t r = 0; r < W; r++)
        for (size_t p = 0; p < per; p++) {
            const size_t b = (p / sb) * W * sb + r * sb + p % sb;
            if (b < total) ordered[b] = all[r * per + p];
        }
    double s = 0.0;
    for (size_t b = 0; b < total; b++) s += ordered[b];   // block order
    free(mine);
    free(all);
    free(ordered);
    return sqrt(s);
}

// In place on `full` (n fp32 elements of backend memory, this rank's [lo, hi) filled): every
// rank's range from its owner.
static void allgather_full(GradSync *g, float *full) {
    Dist *d = g->dist;
    if (g->host_mem) {
        // round by round: a round is the world's stripes in rank order, as a contiguous layout is
        const size_t rounds = shard_rounds(&g->own), P = g->own.period;
        for (size_t k = 0; k < rounds; k++) {
            const size_t a = k * P, len = g->n - a < P ? g->n - a : P;
            dist_allgather_f32(d, full + a, len, g->own.stripe);
        }
    } else if (g->dev_coll) {
        dist_allgather_dev_f32(d, full, g->own.stripe, shard_rounds(&g->own));   // full: m->grad, padded at init
    } else {
        g->be->download(g->host, full, g->n * sizeof(float));
        dist_allgather_f32(d, g->host, g->n, g->shard);
        g->be->upload(full, g->host, g->n * sizeof(float));
    }
}

// Sharded masters: this rank's piece into its range of the gradient buffer, then the rest from
// the other ranks. The buffer's padding between tensors stays 0 (every rank's gradient had it 0).
static float *assemble_masters(GradSync *g, Model *m) {
    shard_copy(&m->master_sh, g->be->copy, m->grad, m->master, 0);
    allgather_full(g, m->grad);
    return m->grad;
}

// Every branch below is taken by all ranks alike (g->shard_masters, g->zero, world): each
// rank enters the same collectives.
void grad_sync_gather_params(GradSync *g, Model *m, unsigned long long seed) {
    if (g->zero && g->host_mem && g->dist->world > 1 && !shard_is_contiguous(&g->own)) {
        g->gather_pending = 1;   // the masters are the weights here: no refresh (started by begin_micro)
        return;
    }
    if (g->shard_masters) {
        model_sync_weights_from(m, assemble_masters(g, m), seed);
        return;
    }
    if (g->zero && g->dist->world > 1) allgather_full(g, m->master);
    model_sync_weights(m, seed);
}

int grad_sync_gather_is_refresh(const GradSync *g) { return !g->shard_masters && !(g->zero && g->dist->world > 1); }

void grad_sync_params_ready(GradSync *g, Model *m) {
    if (g->gathering) {
        dist_buckets_finish(g->gathering);
        g->gathering = NULL;
        m->param_wait = NULL;
        m->param_wait_ctx = NULL;
    }
    if (g->gather_pending) {
        allgather_full(g, m->master);
        g->gather_pending = 0;
    }
}

const float *grad_sync_full_masters(GradSync *g, Model *m) {
    grad_sync_params_ready(g, m);
    return g->shard_masters ? assemble_masters(g, m) : m->master;
}

double grad_sync_optimizer_bytes(size_t n, int world, int zero) {
    size_t per = zero && world > 1 ? dist_shard_size(n, world, GRAD_NORM_BLOCK) : n;
    return 2.0 * 4.0 * (double)per;
}

double grad_sync_master_bytes(size_t n, int world, int zero, int separate) {
    if (!separate) return 0.0;
    return 4.0 * (double)(zero && world > 1 ? dist_shard_size(n, world, GRAD_NORM_BLOCK) : n);
}
