// The tokenizer text file (docs/FORMAT.md): tiktoken's "base64 rank" lines, plus
// '#' directive lines for what tiktoken keeps in code: the pattern name and the special
// tokens. A plain .tiktoken file therefore loads once a "#pattern NAME" line is added.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "data/tokenizer.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_value(char c) {
    const char *p = c ? strchr(B64, c) : NULL;
    return p ? (int)(p - B64) : -1;
}

// Strict standard base64 with padding; returns the decoded length or -1.
// The decoded length; -1 not base64 (or not canonical), -2 longer than cap bytes.
static long b64_decode(const char *s, size_t n, uint8_t *out, size_t cap) {
    if (n == 0 || n % 4 != 0) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) { v[k] = 0; pad++; continue; }
            if (pad) return -1;  // data after padding
            v[k] = b64_value(s[i + k]);
            if (v[k] < 0) return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        // canonical only: the bits a padded group leaves over are zero ("QUJ=" is not "AB")
        if (pad && (w & ((1u << (8 * pad)) - 1))) return -1;
        uint8_t b[3] = {(uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w};
        for (int k = 0; k < 3 - pad; k++) {
            if (o >= cap) return -2;
            out[o++] = b[k];
        }
    }
    return (long)o;
}

static void b64_encode(const uint8_t *p, size_t n, FILE *f) {
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16;
        if (i + 1 < n) w |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) w |= p[i + 2];
        fputc(B64[w >> 18 & 63], f);
        fputc(B64[w >> 12 & 63], f);
        fputc(i + 1 < n ? B64[w >> 6 & 63] : '=', f);
        fputc(i + 2 < n ? B64[w & 63] : '=', f);
    }
}

