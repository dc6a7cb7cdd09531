// Checkpoint directories: atomic save, validation, newest-complete lookup, pruning and
// exact restore (train/checkpoint.h, docs/CHECKPOINTS.md).
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/num.h"
#include "common/unfinished.h"
#include "common/util.h"
#include "data/bytes.h"
#include "model/safetensors.h"

#define STATE_FILE "state.json"
#define CONFIG_FILE "config.json"
#define MODEL_FILE "model.safetensors"
// state.json is a few hundred bytes; anything far larger is not ours.
#define STATE_MAX_BYTES (1u << 20)


static void optimizer_file_name(char *buf, size_t len, int rank) {
    snprintf(buf, len, "optimizer.rank%d.safetensors", rank);
}

// ---------------------------------------------------------------- directory helpers

// "step_00000123" -> 123; -1 for any other name (temporaries, stray files).
static long parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5;
    if (!*p) return -1;
    long v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000000L) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

// Test hook (tests/test_checkpoint.sh): CLLA_TEST_CKPT_PAUSE_MS sleeps after each file of a
// save, so a test can kill the process while the temporary directory is half-written.
static void test_pause(void) {
    const char *s = getenv("CLLA_TEST_CKPT_PAUSE_MS");
    int64_t ms = 0;
    if (s && num_parse_i64(s, 0, 3600000, &ms) != NUM_OK) ms = 0;
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// Size and FNV-1a 64 of a file (streamed).
static int hash_file(const char *path, uint64_t *hash, uint64_t *bytes, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail_with(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    unsigned char *buf = xmalloc(1 << 16);
    uint64_t h = FNV64_OFFSET, n = 0;
    size_t got;
    while ((got = fread(buf, 1, 1 << 16, f)) > 0) {
        h = fnv1a64_update(h, buf, got);
        n += got;
    }
    int bad = ferror(f);
    free(buf);
    fclose(f);
    if (bad) return fail_with(err, errlen, "reading '%s' failed", path);
    *hash = h;
    *bytes = n;
    return 0;
}

static int write_text(const char *path, const char *text, char *err, size_t errlen) {
    AtomicFile af;
    if (atomic_open(&af, path, OUT_REPLACE) != 0) return fail_with(err, errlen, "cannot create '%s': %s", path, strerror(errno));
    if (fputs(text, af.f) < 0 || fputc('\n', af.f) == EOF) {
        int e = errno;
        atomic_abort(&af);
        return fail_with(err, errlen, "writing '%s' failed: %s", path, strerror(e));
    }
    if (atomic_commit(&af) != 0) return fail_with(err, errlen, "writing '%s' failed: %s", path, strerror(errno));
    return 0;
}

// ---------------------------------------------------------------- tensors

// Writes the fp32 buffer `dev` (backend memory laid out like model->params) as one
// safetensors file; tensor names get `suffix` appended (".exp_avg" for optimizer moments).
// Two buffers at once (n_bufs 2) for m and v in the same file.
static int save_tables(Model *model, const char *path, float *const *bufs, const char *const *suffixes, int n_bufs,
                       const char *metadata, char *err, size_t errlen) {
    const TensorTable *tt = &model->params;
    int n = tt->n * n_bufs;
    const float **host = xcalloc((size_t)n_bufs, sizeof(float *));
    float **copies = xcalloc((size_t)n_bufs, sizeof(float *));
    StTensor *st = xcalloc((size_t)n, sizeof(StTensor));
    char (*names)[TENSOR_NAME_MAX + 32] = xcalloc((size_t)n, sizeof(*names));
    // host memory is written from where it lies: a copy of each table (the model, and m and v
    // at once) would be memory the training plan does not count, taken at every save
    for (int b = 0; b < n_bufs; b++) {
        host[b] = model_table_on_host(model, bufs[b], &copies[b]);
        for (int i = 0; i < tt->n; i++) {
            StTensor *s = &st[b * tt->n + i];
            snprintf(names[b * tt->n + i], sizeof(names[0]), "%s%s", tt->t[i].name, suffixes[b]);
            s->name = names[b * tt->n + i];
            s->ndim = tt->t[i].ndim;
            for (int d = 0; d < s->ndim; d++) s->shape[d] = tt->t[i].shape[d];
            s->data = (const float *)((const char *)host[b] + tt->t[i].off_f32);
        }
    }
    int rc = st_save(path, OUT_REPLACE, st, n, ST_F32, metadata, err, errlen);
    for (int b = 0; b < n_bufs; b++) free(copies[b]);
    free(copies);
    free(host);
    free(st);
    free(names);
    return rc;
}

// Reads the tensors named <table name><suffix> (F32, the table's shape; the file holds
// tables_in_file such tables and nothing else) into a host buffer laid out like the fp32 table
// (padding left as it is: zeros). Dies with one line naming the file on any mismatch.
static void load_table_host(Model *model, StFile *sf, const char *path, int tables_in_file, float *host, const char *suffix) {
    const TensorTable *tt = &model->params;
    if (sf->n != tt->n * tables_in_file)
        die("checkpoint file '%s' holds %d tensors, this model needs %d: the file belongs to another model", path, sf->n,
            tt->n * tables_in_file);
    char name[TENSOR_NAME_MAX + 32], err[512];
    for (int i = 0; i < tt->n; i++) {
        const TensorInfo *ti = &tt->t[i];
        snprintf(name, sizeof(name), "%s%s", ti->name, suffix);
        int j = st_find(sf, name);
        if (j < 0) die("checkpoint file '%s': tensor '%s' is missing: the file belongs to another model", path, name);
        const StEntry *e = &sf->e[j];
        int same = e->ndim == ti->ndim && e->dtype == ST_F32;
        for (int d = 0; same && d < ti->ndim; d++) same = e->shape[d] == ti->shape[d];
        if (!same) die("checkpoint file '%s': tensor '%s' is not F32 of the model's shape: the file belongs to another model", path, name);
        if (st_read_f32(sf, j, (float *)((char *)host + ti->off_f32), err, sizeof(err)) != 0)
            die("checkpoint file '%s': %s", path, err);
    }
}

// ---------------------------------------------------------------- state.json

static cJSON *u64_string(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    return cJSON_CreateString(buf);
}

static cJSON *build_state(const Config *cfg, const AdamW *opt, const TrainState *st, int world, int zero) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "clla-checkpoint");
    cJSON_AddNumberToObject(o, "version", CKPT_STATE_VERSION);
    cJSON_AddNumberToObject(o, "step", st->step);
    cJSON_AddNumberToObject(o, "tokens", (double)st->tokens);
    cJSON *sc = cJSON_AddObjectToObject(o, "schedule");
    cJSON_AddNumberToObject(sc, "position", st->step);
    cJSON_AddNumberToObject(sc, "next_lr", lr_at(&cfg->train, st->step));
    cJSON_AddNumberToObject(sc, "warmup_steps", cfg->train.warmup_steps);
    cJSON_AddNumberToObject(sc, "max_steps", cfg->train.max_steps);
    cJSON *op = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddStringToObject(op, "type", "adamw");
    cJSON_AddNumberToObject(op, "t", opt->t);
    // ranks of the run and whether each wrote its own shard (optimizer.rank<r> for r < world)
    cJSON_AddNumberToObject(op, "world", world);
    cJSON_AddNumberToObject(op, "zero_stage", zero);
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    // the only randomness of a run: init and data order from train.seed; bf16 weight
    // rounding from adamw_store_seed(seed, t). No generator carries state between steps.
    cJSON_AddItemToObject(rng, "seed", u64_string(st->seed));
    cJSON_AddItemToObject(rng, "store_weights_seed", u64_string(adamw_store_seed(st->seed, opt->t)));
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    cJSON *tr = cJSON_AddObjectToObject(data, "train");
    cJSON_AddItemToObject(tr, "epoch", u64_string(st->data.epoch));
    cJSON_AddItemToObject(tr, "position", u64_string(st->data.position));
    cJSON_AddItemToObject(tr, "fingerprint", u64_string(st->data.fingerprint));
    cJSON *sk = cJSON_AddObjectToObject(o, "skips");
    cJSON_AddNumberToObject(sk, "consecutive", st->consecutive_skips);
    cJSON_AddNumberToObject(sk, "total", (double)st->skipped_total);
    cJSON_AddObjectToObject(o, "files");
    return o;
}

