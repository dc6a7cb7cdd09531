// Tokenizer tests: a tiny vocabulary trained on the committed fixtures (tests/fixtures/),
// byte round-trips of random input including invalid UTF-8 for every pattern, the
// O(n log n) merge path against a naive reference, special tokens, the file format and
// its error messages, and GPT-2's ids for a known sentence when data_cache has them.
// Output: one line per check, then "N passed, M failed"; exit status 1 on any failure.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/bpe_train.h"
#include "data/corpus.h"
#include "data/tokenizer.h"

static int n_passed, n_failed;

static void check(int ok, const char *fmt, const char *what) {
    if (ok) n_passed++;
    else n_failed++;
    printf("%s ", ok ? "ok  " : "FAIL");
    printf(fmt, what);
    printf("\n");
}

static const char *src_dir(void) {
    const char *s = getenv("SRC");
    return s && *s ? s : ".";
}

static Tokenizer *train_fixture(const char *pattern, uint32_t vocab) {
    char err[256];
    BpeTrainer *bt = bpe_trainer_new(pattern, err, sizeof(err));
    if (!bt) { fprintf(stderr, "%s\n", err); exit(1); }
    const char *files[2] = {"tests/fixtures/english.jsonl", "tests/fixtures/chinese.jsonl"};
    for (int f = 0; f < 2; f++) {
        char *p = path_join(src_dir(), files[f]);
        DocOptions o = {"text", NULL};
        DocReader *r = doc_open(p, &o);
        const char *text;
        size_t len;
        while (doc_next(r, &text, &len)) bpe_trainer_add(bt, text, len);
        doc_close(r);
        free(p);
    }
    const char *specials[] = {"<|endoftext|>", "<|pad|>"};
    Tokenizer *t = bpe_trainer_finish(bt, vocab, specials, 2, 0, err, sizeof(err));
    if (!t) { fprintf(stderr, "%s\n", err); exit(1); }
    bpe_trainer_free(bt);
    return t;
}

static uint64_t rng_state = 0x1234567;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

// Random bytes biased towards what breaks tokenizers: invalid UTF-8 (lone continuation
// bytes, truncated sequences, overlong forms, surrogates), multi-byte characters, runs of
// whitespace and letters long enough for the heap merge path, NUL bytes.
static size_t random_text(uint8_t *buf, size_t cap) {
    size_t n = 0, want = rnd() % cap;
    static const char *frags[] = {"\xe4\xbd\xa0\xe5\xa5\xbd", "\xc3\xa9", "\xf0\x9f\x98\x80", "\x80", "\xbf\xbf",
                                  "\xe4\xbd", "\xc0\xaf", "\xed\xa0\x80", "\xf8\x88\x80\x80\x80", "\xff\xfe",
                                  "'s", "'ll", " the", "\r\n", "\t", "\xc2\xa0", "\xe2\x80\xa8", "\xef\xbb\xbf",
                                  "<|endoftext|>", "12345", "\x00"};
    while (n < want) {
        uint32_t k = rnd() % 10;
        if (k < 3) buf[n++] = (uint8_t)rnd();
        else if (k < 6) {
            const char *f = frags[rnd() % (sizeof(frags) / sizeof(frags[0]))];
            size_t l = strlen(f) ? strlen(f) : 1;
            for (size_t i = 0; i < l && n < cap; i++) buf[n++] = (uint8_t)f[i];
        } else if (k < 8) buf[n++] = (uint8_t)('a' + rnd() % 26);
        else {
            size_t run = rnd() % 200;
            uint8_t c = rnd() % 2 ? ' ' : (uint8_t)('a' + rnd() % 3);
            for (size_t i = 0; i < run && n < cap; i++) buf[n++] = c;
        }
    }
    return n;
}

static int roundtrip(Tokenizer *t, TokEncoder *e, const uint8_t *text, size_t len, int allow_special) {
    U32Vec ids = {0};
    ByteVec out = {0};
    tok_encode(e, (const char *)text, len, allow_special, &ids);
    int ok = tok_decode(t, ids.v, ids.n, &out, NULL) == 0 && out.n == len && (len == 0 || !memcmp(out.v, text, len));
    free(ids.v);
    free(out.v);
    return ok;
}

// tiktoken's merge rule written as plainly as possible: repeatedly merge the leftmost
// adjacent pair whose concatenation has the lowest rank.
static void naive_bpe(const Tokenizer *t, const uint8_t *p, size_t n, U32Vec *out) {
    size_t *b = malloc((n + 1) * sizeof(size_t)), m = n;
    for (size_t i = 0; i <= n; i++) b[i] = i;
    for (;;) {
        uint32_t best = TOK_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            uint32_t r = tok_lookup(t, p + b[i], b[i + 2] - b[i]);
            if (r < best) { best = r; bi = i; }
        }
        if (best == TOK_NONE) break;
        memmove(b + bi + 1, b + bi + 2, (m - bi - 1) * sizeof(size_t));
        m--;
    }
    for (size_t i = 0; i < m; i++) u32vec_push(out, tok_lookup(t, p + b[i], b[i + 1] - b[i]));
    free(b);
}

