#define _POSIX_C_SOURCE 200809L
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/unfinished.h"

// prefix, the message and a newline in one write: stderr is unbuffered, and the lines of the
// ranks of a data-parallel job (or of threads) must not interleave within a line
static void emit_line(const char *prefix, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    const int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    const size_t plen = strlen(prefix);
    char *line = n >= 0 ? malloc(plen + (size_t)n + 2) : NULL;
    if (!line) {   // no memory for the line: the parts, as before
        fputs(prefix, stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        return;
    }
    memcpy(line, prefix, plen);
    vsnprintf(line + plen, (size_t)n + 1, fmt, ap);
    line[plen + (size_t)n] = '\n';
    fwrite(line, 1, plen + (size_t)n + 1, stderr);
    free(line);
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit_line("clla: error: ", fmt, ap);
    va_end(ap);
    exit(1);
}

void die_stdout(void) {
    const int e = errno;
    __fpurge(stdout);
    clearerr(stdout);
    die("writing the output to stdout failed: %s: what was printed is incomplete", e ? strerror(e) : "write error");
}

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit_line("clla: warning: ", fmt, ap);
    va_end(ap);
}

int fail_with(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int env_switch(const char *name, int dflt, const char *what0, const char *what1) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    if (strcmp(v, "0") == 0) return 0;
    if (strcmp(v, "1") == 0) return 1;
    die("%s='%s': use 0 (%s%s) or 1 (%s%s)", name, v, what0, dflt == 0 ? ", the default" : "", what1,
        dflt == 1 ? ", the default" : "");
}

int pread_full(int fd, void *dst, size_t n, unsigned long long off) {
    size_t got = 0;
    while (got < n) {
        const ssize_t r = pread(fd, (char *)dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory allocating %zu bytes: use a smaller model, batch or sequence", bytes);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes: use a smaller model, batch or sequence", count, size);
    return p;
}

void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) die("out of memory allocating %zu bytes: use a smaller model, batch or sequence", bytes);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A stream that cannot seek (a pipe, /dev/stdin, <(...)): read in growing steps to its end.
static char *read_stream(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap + 1);
    for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            if (cap > SIZE_MAX / 2 - 1) { free(buf); fclose(f); errno = EFBIG; return NULL; }
            cap *= 2;
            buf = xrealloc(buf, cap + 1);
        }
    }
    const int err = ferror(f);
    fclose(f);
    if (err) { free(buf); errno = EIO; return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *read_file(const char *path, size_t *len) {
    FILE *f = fopen_read(path);
    if (!f) return NULL;
    if (fseeko(f, 0, SEEK_END) != 0) {
        if (errno == ESPIPE) return read_stream(f, len);
        fclose(f);
        return NULL;
    }
    off_t size = ftello(f);
    if (size < 0 || fseeko(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    // a size of 0 says nothing for /proc and /sys files, which hold text all the same
    if (size == 0) return read_stream(f, len);
    char *buf = xmalloc((size_t)size + 1);
    size_t got = fread(buf, 1, (size_t)size, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)size) { free(buf); errno = EIO; return NULL; }
    buf[size] = 0;
    if (len) *len = (size_t)size;
    return buf;
}

int rename_noreplace(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    // the filesystem lacks RENAME_NOREPLACE: a link fails on an existing name; a directory
    // cannot be linked, so it is checked first (a window between the two remains)
    struct stat st;
    if (lstat(from, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        if (link(from, to) != 0) return -1;
        return unlink(from);
    }
    if (lstat(to, &st) == 0) { errno = EEXIST; return -1; }
    return rename(from, to);
}

int rename_exchange(const char *a, const char *b) { return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE); }

static void atomic_tmp_name(char *buf, size_t n, const char *path) {
    snprintf(buf, n, "%s.tmp.%ld", path, (long)getpid());
}

int atomic_open(AtomicFile *af, const char *path, OutMode mode) {
    af->path = xstrdup(path);
    size_t n = strlen(path) + 32;
    af->tmp = xmalloc(n);
    atomic_tmp_name(af->tmp, n, path);
    af->mode = mode;
    af->unfinished = unfinished_add(af->tmp, UNFINISHED_FILE);   // before it exists: no moment untracked
    af->f = fopen(af->tmp, "wb");   // one of that name was left by a killed process that had our pid
    if (!af->f) {
        int e = errno;
        unfinished_done(af->unfinished);
        free(af->path); free(af->tmp);
        af->path = af->tmp = NULL;
        errno = e;
        return -1;
    }
    return 0;
}

int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    // some file systems cannot fsync a directory; their renames are as durable as they get
    if (rc != 0 && (e == EINVAL || e == EROFS)) rc = 0;
    errno = e;
    return rc;
}

int fsync_parent_dir(const char *path) {
    char *copy = xstrdup(path);
    int rc = fsync_dir(dirname(copy)), e = errno;
    free(copy);
    errno = e;
    return rc;
}

int atomic_finish(AtomicFile *af) {
    int ok = fflush(af->f) == 0 && !ferror(af->f) && fsync(fileno(af->f)) == 0;
    int e = errno;
    if (fclose(af->f) != 0 && ok) { ok = 0; e = errno; }
    af->f = NULL;
    if (!ok) {
        atomic_abort(af);
        errno = e;
        return -1;
    }
    return 0;
}

int atomic_commit(AtomicFile *af) {
    if (af->f && atomic_finish(af) != 0) return -1;   // not finished yet: finish it first
    int ok = 1, e = 0;
    const int keep_existing = af->mode == OUT_KEEP_EXISTING;
    if (ok && (keep_existing ? rename_noreplace(af->tmp, af->path) : rename(af->tmp, af->path)) != 0) { ok = 0; e = errno; }
    if (!ok && !(e == EEXIST && keep_existing)) unlink(af->tmp);   // a finished output kept on EEXIST
    unfinished_done(af->unfinished);
    if (ok && fsync_parent_dir(af->path) != 0) { ok = 0; e = errno; }   // in place, but maybe not for good
    free(af->path); free(af->tmp);
    af->path = af->tmp = NULL;
    errno = e;
    return ok ? 0 : -1;
}

void atomic_commit_message(char *buf, size_t n, const char *path, OutMode mode, int err) {
    if (err != EEXIST || mode != OUT_KEEP_EXISTING) {
        snprintf(buf, n, "writing '%s' failed: %s", path, strerror(err));
        return;
    }
    char tmp[4096];
    atomic_tmp_name(tmp, sizeof(tmp), path);
    snprintf(buf, n, "'%s' was created by another process while this command ran: it was left as it is, and this "
             "command's output is in '%s' (move it yourself, or rerun with --overwrite)", path, tmp);
}

void atomic_abort(AtomicFile *af) {
    if (af->f) fclose(af->f);
    if (af->tmp) {
        unlink(af->tmp);
        unfinished_done(af->unfinished);
    }
    free(af->path); free(af->tmp);
    af->f = NULL; af->path = af->tmp = NULL;
}

int make_dirs(const char *path) {
    if (!path[0]) {   // names no directory (and p + 1 below would start past its end)
        errno = ENOENT;
        return -1;
    }
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) { free(p); return -1; }
        *s = '/';
    }
    int rc = (mkdir(p, 0755) != 0 && errno != EEXIST) ? -1 : 0;
    free(p);
    return rc;
}