static const cJSON *need(const cJSON *obj, const char *key, const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v) fail_with(err, errlen, "'%s': field '%s' is missing", path, key);
    return v;
}

static int get_int(const cJSON *obj, const char *key, long long lo, long long hi, long long *out, const char *path,
                   char *err, size_t errlen) {
    const cJSON *v = need(obj, key, path, err, errlen);
    if (!v) return -1;
    // the range first: converting a double outside long long's (1e300, inf) is undefined
    const double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(x >= (double)lo && x <= (double)hi) || x != floor(x))
        return fail_with(err, errlen, "'%s': field '%s' must be a whole number in [%lld, %lld]", path, key, lo, hi);
    *out = (long long)x;
    return 0;
}

// 64-bit values are decimal strings: a JSON number (a double) cannot hold them exactly.
static int get_u64(const cJSON *obj, const char *key, uint64_t *out, const char *path, char *err, size_t errlen) {
    const cJSON *v = need(obj, key, path, err, errlen);
    if (!v) return -1;
    const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
    uint64_t x = 0;
    if (!s || num_parse_u64(s, UINT64_MAX, &x) != NUM_OK)
        return fail_with(err, errlen, "'%s': field '%s' must be a decimal string of a 64-bit unsigned number", path, key);
    *out = x;
    return 0;
}

static const char *const REQUIRED_FILES[] = {CONFIG_FILE, MODEL_FILE};

