// Unfinished outputs (common/unfinished.h), in forked children that end in each way a command
// can: exit through die() and by SIGTERM remove the tracked file, staging directory (with a
// subdirectory, as prep's) and an empty created directory; a created directory that holds
// something is kept; a finished output (unfinished_done) is kept; an AtomicFile's temporary is
// tracked from atomic_open to atomic_commit; a child's exit leaves its parent's entries alone.
// Output: a FAIL line per failed check, then "N checks, M failed"; exit status 1 on any failure.
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/unfinished.h"
#include "common/util.h"
#include "tests/lib/check.h"


static char dir[] = "/tmp/clla_test_unfinished_XXXXXX";

static char *at(const char *name) { return path_join(dir, name); }

static int exists(const char *name) {
    char *p = at(name);
    struct stat st;
    int e = lstat(p, &st) == 0;
    free(p);
    return e;
}

static void touch(const char *name) {
    char *p = at(name);
    FILE *f = fopen(p, "w");
    if (!f || fputs("x", f) == EOF || fclose(f) != 0) die("cannot write '%s'", p);
    free(p);
}

static void make_dir(const char *name) {
    char *p = at(name);
    if (mkdir(p, 0755) != 0) die("mkdir '%s': %s", p, strerror(errno));
    free(p);
}

static void track(const char *name, UnfinishedKind kind) {
    char *p = at(name);
    if (unfinished_add(p, kind) < 0) die("unfinished_add '%s' was not tracked", p);
    free(p);
}

// The outputs a command has under way: a file, a staging directory with a subdirectory, a
// directory created for the output (empty), one created for it that holds something else, and
// one finished output.
static void start_outputs(void) {
    touch("tmp_file");
    make_dir("staging");
    make_dir("staging/train");
    touch("staging/train/shard_000000.bin");
    touch("staging/tokenizer.tok");
    make_dir("created_empty");
    make_dir("created_used");
    touch("created_used/other");
    touch("finished");
    track("tmp_file", UNFINISHED_FILE);
    track("staging", UNFINISHED_DIR);
    track("created_empty", UNFINISHED_EMPTY_DIR);
    track("created_used", UNFINISHED_EMPTY_DIR);
    char *p = at("finished");
    unfinished_done(unfinished_add(p, UNFINISHED_FILE));
    free(p);
}

static void check_removed(const char *how) {
    CHECK(!exists("tmp_file"), "%s: the unfinished file is removed", how);
    CHECK(!exists("staging"), "%s: the staging directory and what is in it are removed", how);
    CHECK(!exists("created_empty"), "%s: the empty directory created for the output is removed", how);
    CHECK(exists("created_used/other"), "%s: a created directory that holds something is kept", how);
    CHECK(exists("finished"), "%s: a finished output is kept", how);
}

static void reset(void) {
    char *p = at("created_used/other");
    unlink(p);
    free(p);
    p = at("created_used");
    rmdir(p);
    free(p);
    p = at("finished");
    unlink(p);
    free(p);
}

// A child that writes out.bin through an AtomicFile, commits it or not, then dies; its pid, and
// its wait status in *status.
static pid_t atomic_file_child(int commit, int *status) {
    fflush(stdout);   // a child that exits would print the parent's buffered lines again
    pid_t pid = fork();
    if (pid == 0) {
        unfinished_install();
        AtomicFile af;
        char *p = at("out.bin");
        if (atomic_open(&af, p, OUT_KEEP_EXISTING) != 0 || fputs("out", af.f) == EOF || fflush(af.f) != 0) _exit(3);
        if (commit && atomic_commit(&af) != 0) _exit(3);
        die("(a child ending %s its commit)", commit ? "after" : "before");
    }
    waitpid(pid, status, 0);
    return pid;
}

int main(void) {
    if (!mkdtemp(dir)) die("mkdtemp: %s", strerror(errno));

    // (1) a command that dies (die() -> exit(1) -> the atexit handler)
    fflush(stdout);   // a child that exits would print the parent's buffered lines again
    pid_t pid = fork();
    if (pid == 0) {
        unfinished_install();
        start_outputs();
        die("(a child ending through die, as a failing command does)");
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "die: exit status 1 (status %d)", status);
    check_removed("die");
    reset();

    // (2) a command stopped by SIGTERM: the handler removes them and the process ends by it
    int ready[2];
    if (pipe(ready) != 0) die("pipe: %s", strerror(errno));
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        unfinished_install();
        start_outputs();
        if (write(ready[1], "r", 1) != 1) _exit(3);
        for (;;) pause();
    }
    close(ready[1]);   // a child that fails before it is ready ends the read
    char c;
    if (read(ready[0], &c, 1) != 1) {
        waitpid(pid, &status, 0);
        die("the child did not get ready (status %d)", status);
    }
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "SIGTERM: the process ends by SIGTERM (status %d)", status);
    check_removed("SIGTERM");
    reset();

    // (3) an AtomicFile's temporary is tracked until its commit
    pid = atomic_file_child(0, &status);
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "out.bin.tmp.%ld", (long)pid);
    CHECK(WIFEXITED(status) && !exists(tmp) && !exists("out.bin"), "an AtomicFile not committed leaves nothing (status %d)", status);
    atomic_file_child(1, &status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && exists("out.bin"), "a committed AtomicFile stays (status %d)", status);

    // (4) a forked child's exit does not remove its parent's entries
    unfinished_install();
    touch("parents");
    track("parents", UNFINISHED_FILE);
    fflush(stdout);
    pid = fork();
    if (pid == 0) exit(0);
    waitpid(pid, &status, 0);
    CHECK(exists("parents"), "a child's exit leaves the parent's unfinished file");
    char *p = at("parents");
    unlink(p);
    free(p);

    // remove what is left of the work directory
    const char *rest[] = {"out.bin"};
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++) {
        p = at(rest[i]);
        unlink(p);
        free(p);
    }
    if (rmdir(dir) != 0) printf("note: '%s' not empty: %s\n", dir, strerror(errno));
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
