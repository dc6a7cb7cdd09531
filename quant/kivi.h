// KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"): the common
// baseline of the cache quantizers. Asymmetric min-max quantization to b bits:
//   keys   per channel, over groups of G consecutive tokens (one scale and minimum per channel
//          and token group), because key outliers sit in fixed channels;
//   values per token, over groups of G consecutive channels;
// and the most recent tokens kept in fp16 (the "residual"): keys are flushed to the quantized
// part R tokens at a time (R a multiple of G), values slide one token at a time (the oldest of
// more than R recent tokens is quantized). Nothing is calibrated: there is no fitted state.
//
// A sequence of T tokens of width H (one layer's K or V, all heads) is encoded as one byte
// string whose layout is a function of (settings, part, T, H) only (docs/QUANTIZERS.md, KIVI):
//   [quantized blocks, oldest first][the fp16 window, token-major]
// Keys: T - T mod R tokens quantized (T - T mod G when R = 0) in token groups of G, each block
//   H x (fp16 scale, fp16 min) then the H*G codes channel-major (channel c's G tokens
//   together), packed LSB first, padded to a byte.
// Values: max(0, T - R) tokens quantized, each block H/G x (fp16 scale, fp16 min) then the H
//   codes, packed, padded to a byte.
// Code q = round((x - min) / scale) in [0, 2^b - 1]; decode x' = min + q * scale. The stored
// min is rounded down and the scale up to fp16, so every element of a group is within
// scale/2 of its decoded value. Appending tokens only appends blocks: the quantized blocks of
// a prefix of the sequence are a prefix of the blocks of the whole (streaming = block).
#ifndef CLLA_QUANT_KIVI_H
#define CLLA_QUANT_KIVI_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KIVI_KEYS = 0, KIVI_VALUES = 1 } KiviPart;

typedef struct KiviSettings {
    int bits;       // code width b, 1..8 (the reference code runs 2 and 4)
    int group;      // G: tokens per key group, channels per value group (reference code: 32)
    int residual;   // R: recent tokens kept in fp16, a multiple of G, 0 allowed (128: see
                    // docs/QUANTIZERS.md, KIVI, on where that default comes from)
} KiviSettings;

#define KIVI_DEFAULT_BITS 2
#define KIVI_DEFAULT_GROUP 32
#define KIVI_DEFAULT_RESIDUAL 128
KiviSettings kivi_defaults(void);

// Parses "bits=2,group=32,residual=128" (any subset; the rest keeps its default) into *s.
// 0, or -1 with a one-line message in err (unknown key, bad number).
int kivi_settings_parse(const char *spec, KiviSettings *s, char *err, size_t errlen);
// 0 when the settings can encode a part of width H, else -1 with a one-line message naming the
// setting and the fix (bits outside 1..8, G < 1, R not a multiple of G, G not dividing H for
// values, H outside 1..2^24).
int kivi_settings_check(const KiviSettings *s, KiviPart part, int64_t H, char *err, size_t errlen);

// How the T tokens split: *nq quantized (the oldest), T - *nq in the fp16 window.
int64_t kivi_quantized_tokens(const KiviSettings *s, KiviPart part, int64_t T);
// Bytes of the encoding of T tokens of width H (everything stored; no fitted state exists).
// 0, or -1 on overflow.
int kivi_bytes(const KiviSettings *s, KiviPart part, int64_t T, int64_t H, int64_t *bytes);

// Encodes x [T, H] (row-major, token t at x + t*H) into out (cap bytes). Returns the number of
// bytes written (== kivi_bytes), or -1 with a message: bad settings, cap too small, or a value
// fp16 cannot hold (non-finite or |x| > 65504).
int64_t kivi_encode(const KiviSettings *s, KiviPart part, const float *x, int64_t T, int64_t H,
                    uint8_t *out, int64_t cap, char *err, size_t errlen);
// Decodes the nbytes of kivi_encode back into x [T, H]; -1 with a message when nbytes is not
// the size of T tokens of width H.
int kivi_decode(const KiviSettings *s, KiviPart part, const uint8_t *in, int64_t nbytes, int64_t T,
                int64_t H, float *x, char *err, size_t errlen);

// Bits per element counting everything stored for T tokens: codes, fp16 scales and minima,
// padding, and the fp16 window (= 8 * kivi_bytes / (T * H)). 0 when T == 0.
double kivi_bits_stored(const KiviSettings *s, KiviPart part, int64_t T, int64_t H);
// The paper's convention: the nominal code width b ("KIVI-2", "2bit"); its per-group fp16
// scale and minimum (32/G bits per element) and the fp16 window are not counted.
double kivi_bits_paper(const KiviSettings *s);

#endif