// Parses and checks state.json of dir; fills st and *t. Returns the parsed root (caller
// frees) or NULL with err.
static cJSON *read_state(const char *dir, TrainState *st, int *t, char *err, size_t errlen) {
    char *path = path_join(dir, STATE_FILE);
    size_t len = 0;
    struct stat sb;
    char *text = NULL;
    if (stat(path, &sb) != 0) {
        fail_with(err, errlen, "'%s': %s (not a checkpoint directory?)", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode) || sb.st_size > STATE_MAX_BYTES) {
        fail_with(err, errlen, "'%s' is not a state file of at most %u bytes", path, STATE_MAX_BYTES);
    } else if (!(text = read_file(path, &len))) {
        fail_with(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    }
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    if (text && !cJSON_IsObject(root)) fail_with(err, errlen, "'%s' is not a JSON object (damaged state file)", path);
    free(text);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); free(path); return NULL; }
    long long step, version, tokens, topt, world, cons, total, zero = 0;
    uint64_t epoch, position, fingerprint, seed;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *op, *rng, *data, *tr, *sk, *files;
    int rc = -1;
    memset(st, 0, sizeof(*st));
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "clla-checkpoint") != 0) {
        fail_with(err, errlen, "'%s': format is not \"clla-checkpoint\"", path);
    } else if (get_int(root, "version", 0, 1000000, &version, path, err, errlen) != 0) {
        // err names the field
    } else if (version != CKPT_STATE_VERSION) {
        fail_with(err, errlen, "'%s': state version %lld, this build reads version %d: resume with the clla that wrote it", path, version, CKPT_STATE_VERSION);
    } else if (get_int(root, "step", 0, 2147483647LL, &step, path, err, errlen) != 0 ||
               get_int(root, "tokens", 0, 1LL << 53, &tokens, path, err, errlen) != 0 ||
               !(op = need(root, "optimizer", path, err, errlen)) ||
               get_int(op, "t", 0, 2147483647LL, &topt, path, err, errlen) != 0 ||
               get_int(op, "world", 1, 1 << 20, &world, path, err, errlen) != 0 ||
               (cJSON_GetObjectItemCaseSensitive(op, "zero_stage") &&
                get_int(op, "zero_stage", 0, 1, &zero, path, err, errlen) != 0) ||
               !(rng = need(root, "rng", path, err, errlen)) ||
               get_u64(rng, "seed", &seed, path, err, errlen) != 0 ||
               !(data = need(root, "data", path, err, errlen)) || !(tr = need(data, "train", path, err, errlen)) ||
               get_u64(tr, "epoch", &epoch, path, err, errlen) != 0 ||
               get_u64(tr, "position", &position, path, err, errlen) != 0 ||
               get_u64(tr, "fingerprint", &fingerprint, path, err, errlen) != 0 ||
               !(sk = need(root, "skips", path, err, errlen)) ||
               get_int(sk, "consecutive", 0, 2147483647LL, &cons, path, err, errlen) != 0 ||
               get_int(sk, "total", 0, 2147483647LL, &total, path, err, errlen) != 0 ||
               !(files = need(root, "files", path, err, errlen))) {
        // err names the field
    } else if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(op, "type")) ||
               strcmp(cJSON_GetObjectItemCaseSensitive(op, "type")->valuestring, "adamw") != 0) {
        fail_with(err, errlen, "'%s': optimizer.type is not \"adamw\", the only optimizer this build trains with (damaged state file)", path);
    } else if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "schedule"))) {
        // informational (the schedule is recomputed from the config at the step), but part of a whole file
        fail_with(err, errlen, "'%s': field 'schedule' is missing or not an object (damaged state file)", path);
    } else if (topt + total != step || cons > total) {
        fail_with(err, errlen, "'%s': optimizer.t = %lld and %lld skipped steps (%lld in a row) do not make step %lld (damaged state file)", path, topt, total, cons, step);
    } else if (!cJSON_IsObject(files)) {
        fail_with(err, errlen, "'%s': field 'files' must be an object", path);
    } else {
        st->step = (int)step;
        st->tokens = tokens;
        st->consecutive_skips = (int)cons;
        st->skipped_total = total;
        st->seed = seed;
        st->data.epoch = epoch;
        st->data.position = position;
        st->data.fingerprint = fingerprint;
        st->saved_world = (int)world;
        st->saved_zero = (int)zero;
        *t = (int)topt;
        rc = 0;
    }
    free(path);
    if (rc) { cJSON_Delete(root); return NULL; }
    return root;
}

// ---------------------------------------------------------------- save

// A ZeRO-1 shard: m and v of the rank's elements of the flat fp32 layout as two 1-D tensors. A
// contiguous piece: elements [lo, hi). Stripes (model/shard.h): `stripe` elements from lo into
// every round of `period`, packed round after round (the rounds' stripes past numel as zeros);
// lo and hi are then the first round's elements, so that a clla from before the stripes, which
// reads [lo, hi) only, finds a tensor of another length and refuses the file, or, with one round,
// reads it right.
// The flat layout (table offsets, padding included) is a function of the model config, which
// resume requires to be unchanged, so these locate the elements exactly.
static int save_shard(Model *model, const AdamW *opt, const char *path, int rank, int world, char *err, size_t errlen) {
    const size_t n = model->params.bytes_f32 / 4;
    const int striped = !shard_is_contiguous(&opt->sh);
    size_t lo, hi, off;
    shard_range(&opt->sh, 0, &lo, &hi, &off);
    const size_t len = striped ? shard_count(&opt->sh) : hi - lo;
    float *hm = xmalloc((len ? len : 1) * sizeof(float)), *hv = xmalloc((len ? len : 1) * sizeof(float));
    if (len) {
        model->be->download(hm, opt->m, len * sizeof(float));
        model->be->download(hv, opt->v, len * sizeof(float));
    }
    StTensor t[2] = {{.name = "exp_avg", .ndim = 1, .shape = {(int64_t)len}, .data = hm},
                     {.name = "exp_avg_sq", .ndim = 1, .shape = {(int64_t)len}, .data = hv}};
    char meta[400], stripes[128] = "";
    if (striped) snprintf(stripes, sizeof(stripes), ",\"stripe\":\"%zu\",\"period\":\"%zu\"", opt->sh.stripe, opt->sh.period);
    snprintf(meta, sizeof(meta),
             "{\"format\":\"clla-adamw-zero1\",\"layout\":\"joined\",\"t\":\"%d\",\"rank\":\"%d\",\"world\":\"%d\",\"lo\":\"%zu\",\"hi\":\"%zu\",\"numel\":\"%zu\"%s}",
             opt->t, rank, world, lo, hi, n, stripes);
    int rc = st_save(path, OUT_REPLACE, t, len ? 2 : 0, ST_F32, meta, err, errlen);   // an empty shard: metadata only
    free(hm);
    free(hv);
    return rc;
}

// What a rank reports after writing its optimizer file; gathered on every rank.
typedef struct RankReport {
    int ok, wrote;
    uint64_t bytes, hash;
    char err[480];
} RankReport;

// Rank 0's verdict on a phase of the save, broadcast so that every rank returns the same.
typedef struct SaveStatus {
    int ok;
    char msg[1536];   // the error, or the final directory
} SaveStatus;

static void share_status(Dist *dist, SaveStatus *s) {
    if (dist && dist->world > 1) dist_bcast(dist, s, sizeof(*s), 0);
}

