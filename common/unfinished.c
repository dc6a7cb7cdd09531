#include "common/unfinished.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

enum { SLOTS = 256, SLOT_PATH = 4096 };
enum { FREE = 0, CLAIMED = 1, ACTIVE = 2 };

// The one table of the process (a signal handler reaches nothing else). A slot is claimed
// with a compare-and-swap, filled, then published as ACTIVE, so threads may add and finish
// outputs at once and the handler sees only whole entries.
static struct {
    atomic_int state;
    pid_t owner;
    UnfinishedKind kind;
    char path[SLOT_PATH];
} slots[SLOTS];

int unfinished_add(const char *path, UnfinishedKind kind) {
    if (strlen(path) >= SLOT_PATH) return -1;
    for (int i = 0; i < SLOTS; i++) {
        int expected = FREE;
        if (!atomic_compare_exchange_strong(&slots[i].state, &expected, CLAIMED)) continue;
        memcpy(slots[i].path, path, strlen(path) + 1);
        slots[i].kind = kind;
        slots[i].owner = getpid();
        atomic_store(&slots[i].state, ACTIVE);
        return i;
    }
    return -1;
}

void unfinished_done(int slot) {
    if (slot >= 0 && slot < SLOTS) atomic_store(&slots[slot].state, FREE);
}

// What is in the directory open as fd (its subdirectories to a depth of 4, enough for the
// staging directories tracked here; links are removed, never followed). Passes over the entries
// until one removes nothing: removing while reading may make getdents64 skip entries.
static void empty_dir(int fd, int depth) {
    _Alignas(8) char buf[4096];
    for (int pass = 0, removed = 1; removed && pass < 1000; pass++) {
        removed = 0;
        if (lseek(fd, 0, SEEK_SET) != 0) return;
        ssize_t n;
        while ((n = getdents64(fd, buf, sizeof(buf))) > 0)
            for (ssize_t off = 0; off < n;) {
                const struct dirent64 *d = (const struct dirent64 *)(buf + off);
                off += d->d_reclen;
                if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, "..")) continue;
                if (d->d_type == DT_DIR && depth < 4) {
                    int sub = openat(fd, d->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                    if (sub >= 0) {
                        empty_dir(sub, depth + 1);
                        close(sub);
                    }
                    if (unlinkat(fd, d->d_name, AT_REMOVEDIR) == 0) removed = 1;
                } else if (unlinkat(fd, d->d_name, 0) == 0) {
                    removed = 1;
                }
            }
    }
}

static void remove_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        empty_dir(fd, 0);
        close(fd);
    }
    rmdir(path);
}

// Removes this process's unfinished outputs: files, then directories emptied of them, then a
// run's lock, then the directories created for an output (removed only if empty). Returns how many
// outputs were tracked and the slot of the first, for the message.
static int remove_all(int *first) {
    const pid_t me = getpid();
    int n = 0;
    *first = -1;
    for (int kind = UNFINISHED_FILE; kind <= UNFINISHED_EMPTY_DIR; kind++)
        for (int i = SLOTS - 1; i >= 0; i--) {
            if (atomic_load(&slots[i].state) != ACTIVE || slots[i].owner != me || (int)slots[i].kind != kind) continue;
            if (kind == UNFINISHED_FILE || kind == UNFINISHED_LOCK) unlink(slots[i].path);
            else if (kind == UNFINISHED_DIR) remove_dir(slots[i].path);
            else rmdir(slots[i].path);
            const int named = kind == UNFINISHED_FILE || kind == UNFINISHED_DIR;
            if (named && *first < 0) *first = i;
            if (named) n++;
            // the slot stays ACTIVE: its path is still read for the message; the process ends
        }
    return n;
}

static void at_exit(void) {
    int first;
    remove_all(&first);
}

static void put(const char *s) {
    ssize_t w = write(STDERR_FILENO, s, strlen(s));
    (void)w;   // nothing to do about a failed write in a handler
}

void unfinished_die_by_signal(int sig) {
    int first;
    const int n = remove_all(&first);
    if (n > 0) {
        put(sig == SIGINT ? "clla: stopped by SIGINT" : sig == SIGTERM ? "clla: stopped by SIGTERM" : "clla: stopped by a signal");
        put(": removed the unfinished output '");
        put(slots[first].path);
        put(n > 1 ? "' and others\n" : "'\n");
    }
    signal(sig, SIG_DFL);
    raise(sig);   // delivered when the handler returns (the signal is blocked while it runs)
}

static void on_signal(int sig) { unfinished_die_by_signal(sig); }

void unfinished_install(void) {
    atexit(at_exit);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        struct sigaction old, sa;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN) continue;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        for (int k = 0; k < 3; k++) sigaddset(&sa.sa_mask, sigs[k]);   // one handler at a time
        sigaction(sigs[i], &sa, NULL);
    }
}

void unfinished_hold_stops(sigset_t *before) {
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    sigprocmask(SIG_BLOCK, &stops, before);
}

void unfinished_release_stops(const sigset_t *before) { sigprocmask(SIG_SETMASK, before, NULL); }
