// Shuffled, rank-partitioned, resumable batches from token shards, with a prefetch thread.
//
// Windows: in a shard of n tokens, window k covers tokens [k*T, k*T + T] (T+1 tokens;
// consecutive windows share one token), for k*T + T < n. A window belongs to the chunk
// holding its first token and may run into the next chunk.
// Epoch order (depends only on seed, epoch and the data): the chunks that own windows are
// permuted; consecutive runs of MIX_CHUNKS chunks form groups; the windows of a group are
// permuted together. The epoch uses the first floor(W / (B*world)) * B*world windows
// of that order, W being the number of windows.
// Global batch g = windows [g*B*world, (g+1)*B*world) of the epoch order; rank r takes
// the B windows starting at g*B*world + r*B. So the global batch is the same set of
// windows for any split of B*world into ranks, and ranks never overlap.
// State = (epoch, position of the next global batch), so resume is exact.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "data/bytes.h"
#include "data/loader_internal.h"
#include "data/shard.h"

#define MIX_CHUNKS 8     // chunks whose windows are shuffled together
#define PREFETCH_DEPTH 4 // batches decoded ahead of the trainer

typedef struct ChunkRef {
    uint32_t shard, chunk;
    uint64_t first_window;  // window index k (within its shard) of the chunk's first window
    uint32_t n_windows;
} ChunkRef;

typedef struct WindowRef {
    uint32_t shard;
    uint64_t k;
} WindowRef;

typedef struct CachedChunk {
    uint32_t shard, chunk;
    uint32_t *data;
    uint64_t last_use;
    int valid;
} CachedChunk;

// Everything the prefetch thread owns.
typedef struct Producer {
    uint64_t epoch, position;
    uint64_t plan_epoch;    // epoch the plan below was built for, when have_plan
    int have_plan;          // a flag, not a marker epoch: a checkpoint may hold any epoch
    uint32_t *perm;         // chunk order of the epoch
    uint64_t *group_start;  // first epoch position of each group, plus the total at the end
    uint32_t n_groups;
    uint32_t cur_group;     // group whose windows are in `windows` (UINT32_MAX: none)
    WindowRef *windows;
    CachedChunk cache[2 * MIX_CHUNKS + 2];
    uint64_t use_clock;
    ShardReadBuf *rb;
    char err[512];          // why the last batch could not be made (a damaged chunk)
} Producer;

struct ShardLoader {
    Shard *shards;
    int n_shards;
    ChunkRef *chunks;
    uint32_t n_chunks;
    uint64_t n_windows, per_epoch, gb, seed, fingerprint;
    uint64_t fingerprint_counts;   // the fingerprint of checkpoints before 2026-11-28 (no content)
    uint32_t max_chunk_tokens;
    int B, T, rank;

    uint64_t epoch, position;  // consumer's state: the next batch loader_next returns

    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop;
    uint64_t produced, consumed;
    int failed;     // the producer hit a damaged chunk: batches after `produced` never come
    int32_t *ring;  // PREFETCH_DEPTH slots of B * (T+1) tokens
    Producer pr;
};

// ---------------------------------------------------------------- epoch plan

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ULL;
    return mix64(*s);
}

static void build_plan(ShardLoader *sl, uint64_t epoch) {
    Producer *pr = &sl->pr;
    uint64_t rng = mix64(sl->seed ^ mix64(epoch + 1));
    for (uint32_t i = 0; i < sl->n_chunks; i++) pr->perm[i] = i;
    for (uint32_t i = sl->n_chunks; i > 1; i--) {
        uint32_t j = (uint32_t)(rng_next(&rng) % i);
        uint32_t t = pr->perm[i - 1];
        pr->perm[i - 1] = pr->perm[j];
        pr->perm[j] = t;
    }
    uint64_t at = 0;
    for (uint32_t g = 0; g < pr->n_groups; g++) {
        pr->group_start[g] = at;
        for (uint32_t i = g * MIX_CHUNKS; i < sl->n_chunks && i < (g + 1) * MIX_CHUNKS; i++)
            at += sl->chunks[pr->perm[i]].n_windows;
    }
    pr->group_start[pr->n_groups] = at;
    pr->plan_epoch = epoch;
    pr->have_plan = 1;
    pr->cur_group = UINT32_MAX;
}