int ckpt_save(const char *run_dir, const Config *cfg, Model *model, const float *masters, const AdamW *opt,
              const TrainState *st, Dist *dist, char *out, size_t outlen, char *err, size_t errlen) {
    const int rank = dist ? dist->rank : 0, world = dist ? dist->world : 1;
    // a sharded optimizer (ZeRO-1 over several ranks) is written by every rank
    const int sharded = !shard_is_all(&opt->sh);
    char *base = path_join(run_dir, CKPT_SUBDIR);
    char name[64], tmpname[96];
    snprintf(name, sizeof(name), "step_%08d", st->step);
    // every rank writes into rank 0's temporary directory, named with rank 0's pid
    long pid = (long)getpid();
    if (dist && world > 1) dist_bcast(dist, &pid, sizeof(pid), 0);
    snprintf(tmpname, sizeof(tmpname), ".tmp.%s.%ld", name, pid);
    char *final = path_join(base, name), *tmp = path_join(base, tmpname);
    int n_files = 2 + (sharded ? world : 1);
    char (*files)[64] = xcalloc((size_t)n_files, sizeof(*files));
    snprintf(files[0], sizeof(files[0]), "%s", CONFIG_FILE);
    snprintf(files[1], sizeof(files[1]), "%s", MODEL_FILE);
    for (int r = 0; r < n_files - 2; r++) optimizer_file_name(files[2 + r], sizeof(files[0]), r);
    int rc = -1, tmp_slot = -1;
    cJSON *state = NULL;
    char *text = NULL, *p = NULL;
    RankReport mine, *reports = xcalloc((size_t)world, sizeof(RankReport));
    SaveStatus status = {.ok = 1};
    memset(&mine, 0, sizeof(mine));

    // ---- rank 0: the temporary directory, config and model
    if (rank == 0) {
        status.ok = 0;
        if (make_dirs(base) != 0) { fail_with(status.msg, sizeof(status.msg), "cannot create '%s': %s", base, strerror(errno)); goto phase1; }
        // the first save creates checkpoints/ itself: make that name durable too
        if (fsync_dir(run_dir) != 0) { fail_with(status.msg, sizeof(status.msg), "cannot flush '%s': %s", run_dir, strerror(errno)); goto phase1; }
        remove_tree(tmp);   // a stale one of an earlier process that had our pid
        if (mkdir(tmp, 0755) != 0) { fail_with(status.msg, sizeof(status.msg), "cannot create '%s': %s", tmp, strerror(errno)); goto phase1; }
        // removed if the process ends before the rename, by any signal too (a second Ctrl-C, a
        // SIGHUP): train's own handlers only ask for a stop after the step
        tmp_slot = unfinished_add(tmp, UNFINISHED_DIR);

        cJSON *cj = config_to_json(cfg);
        text = cJSON_Print(cj);
        cJSON_Delete(cj);
        p = path_join(tmp, CONFIG_FILE);
        if (write_text(p, text, status.msg, sizeof(status.msg)) != 0) goto phase1;
        free(p); p = NULL;
        free(text); text = NULL;
        test_pause();

        p = path_join(tmp, MODEL_FILE);
        float *mbuf[1] = {(float *)masters};
        const char *msuf[1] = {""};
        if (save_tables(model, p, mbuf, msuf, 1, "{\"format\":\"pt\",\"producer\":\"clla\"}", status.msg, sizeof(status.msg)) != 0)
            goto phase1;
        free(p); p = NULL;
        test_pause();
        status.ok = 1;
    }
phase1:
    free(p); p = NULL;
    free(text); text = NULL;
    share_status(dist, &status);
    if (!status.ok) { fail_with(err, errlen, "%s", status.msg); goto done; }

    // ---- the optimizer: one file of the whole model (rank 0), or one shard per rank
    mine.ok = 1;
    if (sharded || rank == 0) {
        char opt_name[64];
        optimizer_file_name(opt_name, sizeof(opt_name), sharded ? rank : 0);
        p = path_join(tmp, opt_name);
        if (sharded) {
            mine.ok = save_shard(model, opt, p, rank, world, mine.err, sizeof(mine.err)) == 0;
        } else {
            // Moments of every parameter under "<name>.exp_avg" / "<name>.exp_avg_sq".
            char meta[200];
            snprintf(meta, sizeof(meta), "{\"format\":\"clla-adamw\",\"t\":\"%d\",\"rank\":\"0\",\"world\":\"%d\"}", opt->t, world);
            float *obuf[2] = {opt->m, opt->v};
            const char *osuf[2] = {".exp_avg", ".exp_avg_sq"};
            mine.ok = save_tables(model, p, obuf, osuf, 2, meta, mine.err, sizeof(mine.err)) == 0;
        }
        if (mine.ok) mine.ok = hash_file(p, &mine.hash, &mine.bytes, mine.err, sizeof(mine.err)) == 0;
        mine.wrote = mine.ok;
        free(p); p = NULL;
        test_pause();
    }
    if (dist && world > 1) dist_allgather_bytes(dist, &mine, sizeof(mine), reports);
    else reports[0] = mine;

    // ---- rank 0: state.json (with every file's checksum) and the rename
    if (rank == 0) {
        status.ok = 0;
        for (int r = 0; r < world; r++)
            if (!reports[r].ok) {
                if (world > 1) snprintf(status.msg, sizeof(status.msg), "rank %d: %s", r, reports[r].err);
                else snprintf(status.msg, sizeof(status.msg), "%s", reports[r].err);
                goto phase2;
            }
        state = build_state(cfg, opt, st, world, sharded);
        cJSON *fl = cJSON_GetObjectItemCaseSensitive(state, "files");
        for (int i = 0; i < n_files; i++) {
            uint64_t h, n;
            if (i >= 2) {   // optimizer files: hashed by their writers
                const RankReport *rr = &reports[sharded ? i - 2 : 0];
                h = rr->hash;
                n = rr->bytes;
            } else {
                p = path_join(tmp, files[i]);
                if (hash_file(p, &h, &n, status.msg, sizeof(status.msg)) != 0) goto phase2;
                free(p); p = NULL;
            }
            char hex[24];
            snprintf(hex, sizeof(hex), "%016" PRIx64, h);
            cJSON *e = cJSON_AddObjectToObject(fl, files[i]);
            cJSON_AddNumberToObject(e, "bytes", (double)n);
            cJSON_AddStringToObject(e, "fnv1a64", hex);
        }
        text = cJSON_Print(state);
        p = path_join(tmp, STATE_FILE);
        if (write_text(p, text, status.msg, sizeof(status.msg)) != 0) goto phase2;
        free(p); p = NULL;
        if (fsync_dir(tmp) != 0) { fail_with(status.msg, sizeof(status.msg), "cannot flush '%s': %s", tmp, strerror(errno)); goto phase2; }
        test_pause();

        // A checkpoint of the same step from an earlier attempt (resumed from an older one) is
        // replaced: moved aside first, so one complete step_* directory exists at every moment.
        struct stat sb;
        char *old = NULL;
        if (stat(final, &sb) == 0) {
            char oldname[96];
            snprintf(oldname, sizeof(oldname), ".old.%s.%ld", name, (long)getpid());
            old = path_join(base, oldname);
            remove_tree(old);
            if (rename(final, old) != 0) {
                fail_with(status.msg, sizeof(status.msg), "cannot move the existing '%s' aside: %s", final, strerror(errno));
                free(old);
                goto phase2;
            }
        }
        if (rename(tmp, final) != 0) {
            fail_with(status.msg, sizeof(status.msg), "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
            if (old) rename(old, final);
            free(old);
            goto phase2;
        }
        unfinished_done(tmp_slot);
        tmp_slot = -1;
        if (old) { remove_tree(old); free(old); }
        if (fsync_dir(base) != 0) {
            // renamed into place already (a resume may take it), but not known to be on the disk
            fail_with(status.msg, sizeof(status.msg), "'%s' is in place, but flushing '%s' failed: %s: it may not outlive a power loss",
                      final, base, strerror(errno));
            goto phase2;
        }
        snprintf(status.msg, sizeof(status.msg), "%s", final);
        status.ok = 1;
    }
phase2:
    share_status(dist, &status);
    if (!status.ok) { fail_with(err, errlen, "%s", status.msg); goto done; }
    snprintf(out, outlen, "%s", rank == 0 ? final : status.msg);
    rc = 0;
done:
    if (rc != 0 && rank == 0) remove_tree(tmp);
    unfinished_done(tmp_slot);
    cJSON_Delete(state);
    free(text);
    free(p);
    free(tmp);
    free(final);
    free(base);
    free(files);
    free(reports);
    return rc;
}

// ---------------------------------------------------------------- find, prune, validate

typedef struct StepDir { long step; char *name; } StepDir;

static int cmp_step(const void *a, const void *b) {
    long x = ((const StepDir *)a)->step, y = ((const StepDir *)b)->step;
    return x < y ? -1 : x > y;
}

// The step_* directories of run_dir/checkpoints, ascending. *n = 0 when there are none.
static StepDir *list_steps(const char *run_dir, int *n) {
    char *base = path_join(run_dir, CKPT_SUBDIR);
    DIR *d = opendir(base);
    StepDir *v = NULL;
    int cap = 0;
    *n = 0;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            long s = parse_step_name(de->d_name);
            if (s < 0) continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                v = realloc(v, (size_t)cap * sizeof(StepDir));
                if (!v) die("out of memory listing '%s'", base);
            }
            v[*n].step = s;
            v[*n].name = path_join(base, de->d_name);
            (*n)++;
        }
        closedir(d);
    }
    free(base);
    if (*n > 1) qsort(v, (size_t)*n, sizeof(StepDir), cmp_step);
    return v;
}

