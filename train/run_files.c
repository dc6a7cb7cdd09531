#include "train/run_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/unfinished.h"
#include "common/util.h"
#include "model/safetensors.h"

char *run_metrics_path(const char *dir, const char *metrics_path) {
    return metrics_path && metrics_path[0] ? xstrdup(metrics_path) : path_join(dir, "metrics.jsonl");
}

static int exists_in(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    struct stat sb;
    int e = stat(p, &sb) == 0;
    free(p);
    return e;
}

void run_dir_inspect(const char *dir, const char *metrics_path, RunDirContents *c) {
    memset(c, 0, sizeof(*c));
    c->model = exists_in(dir, "model.safetensors") || exists_in(dir, "model.safetensors.index.json");
    c->config = exists_in(dir, "config.json");
    // a run writes config.json with its final model (run_files_save_model), clla init with its
    // initial one: a config.json alone is a file of the user's (the config this run reads, say)
    c->foreign_config = c->config && !c->model;
    char *mp = run_metrics_path(dir, metrics_path), *dflt = path_join(dir, "metrics.jsonl");
    struct stat sb;
    // the metrics file is rewritten by a rename on resume: a link or a device there would be
    // replaced by a plain file
    c->metrics_not_plain = lstat(mp, &sb) == 0 && !S_ISREG(sb.st_mode);
    c->metrics = stat(mp, &sb) == 0 && sb.st_size > 0;
    if (c->metrics && strcmp(mp, dflt)) {
        // train.metrics outside the run directory: a run's metrics file starts with its first
        // step record (run_files_open writes it), anything else is the user's own file
        char head[8] = "";
        FILE *f = fopen(mp, "rb");
        const size_t got = f ? fread(head, 1, sizeof(head), f) : 0;
        if (f) fclose(f);
        c->foreign_metrics = got < sizeof(head) || memcmp(head, "{\"step\":", sizeof(head)) != 0;
    }
    if (strcmp(mp, dflt)) snprintf(c->metrics_elsewhere, sizeof(c->metrics_elsewhere), "%s", mp);
    free(dflt);
    free(mp);
    char *cp = path_join(dir, "checkpoints");
    DIR *d = opendir(cp);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) c->checkpoints++;
        closedir(d);
    }
    free(cp);
}

void run_dir_refuse_foreign(const RunDirContents *c, const char *dir, const char *metrics_path) {
    if (c->metrics_not_plain) {
        char *mp = run_metrics_path(dir, metrics_path);
        die("the metrics file '%s' is a symbolic link or not a regular file (a device, a FIFO), which a resume would replace by a plain file: point train.metrics at a regular file",
            mp);
    }
    // never taken for a run's output, not even with --overwrite: the user's file stays as it is
    if (c->foreign_metrics)
        die("train.metrics: '%s' holds a file that no run wrote (it does not start with a step record): point train.metrics at a new file (or leave it unset for %s/metrics.jsonl)",
            c->metrics_elsewhere, dir);
    if (c->foreign_config)
        die("%s/config.json is not a run's (a run writes it beside its final model, and there is none): it is not replaced or removed, not even with --overwrite: keep your config outside --out, or give another --out",
            dir);
}

int run_dir_is_empty(const RunDirContents *c) { return !c->model && !c->config && !c->metrics && !c->checkpoints; }

void run_dir_describe(const RunDirContents *c, char *buf, size_t len) {
    char metrics[600];
    snprintf(metrics, sizeof(metrics), !c->metrics ? "" : c->metrics_elsewhere[0] ? "its metrics file %s, " : "a metrics file, ",
             c->metrics_elsewhere);
    snprintf(buf, len, "%s%s%s", c->model ? "a model, " : "", c->config ? "config.json, " : "", metrics);
    size_t n = strlen(buf);
    if (c->checkpoints) snprintf(buf + n, len - n, "%d entries in checkpoints/", c->checkpoints);
    else if (n >= 2) buf[n - 2] = '\0';
}


// The length of base in "<base><tag><digits>", or 0 when name is not of that form.
static size_t base_before(const char *name, const char *tag) {
    size_t n = strlen(name), d = n, t = strlen(tag);
    while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9') d--;
    if (d == n || d < t + 1 || strncmp(name + d - t, tag, t) != 0) return 0;
    return d - t;
}

