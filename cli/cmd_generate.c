// clla generate: text from a model through the KV cache (docs/INFERENCE.md, "clla generate").
// Prompts are decoded together: free decoder slots are filled by one batched prefill of the
// waiting prompts, then every active sequence advances one token per decoder_step; a sequence
// that stops frees its slot for the next prompt (continuous batching). Each prompt samples
// from its own RNG stream (the seed mixed with the prompt's index), so its random draws do not
// depend on which prompts share its batch (its logits can, in their last bits: docs/INFERENCE.md).
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/rng.h"
#include "common/json_strict.h"
#include "common/util.h"
#include "data/bytes.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "model/decode.h"
#include "model/mem_plan.h"
#include "model/model_dir.h"
#include "model/sampler.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/cache_codec_args.h"
#include "cli/model_source.h"
#include "cli/open_tokenizer.h"

static const ArgSpec SPECS[] = {
    {"model", 1, "a package (clla export), a run directory or a checkpoint directory (required)", "DIR"},
    {"prompt", ARG_REPEAT, "a prompt (repeatable)", "TEXT"},
    {"prompts", 1, "file of prompts: one per line, or JSONL objects with \"prompt\" when it ends in .jsonl or .json", "FILE"},
    {"max-new-tokens", 1, "tokens to generate per prompt at most (default 64)", "N"},
    {"temperature", 1, "0 = greedy (default); > 0 samples from softmax(logits / T)", "T"},
    {"top-k", 1, "sample among the k most likely tokens (default 0 = off)", "K"},
    {"top-p", 1, "sample among the smallest set of tokens with probability >= p (default 1 = off)", "P"},
    {"seed", 1, "sampling seed (default 0); prompt i draws from its own stream of it", "S"},
    {"stop", ARG_REPEAT, "stop when the completion contains this text, which is cut off (repeatable)", "TEXT"},
    {"stop-token", ARG_REPEAT, "stop after generating this token id (repeatable)", "ID"},
    {"ignore-eos", 0, "do not stop at the tokenizer's <|endoftext|>", NULL},
    {"batch", 1, "sequences decoded together at most (default: every prompt, up to 64)", "B"},
    {"json", 0, "one JSON object per prompt on stdout (JSON lines)", NULL},
    {"device", 1, "cpu (default), cpu-bf16 or cuda", "cpu|cpu-bf16|cuda"},
    {"tokenizer", 1, "tokenizer file (default: the package's, or the run's train.tokenizer)", "FILE"},
    {"cache-codec", ARG_REPEAT, "cache codec, CODEC or PART=CODEC (repeatable): fp32, bf16, int_group:bits=B,group=G, kivi:bits=B,group=G,residual=R, qjl:m=M,... (cq, qet, kvquant: a package from clla calibrate)", "SPEC"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))
#define MAX_LIST ARGS_MAX_REPEATS

typedef struct Prompt {
    char *text;
    size_t len;
    char origin[320];    // "prompt [1] (--prompt 2)", "prompt [6] (FILE line 7)": for messages, with the index of the output
} Prompt;

typedef struct PromptList {
    Prompt *p;
    int n, cap;
} PromptList;

static void add_prompt(PromptList *pl, const char *text, size_t len, const char *origin) {
    if (pl->n == pl->cap) {
        pl->cap = pl->cap ? 2 * pl->cap : 16;
        pl->p = realloc(pl->p, (size_t)pl->cap * sizeof(Prompt));
        if (!pl->p) die("out of memory reading prompts");
    }
    Prompt *p = &pl->p[pl->n++];
    p->text = xmalloc(len + 1);
    memcpy(p->text, text, len);
    p->text[len] = 0;
    p->len = len;
    // the index the output gives it ("[1] text", "index": 1), then where it came from
    snprintf(p->origin, sizeof(p->origin), "prompt [%d] (%.256s)", pl->n - 1, origin);
}


