// Strict numbers (issue 12): every number clla reads from a command line or a config goes
// through these, so "64k", "0x40", "4abc", "3e-3," or " 4" are refused instead of read as
// a prefix, an integer that does not fit is refused instead of wrapped, and a float that is
// not finite ("1e999", "nan", "inf") is refused instead of poisoning a run. Checked size
// arithmetic lives here too: every size derived from a config is a product of its keys.
#ifndef CLLA_COMMON_NUM_H
#define CLLA_COMMON_NUM_H

#include <stdint.h>

// Results of the parsers below.
enum { NUM_OK = 0, NUM_SYNTAX = -1, NUM_RANGE = -2 };

// A whole decimal number: optional '-' (signed only), then digits; nothing else (no sign
// for unsigned, no spaces, no base prefix, no suffix). NUM_RANGE when outside [lo, hi].
int num_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int num_parse_u64(const char *s, uint64_t hi, uint64_t *out);
// Exactly 16 hexadecimal digits (either case), nothing else: a 64-bit hash as configs write it
// (train.tokenizer_hash). 0 and the value in *out, or NUM_SYNTAX.
int num_parse_hex64(const char *s, uint64_t *out);
// A decimal float in JSON's syntax (optional '-', digits, optional fraction and exponent;
// a leading '.' or '+' is not accepted). NUM_RANGE when it is not finite as a double.
int num_parse_f64(const char *s, double *out);
// A double (what a JSON parser produced) as a whole number in [lo, hi]: NUM_SYNTAX when it is
// not whole, NUM_RANGE when outside or beyond 2^53 (where doubles no longer hold every integer).
int num_f64_to_i64(double d, int64_t lo, int64_t hi, int64_t *out);

// Command-line options: the value parsed whole and within [lo, hi], or one line naming the
// option and the value ("--batch 4abc: expected a whole number in 1..2147483647") and exit 1.
int64_t opt_i64(const char *option, const char *value, int64_t lo, int64_t hi);
uint64_t opt_u64(const char *option, const char *value, uint64_t hi);
double opt_f64(const char *option, const char *value, double lo, double hi);

// Checked size arithmetic on int64: returns 0 and stores the result, or -1 on overflow (the
// result is then left unchanged). Negative operands are allowed; sizes are never negative.
static inline int ck_mul(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return -1;
    *out = r;
    return 0;
}
static inline int ck_add(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return -1;
    *out = r;
    return 0;
}

// The most CPU threads a command accepts (train.threads, prep --threads): far beyond any
// machine clla runs on, far below what makes OpenMP's thread creation fail.
#define CLLA_MAX_THREADS 1024

#endif
