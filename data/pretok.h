// Pre-tokenization: splits text into the pieces that byte-level BPE encodes one by one,
// with a named regular expression (gpt2, cl100k, llama3) run by PCRE2.
// Every byte of the input lands in exactly one piece, invalid UTF-8 included (such bytes,
// which no pattern can match, form pieces of their own), so encode/decode round-trips.
#ifndef CLLA_DATA_PRETOK_H
#define CLLA_DATA_PRETOK_H

#include <stddef.h>

typedef struct Pretok Pretok;          // compiled pattern, shared read-only between threads
typedef struct PretokScratch PretokScratch;  // per-thread match state

// Returns NULL and writes a message to err when name is not a known pattern.
Pretok *pretok_new(const char *name, char *err, size_t errlen);
void pretok_free(Pretok *p);
const char *pretok_name(const Pretok *p);
// Space-separated list of the known pattern names, for help texts and errors.
const char *pretok_known_names(void);
// "PCRE2 10.42, Unicode 14.0.0": the library the patterns run on and its Unicode tables, which
// decide \p{L} and \p{N} (a letter added to Unicode later splits as punctuation).
void pretok_unicode_version(char *buf, size_t len);

PretokScratch *pretok_scratch_new(const Pretok *p);
void pretok_scratch_free(PretokScratch *s);

// Returns the end offset of the piece that starts at pos (pos < len).
size_t pretok_next(const Pretok *p, PretokScratch *s, const char *text, size_t len, size_t pos);

#endif
