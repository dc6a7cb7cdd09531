// The cache layer (docs/DESIGN.md section 2), shared by training and inference.
//  - the slot map: which layer produces a slot, which layers read it (share_factor, share);
//  - the payload parts per slot and token: K and V (MHA/GQA/CLA), or the latent C plus
//    k_rope (MLA/CLLA), plus the k_rope of consumers that project their own;
//  - a codec per part with one interface: encode / decode (host bytes), roundtrip (what a
//    full-sequence forward applies), bytes_per_token; codecs with fitted state (cq's
//    codebooks) hold one state per stream, fitted by `clla calibrate` and kept in the package.
// Training uses only int_group's roundtrip, with a straight-through backward.
#ifndef CLLA_MODEL_CACHE_H
#define CLLA_MODEL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"

struct cJSON;

typedef enum { CODEC_FP32 = 0, CODEC_BF16, CODEC_INT_GROUP, CODEC_CQ, CODEC_QET, CODEC_KIVI, CODEC_QJL, CODEC_KVQUANT, N_CODECS } CodecKind;

// What the vectors of a part are to attention (set by the layout from the part, read by the
// codecs whose scheme differs: KIVI quantizes keys per channel and values per token).
enum { CODEC_USE_KEYS = 0, CODEC_USE_VALUES, CODEC_USE_LATENT };

typedef struct Codec {
    CodecKind kind;
    int bits, group;      // int_group: bits per value, values per scale; cq: bits per code, channels per code (c);
                          // qet: group = columns per product-quantization group (width)
    int iters;            // cq, qet: k-means iterations when fitted
    int levels, k[2];     // qet: swap-tree levels, centroids of stage 1 and of the residual stage (0: none)
    int window;           // block codecs (kivi): tokens encoded together as one block; the tokens of the
                          // block a sequence is still filling are kept in fp16 (the full-precision window)
    int use;              // CODEC_USE_*: set by the layout from the part the codec serves
    int head;             // channels of one attention head in the part (set by the layout; 0: the whole width)
    int m, o, mo, gk;     // qjl: sign bits per key, outlier channels, their sign bits, tokens sharing outliers
                          // (o, mo < 0: chosen from the head width); bits, group = value bits and group
    unsigned seed;        // qjl: the projection's seed
    int sink, qnorm, permille;   // kvquant: tokens kept in fp16 at a sequence's start, Q-Norm (1 on, 0 off,
                                 // -1 the paper's: at 2 bits), sparse outliers per thousand elements
    const void *fit;      // the fitted state of one stream (cache_stream_codec), or the derived state
                          // of a bound codec (codec_bind); NULL for the settings alone
} Codec;

