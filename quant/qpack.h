// Storage primitives the cache quantizers share: IEEE fp16 conversions (round to nearest even,
// and rounded down/up so a stored bound still contains what it bounds), b-bit code packing,
// little-endian integers (the byte layouts in docs/QUANTIZERS.md are little-endian on every
// host), and the "key=value,key=value" settings strings of the codec specs.
#ifndef CLLA_QUANT_QPACK_H
#define CLLA_QUANT_QPACK_H

#include <stddef.h>
#include <stdint.h>

#include "quant/fp16.h"

// fp16 <-> fp32. qp_f32_to_f16 rounds to nearest even; beyond the fp16 range it gives +-inf
// (callers refuse such inputs first: every codec here checks |x| <= QP_F16_MAX).
#define QP_F16_MAX 65504.0f
static inline uint16_t qp_f32_to_f16(float x) { return fp16_from_float(x); }   // quant/fp16.h: the one conversion
static inline float qp_f16_to_f32(uint16_t h) { return fp16_to_float(h); }
// The fp16 value nearest to x that is <= x (qp_f16_down) or >= x (qp_f16_up); x finite and
// within [-QP_F16_MAX, QP_F16_MAX].
uint16_t qp_f16_down(float x);
uint16_t qp_f16_up(float x);
// x rounded through fp16 (what a stored fp16 value decodes to).
static inline float qp_f16_round(float x) { return qp_f16_to_f32(qp_f32_to_f16(x)); }

// Codes of `bits` (1..8) bits packed LSB first: code i occupies bits [i*bits, (i+1)*bits)
// of the buffer, bit 0 being the least significant bit of byte 0. The buffer must be zeroed
// before the first qp_put_code.
static inline void qp_put_code(uint8_t *buf, int64_t i, int bits, unsigned code) {
    const int64_t bit = i * bits;
    const int sh = (int)(bit & 7);
    buf[bit >> 3] |= (uint8_t)(code << sh);
    if (sh + bits > 8) buf[(bit >> 3) + 1] |= (uint8_t)(code >> (8 - sh));   // a code spans 2 bytes at most
}
static inline unsigned qp_get_code(const uint8_t *buf, int64_t i, int bits) {
    const int64_t bit = i * bits;
    const int sh = (int)(bit & 7);
    unsigned v = (unsigned)buf[bit >> 3] >> sh;
    if (sh + bits > 8) v |= (unsigned)buf[(bit >> 3) + 1] << (8 - sh);
    return v & ((1u << bits) - 1u);
}
static inline void qp_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline uint16_t qp_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline void qp_put_u32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static inline uint32_t qp_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Settings strings "bits=3,outliers=0.01": qp_spec_next splits off the next "key=value" item
// (key and value NUL-terminated copies, truncated items refused). Returns 1 with an item,
// 0 at the end, -1 (message in err) for an item without '=' or one too long.
int qp_spec_next(const char **s, char *key, size_t keylen, char *val, size_t vallen, char *err, size_t errlen);
// A whole number in [lo, hi] / a finite number in [lo, hi] through common/num.h's strict
// parsers; -1 with "name=value: expected ..." in err otherwise.
int qp_spec_int(const char *name, const char *val, int lo, int hi, int *out, char *err, size_t errlen);
int qp_spec_f64(const char *name, const char *val, double lo, double hi, double *out, char *err, size_t errlen);

// Prepends "<method>: " to the message in err (a settings-string error names its codec);
// returns -1.
int qp_prefix_err(const char *method, char *err, size_t errlen);

// Checks a float array for what fp16 storage cannot hold: 0 when every value is finite and
// within [-QP_F16_MAX, QP_F16_MAX], else -1 with the first bad index in *bad.
int qp_check_f16_range(const float *x, int64_t n, int64_t *bad);

#endif
