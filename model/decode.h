// Incremental decoding through the cache layer (docs/INFERENCE.md).
//
// A Decoder owns a model's KV cache for up to max_seqs sequences: per cache stream (a slot's K
// and V, or latent and k_rope, or a consumer's own k_rope; model/cache.h decides which), the
// encoded tokens in fixed-size blocks, with one block table per sequence (paged attention), so
// memory grows with the tokens stored. Prefill runs the batched full-sequence forward on the
// prompts and writes the cache; each step then feeds one token per sequence, attends over the
// cache directly (MLA/CLLA in the absorbed form, over the cached latent) and returns logits.
#ifndef CLLA_MODEL_DECODE_H
#define CLLA_MODEL_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/cache.h"
#include "model/model.h"

#define DECODE_BLOCK_TOKENS CACHE_MIN_BLOCK_TOKENS   // tokens per cache block without block codecs
#define DECODE_CHUNK_ROWS 128    // rows per forward when a sequence is extended by many tokens

typedef struct Decoder Decoder;

// A decoder for model m (already built and loaded) with the cache codecs of `layout` (NULL:
// the model's served layout, cache_layout()). max_len: the longest sequence (prompt + new
// tokens), at most max_position_embeddings. Dies with a message on a bad setting.
Decoder *decoder_new(Model *m, const CacheLayout *layout, int max_seqs, int max_len);
// decoder_new with each stream's storage reserved in slabs of slab_bytes or more (at least 16
// blocks; 0: 16 blocks) instead of 2 MiB (model/decode.c): the tests cross slabs with small ones
Decoder *decoder_new_slabs(Model *m, const CacheLayout *layout, int max_seqs, int max_len, size_t slab_bytes);
void decoder_free(Decoder *d);

// Prefill n empty sequences seq_ids[i] with prompts[i] (lens[i] >= 1 tokens each), in batched
// forwards of right-padded groups of similar lengths, each of at most sum(lens) positions, padding
// included (so the activations follow the tokens prefilled, not n x the longest). logits (n, V),
// host: the next-token logits after each prompt's last token.
void decoder_prefill(Decoder *d, int n, const int *seq_ids, const int32_t *const *prompts, const int *lens,
                     float *logits);
// The most positions, padding included, one of decoder_prefill's forwards holds when up to batch
// of the n prompts of lengths lens are prefilled together: the batch longest prompts' tokens.
long long decoder_prefill_positions(const int *lens, int n, int batch);
// One token per sequence: tokens[i] is appended to sequence seq_ids[i] (distinct ids, each
// non-empty and shorter than max_len). logits (n, V), host: the next-token logits.
void decoder_step(Decoder *d, int n, const int *seq_ids, const int32_t *tokens, float *logits);

// Appends n tokens to sequence seq (empty or not) through the cache, DECODE_CHUNK_ROWS rows per
// forward: each token attends over the stored tokens and those before it in the chunk, as a
// step would, and no T x T matrix exists (chunked prefill of long contexts). logits (V), host,
// may be NULL: the next-token logits after the last token.
void decoder_extend(Decoder *d, int seq, const int32_t *tokens, int n, float *logits);
// The same, with the logits after every token: all (n, V), host.
void decoder_extend_all(Decoder *d, int seq, const int32_t *tokens, int n, float *all);

// Benchmarks: appends n positions to sequence seq whose cache entries are random vectors (unit
// normal) encoded with each stream's codec, without running the model: a long context in
// seconds, for timing steps (their time does not depend on the values).
void decoder_fill_synthetic(Decoder *d, int seq, int n, uint64_t seed);

// Starts the empty sequence dst as a copy of sequence src (non-empty): the two share src's full
// blocks (kept until both are released) and dst gets its own copy of the partial last one, so a
// context prefilled once serves several continuations (benchmark choices, beam candidates).
void decoder_fork(Decoder *d, int src, int dst);

int decoder_seq_len(const Decoder *d, int seq);
// Blocks some sequence holds now (a block shared by forks counts once).
size_t decoder_blocks_in_use(const Decoder *d);
// Frees a sequence's blocks for reuse (its length becomes 0).
void decoder_release(Decoder *d, int seq);
// Bytes held by cache blocks now (blocks in use and free ones kept for reuse, block codecs'
// fp16 windows while open), every stream.
size_t decoder_cache_bytes(const Decoder *d);
// Bytes sequence seq stores, read from its blocks' state (encoded, or fp16 windows of the tokens
// in them, variable-size records at their size): what `clla eval --through-cache` prints.
size_t decoder_seq_bytes(const Decoder *d, int seq);
// The same for one stream s.
size_t decoder_stream_seq_bytes(const Decoder *d, int s, int seq);
// Bytes one token occupies in the cache, all streams of all layers (== cache_bytes_per_token's
// total for the same layout; block codecs on average over encoded blocks).
double decoder_bytes_per_token(const Decoder *d);
// Tokens per cache block (cache_layout_block_tokens of the decoder's layout).
int decoder_block_tokens(const Decoder *d);
const CacheLayout *decoder_layout(const Decoder *d);
// The stored vector of stream s (model/cache.h) at position pos of sequence seq, decoded (tests).
void decoder_read(const Decoder *d, int s, int seq, int pos, float *out);

// The model's full-sequence forward applies the codecs of `layout` (same model) where the cache
// would hold each part, when m->apply_codecs is set (evaluation through the cache).
void model_use_cache_codecs(Model *m, const CacheLayout *layout);

#endif