// What a codec is, as a table indexed by kind (every function of this header dispatches
// through it; a new codec is one more row). encode/decode work on host bytes; roundtrip on
// backend buffers (NULL: through the host encode/decode); scores, for codecs that score a
// query against encoded keys without decoding them, is NULL for the codecs here.
typedef struct CodecTraits {
    const char *name;
    size_t (*bytes_per_token)(const Codec *c, int W);
    void (*encode)(const Codec *c, uint8_t *dst, const float *src, int N, int W);
    void (*decode)(const Codec *c, float *dst, const uint8_t *src, int N, int W);
    void (*roundtrip)(const Codec *c, const Backend *be, float *out, const float *in, int N, int W);
    // settings: key=value pairs of a spec; 0 on success, -1 with a message
    int (*set_param)(Codec *c, const char *key, long value, char *err, size_t errlen);
    void (*defaults)(Codec *c);   // the settings a bare name means (NULL: none)
    // does the codec fit vectors of width W (and are its settings complete)? 0 yes, -1 with a message
    int (*check)(const Codec *c, int W, char *err, size_t errlen);
    void (*format)(const Codec *c, char *buf, size_t n);   // the settings part of the spec ("" if none)
    // bits per element as the codec's paper counts them (NULL: everything stored, 8 x bytes / W)
    double (*bits_paper)(const Codec *c, int W);
    // Fitted state (NULL fit: the codec has none). fit learns it from n sample vectors x[n][W],
    // sequences of seq_len tokens back to back (n a multiple of it; kvquant leaves each one's
    // first tokens out), with optional Fisher weights fisher[n][W]; the state travels as one fp32
    // tensor of fit_shape (returns its rank), written by fit_save and checked and read by fit_load.
    int (*fit)(const Codec *c, int W, const float *x, int64_t n, int64_t seq_len, const float *fisher, void **state, char *err,
               size_t errlen);
    int uses_fisher;   // fit weighs the samples by their Fisher information (else it ignores fisher)
    // Block codecs (NULL: a per-token codec). block_tokens: tokens encoded together; encode and
    // decode then take N a multiple of it, and block_bytes is the size of one block (bytes_per_token
    // is NULL: a token's share of a block need not be whole bytes).
    int (*block_tokens)(const Codec *c);
    size_t (*block_bytes)(const Codec *c, int W);
    // Derived state (NULL: none): what a codec computes from its settings alone before it can
    // encode (qjl's projection), made by bind and freed by unbind (codec_bind).
    void *(*bind)(const Codec *c, int W);
    void (*unbind)(void *state);
    // Scores without decoding (NULL: decode and dot): sc[j] = q . k_j for the n tokens of an
    // encoded block, k_j the vector of attention head `head` (q has Codec.head values). A query is
    // prepared once for all the blocks it is scored against (qjl: S q), into query_prep_doubles.
    size_t (*query_prep_doubles)(const Codec *c, int W);
    void (*query_prep)(const Codec *c, const float *q, double *prep);
    void (*scores)(const Codec *c, float *sc, const float *q, const double *prep, int head, const uint8_t *block, int n, int W);
    // Variable-size tokens (NULL: fixed sizes): a token at position pos is coded on its own into a
    // record whose size depends on its values (kvquant's sparse outliers) and position (its
    // attention sink): token_size sizes it before encode_token writes it; record_size reads a
    // stored record's size back, decode_token decodes it. The cache appends records to a block as
    // tokens come, so there is no full-precision window and streaming is block coding.
    size_t (*token_size)(const Codec *c, const float *x, int W, int64_t pos);
    void (*encode_token)(const Codec *c, uint8_t *dst, size_t size, const float *x, int W, int64_t pos);
    size_t (*record_size)(const Codec *c, const uint8_t *rec, int W, int64_t pos);
    void (*decode_token)(const Codec *c, float *dst, const uint8_t *rec, size_t size, int W, int64_t pos);
    // Keys are coded before RoPE (kvquant): the cache rotates a key part back before encoding and
    // forward again after decoding (model/decode.c); the latent and values have no RoPE.
    int pre_rope;
    void (*fit_free)(void *state);
    int (*fit_shape)(const Codec *c, int W, int64_t *shape);
    void (*fit_save)(const Codec *c, int W, const void *state, float *out);
    int (*fit_load)(const Codec *c, int W, const float *data, void **state, char *err, size_t errlen);
} CodecTraits;