static void free_steps(StepDir *v, int n) {
    for (int i = 0; i < n; i++) free(v[i].name);
    free(v);
}

int ckpt_validate(const char *dir, char *err, size_t errlen) {
    TrainState st;
    int t;
    cJSON *root = read_state(dir, &st, &t, err, errlen);
    if (!root) return -1;
    const char *slash = strrchr(dir, '/');
    long named = parse_step_name(slash ? slash + 1 : dir);
    int rc = 0;
    if (named >= 0 && named != st.step)
        rc = fail_with(err, errlen, "'%s/%s' says step %d but the directory is named for step %ld (damaged or renamed checkpoint)", dir, STATE_FILE, st.step, named);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    for (size_t i = 0; !rc && i < sizeof(REQUIRED_FILES) / sizeof(REQUIRED_FILES[0]); i++)
        if (!cJSON_GetObjectItemCaseSensitive(files, REQUIRED_FILES[i]))
            rc = fail_with(err, errlen, "'%s/%s' lists no '%s' (damaged state file)", dir, STATE_FILE, REQUIRED_FILES[i]);
    // one optimizer file, or one per rank when the ranks saved ZeRO-1 shards
    for (int r = 0; !rc && r < (st.saved_zero ? st.saved_world : 1); r++) {
        char opt_name[64];
        optimizer_file_name(opt_name, sizeof(opt_name), r);
        if (!cJSON_GetObjectItemCaseSensitive(files, opt_name))
            rc = fail_with(err, errlen, "'%s/%s' lists no '%s' (damaged state file)", dir, STATE_FILE, opt_name);
    }
    for (const cJSON *f = files->child; !rc && f; f = f->next) {
        // only plain names: a forged state file must not make us read outside the directory
        if (!f->string || !f->string[0] || strchr(f->string, '/') || !strcmp(f->string, "..") || !strcmp(f->string, ".")) {
            rc = fail_with(err, errlen, "'%s/%s': file name '%s' is not a plain name", dir, STATE_FILE, f->string ? f->string : "");
            break;
        }
        char sub[80];
        snprintf(sub, sizeof(sub), "files.%s", f->string);
        long long bytes;
        uint64_t h, n;
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(f, "fnv1a64");
        if (get_int(f, "bytes", 0, 1LL << 53, &bytes, sub, err, errlen) != 0) { rc = -1; break; }
        if (!cJSON_IsString(hx) || strlen(hx->valuestring) != 16) {
            rc = fail_with(err, errlen, "'%s/%s': %s.fnv1a64 must be 16 hex digits", dir, STATE_FILE, sub);
            break;
        }
        char *p = path_join(dir, f->string);
        if (hash_file(p, &h, &n, err, errlen) != 0) { rc = -1; free(p); break; }
        char hex[24];
        snprintf(hex, sizeof(hex), "%016" PRIx64, h);
        if ((long long)n != bytes)
            rc = fail_with(err, errlen, "'%s' has %" PRIu64 " bytes, the checkpoint recorded %lld (truncated or damaged)", p, n, bytes);
        else if (strcmp(hex, hx->valuestring) != 0)
            rc = fail_with(err, errlen, "'%s' does not match its checksum in %s (damaged)", p, STATE_FILE);
        free(p);
    }
    cJSON_Delete(root);
    return rc;
}