static void test_roundtrips(void) {
    const char *patterns[] = {"gpt2", "cl100k", "llama3"};
    for (int pi = 0; pi < 3; pi++) {
        Tokenizer *t = train_fixture(patterns[pi], 600);
        TokEncoder *e = tok_encoder_new(t);
        uint8_t *buf = malloc(8192);
        int ok = 1;
        for (int it = 0; it < 300 && ok; it++) {
            size_t n = random_text(buf, 8192);
            ok = roundtrip(t, e, buf, n, it % 2);
        }
        check(ok, "random bytes (invalid UTF-8, NUL, long runs) round-trip, pattern %s", patterns[pi]);
        // Every single byte value alone and all 2-byte sequences starting with a high byte.
        ok = 1;
        for (int b = 0; b < 256 && ok; b++) {
            uint8_t c[2] = {(uint8_t)b, 0x80};
            ok = roundtrip(t, e, c, 1, 0) && roundtrip(t, e, c, 2, 0);
        }
        check(ok, "every byte value round-trips, pattern %s", patterns[pi]);
        // A 1 MiB + 17 piece without whitespace (split internally) still round-trips.
        size_t big = (1u << 20) + 17;
        uint8_t *blob = malloc(big);
        for (size_t i = 0; i < big; i++) blob[i] = (uint8_t)('a' + (i * 7 + i / 13) % 26);
        check(roundtrip(t, e, blob, big, 0), "1 MiB piece without whitespace round-trips, pattern %s", patterns[pi]);
        free(blob);
        free(buf);
        tok_encoder_free(e);
        tok_free(t);
    }
}

static void test_trained(void) {
    Tokenizer *t = train_fixture("gpt2", 512);
    check(tok_vocab_size(t) == 512, "trained vocabulary has exactly the asked size%s", "");
    Tokenizer *t2 = train_fixture("gpt2", 512);
    check(tok_hash(t) == tok_hash(t2), "training is deterministic (same hash twice)%s", "");
    tok_free(t2);
    check(tok_special_id(t, "<|endoftext|>") == 510 && tok_special_id(t, "<|pad|>") == 511,
          "special tokens take the last ids%s", "");
    // Compression on the fixture text: fewer tokens than bytes.
    char *p = path_join(src_dir(), "tests/fixtures/english.jsonl");
    size_t len;
    char *text = read_file(p, &len);
    TokEncoder *e = tok_encoder_new(t);
    U32Vec ids = {0};
    tok_encode(e, text, len, 0, &ids);
    printf("     fixture: %zu bytes -> %zu tokens with a 512-token vocabulary\n", len, ids.n);
    check(ids.n < len * 2 / 3, "a trained vocabulary compresses its corpus (< 2/3 token per byte)%s", "");
    check(roundtrip(t, e, (const uint8_t *)text, len, 0), "fixture text round-trips%s", "");
    // Heap path (long pieces) equals the naive rule on single pieces of letters.
    int ok = 1;
    for (int it = 0; it < 200 && ok; it++) {
        size_t n = 1 + rnd() % 300;
        uint8_t w[300];
        for (size_t i = 0; i < n; i++) w[i] = "etaoinshrdlu"[rnd() % 12];
        U32Vec a = {0}, b = {0};
        tok_encode(e, (const char *)w, n, 0, &a);
        naive_bpe(t, w, n, &b);
        ok = a.n == b.n && !memcmp(a.v, b.v, a.n * sizeof(uint32_t));
        free(a.v);
        free(b.v);
    }
    check(ok, "merges of long and short pieces equal the naive lowest-rank-first rule%s", "");
    // Special tokens: matched only when allowed.
    const char *s = "hello<|endoftext|>world<|pad|>";
    ids.n = 0;
    tok_encode(e, s, strlen(s), 1, &ids);
    int n_special = 0;
    for (size_t i = 0; i < ids.n; i++) n_special += ids.v[i] >= 510;
    check(n_special == 2 && ids.v[ids.n - 1] == 511, "allowed special tokens become their ids%s", "");
    ids.n = 0;
    tok_encode(e, s, strlen(s), 0, &ids);
    n_special = 0;
    for (size_t i = 0; i < ids.n; i++) n_special += ids.v[i] >= 510;
    check(n_special == 0 && roundtrip(t, e, (const uint8_t *)s, strlen(s), 0),
          "special token text is ordinary text when not allowed%s", "");
    // Save / load keeps everything (the hash covers ids, bytes, specials and pattern).
    char tmp[] = "/tmp/clla_tok_XXXXXX";
    int fd = mkstemp(tmp);
    close(fd);
    check(tok_save(t, tmp, OUT_REPLACE) == 0, "tokenizer saves%s", "");
    Tokenizer *l = tok_load(tmp);
    check(tok_hash(l) == tok_hash(t) && tok_vocab_size(l) == 512, "saved tokenizer loads with the same hash%s", "");
    tok_free(l);
    unlink(tmp);
    free(ids.v);
    free(text);
    free(p);
    tok_encoder_free(e);
    tok_free(t);
}