const CodecTraits *codec_traits(CodecKind kind);
// Does the codec score queries against its encoded keys without decoding them (qjl)?
static inline int codec_has_scores(const Codec *c) { return codec_traits(c->kind)->scores != NULL; }
static inline int codec_is_variable(const Codec *c) { return codec_traits(c->kind)->encode_token != NULL; }
const char *codec_name(const Codec *c);
// Bytes one token's vector of width W occupies, every overhead counted (scales). Per-token
// codecs only (codec_block_tokens == 1).
size_t codec_bytes_per_token(const Codec *c, int W);
// Tokens a codec encodes together (1: every token on its own; block codecs: their block).
int codec_block_tokens(const Codec *c);
// Does the cache hold the codec's tokens in blocks of its own (the fixed-size blocks of a window
// codec, encoded as a unit; kvquant's blocks of variable-size records)?
int codec_is_blocked(const Codec *c);
static inline int codec_is_variable(const Codec *c);
// Bytes of N tokens of width W, N a multiple of codec_block_tokens; and per token on average.
size_t codec_span_bytes(const Codec *c, int W, int N);
double codec_bytes_per_token_avg(const Codec *c, int W);
// Host: N vectors of width W to bytes (codec_span_bytes) and back (N a multiple of the block).
void codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W);
void codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W);
// Backend buffers: out = decode(encode(in)). out may equal in.
void codec_roundtrip(const Codec *c, const Backend *be, float *out, const float *in, int N, int W);
// The same for B sequences of T tokens at positions 0..T-1 (what a full-sequence forward holds): a
// variable-size codec (kvquant) codes each token at its position; others as codec_roundtrip. A
// codec with a full-precision window has none (codec_has_window).
void codec_roundtrip_seq(const Codec *c, const Backend *be, float *out, const float *in, int B, int T, int W);
// Does the codec keep the block being filled in fp16 (kivi, qjl), so that what a query reads
// depends on its position and no full-sequence round trip exists?
int codec_has_window(const Codec *c);
// Is the codec the identity on fp32 values (nothing to apply)?
static inline int codec_is_exact(const Codec *c) { return c->kind == CODEC_FP32; }
// Does the codec need fitted state (clla calibrate) before it can encode?
int codec_needs_fit(const Codec *c);
// Gives a codec with derived state (qjl) that state for width W in c->fit (a no-op for the
// others, and for a codec with its fitted state already); codec_unbind frees what codec_bind made.
void codec_bind(Codec *c, int W);
void codec_unbind(Codec *c);
// The heads of a part of width W (W / Codec.head) and one head's channels.
int codec_head_width(const Codec *c, int W);
// Bits per element: everything a token stores (8 x bytes_per_token / W; a block codec's encoded
// blocks, its fp16 window not counted), and as the codec's paper counts them (the nominal code
// width, scales and codebooks left out).
double codec_bits_stored(const Codec *c, int W);
double codec_bits_paper(const Codec *c, int W);
// The elements of a fitted state's tensor (0 for codecs without one).
int64_t codec_fit_elements(const Codec *c, int W);
// For the fit_load of a codec: the n codebook values of a package are finite and within
// max_abs; else -1 and "codebook value I is X, not a finite <what>" in err.
int codec_check_codebook(const float *data, size_t n, float max_abs, const char *what, char *err, size_t errlen);
// The same for a codebook the package stores as fp16 numbers (cq, kvquant: docs/FORMAT.md): each
// value also exactly an fp16 one ("codebook value I is X, not an fp16 number"), as the codec fitted
// it and as the bytes per token count it.
int codec_check_fp16(const float *data, size_t n, char *err, size_t errlen);
// For the encode of a codec that would code a NaN or an inf as some finite code (cq's and qet's
// nearest centroid): dies naming the first such value of src (N, W) and the codec.
void codec_refuse_non_finite(const Codec *c, const float *src, int N, int W);

enum { PART_K = 0, PART_V, PART_LATENT, PART_KROPE, PART_OWN_KROPE, N_PARTS };

typedef struct CachePart {
    int present;
    int width;            // elements per token
    Codec codec;
    int head;             // channels of one attention head (K, V: head_dim, v_head_dim; latent, k_rope: the width)
} CachePart;

// The role of one layer in the cache layer: the single place where sharing is decided
// (docs/DESIGN.md section 1). Params, activations, the training forward and the decoder read it.
typedef struct LayerRole {
    int slot;             // the cache slot the layer attends over
    int producer;         // 1: the layer computes the slot's payload and writes it
    int kv_b_layer;       // latent: whose kv_b_proj up-projects the latent (own, or the producer's: latent_kvproj)
    int own_krope;        // latent consumer: projects and stores its own k_rope (share latent, latent_kvproj)
    int stream[N_PARTS];  // the cache stream the layer reads for each part (-1: none); PART_KROPE
                          // is the rope key it attends with: the slot's, or its own stream
} LayerRole;

// A stream: one part's tokens as written by one layer (a producer's K, V, latent, k_rope; a
// consumer's own k_rope). The decoder stores one block pool per stream; nothing is stored twice.
typedef struct CacheStream {
    int part;             // PART_*
    int layer;            // the layer that writes it
} CacheStream;

typedef struct CacheLayout {
    int n_layers, n_slots, share_factor, share;
    CachePart part[N_PARTS];   // PART_OWN_KROPE: stored by each consumer that projects its own
    LayerRole *role;           // [n_layers]
    CacheStream *streams;      // [n_streams]
    int n_streams;
    // [n_streams] the fitted state of each stream's codec (NULL where the codec has none or it is
    // not fitted yet); NULL array when no stream has one. Freed by cache_layout_free when owned.
    void **fit;
    int owns_fit;
} CacheLayout;

