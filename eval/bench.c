// Multiple-choice benchmarks: reading, few-shot prompts, scoring (eval/bench.h, docs/BENCHMARKS.md).
#include "eval/bench.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_strict.h"
#include "common/rng.h"
#include "common/util.h"
#include "data/bytes.h"
#include "eval/through_cache.h"
#include "model/decode.h"

// ---------------------------------------------------------------- reading

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

static void item_free(BenchItem *it) {
    free(it->context);
    for (int i = 0; i < it->n_choices; i++) free(it->choices[i]);
    free(it->choices);
    free(it->continuation);
    free(it->header);
    free(it->group);
    memset(it, 0, sizeof(*it));
}

// An optional string key: 0 (absent, *out NULL, or present: a copy), -1 when not a string.
static int opt_string(const cJSON *o, const char *key, char **out, char *err, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v) return 0;
    if (!cJSON_IsString(v)) { set_err(err, n, "\"%s\" must be a string", key); return -1; }
    *out = xstrdup(v->valuestring);
    return 0;
}

// The label: an integer, or a string of digits (HellaSwag files hold either).
static int read_label(const cJSON *o, int n_choices, int *label, char *err, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "label");
    if (!v) { set_err(err, n, "no \"label\""); return -1; }
    double x;
    if (cJSON_IsNumber(v)) x = v->valuedouble;
    else if (cJSON_IsString(v) && v->valuestring[0] && strspn(v->valuestring, "0123456789") == strlen(v->valuestring) &&
             strlen(v->valuestring) < 9)
        x = atof(v->valuestring);
    else { set_err(err, n, "\"label\" must be an integer"); return -1; }
    if (x != floor(x) || x < 0 || x >= n_choices) {
        set_err(err, n, "label %g is out of range: %d choices are numbered 0 to %d", x, n_choices, n_choices - 1);
        return -1;
    }
    *label = (int)x;
    return 0;
}

// One object into an item, by format (0 generic, 1 hellaswag). 0, or -1 with the problem in err.
static int parse_item(const cJSON *o, int format, BenchItem *it, char *err, size_t n) {
    const char *ck = format ? "ctx" : "context", *chk = format ? "endings" : "choices";
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(o, ck), *ch = cJSON_GetObjectItemCaseSensitive(o, chk);
    if (!cJSON_IsString(ctx)) { set_err(err, n, "\"%s\" must be a string", ck); return -1; }
    if (!cJSON_IsArray(ch)) { set_err(err, n, "\"%s\" must be an array of strings", chk); return -1; }
    int nc = cJSON_GetArraySize(ch);
    if (format && nc != 4) {   // a HellaSwag file with other counts is a broken one (docs/BENCHMARKS.md)
        set_err(err, n, "\"endings\" has %d entries: a HellaSwag item has 4 (other choice counts go in the generic format)", nc);
        return -1;
    }
    if (nc < 2 || nc > BENCH_MAX_CHOICES) { set_err(err, n, "\"%s\" has %d entries: 2 to %d are accepted", chk, nc, BENCH_MAX_CHOICES); return -1; }
    it->choices = xcalloc((size_t)nc, sizeof(char *));
    int i = 0;
    for (const cJSON *c = ch->child; c; c = c->next, i++) {
        if (!cJSON_IsString(c)) { set_err(err, n, "%s[%d] is not a string", chk, i); return -1; }
        if (!c->valuestring[0]) { set_err(err, n, "%s[%d] is empty: every choice needs text to score", chk, i); return -1; }
        // HellaSwag endings follow the context after a space, as llm.c's hellaswag.py renders them
        if (format) {
            size_t len = strlen(c->valuestring);
            it->choices[i] = xmalloc(len + 2);
            it->choices[i][0] = ' ';
            memcpy(it->choices[i] + 1, c->valuestring, len + 1);
        } else it->choices[i] = xstrdup(c->valuestring);
        it->n_choices = i + 1;
    }
    if (read_label(o, nc, &it->label, err, n) != 0) return -1;
    it->context = xstrdup(ctx->valuestring);
    if (format) return 0;
    char *split = NULL;
    if (opt_string(o, "continuation", &it->continuation, err, n) || opt_string(o, "header", &it->header, err, n) ||
        opt_string(o, "fewshot", &it->group, err, n) || opt_string(o, "split", &split, err, n))
        return -1;
    if (it->continuation && !it->continuation[0]) { set_err(err, n, "\"continuation\" is empty: it is the scored text"); return -1; }
    if (split && strcmp(split, "dev") && strcmp(split, "test")) {
        set_err(err, n, "\"split\" is '%s': use \"dev\" (few-shot examples) or \"test\" (scored)", split);
        free(split);
        return -1;
    }
    it->dev = split && !strcmp(split, "dev");
    free(split);
    return 0;
}