static void load_group(ShardLoader *sl, uint32_t g) {
    Producer *pr = &sl->pr;
    uint64_t n = 0;
    for (uint32_t i = g * MIX_CHUNKS; i < sl->n_chunks && i < (g + 1) * MIX_CHUNKS; i++) {
        const ChunkRef *c = &sl->chunks[pr->perm[i]];
        for (uint32_t w = 0; w < c->n_windows; w++) pr->windows[n++] = (WindowRef){c->shard, c->first_window + w};
    }
    uint64_t rng = mix64(sl->seed ^ mix64(pr->plan_epoch + 1) ^ mix64(0x5eedull + g));
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rng_next(&rng) % i;
        WindowRef t = pr->windows[i - 1];
        pr->windows[i - 1] = pr->windows[j];
        pr->windows[j] = t;
    }
    pr->cur_group = g;
}

// ---------------------------------------------------------------- decoded chunk cache

// NULL with pr->err set when the chunk is damaged (the consumer reports it: the trainer saves
// its state first, so this must not die on the prefetch thread).
static const uint32_t *get_chunk(ShardLoader *sl, uint32_t shard, uint32_t chunk) {
    Producer *pr = &sl->pr;
    CachedChunk *slot = NULL;
    int n_slots = (int)(sizeof(pr->cache) / sizeof(pr->cache[0]));
    for (int i = 0; i < n_slots; i++) {
        CachedChunk *c = &pr->cache[i];
        if (c->valid && c->shard == shard && c->chunk == chunk) {
            c->last_use = ++pr->use_clock;
            return c->data;
        }
        if (!slot || !c->valid || (slot->valid && c->last_use < slot->last_use)) slot = c;
    }
    const Shard *s = &sl->shards[shard];
    if (!slot->data) slot->data = xmalloc((size_t)sl->max_chunk_tokens * sizeof(uint32_t));
    slot->valid = 0;
    if (shard_read_chunk(s, chunk, pr->rb, slot->data, pr->err, sizeof(pr->err)) != 0) return NULL;
    slot->valid = 1;
    slot->shard = shard;
    slot->chunk = chunk;
    slot->last_use = ++pr->use_clock;
    return slot->data;
}

// Copies tokens [k*T, k*T + T] of the window's shard into dst.
static int copy_window(ShardLoader *sl, WindowRef w, int32_t *dst) {
    const Shard *s = &sl->shards[w.shard];
    uint64_t pos = w.k * (uint64_t)sl->T, left = (uint64_t)sl->T + 1;
    // Binary search for the chunk holding pos.
    uint32_t lo = 0, hi = s->n_chunks - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (s->chunks[mid].first_token <= pos) lo = mid;
        else hi = mid - 1;
    }
    for (uint32_t c = lo; left > 0; c++) {
        const uint32_t *data = get_chunk(sl, w.shard, c);
        if (!data) return -1;
        const ShardChunk *ch = &s->chunks[c];
        uint64_t off = pos - ch->first_token, take = ch->n_tokens - off;
        if (take > left) take = left;
        for (uint64_t i = 0; i < take; i++) *dst++ = (int32_t)data[off + i];
        pos += take;
        left -= take;
    }
    return 0;
}

