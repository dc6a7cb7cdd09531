// The process group and its deterministic collectives (train/dist.h).
#include "train/dist.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/num.h"
#include "common/util.h"
#include "data/bytes.h"
#include "train/dist_internal.h"

#ifdef CLLA_HAVE_MPI
#include <mpi.h>
#endif
#ifdef CLLA_HAVE_CUDA
#include "kernels/backend_cuda.h"
#endif
#ifdef CLLA_NCCL_EMULATION
// Test builds only (tests/nccl_emu/): NCCL emulated over MPI on host memory, attached to the
// cpu-bf16 backend, so the trainer's device-collective path runs without GPUs.
#include "backend/backend.h"
#endif

// ---------------------------------------------------------------- watchdog

// A thread that watches the collective in progress. It never calls MPI (the library is
// initialized for the main thread only): on a timeout it prints and _exit()s, and mpirun
// (which ends a job when one process exits non-zero) takes the other ranks down.
struct DistWatchdog {
    pthread_t thread;
    atomic_llong entered_ms;      // monotonic ms when the current collective began, 0 when none
    atomic_int stop;
    const char *volatile what;   // name of the current collective (a string literal)
    long long timeout_ms;
    int rank, world;
};

static long long mono_ms(void) { return (long long)(now_seconds() * 1000.0); }

static void *watchdog_main(void *arg) {
    DistWatchdog *w = arg;
    while (!atomic_load(&w->stop)) {
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        long long t0 = atomic_load(&w->entered_ms);
        if (t0 && mono_ms() - t0 > w->timeout_ms) {
            fprintf(stderr,
                    "clla: error: rank %d of %d: '%s' has waited %.0f s for the other ranks (train.dist_timeout_s): a rank died, hangs or the network is down; ending this process so that the launcher ends the job (resume from the last checkpoint with --resume auto)\n",
                    w->rank, w->world, w->what ? w->what : "collective", (double)(mono_ms() - t0) / 1000.0);
            fflush(stderr);
            _exit(3);
        }
    }
    return NULL;
}

#ifdef CLLA_HAVE_MPI   // only the MPI collectives are timed and watched
void dist_enter(Dist *d, const char *what, double *t0) {
    *t0 = now_seconds();
    if (d->watchdog) {
        d->watchdog->what = what;
        atomic_store(&d->watchdog->entered_ms, mono_ms() ? mono_ms() : 1);
    }
}

void dist_leave(Dist *d, double t0) {
    if (d->watchdog) atomic_store(&d->watchdog->entered_ms, 0);
    d->comm_seconds += now_seconds() - t0;
}
#endif

// ---------------------------------------------------------------- group

// What launchers put in each rank's environment: the one table that both whether this process
// is an MPI rank (dist_init) and how many ranks were started (dist_launched_ranks) are read from.
static const struct {
    const char *name;
    int size;   // the value is the number of ranks (else a rank's index)
    int mpi;    // set by an MPI launcher (SLURM's step size also for a step without MPI)
} LAUNCHER_VARS[] = {
    {"OMPI_COMM_WORLD_SIZE", 1, 1}, {"PMIX_RANK", 0, 1}, {"PMI_RANK", 0, 1}, {"PMI_SIZE", 1, 1}, {"SLURM_STEP_NUM_TASKS", 1, 0},
};
#define N_LAUNCHER_VARS (sizeof(LAUNCHER_VARS) / sizeof(LAUNCHER_VARS[0]))

int dist_launched_ranks(const char **var) {
    for (size_t i = 0; i < N_LAUNCHER_VARS; i++) {
        const char *v = LAUNCHER_VARS[i].size ? getenv(LAUNCHER_VARS[i].name) : NULL;
        uint64_t n = 0;
        if (v && num_parse_u64(v, UINT64_MAX, &n) == NUM_OK && n > 1) {
            if (var) *var = LAUNCHER_VARS[i].name;
            return n > INT_MAX ? INT_MAX : (int)n;
        }
    }
    return 1;
}

#ifdef CLLA_HAVE_MPI
static int launched_by_mpi(void) {
    for (size_t i = 0; i < N_LAUNCHER_VARS; i++)
        if (LAUNCHER_VARS[i].mpi && getenv(LAUNCHER_VARS[i].name)) return 1;
    return 0;
}
#endif