// "generic" / "hellaswag" from an object's keys, -1 when neither.
static int detect_format(const cJSON *o) {
    if (cJSON_GetObjectItemCaseSensitive(o, "context") && cJSON_GetObjectItemCaseSensitive(o, "choices")) return 0;
    if (cJSON_GetObjectItemCaseSensitive(o, "ctx") && cJSON_GetObjectItemCaseSensitive(o, "endings")) return 1;
    return -1;
}

int bench_load(Bench *b, const char *path, int skip_bad, char *err, size_t errlen) {
    memset(b, 0, sizeof(*b));
    size_t len;
    char *text = read_file(path, &len);
    if (!text) { set_err(err, errlen, "cannot read benchmark '%s': %s", path, strerror(errno)); return -1; }
    int format = -2, cap = 0, line = 0;
    char why[400];
    size_t pos = 0, n;
    for (char *s; (s = buf_next_line(text, len, &pos, &n));) {
        line++;
        if (strspn(s, " \t") >= n) continue;   // blank line
        BenchItem it = {0};
        it.line = line;
        cJSON *o = json_parse_line(s, n, why, sizeof(why));
        int bad = 0;
        if (!o) bad = 1;
        else if (!cJSON_IsObject(o)) { set_err(why, sizeof(why), "not a JSON object"); bad = 1; }
        else {
            if (format == -2) {
                format = detect_format(o);
                if (format < 0) {
                    set_err(err, errlen,
                            "%s:%d: unknown benchmark format: a line needs \"context\" and \"choices\" (generic) or \"ctx\" and "
                            "\"endings\" (HellaSwag); convert other datasets with eval/convert_bench.py",
                            path, line);
                    cJSON_Delete(o);
                    free(text);
                    bench_free(b);
                    return -1;
                }
            }
            bad = parse_item(o, format, &it, why, sizeof(why)) != 0;
        }
        cJSON_Delete(o);
        if (bad) {
            item_free(&it);
            if (!skip_bad) {
                set_err(err, errlen, "%s:%d: %s (fix the line, or pass --skip-bad to score the other items)", path, line, why);
                free(text);
                bench_free(b);
                return -1;
            }
            warn("%s:%d: %s: line skipped", path, line, why);
            b->n_skipped++;
            continue;
        }
        if (b->n_items == cap) {
            cap = cap ? 2 * cap : 64;
            b->items = xrealloc(b->items, (size_t)cap * sizeof(BenchItem));
        }
        it.context_hash = fnv1a64_update(FNV64_OFFSET, it.context, strlen(it.context));
        it.group_hash = fnv1a64_update(FNV64_OFFSET, it.group ? it.group : "", it.group ? strlen(it.group) : 0);
        b->items[b->n_items++] = it;
        b->n_dev += it.dev;
    }
    free(text);
    if (b->n_items - b->n_dev == 0) {
        set_err(err, errlen, "'%s' holds no item to score%s", path, b->n_skipped ? " (every line was bad)" : "");
        bench_free(b);
        return -1;
    }
    b->path = xstrdup(path);
    b->format = format == 1 ? "hellaswag" : "generic";
    return 0;
}

void bench_free(Bench *b) {
    for (int i = 0; i < b->n_items; i++) item_free(&b->items[i]);
    free(b->items);
    free(b->path);
    memset(b, 0, sizeof(*b));
}

// ---------------------------------------------------------------- few-shot prompts

static int same_group(const BenchItem *a, const BenchItem *b) {
    return a->group_hash == b->group_hash && !strcmp(a->group ? a->group : "", b->group ? b->group : "");
}

static int same_context(const BenchItem *a, const BenchItem *b) {
    return a->context_hash == b->context_hash && !strcmp(a->context, b->context);
}

static void append(ByteVec *v, const char *s) { bytevec_append(v, s, strlen(s)); }