static int produce_batch(ShardLoader *sl, int32_t *slot) {
    Producer *pr = &sl->pr;
    if (!pr->have_plan || pr->plan_epoch != pr->epoch) build_plan(sl, pr->epoch);
    for (int b = 0; b < sl->B; b++) {
        uint64_t p = pr->position + (uint64_t)sl->rank * sl->B + (uint64_t)b;
        uint32_t g = pr->cur_group;
        if (g == UINT32_MAX || p < pr->group_start[g] || p >= pr->group_start[g + 1]) {
            uint32_t lo = 0, hi = pr->n_groups - 1;
            while (lo < hi) {
                uint32_t mid = (lo + hi + 1) / 2;
                if (pr->group_start[mid] <= p) lo = mid;
                else hi = mid - 1;
            }
            load_group(sl, lo);
            g = lo;
        }
        if (copy_window(sl, pr->windows[p - pr->group_start[g]], slot + (size_t)b * (sl->T + 1)) != 0) return -1;
    }
    pr->position += sl->gb;
    if (pr->position >= sl->per_epoch) {
        pr->position = 0;
        pr->epoch++;
    }
    return 0;
}

static void *prefetch_main(void *arg) {
    ShardLoader *sl = arg;
    size_t slot_len = (size_t)sl->B * (sl->T + 1);
    for (;;) {
        pthread_mutex_lock(&sl->mu);
        while (!sl->stop && sl->produced - sl->consumed == PREFETCH_DEPTH) pthread_cond_wait(&sl->cv, &sl->mu);
        int stop = sl->stop;
        uint64_t slot = sl->produced % PREFETCH_DEPTH;
        pthread_mutex_unlock(&sl->mu);
        if (stop) break;
        int bad = produce_batch(sl, sl->ring + slot * slot_len) != 0;
        pthread_mutex_lock(&sl->mu);
        if (bad) sl->failed = 1;
        else sl->produced++;
        pthread_cond_broadcast(&sl->cv);
        pthread_mutex_unlock(&sl->mu);
        if (bad) break;
    }
    return NULL;
}

static void start_thread(ShardLoader *sl) {
    sl->stop = 0;
    sl->failed = 0;
    sl->produced = sl->consumed = 0;
    sl->pr.epoch = sl->epoch;
    sl->pr.position = sl->position;
    if (pthread_create(&sl->thread, NULL, prefetch_main, sl) != 0) die("cannot start the data prefetch thread");
    sl->running = 1;
}

static void stop_thread(ShardLoader *sl) {
    if (!sl->running) return;
    pthread_mutex_lock(&sl->mu);
    sl->stop = 1;
    pthread_cond_broadcast(&sl->cv);
    pthread_mutex_unlock(&sl->mu);
    pthread_join(sl->thread, NULL);
    sl->running = 0;
}

// ---------------------------------------------------------------- interface