void dist_init(Dist *d, double timeout_s) {
    memset(d, 0, sizeof(*d));
    d->world = d->local_world = 1;
#ifdef CLLA_HAVE_MPI
    int already = 0;
    MPI_Initialized(&already);
    if (launched_by_mpi() || already) {
        if (!already) {
            int provided;
            // SERIALIZED: OpenMP threads compute; MPI is called by one thread at a time, the
            // main thread or, during the last backward of a step, the gradient progress thread
            // (train/dist_buckets.c), which falls back to the main thread under FUNNELED
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
                die("MPI_Init_thread failed: check the MPI installation (mpirun --version) and the launcher");
            d->mpi = 1;
        }
        int level;
        MPI_Query_thread(&level);
        d->mpi_serialized = level >= MPI_THREAD_SERIALIZED;
        MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &d->world);
        MPI_Comm local;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local);
        MPI_Comm_rank(local, &d->local_rank);
        MPI_Comm_size(local, &d->local_world);
        MPI_Comm_free(&local);
    }
#endif
    // started as one of several ranks (mpirun of a build without MPI, srun without --mpi=pmix)
    // but alone in its world: it would do the whole job alone, once per rank
    const char *var = NULL;
    const int launched = dist_launched_ranks(&var);
    if (launched > 1 && d->world == 1)
        die("this process is one of %d ranks (%s) but no MPI world joins them: each would do the whole job alone; use a clla "
            "built with MPI (docs/DISTRIBUTED.md) under mpirun, or srun --mpi=pmix", launched, var);
    if (d->world > 1) d->scratch = xmalloc((size_t)d->world * DIST_PIECE * sizeof(float));
    if (timeout_s > 0 && d->world > 1) {
        DistWatchdog *w = xcalloc(1, sizeof(*w));
        w->timeout_ms = (long long)(timeout_s * 1000.0);
        w->rank = d->rank;
        w->world = d->world;
        atomic_init(&w->entered_ms, 0);
        atomic_init(&w->stop, 0);
        if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0) die("cannot start the collective watchdog thread");
        d->watchdog = w;
    }
}

void dist_finalize(Dist *d) {
#ifdef DIST_NCCL
    // before MPI_Finalize: NCCL's bootstrap may still hold sockets to the other ranks
    nccl_comm_destroy(d->nccl);
#endif
    d->nccl = NULL;
    if (d->watchdog) {
        atomic_store(&d->watchdog->stop, 1);
        pthread_join(d->watchdog->thread, NULL);
        free(d->watchdog);
        d->watchdog = NULL;
    }
    free(d->scratch);
    d->scratch = NULL;
#ifdef CLLA_HAVE_MPI
    if (d->mpi) MPI_Finalize();
#endif
    d->mpi = 0;
}

void dist_abort(Dist *d, int code) {
    fflush(stdout);
    fflush(stderr);
#ifdef CLLA_HAVE_MPI
    if (d->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)d;
    exit(code);
}

const char *dist_describe(const Dist *d, char *buf, size_t len) {
    if (d->world == 1) snprintf(buf, len, "single process");
    else snprintf(buf, len, "rank %d/%d (local %d/%d)", d->rank, d->world, d->local_rank, d->local_world);
    return buf;
}

size_t dist_shard_size(size_t n, int world, size_t align) {
    size_t s = (n + (size_t)world - 1) / (size_t)world;
    if (align > 1) s = (s + align - 1) / align * align;
    return s ? s : align;
}

// ---------------------------------------------------------------- collectives

enum { TAG_RS = 101 };

// Elements of piece r (r*shard + off, at most len long) that lie below n.
static size_t piece_count(size_t n, size_t shard, int r, size_t off, size_t len) {
    size_t start = (size_t)r * shard + off;
    if (start >= n) return 0;
    return n - start < len ? n - start : len;
}

