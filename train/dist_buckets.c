// The sums over ranks of train/dist.c formed bucket by bucket while the buffer is still being
// written (train/dist.h, dist_buckets_*): train/grad_sync.c hands each range of gradients to it
// as the backward finishes the layers that write them, so the messages travel while the earlier
// layers compute. On the host each element is added in dist_reduce_scatter_f32's pairwise tree
// over ranks, whichever rank adds it, so the results are the bits of the collectives formed after
// the backward.
//
// A bucket's elements are cut into one part per rank; rank s receives part s from every rank and
// adds. All-reduce (ZeRO-0): the bucket is cut into world equal parts, so every bucket keeps every
// link busy both ways, and each rank then sends its added part to all (the all-gather half),
// written back into the buffer in place. Reduce-scatter (ZeRO-1): the bucket is a round of world
// stripes and part s is stripe s, which rank s's optimizer owns (model/shard.h): the same balance
// as the all-reduce's first half. (With the optimizer's pieces contiguous instead, a bucket had
// one owner, whose receive link took world - 1 copies of it while the others idled, and the
// backward completes the pieces one after another: docs/DISTRIBUTED.md measured that slower than
// the sum after the backward.)
//
// The all-gather (dist_buckets_begin_gather) takes the same stripes the other way: each rank's
// stripe of a round to every rank, rounds from the lowest, all ready at once, so that the
// forward, which reads the layout from its start, waits only for the rounds it has reached.
//
// On device buffers with NCCL (dist_buckets_begin_dev) a bucket is one started NCCL collective
// (kernels/nccl_comm.h: on a stream of its own, after the backward's kernels queued so far): an
// all-reduce, or a reduce-scatter of the round's stripes, in place. The GPU moves the data; no
// thread here.
#include "train/dist.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "train/dist_internal.h"

#ifdef CLLA_HAVE_MPI
#include <mpi.h>

enum { TAG_BUCKET = 102, TAG_GATHER = 103 };   // apart from dist.c's tags

// One bucket in flight.
typedef struct Flight {
    size_t lo, hi;        // the bucket: elements [lo, hi)
    size_t oa, len;       // this rank's part: elements [oa, oa + len)
    int gathering;        // all-reduce: the added parts are being exchanged (second phase)
    int nreq;
    MPI_Request *req;     // 2 world: receives, then sends
    float *recv;          // world x stride: rank s's values of the own part at s stride
} Flight;

struct DistBuckets {
    Dist *d;
    float *buf;           // read only in reduce-scatter mode on the host; written by the gather
    int scatter;          // 1: parts are stripes (reduce-scatter, gather)
    int dev;              // 1: device buffers, NCCL (no Flights, no thread)
    float *out;           // host reduce-scatter: this rank's piece of the sums; else NULL
    size_t n, shard, bucket;   // shard: the stripe of a reduce-scatter or gather
    size_t stride;        // floats of one rank's values in a Flight's recv (the longest own part)
    size_t unsent;        // buckets of the grid not sent yet ([0, unsent): sums, sent top down)
    int gather;           // all-gather of stripes (dist_buckets_begin_gather): rounds sent bottom up
    size_t next_up;       // gather: rounds [0, next_up) sent
    size_t done;          // gather: rounds [0, done) arrived (under mu when threaded)
    Flight fl[DIST_BUCKETS_IN_FLIGHT];
    int head, count;      // in-flight buckets in the order sent, the oldest at fl[head]
    float *recv;          // DIST_BUCKETS_IN_FLIGHT x world x stride floats
    MPI_Request *req;     // DIST_BUCKETS_IN_FLIGHT x 2 world
    // With MPI callable from any thread (Dist.mpi_serialized) a thread of its own sends, tests
    // and adds, so that the messages move while the caller computes: MPI moves data only inside
    // its calls (a TCP rendezvous waits for the receiver's next call), and the caller calls
    // between layers only. The caller then makes no MPI call until dist_buckets_finish.
    int threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t arrived;   // gather: signalled when a round has arrived
    size_t ready_from;    // under mu: the lowest `from` reported
    int finishing;        // under mu: dist_buckets_finish was called
};

