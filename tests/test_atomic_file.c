// Output files (common/util.h): an AtomicFile committed with OUT_KEEP_EXISTING never replaces a
// path that appeared after the command checked it (another process's output), keeps its own
// finished output under the name atomic_commit_message() gives, and with OUT_REPLACE replaces
// as before; rename_noreplace() refuses an existing file or directory and moves otherwise;
// rename_exchange() swaps; path_absolute() cleans a path lexically.
// Output: a FAIL line per failed check, then "N checks, M failed"; exit status 1 on any failure.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/lib/check.h"


static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) die("cannot write '%s'", path);
}

static int holds(const char *path, const char *text) {
    size_t len;
    char *got = read_file(path, &len);
    int ok = got && len == strlen(text) && !memcmp(got, text, len);
    free(got);
    return ok;
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

// Commits "new" to path after `before` (NULL: nothing) appeared there; returns the commit's
// result and errno in *err.
static int commit_over(const char *path, OutMode mode, const char *before, int *err) {
    AtomicFile af;
    if (atomic_open(&af, path, mode) != 0) die("atomic_open '%s': %s", path, strerror(errno));
    fputs("new", af.f);
    if (before) write_text(path, before);   // what another process does between check and commit
    int rc = atomic_commit(&af);
    *err = errno;
    return rc;
}

int main(void) {
    char dir[] = "/tmp/clla_test_atomic_XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp: %s", strerror(errno));
    char *path = path_join(dir, "out.bin"), tmp[4096], msg[8192];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    int err;

    // absent at commit: written, no temporary left
    CHECK(commit_over(path, OUT_KEEP_EXISTING, NULL, &err) == 0 && holds(path, "new") && !exists(tmp),
      "OUT_KEEP_EXISTING onto an absent path writes it");
    unlink(path);

    // appeared meanwhile: refused with EEXIST, the other file untouched, ours kept and named
    int rc = commit_over(path, OUT_KEEP_EXISTING, "theirs", &err);
    CHECK(rc != 0 && err == EEXIST, "OUT_KEEP_EXISTING refuses a path that appeared (rc %d, errno %d)", rc, err);
    CHECK(holds(path, "theirs"), "the file that appeared is left as it was");
    CHECK(holds(tmp, "new"), "the finished output is kept at '%s'", tmp);
    atomic_commit_message(msg, sizeof(msg), path, OUT_KEEP_EXISTING, EEXIST);
    CHECK(strstr(msg, tmp) && strstr(msg, path) && strstr(msg, "--overwrite"), "the message names both files and the flag: %s", msg);
    unlink(tmp);

    // OUT_REPLACE (a run's own file, or --overwrite): replaced
    CHECK(commit_over(path, OUT_REPLACE, "theirs", &err) == 0 && holds(path, "new") && !exists(tmp), "OUT_REPLACE replaces");

    // abort leaves nothing
    AtomicFile af;
    if (atomic_open(&af, path, OUT_KEEP_EXISTING) != 0) die("atomic_open: %s", strerror(errno));
    atomic_abort(&af);
    CHECK(!exists(tmp) && holds(path, "new"), "atomic_abort removes the temporary only");

    // rename_noreplace: files and directories
    char *a = path_join(dir, "a"), *b = path_join(dir, "b"), *d1 = path_join(dir, "d1"), *d2 = path_join(dir, "d2");
    write_text(a, "A");
    write_text(b, "B");
    CHECK(rename_noreplace(a, b) != 0 && errno == EEXIST && holds(a, "A") && holds(b, "B"), "rename_noreplace refuses an existing file");
    unlink(b);
    CHECK(rename_noreplace(a, b) == 0 && !exists(a) && holds(b, "B") == 0 && holds(b, "A"), "rename_noreplace moves onto an absent name");
    if (mkdir(d1, 0755) != 0 || mkdir(d2, 0755) != 0) die("mkdir: %s", strerror(errno));
    CHECK(rename_noreplace(d1, d2) != 0 && errno == EEXIST && exists(d1), "rename_noreplace refuses an existing (even empty) directory");
    rmdir(d2);
    CHECK(rename_noreplace(d1, d2) == 0 && !exists(d1) && exists(d2), "rename_noreplace moves a directory");

    // rename_exchange swaps two names (export --overwrite's package and the old one)
    mkdir(d1, 0755);
    write_text(a, "A");
    CHECK(rename_exchange(a, d1) == 0 && holds(d1, "A") && exists(a) && !holds(a, "A"), "rename_exchange swaps a file and a directory");
    rename_exchange(a, d1);
    rmdir(d1);
    unlink(a);

    // path_absolute's clean-up: "run/" and "run" are one directory (data-parallel ranks given
    // them were refused as disagreeing); "." components and repeated slashes go, ".." stays
    static const char *const CLEAN[][2] = {
        {"/a/b/", "/a/b"}, {"/a//b", "/a/b"}, {"/a/./b/.", "/a/b"}, {"/", "/"}, {"//", "/"}, {"/.", "/"},
        {"/a/.b/..c", "/a/.b/..c"}, {"/a/../b", "/a/../b"}, {"/a///", "/a"},
    };
    for (size_t i = 0; i < sizeof(CLEAN) / sizeof(CLEAN[0]); i++) {
        char *got = path_absolute(CLEAN[i][0]);
        CHECK(got && !strcmp(got, CLEAN[i][1]), "path_absolute(\"%s\") = \"%s\", want \"%s\"", CLEAN[i][0], got ? got : "(null)", CLEAN[i][1]);
        free(got);
    }
    char *cwd = getcwd(NULL, 0), *rel = path_absolute("./x//y/"), *want = path_join(cwd, "x/y");
    CHECK(!strcmp(rel, want), "path_absolute(\"./x//y/\") = \"%s\", want \"%s\"", rel, want);
    free(cwd); free(rel); free(want);

    rmdir(d2);
    unlink(b);
    unlink(path);
    rmdir(dir);
    free(a); free(b); free(d1); free(d2); free(path);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
