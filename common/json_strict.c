#include "common/json_strict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void line_col(const char *text, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

static cJSON *fail_at(const char *text, size_t off, char *err, size_t errlen, const char *what) {
    int line, col;
    line_col(text, off, &line, &col);
    snprintf(err, errlen, "line %d, column %d: %s", line, col, what);
    return NULL;
}

// Deepest nesting of objects and arrays (strings skipped), and where it first goes past limit.
static int too_deep(const char *text, size_t len, int limit, size_t *where) {
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > limit) { *where = i; return 1; }
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The first duplicated key of any object in the tree, or NULL.
static const char *find_duplicate(const cJSON *v) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
    size_t n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        const char *d = find_duplicate(c);
        if (d) return d;
        n++;
    }
    if (!cJSON_IsObject(v) || n < 2) return NULL;
    const char **names = malloc(n * sizeof(*names));
    if (!names) return NULL;
    size_t k = 0;
    for (const cJSON *c = v->child; c; c = c->next) names[k++] = c->string;
    qsort(names, n, sizeof(*names), cmp_names);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (!strcmp(names[i - 1], names[i])) dup = names[i];
    free(names);
    return dup;
}

// Offset of the second occurrence of "name" as a key (for the message's line and column).
static size_t key_offset(const char *text, size_t len, const char *name) {
    size_t nl = strlen(name), seen = 0;
    for (size_t i = 0; i + nl + 2 <= len; i++) {
        if (text[i] != '"' || strncmp(text + i + 1, name, nl) != 0 || text[i + 1 + nl] != '"') continue;
        size_t j = i + nl + 2;
        while (j < len && (text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r')) j++;
        if (j < len && text[j] == ':' && ++seen == 2) return i;
    }
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

// The value of 4 hex digits at p, or -1.
static int hex4(const char *p) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        const char c = p[k];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

// What cJSON lets through and JSON (RFC 8259) does not, found before it parses: a number it
// would read by strtod's looser rules (032, 32., .5, +1, 1.e3), an integer beyond 2^53 (it keeps
// doubles only, so 2^53 + 1 would silently become 2^53), a control character outside a string
// (cJSON skips every byte up to the space as whitespace), a raw control character in a string,
// or \u0000 (a C string ends there, so the rest of the string would silently go). Returns the
// offset of the problem with its description, or 0 with *what NULL.
static size_t lexical_problem(const char *text, size_t len, const char **what) {
    *what = NULL;
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c == '"') {
            for (i++; i < len && text[i] != '"'; i++) {
                if ((unsigned char)text[i] < 0x20) { *what = "a raw control character in a string: write it as \\n, \\t or \\u00XX"; return i; }
                if (text[i] == '\\') {
                    if (i + 5 < len && text[i + 1] == 'u' && !strncmp(text + i + 2, "0000", 4)) {
                        *what = "\\u0000 in a string: a NUL cannot be held here; remove it";
                        return i;
                    }
                    // a UTF-16 surrogate must come as a pair, high then low: alone it stands for
                    // no character (cJSON's error for it was a bare "syntax error")
                    const int u = i + 5 < len && text[i + 1] == 'u' ? hex4(text + i + 2) : -1;
                    if (u >= 0xDC00 && u <= 0xDFFF) {
                        *what = "a lone UTF-16 low surrogate (\\uDC00..\\uDFFF) in a string: it stands for no character; remove it";
                        return i;
                    }
                    if (u >= 0xD800 && u <= 0xDBFF) {
                        const int lo = i + 11 < len && text[i + 6] == '\\' && text[i + 7] == 'u' ? hex4(text + i + 8) : -1;
                        if (lo < 0xDC00 || lo > 0xDFFF) {
                            *what = "a lone UTF-16 high surrogate (\\uD800..\\uDBFF) in a string, not followed by a low one: it stands for no character; remove it";
                            return i;
                        }
                        i += 6;   // the pair's low half
                    }
                    i++;
                }
            }
            continue;
        }
        if (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r') { *what = "a control character outside a string"; return i; }
        if (c == '+' || c == '.') { *what = "a number must start with a digit or '-'"; return i; }
        if (c != '-' && !is_digit((char)c)) continue;
        // a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
        const size_t start = i;
        if (text[i] == '-') i++;
        if (i >= len || !is_digit(text[i])) { *what = "'-' must be followed by a digit"; return start; }
        if (text[i] == '0' && i + 1 < len && is_digit(text[i + 1])) { *what = "a number with a leading zero: JSON has no octal, write it without"; return start; }
        while (i < len && is_digit(text[i])) i++;
        int integer = 1;
        if (i < len && text[i] == '.') {
            integer = 0;
            if (++i >= len || !is_digit(text[i])) { *what = "a '.' in a number must be followed by digits"; return start; }
            while (i < len && is_digit(text[i])) i++;
        }
        if (i < len && (text[i] == 'e' || text[i] == 'E')) {
            integer = 0;
            i++;
            if (i < len && (text[i] == '+' || text[i] == '-')) i++;
            if (i >= len || !is_digit(text[i])) { *what = "an exponent must have digits"; return start; }
            while (i < len && is_digit(text[i])) i++;
        }
        if (integer) {
            const char *d = text + start + (text[start] == '-');
            const size_t nd = (size_t)(text + i - d);
            // 2^53 = 9007199254740992 (16 digits): beyond it not every integer is a double
            if (nd > 16 || (nd == 16 && strncmp(d, "9007199254740992", 16) > 0)) {
                *what = "an integer beyond 2^53 (9007199254740992), which is not held exactly; give a smaller one";
                return start;
            }
        }
        i--;   // the loop steps past the number's last character
    }
    return 0;
}

cJSON *json_parse_strict(const char *text, size_t len, char *err, size_t errlen) {
    size_t nul = strlen(text);
    if (nul < len) return fail_at(text, nul, err, errlen, "a NUL byte: this is not a JSON text file");
    const char *problem;
    const size_t problem_at = lexical_problem(text, len, &problem);
    if (problem) return fail_at(text, problem_at, err, errlen, problem);
    size_t where;
    if (too_deep(text, len, CJSON_NESTING_LIMIT, &where)) {
        char what[128];
        snprintf(what, sizeof(what), "nested deeper than the %d levels the JSON parser allows", CJSON_NESTING_LIMIT);
        return fail_at(text, where, err, errlen, what);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        // parsed as a prefix? then the value is fine and something follows it
        cJSON *prefix = cJSON_ParseWithOpts(text, &end, 0);
        if (prefix) {
            cJSON_Delete(prefix);
            while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
            return fail_at(text, (size_t)(end - text), err, errlen, "text after the end of the JSON value: remove it");
        }
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        // cJSON can stop one past the offending character: point at the last one it saw
        while (off > 0 && (off == len || text[off] == ' ' || text[off] == '\t' || text[off] == '\n' || text[off] == '\r')) off--;
        return fail_at(text, off, err, errlen, "JSON syntax error: fix the text here");
    }
    const char *dup = find_duplicate(root);
    if (dup) {
        char what[160];
        snprintf(what, sizeof(what), "duplicate key '%.100s': a key may appear once per object", dup);
        fail_at(text, key_offset(text, len, dup), err, errlen, what);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *json_parse_line(const char *text, size_t len, char *err, size_t errlen) {
    char *line = malloc(len + 1);
    if (!line) {
        snprintf(err, errlen, "out of memory reading a line of %zu bytes", len);
        return NULL;
    }
    memcpy(line, text, len);
    line[len] = '\0';
    char why[256];
    cJSON *root = json_parse_strict(line, len, why, sizeof(why));
    free(line);
    if (!root) snprintf(err, errlen, "%s", strncmp(why, "line 1, ", 8) ? why : why + 8);
    return root;
}

const char *json_snippet(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble)) {   // cJSON prints these as null
        snprintf(buf, n, "%s", isnan(v->valuedouble) ? "nan" : v->valuedouble > 0 ? "inf" : "-inf");
        return buf;
    }
    char *s = cJSON_PrintUnformatted(v);
    if (!s) { snprintf(buf, n, "?"); return buf; }
    if (strlen(s) < n) snprintf(buf, n, "%s", s);
    else if (n > 4) snprintf(buf, n, "%.*s...", (int)(n - 4), s);
    cJSON_free(s);
    return buf;
}