// One prompt per line (empty lines skipped), or with a .jsonl name one JSON object with a
// "prompt" string per non-empty line.
static void read_prompts_file(PromptList *pl, const char *path) {
    size_t len;
    char *buf = read_file(path, &len);
    if (!buf) die("cannot read --prompts '%s': %s", path, strerror(errno));
    const int jsonl = corpus_path_is_jsonl(path);   // as prep reads a corpus
    long line_no = 0;
    size_t pos = 0, n;
    for (char *line; (line = buf_next_line(buf, len, &pos, &n));) {
        line_no++;
        if (n == 0) continue;
        char origin[256];
        snprintf(origin, sizeof(origin), "%s line %ld", path, line_no);
        if (!jsonl) { add_prompt(pl, line, n, origin); continue; }
        char jerr[256];
        cJSON *o = json_parse_line(line, n, jerr, sizeof(jerr));
        if (!o) die("%s: %s", origin, jerr);
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
        if (!cJSON_IsObject(o) || !cJSON_IsString(pr))
            die("%s: not a JSON object with a \"prompt\" string: fix the line (or give plain text in a file not named .jsonl or .json)", origin);
        add_prompt(pl, pr->valuestring, strlen(pr->valuestring), origin);
        cJSON_Delete(o);
    }
    free(buf);
}

// ---------------------------------------------------------------- one sequence

enum { RUNNING = 0, STOP_LENGTH, STOP_TOKEN, STOP_STRING };
static const char *const STOP_NAMES[] = {"running", "length", "stop_token", "stop_string"};

typedef struct Seq {
    int index;
    int32_t *prompt;
    int plen;
    int32_t *gen;        // generated ids (max_new)
    int n_gen;
    ByteVec text;        // the completion's bytes (a stop string cut off)
    size_t emitted;      // bytes already streamed
    int stop;            // RUNNING or the reason it ended
    int slot;            // decoder sequence id while active, else -1
    int32_t pending;     // sampled, to be fed by the next step
    Rng rng;
    double t_start;
} Seq;

typedef struct Gen {
    const Tokenizer *tok;
    int max_new, V_tok;
    int *gap_ids;        // ids below V_tok the tokenizer lacks (its ids may have gaps, docs/FORMAT.md)
    int n_gaps;
    const int32_t *stop_tokens;
    int n_stop_tokens;
    const char *const *stops;
    int n_stops;
    int json, stream;
    Sampler sampler;
} Gen;

// Appends token id to s: stop token, then its bytes, then stop strings, then the length limit.
static void take_token(const Gen *g, Seq *s, int32_t id) {
    s->gen[s->n_gen++] = id;
    for (int i = 0; i < g->n_stop_tokens; i++)
        if (g->stop_tokens[i] == id) { s->stop = STOP_TOKEN; return; }
    size_t blen = 0, before = s->text.n;
    int special;
    const uint8_t *b = tok_bytes(g->tok, (uint32_t)id, &blen, &special);
    if (b) bytevec_append(&s->text, b, blen);
    // the earliest match of any stop string wins, whatever order the strings were given in: cut
    // it and what follows
    size_t cut = SIZE_MAX;
    for (int i = 0; i < g->n_stops && s->text.n > before; i++) {
        size_t sl = strlen(g->stops[i]);
        if (sl > s->text.n) continue;
        // a match must end in the new bytes: start searching sl - 1 bytes before them
        size_t from = before >= sl - 1 ? before - (sl - 1) : 0;
        for (size_t p = from; p + sl <= s->text.n && p < cut; p++)
            if (!memcmp(s->text.v + p, g->stops[i], sl)) { cut = p; break; }
    }
    if (cut != SIZE_MAX) {
        s->text.n = cut;
        s->stop = STOP_STRING;
    }
    if (s->stop == RUNNING && s->n_gen >= g->max_new) s->stop = STOP_LENGTH;
    if (s->stop == RUNNING) s->pending = id;
}

// The bytes at the end of text that a stop string could still complete: the longest suffix that
// is a proper prefix of some stop string (a match ending in later bytes starts within it).
static size_t stop_prefix_tail(const Gen *g, const ByteVec *text) {
    size_t hold = 0;
    for (int i = 0; i < g->n_stops; i++) {
        const size_t sl = strlen(g->stops[i]);
        for (size_t h = sl - 1 < text->n ? sl - 1 : text->n; h > hold; h--)
            if (!memcmp(text->v + text->n - h, g->stops[i], h)) { hold = h; break; }
    }
    return hold;
}

