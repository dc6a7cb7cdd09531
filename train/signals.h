// Graceful stop on SIGINT and SIGTERM (cluster preemption): the handler only records the
// signal; the training loop polls signals_stop_requested() after each step, saves a
// checkpoint and exits 0. (SIGXFSZ is ignored for every command, in cli/main.c, so a write
// past a file-size limit fails with EFBIG and the save reports it.) clla prep uses it too.
#ifndef CLLA_TRAIN_SIGNALS_H
#define CLLA_TRAIN_SIGNALS_H

#include <signal.h>

typedef struct SignalWatch {
    struct sigaction old_int, old_term;   // restored by signals_restore
    int installed;
} SignalWatch;

// Installs the handlers. The first SIGINT/SIGTERM asks for a stop; a second ends the process
// by that signal when a user does not want to wait for the step and the save, removing its
// unfinished outputs (common/unfinished.h; checkpoints are atomic, so that is safe).
void signals_install(SignalWatch *sw);
// The signal number that asked for a stop, or 0.
int signals_stop_requested(const SignalWatch *sw);
void signals_restore(SignalWatch *sw);

#endif
