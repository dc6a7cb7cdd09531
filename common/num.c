#include "common/num.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static int is_digit(char c) { return c >= '0' && c <= '9'; }

// Digits only, accumulated with overflow checks (no strtoull: it accepts spaces, '+', "0x").
static int parse_digits(const char *s, uint64_t *out) {
    if (!is_digit(*s)) return NUM_SYNTAX;
    uint64_t x = 0;
    int over = 0;
    for (; *s; s++) {
        if (!is_digit(*s)) return NUM_SYNTAX;
        if (x > (UINT64_MAX - (uint64_t)(*s - '0')) / 10) over = 1;
        else x = x * 10 + (uint64_t)(*s - '0');
    }
    if (over) return NUM_RANGE;
    *out = x;
    return NUM_OK;
}

int num_parse_u64(const char *s, uint64_t hi, uint64_t *out) {
    uint64_t x;
    int rc = parse_digits(s, &x);
    if (rc != NUM_OK) return rc;
    if (x > hi) return NUM_RANGE;
    *out = x;
    return NUM_OK;
}

int num_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    int neg = *s == '-';
    uint64_t mag;
    int rc = parse_digits(s + neg, &mag);
    if (rc != NUM_OK) return rc;
    int64_t x;
    if (!neg) {
        if (mag > (uint64_t)INT64_MAX) return NUM_RANGE;
        x = (int64_t)mag;
    } else {
        if (mag > (uint64_t)INT64_MAX + 1) return NUM_RANGE;
        x = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
    }
    if (x < lo || x > hi) return NUM_RANGE;
    *out = x;
    return NUM_OK;
}

// JSON number grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
static int json_number_syntax(const char *s) {
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (is_digit(*s)) while (is_digit(*s)) s++;
    else return 0;
    if (*s == '.') {
        s++;
        if (!is_digit(*s)) return 0;
        while (is_digit(*s)) s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!is_digit(*s)) return 0;
        while (is_digit(*s)) s++;
    }
    return *s == 0;
}

int num_parse_f64(const char *s, double *out) {
    if (!json_number_syntax(s)) return NUM_SYNTAX;
    double d = strtod(s, NULL);
    // overflow gives inf (refused); underflow to 0 or a subnormal keeps strtod's nearest value
    if (!isfinite(d)) return NUM_RANGE;
    *out = d;
    return NUM_OK;
}

int num_f64_to_i64(double d, int64_t lo, int64_t hi, int64_t *out) {
    if (!isfinite(d)) return NUM_RANGE;
    if (d != floor(d)) return NUM_SYNTAX;
    const double exact = 9007199254740992.0;   // 2^53
    if (d > exact || d < -exact) return NUM_RANGE;
    int64_t x = (int64_t)d;
    if (x < lo || x > hi) return NUM_RANGE;
    *out = x;
    return NUM_OK;
}

int64_t opt_i64(const char *option, const char *value, int64_t lo, int64_t hi) {
    int64_t x = 0;
    int rc = num_parse_i64(value, lo, hi, &x);
    if (rc == NUM_SYNTAX) die("%s '%s': expected a whole decimal number in %lld..%lld", option, value, (long long)lo, (long long)hi);
    if (rc == NUM_RANGE) die("%s %s: out of range, use %lld..%lld", option, value, (long long)lo, (long long)hi);
    return x;
}

uint64_t opt_u64(const char *option, const char *value, uint64_t hi) {
    uint64_t x = 0;
    int rc = num_parse_u64(value, hi, &x);
    if (rc == NUM_SYNTAX) die("%s '%s': expected a whole decimal number in 0..%llu", option, value, (unsigned long long)hi);
    if (rc == NUM_RANGE) die("%s %s: out of range, use 0..%llu", option, value, (unsigned long long)hi);
    return x;
}

double opt_f64(const char *option, const char *value, double lo, double hi) {
    double x = 0;
    int rc = num_parse_f64(value, &x);
    if (rc == NUM_SYNTAX) die("%s '%s': expected a decimal number (such as 0.02 or 1e-3)", option, value);
    if (rc == NUM_RANGE) die("%s %s: out of range, beyond what a double holds (about 1.8e308): give a finite number", option, value);
    if (x < lo || x > hi) die("%s %s: out of range, use %g..%g", option, value, lo, hi);
    return x;
}

int num_parse_hex64(const char *s, uint64_t *out) {
    uint64_t h = 0;
    int n = 0;
    for (; s[n]; n++) {
        const char c = s[n];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 || n >= 16) return NUM_SYNTAX;
        h = h << 4 | (uint64_t)d;
    }
    if (n != 16) return NUM_SYNTAX;
    *out = h;
    return 0;
}
