// UTF-8 validation for text handed to the tokenizer or printed as JSON (strict: no overlong
// forms, no surrogates, nothing above U+10FFFF).
#ifndef CLLA_DATA_UTF8_H
#define CLLA_DATA_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "data/bytes.h"

// Length of the valid sequence starting at s[0] (1 to 4), or 0 when s[0] does not start one.
size_t utf8_seq_len(const uint8_t *s, size_t n);
// Offset of the first byte that is not part of valid UTF-8 (n when all of it is valid).
size_t utf8_first_invalid(const uint8_t *s, size_t n);
// Appends s to out with every invalid byte replaced by U+FFFD (what JSON output needs).
void utf8_sanitize(ByteVec *out, const uint8_t *s, size_t n);

#endif
