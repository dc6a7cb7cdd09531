// Strict UTF-8 validation (data/utf8.h), per RFC 3629's table of well-formed sequences.
#include "data/utf8.h"

size_t utf8_seq_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;   // range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

size_t utf8_first_invalid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_seq_len(s + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

void utf8_sanitize(ByteVec *out, const uint8_t *s, size_t n) {
    static const uint8_t REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_seq_len(s + i, n - i);
        if (k) bytevec_append(out, s + i, k), i += k;
        else bytevec_append(out, REPLACEMENT, 3), i++;
    }
}
