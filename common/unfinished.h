// The outputs this process has started and not finished: the temporary of an AtomicFile
// (common/util.h), the staging directory of a package (cli/package_out.c) or of prep's shards
// (cli/cmd_prep.c), the parts of a sharded weights file (model/safetensors.c), a directory a
// command created for its output. When the
// process ends before finishing them, through die() or exit() (an atexit handler) or by SIGINT,
// SIGTERM or SIGHUP (a handler that removes them, says so in one line on stderr, and ends the
// process by the same signal), they are removed: nothing half-written is left behind, and an
// earlier output is untouched (an unfinished output never has the final name).
//
// The handler may only make async-signal-safe calls, so the table is fixed slots of fixed size
// (a path longer than a slot, or a 257th unfinished output, is not tracked: it stays behind, as
// it did before this table), and a directory is emptied with getdents64/unlinkat (to a depth of
// 4, which the staging directories tracked here do not reach). Only the
// process that added an entry removes it (a forked child's exit does not).
#ifndef CLLA_COMMON_UNFINISHED_H
#define CLLA_COMMON_UNFINISHED_H

#include <signal.h>

typedef enum UnfinishedKind {
    UNFINISHED_FILE,        // unlinked
    UNFINISHED_DIR,         // removed with what is in it (a staging directory)
    UNFINISHED_LOCK,        // unlinked after the outputs and not named in the message (a run's lock: not an output)
    UNFINISHED_EMPTY_DIR,   // removed only if empty (a directory the command created for its output)
} UnfinishedKind;

// Once, from main: the atexit handler and the signal handlers (a signal ignored when the
// process started, as for a background job of a shell, stays ignored).
void unfinished_install(void);
// Tracks path; returns its slot for unfinished_done, or -1 when it is not tracked.
int unfinished_add(const char *path, UnfinishedKind kind);
// The output of that slot is finished (renamed into place) or removed by its owner; -1 is ignored.
void unfinished_done(int slot);
// A commit of several renames that must not be cut in two (a package, a run's model and
// config, prep's outputs): SIGINT, SIGTERM and SIGHUP are held from unfinished_hold_stops to
// unfinished_release_stops, and one that came meanwhile is handled then.
void unfinished_hold_stops(sigset_t *before);
void unfinished_release_stops(const sigset_t *before);
// For a handler of SIGINT/SIGTERM that is not this module's (train/signals.c): removes the
// unfinished outputs, then ends the process by sig the default way.
void unfinished_die_by_signal(int sig);

#endif
