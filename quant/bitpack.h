// Little-endian bitstreams for the quantizers' codes: value v of `bits` bits is written at bit
// offset `pos` of the buffer, bit 0 of v at bit (pos % 8) of byte pos / 8, so a 10-bit code may
// straddle two or three bytes. A record of N codes of b bits takes ceil(N b / 8) bytes; codes
// never depend on the bytes around them, so records can be appended one token at a time.
#ifndef CLLA_QUANT_BITPACK_H
#define CLLA_QUANT_BITPACK_H

#include <stdint.h>

// Writes the low `bits` (0..32) bits of v; the bits must be zero beforehand (callers clear
// a record before filling it).
static inline void bits_put(uint8_t *buf, int64_t pos, int bits, uint32_t v) {
    for (int i = 0; i < bits; i++, pos++)
        if ((v >> i) & 1u) buf[pos >> 3] |= (uint8_t)(1u << (pos & 7));
}

static inline uint32_t bits_get(const uint8_t *buf, int64_t pos, int bits) {
    uint32_t v = 0;
    for (int i = 0; i < bits; i++, pos++) v |= (uint32_t)((buf[pos >> 3] >> (pos & 7)) & 1u) << i;
    return v;
}

// ceil(log2(k)) for k >= 1: the bits a code into k entries takes (0 for one entry).
static inline int bits_for(int64_t k) {
    int b = 0;
    while (((int64_t)1 << b) < k) b++;
    return b;
}

#endif