// Streams what can no longer become part of a stop string (everything once the sequence ended).
static void stream_out(const Gen *g, Seq *s) {
    if (!g->stream) return;
    const size_t hold = s->stop == RUNNING ? stop_prefix_tail(g, &s->text) : 0;
    size_t safe = s->text.n > hold ? s->text.n - hold : 0;
    if (safe > s->emitted) {
        if (fwrite(s->text.v + s->emitted, 1, safe - s->emitted, stdout) != safe - s->emitted) die_stdout();
        fflush(stdout);
        s->emitted = safe;
    }
}

// A JSON string of the bytes b[0..n): invalid UTF-8 replaced (utf8_sanitize), then escaped by hand
// rather than through cJSON, whose strings end at a NUL: a byte-level token 0 is a NUL, and the
// text after it would silently go (\u0000 is written instead).
static void append_json_string(ByteVec *out, const uint8_t *b, size_t n) {
    ByteVec v = {0};
    utf8_sanitize(&v, b, n);
    bytevec_append(out, "\"", 1);
    for (size_t i = 0; i < v.n; i++) {
        const uint8_t c = v.v[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            bytevec_append(out, esc, 2);
        } else if (c < 0x20) {
            const char *named = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (named) bytevec_append(out, named, 2);
            else {
                snprintf(esc, sizeof(esc), "\\u%04x", c);
                bytevec_append(out, esc, 6);
            }
        } else {
            bytevec_append(out, &c, 1);
        }
    }
    bytevec_append(out, "\"", 1);
    free(v.v);
}

static void print_finished(const Gen *g, const Seq *s, const Prompt *p, double now) {
    if (g->stream) {
        fputc('\n', stdout);
    } else if (g->json) {
        // index, prompt and completion first (the texts escaped here), then cJSON's print of the
        // rest without its opening brace
        ByteVec line = {0};
        char head[48];
        snprintf(head, sizeof(head), "{\"index\":%d,\"prompt\":", s->index);
        bytevec_append(&line, head, strlen(head));
        append_json_string(&line, (const uint8_t *)p->text, p->len);
        bytevec_append(&line, ",\"completion\":", 14);
        append_json_string(&line, s->text.v, s->text.n);
        bytevec_append(&line, ",", 1);
        cJSON *o = cJSON_CreateObject();
        cJSON *ids = cJSON_AddArrayToObject(o, "tokens");
        for (int i = 0; i < s->n_gen; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(s->gen[i]));
        cJSON_AddNumberToObject(o, "prompt_tokens", s->plen);
        cJSON_AddNumberToObject(o, "completion_tokens", s->n_gen);
        cJSON_AddStringToObject(o, "stop_reason", STOP_NAMES[s->stop]);
        cJSON_AddNumberToObject(o, "seconds", now - s->t_start);
        char *rest = cJSON_PrintUnformatted(o);
        if (!rest) die("out of memory printing a JSON line");
        bytevec_append(&line, rest + 1, strlen(rest + 1));
        bytevec_append(&line, "\n", 1);
        if (fwrite(line.v, 1, line.n, stdout) != line.n) die_stdout();
        cJSON_free(rest);
        free(line.v);
        cJSON_Delete(o);
    } else {
        printf("[%d] ", s->index);
        if (fwrite(s->text.v, 1, s->text.n, stdout) != s->text.n) die_stdout();
        fputc('\n', stdout);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) die_stdout();
}

// What a finished sequence and its prompt held, once printed.
static void seq_free(Seq *s, Prompt *p) {
    free(s->prompt);
    free(s->gen);
    free(s->text.v);
    free(p->text);
    s->prompt = s->gen = NULL;
    s->text = (ByteVec){0};
    p->text = NULL;
}

// ---------------------------------------------------------------- options

int cmd_generate(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla generate --model DIR (--prompt TEXT ... | --prompts FILE) [--max-new-tokens N] [--temperature T]\n"
               "                     [--top-k K] [--top-p P] [--seed S] [--stop TEXT ...] [--stop-token ID ...] [--json]\n"
               "Continues each prompt through the model's KV cache. One prompt streams its text as it comes; several print\n"
               "each completion when it ends ([index] text, or a JSON line with --json). Speeds and cache bytes go to stderr.",
               NULL, NULL, 0);