static void expect_parse_error(const char *file, const char *needle, const char *what) {
    char err[512] = "";
    Tokenizer *t = tok_parse(file, strlen(file), "bad.tok", err, sizeof(err));
    int ok = !t && strstr(err, "bad.tok") && strstr(err, needle);
    if (!ok) printf("     got: %s\n", err);
    check(ok, "bad tokenizer file is rejected with a message: %s", what);
    tok_free(t);
}

// s with the first `from` replaced by `to` (a new string).
static char *replaced(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    size_t a = (size_t)(at - s), n = strlen(s) - strlen(from) + strlen(to) + 1;
    char *r = malloc(n);
    snprintf(r, n, "%.*s%s%s", (int)a, s, to, at + strlen(from));
    return r;
}

// A tokenizer file of the 256 single bytes as ranks 0..255 after the header lines `head`,
// NUL-terminated (f.n counts the NUL).
static ByteVec byte_vocabulary(const char *head) {
    ByteVec f = {0};
    bytevec_append(&f, head, strlen(head));
    static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; b++) {
        char line[32];
        snprintf(line, sizeof(line), "%c%c== %d\n", B64[b >> 2], B64[(b & 3) << 4], b);
        bytevec_append(&f, line, strlen(line));
    }
    bytevec_append(&f, "", 1);
    return f;
}

static void test_file_errors(void) {
    // A valid 256-byte vocabulary to damage.
    ByteVec f = byte_vocabulary("#clla-tokenizer 1\n#pattern gpt2\n");
    char err[256];
    Tokenizer *t = tok_parse((const char *)f.v, f.n - 1, "ok.tok", err, sizeof(err));
    check(t && tok_vocab_size(t) == 256, "a 256-byte rank file parses%s", "");
    tok_free(t);
    char *s = (char *)f.v;
    char *bad = strdup(s);
    memcpy(strstr(bad, "#pattern gpt2"), "#comment", 8);
    expect_parse_error(bad, "#pattern", "no pattern line");
    free(bad);
    bad = strdup(s);
    memcpy(strstr(bad, "#pattern gpt2"), "#pattern xxxx", 13);
    expect_parse_error(bad, "unknown pre-tokenization pattern", "unknown pattern");
    free(bad);
    bad = strdup(s);
    char *l = strstr(bad, "AA== 0");
    memcpy(l, "A?== 0", 6);
    expect_parse_error(bad, ":3:", "bad base64 (line number)");
    free(bad);
    bad = strdup(s);
    l = strstr(bad, "AQ== 1");
    memcpy(l, "AQ== 0", 6);
    expect_parse_error(bad, "appears twice", "duplicate rank");
    free(bad);
    bad = strdup(s);
    l = strstr(bad, "AQ== 1");
    memcpy(l, "AA== 1", 6);
    expect_parse_error(bad, "same bytes", "duplicate bytes");
    free(bad);
    bad = strdup(s);
    *strstr(bad, "/w== 255") = 0;  // drop the last line: byte 0xff then has no rank
    expect_parse_error(bad, "byte 0xff has no rank", "missing byte");
    free(bad);
    // a rank of 2^32 + 65 was cast to 65 and loaded as byte 'A''s
    bad = replaced(s, "QQ== 65\n", "QQ== 4294967361\n");
    expect_parse_error(bad, "rank 4294967361 is too large", "a rank past 32 bits");
    free(bad);
    bad = replaced(s, "QQ== 65\n", "QR== 65\n");   // 'A' with a stray low bit: not canonical base64
    expect_parse_error(bad, ":68: the token's base64 is not canonical", "base64 whose padding leaves bits set");
    free(bad);
    {   // a token of 4098 bytes ("aaa" x 1366): its own message, not "expected 'BASE64 RANK'"
        char *line = malloc(1366 * 4 + 16);
        for (int i = 0; i < 1366; i++) memcpy(line + 4 * i, "YWFh", 4);
        strcpy(line + 1366 * 4, " 300\n");
        bad = replaced(s, "#pattern gpt2\n", "#pattern gpt2\n");
        char *joined = malloc(strlen(bad) + strlen(line) + 1);
        strcpy(joined, bad);
        strcat(joined, line);
        expect_parse_error(joined, "the token is longer than 4096 bytes", "a token longer than 4096 bytes");
        free(joined);
        free(line);
        free(bad);
    }
    bad = replaced(s, "#pattern gpt2\n", "#pattern gpt2\n#pattern cl100k\n");
    expect_parse_error(bad, "a second '#pattern' line", "two pattern lines");
    free(bad);
    bad = replaced(s, "#pattern gpt2\n", "#pattern gpt2\n#special end of text 300\n");
    expect_parse_error(bad, "holds white space", "a special token with a space");
    free(bad);
    bad = replaced(s, "#pattern gpt2\n", "#pattern gpt2\n#special <|x|> 4294967296\n");
    expect_parse_error(bad, "id 4294967296 is too large", "a special id past 32 bits");
    free(bad);
    free(f.v);
}