// [lo, hi) within [p0, p1): its start and length
static size_t overlap(size_t lo, size_t hi, size_t p0, size_t p1, size_t *start) {
    const size_t a = lo > p0 ? lo : p0, e = hi < p1 ? hi : p1;
    *start = a;
    return e > a ? e - a : 0;
}

// Rank s's part of the bucket [lo, hi): its start and length. Reduce-scatter: stripe s of the
// round that starts at lo; all-reduce: world equal parts, the last ones shorter or empty.
static size_t part_of(const DistBuckets *b, size_t lo, size_t hi, int s, size_t *start) {
    const size_t q = b->scatter ? b->shard : (hi - lo + (size_t)b->d->world - 1) / (size_t)b->d->world;
    return overlap(lo, hi, lo + (size_t)s * q, lo + (size_t)(s + 1) * q, start);
}

// Bucket j's messages: the own part received from every rank (the own values copied), the
// other ranks' parts sent to them.
static void send_bucket(DistBuckets *b, size_t j, Flight *f) {
    const int W = b->d->world, me = b->d->rank;
    f->lo = j * b->bucket;
    f->hi = f->lo + b->bucket < b->n ? f->lo + b->bucket : b->n;
    f->len = part_of(b, f->lo, f->hi, me, &f->oa);
    f->gathering = 0;
    f->nreq = 0;
    if (b->gather) {   // the own stripe to every rank, theirs into their places
        for (int s = 0; s < W; s++) {
            if (s == me) continue;
            size_t sa, sl = part_of(b, f->lo, f->hi, s, &sa);
            if (sl) MPI_Irecv(b->buf + sa, (int)sl, MPI_FLOAT, s, TAG_GATHER, MPI_COMM_WORLD, &f->req[f->nreq++]);
            if (f->len) MPI_Isend(b->buf + f->oa, (int)f->len, MPI_FLOAT, s, TAG_GATHER, MPI_COMM_WORLD, &f->req[f->nreq++]);
        }
        return;
    }
    for (int s = 0; s < W; s++) {
        if (s == me) {
            if (f->len) memcpy(f->recv + (size_t)s * b->stride, b->buf + f->oa, f->len * sizeof(float));
            continue;
        }
        if (f->len) MPI_Irecv(f->recv + (size_t)s * b->stride, (int)f->len, MPI_FLOAT, s, TAG_BUCKET, MPI_COMM_WORLD, &f->req[f->nreq++]);
        size_t sa, sl = part_of(b, f->lo, f->hi, s, &sa);
        if (sl) MPI_Isend(b->buf + sa, (int)sl, MPI_FLOAT, s, TAG_BUCKET, MPI_COMM_WORLD, &f->req[f->nreq++]);
    }
}

// The oldest bucket's messages are complete. First phase: its own part added in the pairwise
// tree over rank indices (train/dist.h; dist_reduce_scatter_f32's adds, element by element)
// into out, or (all-reduce) into buf, whose every part has been sent by now, and the added part
// sent to every rank while theirs are received into buf. Second phase: done. Returns 1 when the
// bucket is done (and leaves the queue).
static int advance_oldest(DistBuckets *b) {
    Flight *f = &b->fl[b->head];
    const int W = b->d->world, me = b->d->rank;
    if (b->gather) {   // arrived: rounds arrive in order (the oldest first)
        if (b->threaded) pthread_mutex_lock(&b->mu);
        b->done++;
        if (b->threaded) {
            pthread_cond_broadcast(&b->arrived);
            pthread_mutex_unlock(&b->mu);
        }
    } else if (!f->gathering) {
        // (a plain loop: on the progress thread an OpenMP loop would start a second team of threads)
        for (int s = 1; s < W; s *= 2)
            for (int j = 0; j + s < W; j += 2 * s) {
                float *dst = f->recv + (size_t)j * b->stride;
                const float *src = f->recv + (size_t)(j + s) * b->stride;
                for (size_t i = 0; i < f->len; i++) dst[i] += src[i];
            }
        // reduce-scatter: round lo / bucket of the stripes, packed (model/shard.h)
        float *to = b->out ? b->out + f->lo / b->bucket * b->shard + (f->oa - f->lo - (size_t)me * b->shard) : b->buf + f->oa;
        if (f->len) memcpy(to, f->recv, f->len * sizeof(float));
        if (!b->out) {
            f->gathering = 1;
            f->nreq = 0;
            for (int s = 0; s < W; s++) {
                if (s == me) continue;
                size_t sa, sl = part_of(b, f->lo, f->hi, s, &sa);
                if (sl) MPI_Irecv(b->buf + sa, (int)sl, MPI_FLOAT, s, TAG_GATHER, MPI_COMM_WORLD, &f->req[f->nreq++]);
                if (f->len) MPI_Isend(b->buf + f->oa, (int)f->len, MPI_FLOAT, s, TAG_GATHER, MPI_COMM_WORLD, &f->req[f->nreq++]);
            }
            return 0;
        }
    }
    b->head = (b->head + 1) % DIST_BUCKETS_IN_FLIGHT;
    b->count--;
    return 1;
}

