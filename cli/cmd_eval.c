// clla eval: mean next-token loss and perplexity of a saved model over the windows of token
// data, scored by eval/evaluate.c exactly as training-time validation scores them.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "eval/evaluate.h"
#include "eval/through_cache.h"
#include "model/model.h"
#include "model/model_dir.h"
#include "cli/commands.h"
#include "cli/device.h"

static const ArgSpec SPECS[] = {
    {"checkpoint", 1, "model directory: a run directory, a checkpoint or a package (required)", "DIR"},
    {"data", 1, "token file or shards (required)", "PATH"},
    {"batch", 1, "sequences per forward (default train.micro_batch)", "B"},
    {"seq", 1, "tokens per sequence (default train.seq_len)", "T"},
    {"max-batches", 1, "score the first N batches of windows (default: every window)", "N"},
    {"device", 1, "cpu (default), cpu-bf16 (CPU emulating the CUDA bf16 roundings) or cuda", "cpu|cpu-bf16|cuda"},
    {"json", 0, "print one JSON object", NULL},
    {"through-cache", 0, "score through the KV cache: the full forward with each codec's round trip, and token by token through the decoder", NULL},
    {"cache-codec", ARG_REPEAT, "with --through-cache: cache codec, CODEC or PART=CODEC (repeatable): fp32, bf16, int_group:bits=B,group=G", "SPEC"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))


static void show_progress(long long done, long long total, void *ctx);

typedef struct CacheScore {
    Model *model;
    const CacheLayout *layout;
    int T;
    CacheLoss acc;
} CacheScore;

static void score_through_cache(const int32_t *in, const int32_t *tg, int rows, void *ctx) {
    CacheScore *cs = ctx;
    eval_through_cache(cs->model, cs->layout, in, tg, rows, cs->T, &cs->acc);
}

// --through-cache: both losses, the cache's bytes per token and codecs.
static int eval_cache(Model *model, const ModelDir *md, const Args *a, DataLoader *dl, int B, int T, long long max_batches,
                      int json, int tty, const char *data) {
    const char *specs[256];
    int n_specs = args_get_all(a, SPECS, N_SPECS, "cache-codec", specs, 256);
    CacheLayout layout;
    cache_layout_copy(&layout, &md->cache);
    char err[512];
    for (int i = 0; i < n_specs; i++)
        if (cache_layout_apply_spec(&layout, specs[i], err, sizeof(err)) != 0) die("--cache-codec '%s': %s", specs[i], err);
    CacheScore cs = {model, &layout, T, {0, 0, 0}};
    EvalResult r = {0};
    double t0 = now_seconds();
    eval_for_each_batch(dl, B, T, max_batches * B, score_through_cache, &cs, tty ? show_progress : NULL, NULL, &r);
    if (tty) fprintf(stderr, " | %.0f tok/s\n", (double)cs.acc.count / (now_seconds() - t0));
    if (r.failed) die("%s", r.err);
    double full = cs.acc.count ? cs.acc.full_sum / cs.acc.count : 0, dec = cs.acc.count ? cs.acc.decode_sum / cs.acc.count : 0;
    char codecs[512];
    model_dir_describe_cache(&layout, codecs, sizeof(codecs));
    size_t bpt = cache_layout_bytes_per_token(&layout);
    int finite = isfinite(full) && isfinite(dec);
    if (json) {
        if (finite) printf("{\"loss\":%.6f,\"perplexity\":%.4f,\"loss_decoded\":%.6f,\"perplexity_decoded\":%.4f", full, exp(full), dec, exp(dec));
        else printf("{\"loss\":null,\"perplexity\":null,\"loss_decoded\":null,\"perplexity_decoded\":null");
        printf(",\"cache_bytes_per_token\":%zu,\"cache\":\"%s\",\"tokens\":%lld,\"windows\":%lld,\"batches\":%lld}\n", bpt, codecs,
               cs.acc.count, r.windows, r.batches);
    } else {
        printf("through the cache (%s, %zu bytes/token):\n", codecs, bpt);
        printf("  full forward with the codecs' round trips: loss %.4f | perplexity %.3f\n", full, exp(full));
        printf("  decoded token by token through the cache:  loss %.4f | perplexity %.3f\n", dec, exp(dec));
        printf("  %lld tokens in %lld windows of %d\n", cs.acc.count, r.windows, T);
    }
    cache_layout_free(&layout);
    if (!finite) {
        fflush(stdout);
        die("the model's loss on '%s' is not finite: its weights have diverged", data);
    }
    return 0;
}