char *bench_prompt(const Bench *b, int item, int K, uint64_t seed, char *err, size_t errlen) {
    const BenchItem *it = &b->items[item];
    int *pool = xmalloc((size_t)b->n_items * sizeof(int)), np = 0;
    int from_dev = b->n_dev > 0;
    // zero-shot needs no pool (a pool per item made the setup of N items take N^2 comparisons of
    // whole contexts, minutes at 32000 items); with shots, the hashes decide all but equal texts
    for (int j = 0; K > 0 && j < b->n_items; j++) {
        const BenchItem *c = &b->items[j];
        // never the scored item itself, nor a copy of it elsewhere in the file
        if (j == item || c->dev != from_dev || !same_group(c, it) || same_context(c, it)) continue;
        pool[np++] = j;
    }
    if (np < K) {
        set_err(err, errlen, "%s:%d: --shots %d needs %d examples but the %s%s%s holds %d: lower --shots or add dev items", b->path,
                it->line, K, K, from_dev ? "dev split" : "file (no dev split: the other items)",
                it->group && it->group[0] ? " of group " : "", it->group && it->group[0] ? it->group : "", np);
        free(pool);
        return NULL;
    }
    // a partial Fisher-Yates shuffle: the first K of a seeded permutation of the pool
    Rng r;
    rng_seed(&r, seed ^ mix64((uint64_t)item));
    for (int k = 0; k < K; k++) {
        int j = k + (int)(rng_next(&r) % (uint64_t)(np - k));
        int t = pool[k]; pool[k] = pool[j]; pool[j] = t;
    }
    ByteVec v = {0};
    if (it->header) append(&v, it->header);
    for (int k = 0; k < K; k++) {
        const BenchItem *s = &b->items[pool[k]];
        append(&v, s->context);
        append(&v, s->choices[s->label]);
        if (s->continuation) append(&v, s->continuation);
        append(&v, "\n\n");
    }
    append(&v, it->context);
    bytevec_append(&v, "", 1);
    free(pool);
    return (char *)v.v;
}

// ---------------------------------------------------------------- scoring

struct BenchScorer {
    Model *m;
    const CacheLayout *layout;
    const Tokenizer *tok;
    TokEncoder *enc;
    int full_forward;
    int max_len;
    Decoder *d;
    float *logits;          // (C, V) for the decoder path; grown for the full forward
    size_t logits_cap;
    double forward_seconds;
};

BenchScorer *bench_scorer_new(Model *m, const CacheLayout *layout, const Tokenizer *tok, int full_forward) {
    BenchScorer *s = xcalloc(1, sizeof(*s));
    s->m = m;
    s->layout = layout;
    s->tok = tok;
    s->enc = tok_encoder_new(tok);
    s->full_forward = full_forward;
    s->max_len = m->cfg.max_position_embeddings;
    m->inference = 1;
    // the decoder's prefill runs the full forward, which applies the model's codecs: they must be
    // the layout's, or a prefill would round through the served codecs while the cache holds others
    model_use_cache_codecs(m, layout);
    if (full_forward && cache_layout_has_blocks(layout))
        die("--full-forward: a codec with a full-precision window (kivi, qjl) has no full-sequence round trip (what a query reads "
            "depends on its position): score through the decoder, without --full-forward");
    if (full_forward) m->apply_codecs = 1;
    else s->d = decoder_new(m, layout, BENCH_BATCH_SEQS, s->max_len);
    return s;
}

void bench_scorer_free(BenchScorer *s) {
    if (!s) return;
    if (s->d) decoder_free(s->d);
    tok_encoder_free(s->enc);
    free(s->logits);
    free(s);
}

double bench_scorer_forward_seconds(const BenchScorer *s) { return s->forward_seconds; }

static float *logits_buf(BenchScorer *s, size_t n) {
    if (n > s->logits_cap) {
        free(s->logits);
        s->logits = xmalloc(n * sizeof(float));
        s->logits_cap = n;
    }
    return s->logits;
}

// Bytes of the white space character ending t[0..n), 0 if none: what Python's str.rstrip()
// removes (lm-evaluation-harness strips contexts with it), ASCII \t \n \v \f \r, \x1c-\x1f and
// space, and in UTF-8 U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
static size_t trailing_space(const char *t, size_t n) {
    const unsigned char *u = (const unsigned char *)t;
    if (n >= 1 && ((u[n - 1] >= 0x09 && u[n - 1] <= 0x0D) || (u[n - 1] >= 0x1C && u[n - 1] <= 0x20))) return 1;
    if (n >= 2 && u[n - 2] == 0xC2 && (u[n - 1] == 0x85 || u[n - 1] == 0xA0)) return 2;
    if (n >= 3) {
        const unsigned a = u[n - 3], b = u[n - 2], c = u[n - 1];
        if ((a == 0xE1 && b == 0x9A && c == 0x80) || (a == 0xE3 && b == 0x80 && c == 0x80) || (a == 0xE2 && b == 0x81 && c == 0x9F) ||
            (a == 0xE2 && b == 0x80 && (c <= 0x8A || c == 0xA8 || c == 0xA9 || c == 0xAF)))
            return 3;
    }
    return 0;
}

