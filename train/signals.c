#include "train/signals.h"

#include <string.h>

#include "common/unfinished.h"

// The one global: a signal handler cannot reach the caller's SignalWatch, and
// volatile sig_atomic_t is the only type it may safely write. It is read only through
// signals_stop_requested(), so the rest of the program passes its SignalWatch around.
static volatile sig_atomic_t stop_signal = 0;

// The second signal does not wait for the step and the save: the process ends the default way,
// its unfinished outputs (a checkpoint's temporaries) removed (common/unfinished.h).
static void on_stop(int sig) {
    if (stop_signal) unfinished_die_by_signal(sig);
    stop_signal = sig;
}

void signals_install(SignalWatch *sw) {
    memset(sw, 0, sizeof(*sw));
    stop_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    // SA_RESTART: reads and writes in progress (data, metrics, checkpoint files) continue
    // instead of failing with EINTR.
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &sw->old_int);
    sigaction(SIGTERM, &sa, &sw->old_term);
    sw->installed = 1;
}

int signals_stop_requested(const SignalWatch *sw) { return sw->installed ? (int)stop_signal : 0; }

void signals_restore(SignalWatch *sw) {
    if (!sw->installed) return;
    sigaction(SIGINT, &sw->old_int, NULL);
    sigaction(SIGTERM, &sw->old_term, NULL);
    sw->installed = 0;
}
