// clla calibrate: fits the cache codecs that learn from the model's own activations (cq's and
// qet's codebooks, kvquant's datatypes and key ranges) and writes an inference package that
// carries them (docs/QUANTIZERS.md, "In the cache layer").
//
// Calibration windows of the data run through the model, forward and backward (the LM loss, our
// own backward pass): every cache stream's payload (a producer's K, V, latent, k_rope; a
// consumer's own k_rope) is collected as it would be cached, with its Fisher information, the
// squared gradient of the loss with respect to each cached element. RoPE-carrying parts (K,
// k_rope) are cached after RoPE, and the backward pass leaves their gradients rotated back to
// before it: they are rotated forward again so that value and weight match, unless the codec
// codes keys before RoPE (kvquant), whose values are rotated back instead. A consumer's own
// k_rope has no stored gradient (its buffer is reused per layer): its samples weigh alike.
// Then each stream's codec is fitted and the package written (cli/package_out.c).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "eval/evaluate.h"
#include "model/decode.h"
#include "model/mem_plan.h"
#include "model/model_dir.h"
#include "cli/commands.h"
#include "train/progress.h"
#include "quant/kvquant.h"
#include "cli/package_out.h"

static const ArgSpec SPECS[] = {
    {"data", 1, "calibration data: a token file or shards made with the model's tokenizer (required)", "PATH"},
    {"cache-codec", ARG_REPEAT, "cache codec, CODEC or PART=CODEC (repeatable), e.g. latent=cq:bits=8,c=4 (required)", "SPEC"},
    {"out", 1, "the package directory to write (required; must not exist unless --overwrite)", "PACKAGE"},
    {"tokens", 1, "calibration tokens to collect (default 4096)", "N"},
    {"batch", 1, "sequences per forward (default: train.micro_batch)", "B"},
    {"seq", 1, "tokens per sequence (default: train.seq_len)", "T"},
    {"no-fisher", 0, "cq, kvquant: weigh every sample alike in k-means (CQ's uniform variant) instead of by squared gradients", NULL},
    {"dtype", 1, "weights in the package: fp32 (default) or bf16", "fp32|bf16"},
    {"tokenizer", 1, "tokenizer file to include (default: the model's)", "FILE"},
    {"overwrite", 0, "replace an existing package at --out", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

typedef struct Collect {
    Model *m;
    const CacheLayout *cl;
    int T, fisher;
    long long want, have;   // tokens
    float **x, **f;         // [n_streams] samples and their Fisher weights (NULL: not fitted / no weights)
    float *host;            // staging for one act buffer
    int tty;
    double t0, last;   // last: when a progress line last went to a log (not a terminal)
} Collect;

// The stream's cached payload and its gradient in the model's buffers (gradient NULL: none kept).
static void stream_buffers(Model *m, int s, float **val, float **grad) {
    const CacheStream *st = &m->cache.streams[s];
    int slot = m->cache.role[st->layer].slot;
    const SlotActs *a = &m->sa[slot], *g = &m->gsa[slot];
    int vi = -1, gi = -1;
    switch (st->part) {
    case PART_K: vi = a->k, gi = g->k; break;
    case PART_V: vi = a->v, gi = g->v; break;
    case PART_LATENT: vi = a->c, gi = g->c; break;
    case PART_KROPE: vi = a->k_rope, gi = g->k_rope; break;
    case PART_OWN_KROPE: vi = m->la[st->layer].k_rope; break;
    }
    *val = (float *)table_ptr_store(&m->acts, m->act, vi);
    *grad = gi >= 0 ? (float *)table_ptr_store(&m->gacts, m->gact, gi) : NULL;
}

static void collect_batch(const int32_t *in, const int32_t *tg, int rows, void *ctx) {
    Collect *c = ctx;
    if (c->have >= c->want) return;
    Model *m = c->m;
    const ModelConfig *mc = &m->cfg;
    model_set_batch(m, rows, c->T);
    model_zero_grad(m);
    float loss = model_forward(m, in, tg);
    if (!isfinite(loss)) die("the model's loss on the calibration data is not finite (%g): its weights have diverged", loss);
    if (c->fisher) model_backward(m, 1.0f);
    long long n = (long long)rows * c->T, take = c->want - c->have < n ? c->want - c->have : n;
    for (int s = 0; s < c->cl->n_streams; s++) {
        if (!c->x[s]) continue;
        int part = c->cl->streams[s].part, W = c->cl->part[part].width, D = c->cl->part[part].head, heads = W / D;
        float *val, *grad;
        stream_buffers(m, s, &val, &grad);
        m->be->act_to_host(c->host, val, (size_t)n * W);
        const int rotated = part == PART_K || part == PART_KROPE || part == PART_OWN_KROPE;
        const int pre_rope = rotated && codec_traits(c->cl->part[part].codec.kind)->pre_rope;
        if (pre_rope)   // a codec of keys before RoPE (cq, kvquant): the values rotated back, row by row of each window
            for (int r = 0; r < rows; r++) kvq_rope_rows(c->host + (size_t)r * c->T * W, c->T, heads, D, 0, mc->rope_theta, -1);
        memcpy(c->x[s] + (size_t)c->have * W, c->host, (size_t)take * W * sizeof(float));
        if (!c->f[s]) continue;
        // the backward pass leaves a rotated key's gradient rotated back, before RoPE: where a
        // pre-RoPE codec wants it; a post-RoPE codec has it rotated forward again
        if ((part == PART_K || part == PART_KROPE) && !pre_rope) m->be->rope_forward(grad, rows, c->T, heads, D, 0, D, 0, mc->rope_theta);
        m->be->act_to_host(c->host, grad, (size_t)n * W);
        float *f = c->f[s] + (size_t)c->have * W;
        for (size_t i = 0; i < (size_t)take * W; i++) f[i] = c->host[i] * c->host[i];
    }
    c->have += take;
    if (progress_due(c->tty, &c->last)) {
        double el = now_seconds() - c->t0, rate = c->have / (el > 0 ? el : 1e-9);
        fprintf(stderr, "%scalibrate: %lld/%lld tokens | %.0f tok/s | ETA %.0f s%s", c->tty ? "\r" : "", c->have, c->want, rate,
                (c->want - c->have) / rate, c->tty ? "" : "\n");
    }
}

int cmd_calibrate(int argc, char **argv) {
    Args a;
    char *pos[1];
    int n_pos = 0;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla calibrate MODEL_DIR --data PATH --cache-codec SPEC [...] --out PACKAGE [--tokens N] [--batch B] [--seq T]\n"
               "                      [--no-fisher] [--dtype fp32|bf16] [--tokenizer FILE] [--overwrite]\n"
               "Fits the cache codecs that learn from the model's activations (cq: codebooks by Fisher-weighted k-means;\n"
               "qet: QET's stage codebooks by k-means; kvquant: per-stream datatypes by Fisher-weighted k-means and the\n"
               "keys' per-channel ranges, before RoPE)\n"
               "on calibration data and writes an inference package that carries them (serve it with clla generate or\n"
               "clla eval --through-cache).",
               pos, &n_pos, 1);
    const char *data = args_get(&a, SPECS, N_SPECS, "data"), *out = args_get(&a, SPECS, N_SPECS, "out");
    const char *specs[ARGS_MAX_REPEATS];
    int n_specs = args_get_all(&a, SPECS, N_SPECS, "cache-codec", specs, ARGS_MAX_REPEATS);
    if (n_pos != 1 || !data || !out || !n_specs)
        die("clla calibrate needs a model directory, --data, --cache-codec and --out: see clla calibrate --help");
    const char *ts = args_get(&a, SPECS, N_SPECS, "tokens"), *bs = args_get(&a, SPECS, N_SPECS, "batch");
    const char *ss = args_get(&a, SPECS, N_SPECS, "seq"), *dtype = args_get(&a, SPECS, N_SPECS, "dtype");
    long long want = ts ? opt_i64("--tokens", ts, 1, 1LL << 31) : 4096;
    int B = bs ? (int)opt_i64("--batch", bs, 1, 1 << 20) : 0, T = ss ? (int)opt_i64("--seq", ss, 1, 1 << 30) : 0;
    if (!dtype) dtype = "fp32";
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("--dtype '%s' is not a package dtype: use fp32 or bf16", dtype);
    const char *src = pos[0];
    Config cfg;
    Model model;
    ModelDir md;
    package_load_source(&md, &model, &cfg, src, specs, n_specs);
    CacheLayout *cl = &md.cache;
    // the codecs learn from the activations of the weights the package serves
    if (!strcmp(dtype, "bf16")) package_round_masters_bf16(&model, cfg.train.seed);
    // a part named by --cache-codec is fitted anew, also when the source package already holds
    // a fit of the same codec (a re-fit on other data or more tokens); the others keep theirs
    for (int i = 0; i < n_specs; i++)
        for (int s = 0; s < cl->n_streams; s++)
            if (cache_spec_names_part(cl, specs[i], cl->streams[s].part) && cl->fit && cl->fit[s]) cache_layout_set_fit(cl, s, NULL);
    // and with the settings named: iters too, which the layout kept from the dropped fit
    for (int i = 0; i < n_specs; i++) {
        char err[512];
        if (cache_layout_apply_spec(cl, specs[i], err, sizeof(err)) != 0) die("--cache-codec '%s': %s", specs[i], err);
    }
    int to_fit = 0;
    for (int s = 0; s < cl->n_streams; s++) to_fit += codec_needs_fit(&cl->part[cl->streams[s].part].codec) && !(cl->fit && cl->fit[s]);
    if (!to_fit) die("no cache codec to fit: --cache-codec names none that learns from data (cq, qet and kvquant do): use clla export for the others");
    if (!B) B = cfg.train.micro_batch;
    if (!T) T = cfg.train.seq_len;
    if (T > cfg.model.max_position_embeddings) die("--seq %d exceeds max_position_embeddings %d", T, cfg.model.max_position_embeddings);
    PackageOut po;
    package_out_begin(&po, out, args_get(&a, SPECS, N_SPECS, "overwrite") != NULL, args_get(&a, SPECS, N_SPECS, "tokenizer"),
                      md.tokenizer, cfg.model.vocab_size, cfg.train.tokenizer_hash);
    unsigned long long tok_hash = 0;
    if (cfg.train.tokenizer_hash[0] && loader_parse_tokenizer_hash(cfg.train.tokenizer_hash, &tok_hash) != 0)
        die("'%s/config.json': train.tokenizer_hash '%s' is not 16 hex digits", src, cfg.train.tokenizer_hash);
    DataLoader *dl = eval_open(data, T, cfg.train.seed, cfg.model.vocab_size, tok_hash);
    long long windows = eval_num_windows(dl);
    if (windows * T < want) {
        warn("'%s' holds %lld tokens in windows of %d: calibrating on those, not %lld", data, windows * T, T, want);
        want = windows * T;
    }

    // the codecs being fitted are not applied while collecting (fp32 in their place): the
    // samples are the exact values, also where training rounded them (CLLA-quant's int4 latent)
    CacheLayout exact;
    cache_layout_copy(&exact, cl);
    for (int p = 0; p < N_PARTS; p++)
        if (codec_needs_fit(&exact.part[p].codec)) exact.part[p].codec = (Codec){.kind = CODEC_FP32};
    model_use_cache_codecs(&model, &exact);
    cache_layout_free(&exact);
    // Fisher information only when a codec being fitted weighs by it (a backward pass per batch)
    int fisher = 0;
    for (int s = 0; s < cl->n_streams; s++) {
        const Codec *codec = &cl->part[cl->streams[s].part].codec;
        // a consumer's own k_rope weighs its samples alike (the collection below gives it no weights)
        if (codec_needs_fit(codec) && !(cl->fit && cl->fit[s]) && cl->streams[s].part != PART_OWN_KROPE)
            fisher |= codec_traits(codec->kind)->uses_fisher;
    }
    Collect c = {.m = &model, .cl = cl, .T = T, .fisher = fisher && !args_get(&a, SPECS, N_SPECS, "no-fisher"), .want = want,
                 .tty = isatty(2), .t0 = now_seconds(), .last = now_seconds()};
    c.x = xcalloc((size_t)cl->n_streams, sizeof(float *));
    c.f = xcalloc((size_t)cl->n_streams, sizeof(float *));
    size_t widest = 1;
    double sample_bytes = 0;   // every stream's samples (and weights), counted before any is taken
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            char what[160];
            snprintf(what, sizeof(what), "the calibration samples (%lld tokens of %d cache stream%s%s)", want, cl->n_streams,
                     cl->n_streams == 1 ? "" : "s", c.fisher ? ", with their Fisher weights" : "");
            mem_check_host(sample_bytes, what, "lower --tokens");
        }
        for (int s = 0; s < cl->n_streams; s++) {
            int part = cl->streams[s].part, W = cl->part[part].width;
            if ((size_t)W > widest) widest = (size_t)W;
            if (!codec_needs_fit(&cl->part[part].codec) || (cl->fit && cl->fit[s])) continue;
            const int weighed = c.fisher && part != PART_OWN_KROPE && codec_traits(cl->part[part].codec.kind)->uses_fisher;
            if (pass == 0) {
                sample_bytes += (double)want * W * sizeof(float) * (weighed ? 2 : 1);
                continue;
            }
            c.x[s] = xmalloc((size_t)want * W * sizeof(float));
            if (weighed) c.f[s] = xmalloc((size_t)want * W * sizeof(float));
        }
    }
    c.host = xmalloc((size_t)B * T * widest * sizeof(float));
    EvalResult r = {0};
    long long windows_needed = (want + T - 1) / T;
    eval_for_each_batch(dl, B, T, windows_needed, collect_batch, &c, NULL, NULL, &r);
    if (c.tty) fprintf(stderr, "\n");
    if (r.failed) die("%s", r.err);
    loader_close(dl);

    double t_fit = now_seconds();
    int done = 0;
    for (int s = 0; s < cl->n_streams; s++) {
        if (!c.x[s]) continue;
        int part = cl->streams[s].part, W = cl->part[part].width;
        const Codec *codec = &cl->part[part].codec;
        if (progress_due(c.tty, &c.last)) {
            double el = now_seconds() - t_fit, eta = done ? el / done * (to_fit - done) : 0;
            fprintf(stderr, "%scalibrate: fitting %s of layer %d (%d/%d) | ETA %.0f s%s", c.tty ? "\r" : "", cache_part_name(part),
                    cl->streams[s].layer, done + 1, to_fit, eta, c.tty ? "   " : "\n");
        }
        void *state = NULL;
        char err[512];
        if (codec_traits(codec->kind)->fit(codec, W, c.x[s], c.have, T, c.f[s], &state, err, sizeof(err)) != 0)
            die("fitting %s of layer %d: %s: nothing was written", cache_part_name(part), cl->streams[s].layer, err);
        cache_layout_set_fit(cl, s, state);
        done++;
        free(c.x[s]);
        free(c.f[s]);
        c.x[s] = c.f[s] = NULL;
    }
    if (c.tty) fprintf(stderr, "\n");
    package_out_write(&po, &model, &cfg, cl, dtype);
    char codecs[512];
    model_dir_describe_cache(cl, codecs, sizeof(codecs));
    printf("wrote %s: cache %s fitted on %lld tokens of %s%s; %.10g cache bytes/token", po.out, codecs, c.have, data,
           c.fisher ? " (Fisher-weighted)" : "", cache_layout_bytes_per_token(cl));
    int kept = 0;
    for (int s = 0; s < cl->n_streams; s++) kept += codec_needs_fit(&cl->part[cl->streams[s].part].codec);
    kept -= done;   // the fitted streams not fitted here kept their fits
    if (kept) printf(" (%d of the %d fitted streams kept the fits of '%s': only the parts --cache-codec names are fitted anew)",
                     kept, kept + done, src);
    printf("\n");
    for (int p = 0; p < N_PARTS; p++) {
        if (!cl->part[p].present) continue;
        const Codec *codec = &cl->part[p].codec;
        int W = cl->part[p].width;
        int64_t fit = codec_fit_elements(codec, W);
        char spec[160];
        codec_format(codec, spec, sizeof(spec));
        printf("  %-10s %-28s %.3f bits/element stored%s, %.3f as its paper counts", cache_part_name(p), spec,
               codec_bits_stored(codec, W), fit ? " (codes)" : "", codec_bits_paper(codec, W));
        if (fit) printf("; plus codebooks of %lld values per stream", (long long)fit);
        printf("\n");
    }
    free(c.x);
    free(c.f);
    free(c.host);
    package_out_free(&po);
    model_dir_free(&md);
    model_free(&model);
    return 0;
}