// The special-token split by its definition: the earliest occurrence of any special (the longest
// on a tie) ends an ordinary run, searched again from each cut (tokenizer.c keeps every special's
// next occurrence instead of searching again).
static void naive_special_encode(TokEncoder *e, const char *const *sp, const uint32_t *sid, int ns, const char *text, size_t len,
                                 U32Vec *out) {
    size_t pos = 0;
    while (pos < len) {
        size_t best = len, blen = 0;
        int bi = -1;
        for (int i = 0; i < ns; i++) {
            const char *hit = memmem(text + pos, len - pos, sp[i], strlen(sp[i]));
            if (!hit) continue;
            size_t at = (size_t)(hit - text);
            if (at < best || (at == best && strlen(sp[i]) > blen)) { best = at; bi = i; blen = strlen(sp[i]); }
        }
        tok_encode(e, text + pos, best - pos, 0, out);
        if (bi < 0) break;
        u32vec_push(out, sid[bi]);
        pos = best + blen;
    }
}

static void test_special_split(void) {
    // the 256 bytes as ranks, and specials that overlap each other and share prefixes
    ByteVec f = byte_vocabulary("#clla-tokenizer 1\n#pattern gpt2\n#special <|a|> 256\n#special <|a|>b 257\n#special b<|c|> 258\n#special <|c|> 259\n");
    char err[256];
    Tokenizer *t = tok_parse((const char *)f.v, f.n - 1, "specials.tok", err, sizeof(err));
    if (!t) { printf("FAIL %s\n", err); n_failed++; free(f.v); return; }
    TokEncoder *e = tok_encoder_new(t);
    const char *sp[] = {"<|a|>", "<|a|>b", "b<|c|>", "<|c|>"};
    const uint32_t sid[] = {256, 257, 258, 259};
    const char *pieces[] = {"<|a|>", "b", "<|c|>", "x", "<|", "|>", "a", " ", "<|a", "c|>"};
    uint64_t r = 12345;
    int same = 1, texts = 0;
    for (int k = 0; k < 400 && same; k++, texts++) {
        char text[512] = "";
        for (int j = 0; j < 40; j++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            strcat(text, pieces[(r >> 33) % 10]);
        }
        U32Vec a = {0}, b = {0};
        tok_encode(e, text, strlen(text), 1, &a);
        naive_special_encode(e, sp, sid, 4, text, strlen(text), &b);
        same = a.n == b.n && !memcmp(a.v, b.v, a.n * sizeof(uint32_t));
        if (!same) printf("     differs on: %s\n", text);
        free(a.v);
        free(b.v);
    }
    check(same, "special tokens split where the naive search splits (overlapping specials, %s random texts)", "400");
    tok_encoder_free(e);
    tok_free(t);
    free(f.v);
}

static void test_gpt2(void) {
    char *cache = data_cache_dir();
    char *p = path_join(cache, "gpt2.tok");
    if (access(p, R_OK) != 0) {
        printf("skip GPT-2 ids of a known sentence: %s missing (run scripts/setup.sh)\n", p);
    } else {
        Tokenizer *t = tok_load(p);
        TokEncoder *e = tok_encoder_new(t);
        U32Vec ids = {0};
        const char *s = "Hello world<|endoftext|>";
        tok_encode(e, s, strlen(s), 1, &ids);
        // The ids GPT-2's own encoder gives (15496 "Hello", 995 " world", 50256 <|endoftext|>).
        check(ids.n == 3 && ids.v[0] == 15496 && ids.v[1] == 995 && ids.v[2] == 50256,
              "GPT-2 vocabulary gives GPT-2's ids for a known sentence%s", "");
        free(ids.v);
        tok_encoder_free(e);
        tok_free(t);
    }
    free(p);
    free(cache);
}

int main(void) {
    test_roundtrips();
    test_trained();
    test_file_errors();
    test_special_split();
    test_gpt2();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