#ifdef CLLA_HAVE_MPI
static void add_into(float *dst, const float *src, size_t n) {
    #pragma omp parallel for schedule(static) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
#endif

void dist_reduce_scatter_f32(Dist *d, const float *buf, size_t n, size_t shard, float *out) {
    if (d->world == 1) {
        size_t c = n < shard ? n : shard;
        if (out != buf) memcpy(out, buf, c * sizeof(float));
        memset(out + c, 0, (shard - c) * sizeof(float));
        return;
    }
#ifdef CLLA_HAVE_MPI
    double t0;
    dist_enter(d, "reduce-scatter of gradients", &t0);
    const int W = d->world, me = d->rank;
    MPI_Request *req = xmalloc(2 * (size_t)W * sizeof(MPI_Request));
    for (size_t off = 0; off < shard; off += DIST_PIECE) {
        size_t len = shard - off < DIST_PIECE ? shard - off : DIST_PIECE;
        size_t mine = piece_count(n, shard, me, off, len);   // what every rank sends me
        int nr = 0;
        for (int s = 0; s < W; s++) {
            float *dst = d->scratch + (size_t)s * DIST_PIECE;
            if (mine < len) memset(dst + mine, 0, (len - mine) * sizeof(float));
            if (s == me) {
                if (mine) memcpy(dst, buf + (size_t)me * shard + off, mine * sizeof(float));
                continue;
            }
            if (mine) MPI_Irecv(dst, (int)mine, MPI_FLOAT, s, TAG_RS, MPI_COMM_WORLD, &req[nr++]);
            size_t theirs = piece_count(n, shard, s, off, len);
            if (theirs)
                MPI_Isend(buf + (size_t)s * shard + off, (int)theirs, MPI_FLOAT, s, TAG_RS, MPI_COMM_WORLD, &req[nr++]);
        }
        MPI_Waitall(nr, req, MPI_STATUSES_IGNORE);
        // the fixed pairwise tree over rank indices (see dist.h)
        for (int s = 1; s < W; s *= 2)
            for (int j = 0; j + s < W; j += 2 * s)
                add_into(d->scratch + (size_t)j * DIST_PIECE, d->scratch + (size_t)(j + s) * DIST_PIECE, len);
        memcpy(out + off, d->scratch, len * sizeof(float));
    }
    free(req);
    dist_leave(d, t0);
#else
    (void)buf; (void)n; (void)shard; (void)out;
    die("dist: %d ranks without MPI (internal error)", d->world);
#endif
}

void dist_allgather_f32(Dist *d, float *buf, size_t n, size_t shard) {
    if (d->world == 1) return;
#ifdef CLLA_HAVE_MPI
    if ((size_t)d->world * shard > (size_t)2147483647)
        die("all-gather of %zu elements: more than MPI's int counts allow (2^31 - 1); this model is too large for the MPI path", (size_t)d->world * shard);
    double t0;
    dist_enter(d, "all-gather of parameters", &t0);
    int *cnt = xmalloc((size_t)d->world * sizeof(int)), *dsp = xmalloc((size_t)d->world * sizeof(int));
    for (int r = 0; r < d->world; r++) {
        cnt[r] = (int)piece_count(n, shard, r, 0, shard);
        dsp[r] = (int)((size_t)r * shard < n ? (size_t)r * shard : n);
    }
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, dsp, MPI_FLOAT, MPI_COMM_WORLD);
    free(cnt);
    free(dsp);
    dist_leave(d, t0);
#else
    (void)buf; (void)n; (void)shard;
#endif
}

void dist_allreduce_sum_f32(Dist *d, float *buf, size_t n) {
    if (d->world == 1) return;
    size_t shard = dist_shard_size(n, d->world, 1);
    float *mine = xmalloc(shard * sizeof(float));
    dist_reduce_scatter_f32(d, buf, n, shard, mine);
    size_t c = piece_count(n, shard, d->rank, 0, shard);
    if (c) memcpy(buf + (size_t)d->rank * shard, mine, c * sizeof(float));
    free(mine);
    dist_allgather_f32(d, buf, n, shard);
}

void dist_allgather_f64(Dist *d, const double *mine, int count, double *all) {
    if (d->world == 1) {
        memcpy(all, mine, (size_t)count * sizeof(double));
        return;
    }
#ifdef CLLA_HAVE_MPI
    double t0;
    dist_enter(d, "all-gather of step statistics", &t0);
    MPI_Allgather(mine, count, MPI_DOUBLE, all, count, MPI_DOUBLE, MPI_COMM_WORLD);
    dist_leave(d, t0);
#endif
}

void dist_allgather_bytes(Dist *d, const void *mine, size_t bytes, void *all) {
    if (d->world == 1) {
        memcpy(all, mine, bytes);
        return;
    }
#ifdef CLLA_HAVE_MPI
    if (bytes > (size_t)2147483647) die("all-gather of %zu bytes per rank exceeds MPI's int counts", bytes);
    double t0;
    dist_enter(d, "all-gather", &t0);
    MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    dist_leave(d, t0);
#endif
}

double dist_sum_f64(Dist *d, double x) {
    if (d->world == 1) return x;
    double *all = xmalloc((size_t)d->world * sizeof(double));
    dist_allgather_f64(d, &x, 1, all);
    double s = 0;
    for (int r = 0; r < d->world; r++) s += all[r];
    free(all);
    return s;
}

int dist_max_int(Dist *d, int x) {
    if (d->world == 1) return x;
    int y = x;
#ifdef CLLA_HAVE_MPI
    double t0;
    dist_enter(d, "agreement on stopping", &t0);
    MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);   // exact for integers
    dist_leave(d, t0);
#endif
    return y;
}

int dist_rank_differing(Dist *d, unsigned long long x) {
    unsigned long long x0 = x;
    dist_bcast(d, &x0, sizeof(x0), 0);
    return dist_max_int(d, x != x0 ? d->rank : 0);
}