#define OPT(name) args_get(&a, SPECS, N_SPECS, name)
    const char *dir = OPT("model");
    if (!dir) die("clla generate needs --model DIR: see clla generate --help");

    // ---- settings (all checked before the model is read)
    const char *v;
    int max_new = (v = OPT("max-new-tokens")) ? (int)args_int("max-new-tokens", v, 0, 1 << 24) : 64;
    SamplerParams sp = {0.0f, 0, 1.0f};
    // read as doubles; a temperature is refused where the sampler's float would change its meaning
    // (one that underflows to greedy or overflows); top-p stays a double
    if ((v = OPT("temperature"))) {
        const double t = args_double("temperature", v);
        sp.temperature = (float)t;
        if (t > 0 && !(sp.temperature >= FLT_MIN && isfinite(sp.temperature)))
            die("--temperature %s is out of range: a positive temperature lies between %g and %g (0 is greedy)", v, (double)FLT_MIN,
                (double)FLT_MAX);
    }
    if ((v = OPT("top-k"))) sp.top_k = (int)args_int("top-k", v, -2147483647LL, 2147483647LL);
    if ((v = OPT("top-p"))) {
        const double p = args_double("top-p", v);
        sp.top_p = p;
        if (!(p > 0 && p <= 1)) die("--top-p %s is out of range: use a value in (0, 1] (1 = off)", v);
    }
    char err[1024];
    if (sampler_check(&sp, err, sizeof(err)) != 0) die("%s", err);
    unsigned long long seed = (v = OPT("seed")) ? (unsigned long long)args_int("seed", v, 0, 9223372036854775807LL) : 0;
    int batch_opt = (v = OPT("batch")) ? (int)args_int("batch", v, 1, 4096) : 0;
    const char *stops[MAX_LIST], *stop_tok_s[MAX_LIST], *prompt_args[MAX_LIST], *codec_specs[MAX_LIST];
    int n_stops = args_get_all(&a, SPECS, N_SPECS, "stop", stops, MAX_LIST);
    int n_stop_tok = args_get_all(&a, SPECS, N_SPECS, "stop-token", stop_tok_s, MAX_LIST);
    int n_prompt_args = args_get_all(&a, SPECS, N_SPECS, "prompt", prompt_args, MAX_LIST);
    int n_codecs = args_get_all(&a, SPECS, N_SPECS, "cache-codec", codec_specs, MAX_LIST);
    for (int i = 0; i < n_stops; i++)
        if (!stops[i][0]) die("--stop '': a stop string must not be empty");
    if (n_prompt_args && OPT("prompts"))
        die("--prompt and --prompts both given: put every prompt in the file, or give them all with --prompt");
    PromptList pl = {0};
    for (int i = 0; i < n_prompt_args; i++) {
        char origin[64];
        snprintf(origin, sizeof(origin), "--prompt %d", i + 1);
        add_prompt(&pl, prompt_args[i], strlen(prompt_args[i]), origin);
    }
    if ((v = OPT("prompts"))) read_prompts_file(&pl, v);
    if (pl.n == 0) die("no prompt: give --prompt TEXT (repeatable) or --prompts FILE");
    for (int i = 0; i < pl.n; i++)
        if (pl.p[i].len == 0) die("%s: the prompt is empty: give at least one character", pl.p[i].origin);

    // ---- model, cache layout, tokenizer
    Config cfg;
    Model model;
    ModelDir md;
    model_source_load(&md, &model, &cfg, dir, device_backend(OPT("device")));
    apply_cache_codec_args(&md.cache, codec_specs, n_codecs);
    const CacheLayout *layout = &md.cache;
    Tokenizer *tok = open_tokenizer(OPT("tokenizer"), &md, cfg.model.vocab_size, cfg.train.tokenizer_hash);
    const int V = cfg.model.vocab_size, ctx = cfg.model.max_position_embeddings;
    int32_t stop_tokens[MAX_LIST + 1];
    int n_stop_tokens = 0;
    for (int i = 0; i < n_stop_tok; i++) stop_tokens[n_stop_tokens++] = (int32_t)args_int("stop-token", stop_tok_s[i], 0, V - 1);
    uint32_t eos = tok_special_id(tok, "<|endoftext|>");
    if (!OPT("ignore-eos") && eos != TOK_NONE) stop_tokens[n_stop_tokens++] = (int32_t)eos;

    // ---- prompts to tokens, each checked against the context
    TokEncoder *enc = tok_encoder_new(tok);
    Seq *seqs = xcalloc((size_t)pl.n, sizeof(Seq));
    long long prompt_tokens = 0;
    int max_len = 1;
    for (int i = 0; i < pl.n; i++) {
        const Prompt *p = &pl.p[i];
        size_t bad = utf8_first_invalid((const uint8_t *)p->text, p->len);
        if (bad < p->len)
            warn("%s is not valid UTF-8 (byte %zu of %zu): its bytes are encoded as they are", p->origin, bad + 1, p->len);
        U32Vec ids = {0};
        tok_encode(enc, p->text, p->len, 1, &ids);
        if ((long long)ids.n > ctx)
            die("%s is %zu tokens, more than the model's context of %d (max_position_embeddings): shorten the prompt",
                p->origin, ids.n, ctx);
        if ((long long)ids.n + max_new > ctx)
            die("%s is %zu tokens; with --max-new-tokens %d that makes %lld, more than the model's context of %d "
                "(max_position_embeddings): shorten the prompt or lower --max-new-tokens",
                p->origin, ids.n, max_new, (long long)ids.n + max_new, ctx);
        Seq *s = &seqs[i];
        s->index = i;
        s->plen = (int)ids.n;
        s->prompt = xmalloc(ids.n * sizeof(int32_t));
        for (size_t k = 0; k < ids.n; k++) s->prompt[k] = (int32_t)ids.v[k];
        s->slot = -1;
        // the prompt's own stream: its tokens do not depend on the batch it is decoded in
        rng_seed(&s->rng, seed ^ (0x9E3779B97F4A7C15ull * (unsigned long long)(i + 1)));
        prompt_tokens += s->plen;
        if (s->plen + max_new > max_len) max_len = s->plen + max_new;
        free(ids.v);
    }
    tok_encoder_free(enc);

    // ---- decode
    const int batch = batch_opt ? (batch_opt < pl.n ? batch_opt : pl.n) : (pl.n < 64 ? pl.n : 64);
    Gen g = {.tok = tok, .max_new = max_new, .stop_tokens = stop_tokens, .n_stop_tokens = n_stop_tokens,
             .stops = stops, .n_stops = n_stops, .json = OPT("json") != NULL};
    g.stream = !g.json && pl.n == 1;
    // sample only ids the tokenizer can print (a model's vocab may be padded beyond it)
    g.V_tok = (int)tok_vocab_size(tok);
    sampler_init(&g.sampler, &sp, g.V_tok);
    // nor the ids inside that range the tokenizer lacks: each would be "generated" and print nothing
    g.gap_ids = xmalloc((size_t)g.V_tok * sizeof(int));
    for (int id = 0; id < g.V_tok; id++) {
        size_t blen;
        int special;
        if (!tok_bytes(tok, (uint32_t)id, &blen, &special)) g.gap_ids[g.n_gaps++] = id;
    }
    Decoder *dec = decoder_new(&model, layout, batch, max_len);
    {
        // refused before the prefill rather than killed by the kernel mid-way (model/mem_plan.h)
        // a prefill forward's positions (model/decode.h), as rows of the longest prompt
        int *plens = xmalloc((size_t)pl.n * sizeof(int)), longest = 1;
        for (int i = 0; i < pl.n; i++) {
            plens[i] = seqs[i].plen;
            if (plens[i] > longest) longest = plens[i];
        }
        const long long most = decoder_prefill_positions(plens, pl.n, batch);
        free(plens);
        const int rows = (int)((most + longest - 1) / longest);
        const int bt = decoder_block_tokens(dec);
        const double blocks = (double)((max_len + bt - 1) / bt);
        mem_check_fits_decode(&cfg, model.be, rows, longest, (double)batch * blocks * bt * decoder_bytes_per_token(dec));
    }
    Seq **slot = xcalloc((size_t)batch, sizeof(Seq *));
    float *logits = xmalloc((size_t)batch * V * sizeof(float));
    int *ids = xmalloc((size_t)batch * sizeof(int)), *lens = xmalloc((size_t)batch * sizeof(int));
    const int32_t **prompts = xmalloc((size_t)batch * sizeof(int32_t *));
    int32_t *feed = xmalloc((size_t)batch * sizeof(int32_t));
    Seq **batch_seqs = xmalloc((size_t)batch * sizeof(Seq *));
    double t_prefill = 0, t_decode = 0, t0 = now_seconds();
    long long decoded = 0, generated = 0, peak_tokens = 0;
    size_t peak_bytes = 0;
    int next = 0, active = 0;
    while (next < pl.n || active > 0) {
        for (int phase = 0; phase < 2; phase++) {
            // phase 0: prefill waiting prompts into free slots; phase 1: one step of every active sequence
            int n = 0;
            for (int k = 0; k < batch; k++) {
                if (phase == 0 && !slot[k] && next < pl.n) {
                    Seq *s = &seqs[next++];
                    // its generation buffer while it runs: a file of many prompts holds only the
                    // --batch running ones' (tests/test_input_memory.sh)
                    s->gen = xmalloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t));
                    s->slot = k;
                    s->t_start = now_seconds();
                    slot[k] = s;
                    active++;
                    ids[n] = k;
                    prompts[n] = s->prompt;
                    lens[n] = s->plen;
                    batch_seqs[n++] = s;
                } else if (phase == 1 && slot[k] && slot[k]->stop == RUNNING && slot[k]->n_gen > 0) {
                    ids[n] = k;
                    feed[n] = slot[k]->pending;
                    batch_seqs[n++] = slot[k];
                }
            }
            if (n == 0) continue;
            double ts = now_seconds();
            if (phase == 0) decoder_prefill(dec, n, ids, prompts, lens, logits);
            else decoder_step(dec, n, ids, feed, logits);
            double te = now_seconds();
            if (phase == 0) t_prefill += te - ts;
            else { t_decode += te - ts; decoded += n; }
            // two peaks: the blocks' bytes never go down (a finished sequence's blocks are kept for
            // the next), and the tokens stored at once may peak before or after them
            size_t bytes = decoder_cache_bytes(dec);
            if (bytes > peak_bytes) peak_bytes = bytes;
            long long stored = 0;
            for (int k = 0; k < batch; k++) if (slot[k]) stored += decoder_seq_len(dec, k);
            if (stored > peak_tokens) peak_tokens = stored;
            for (int i = 0; i < n; i++) {
                Seq *s = batch_seqs[i];
                if (max_new == 0) s->stop = STOP_LENGTH;
                else {
                    float *row = logits + (size_t)i * V;
                    for (int j = 0; j < g.n_gaps; j++) row[g.gap_ids[j]] = -INFINITY;   // never chosen
                    const int chosen = sampler_next(&g.sampler, row, &s->rng);
                    if (chosen < 0)
                        die("%s: after %d generated tokens no logit of the model is finite (NaN or infinite outputs): its weights "
                            "have diverged or are damaged; use another checkpoint",
                            pl.p[s->index].origin, s->n_gen);
                    take_token(&g, s, chosen);
                    generated++;
                }
                stream_out(&g, s);
                if (s->stop != RUNNING) {
                    print_finished(&g, s, &pl.p[s->index], now_seconds());
                    seq_free(s, &pl.p[s->index]);
                    decoder_release(dec, s->slot);
                    slot[s->slot] = NULL;
                    s->slot = -1;
                    active--;
                }
            }
        }
    }
    double total = now_seconds() - t0;
    char codecs[512];
    model_dir_describe_cache(decoder_layout(dec), codecs, sizeof(codecs));
    fprintf(stderr,
            "generate: %d prompt%s, %lld prompt tokens in %.3f s (%.1f tok/s prefill), %lld tokens generated, "
            "%lld decoded in %.3f s (%.1f tok/s decode), %.3f s in all\n"
            "cache: %zu bytes held at the peak (at most %lld tokens stored at once), %.10g bytes per token (%s)\n",
            pl.n, pl.n == 1 ? "" : "s", prompt_tokens, t_prefill, t_prefill > 0 ? prompt_tokens / t_prefill : 0.0, generated,
            decoded, t_decode, t_decode > 0 ? decoded / t_decode : 0.0, total, peak_bytes, peak_tokens,
            decoder_bytes_per_token(dec), codecs);

    decoder_free(dec);
    sampler_free(&g.sampler);
    free(g.gap_ids);
    free(seqs);   // each freed when it finished
    free(pl.p);
    free(slot);
    free(logits);
    free(ids);
    free(lens);
    free(prompts);
    free(feed);
    free(batch_seqs);
    tok_free(tok);
    model_dir_free(&md);
    model_free(&model);
    return 0;
#undef OPT
}