static void encode(BenchScorer *s, const char *text, U32Vec *out) {
    out->n = 0;
    tok_encode(s->enc, text, strlen(text), 0, out);
}

// Per choice: the context tokens (ctx[c], len nctx[c]) and the continuation's (cont[c], ncont[c]).
typedef struct Seqs {
    U32Vec ctx[BENCH_MAX_CHOICES], cont[BENCH_MAX_CHOICES];
    int start[BENCH_MAX_CHOICES];   // first context token kept (left truncation)
} Seqs;

static int build_seqs(BenchScorer *s, const BenchItem *it, const char *prompt, Seqs *q, BenchScores *out, char *err, size_t n) {
    memset(out, 0, sizeof(*out));
    out->n_choices = it->n_choices;
    size_t plen = strlen(prompt);
    for (int c = 0; c < it->n_choices; c++) {
        // partial scoring: the choice joins the context, the shared continuation is scored
        const char *cont = it->continuation ? it->continuation : it->choices[c];
        const size_t cl = it->continuation ? strlen(it->choices[c]) : 0, tl = strlen(cont);
        char *ctx = xmalloc(plen + cl + 1);
        memcpy(ctx, prompt, plen);
        memcpy(ctx + plen, it->continuation ? it->choices[c] : "", cl + 1);
        // white space ending the context goes to the continuation, as lm-evaluation-harness moves
        // it ("a time " + "ago" is read as "a time" + " ago", the tokens a byte-level tokenizer
        // gives the joined text)
        size_t keep = plen + cl, w;
        while ((w = trailing_space(ctx, keep)) > 0) keep -= w;
        char *full = xmalloc(plen + cl - keep + tl + 1);
        memcpy(full, ctx + keep, plen + cl - keep);
        memcpy(full + plen + cl - keep, cont, tl + 1);
        ctx[keep] = 0;
        encode(s, ctx, &q->ctx[c]);
        encode(s, full, &q->cont[c]);
        free(ctx);
        free(full);
        out->bytes[c] = (int)tl;   // the continuation's own bytes, as lm-evaluation-harness's acc_norm
        out->tokens[c] = (int)q->cont[c].n;
        if (q->ctx[c].n == 0) {
            // an empty context: the continuation is scored after <|endoftext|>, as lm-evaluation-harness does
            uint32_t eot = tok_special_id(s->tok, "<|endoftext|>");
            if (eot == TOK_NONE) { set_err(err, n, "the context is empty and the tokenizer has no <|endoftext|> to stand for it"); return -1; }
            u32vec_push(&q->ctx[c], eot);
        }
        // the model reads context + continuation minus its last token: keep the last max_len of
        // them, at least one context token, so a continuation of max_len tokens still fits
        size_t need = q->ctx[c].n + q->cont[c].n - 1;
        if (q->cont[c].n > (size_t)s->max_len) {
            set_err(err, n, "choice %d's continuation has %zu tokens, the model's context is %d: it cannot be scored", c, q->cont[c].n, s->max_len);
            return -1;
        }
        q->start[c] = need > (size_t)s->max_len ? (int)(need - (size_t)s->max_len) : 0;
        if (q->start[c]) out->truncated = 1;
    }
    return 0;
}

static double logprob(const float *logits, int V, uint32_t target) { return -eval_token_nll(logits, V, (int)target); }

// The tokens choice c of an item reads (its context after left truncation): n of them at *v.
static const int32_t *choice_ctx(const Seqs *q, int c, int *n) {
    *n = (int)q->ctx[c].n - q->start[c];
    return (const int32_t *)q->ctx[c].v + q->start[c];
}