int path_has_ext(const char *path, const char *ext) {
    size_t n = strlen(path), k = strlen(ext);
    return n >= k && !strcasecmp(path + n - k, ext);
}

char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = xmalloc(n);
    snprintf(s, n, "%s/%s", dir, name);
    return s;
}

int remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    int err = 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return -1;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char *p = path_join(path, de->d_name);
            if (remove_tree(p) != 0 && !err) err = errno;   // go on: remove what can be removed
            free(p);
        }
        closedir(d);
        if (rmdir(path) != 0 && !err) err = errno;
    } else if (unlink(path) != 0) {
        err = errno;
    }
    if (!err) return 0;
    errno = err;
    return -1;
}

static int dir_changeable(const char *dir) { return access(dir, W_OK | X_OK) == 0; }

// the directory path is in: a copy with its last component cut ("." for a bare name)
static char *parent_of(const char *path) {
    char *copy = xstrdup(path), *p = xstrdup(dirname(copy));
    free(copy);
    return p;
}

static int tree_entries_removable(const char *path, char *blocker, size_t len) {
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    DIR *d = opendir(path);
    if (!d) {
        snprintf(blocker, len, "%s", path);
        return -1;
    }
    int rc = 0, any = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        any = 1;
        char *p = path_join(path, de->d_name);
        rc = tree_entries_removable(p, blocker, len);
        free(p);
    }
    closedir(d);
    if (rc == 0 && any && !dir_changeable(path)) {
        snprintf(blocker, len, "%s", path);
        rc = -1;
    }
    return rc;
}

int tree_removable(const char *path, char *blocker, size_t len) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0;   // nothing to remove
    char *parent = parent_of(path);
    const int ok = dir_changeable(parent);
    if (!ok) snprintf(blocker, len, "%s", parent);
    free(parent);
    return ok ? tree_entries_removable(path, blocker, len) : -1;
}