int ckpt_find_newest(const char *run_dir, char *path, size_t pathlen, char *err, size_t errlen) {
    int n;
    StepDir *v = list_steps(run_dir, &n);
    int rc = n ? -2 : -1;
    char why[1024], newest[1200] = "";
    for (int i = n - 1; i >= 0 && rc; i--) {
        if (ckpt_validate(v[i].name, why, sizeof(why)) == 0) {
            if ((size_t)snprintf(path, pathlen, "%s", v[i].name) >= pathlen)
                die("checkpoint path '%s' is longer than %zu bytes: use a shorter run directory", v[i].name, pathlen - 1);
            rc = 0;
        } else {
            if (!newest[0]) snprintf(newest, sizeof(newest), "%s", why);
            warn("skipping checkpoint '%s': %s", v[i].name, why);
        }
    }
    if (rc == -2)
        fail_with(err, errlen, "every checkpoint in %s/%s is damaged (%d: the newest, %s)", run_dir, CKPT_SUBDIR, n, newest);
    free_steps(v, n);
    return rc;
}

int ckpt_abandon_after(const char *run_dir, int step, const char *const *extra, char *moved_to, size_t moved_len,
                       char *err, size_t errlen) {
    int n;
    StepDir *v = list_steps(run_dir, &n);
    int todo = 0;
    for (int i = 0; i < n; i++) todo += v[i].step > step;
    struct stat sb;
    // the extra files (a final model) belong to the abandoned timeline only when it went further
    for (int i = 0; todo && extra && extra[i]; i++) todo += stat(extra[i], &sb) == 0;
    int rc = 0;
    if (todo) {
        char name[64], *base = path_join(run_dir, CKPT_SUBDIR);
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(name, sizeof(name), "abandoned-%Y%m%dT%H%M%SZ", &tm);
        // a directory of its own: a second abandon within the same second (two resumes from an
        // early step, one after the other) takes the next free suffix, where sharing the first's
        // directory had failed on a step both timelines saved, or replaced the first's final model
        char *dst = path_join(base, name);
        for (int k = 2; mkdir(dst, 0777) != 0; k++) {
            if (errno != EEXIST || k > 1000) {
                rc = fail_with(err, errlen, "cannot create '%s': %s", dst, strerror(errno));
                break;
            }
            free(dst);
            char numbered[80];
            snprintf(numbered, sizeof(numbered), "%s-%d", name, k);
            dst = path_join(base, numbered);
        }
        for (int i = 0; !rc && i < n; i++) {
            if (v[i].step <= step) continue;
            const char *leaf = strrchr(v[i].name, '/');
            char *to = path_join(dst, leaf ? leaf + 1 : v[i].name);
            if (rename(v[i].name, to) != 0) rc = fail_with(err, errlen, "cannot move '%s' to '%s': %s", v[i].name, to, strerror(errno));
            free(to);
        }
        for (int i = 0; !rc && extra && extra[i]; i++) {
            if (stat(extra[i], &sb) != 0) continue;
            const char *leaf = strrchr(extra[i], '/');
            char *to = path_join(dst, leaf ? leaf + 1 : extra[i]);
            if (rename(extra[i], to) != 0) rc = fail_with(err, errlen, "cannot move '%s' to '%s': %s", extra[i], to, strerror(errno));
            free(to);
        }
        // the moves made durable before the resumed run writes its own steps in their place
        if (!rc && (fsync_dir(dst) != 0 || fsync_dir(base) != 0 || fsync_dir(run_dir) != 0))
            rc = fail_with(err, errlen, "moved the abandoned steps to '%s', but flushing it failed: %s", dst, strerror(errno));
        if (!rc) snprintf(moved_to, moved_len, "%s", dst);
        free(dst);
        free(base);
    }
    free_steps(v, n);
    return rc ? -1 : todo;
}

// Is the writer of ".tmp.step_N.<pid>" gone? Our own pid counts as gone: this process is
// not saving while it prunes, so such a directory is from an earlier process with our pid.
static int writer_gone(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot || !dot[1]) return 1;
    int64_t pid = 0;
    if (num_parse_i64(dot + 1, 1, INT32_MAX, &pid) != NUM_OK) return 1;
    if (pid <= 0 || pid == (long)getpid()) return 1;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int ckpt_prune(const char *run_dir, int keep, char *err, size_t errlen) {
    int removed = 0;
    char *base = path_join(run_dir, CKPT_SUBDIR);
    DIR *d = opendir(base);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (strncmp(de->d_name, ".tmp.step_", 10) != 0 && strncmp(de->d_name, ".old.step_", 10) != 0) continue;
            if (!writer_gone(de->d_name)) continue;
            char *p = path_join(base, de->d_name);
            if (remove_tree(p) == 0) removed++;
            free(p);
        }
        closedir(d);
    }
    free(base);
    if (keep <= 0) return removed;
    int n;
    StepDir *v = list_steps(run_dir, &n);
    int rc = 0;
    for (int i = 0; i < n - keep; i++) {
        if (remove_tree(v[i].name) != 0) { rc = fail_with(err, errlen, "cannot remove old checkpoint '%s': %s", v[i].name, strerror(errno)); break; }
        removed++;
    }
    free_steps(v, n);
    return rc ? -1 : removed;
}