// A temporary of a file the run writes in its directory, with the writer's pid: an AtomicFile's
// "<name>.tmp.<pid>" (common/util.h) of the final model, its index or shards, config.json or
// metrics.jsonl, and a sharded save's "<shard>.partial.<pid>" (model/safetensors.c).
static int is_run_temporary(const char *name) {
    char base[256];
    size_t b = base_before(name, ".tmp.");
    if (b) {
        if (b >= sizeof(base)) return 0;
        memcpy(base, name, b);
        base[b] = 0;
        name = base;
        const char *owned[] = {"model.safetensors", "model.safetensors.index.json", "config.json", "metrics.jsonl"};
        for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++)
            if (!strcmp(name, owned[i])) return 1;
        if (st_is_shard_name(name)) return 1;
    }
    size_t p = base_before(name, ".partial.");
    if (!p || p >= sizeof(base)) return 0;
    char shard[256];
    memcpy(shard, name, p);
    shard[p] = 0;
    return st_is_shard_name(shard);
}

int run_dir_remove_temporaries(const char *dir, char *first, size_t first_len) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_run_temporary(de->d_name)) continue;
        char *p = path_join(dir, de->d_name);
        if (unlink(p) == 0 && n++ == 0) snprintf(first, first_len, "%s", de->d_name);
        free(p);
    }
    closedir(d);
    return n;
}

// the files of a run directory that --overwrite replaces (the metrics file and checkpoints/ aside)
static const char *const RUN_MODEL_FILES[] = {"model.safetensors", "model.safetensors.index.json", "config.json"};
#define N_RUN_MODEL_FILES (int)(sizeof(RUN_MODEL_FILES) / sizeof(RUN_MODEL_FILES[0]))

char **run_final_model_files(const char *dir) {
    size_t n = 0, cap = N_RUN_MODEL_FILES + 8;
    char **v = xmalloc(cap * sizeof(char *));
    struct stat sb;
    for (int i = 0; i < N_RUN_MODEL_FILES; i++) {
        char *p = path_join(dir, RUN_MODEL_FILES[i]);
        if (stat(p, &sb) == 0) v[n++] = p;
        else free(p);
    }
    DIR *dd = opendir(dir);
    for (struct dirent *de; dd && (de = readdir(dd));) {
        if (!st_is_shard_name(de->d_name)) continue;
        if (n + 1 >= cap) v = xrealloc(v, (cap *= 2) * sizeof(char *));
        v[n++] = path_join(dir, de->d_name);
    }
    if (dd) closedir(dd);
    v[n] = NULL;
    return v;
}

void run_dir_check_clearable(const char *dir, const char *metrics_path) {
    char *paths[N_RUN_MODEL_FILES + 2];
    paths[0] = run_metrics_path(dir, metrics_path);
    paths[1] = path_join(dir, "checkpoints");
    for (int i = 0; i < N_RUN_MODEL_FILES; i++) paths[2 + i] = path_join(dir, RUN_MODEL_FILES[i]);
    char blocker[1024];
    int rc = 0;
    for (int i = 0; i < N_RUN_MODEL_FILES + 2 && rc == 0; i++) rc = tree_removable(paths[i], blocker, sizeof(blocker));
    for (int i = 0; i < N_RUN_MODEL_FILES + 2; i++) free(paths[i]);
    if (rc != 0)
        die("--overwrite: the earlier run in '%s' cannot be cleared: nothing may be removed from '%s' (permissions or a "
            "read-only file system): make it writable, or give another --out; nothing was changed",
            dir, blocker);
}