// Parses a decimal id; -1 on anything else.
static long long parse_id(const char *s, size_t n) {
    if (n == 0 || n > 10) return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

typedef struct Line {
    const char *s;
    size_t n;
    size_t no;
} Line;

// Iterates lines of buf; strips a trailing '\r'. Returns 0 at the end.
static int next_line(const char *buf, size_t len, size_t *pos, Line *ln) {
    if (*pos >= len) return 0;
    const char *s = buf + *pos;
    const char *nl = memchr(s, '\n', len - *pos);
    size_t n = nl ? (size_t)(nl - s) : len - *pos;
    *pos += n + (nl ? 1 : 0);
    if (n && s[n - 1] == '\r') n--;
    ln->s = s;
    ln->n = n;
    ln->no++;
    return 1;
}

static int starts(const Line *ln, const char *prefix) {
    size_t k = strlen(prefix);
    return ln->n >= k && !memcmp(ln->s, prefix, k);
}

Tokenizer *tok_parse(const char *buf, size_t len, const char *name, char *err, size_t errlen) {
    char pattern[32] = "";
    size_t pos = 0;
    Line ln = {0};
    while (next_line(buf, len, &pos, &ln))
        if (starts(&ln, "#pattern ")) {
            size_t k = ln.n - 9;
            if (k == 0 || k >= sizeof(pattern)) {
                snprintf(err, errlen, "%s:%zu: '#pattern' needs a name (one of gpt2 cl100k llama3)", name, ln.no);
                return NULL;
            }
            if (pattern[0]) {   // which one was meant is not ours to guess
                snprintf(err, errlen, "%s:%zu: a second '#pattern' line: a tokenizer file names its pattern once", name, ln.no);
                return NULL;
            }
            memcpy(pattern, ln.s + 9, k);
            pattern[k] = 0;
        }
    if (!pattern[0]) {
        snprintf(err, errlen, "%s: no '#pattern NAME' line: add one naming the pre-tokenization pattern (gpt2, cl100k or llama3)", name);
        return NULL;
    }
    char perr[256];
    Tokenizer *t = tok_new(pattern, perr, sizeof(perr));
    if (!t) {
        snprintf(err, errlen, "%s: %s", name, perr);
        return NULL;
    }
    uint8_t bytes[TOK_MAX_TOKEN_BYTES];
    pos = 0;
    ln.no = 0;
    size_t n_tokens = 0;
    while (next_line(buf, len, &pos, &ln)) {
        if (ln.n == 0) continue;
        const char *sp = memchr(ln.s, ' ', ln.n);
        if (starts(&ln, "#special ")) {
            // "#special TEXT ID": TEXT runs to the last space (special strings have no spaces).
            const char *last = ln.s + ln.n;
            while (last > ln.s + 9 && last[-1] != ' ') last--;
            size_t tn = (size_t)(last - (ln.s + 9));
            long long id = parse_id(last, (size_t)(ln.s + ln.n - last));
            if (tn < 2 || id < 0) {
                snprintf(err, errlen, "%s:%zu: expected '#special TEXT ID'", name, ln.no);
                tok_free(t);
                return NULL;
            }
            if (!tok_special_text_ok(ln.s + 9, (size_t)(last - 1 - (ln.s + 9)))) {
                snprintf(err, errlen, "%s:%zu: a special token's text holds white space or a control character (docs/FORMAT.md): '#special TEXT ID' with TEXT without them", name, ln.no);
                tok_free(t);
                return NULL;
            }
            if (id >= TOK_MAX_ID) {
                snprintf(err, errlen, "%s:%zu: id %lld is too large: ids are below %u", name, ln.no, id, (unsigned)TOK_MAX_ID);
                tok_free(t);
                return NULL;
            }
            if (tok_add(t, (uint32_t)id, (const uint8_t *)ln.s + 9, tn - 1, 1, perr, sizeof(perr)) != 0) {
                snprintf(err, errlen, "%s:%zu: %s", name, ln.no, perr);
                tok_free(t);
                return NULL;
            }
            continue;
        }
        if (ln.s[0] == '#') continue;  // "#clla-tokenizer 1", "#pattern", comments
        long long id = sp ? parse_id(sp + 1, (size_t)(ln.s + ln.n - sp - 1)) : -1;
        long blen = sp ? b64_decode(ln.s, (size_t)(sp - ln.s), bytes, sizeof(bytes)) : -1;
        if (id < 0 || blen <= 0) {
            // which part is wrong, where the line's shape is right
            if (!sp || id < 0)
                snprintf(err, errlen, "%s:%zu: expected 'BASE64 RANK' (standard base64 of the token bytes, a space, a decimal rank)",
                         name, ln.no);
            else if (blen == -2)
                snprintf(err, errlen, "%s:%zu: the token is longer than %d bytes: a token is 1..%d bytes (docs/FORMAT.md)", name, ln.no,
                         TOK_MAX_TOKEN_BYTES, TOK_MAX_TOKEN_BYTES);
            else
                snprintf(err, errlen, "%s:%zu: the token's base64 is not canonical standard base64 (the bits a padded group leaves over "
                         "must be zero; '=' only at the end)", name, ln.no);
            tok_free(t);
            return NULL;
        }
        if (id >= TOK_MAX_ID) {
            snprintf(err, errlen, "%s:%zu: rank %lld is too large: ranks are below %u", name, ln.no, id, (unsigned)TOK_MAX_ID);
            tok_free(t);
            return NULL;
        }
        if (tok_add(t, (uint32_t)id, bytes, (size_t)blen, 0, perr, sizeof(perr)) != 0) {
            snprintf(err, errlen, "%s:%zu: %s", name, ln.no, perr);
            tok_free(t);
            return NULL;
        }
        n_tokens++;
    }
    if (n_tokens == 0 || tok_finish(t, perr, sizeof(perr)) != 0) {
        snprintf(err, errlen, "%s: %s", name, n_tokens ? perr : "no 'BASE64 RANK' token lines");
        tok_free(t);
        return NULL;
    }
    return t;
}

Tokenizer *tok_load(const char *path) {
    size_t len = 0;
    char *buf = read_file(path, &len);
    if (!buf) die("cannot read tokenizer file '%s': %s (train one with 'clla tokenizer train' or run scripts/setup.sh for gpt2)", path, strerror(errno));
    char err[512];
    Tokenizer *t = tok_parse(buf, len, path, err, sizeof(err));
    free(buf);
    if (!t) die("%s", err);
    return t;
}

int tok_save(const Tokenizer *t, const char *path, OutMode mode) {
    AtomicFile af;
    if (atomic_open(&af, path, mode) != 0) return -1;
    fprintf(af.f, "#clla-tokenizer 1\n#pattern %s\n", tok_pattern(t));
    uint32_t n = tok_vocab_size(t);
    for (uint32_t id = 0; id < n; id++) {
        size_t len;
        int special;
        const uint8_t *b = tok_bytes(t, id, &len, &special);
        if (b && special) fprintf(af.f, "#special %.*s %u\n", (int)len, (const char *)b, id);
    }
    for (uint32_t id = 0; id < n; id++) {
        size_t len;
        int special;
        const uint8_t *b = tok_bytes(t, id, &len, &special);
        if (!b || special) continue;
        b64_encode(b, len, af.f);
        fprintf(af.f, " %u\n", id);
    }
    return atomic_commit(&af);
}