static void show_progress(long long done, long long total, void *ctx) {
    (void)ctx;
    fprintf(stderr, "\reval %lld/%lld windows", done, total);
}

int cmd_eval(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla eval --checkpoint DIR --data FILE [--json] [--batch B] [--seq T] [--max-batches N]\n"
               "                 [--through-cache [--cache-codec SPEC ...]]\n"
               "Mean next-token loss and perplexity over the data's windows, in the order and with the\n"
               "seed (train.seed) that training-time validation uses; the last batch may be partial.\n"
               "Exits 1 when the loss is not finite (--json prints it as null).",
               NULL, NULL, 0);
    const char *dir = args_get(&a, SPECS, N_SPECS, "checkpoint"), *data = args_get(&a, SPECS, N_SPECS, "data");
    if (!dir || !data) die("clla eval needs --checkpoint DIR and --data FILE: see clla eval --help");
    // numbers first: a bad one is refused before the model is read
    const char *bs = args_get(&a, SPECS, N_SPECS, "batch"), *ts = args_get(&a, SPECS, N_SPECS, "seq");
    const char *mb = args_get(&a, SPECS, N_SPECS, "max-batches");
    int B = bs ? (int)opt_i64("--batch", bs, 1, 1 << 20) : 0;
    int T = ts ? (int)opt_i64("--seq", ts, 1, 1 << 30) : 0;
    long long max_batches = mb ? opt_i64("--max-batches", mb, 1, 1LL << 40) : 0;
    Config cfg;
    Model model;
    ModelDir md;
    model_dir_load(&md, &model, &cfg, dir, device_backend(args_get(&a, SPECS, N_SPECS, "device")), 0, NULL);
    if (!B) B = cfg.train.micro_batch;
    if (!T) T = cfg.train.seq_len;
    if (T > cfg.model.max_position_embeddings) die("--seq %d exceeds max_position_embeddings %d", T, cfg.model.max_position_embeddings);
    // data made with another tokenizer than the model's training data is refused by the loader
    unsigned long long tok_hash = 0;
    if (cfg.train.tokenizer_hash[0] && loader_parse_tokenizer_hash(cfg.train.tokenizer_hash, &tok_hash) != 0)
        die("'%s/config.json': train.tokenizer_hash '%s' is not 16 hex digits", dir, cfg.train.tokenizer_hash);
    DataLoader *dl = eval_open(data, T, cfg.train.seed, cfg.model.vocab_size, tok_hash);
    int json = args_get(&a, SPECS, N_SPECS, "json") != NULL, tty = !json && isatty(2);
    if (args_get(&a, SPECS, N_SPECS, "through-cache")) {
        int rc = eval_cache(&model, &md, &a, dl, B, T, max_batches, json, tty, data);
        loader_close(dl);
        model_dir_free(&md);
        model_free(&model);
        return rc;
    }
    if (args_get(&a, SPECS, N_SPECS, "cache-codec")) die("--cache-codec applies with --through-cache: add it, or drop --cache-codec");
    double t0 = now_seconds();
    EvalResult r = evaluate(&model, dl, B, T, max_batches * B, tty ? show_progress : NULL, NULL);
    if (tty) fprintf(stderr, " | %.0f tok/s\n", (double)r.tokens / (now_seconds() - t0));
    if (r.failed) die("%s", r.err);
    int finite = isfinite(r.loss);
    if (json) {
        // JSON has no NaN or Infinity: a non-finite loss is null (and the exit status says so)
        if (finite) printf("{\"loss\":%.6f,\"perplexity\":%.4f", r.loss, exp(r.loss));
        else printf("{\"loss\":null,\"perplexity\":null");
        printf(",\"tokens\":%lld,\"windows\":%lld,\"batches\":%lld}\n", r.tokens, r.windows, r.batches);
    } else {
        printf("loss %.4f | perplexity %.3f | %lld tokens in %lld windows of %d (%lld batches of up to %d)\n", r.loss,
               exp(r.loss), r.tokens, r.windows, T, r.batches, B);
    }
    loader_close(dl);
    model_dir_free(&md);
    model_free(&model);
    if (!finite) {
        fflush(stdout);
        die("the model's loss on '%s' is not finite (%g): its weights have diverged", data, r.loss);
    }
    return 0;
}