// ---------------------------------------------------------------- resume

void ckpt_read_config(const char *dir, Config *saved) {
    char *p = path_join(dir, CONFIG_FILE);
    config_load(saved, p, 0, NULL);
    free(p);
}

static char *json_text(const cJSON *v) { return v ? cJSON_PrintUnformatted(v) : xstrdup("(absent)"); }

// Two path strings that name the same existing file or directory ("a/../b" and "b", a link and
// its target): not a change of the setting.
static int same_existing_path(const cJSON *x, const cJSON *y) {
    if (!cJSON_IsString(x) || !cJSON_IsString(y) || !x->valuestring[0] || !y->valuestring[0]) return 0;
    char a[PATH_MAX], b[PATH_MAX];
    return realpath(x->valuestring, a) && realpath(y->valuestring, b) && !strcmp(a, b);
}

int ckpt_compare_config(const Config *saved, const Config *cur, const char *dir) {
    cJSON *a = config_to_json(saved), *b = config_to_json(cur);
    for (const cJSON *x = b->child; x; x = x->next) {
        if (!strcmp(x->string, "train")) continue;
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(a, x->string);
        if (y && cJSON_Compare(x, y, 1)) continue;
        char *was = json_text(y), *now = json_text(x);
        die("cannot resume from '%s': it was trained with %s = %s and this run asks for %s = %s; the model's shape cannot change on resume (drop the override, or start a new run directory with --out)",
            dir, x->string, was, x->string, now);
    }
    int changed = 0;
    const cJSON *ta = cJSON_GetObjectItemCaseSensitive(a, "train"), *tb = cJSON_GetObjectItemCaseSensitive(b, "train");
    for (const cJSON *x = tb ? tb->child : NULL; x; x = x->next) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(ta, x->string);
        if (y && (cJSON_Compare(x, y, 1) || same_existing_path(x, y))) continue;
        char *was = json_text(y), *now = json_text(x);
        fprintf(stderr, "clla: resume: train.%s changed from %s (checkpoint) to %s; the new value applies from here on\n",
                x->string, was, now);
        free(was);
        free(now);
        changed++;
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    return changed;
}

// Unsigned decimal metadata value of an optimizer file (they are strings in safetensors).
static unsigned long long meta_u64(const cJSON *meta, const char *key, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    uint64_t x = 0;
    if (!cJSON_IsString(v) || num_parse_u64(v->valuestring, UINT64_MAX, &x) != NUM_OK)
        die("cannot resume: '%s': metadata '%s' is missing or not a whole number (damaged optimizer file)", path, key);
    return x;
}

// A ZeRO-1 shard written before the tensor table joined up_proj to gate_proj (no "layout" key in
// its metadata) padded every tensor to 256 bytes; its flat offsets are this model's only when no
// joined tensor moved, that is when every tensor before one ends on a 256-byte boundary.
static int joined_moved(const TensorTable *tt) {
    for (int i = 1; i < tt->n; i++)
        if (tt->t[i].joined && tt->t[i - 1].numel * 4 % 256) return 1;
    return 0;
}

// Opens an optimizer file of the checkpoint and checks that it belongs to update t.
static cJSON *open_optimizer_file(StFile *sf, const char *op, int t) {
    char err[1024];
    if (st_open(sf, op, err, sizeof(err)) != 0) die("cannot resume: '%s': %s", op, err);
    cJSON *meta = sf->metadata_json ? cJSON_Parse(sf->metadata_json) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(meta, "t");
    char tbuf[32];
    snprintf(tbuf, sizeof(tbuf), "%d", t);
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, tbuf) != 0)
        die("cannot resume: '%s' is for optimizer step %s, state.json says %d (mixed-up checkpoint files)", op,
            cJSON_IsString(mt) ? mt->valuestring : "(none)", t);
    return meta;
}

// An element range [a, b) of the flat layout.
typedef struct Range {
    size_t a, b;
} Range;

static int range_cmp(const void *x, const void *y) {
    const Range *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

void ckpt_identity(const char *dir, CkptId *id) {
    struct stat sb;
    if (stat(dir, &sb) != 0) die("cannot resume from '%s': %s", dir, strerror(errno));
    *id = (CkptId){(unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino};
}

void ckpt_check_same(const char *dir, const CkptId *id) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || (unsigned long long)sb.st_dev != id->dev || (unsigned long long)sb.st_ino != id->ino)
        die("cannot resume: '%s' was replaced while it was read (another process resumed this run from an earlier step, or "
            "pruned it): what was read may mix two checkpoints; run the command again",
            dir);
}

