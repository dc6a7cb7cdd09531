// Named pre-tokenization patterns compiled with PCRE2 (UTF mode, JIT, invalid UTF-8
// tolerated). The patterns are those of GPT-2, cl100k_base and Llama 3, with \s and \S
// written as explicit classes: PCRE2's \s differs between versions and options, while
// the reference encoders define whitespace exactly (see docs/FORMAT.md, "Tokenizer file").
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/pretok.h"

#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

// JavaScript's \s (the gpt-3-encoder reference runs the GPT-2 pattern in JavaScript):
// ASCII whitespace, the Zs category, line/paragraph separators and U+FEFF.
#define WS_JS "\\t\\n\\x0b\\f\\r\\x20\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}"
// Unicode White_Space (the \s of the Rust regex engine behind tiktoken's cl100k/llama3).
#define WS_UNI "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

typedef struct NamedPattern {
    const char *name;
    const char *regex;
} NamedPattern;

static const NamedPattern PATTERNS[] = {
    {"gpt2",
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS_JS "\\p{L}\\p{N}]+"
     "|[" WS_JS "]+(?![^" WS_JS "])|[" WS_JS "]+"},
    {"cl100k",
     "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}{1,3}| ?[^" WS_UNI "\\p{L}\\p{N}]++[\\r\\n]*"
     "|[" WS_UNI "]*[\\r\\n]|[" WS_UNI "]+(?![^" WS_UNI "])|[" WS_UNI "]+"},
    {"llama3",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS_UNI "\\p{L}\\p{N}]+[\\r\\n]*"
     "|[" WS_UNI "]*[\\r\\n]+|[" WS_UNI "]+(?![^" WS_UNI "])|[" WS_UNI "]+"},
};
static const int N_PATTERNS = (int)(sizeof(PATTERNS) / sizeof(PATTERNS[0]));

struct Pretok {
    const char *name;
    pcre2_code *code;
};

struct PretokScratch {
    pcre2_match_data *md;
};

void pretok_unicode_version(char *buf, size_t len) {
    char lib[64] = "?", uni[64] = "?";
    if (pcre2_config(PCRE2_CONFIG_VERSION, lib) < 0) snprintf(lib, sizeof(lib), "?");
    if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, uni) < 0) snprintf(uni, sizeof(uni), "?");
    snprintf(buf, len, "PCRE2 %s, Unicode %s", lib, uni);
}

const char *pretok_known_names(void) { return "gpt2 cl100k llama3"; }

Pretok *pretok_new(const char *name, char *err, size_t errlen) {
    const NamedPattern *np = NULL;
    for (int i = 0; i < N_PATTERNS; i++)
        if (!strcmp(name, PATTERNS[i].name)) np = &PATTERNS[i];
    if (!np) {
        snprintf(err, errlen, "unknown pre-tokenization pattern '%s': use one of %s", name, pretok_known_names());
        return NULL;
    }
    int code_err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)np->regex, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &code_err, &err_off, NULL);
    if (!code) {
        // Only reachable with a PCRE2 built without Unicode support.
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code_err, msg, sizeof(msg));
        snprintf(err, errlen, "PCRE2 cannot compile pattern '%s' at offset %zu: %s (install a Unicode-enabled libpcre2-8)",
                 name, (size_t)err_off, (const char *)msg);
        return NULL;
    }
    // JIT is an optimization: the interpreter gives the same matches when it is unavailable.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    Pretok *p = xcalloc(1, sizeof(*p));
    p->name = np->name;
    p->code = code;
    return p;
}

void pretok_free(Pretok *p) {
    if (!p) return;
    pcre2_code_free(p->code);
    free(p);
}

const char *pretok_name(const Pretok *p) { return p->name; }

PretokScratch *pretok_scratch_new(const Pretok *p) {
    PretokScratch *s = xcalloc(1, sizeof(*s));
    s->md = pcre2_match_data_create_from_pattern(p->code, NULL);
    if (!s->md) die("out of memory creating PCRE2 match data");
    return s;
}

void pretok_scratch_free(PretokScratch *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    free(s);
}

size_t pretok_next(const Pretok *p, PretokScratch *s, const char *text, size_t len, size_t pos) {
    int rc = pcre2_match(p->code, (PCRE2_SPTR)text, len, pos, 0, s->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return len;  // only invalid UTF-8 is left: one raw piece
    if (rc < 0) return pos + 1;                 // resource limit: a one-byte piece still round-trips
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
    size_t start = ov[0], end = ov[1];
    if (start > pos) return start;  // bytes no pattern matches (invalid UTF-8) before the match
    if (end <= pos) return pos + 1; // an empty match cannot make progress
    return end;
}
