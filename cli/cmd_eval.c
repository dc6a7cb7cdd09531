// clla eval: mean next-token loss and perplexity of a saved model over the windows of token
// data, scored by eval/evaluate.c exactly as training-time validation scores them; with --bench,
// multiple-choice benchmarks scored through the KV cache (eval/bench.c, docs/BENCHMARKS.md).
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/json_strict.h"
#include "common/num.h"
#include "common/util.h"
#include "data/bytes.h"
#include "data/corpus.h"
#include "data/utf8.h"
#include "eval/bench.h"
#include "eval/evaluate.h"
#include "eval/perplexity.h"
#include "eval/through_cache.h"
#include "model/model.h"
#include "model/model_dir.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/one_process.h"
#include "cli/cache_codec_args.h"
#include "cli/model_source.h"
#include "cli/open_tokenizer.h"
#include "train/dist.h"
#include "train/progress.h"

// A string field of the JSON output: a path or a name holds what bytes the file system has, and
// bytes that are not UTF-8 (a file named with 0xFF) made the line no JSON: each becomes U+FFFD, as
// generate --json does with its text.
static void add_text(cJSON *o, const char *key, const char *s) {
    ByteVec v = {0};
    utf8_sanitize(&v, (const uint8_t *)s, strlen(s));
    bytevec_append(&v, "", 1);
    cJSON_AddStringToObject(o, key, (const char *)v.v);
    free(v.v);
}
static const ArgSpec SPECS[] = {
    {"checkpoint", 1, "model directory: a run directory, a checkpoint or a package (required)", "DIR"},
    {"data", 1, "token file or shards (required, unless --bench)", "PATH"},
    {"batch", 1, "sequences per forward (default train.micro_batch)", "B"},
    {"seq", 1, "tokens per sequence (default train.seq_len)", "T"},
    {"max-batches", 1, "score the first N batches of windows (default: every window)", "N"},
    {"device", 1, "cpu (default), cpu-bf16 (CPU emulating the CUDA bf16 roundings) or cuda", "cpu|cpu-bf16|cuda"},
    {"json", 0, "print one JSON object", NULL},
    {"through-cache", 0, "score through the KV cache (with --data or --ppl): the full forward with each codec's round trip (kivi, qjl: a block per forward through the cache), and token by token through the decoder", NULL},
    {"cache-codec", ARG_REPEAT, "with --through-cache or --bench: cache codec, CODEC or PART=CODEC (repeatable): fp32, bf16, int_group:bits=B,group=G, kivi:bits=B,group=G,residual=R, qjl:m=M,... (cq, qet, kvquant: a package from clla calibrate)", "SPEC"},
    {"bench", ARG_REPEAT, "score a multiple-choice benchmark (generic or HellaSwag JSONL; a directory: its *.jsonl files) through the KV cache; repeatable", "FILE|DIR"},
    {"shots", 1, "with --bench: few-shot examples before each item (default 0)", "K"},
    {"seed", 1, "with --bench: seed of the few-shot draw (default 1234)", "S"},
    {"limit", 1, "with --bench: score the first N items of each benchmark", "N"},
    {"skip-bad", 0, "with --bench: warn about bad lines and score the others (default: stop at the first)", NULL},
    {"full-forward", 0, "with --bench: score with the full-sequence forward instead of the decoder (the check path)", NULL},
    {"tokenizer", 1, "with --bench or --ppl: tokenizer file (default: the package's, or the run's train.tokenizer)", "FILE"},
    {"items-out", 1, "with --bench: write every item's per-choice log-likelihoods as JSONL to FILE", "FILE"},
    {"overwrite", 0, "with --items-out: replace an existing FILE", NULL},
    {"ppl", 1, "perplexity of a text (plain: the whole file; .jsonl or .json: the \"text\" of each line, joined by <|endoftext|>) or a token file (.bin) in sliding windows", "FILE"},
    {"stride", 1, "with --ppl: tokens between window starts (default --seq: windows do not overlap)", "S"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// Progress of the windows (train/progress.h, progress_due), with the rate and the ETA.
typedef struct WindowProgress {
    double t0, last;
    int tty;
} WindowProgress;

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

// The model directory's cache layout with every --cache-codec applied in order.
static void layout_from_args(CacheLayout *layout, const ModelDir *md, const Args *a) {
    const char *specs[ARGS_MAX_REPEATS];
    int n_specs = args_get_all(a, SPECS, N_SPECS, "cache-codec", specs, ARGS_MAX_REPEATS);
    cache_layout_copy(layout, &md->cache);
    apply_cache_codec_args(layout, specs, n_specs);
}

// Bits per element of every stored part, both ways: everything the cache stored, measured from
// the decoder's blocks at the end of each window (acc->stored: a block codec's fp16 window of the
// block being filled and kvquant's variable-size records included, so it depends on the window
// length), the same with the codec's fitted tables (codebooks, datatypes, ranges: fp16 values, as
// the papers store them) amortized over the tokens this evaluation stored, and as the codec's
// paper counts (codec_bits_paper); the fitted values a part's codec keeps over all its streams,
// and over all parts as stored: as JSON members, or as text lines.
// ,"LOSS":x,"PPL":exp(x) (no comma first when `first`): JSON has no NaN or Infinity, so a value
// that is not finite is null, the loss when the model diverged (the exit status says so), the
// perplexity also when exp overflows (a finite loss above about 709)
static void print_json_loss(const char *loss_key, const char *ppl_key, double loss, int first) {
    const double ppl = exp(loss);
    printf(first ? "\"%s\":" : ",\"%s\":", loss_key);
    if (isfinite(loss)) printf("%.6f", loss);
    else printf("null");
    printf(",\"%s\":", ppl_key);
    if (isfinite(ppl)) printf("%.4f", ppl);
    else printf("null");
}

static void print_bits(const CacheLayout *cl, int json, const CacheLoss *acc) {
    long long elements = 0;
    double bytes = 0;
    for (int s = 0; s < cl->n_streams; s++) elements += cl->part[cl->streams[s].part].width;
    for (int p = 0; p < N_PARTS; p++) bytes += acc->stored[p];
    const double tokens = acc->stored_tokens ? (double)acc->stored_tokens : 1;
    double all = elements ? 8.0 * bytes / ((double)elements * tokens) : 0;
    if (json) printf(",\"cache_bytes_stored_per_token\":%.4f,\"bits_per_element\":{\"all_parts_stored\":%.4f", bytes / tokens, all);
    else printf("  bits/element: %.3f over all parts as stored (%.2f bytes a token, measured)", all, bytes / tokens);
    for (int p = 0; p < N_PARTS; p++) {
        if (!cl->part[p].present) continue;
        const Codec *c = &cl->part[p].codec;
        int W = cl->part[p].width, streams = 0;
        for (int s = 0; s < cl->n_streams; s++) streams += cl->streams[s].part == p;
        if (streams == 0 || W == 0) continue;   // a part no layer stores: no bits per element to print (0/0)
        double stored = 8.0 * acc->stored[p] / ((double)W * streams * tokens);
        long long fitted = 0;
        for (int s = 0; s < cl->n_streams; s++) fitted += cl->streams[s].part == p ? codec_fit_elements(c, W) : 0;
        double with_tables = 8.0 * (acc->stored[p] + 2.0 * (double)fitted) / ((double)W * streams * tokens);
        if (json)
            printf(",\"%s\":{\"stored\":%.4f,\"paper\":%.4f,\"fitted_values\":%lld,\"stored_with_tables\":%.4f}", cache_part_name(p),
                   stored, codec_bits_paper(c, W), fitted, with_tables);
        else if (fitted)
            printf("; %s %.3f stored (%.3f with its tables over these %.0f tokens), %.3f as its paper counts", cache_part_name(p), stored,
                   with_tables, tokens, codec_bits_paper(c, W));
        else
            printf("; %s %.3f stored, %.3f as its paper counts", cache_part_name(p), stored, codec_bits_paper(c, W));
    }
    printf(json ? "}" : "\n");
}

// --through-cache: both losses, the cache's bytes per token and codecs.
static int eval_cache(Model *model, const ModelDir *md, const Args *a, DataLoader *dl, int B, int T, long long max_batches,
                      int json, int tty, const char *data) {
    CacheLayout layout;
    layout_from_args(&layout, md, a);
    CacheScore cs = {.model = model, .layout = &layout, .T = T};
    EvalResult r = {0};
    double t0 = now_seconds();
    WindowProgress pg = {t0, t0, tty};
    eval_for_each_batch(dl, B, T, max_batches * B, score_through_cache, &cs, show_progress, &pg, &r);
    if (tty) fprintf(stderr, " | %.0f tok/s\n", (double)cs.acc.count / (now_seconds() - t0));
    if (r.failed) die("%s", r.err);
    double full = cs.acc.count ? cs.acc.full_sum / cs.acc.count : 0, dec = cs.acc.count ? cs.acc.decode_sum / cs.acc.count : 0;
    char codecs[512];
    model_dir_describe_cache(&layout, codecs, sizeof(codecs));
    double bpt = cache_layout_bytes_per_token(&layout);
    int finite = isfinite(full) && isfinite(dec);
    if (json) {
        printf("{");
        print_json_loss("loss", "perplexity", full, 1);
        print_json_loss("loss_decoded", "perplexity_decoded", dec, 0);
        printf(",\"cache_bytes_per_token\":%.10g,\"cache\":\"%s\",\"tokens\":%lld,\"windows\":%lld,\"batches\":%lld", bpt, codecs,
               cs.acc.count, r.windows, r.batches);
        print_bits(&layout, 1, &cs.acc);
        printf("}\n");
    } else {
        printf("through the cache (%s, %.10g bytes/token):\n", codecs, bpt);
        printf("  %s: loss %.4f | perplexity %.3f\n", cache_layout_has_blocks(&layout) ? "chunked prefill through the cache, a block per forward"
               : "full forward with the codecs' round trips", full, exp(full));
        printf("  decoded token by token through the cache:  loss %.4f | perplexity %.3f\n", dec, exp(dec));
        print_bits(&layout, 0, &cs.acc);
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
    WindowProgress *pg = ctx;
    if ((!pg->tty && done >= total) || !progress_due(pg->tty, &pg->last)) return;
    const double dt = now_seconds() - pg->t0;
    char eta[32] = "?";
    const double rate = dt > 0 ? (double)done / dt : 0;
    if (rate > 0) format_duration(eta, sizeof(eta), (double)(total - done) / rate);
    fprintf(stderr, "%seval %lld/%lld windows | %.2f windows/s | ETA %s%s", pg->tty ? "\r" : "", done, total, rate, eta,
            pg->tty ? "" : "\n");
}

// ---------------------------------------------------------------- --ppl


// The token ids of --ppl FILE: a .bin file of little-endian uint32 ids, else text encoded with
// the model's tokenizer (.jsonl: each line's "text", documents joined by <|endoftext|> when the
// tokenizer has it). Dies with one line on a bad file.
static int32_t *ppl_tokens(const char *path, const Args *a, const ModelDir *md, int vocab, const char *model_hash, long long *n) {
    size_t len;
    char *buf = read_file(path, &len);
    if (!buf) die("cannot read --ppl '%s': %s", path, strerror(errno));
    int32_t *ids;
    if (path_has_ext(path, ".bin")) {
        if (len % 4) die("--ppl '%s': %zu bytes is not a whole number of uint32 token ids", path, len);
        *n = (long long)(len / 4);
        // converted in place: the file's buffer becomes the ids (one copy of the file held)
        ids = (int32_t *)(void *)buf;
        for (long long i = 0; i < *n; i++) {
            const uint32_t id = get_le32((const uint8_t *)buf + 4 * i);
            if (id >= (uint32_t)vocab) die("--ppl '%s': token %lld is id %u, outside the model's vocabulary of %d", path, i, id, vocab);
            ids[i] = (int32_t)id;
        }
        return ids;
    }
    if (memchr(buf, 0, len)) die("--ppl '%s' holds a NUL byte: not a text file (token ids go in a .bin file)", path);
    Tokenizer *tok = open_tokenizer(args_get(a, SPECS, N_SPECS, "tokenizer"), md, vocab, model_hash);
    TokEncoder *enc = tok_encoder_new(tok);
    U32Vec out = {0};
    if (corpus_path_is_jsonl(path)) {   // as prep reads a corpus
        uint32_t eot = tok_special_id(tok, "<|endoftext|>");
        long long line = 0, docs = 0;
        size_t pos = 0, ln;
        for (char *l; (l = buf_next_line(buf, len, &pos, &ln));) {
            line++;
            if (!l[strspn(l, " \t\r")]) continue;
            char jerr[256];
            cJSON *j = json_parse_line(l, strlen(l), jerr, sizeof(jerr));   // as prep reads JSONL
            if (!j) die("--ppl '%s' line %lld: %s", path, line, jerr);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text");
            if (!cJSON_IsString(t)) die("--ppl '%s' line %lld: not a JSON object with a \"text\" string", path, line);
            // an empty document adds nothing, not even a separator, as prep skips it (docs/FORMAT.md)
            if (t->valuestring[0]) {
                if (docs++ && eot != TOK_NONE) u32vec_push(&out, eot);
                tok_encode(enc, t->valuestring, strlen(t->valuestring), 0, &out);
            }
            cJSON_Delete(j);
        }
    } else {
        tok_encode(enc, buf, len, 0, &out);
    }
    tok_encoder_free(enc);
    tok_free(tok);
    free(buf);
    *n = (long long)out.n;
    ids = xmalloc((out.n ? out.n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < out.n; i++) ids[i] = (int32_t)out.v[i];
    free(out.v);
    return ids;
}

static int eval_ppl(const Args *a, const char *dir) {
    // (--overwrite alone is refused before: it needs --items-out, which is refused here)
    static const char *NOT_WITH[] = {"data", "bench", "max-batches", "shots", "seed", "limit", "skip-bad", "full-forward", "items-out"};
    for (size_t i = 0; i < sizeof(NOT_WITH) / sizeof(NOT_WITH[0]); i++)
        if (args_get(a, SPECS, N_SPECS, NOT_WITH[i])) die("--%s does not apply to --ppl: drop one of them", NOT_WITH[i]);
    if (!dir) die("clla eval --ppl needs --checkpoint DIR: see clla eval --help");
    const int through = args_get(a, SPECS, N_SPECS, "through-cache") != NULL;
    if (!through && args_get(a, SPECS, N_SPECS, "cache-codec"))
        die("--cache-codec applies with --through-cache: add it, or drop --cache-codec");
    const char *path = args_get(a, SPECS, N_SPECS, "ppl");
    const char *bs = args_get(a, SPECS, N_SPECS, "batch"), *ts = args_get(a, SPECS, N_SPECS, "seq"), *ss = args_get(a, SPECS, N_SPECS, "stride");
    int B = bs ? (int)opt_i64("--batch", bs, 1, 1 << 20) : 0, T = ts ? (int)opt_i64("--seq", ts, 1, 1 << 30) : 0;
    int S = ss ? (int)opt_i64("--stride", ss, 1, 1 << 30) : 0;
    Config cfg;
    Model model;
    ModelDir md;
    model_source_load(&md, &model, &cfg, dir, device_backend(args_get(a, SPECS, N_SPECS, "device")));
    // the model as it serves: an MoE layer without its training capacity, whose drops would
    // depend on how many windows share a forward (--batch); no gradient buffers
    model.inference = 1;
    if (!B) B = cfg.train.micro_batch;
    if (!T) T = cfg.train.seq_len;
    if (T > cfg.model.max_position_embeddings) die("--seq %d exceeds max_position_embeddings %d", T, cfg.model.max_position_embeddings);
    if (!S) S = T;
    if (S > T) die("--stride %d is longer than the window (--seq %d): windows would skip tokens; use a stride of at most %d", S, T, T);
    long long n;
    int32_t *ids = ppl_tokens(path, a, &md, cfg.model.vocab_size, cfg.train.tokenizer_hash, &n);
    if (n < 2) die("--ppl '%s' holds %lld tokens: perplexity needs at least 2", path, n);
    int json = args_get(a, SPECS, N_SPECS, "json") != NULL, tty = !json && isatty(2);
    double t0 = now_seconds();
    CacheLayout layout;
    CacheLoss acc = {0};
    if (through) layout_from_args(&layout, &md, a);
    // as --data: one rewritten line on a terminal, a plain line every PROGRESS_LOG_SECONDS in a log
    // (it printed nothing at all unless stderr was a terminal)
    WindowProgress pg = {t0, t0, tty};
    EvalResult r = through ? eval_strided_cache(&model, &layout, ids, n, B, T, S, show_progress, &pg, &acc)
                           : eval_strided(&model, ids, n, B, T, S, show_progress, &pg);
    if (tty) fprintf(stderr, " | %.0f tok/s\n", (double)r.tokens / (now_seconds() - t0));
    const double dec = acc.count ? acc.decode_sum / (double)acc.count : 0;
    int finite = isfinite(r.loss) && isfinite(dec);
    char codecs[512] = "";
    if (through) model_dir_describe_cache(&layout, codecs, sizeof(codecs));
    if (json) {
        printf("{");
        print_json_loss("loss", "perplexity", r.loss, 1);
        if (through) {
            print_json_loss("loss_decoded", "perplexity_decoded", dec, 0);
            printf(",\"cache\":\"%s\"", codecs);
        }
        printf(",\"tokens\":%lld,\"windows\":%lld,\"seq\":%d,\"stride\":%d", r.tokens, r.windows, T, S);
        if (through) print_bits(&layout, 1, &acc);
        printf("}\n");
    } else {
        printf("loss %.4f | perplexity %.3f | %lld tokens of '%s' scored in %lld windows of %d, stride %d\n", r.loss, exp(r.loss),
               r.tokens, path, r.windows, T, S);
        if (through) {
            printf("through the cache (%s): decoded token by token: loss %.4f | perplexity %.3f\n", codecs, dec, exp(dec));
            print_bits(&layout, 0, &acc);
        }
    }
    if (through) cache_layout_free(&layout);
    free(ids);
    model_dir_free(&md);
    model_free(&model);
    if (!finite) {
        fflush(stdout);
        die("the model's loss on '%s' is not finite (%g): its weights have diverged", path, r.loss);
    }
    return 0;
}

// ---------------------------------------------------------------- --bench

typedef struct BenchRun {
    char *name;                  // the file's name without folder and extension
    long long n, skipped;
    long long not_finite;        // items with a log-likelihood that is not finite (a diverged model)
    double acc, acc_se, acc_norm, acc_norm_se, seconds, forward_seconds;
} BenchRun;

static char *bench_name(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *name = xstrdup(base), *dot = strrchr(name, '.');
    if (dot && dot != name) *dot = '\0';
    return name;
}

// One progress line of a benchmark: rewritten on a terminal (tty), a line of its own in a log.
static void bench_progress(const char *name, long long done, long long total, double t0, int final, int tty) {
    double dt = now_seconds() - t0, rate = dt > 0 ? done / dt : 0;
    char eta[32] = "?";
    if (rate > 0) format_duration(eta, sizeof(eta), (double)(total - done) / rate);
    fprintf(stderr, "%sbench %s: %lld/%lld items | %.1f items/s | ETA %s%s", tty ? "\r" : "", name, done, total, rate, eta,
            final || !tty ? "\n" : "");
}

static void add_number_or_null(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

// A benchmark read and its prompts built, before any forward: bad input in any file stops the
// run before anything is scored or printed.
typedef struct BenchJob {
    Bench b;
    int *scored;     // indices of the items scored (not dev), the first --limit
    long long n;
    char **prompts;  // per scored item
} BenchJob;

static void prepare_bench(BenchJob *j, BenchScorer *sc, const char *path, int K, uint64_t seed, long long limit, int skip_bad) {
    char err[1024];
    if (bench_load(&j->b, path, skip_bad, err, sizeof(err)) != 0) die("%s", err);
    j->scored = xmalloc((size_t)j->b.n_items * sizeof(int));
    j->n = 0;
    for (int i = 0; i < j->b.n_items && (!limit || j->n < limit); i++)
        if (!j->b.items[i].dev) j->scored[j->n++] = i;
    j->prompts = xmalloc((size_t)j->n * sizeof(char *));
    for (long long i = 0; i < j->n; i++)
        if (!(j->prompts[i] = bench_prompt(&j->b, j->scored[i], K, seed, err, sizeof(err)))) die("%s", err);
    // every item tokenized once here too, so that one the model cannot read stops the run now
    for (long long i = 0; i < j->n; i++) {
        const BenchItem *it = &j->b.items[j->scored[i]];
        if (bench_check_item(sc, it, j->prompts[i], err, sizeof(err)) != 0) die("%s:%d: %s", path, it->line, err);
    }
}

// Items in batches: sorted by prompt and longest choice length (bytes; ties by file order), cut into
// runs of at most BENCH_BATCH_SEQS choices, so a batch's sequences have similar lengths and few
// padded positions. The batches depend only on the benchmark, never on the ranks.
typedef struct ItemLen { long long len; long long i; } ItemLen;
static int by_len(const void *a, const void *b) {
    const ItemLen *x = a, *y = b;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->i < y->i ? -1 : x->i > y->i);
}

// Scores a prepared benchmark's items, several per batch (bench_score_batch). Under mpirun the
// batches are dealt round-robin over the ranks, each rank scores its own, and every rank gathers
// all the scores (train/dist.h); totals and the per-item lines are then formed in file order from
// the gathered scores, so any number of ranks gives the same numbers. items_out: per-item lines,
// or NULL.
// progress: 0 none (the ranks but 0), 1 a line every PROGRESS_LOG_SECONDS (a log), 2 a terminal's
static void run_bench(BenchScorer *sc, BenchJob *j, Dist *dist, int progress, FILE *items_out, BenchRun *r) {
    const char *path = j->b.path;
    char err[1024];
    memset(r, 0, sizeof(*r));
    r->name = bench_name(path);
    r->skipped = j->b.n_skipped;
    int *scored = j->scored;
    char **prompts = j->prompts;
    long long n = j->n;
    ItemLen *order = xmalloc((size_t)(n ? n : 1) * sizeof(ItemLen));
    for (long long i = 0; i < n; i++) {
        const BenchItem *it = &j->b.items[scored[i]];
        size_t longest = it->continuation ? strlen(it->continuation) : 0;
        for (int c = 0; c < it->n_choices; c++) longest = strlen(it->choices[c]) > longest ? strlen(it->choices[c]) : longest;
        order[i] = (ItemLen){(long long)(strlen(prompts[i]) + longest), i};
    }
    qsort(order, (size_t)n, sizeof(ItemLen), by_len);
    long long *first = xmalloc((size_t)(n + 1) * sizeof(long long)), n_batches = 0;   // batch b: order[first[b], first[b + 1])
    for (long long k = 0; k < n;) {
        first[n_batches++] = k;
        int seqs = 0;
        while (k < n && seqs + j->b.items[scored[order[k].i]].n_choices <= BENCH_BATCH_SEQS) seqs += j->b.items[scored[order[k++].i]].n_choices;
    }
    first[n_batches] = n;
    BenchScores *mine = xcalloc((size_t)(n ? n : 1), sizeof(BenchScores)), *all = xcalloc((size_t)(n ? n : 1) * dist->world, sizeof(BenchScores));
    const BenchItem *bitems[BENCH_BATCH_SEQS];
    char *bprompts[BENCH_BATCH_SEQS];
    BenchScores bout[BENCH_BATCH_SEQS];
    long long done = 0, mine_total = 0;
    for (long long b = dist->rank; b < n_batches; b += dist->world) mine_total += first[b + 1] - first[b];
    double t0 = now_seconds(), f0 = bench_scorer_forward_seconds(sc), last = 0, last_log = t0;
    for (long long b = dist->rank; b < n_batches; b += dist->world) {
        int m = (int)(first[b + 1] - first[b]), bad = 0;
        for (int k = 0; k < m; k++) {
            long long i = order[first[b] + k].i;
            bitems[k] = &j->b.items[scored[i]];
            bprompts[k] = prompts[i];
        }
        if (bench_score_batch(sc, m, bitems, bprompts, bout, &bad, err, sizeof(err)) != 0) die("%s:%d: %s", path, bitems[bad]->line, err);
        for (int k = 0; k < m; k++) mine[order[first[b] + k].i] = bout[k];
        done += m;
        if (progress == 2 && (now_seconds() - last > 0.1 || done == mine_total)) {
            last = now_seconds();
            bench_progress(r->name, done, mine_total, t0, done == mine_total, 1);
        } else if (progress == 1 && done < mine_total && progress_due(0, &last_log)) {
            bench_progress(r->name, done, mine_total, t0, 0, 0);
        }
    }
    // every item is scored by one rank (its batch's): the others leave it zero
    dist_allgather_bytes(dist, mine, (size_t)(n ? n : 1) * sizeof(BenchScores), all);
    long long *owner = xmalloc((size_t)(n ? n : 1) * sizeof(long long));
    for (long long b = 0; b < n_batches; b++)
        for (long long k = first[b]; k < first[b + 1]; k++) owner[order[k].i] = b % dist->world;
    BenchTotals tot = {0};
    for (long long i = 0; i < n; i++) {
        const BenchItem *it = &j->b.items[scored[i]];
        const BenchScores s = all[(size_t)owner[i] * (size_t)(n ? n : 1) + (size_t)i];
        bench_totals_add(&tot, &s, it->label);
        int finite = 1;
        for (int c = 0; c < s.n_choices; c++) finite &= isfinite(s.loglik[c]) != 0;
        r->not_finite += !finite;
        if (items_out) {
            cJSON *o = cJSON_CreateObject();
            add_text(o, "benchmark", r->name);
            cJSON_AddNumberToObject(o, "line", it->line);
            cJSON_AddNumberToObject(o, "label", it->label);
            // no pick among scores that are not all finite (bench_pick would say choice 0)
            add_number_or_null(o, "pred", finite ? bench_pick(&s, 0) : NAN);
            add_number_or_null(o, "pred_norm", finite ? bench_pick(&s, 1) : NAN);
            cJSON *ll = cJSON_AddArrayToObject(o, "loglik"), *tk = cJSON_AddArrayToObject(o, "tokens"),
                  *by = cJSON_AddArrayToObject(o, "bytes");
            for (int c = 0; c < s.n_choices; c++) {
                cJSON_AddItemToArray(ll, isfinite(s.loglik[c]) ? cJSON_CreateNumber(s.loglik[c]) : cJSON_CreateNull());
                cJSON_AddItemToArray(tk, cJSON_CreateNumber(s.tokens[c]));
                cJSON_AddItemToArray(by, cJSON_CreateNumber(s.bytes[c]));
            }
            cJSON_AddBoolToObject(o, "truncated", s.truncated);
            char *line = cJSON_PrintUnformatted(o);
            if (!line || fprintf(items_out, "%s\n", line) < 0) die("writing --items-out failed: %s", strerror(errno));
            free(line);
            cJSON_Delete(o);
        }
    }
    free(mine);
    free(all);
    free(owner);
    free(order);
    free(first);
    r->n = tot.n;
    r->seconds = now_seconds() - t0;
    r->forward_seconds = bench_scorer_forward_seconds(sc) - f0;
    bench_accuracy(tot.correct, tot.n, &r->acc, &r->acc_se);
    bench_accuracy(tot.correct_norm, tot.n, &r->acc_norm, &r->acc_norm_se);
    // a pick among NaN scores is choice 0, whatever the model: no accuracy (null), and exit 1
    if (r->not_finite) r->acc = r->acc_se = r->acc_norm = r->acc_norm_se = NAN;
    for (long long i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(scored);
    bench_free(&j->b);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The --bench values with every directory replaced by its *.jsonl files in name order.
static int bench_files(const Args *a, char ***out) {
    const char *paths[ARGS_MAX_REPEATS];
    int n = args_get_all(a, SPECS, N_SPECS, "bench", paths, ARGS_MAX_REPEATS), m = 0, cap = 16;
    char **files = xmalloc((size_t)cap * sizeof(char *));
    for (int i = 0; i < n; i++) {
        struct stat st;
        DIR *dir = stat(paths[i], &st) == 0 && S_ISDIR(st.st_mode) ? opendir(paths[i]) : NULL;
        if (!dir) {
            if (m == cap) files = xrealloc(files, (size_t)(cap *= 2) * sizeof(char *));
            files[m++] = xstrdup(paths[i]);   // a file (or nothing: bench_load says so)
            continue;
        }
        int first = m;
        for (struct dirent *e; (e = readdir(dir));) {
            size_t len = strlen(e->d_name);
            if (len <= 6 || !path_has_ext(e->d_name, ".jsonl") || e->d_name[0] == '.') continue;
            if (m == cap) files = xrealloc(files, (size_t)(cap *= 2) * sizeof(char *));
            files[m++] = path_join(paths[i], e->d_name);
        }
        closedir(dir);
        if (m == first) die("--bench '%s' is a directory without *.jsonl files: pass benchmark files", paths[i]);
        qsort(files + first, (size_t)(m - first), sizeof(char *), cmp_str);
    }
    *out = files;
    return m;
}

// Under mpirun every rank must score the same items of the same model the same way: a rank with
// another --shots, --limit, benchmark file or model config (a node-local copy) gave numbers that
// were neither run's, or wrote past a buffer sized for its own item count in the gather. What
// each rank would score (the model's config, the cache codecs, the path, every item's prompt,
// choices and label) is compared with rank 0's before any forward.
static void check_bench_ranks_agree(Dist *dist, const Config *cfg, const char *codecs, int full, int n_bench, const BenchJob *jobs) {
    unsigned long long h = dist_config_fingerprint(cfg);
    h = fnv1a64_update(h, codecs, strlen(codecs) + 1);
    h = fnv1a64_update(h, &full, sizeof(full));
    h = fnv1a64_update(h, &n_bench, sizeof(n_bench));
    for (int b = 0; b < n_bench; b++) {
        h = fnv1a64_update(h, &jobs[b].n, sizeof(jobs[b].n));
        for (long long i = 0; i < jobs[b].n; i++) {
            const BenchItem *it = &jobs[b].b.items[jobs[b].scored[i]];
            h = fnv1a64_update(h, jobs[b].prompts[i], strlen(jobs[b].prompts[i]) + 1);
            for (int c = 0; c < it->n_choices; c++) h = fnv1a64_update(h, it->choices[c], strlen(it->choices[c]) + 1);
            if (it->continuation) h = fnv1a64_update(h, it->continuation, strlen(it->continuation) + 1);
            h = fnv1a64_update(h, &it->label, sizeof(it->label));
        }
    }
    dist_agree_or_die(dist, h, "would score other items, or another model or cache, than rank 0 (its options, benchmark "
                               "files or model directory differ): every rank must get the same command line and the same files");
}

// --bench: one JSON object per benchmark (--json), else a markdown table with one row for this
// checkpoint and codec, columns per benchmark.
static int eval_bench(Model *model, const ModelDir *md, const Config *cfg, const Args *a, Dist *dist, int K, uint64_t seed,
                      long long limit, int json, int tty, const char *dir) {
    char **paths;
    int n_bench = bench_files(a, &paths);
    CacheLayout layout;
    layout_from_args(&layout, md, a);
    Tokenizer *tok = open_tokenizer(args_get(a, SPECS, N_SPECS, "tokenizer"), md, cfg->model.vocab_size, cfg->train.tokenizer_hash);
    int full = args_get(a, SPECS, N_SPECS, "full-forward") != NULL, skip_bad = args_get(a, SPECS, N_SPECS, "skip-bad") != NULL;
    const char *items_path = args_get(a, SPECS, N_SPECS, "items-out");
    for (int i = 0; items_path && i < n_bench; i++) output_not_input(items_path, "--items-out", paths[i], "--bench file");
    // item lines gather in memory and reach the file at the end: a run stopped by bad input
    // leaves no file, nor a temporary
    char *items_buf = NULL;
    size_t items_len = 0;
    FILE *items = items_path && dist->rank == 0 ? open_memstream(&items_buf, &items_len) : NULL;
    if (items_path && dist->rank == 0 && !items) die("--items-out: %s", strerror(errno));
    char codecs[512];
    model_dir_describe_cache(&layout, codecs, sizeof(codecs));
    double bpt = cache_layout_bytes_per_token(&layout);
    BenchScorer *sc = bench_scorer_new(model, &layout, tok, full);
    BenchRun *runs = xcalloc((size_t)n_bench, sizeof(BenchRun));
    BenchJob *jobs = xcalloc((size_t)n_bench, sizeof(BenchJob));
    for (int i = 0; i < n_bench; i++) prepare_bench(&jobs[i], sc, paths[i], K, seed, limit, skip_bad);
    if (dist->world > 1) check_bench_ranks_agree(dist, cfg, codecs, full, n_bench, jobs);
    for (int i = 0; i < n_bench; i++) {
        BenchRun *r = &runs[i];
        run_bench(sc, &jobs[i], dist, dist->rank ? 0 : tty ? 2 : 1, items, r);
        if (dist->rank) continue;   // rank 0 reports for all
        fprintf(stderr, "bench %s: %lld items%s in %.2f s (%.1f items/s), %.0f%% of it in the model's forwards\n", r->name, r->n,
                r->skipped ? " (bad lines skipped)" : "", r->seconds, r->seconds > 0 ? r->n / r->seconds : 0,
                r->seconds > 0 ? 100 * r->forward_seconds / r->seconds : 0);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            add_text(o, "checkpoint", dir);
            add_text(o, "benchmark", r->name);
            add_text(o, "file", paths[i]);
            cJSON_AddStringToObject(o, "cache", codecs);
            cJSON_AddNumberToObject(o, "cache_bytes_per_token", bpt);
            cJSON_AddStringToObject(o, "path", full ? "full-forward" : "decoder");
            cJSON_AddNumberToObject(o, "shots", K);
            cJSON_AddNumberToObject(o, "items", (double)r->n);
            cJSON_AddNumberToObject(o, "skipped_lines", (double)r->skipped);
            add_number_or_null(o, "acc", r->acc);
            add_number_or_null(o, "acc_stderr", r->acc_se);
            add_number_or_null(o, "acc_norm", r->acc_norm);
            add_number_or_null(o, "acc_norm_stderr", r->acc_norm_se);
            cJSON_AddNumberToObject(o, "seconds", r->seconds);
            cJSON_AddNumberToObject(o, "forward_seconds", r->forward_seconds);
            char *line = cJSON_PrintUnformatted(o);
            printf("%s\n", line);
            free(line);
            cJSON_Delete(o);
        }
    }
    if (!json && dist->rank == 0) {
        printf("| checkpoint | cache | bytes/token | shots |");
        for (int i = 0; i < n_bench; i++) printf(" %s acc | %s acc_norm |", runs[i].name, runs[i].name);
        printf("\n|---|---|---|---|");
        for (int i = 0; i < n_bench; i++) printf("---|---|");
        printf("\n| %s | %s | %.10g | %d |", dir, codecs, bpt, K);
        for (int i = 0; i < n_bench; i++) {   // a standard error needs two items: "n/a" where --json says null
            char se[2][32];
            const double v[2] = {runs[i].acc_se, runs[i].acc_norm_se};
            for (int k = 0; k < 2; k++)
                if (isfinite(v[k])) snprintf(se[k], sizeof(se[k]), "%.4f", v[k]);
                else snprintf(se[k], sizeof(se[k]), "n/a");
            printf(" %.4f ± %s | %.4f ± %s |", runs[i].acc, se[0], runs[i].acc_norm, se[1]);
        }
        printf("\n");
    }
    if (fflush(stdout) != 0 || ferror(stdout)) die_stdout();
    if (items) {
        AtomicFile af;
        if (fclose(items) != 0) die("--items-out: %s", strerror(errno));
        const int overwrite = args_get(a, SPECS, N_SPECS, "overwrite") != NULL;
        if (atomic_open(&af, items_path, overwrite ? OUT_REPLACE : OUT_KEEP_EXISTING) != 0) die("cannot write --items-out '%s': %s", items_path, strerror(errno));
        if (fwrite(items_buf, 1, items_len, af.f) != items_len) {
            int e = errno;
            atomic_abort(&af);
            die("cannot write --items-out '%s': %s", items_path, strerror(e));
        }
        if (atomic_commit(&af) != 0) {
            char msg[8192];
            atomic_commit_message(msg, sizeof(msg), items_path, overwrite ? OUT_REPLACE : OUT_KEEP_EXISTING, errno);
            die("%s", msg);
        }
        free(items_buf);
    }
    long long not_finite = 0;
    const char *first_bad = NULL;
    for (int i = 0; i < n_bench; i++)
        if (runs[i].not_finite) { not_finite += runs[i].not_finite; if (!first_bad) first_bad = paths[i]; }
    if (not_finite && dist->rank == 0)
        die("the model's log-likelihoods of %lld item%s (the first in '%s') are not finite: its weights have diverged", not_finite,
            not_finite == 1 ? "" : "s", first_bad);
    if (not_finite) return 1;
    for (int i = 0; i < n_bench; i++) { free(runs[i].name); free(paths[i]); }
    free(runs);
    free(jobs);
    free(paths);
    bench_scorer_free(sc);
    tok_free(tok);
    cache_layout_free(&layout);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla eval --checkpoint DIR --data FILE [--json] [--batch B] [--seq T] [--max-batches N]\n"
               "                 [--through-cache [--cache-codec SPEC ...]]\n"
               "       clla eval --checkpoint DIR --ppl FILE [--seq T] [--stride S] [--batch B] [--tokenizer FILE]\n"
               "                 [--through-cache [--cache-codec SPEC ...]] [--json]\n"
               "       clla eval --checkpoint DIR --bench FILE|DIR ... [--shots K] [--seed S] [--limit N] [--skip-bad]\n"
               "                 [--cache-codec SPEC ...] [--full-forward] [--tokenizer FILE] [--items-out FILE] [--json]\n"
               "Mean next-token loss and perplexity over the data's windows, in the order and with the\n"
               "seed (train.seed) that training-time validation uses; the last batch may be partial.\n"
               "Exits 1 when the loss is not finite (--json prints it as null).\n"
               "With --ppl: perplexity of a text or token file in sliding windows of T tokens every S tokens, each\n"
               "token scored once (with at least T - S tokens of context after the first window).\n"
               "With --bench: multiple-choice accuracy (acc, byte-normalized acc_norm, standard errors), each\n"
               "choice's continuation scored through the KV cache (docs/BENCHMARKS.md).",
               NULL, NULL, 0);
    const char *dir = args_get(&a, SPECS, N_SPECS, "checkpoint"), *data = args_get(&a, SPECS, N_SPECS, "data");
    static const char *BENCH_ONLY[] = {"shots", "seed", "limit", "skip-bad", "full-forward", "tokenizer", "items-out"};
    if (args_get(&a, SPECS, N_SPECS, "overwrite") && !args_get(&a, SPECS, N_SPECS, "items-out"))
        die("--overwrite replaces an existing --items-out FILE: give --items-out, or drop --overwrite");
    if (args_get(&a, SPECS, N_SPECS, "bench")) {
        static const char *DATA_ONLY[] = {"data", "ppl", "stride", "batch", "seq", "max-batches", "through-cache"};
        for (size_t i = 0; i < sizeof(DATA_ONLY) / sizeof(DATA_ONLY[0]); i++)
            if (args_get(&a, SPECS, N_SPECS, DATA_ONLY[i]))
                die("--%s applies to token data (--data, --ppl), not to --bench, which scores each item whole (through the cache, or "
                    "one forward with --full-forward): drop one of them", DATA_ONLY[i]);
        if (!dir) die("clla eval --bench needs --checkpoint DIR: see clla eval --help");
        const char *items_path = args_get(&a, SPECS, N_SPECS, "items-out");
        if (items_path) output_file_check(items_path, args_get(&a, SPECS, N_SPECS, "overwrite") != NULL, "--items-out");
        const char *ks = args_get(&a, SPECS, N_SPECS, "shots"), *ss = args_get(&a, SPECS, N_SPECS, "seed");
        const char *ls = args_get(&a, SPECS, N_SPECS, "limit");
        int K = ks ? (int)opt_i64("--shots", ks, 0, 1 << 16) : 0;
        uint64_t seed = ss ? opt_u64("--seed", ss, UINT64_MAX) : 1234;
        long long limit = ls ? opt_i64("--limit", ls, 1, 1LL << 40) : 0;
        Dist dist;
        dist_init(&dist, 0);   // under mpirun the items are split over the ranks
        Config cfg;
        Model model;
        ModelDir md;
        const Backend *be = device_backend(args_get(&a, SPECS, N_SPECS, "device"));
        dist_select_device(&dist, be);   // each rank of a node on its own GPU
        model_source_load(&md, &model, &cfg, dir, be);
        int json = args_get(&a, SPECS, N_SPECS, "json") != NULL;
        int rc = eval_bench(&model, &md, &cfg, &a, &dist, K, seed, limit, json, isatty(2), dir);
        model_dir_free(&md);
        model_free(&model);
        dist_finalize(&dist);
        return rc;
    }
    cli_one_process("clla eval --data or --ppl (--bench splits its items over the ranks)");
    if (args_get(&a, SPECS, N_SPECS, "ppl")) return eval_ppl(&a, dir);
    if (args_get(&a, SPECS, N_SPECS, "stride")) die("--stride applies with --ppl: add --ppl FILE, or drop --stride");
    for (size_t i = 0; i < sizeof(BENCH_ONLY) / sizeof(BENCH_ONLY[0]); i++)
        if (args_get(&a, SPECS, N_SPECS, BENCH_ONLY[i])) die("--%s applies with --bench: add --bench FILE, or drop --%s", BENCH_ONLY[i], BENCH_ONLY[i]);
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
    model_source_load(&md, &model, &cfg, dir, device_backend(args_get(&a, SPECS, N_SPECS, "device")));
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
    WindowProgress pg = {t0, t0, tty};
    EvalResult r = evaluate(&model, dl, B, T, max_batches * B, show_progress, &pg);
    if (tty) fprintf(stderr, " | %.0f tok/s\n", (double)r.tokens / (now_seconds() - t0));
    if (r.failed) die("%s", r.err);
    int finite = isfinite(r.loss);
    if (json) {
        printf("{");
        print_json_loss("loss", "perplexity", r.loss, 1);
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