static void wait_oldest(DistBuckets *b) {
    do {
        Flight *f = &b->fl[b->head];
        MPI_Waitall(f->nreq, f->req, MPI_STATUSES_IGNORE);
    } while (!advance_oldest(b));
}

// 1 when a bucket of the grid not yet sent lies wholly at or above from.
static int sendable(const DistBuckets *b, size_t from) {
    if (b->gather) return b->unsent > 0;   // every round is ready at once
    return b->unsent > 0 && (b->unsent - 1) * b->bucket >= from;
}

// One round: the oldest buckets whose messages have arrived are advanced, then the buckets at
// or above from are sent; with all DIST_BUCKETS_IN_FLIGHT in flight, a further one waits for
// the oldest (wait) or for the next round. Returns 1 when anything was done.
static int pump(DistBuckets *b, size_t from, int wait) {
    int did = 0;
    while (b->count > 0) {
        Flight *f = &b->fl[b->head];
        int done = 0;
        MPI_Testall(f->nreq, f->req, &done, MPI_STATUSES_IGNORE);
        if (!done) break;
        did = 1;
        if (!advance_oldest(b)) break;   // its second phase has just been posted
    }
    while (sendable(b, from)) {
        if (b->count == DIST_BUCKETS_IN_FLIGHT) {
            if (!wait) break;
            wait_oldest(b);
        }
        b->unsent--;
        send_bucket(b, b->gather ? b->next_up++ : b->unsent, &b->fl[(b->head + b->count) % DIST_BUCKETS_IN_FLIGHT]);
        b->count++;
        did = 1;
    }
    return did;
}