void ckpt_load(const char *dir, Model *model, AdamW *opt, TrainState *st) {
    char err[1024];
    if (ckpt_validate(dir, err, sizeof(err)) != 0) die("cannot resume: %s", err);
    int t;
    cJSON *root = read_state(dir, st, &t, err, sizeof(err));
    if (!root) die("cannot resume: %s", err);
    cJSON_Delete(root);

    // One whole fp32 table on the host at a time (a 1B model's is 4 GB, on every rank): the
    // masters, set (model_set_masters takes this rank's part) and freed; then each moment.
    char *mp = path_join(dir, MODEL_FILE);
    StFile sf;
    if (st_open(&sf, mp, err, sizeof(err)) != 0) die("cannot resume: '%s': %s", mp, err);
    float *hw = xcalloc(model->params.bytes_f32, 1);
    load_table_host(model, &sf, mp, 1, hw, "");
    st_close(&sf);
    free(mp);
    // the storage copy exactly as adamw_step left it after update t
    model_set_masters(model, hw, adamw_store_seed(st->seed, t));
    free(hw);

    // Each moment of the whole flat layout on the host, from one file or from every rank's
    // shard, then this optimizer's range of it: any number of ranks resumes any other.
    const TensorTable *tt = &model->params;
    const size_t n = tt->bytes_f32 / 4;
    const char *names[2] = {"exp_avg", "exp_avg_sq"}, *suffixes[2] = {".exp_avg", ".exp_avg_sq"};
    float *dst[2] = {opt->m, opt->v};
    for (int b = 0; b < 2; b++) {
        float *whole = xcalloc(n ? n : 1, sizeof(float));
        // ZeRO-1: the ranges every rank's shard holds, which must tile [0, n) (checked below)
        Range *held = NULL;
        size_t n_held = 0, cap_held = 0;
        for (int r = 0; r < (st->saved_zero ? st->saved_world : 1); r++) {
            char opt_name[64];
            optimizer_file_name(opt_name, sizeof(opt_name), r);
            char *op = path_join(dir, opt_name);
            cJSON *meta = open_optimizer_file(&sf, op, t);
            if (!st->saved_zero) {
                load_table_host(model, &sf, op, 2, whole, suffixes[b]);
            } else {
                if (!cJSON_GetObjectItemCaseSensitive(meta, "layout") && joined_moved(tt))
                    die("cannot resume: '%s' is a ZeRO-1 shard written before gate_proj and up_proj were laid out as one matrix, and its "
                        "flat offsets are not this model's: resume with the clla that wrote it, or start from its weights with "
                        "--set train.init_from=%s/model.safetensors",
                        op, dir);
                unsigned long long lo = meta_u64(meta, "lo", op), hi = meta_u64(meta, "hi", op), numel = meta_u64(meta, "numel", op);
                // stripes (model/shard.h), or the contiguous [lo, hi) as one round
                const int striped = cJSON_GetObjectItemCaseSensitive(meta, "period") != NULL;
                if (numel != n || (!striped && (lo > hi || hi > n)))
                    die("cannot resume: '%s' holds elements [%llu, %llu) of %llu, this model has %zu: the file belongs to another model",
                        op, lo, hi, numel, n);
                Shard sh = {lo, hi - lo, n ? n : 1, n};
                if (striped) {
                    sh.stripe = meta_u64(meta, "stripe", op);
                    sh.period = meta_u64(meta, "period", op);
                    if (sh.stripe == 0 || sh.period < sh.stripe || lo > sh.period - sh.stripe || shard_rounds(&sh) > SIZE_MAX / sizeof(float) / sh.stripe)
                        die("cannot resume: '%s': stripes of %zu elements from %llu every %zu do not fit (damaged optimizer file)", op,
                            sh.stripe, lo, sh.period);
                }
                if (meta_u64(meta, "rank", op) != (unsigned long long)r || meta_u64(meta, "world", op) != (unsigned long long)st->saved_world)
                    die("cannot resume: '%s' says it is rank %llu of %llu, the checkpoint's state.json says rank %d of %d (damaged or mixed-up optimizer files)",
                        op, meta_u64(meta, "rank", op), meta_u64(meta, "world", op), r, st->saved_world);
                for (size_t k = 0; k < shard_rounds(&sh); k++) {
                    size_t a, e, off;
                    shard_range(&sh, k, &a, &e, &off);
                    if (e <= a) continue;
                    if (n_held == cap_held) {
                        cap_held = cap_held ? 2 * cap_held : 64;
                        held = realloc(held, cap_held * sizeof(*held));
                        if (!held) die("out of memory reading '%s'", op);
                    }
                    held[n_held++] = (Range){a, e};
                }
                const size_t len = striped ? shard_count(&sh) : hi - lo;
                if (len) {
                    float *packed = xmalloc(len * sizeof(float));
                    int j = st_find(&sf, names[b]);
                    if (j < 0 || sf.e[j].dtype != ST_F32 || sf.e[j].ndim != 1 || sf.e[j].shape[0] != (int64_t)len)
                        die("cannot resume: '%s': tensor '%s' is missing or not F32 [%zu] (damaged optimizer file)", op, names[b], len);
                    if (st_read_f32(&sf, j, packed, err, sizeof(err)) != 0) die("cannot resume: '%s': %s", op, err);
                    shard_unpack(&sh, whole, packed);
                    free(packed);
                }
            }
            cJSON_Delete(meta);
            st_close(&sf);
            free(op);
        }
        if (st->saved_zero) {
            // every element's moments from exactly one rank: a gap would resume with zero moments,
            // an overlap with one rank's values over another's
            qsort(held, n_held, sizeof(*held), range_cmp);
            size_t next = 0;
            for (size_t i = 0; i < n_held && next <= n; i++) {
                if (held[i].a != next)
                    die("cannot resume: the ZeRO-1 optimizer shards of '%s' %s elements from %zu of the %zu: damaged or mixed-up optimizer files",
                        dir, held[i].a > next ? "miss" : "repeat", next, n);
                next = held[i].b;
            }
            if (next != n)
                die("cannot resume: the ZeRO-1 optimizer shards of '%s' miss elements from %zu of the %zu: damaged or mixed-up optimizer files",
                    dir, next, n);
        }
        free(held);
        shard_copy(&opt->sh, model->be->upload, dst[b], whole, 1);   // this optimizer's elements of the whole
        free(whole);
    }
    opt->t = t;
}