ShardLoader *shards_open(char **paths, int n_paths, const LoaderOptions *opt) {
    ShardLoader *sl = xcalloc(1, sizeof(*sl));
    sl->B = opt->B;
    sl->T = opt->T;
    sl->rank = opt->rank;
    sl->gb = (uint64_t)opt->B * (uint64_t)opt->world;
    sl->seed = opt->seed;
    sl->n_shards = n_paths;
    sl->shards = xcalloc((size_t)n_paths, sizeof(Shard));
    char err[512];
    uint64_t fp = fnv1a64_update(FNV64_OFFSET, &sl->gb, sizeof(sl->gb));
    fp = fnv1a64_update(fp, &sl->seed, sizeof(sl->seed));
    fp = fnv1a64_update(fp, &sl->T, sizeof(sl->T));
    uint64_t total_chunks = 0;
    for (int i = 0; i < n_paths; i++) {
        Shard *s = &sl->shards[i];
        if (shard_open(s, paths[i], err, sizeof(err)) != 0) die("%s", err);
        if (s->vocab_size > (uint32_t)opt->vocab_size)
            die("shard '%s' was made with a vocabulary of %u tokens (header offset 24) but the model has vocab_size %d: raise vocab_size or use matching shards",
                paths[i], s->vocab_size, opt->vocab_size);
        if (opt->tokenizer_hash && s->tokenizer_hash != opt->tokenizer_hash)
            die("shard '%s' was made with another tokenizer (hash %016llx at offset 32, expected %016llx): re-run clla prep with this tokenizer or use its shards",
                paths[i], (unsigned long long)s->tokenizer_hash, opt->tokenizer_hash);
        if (i > 0 && s->tokenizer_hash != sl->shards[0].tokenizer_hash)
            die("shards '%s' and '%s' were made with different tokenizers (hash at offset 32): keep one tokenizer's shards per directory",
                paths[0], paths[i]);
        total_chunks += s->n_chunks;
        if (s->chunk_tokens > sl->max_chunk_tokens) sl->max_chunk_tokens = s->chunk_tokens;
        fp = fnv1a64_update(fp, &s->n_tokens, sizeof(s->n_tokens));
        fp = fnv1a64_update(fp, &s->tokenizer_hash, sizeof(s->tokenizer_hash));
    }
    sl->fingerprint_counts = fp;
    // the content too: every chunk's place, size and checksum (from the shards' indexes, no
    // data read), so that data prepared again with the same token counts (other documents, their
    // order, another chunk size) does not take a position meant for the old windows
    for (int i = 0; i < n_paths; i++)
        for (uint32_t c = 0; c < sl->shards[i].n_chunks; c++) {
            const ShardChunk *ch = &sl->shards[i].chunks[c];
            const uint64_t f[3] = {ch->first_token, (uint64_t)ch->n_tokens, ch->checksum};
            fp = fnv1a64_update(fp, f, sizeof(f));
        }
    sl->fingerprint = fp;
    sl->chunks = xcalloc(total_chunks ? total_chunks : 1, sizeof(ChunkRef));
    uint64_t T = (uint64_t)opt->T;
    for (int i = 0; i < n_paths; i++) {
        const Shard *s = &sl->shards[i];
        uint64_t kmax = s->n_tokens > T ? (s->n_tokens - 1) / T : 0;  // windows k < kmax
        for (uint32_t c = 0; c < s->n_chunks; c++) {
            const ShardChunk *ch = &s->chunks[c];
            uint64_t k0 = (ch->first_token + T - 1) / T, k1 = (ch->first_token + ch->n_tokens + T - 1) / T;
            if (k1 > kmax) k1 = kmax;
            if (k1 <= k0) continue;
            sl->chunks[sl->n_chunks++] = (ChunkRef){(uint32_t)i, c, k0, (uint32_t)(k1 - k0)};
            sl->n_windows += k1 - k0;
        }
    }
    sl->per_epoch = sl->n_windows / sl->gb * sl->gb;
    if (sl->per_epoch == 0)
        die("data '%s'%s holds %llu windows of T+1 = %d tokens, fewer than one global batch of %llu sequences (the rows a step reads): use more data, a smaller batch (train.global_batch_tokens or train.micro_batch when training, --batch in the other commands) or a shorter sequence",
            paths[0], n_paths > 1 ? " (and the other shards)" : "", (unsigned long long)sl->n_windows, opt->T + 1,
            (unsigned long long)sl->gb);
    Producer *pr = &sl->pr;
    pr->n_groups = (sl->n_chunks + MIX_CHUNKS - 1) / MIX_CHUNKS;
    pr->perm = xmalloc((size_t)sl->n_chunks * sizeof(uint32_t));
    pr->group_start = xmalloc(((size_t)pr->n_groups + 1) * sizeof(uint64_t));
    uint64_t max_group = 0;
    // Any MIX_CHUNKS chunks can form a group: size the window list for the largest ones.
    {
        uint32_t top[MIX_CHUNKS] = {0};
        for (uint32_t i = 0; i < sl->n_chunks; i++) {
            uint32_t w = sl->chunks[i].n_windows;
            for (int j = 0; j < MIX_CHUNKS; j++)
                if (w > top[j]) { uint32_t t = top[j]; top[j] = w; w = t; }
        }
        for (int j = 0; j < MIX_CHUNKS; j++) max_group += top[j];
    }
    pr->windows = xmalloc(max_group * sizeof(WindowRef));
    pr->have_plan = 0;
    pr->cur_group = UINT32_MAX;
    pr->rb = shard_readbuf_new();
    sl->ring = xmalloc((size_t)PREFETCH_DEPTH * sl->B * (sl->T + 1) * sizeof(int32_t));
    pthread_mutex_init(&sl->mu, NULL);
    pthread_cond_init(&sl->cv, NULL);
    start_thread(sl);
    return sl;
}