void run_dir_clear(const char *dir, const char *metrics_path, int keep_model) {
    run_dir_check_clearable(dir, metrics_path);   // fail before the first removal, not half-way
    for (int i = 0; i < N_RUN_MODEL_FILES && !keep_model; i++) {
        char *p = path_join(dir, RUN_MODEL_FILES[i]);
        if (unlink(p) != 0 && errno != ENOENT) die("--overwrite: cannot remove '%s': %s", p, strerror(errno));
        free(p);
    }
    DIR *dd = keep_model ? NULL : opendir(dir);
    if (dd) {
        struct dirent *de;
        while ((de = readdir(dd)))
            if (st_is_shard_name(de->d_name)) {
                char *p = path_join(dir, de->d_name);
                if (unlink(p) != 0 && errno != ENOENT) die("--overwrite: cannot remove '%s': %s", p, strerror(errno));
                free(p);
            }
        closedir(dd);
    }
    char *mp = run_metrics_path(dir, metrics_path);
    if (unlink(mp) != 0 && errno != ENOENT) die("--overwrite: cannot remove '%s': %s", mp, strerror(errno));
    free(mp);
    char *cp = path_join(dir, "checkpoints");
    // depth first, without following links: a link in checkpoints/ is removed, not its target
    if (remove_tree(cp) != 0) die("--overwrite: cannot remove '%s' (or something in it): %s", cp, strerror(errno));
    free(cp);
}

// ---------------------------------------------------------------- the lock

// The one piece of process state here: an atexit handler takes no argument, and the lock must
// go also when die() ends the process. Set once by run_lock_acquire.
static struct {
    char *path, *dir;
    int fd, created_dir, unfinished_slot;
} held = {NULL, NULL, -1, 0, -1};

static void release_lock(void) {
    if (held.fd < 0) return;
    unfinished_done(held.unfinished_slot);
    // unlink before unlocking: a process that opens the name afterwards gets a new file
    unlink(held.path);
    close(held.fd);
    held.fd = -1;
    if (held.created_dir) rmdir(held.dir);   // fails, as it should, unless the run left it empty
}

void run_lock_acquire(const char *dir) {
    struct stat sb;
    int existed = stat(dir, &sb) == 0;
    if (existed && !S_ISDIR(sb.st_mode))
        die("run directory '%s' is a file, not a directory: give --out a directory (new or a run's)", dir);
    if (make_dirs(dir) != 0) die("cannot create run directory '%s': %s", dir, strerror(errno));
    char *path = path_join(dir, RUN_LOCK_FILE);
    for (int attempt = 0;; attempt++) {
        // the lock is truncated and rewritten below: never through a link to someone's file
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0 && errno == ELOOP)
            die("the lock file '%s' is a symbolic link: a run's lock is a file of its own; remove the link", path);
        if (fd < 0) die("cannot create the lock file '%s': %s", path, strerror(errno));
        struct stat own;
        if (fstat(fd, &own) != 0 || !S_ISREG(own.st_mode) || own.st_nlink > 1) {   // 0: the holder removed it (retried below)
            close(fd);
            die("the lock file '%s' is not a plain file of its own (a directory, a device or a hard link to another "
                "file): remove it", path);
        }
        char text[128] = "";
        ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
        text[got > 0 ? got : 0] = '\0';
        long pid = strtol(text, NULL, 10);
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK) {
                char who[48] = "a process that wrote no pid";
                if (pid > 0) snprintf(who, sizeof(who), "process %ld", pid);
                die("run directory '%s' is in use by another training (%s holds %s): wait for it to end, or train into another --out",
                    dir, who, path);
            }
            die("cannot lock '%s': %s", path, strerror(e));
        }
        // the holder may have removed the name between our open and flock: lock the file the name is now
        struct stat a, b;
        if (fstat(fd, &a) != 0 || lstat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            if (attempt > 100) die("cannot take the lock '%s': it keeps changing", path);
            continue;
        }
        if (pid > 0 && pid != (long)getpid())
            fprintf(stderr, "clla train: taking over the lock %s left by process %ld, which no longer holds it (it ended, or was killed)\n",
                    path, pid);
        // held from here: a failing write below (a full disk) still releases the lock and removes
        // the directory this call created
        held.path = path;
        held.dir = xstrdup(dir);
        held.fd = fd;
        held.created_dir = !existed;
        atexit(release_lock);
        // a signal that ends the process without exit() (SIGHUP, a second Ctrl-C) removes it too
        held.unfinished_slot = unfinished_add(path, UNFINISHED_LOCK);
        if (!existed) unfinished_add(dir, UNFINISHED_EMPTY_DIR);   // and the directory, if that left it empty
        char mine[32];
        int n = snprintf(mine, sizeof(mine), "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, mine, (size_t)n, 0) != n)
            die("cannot write the lock file '%s': %s", path, strerror(errno));
        return;
    }
}

