// clla: one binary, one subcommand per job (docs/DESIGN.md section 5).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/one_process.h"
#include "common/unfinished.h"
#include "common/version.h"

typedef struct Subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    int ranks;   // 1: runs data parallel under mpirun (train; eval checks its own modes); 0: one process only
} Subcommand;

static const Subcommand SUBCOMMANDS[] = {
    {"prep", cmd_prep, "tokenize corpus files into train/validation token shards", 0},
    {"tokenizer", cmd_tokenizer, "train a BPE vocabulary, encode/decode text, import GPT-2's", 0},
    {"train", cmd_train, "train a model from a config on token data", 1},
    {"eval", cmd_eval, "loss and perplexity of a saved model on token data", 1},
    {"info", cmd_info, "parameter counts, memory and KV-cache bytes of a config", 0},
    {"generate", cmd_generate, "generate text from a model: batched prompts, greedy or sampled, through the KV cache", 0},
    {"export", cmd_export, "write an inference package (weights fp32/bf16, cache codecs, tokenizer) from a checkpoint", 0},
    {"calibrate", cmd_calibrate, "fit learned cache codecs (cq, kvquant, qet) on data and write a package that carries them", 0},
    {"init", cmd_init, "write a freshly initialized model (config.json + model.safetensors)", 0},
    {"debug-step", cmd_debug_step, "one forward+backward on a batch, dumped for the PyTorch twin", 0},
};
static const int N_SUBCOMMANDS = (int)(sizeof(SUBCOMMANDS) / sizeof(SUBCOMMANDS[0]));

// At exit, after every other handler (registered first, so run last): what the command printed
// must have reached stdout's file. A full disk or a failing device (> /dev/full) otherwise left a
// truncated ids file or table behind an exit status of 0. _exit is allowed in a handler; the
// status becomes 1 and the message says why.
static void check_stdout_at_exit(void) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return;
    const int e = errno;
    fprintf(stderr, "clla: error: writing the output to stdout failed: %s: what was printed is incomplete\n",
            e ? strerror(e) : "write error");
    _exit(1);
}

static void usage(FILE *out) {
    fprintf(out, "usage: clla <command> [options]   (clla <command> --help for its options; clla --version)\n\ncommands:\n");
    for (int i = 0; i < N_SUBCOMMANDS; i++)
        fprintf(out, "  %-12s %s\n", SUBCOMMANDS[i].name, SUBCOMMANDS[i].summary);
}

int main(int argc, char **argv) {
    // A file-size limit (ulimit -f) fails the write that crosses it with EFBIG, which every
    // command's checked writes report in one line and clean up after, instead of killing the
    // process with its temporary files left behind.
    signal(SIGXFSZ, SIG_IGN);
    atexit(check_stdout_at_exit);
    // an output not finished when the process ends (an error, Ctrl-C, a kill by SIGTERM) is
    // removed, not left half-written beside the user's files (common/unfinished.h)
    unfinished_install();
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        version_print(stdout);
        return 0;
    }
    for (int i = 0; i < N_SUBCOMMANDS; i++) {
        if (strcmp(argv[1], SUBCOMMANDS[i].name)) continue;
        if (!SUBCOMMANDS[i].ranks) {
            char what[64];
            snprintf(what, sizeof(what), "clla %s", SUBCOMMANDS[i].name);
            cli_one_process(what);
        }
        return SUBCOMMANDS[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "clla: error: unknown command '%s': run 'clla --help' for the list\n", argv[1]);
    return 2;
}