void output_file_check(const char *path, int overwrite, const char *option) {
    struct stat st;
    if (!path[0]) die("%s is empty: give a file name", option);
    // the output is renamed into place: a link (even one to nothing yet) would be replaced by
    // the file, its target never written
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
        die("%s '%s' is a symbolic link: give the path it points to", option, path);
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) die("%s '%s' is a directory: give a file name", option, path);
        // the output replaces the name by a rename: a device (/dev/null), a FIFO or a socket would
        // be swapped for a regular file, even with --overwrite
        if (!S_ISREG(st.st_mode))
            die("%s '%s' is not a regular file (a device, a FIFO or a socket), which the output would replace: give a file name", option, path);
        if (!overwrite) die("%s '%s' already exists: give another file name, or replace it with --overwrite", option, path);
    }
    output_parent_check(path, option);
}

void output_not_input(const char *out, const char *out_option, const char *in, const char *in_option) {
    struct stat os, is;
    if (stat(out, &os) != 0 || stat(in, &is) != 0) return;
    if (os.st_dev == is.st_dev && os.st_ino == is.st_ino)
        die("%s '%s' is the %s '%s': write the output to another file", out_option, out, in_option, in);
    if (!S_ISDIR(is.st_mode)) return;
    char *ro = realpath(out, NULL), *ri = realpath(in, NULL);
    const size_t n = ri ? strlen(ri) : 0;
    const int inside = ro && ri && !strncmp(ro, ri, n) && (ro[n] == '/' || (n == 1 && ri[0] == '/'));
    free(ro);
    free(ri);
    if (inside) die("%s '%s' is inside the %s '%s': write the output outside it", out_option, out, in_option, in);
}

char *buf_next_line(char *buf, size_t len, size_t *pos, size_t *n) {
    if (*pos >= len) return NULL;
    char *line = buf + *pos, *nl = memchr(line, '\n', len - *pos);
    size_t k = nl ? (size_t)(nl - line) : len - *pos;
    *pos += k + (nl ? 1 : 0);
    if (k && line[k - 1] == '\r') k--;
    line[k] = '\0';
    *n = k;
    return line;
}

void output_parent_check(const char *path, const char *option) {
    struct stat st;
    char *dir = parent_of(path);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) die("%s '%s': its directory '%s' does not exist: create it first", option, path, dir);
    // found now, not after the work (access() also reports a read-only filesystem to root)
    if (access(dir, W_OK) != 0) die("%s '%s': its directory '%s' is not writable: %s", option, path, dir, strerror(errno));
    free(dir);
}

// Lexical clean-up of an absolute path in place: repeated slashes and "." components go, and a
// trailing slash ("/" stays "/"). ".." is kept: through a link it names another place than its
// text suggests.
static void path_clean(char *p) {
    char *w = p;
    for (const char *r = p; *r;) {
        if (r[0] == '/' && (r[1] == '/' || (r[1] == '.' && (r[2] == '/' || r[2] == 0)))) {
            r += r[1] == '/' ? 1 : 2;   // "//" -> "/", "/." -> ""
            continue;
        }
        *w++ = *r++;
    }
    *w = 0;
    while (w > p + 1 && w[-1] == '/') *--w = 0;
    if (!p[0]) strcpy(p, "/");
}

char *path_absolute(const char *path) {
    char *abs;
    if (path[0] == '/') {
        abs = xstrdup(path);
    } else {
        char *cwd = getcwd(NULL, 0);
        if (!cwd) return NULL;
        abs = path_join(cwd, path);
        free(cwd);
    }
    path_clean(abs);
    return abs;
}

// ---- opening files to read (issue 12)

FILE *fopen_read(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        errno = EISDIR;
        return NULL;
    }
    return f;
}

// ---- byte sizes (issue 12: --shard-size)

int parse_byte_size(const char *s, unsigned long long *out) {
    static const struct { const char *unit; unsigned long long mult; } UNITS[] = {
        {"", 1}, {"b", 1}, {"kb", 1000ull}, {"mb", 1000000ull}, {"gb", 1000000000ull}, {"tb", 1000000000000ull},
        {"kib", 1ull << 10}, {"mib", 1ull << 20}, {"gib", 1ull << 30}, {"tib", 1ull << 40},
    };
    unsigned long long v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (~0ull - 9) / 10) return -1;
        v = v * 10 + (unsigned long long)(*p - '0');
    }
    char unit[8];
    size_t k = 0;
    for (; p[k] && k < sizeof(unit) - 1; k++) unit[k] = (char)(p[k] >= 'A' && p[k] <= 'Z' ? p[k] - 'A' + 'a' : p[k]);
    if (p[k]) return -1;
    unit[k] = 0;
    for (size_t i = 0; i < sizeof(UNITS) / sizeof(UNITS[0]); i++) {
        if (strcmp(unit, UNITS[i].unit)) continue;
        if (v == 0 || v > ~0ull / UNITS[i].mult) return -1;
        *out = v * UNITS[i].mult;
        return 0;
    }
    return -1;
}
