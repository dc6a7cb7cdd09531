// libFuzzer target for config parsing, --set and the size planner (built and run by
// tests/test_fuzz_config.sh). The input is text: the config JSON, then optionally a line
// "#set" followed by one --set assignment per line. A config that is accepted is then laid
// out: parameter and activation tables (model_build_table, model_layout_acts), whose sizes
// config_check_sizes promised would not overflow; UBSan checks that promise.
//
// clla reports bad input with die() (print, exit 1). Here die() records the message and
// jumps back to the fuzzer, so a rejection is a normal outcome; the script compiles
// common/util.c with its own die and warn renamed away so that these definitions are used.
// The jump leaks what the rejected parse had allocated, so leak detection is off.
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/config.h"
#include "model/model.h"

static jmp_buf on_die;
static char message[1024];

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    if (!message[0]) abort();   // a rejection must say why
    longjmp(on_die, 1);
}

void warn(const char *fmt, ...) { (void)fmt; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    // split off the --set lines
    char *sets[16];
    int n_sets = 0;
    char *marker = strstr(text, "\n#set\n");
    if (marker) {
        *marker = 0;
        for (char *line = strtok(marker + 6, "\n"); line && n_sets < 16; line = strtok(NULL, "\n")) sets[n_sets++] = line;
    }
    static Config cfg;   // static: the jump must not leave it in a dead frame
    static Model m;
    memset(&m, 0, sizeof(m));
    message[0] = 0;
    if (setjmp(on_die) == 0) {
        config_from_json(&cfg, text, "fuzz", n_sets, sets);
        // lay out what was accepted, when it is small enough to build quickly; the sizes of big
        // ones are what config_check_sizes bounds, and it ran inside config_from_json
        const ModelConfig *c = &cfg.model;
        long long layers = c->num_hidden_layers, experts = c->n_routed_experts > 0 ? c->n_routed_experts : 0;
        if (layers * (experts + 1) <= 4096) {
            model_build_table(&m, c, 2);
            model_layout_acts(&m, cfg.train.micro_batch, cfg.train.seq_len, 2);
            model_free(&m);
        }
    }
    free(text);
    return 0;
}