// The served layout of a config (what the cache stores by default): K/V, k_rope in bf16, the
// latent in bf16 or, when latent_quant_bits > 0, in int_group (the trained quantizer).
// Allocates the role and stream tables: cache_layout_free releases them.
void cache_layout(CacheLayout *cl, const ModelConfig *m);
void cache_layout_free(CacheLayout *cl);
// A copy whose role and stream tables are its own; the fitted states are shared with src (which
// must outlive the copy) and are not freed with it.
void cache_layout_copy(CacheLayout *dst, const CacheLayout *src);
// Stream s's codec: its part's, with the stream's fitted state.
Codec cache_stream_codec(const CacheLayout *cl, int s);
// Gives stream s its fitted state (the layout owns it from now on); NULL drops the stream's state
// (freed when the layout owns it; a copy sharing its source's states only forgets it).
void cache_layout_set_fit(CacheLayout *cl, int s, void *state);
// 0 when every stream whose codec needs fitted state has it; else -1 with a message naming the
// part and what to run.
int cache_layout_check_fitted(const CacheLayout *cl, char *err, size_t errlen);
static inline int cache_slot_of(const CacheLayout *cl, int layer) { return cl->role[layer].slot; }
static inline int cache_is_producer(const CacheLayout *cl, int layer) { return cl->role[layer].producer; }
// Bytes per token of stream s, and of all streams (the whole model); block codecs on average
// over their encoded blocks (the fp16 window of the open block left out: decoder_seq_bytes
// measures what a sequence holds).
double cache_stream_bytes_per_token(const CacheLayout *cl, int s);
double cache_layout_bytes_per_token(const CacheLayout *cl);
// Bytes per cached token that one decoding step reads, all layers: each layer reads the streams
// of its role, so a slot shared by F layers (CLA, CLLA) is read F times. A step runs its layers
// one after another, and between a slot's producer and its consumers the other layers' work
// passes through the CPU's caches: at long contexts the slot is read again from memory.
double cache_layout_read_bytes_per_token(const CacheLayout *cl);
// The tokens of one cache block for this layout: CACHE_MIN_BLOCK_TOKENS, or the largest block of
// its block codecs when every other one divides it; -1 with a message when they do not.
#define CACHE_MIN_BLOCK_TOKENS 16
int cache_layout_block_tokens(const CacheLayout *cl, char *err, size_t errlen);
// Does some stream use a codec with a full-precision window (kivi, qjl: what a query reads depends
// on its position, so no full-sequence round trip exists)?
int cache_layout_has_blocks(const CacheLayout *cl);

// Codec specs, as on the command line and in an export package's "cache" section:
// "fp32", "bf16", "int_group:bits=4,group=32", "cq:bits=8,c=4", "qet:levels=3,width=8,k1=256,k2=16". 0 on success; -1 with a message in err.
int codec_parse(Codec *c, const char *spec, char *err, size_t errlen);
// The spec of c (what codec_parse reads back).
void codec_format(const Codec *c, char *buf, size_t n);
// Part names of the cache layer: "k", "v", "latent", "k_rope", "own_k_rope".
const char *cache_part_name(int part);
// Applies "CODEC" (every present part) or "PART=CODEC" to a layout; a codec must fit the part's
// width (int_group: the group divides it). 0 on success; -1 with a message in err.
int cache_layout_apply_spec(CacheLayout *cl, const char *spec, char *err, size_t errlen);
// Whether a spec that cache_layout_apply_spec took names part p: "CODEC" names every present
// part, "PART=CODEC" that one.
int cache_spec_names_part(const CacheLayout *cl, const char *spec, int p);
// The layout's codecs as a JSON object {"part": "spec", ...} (present parts only); caller frees.
struct cJSON *cache_layout_to_json(const CacheLayout *cl);
// Reads such an object over the layout of m: every present part must be named, nothing else.
int cache_layout_from_json(CacheLayout *cl, const ModelConfig *m, const struct cJSON *j, char *err, size_t errlen);

typedef struct CacheBytes {
    double total;            // bytes per token, whole model, everything stored (the served layout)
    double per_layer;        // total / num_hidden_layers
    double paper;            // per layer, the paper's Table 4 convention (see docs/CACHE.md)
    double mha_total;        // plain MHA of the same shape, bf16
} CacheBytes;
void cache_bytes_per_token(const ModelConfig *m, CacheBytes *out);

#endif