// The progress thread: rounds while there is anything in flight or to send, 50 us asleep after a
// round that moved nothing, asleep on cv while there is nothing; done when finish was called and
// everything has arrived. The poll is short because a network transfer's rendezvous waits for
// it: with sleeps growing from 20 us to 1 ms after idle rounds, the overlapped runs of
// bench/bench_overlap.sh over an emulated 1 Gbit/s link were slower than the ones summing after
// the backward; with 50 us they are faster (docs/DISTRIBUTED.md).
static void *progress_main(void *arg) {
    DistBuckets *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        while (!b->finishing && b->count == 0 && !sendable(b, b->ready_from)) pthread_cond_wait(&b->cv, &b->mu);
        const size_t from = b->ready_from;
        const int finishing = b->finishing;
        pthread_mutex_unlock(&b->mu);
        const int did = pump(b, from, 0);
        if (finishing && b->unsent == 0 && b->count == 0) return NULL;
        if (!did) {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

static DistBuckets *fresh(Dist *d, float *buf, size_t n, size_t shard, size_t bucket, int scatter) {
    if (bucket == 0 || bucket > (size_t)2147483647)
        die("dist: a gradient bucket of %zu elements: it must be 1 to 2^31 - 1 (MPI's int counts)", bucket);
    DistBuckets *b = xcalloc(1, sizeof(*b));
    b->d = d;
    b->buf = buf;
    b->scatter = scatter;
    b->n = n;
    b->shard = shard;
    b->bucket = bucket;
    b->unsent = n / bucket + (n % bucket != 0);
    b->ready_from = n;
    return b;
}

// shard: the reduce-scatter's or the gather's stripe (bucket = world x stripe), else unused
static DistBuckets *begin(Dist *d, float *buf, size_t n, size_t shard, size_t bucket, float *out, int gather) {
    DistBuckets *b = fresh(d, buf, n, shard, bucket, out != NULL || gather);
    b->out = out;
    b->gather = gather;
    // the longest own part: the stripe, or ceil(min(bucket, n) / world)
    const size_t whole = bucket < n ? bucket : n;
    b->stride = out ? shard : (whole + (size_t)d->world - 1) / (size_t)d->world;
    size_t per, total;
    if (__builtin_mul_overflow((size_t)d->world, b->stride, &per) ||
        __builtin_mul_overflow(per, (size_t)DIST_BUCKETS_IN_FLIGHT * sizeof(float), &total))
        die("dist: %d ranks x gradient buckets of %zu elements overflow a size: lower train.grad_bucket_elements", d->world, bucket);
    b->recv = xmalloc(total ? total : 1);
    b->req = xmalloc((size_t)DIST_BUCKETS_IN_FLIGHT * 2 * (size_t)d->world * sizeof(MPI_Request));
    for (int i = 0; i < DIST_BUCKETS_IN_FLIGHT; i++) {
        b->fl[i].recv = b->recv + (size_t)i * per;
        b->fl[i].req = b->req + (size_t)i * 2 * (size_t)d->world;
    }
    if (out) memset(out, 0, (b->unsent ? b->unsent : 1) * shard * sizeof(float));   // the stripes past n stay 0
    if (d->mpi_serialized) {
        pthread_mutex_init(&b->mu, NULL);
        pthread_cond_init(&b->cv, NULL);
        pthread_cond_init(&b->arrived, NULL);
        if (pthread_create(&b->thread, NULL, progress_main, b) != 0) die("dist: cannot start the gradient progress thread");
        b->threaded = 1;
    }
    return b;
}

DistBuckets *dist_buckets_begin(Dist *d, const float *buf, size_t n, size_t stripe, float *out) {
    size_t bucket;
    if (!out || stripe == 0 || __builtin_mul_overflow(stripe, (size_t)d->world, &bucket))
        die("dist_buckets_begin: no output, or stripes of %zu elements over %d ranks (internal error)", stripe, d->world);
    return begin(d, (float *)buf, n, stripe, bucket, out, 0);   // (buf is only read in this mode)
}

DistBuckets *dist_buckets_begin_allreduce(Dist *d, float *buf, size_t n, size_t bucket) { return begin(d, buf, n, n, bucket, NULL, 0); }

DistBuckets *dist_buckets_begin_gather(Dist *d, float *buf, size_t n, size_t stripe) {
    size_t bucket;
    if (stripe == 0 || __builtin_mul_overflow(stripe, (size_t)d->world, &bucket))
        die("dist_buckets_begin_gather: stripes of %zu elements over %d ranks (internal error)", stripe, d->world);
    return begin(d, buf, n, stripe, bucket, NULL, 1);
}

void dist_buckets_wait(DistBuckets *b, size_t upto) {
    if (!b->gather) die("dist_buckets_wait on a sum (internal error)");
    if (upto > b->n) upto = b->n;
    const size_t rounds = upto ? (upto - 1) / b->bucket + 1 : 0;   // the rounds that hold [0, upto)
    double t0;
    dist_enter(b->d, "all-gather of the weights (stripes)", &t0);
    if (b->threaded) {
        pthread_mutex_lock(&b->mu);
        while (b->done < rounds) pthread_cond_wait(&b->arrived, &b->mu);
        pthread_mutex_unlock(&b->mu);
    } else {
        while (b->done < rounds) {
            pump(b, 0, 1);
            if (b->done < rounds) wait_oldest(b);
        }
    }
    dist_leave(b->d, t0);
}

#ifdef DIST_NCCL
DistBuckets *dist_buckets_begin_dev(Dist *d, float *buf, size_t n, size_t stripe, size_t bucket, int scatter) {
    if (!d->nccl) die("dist_buckets_begin_dev without an NCCL communicator (internal error)");
    if (scatter && bucket != stripe * (size_t)d->world)
        die("dist_buckets_begin_dev: a bucket of %zu elements is not %d stripes of %zu (internal error)", bucket, d->world, stripe);
    DistBuckets *b = fresh(d, buf, n, stripe, bucket, scatter);
    b->dev = 1;
    return b;
}

// Every bucket at or above from not yet started, started.
static void start_dev(DistBuckets *b, size_t from) {
    while (sendable(b, from)) {
        const size_t j = --b->unsent, lo = j * b->bucket, hi = lo + b->bucket < b->n ? lo + b->bucket : b->n;
        if (b->scatter) nccl_comm_start_reduce_scatter_f32(b->d->nccl, b->buf + lo, b->shard);   // the whole round: padded
        else nccl_comm_start_allreduce_f32(b->d->nccl, b->buf + lo, hi - lo);
    }
}
#else
DistBuckets *dist_buckets_begin_dev(Dist *d, float *buf, size_t n, size_t stripe, size_t bucket, int scatter) {
    (void)d; (void)buf; (void)n; (void)stripe; (void)bucket; (void)scatter;
    die("dist: a bucketed sum on device buffers needs NCCL, which this build lacks (internal error)");
}
static void start_dev(DistBuckets *b, size_t from) { (void)b; (void)from; }
#endif

void dist_buckets_ready(DistBuckets *b, size_t from) {
    if (b->dev) {
        start_dev(b, from);
        return;
    }
    if (b->threaded) {
        pthread_mutex_lock(&b->mu);   // (the unlock publishes the caller's writes below from)
        if (from < b->ready_from) {
            b->ready_from = from;
            pthread_cond_signal(&b->cv);
        }
        pthread_mutex_unlock(&b->mu);
        return;
    }
    double t0;
    dist_enter(b->d, "sum of gradients over ranks (buckets)", &t0);
    pump(b, from, 1);
    dist_leave(b->d, t0);
}

void dist_buckets_finish(DistBuckets *b) {
    double t0;
    // only the wait counts as time in collectives: the thread's work overlapped the caller's
    dist_enter(b->d, "sum of gradients over ranks (buckets)", &t0);
    if (b->dev) {
        start_dev(b, 0);
#ifdef DIST_NCCL
        nccl_comm_wait_started(b->d->nccl);
#endif
    } else if (b->threaded) {
        pthread_mutex_lock(&b->mu);
        b->ready_from = 0;
        b->finishing = 1;
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->thread, NULL);
        pthread_cond_destroy(&b->arrived);
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
    } else {
        pump(b, 0, 1);
        while (b->count > 0) wait_oldest(b);
    }
    dist_leave(b->d, t0);
    free(b->recv);
    free(b->req);
    free(b);
}

#else   // without MPI there is one rank and nothing to reduce: train/grad_sync.c never starts one

DistBuckets *dist_buckets_begin(Dist *d, const float *buf, size_t n, size_t stripe, float *out) {
    (void)d; (void)buf; (void)n; (void)stripe; (void)out;
    die("dist: a bucketed reduce-scatter without MPI (internal error)");
}
DistBuckets *dist_buckets_begin_allreduce(Dist *d, float *buf, size_t n, size_t bucket) {
    (void)d; (void)buf; (void)n; (void)bucket;
    die("dist: a bucketed all-reduce without MPI (internal error)");
}
DistBuckets *dist_buckets_begin_dev(Dist *d, float *buf, size_t n, size_t stripe, size_t bucket, int scatter) {
    (void)d; (void)buf; (void)n; (void)stripe; (void)bucket; (void)scatter;
    die("dist: a bucketed sum on device buffers without MPI (internal error)");
}
void dist_buckets_ready(DistBuckets *b, size_t from) { (void)b; (void)from; }
DistBuckets *dist_buckets_begin_gather(Dist *d, float *buf, size_t n, size_t stripe) {
    (void)d; (void)buf; (void)n; (void)stripe;
    die("dist: a bucketed all-gather without MPI (internal error)");
}
void dist_buckets_wait(DistBuckets *b, size_t upto) { (void)b; (void)upto; }
void dist_buckets_finish(DistBuckets *b) { (void)b; }

#endif
