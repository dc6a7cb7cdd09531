// clla eval: mean next-token loss and perplexity of a saved model over consecutive
// windows of a token file.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "data/loader.h"
#include "model/model.h"
#include "train/commands.h"
#include "train/device.h"
#include "train/run_files.h"

static const ArgSpec SPECS[] = {
    {"checkpoint", 1, "model directory with config.json and model.safetensors (required)", "DIR"},
    {"data", 1, "token file (required)", "PATH"},
    {"batch", 1, "sequences per forward (default train.micro_batch)", "B"},
    {"seq", 1, "tokens per sequence (default train.seq_len)", "T"},
    {"max-batches", 1, "stop after this many batches (default: the whole file)", "N"},
    {"device", 1, "cpu (default), cpu-bf16 (CPU emulating the CUDA bf16 roundings) or cuda", "cpu|cpu-bf16|cuda"},
    {"json", 0, "print one JSON object", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

int cmd_eval(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla eval --checkpoint DIR --data FILE [--json] [--batch B] [--seq T] [--max-batches N]\n"
               "Mean next-token loss and perplexity over the file's consecutive windows.",
               NULL, NULL, 0);
    const char *dir = args_get(&a, SPECS, N_SPECS, "checkpoint"), *data = args_get(&a, SPECS, N_SPECS, "data");
    if (!dir || !data) die("clla eval needs --checkpoint DIR and --data FILE: see clla eval --help");
    // numbers first: a bad one is refused before the model is read
    const char *bs = args_get(&a, SPECS, N_SPECS, "batch"), *ts = args_get(&a, SPECS, N_SPECS, "seq");
    const char *mb = args_get(&a, SPECS, N_SPECS, "max-batches");
    int B = bs ? (int)opt_i64("--batch", bs, 1, 2147483647) : 0;
    int T = ts ? (int)opt_i64("--seq", ts, 1, 2147483647) : 0;
    long long max_batches = mb ? opt_i64("--max-batches", mb, 1, INT64_MAX) : 0;
    Config cfg;
    Model model;
    load_model_dir(&model, &cfg, dir, device_backend(args_get(&a, SPECS, N_SPECS, "device")), 0, NULL);
    if (!B) B = cfg.train.micro_batch;
    if (!T) T = cfg.train.seq_len;
    if ((long long)B * T > 2147483647) die("--batch %d x --seq %d is more than 2147483647 tokens per batch: make them smaller", B, T);
    if (T > cfg.model.max_position_embeddings) die("--seq %d exceeds max_position_embeddings %d", T, cfg.model.max_position_embeddings);
    LoaderOptions lo = {.B = B, .T = T, .seed = 0, .rank = 0, .world = 1, .vocab_size = cfg.model.vocab_size};
    DataLoader *dl = loader_open(data, &lo);
    long long n = loader_num_batches(dl);
    if (max_batches && max_batches < n) n = max_batches;
    model_set_batch(&model, B, T);
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    double sum = 0, t0 = now_seconds();
    for (long long i = 0; i < n; i++) {
        loader_next(dl, in, tg);
        sum += model_forward(&model, in, tg);
        if (!args_get(&a, SPECS, N_SPECS, "json") && isatty(2))
            fprintf(stderr, "\reval %lld/%lld batches | %.0f tok/s", i + 1, n, (double)(i + 1) * B * T / (now_seconds() - t0));
    }
    if (isatty(2)) fprintf(stderr, "\n");
    double loss = sum / (double)n;
    long long tokens = n * (long long)B * T;
    if (args_get(&a, SPECS, N_SPECS, "json"))
        printf("{\"loss\":%.6f,\"perplexity\":%.4f,\"tokens\":%lld,\"batches\":%lld}\n", loss, exp(loss), tokens, n);
    else
        printf("loss %.4f | perplexity %.3f | %lld tokens in %lld batches of %dx%d\n", loss, exp(loss), tokens, n, B, T);
    free(in); free(tg);
    loader_close(dl);
    model_free(&model);
    return 0;
}