int shards_next(ShardLoader *sl, int32_t *inputs, int32_t *targets, char *err, size_t errlen) {
    size_t slot_len = (size_t)sl->B * (sl->T + 1);
    pthread_mutex_lock(&sl->mu);
    while (sl->produced == sl->consumed && !sl->failed) pthread_cond_wait(&sl->cv, &sl->mu);
    if (sl->produced == sl->consumed) {   // failed, and every good batch before it was consumed
        pthread_mutex_unlock(&sl->mu);
        snprintf(err, errlen, "%s", sl->pr.err);
        return -1;
    }
    const int32_t *w = sl->ring + (sl->consumed % PREFETCH_DEPTH) * slot_len;
    pthread_mutex_unlock(&sl->mu);
    for (int b = 0; b < sl->B; b++) {
        const int32_t *row = w + (size_t)b * (sl->T + 1);
        memcpy(inputs + (size_t)b * sl->T, row, (size_t)sl->T * sizeof(int32_t));
        memcpy(targets + (size_t)b * sl->T, row + 1, (size_t)sl->T * sizeof(int32_t));
    }
    pthread_mutex_lock(&sl->mu);
    sl->consumed++;
    pthread_cond_broadcast(&sl->cv);
    pthread_mutex_unlock(&sl->mu);
    sl->position += sl->gb;
    if (sl->position >= sl->per_epoch) {
        sl->position = 0;
        sl->epoch++;
    }
    return 0;
}

long long shards_num_batches(const ShardLoader *sl) { return (long long)(sl->per_epoch / sl->gb); }

unsigned long long shards_tokenizer_hash(const ShardLoader *sl) { return sl->shards[0].tokenizer_hash; }

void shards_get_state(const ShardLoader *sl, LoaderState *st) {
    st->epoch = sl->epoch;
    st->position = sl->position;
    st->fingerprint = sl->fingerprint;
}

void shards_set_state(ShardLoader *sl, const LoaderState *st) {
    if (st->fingerprint == sl->fingerprint_counts && st->fingerprint != sl->fingerprint)
        warn("shards '%s'...: the checkpoint's data fingerprint is of token counts only (written before 2026-11-28): "
             "they match, the content could not be compared",
             sl->shards[0].path);
    else if (st->fingerprint != sl->fingerprint)
        die("shards '%s'...: the saved data position belongs to other data, seed, T or global batch (B*world = %llu): resume with the same data and settings",
            sl->shards[0].path, (unsigned long long)sl->gb);
    if (st->position >= sl->per_epoch || st->position % sl->gb)
        die("shards '%s'...: saved data position %llu is not a global batch start below %llu: the checkpoint's state is damaged",
            sl->shards[0].path, st->position, (unsigned long long)sl->per_epoch);
    stop_thread(sl);
    sl->epoch = st->epoch;
    sl->position = st->position;
    start_thread(sl);
}

void shards_close(ShardLoader *sl) {
    if (!sl) return;
    stop_thread(sl);
    pthread_mutex_destroy(&sl->mu);
    pthread_cond_destroy(&sl->cv);
    for (size_t i = 0; i < sizeof(sl->pr.cache) / sizeof(sl->pr.cache[0]); i++) free(sl->pr.cache[i].data);
    shard_readbuf_free(sl->pr.rb);
    free(sl->pr.perm); free(sl->pr.group_start); free(sl->pr.windows);
    for (int i = 0; i < sl->n_shards; i++) shard_close(&sl->shards[i]);
    free(sl->shards); free(sl->chunks); free(sl->ring);
    free(sl);
}