// How many leading tokens every choice of the item reads alike (0 if a single choice): the
// part prefilled once and forked. A plain item shares its whole context; a partial-scoring
// item (Winogrande) the prompt before the option.
static int shared_prefix(const BenchItem *it, const Seqs *q) {
    if (it->n_choices < 2) return 0;
    int n0, p;
    const int32_t *t0 = choice_ctx(q, 0, &n0);
    p = n0;
    for (int c = 1; c < it->n_choices; c++) {
        int n;
        const int32_t *t = choice_ctx(q, c, &n);
        int k = 0;
        while (k < p && k < n && t[k] == t0[k]) k++;
        p = k;
    }
    return p;
}

// One choice's run through the decoder: after the prefill, its tail goes in one token a step (the
// rest of its context past the shared prefix, then its continuation but the last token); the
// logits from tail position `skip` on (the prefill's own when skip is 0) score the continuation.
typedef struct ChoiceRun {
    int item, choice, prefill_row;
    int skip, n_tail;
    int32_t *tail;   // context tail + continuation
} ChoiceRun;

// Through the decoder: the context each item's choices share prefilled once, with every
// unshared one, in one batched forward; the shared sequences forked into one per choice
// (model/decode.h: full cache blocks shared, not copied); then all the choices' remaining
// tokens decoded one a step, side by side.
static void score_cached(BenchScorer *s, int n, const BenchItem *const *items, Seqs *qs, BenchScores *outs) {
    int V = s->m->cfg.vocab_size, S = 0, np = 0;
    ChoiceRun run[BENCH_BATCH_SEQS];
    int pids[BENCH_BATCH_SEQS], plens[BENCH_BATCH_SEQS], act[BENCH_BATCH_SEQS];
    const int32_t *prompts[BENCH_BATCH_SEQS];
    int32_t toks[BENCH_BATCH_SEQS];
    int forks[BENCH_BATCH_SEQS][2], n_forks = 0;
    for (int i = 0; i < n; i++) {
        int shared = shared_prefix(items[i], &qs[i]), base = S;
        for (int c = 0; c < items[i]->n_choices; c++, S++) {
            if (S == BENCH_BATCH_SEQS) die("internal error: a benchmark batch of more than %d sequences", BENCH_BATCH_SEQS);
            int nc;
            const int32_t *ctx = choice_ctx(&qs[i], c, &nc);
            int prefix = shared ? shared : nc;
            const U32Vec *cont = &qs[i].cont[c];
            ChoiceRun *r = &run[S];
            r->item = i;
            r->choice = c;
            r->skip = nc - prefix;
            r->n_tail = r->skip + (int)cont->n;
            r->tail = xmalloc((size_t)r->n_tail * sizeof(int32_t));
            memcpy(r->tail, ctx + prefix, (size_t)r->skip * sizeof(int32_t));
            for (size_t k = 0; k < cont->n; k++) r->tail[r->skip + (int)k] = (int32_t)cont->v[k];
            if (!shared || c == 0) {
                pids[np] = S;
                prompts[np] = ctx;
                plens[np] = prefix;
                np++;
            } else {
                forks[n_forks][0] = base;
                forks[n_forks][1] = S;
                n_forks++;
            }
            r->prefill_row = np - 1;
        }
    }
    float *logits = logits_buf(s, (size_t)S * V);
    double t0 = now_seconds();
    decoder_prefill(s->d, np, pids, prompts, plens, logits);
    for (int f = 0; f < n_forks; f++) decoder_fork(s->d, forks[f][0], forks[f][1]);
    s->forward_seconds += now_seconds() - t0;
    for (int j = 0; j < S; j++) {
        outs[run[j].item].loglik[run[j].choice] = 0;
        if (run[j].skip == 0)
            outs[run[j].item].loglik[run[j].choice] = logprob(logits + (size_t)run[j].prefill_row * V, V, (uint32_t)run[j].tail[0]);
    }
    for (int t = 1;; t++) {
        int na = 0;
        for (int j = 0; j < S; j++)
            if (run[j].n_tail > t) { act[na] = j; toks[na] = run[j].tail[t - 1]; na++; }
        if (!na) break;
        t0 = now_seconds();
        decoder_step(s->d, na, act, toks, logits);
        s->forward_seconds += now_seconds() - t0;
        for (int k = 0; k < na; k++) {
            const ChoiceRun *r = &run[act[k]];
            if (t >= r->skip) outs[r->item].loglik[r->choice] += logprob(logits + (size_t)k * V, V, (uint32_t)r->tail[t]);
        }
    }
    for (int j = 0; j < S; j++) {
        decoder_release(s->d, j);
        free(run[j].tail);
    }
}