// ---------------------------------------------------------------- metrics and the model

// A training holds its metrics file locked (flock) while it writes it: train.metrics may name
// a file outside the run directory, which the run directory's lock does not cover. Only a lock
// held elsewhere stops a run; a filesystem without flock for this file (EBADF, ENOLCK, ...) is
// left unchecked.
static void metrics_lock(int fd, const char *path) {
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
        die("metrics file '%s' is being written by another training: give this run its own train.metrics, or wait for that run to end", path);
}

void run_metrics_check_free(const char *dir, const char *metrics_path) {
    char *mp = run_metrics_path(dir, metrics_path);
    int fd = open(mp, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        metrics_lock(fd, mp);
        close(fd);   // releases the lock taken to look
    }
    free(mp);
}

static void open_metrics(RunFiles *rf, const char *dir, const char *metrics_path, int truncate) {
    rf->dir = xstrdup(dir);
    rf->metrics_path = run_metrics_path(dir, metrics_path);
    // opened without truncation, locked, then truncated: another training's file is never emptied
    rf->metrics_fd = open(rf->metrics_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (rf->metrics_fd < 0) die("cannot write metrics file '%s': %s", rf->metrics_path, strerror(errno));
    metrics_lock(rf->metrics_fd, rf->metrics_path);
    if (truncate && ftruncate(rf->metrics_fd, 0) != 0) die("cannot truncate metrics file '%s': %s", rf->metrics_path, strerror(errno));
}

void run_files_open(RunFiles *rf, const char *dir, const char *metrics_path) {
    if (make_dirs(dir) != 0) die("cannot create run directory '%s': %s", dir, strerror(errno));
    open_metrics(rf, dir, metrics_path, 1);
}

// The metrics of a resumed run keep the records of the steps up to the checkpoint's: the file is
// opened and locked first, then cut in place after the last such record (records are appended in
// step order; a torn last line, from a kill, goes too). It was rewritten by a rename before the
// lock was taken, so a training that had locked the same train.metrics meanwhile lost its records
// to this one's copy.
void run_files_open_resume(RunFiles *rf, const char *dir, const char *metrics_path, int resumed_step) {
    if (make_dirs(dir) != 0) die("cannot create run directory '%s': %s", dir, strerror(errno));
    rf->dir = xstrdup(dir);
    rf->metrics_path = run_metrics_path(dir, metrics_path);
    const char *mp = rf->metrics_path;
    rf->metrics_fd = open(mp, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (rf->metrics_fd < 0) die("cannot write metrics file '%s': %s", mp, strerror(errno));
    metrics_lock(rf->metrics_fd, mp);
    struct stat sb;
    if (fstat(rf->metrics_fd, &sb) != 0) die("cannot read metrics file '%s': %s", mp, strerror(errno));
    const size_t len = sb.st_size > 0 ? (size_t)sb.st_size : 0;
    char *old = xmalloc(len + 1);
    if (pread_full(rf->metrics_fd, old, len, 0) != 0)
        die("cannot read metrics file '%s': %s", mp, errno ? strerror(errno) : "it shrank while read");
    size_t keep = 0;   // bytes of the records to keep
    for (char *line = old, *next; line < old + len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(old + len - line));
        if (!nl) break;   // a last line without its newline was cut off by a kill
        next = nl + 1;
        cJSON *rec = cJSON_ParseWithLength(line, (size_t)(nl - line));
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(rec, "step");
        const int kept = cJSON_IsNumber(st) && st->valuedouble <= resumed_step;
        cJSON_Delete(rec);
        if (!kept) break;
        keep = (size_t)(next - old);
    }
    free(old);
    if (keep < len && ftruncate(rf->metrics_fd, (off_t)keep) != 0)
        die("cutting metrics file '%s' back to step %d failed: %s", mp, resumed_step, strerror(errno));
}

// config.json written whole into its temporary (atomic_finish), to be renamed by atomic_commit
static int config_json_stage(AtomicFile *af, const char *path, const Config *cfg, char *err, size_t errlen) {
    cJSON *j = config_to_json(cfg);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (atomic_open(af, path, OUT_REPLACE) != 0) {
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        free(text);
        return -1;
    }
    int ok = fputs(text, af->f) >= 0 && fputc('\n', af->f) != EOF;
    int e = errno;
    free(text);
    if (!ok) {
        atomic_abort(af);
        snprintf(err, errlen, "writing '%s' failed: %s", path, strerror(e));
        return -1;
    }
    if (atomic_finish(af) != 0) {
        snprintf(err, errlen, "writing '%s' failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int write_config_json_checked(const char *path, const Config *cfg, char *err, size_t errlen) {
    AtomicFile af;
    if (config_json_stage(&af, path, cfg, err, errlen) != 0) return -1;
    if (atomic_commit(&af) != 0) {
        snprintf(err, errlen, "writing '%s' failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int model_masters_finite(Model *model, const float *masters, size_t *bad) {
    size_t n = model->params.bytes_f32 / 4;
    float *copy;   // host memory is read where it lies (a copy at every checkpoint is memory unplanned)
    const float *host = model_table_on_host(model, masters, &copy);
    int ok = 1;
    for (size_t i = 0; ok && i < n; i++)
        if (!isfinite(host[i])) { ok = 0; *bad = i; }
    free(copy);
    return ok;
}

void run_files_save_model(RunFiles *rf, const Config *cfg, Model *model, const float *masters, const char *last_good) {
    size_t bad;
    if (!model_masters_finite(model, masters, &bad))
        die("not writing %s/model.safetensors: weight element %zu (of the fp32 layout) is not finite: the model diverged",
            rf->dir, bad);
    char *cp = path_join(rf->dir, "config.json");
    char err[1536];
    // config.json's bytes are written before the weights replace the earlier ones, and renamed
    // after them: a full disk fails it while the earlier model and config are both still there
    // (an init --overwrite left new weights beside the trained run's config and checkpoints)
    AtomicFile cf;
    int rc = config_json_stage(&cf, cp, cfg, err, sizeof(err));
    if (!rc && model_save_dir_checked(model, masters, rf->dir, rf->shard_bytes, err, sizeof(err)) != 0) {
        atomic_abort(&cf);
        rc = -1;
    }
    if (!rc && atomic_commit(&cf) != 0) rc = fail_with(err, sizeof(err), "writing '%s' failed: %s", cp, strerror(errno));
    if (rc) die("%s%s%s", err, last_good ? "; the last good checkpoint is " : "", last_good ? last_good : "");
    free(cp);
}

int run_final_model_current(const char *dir, int step) {
    char *cp = path_join(dir, "config.json");
    char *text = read_file(cp, NULL);
    free(cp);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "train"), "max_steps");
    int current = cJSON_IsNumber(ms) && ms->valuedouble == (double)step &&
                  (exists_in(dir, "model.safetensors") || exists_in(dir, "model.safetensors.index.json"));
    cJSON_Delete(j);
    return current;
}

void run_files_close(RunFiles *rf) {
    // the records on the disk before the run says it is done: a failure here (an NFS server's
    // delayed write error at close) is the run's, not a warning after which it exited 0
    if (rf->metrics_fd >= 0) {
        struct stat sb;
        const int regular = fstat(rf->metrics_fd, &sb) == 0 && S_ISREG(sb.st_mode);
        if ((regular && fsync(rf->metrics_fd) != 0) || close(rf->metrics_fd) != 0)
            die("writing metrics file '%s' failed at its end: %s: its last records may be missing (the model and checkpoints "
                "were written)",
                rf->metrics_path, strerror(errno));
    }
    free(rf->dir);
    free(rf->metrics_path);
    memset(rf, 0, sizeof(*rf));
    rf->metrics_fd = -1;
}

void load_model_dir(Model *model, Config *cfg, const char *dir, const Backend *be, int n_sets, char **sets) {
    char *cp = path_join(dir, "config.json");
    config_load(cfg, cp, n_sets, sets);
    model_build(model, &cfg->model, be);
    model_load(model, dir);   // model.safetensors or model.safetensors.index.json and its shards
    free(cp);
}
