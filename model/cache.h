// The cache layer (DESIGN section 2), shared by training and inference.
//  - the slot map: which layer produces a slot, which layers read it (share_factor, share);
//  - the payload parts per slot and token: K and V (MHA/GQA/CLA), or the latent C plus
//    k_rope (MLA/CLLA), plus the k_rope of consumers that project their own;
//  - a codec per part with one interface: encode / decode (host bytes), roundtrip (what a
//    full-sequence forward applies), bytes_per_token.
// Training uses only int_group's roundtrip, with a straight-through backward.
#ifndef CLLA_MODEL_CACHE_H
#define CLLA_MODEL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"

typedef enum { CODEC_FP32 = 0, CODEC_BF16, CODEC_INT_GROUP } CodecKind;

typedef struct Codec {
    CodecKind kind;
    int bits, group;      // int_group only
} Codec;

const char *codec_name(const Codec *c);
// Bytes one token's vector of width W occupies, every overhead counted (scales).
size_t codec_bytes_per_token(const Codec *c, int W);
// Host: N vectors of width W to bytes (N * codec_bytes_per_token) and back.
void codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W);
void codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W);
// Backend buffers: out = decode(encode(in)). out may equal in.
void codec_roundtrip(const Codec *c, const Backend *be, float *out, const float *in, int N, int W);

enum { PART_K = 0, PART_V, PART_LATENT, PART_KROPE, PART_OWN_KROPE, N_PARTS };

typedef struct CachePart {
    int present;
    int width;            // elements per token
    Codec codec;
} CachePart;

typedef struct CacheLayout {
    int n_layers, n_slots, share_factor, share;
    CachePart part[N_PARTS];   // PART_OWN_KROPE: stored by each consumer that projects its own
} CacheLayout;

// The training-time layout of a config: bf16 storage, the latent in int_group when
// latent_quant_bits > 0.
void cache_layout(CacheLayout *cl, const ModelConfig *m);
static inline int cache_slot_of(const CacheLayout *cl, int layer) { return layer / cl->share_factor; }
static inline int cache_is_producer(const CacheLayout *cl, int layer) { return layer % cl->share_factor == 0; }
// Does consumer layer l store its own k_rope? (CLLA share=latent and latent_kvproj)
int cache_consumer_owns_krope(const ModelConfig *m);

// Codec specs, as on the command line and in an export package's "cache" section:
// "fp32", "bf16", "int_group:bits=4,group=32". 0 on success; -1 with a message in err.
int codec_parse(Codec *c, const char *spec, char *err, size_t errlen);
// The spec of c (what codec_parse reads back).
void codec_format(const Codec *c, char *buf, size_t n);
// Part names of the cache layer: "k", "v", "latent", "k_rope", "own_k_rope".
const char *cache_part_name(int part);
// Applies "CODEC" (every present part) or "PART=CODEC" to a layout; a codec must fit the part's
// width (int_group: the group divides it). 0 on success; -1 with a message in err.
int cache_layout_apply_spec(CacheLayout *cl, const char *spec, char *err, size_t errlen);
// The layout's codecs as a JSON object {"part": "spec", ...} (present parts only); caller frees.
struct cJSON *cache_layout_to_json(const CacheLayout *cl);
// Reads such an object over the layout of m: every present part must be named, nothing else.
int cache_layout_from_json(CacheLayout *cl, const ModelConfig *m, const struct cJSON *j, char *err, size_t errlen);

typedef struct CacheBytes {
    double total;            // bytes per token, whole model, everything stored
    double per_layer;        // total / num_hidden_layers
    double paper;            // per layer, the paper's Table 4 convention (see docs/CACHE.md)
    double mha_total;        // plain MHA of the same shape, bf16
} CacheBytes;
void cache_bytes_per_token(const ModelConfig *m, CacheBytes *out);

#endif