// The check path: one full-sequence forward of every choice's tokens, right-padded.
static void score_full(BenchScorer *s, const BenchItem *it, Seqs *q, BenchScores *out) {
    int C = it->n_choices, V = s->m->cfg.vocab_size, T = 1;
    for (int c = 0; c < C; c++) {
        int len = (int)(q->ctx[c].n - (size_t)q->start[c] + q->cont[c].n - 1);
        T = len > T ? len : T;
    }
    int32_t *in = xcalloc((size_t)C * T, sizeof(int32_t));
    for (int c = 0; c < C; c++) {
        int32_t *row = in + (size_t)c * T;
        int nc = (int)q->ctx[c].n - q->start[c];
        for (int i = 0; i < nc; i++) row[i] = (int32_t)q->ctx[c].v[q->start[c] + i];
        for (size_t i = 0; i + 1 < q->cont[c].n; i++) row[nc + (int)i] = (int32_t)q->cont[c].v[i];
    }
    double t0 = now_seconds();
    model_set_batch(s->m, C, T);
    model_forward(s->m, in, NULL);
    for (int c = 0; c < C; c++) {
        // only the rows that predict the continuation come to the host
        int nc = (int)q->ctx[c].n - q->start[c];
        float *logits = logits_buf(s, q->cont[c].n * V);
        model_logits_to_host(s->m, (size_t)c * T + (size_t)(nc - 1), q->cont[c].n, logits);
        out->loglik[c] = 0;
        for (size_t j = 0; j < q->cont[c].n; j++) out->loglik[c] += logprob(logits + j * V, V, q->cont[c].v[j]);
    }
    s->forward_seconds += now_seconds() - t0;   // with the copies, which wait for the forward
    free(in);
}

int bench_score_batch(BenchScorer *s, int n, const BenchItem *const *items, char *const *prompts, BenchScores *outs, int *bad,
                      char *err, size_t errlen) {
    int total = 0;
    for (int i = 0; i < n; i++) total += items[i]->n_choices;
    if (n < 1 || total > BENCH_BATCH_SEQS) die("internal error: a benchmark batch of %d items, %d choices", n, total);
    Seqs *qs = xcalloc((size_t)n, sizeof(Seqs));
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (build_seqs(s, items[i], prompts[i], &qs[i], &outs[i], err, errlen) != 0) {
            rc = -1;
            if (bad) *bad = i;
        }
    if (!rc) {
        if (s->full_forward)
            for (int i = 0; i < n; i++) score_full(s, items[i], &qs[i], &outs[i]);
        else
            score_cached(s, n, items, qs, outs);
    }
    for (int i = 0; i < n; i++)
        for (int c = 0; c < BENCH_MAX_CHOICES; c++) { free(qs[i].ctx[c].v); free(qs[i].cont[c].v); }
    free(qs);
    return rc;
}

int bench_check_item(BenchScorer *s, const BenchItem *it, const char *prompt, char *err, size_t errlen) {
    Seqs q = {0};
    BenchScores out;
    int rc = build_seqs(s, it, prompt, &q, &out, err, errlen);
    for (int c = 0; c < BENCH_MAX_CHOICES; c++) { free(q.ctx[c].v); free(q.cont[c].v); }
    return rc;
}

int bench_score_item(BenchScorer *s, const BenchItem *it, const char *prompt, BenchScores *out, char *err, size_t errlen) {
    char *p = (char *)prompt;
    return bench_score_batch(s, 1, &it, &p, out, NULL, err, errlen);
}

// ---------------------------------------------------------------- metrics

int bench_pick(const BenchScores *sc, int norm) {
    int best = 0;
    double bv = -INFINITY;
    for (int c = 0; c < sc->n_choices; c++) {
        double v = norm ? sc->loglik[c] / sc->bytes[c] : sc->loglik[c];
        if (v > bv) { bv = v; best = c; }
    }
    return best;
}

void bench_totals_add(BenchTotals *t, const BenchScores *sc, int label) {
    t->n++;
    t->correct += bench_pick(sc, 0) == label;
    t->correct_norm += bench_pick(sc, 1) == label;
}

void bench_accuracy(long long correct, long long n, double *acc, double *stderr_out) {
    double p = n ? (double)correct / (double)n : NAN;
    *acc = p;
    *stderr_out = n >= 2 ? sqrt(p * (1 - p) / (double)(n - 1)) : NAN;
}