void dist_agree_or_die(Dist *d, unsigned long long x, const char *differs_msg) {
    const int r = dist_rank_differing(d, x);
    if (!r) return;
    if (d->rank != 0) exit(1);   // rank 0 says why, once
    die("rank %d %s", r, differs_msg);
}

unsigned long long dist_config_fingerprint(const Config *cfg) {
    cJSON *j = config_to_json(cfg);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) die("out of memory printing a config");
    const unsigned long long h = fnv1a64(text, strlen(text) + 1);
    free(text);
    return h;
}

void dist_bcast(Dist *d, void *buf, size_t bytes, int root) {
    if (d->world == 1) return;
#ifdef CLLA_HAVE_MPI
    double t0;
    dist_enter(d, "broadcast", &t0);
    for (size_t off = 0; off < bytes; off += (size_t)1 << 30) {
        size_t len = bytes - off < ((size_t)1 << 30) ? bytes - off : ((size_t)1 << 30);
        MPI_Bcast((char *)buf + off, (int)len, MPI_BYTE, root, MPI_COMM_WORLD);
    }
    dist_leave(d, t0);
#else
    (void)buf; (void)bytes; (void)root;
#endif
}

void dist_barrier(Dist *d) {
    if (d->world == 1) return;
#ifdef CLLA_HAVE_MPI
    double t0;
    dist_enter(d, "barrier", &t0);
    MPI_Barrier(MPI_COMM_WORLD);
    dist_leave(d, t0);
#endif
}

// ---------------------------------------------------------------- device (CUDA, NCCL)

#ifdef DIST_NCCL
// Rank 0 makes the unique id, MPI carries it to every rank, every rank joins the communicator.
static void open_nccl(Dist *d) {
    if (d->world == 1) return;
    unsigned char id[NCCL_COMM_ID_BYTES] = {0};
    if (d->rank == 0) nccl_comm_unique_id(id);
    dist_bcast(d, id, sizeof(id), 0);
    double t0;
    dist_enter(d, "NCCL communicator set-up (ncclCommInitRank)", &t0);
    d->nccl = nccl_comm_init(id, d->rank, d->world);
    dist_leave(d, t0);
}
#endif

void dist_select_device(const Dist *d, const struct Backend *be) {
#ifdef CLLA_HAVE_CUDA
    // before the first allocation: a CUDA context lands on whichever device is current
    if (be == backend_cuda()) cuda_select_device(d->local_rank);
#else
    (void)d; (void)be;
#endif
}

void dist_attach_device(Dist *d, const struct Backend *be) {
#if defined(CLLA_NCCL_EMULATION) && defined(DIST_NCCL)
    if (be == backend_cpu_bf16()) open_nccl(d);
#elif defined(CLLA_HAVE_CUDA)
    if (be != backend_cuda()) return;
    dist_select_device(d, be);
#ifdef DIST_NCCL
    open_nccl(d);
#endif
#else
    (void)d; (void)be;
#endif
}

int dist_has_device_collectives(const Dist *d) { return d->nccl != NULL; }

#ifndef DIST_NCCL
// Without NCCL grad_sync never calls these (dist_has_device_collectives is 0).
static void no_device_collectives(const char *what) __attribute__((noreturn));
static void no_device_collectives(const char *what) {
    die("dist: %s on device buffers needs NCCL, which this build lacks (internal error)", what);
}
#endif

void dist_reduce_scatter_dev_f32(Dist *d, float *buf, size_t shard) {
#ifdef DIST_NCCL
    if (d->world == 1) return;
    double t0;
    dist_enter(d, "NCCL reduce-scatter of gradients", &t0);
    nccl_comm_reduce_scatter_f32(d->nccl, buf, shard, 0);
    dist_leave(d, t0);
#else
    (void)d; (void)buf; (void)shard;
    no_device_collectives("reduce-scatter");
#endif
}

void dist_allgather_dev_f32(Dist *d, float *buf, size_t shard, size_t rounds) {
#ifdef DIST_NCCL
    if (d->world == 1) return;
    double t0;
    dist_enter(d, "NCCL all-gather of parameters", &t0);
    nccl_comm_allgather_f32(d->nccl, buf, shard, rounds);
    dist_leave(d, t0);
#else
    (void)d; (void)buf; (void)shard; (void)rounds;
    no_device_collectives("all-gather");
#endif
}

void dist_allreduce_sum_dev_f32(Dist *d, float *buf, size_t n) {
#ifdef DIST_NCCL
    if (d->world == 1) return;
    double t0;
    dist_enter(d, "NCCL all-reduce of gradients", &t0);
    nccl_comm_allreduce_f32(d->nccl, buf, n, 0);
    dist_leave(d, t0);
#else
    (void)d; (void)buf; (void)n;
    no_device_collectives("all-reduce");
#endif
}
