// Incremental decoding through the cache layer: paged storage, prefill, one-token steps
// The model's own forward runs both (model_forward_with); only attention differs in a step,
// where each layer's query attends over the stored tokens (docs/CACHE.md, "Decoding through the cache").
//
// Storage: one pool of blocks per cache stream (model/cache.h: a producer's K, V, latent, rope
// key; a consumer's own rope key), blocks of decoder_block_tokens tokens in the stream's codec.
// A block id names the same block in every stream, so one block table per sequence serves all
// layers. Blocks are allocated when a sequence first needs them and kept for reuse when it is
// released: the bytes held grow with the tokens stored, rounded up to whole blocks. A stream's
// storage is reserved a slab of blocks at a time (slab_blocks[s]: SLAB_BYTES or more, at least
// SLAB_MIN_BLOCKS blocks), block id at (id % slab_blocks[s]) x its stride in slab
// id / slab_blocks[s]: blocks taken one after another (a prompt's) lie one after another in
// memory, so reading a long context streams through long runs that the CPU's prefetchers follow,
// where a separate allocation per block left one 2-8 KiB run per block, and on the CPU backend
// through huge pages (bench/bench_decode.c; docs/INFERENCE.md has the measurements).
//
// Block codecs (kivi, qjl; model/cache.h): a block is encoded as one unit, so the block a sequence
// is filling is kept in fp16 (stage[s][id], the full-precision window) and encoded when the
// sequence moves past it: writing position b * block_tokens closes block b - 1. A query therefore
// reads the encoded blocks before its own and the fp16 tokens of its own block, whether it runs as
// a step or as a row of a chunk (decoder_extend cuts chunks at block boundaries, and a prefill goes
// through decoder_extend): the cache's contents at a query do not depend on how the tokens came.
// Variable-size codecs (kvquant) append each token's record to its block as it comes (rec[s][id],
// host memory): no window. Pre-RoPE key codecs (kvquant) get keys rotated back at their positions
// before encoding and rotated forward after decoding (pos0[id]: a block's first position).
//
// Absorbed latent attention (MLA, CLLA): with W_UK_h, W_UV_h the rows of
// kv_b_proj that make head h's key and value from the latent C,
//   q_h . k_t = q_nope_h . (W_UK_h c_t) + q_rope_h . k_rope_t = (W_UK_h^T q_nope_h) . c_t + ...
//   out_h = sum_t p_t W_UV_h c_t = W_UV_h (sum_t p_t c_t),
// so a step attends with one "key head" [c | k_rope] of width R + DR and value c (width R),
// read straight from the cache, and never up-projects the cached tokens.
#include "model/decode.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/rng.h"
#include "common/util.h"
#include "model/model_internal.h"
#include "quant/fp16.h"
#include "quant/kvquant.h"

// How a stream stores its tokens: one fixed-size encoding per token in its block; a window codec's
// blocks (the block being filled in fp16, encoded whole when the sequence moves past it); a
// variable-size codec's records, appended to the block's host buffer as tokens come.
enum { STREAM_TOKENS = 0, STREAM_WINDOW, STREAM_RECORDS };

// A stream's slab (see the top): at least SLAB_MIN_BLOCKS blocks and SLAB_BYTES bytes
// (decoder_new_slabs takes another size). 2 MiB is a
// huge page: the CPU backend gives an allocation of 2 MiB or more whole huge pages where the
// kernel has them (layers/cpu_memory.c), and a step that reads its cache through 4 KiB pages
// walked the page tables for every page of it (docs/INFERENCE.md). The slab is reserved, not
// written: the CPU backend's pages come as the blocks are written.
#define SLAB_MIN_BLOCKS 16
#define SLAB_BYTES ((size_t)2 << 20)

// What a backend's decode callback of stream s needs (PagedStream.ctx).
typedef struct StreamRead {
    const struct Decoder *d;
    int s;
} StreamRead;

struct Decoder {
    Model *m;
    CacheLayout cl;
    int max_seqs, max_len, max_blocks;   // max_blocks: per sequence
    int bt;                // tokens per block (cache_layout_block_tokens)
    int has_blocks;        // some stream uses a codec with a full-precision window (kivi, qjl)
    // storage: blocks[s][id], the same ids in every stream, inside slabs[s][id / slab_blocks[s]]
    uint8_t ***blocks;
    uint8_t ***slabs;
    size_t *stride;        // [n_streams]: bytes from one block of the stream to the next in a slab
    int *slab_blocks;      // [n_streams]: blocks per slab of the stream
    uint16_t ***stage;     // [s][id]: a window codec's fp16 window while block id is open (else NULL)
    uint8_t ***rec;        // [s][id]: a variable-size codec's records of block id (host)
    size_t **rec_len, **rec_cap;   // [s][id]: their bytes, and the buffer's
    int *is_block;         // [n_streams]: STREAM_*
    int *rope_heads, *rope_dim;    // [n_streams]: a pre-RoPE key stream's heads and their width (0: none)
    int *pos0;             // [cap_ids]: the position of block id's first token
    StreamRead *rd;        // [n_streams]
    int cap_ids, n_ids;
    int *free_ids, n_free;
    int *refs;             // [cap_ids]: sequences whose tables hold the block (forks share full blocks)
    int *closed;           // [cap_ids]: the block codecs' streams of block id are encoded
    int *table;            // [max_seqs * max_blocks]
    int *len;              // [max_seqs]
    PagedStream *ps;       // [n_streams]
    // the rows of the current step (one token each; several may belong to one sequence)
    int max_rows, n;
    int *row_seq;          // [max_rows]
    int *h_pos, *d_pos;    // [max_rows] positions of the rows (host, backend)
    int *step_table, *step_lens;   // [max_rows * max_blocks], [max_rows]: what each row attends
    float *row;            // host staging for one layer's rows: (max rows, widest part)
    size_t row_cap;
    uint8_t *tok;          // host staging for one encoded token (the widest stream)
    float *unrot;          // host staging for a key rotated back before RoPE
    size_t unrot_cap;
    // absorbed latent attention: scratch and per-head weights (latent models only)
    TensorTable scratch;
    void *scratch_buf;
    int qn, ql, qabs, olat, ol, oh;   // scratch entries, max_rows rows each
    int *uk, *uv;                     // [L * NH]: W_UK_h (D, R), W_UV_h (DV, R) of layer l's kv_b
    int saved_inference, saved_apply;
    Codec *codecs;                    // [n_streams]: each stream's codec with its fitted state
};

#define P(i) ((float *)table_ptr_store(&m->params, m->w, (i)))
#define A(i) ((float *)table_ptr_store(&m->acts, m->act, (i)))
#define S(i) ((float *)table_ptr_store(&d->scratch, d->scratch_buf, (i)))

static int width_of(const Decoder *d, int s) { return d->cl.part[d->cl.streams[s].part].width; }

// The backends' decode callback: the first n tokens of block id of stream s as fp32 (a pre-RoPE
// key stream rotated to their positions).
static void stream_decode(const void *ctx, float *dst, int id, int n) {
    const StreamRead *r = ctx;
    const Decoder *d = r->d;
    const int s = r->s, W = width_of(d, s);
    const Codec *c = &d->codecs[s];
    if (d->is_block[s] == STREAM_TOKENS) codec_decode(c, dst, d->blocks[s][id], n, W);
    else if (d->is_block[s] == STREAM_RECORDS) {
        const CodecTraits *t = codec_traits(c->kind);
        const uint8_t *p = d->rec[s][id];
        for (int j = 0; j < n; j++) {
            size_t size = t->record_size(c, p, W, d->pos0[id] + j);
            t->decode_token(c, dst + (size_t)j * W, p, size, W, d->pos0[id] + j);
            p += size;
        }
    } else if (d->stage[s][id]) {
        const uint16_t *st = d->stage[s][id];
        for (size_t i = 0; i < (size_t)n * W; i++) dst[i] = fp16_to_float(st[i]);
    } else {
        // an encoded block is read only by rows past it, so whole
        if (n != d->bt) die("internal error: %d tokens read of an encoded block of %d", n, d->bt);
        codec_decode(c, dst, d->blocks[s][id], d->bt, W);
    }
    if (d->rope_dim[s]) kvq_rope_rows(dst, n, d->rope_heads[s], d->rope_dim[s], d->pos0[id], d->m->cfg.rope_theta, 1);
}

// The backends' score callback of a key stream whose codec scores (qjl): exact dot products over
// the fp16 window of an open block, the codec's estimate over an encoded one.
static void stream_prep(const void *ctx, double *out, const float *q) {
    const StreamRead *r = ctx;
    const Codec *c = &r->d->codecs[r->s];
    codec_traits(c->kind)->query_prep(c, q, out);
}

static void stream_score(const void *ctx, float *sc, const float *q, const double *prep, int head, int id, int n) {
    const StreamRead *r = ctx;
    const Decoder *d = r->d;
    const int s = r->s, W = width_of(d, s), hd = codec_head_width(&d->codecs[s], W);
    const uint16_t *st = d->stage[s][id];
    if (st) {
        for (int j = 0; j < n; j++) {
            const uint16_t *k = st + (size_t)j * W + (size_t)head * hd;
            float a = 0.0f;
            for (int i = 0; i < hd; i++) a += q[i] * fp16_to_float(k[i]);
            sc[j] = a;
        }
        return;
    }
    if (n != d->bt) die("internal error: %d tokens scored of an encoded block of %d", n, d->bt);
    const Codec *c = &d->codecs[s];
    const size_t per = codec_span_bytes(c, W, codec_block_tokens(c));
    for (int b = 0; b < d->bt / codec_block_tokens(c); b++)   // the codec's blocks inside the cache block
        codec_traits(c->kind)->scores(c, sc + (size_t)b * codec_block_tokens(c), q, prep, head, d->blocks[s][id] + (size_t)b * per,
                                      codec_block_tokens(c), W);
}

// ---------------------------------------------------------------- storage

// A block id with storage in every stream: a released one, or a new one.
static int block_take(Decoder *d) {
    if (d->n_free) {
        int id = d->free_ids[--d->n_free];
        d->refs[id] = 1;
        return id;
    }
    if (d->n_ids == d->cap_ids) {
        int cap = d->cap_ids ? 2 * d->cap_ids : 16;
        for (int s = 0; s < d->cl.n_streams; s++) {
            d->blocks[s] = xrealloc(d->blocks[s], (size_t)cap * sizeof(uint8_t *));
            d->stage[s] = xrealloc(d->stage[s], (size_t)cap * sizeof(uint16_t *));
            d->rec[s] = xrealloc(d->rec[s], (size_t)cap * sizeof(uint8_t *));
            d->rec_len[s] = xrealloc(d->rec_len[s], (size_t)cap * sizeof(size_t));
            d->rec_cap[s] = xrealloc(d->rec_cap[s], (size_t)cap * sizeof(size_t));
            d->ps[s].blocks = d->blocks[s];
        }
        d->free_ids = xrealloc(d->free_ids, (size_t)cap * sizeof(int));
        d->refs = xrealloc(d->refs, (size_t)cap * sizeof(int));
        d->closed = xrealloc(d->closed, (size_t)cap * sizeof(int));
        d->pos0 = xrealloc(d->pos0, (size_t)cap * sizeof(int));
        d->cap_ids = cap;
    }
    int id = d->n_ids++;
    for (int s = 0; s < d->cl.n_streams; s++) {
        const int sb = d->slab_blocks[s];
        if (id % sb == 0) {
            d->slabs[s] = xrealloc(d->slabs[s], ((size_t)id / sb + 1) * sizeof(uint8_t *));
            d->slabs[s][id / sb] = d->m->be->alloc((size_t)sb * d->stride[s]);   // no overflow: checked in decoder_new
        }
        d->blocks[s][id] = d->slabs[s][id / sb] + (size_t)(id % sb) * d->stride[s];
        d->stage[s][id] = NULL;
        d->rec[s][id] = NULL;
        d->rec_len[s][id] = d->rec_cap[s][id] = 0;
        d->ps[s].n_blocks = d->n_ids;
    }
    d->refs[id] = 1;
    return id;
}

// A block starts open at position pos0: its window codecs' streams get an fp16 window (kept from
// an earlier use), its variable-size streams no records.
static int block_open(Decoder *d, int pos0) {
    int id = block_take(d);
    d->closed[id] = 0;
    d->pos0[id] = pos0;
    for (int s = 0; s < d->cl.n_streams; s++) {
        if (d->is_block[s] == STREAM_WINDOW && !d->stage[s][id]) d->stage[s][id] = xmalloc((size_t)d->bt * width_of(d, s) * sizeof(uint16_t));
        d->rec_len[s][id] = 0;
    }
    return id;
}

// Encodes the fp16 windows of block id (whole: the sequence has moved past it) into its storage.
// A block shared by forks is closed by the first of them to move on.
static void block_close(Decoder *d, int id) {
    if (d->closed[id]) return;
    for (int s = 0; s < d->cl.n_streams; s++) {
        if (d->is_block[s] != STREAM_WINDOW) continue;
        int W = width_of(d, s);
        size_t n = (size_t)d->bt * W, bytes = codec_span_bytes(&d->codecs[s], W, d->bt);
        float *x = xmalloc(n * sizeof(float));
        uint8_t *enc = xmalloc(bytes);
        for (size_t i = 0; i < n; i++) x[i] = fp16_to_float(d->stage[s][id][i]);
        codec_encode(&d->codecs[s], enc, x, d->bt, W);
        d->m->be->upload(d->blocks[s][id], enc, bytes);
        free(x);
        free(enc);
        free(d->stage[s][id]);
        d->stage[s][id] = NULL;
    }
    d->closed[id] = 1;
}


// Makes room for token position pos of sequence seq: a new block at each block boundary, where
// the block before it is closed.
static void reserve(Decoder *d, int seq, int pos) {
    if (pos % d->bt) return;
    int *table = d->table + (size_t)seq * d->max_blocks, b = pos / d->bt;
    if (b > 0 && d->has_blocks) block_close(d, table[b - 1]);
    table[b] = block_open(d, pos);
}

static int block_id_at(const Decoder *d, int seq, int pos) { return d->table[(size_t)seq * d->max_blocks + pos / d->bt]; }

// A per-token stream's bytes of token pos.
static uint8_t *token_ptr(const Decoder *d, int s, int seq, int pos) {
    return d->blocks[s][block_id_at(d, seq, pos)] + (size_t)(pos % d->bt) * d->ps[s].token_bytes;
}

// The model buffer holding what stream s's layer wrote in the last forward.
static float *stream_source(Decoder *d, int s) {
    Model *m = d->m;
    const CacheStream *st = &d->cl.streams[s];
    const SlotActs *sa = &m->sa[d->cl.role[st->layer].slot];
    switch (st->part) {
    case PART_K: return A(sa->k);
    case PART_V: return A(sa->v);
    case PART_LATENT: return A(sa->c);
    case PART_KROPE: return A(sa->k_rope);
    case PART_OWN_KROPE: return A(m->la[st->layer].k_rope);
    }
    die("internal error: stream part %d", st->part);
}

// Encodes one token's vector x into stream s at (seq, pos): on the host, then into the block
// (backend memory) with one upload; a window codec's token goes to its open block's fp16 window,
// a variable-size codec's record is appended to its block's records. A pre-RoPE key is rotated
// back to before RoPE first.
static void write_token(Decoder *d, int s, int seq, int pos, const float *x_in) {
    int W = width_of(d, s);
    const float *x = x_in;
    if (d->rope_dim[s]) {
        if ((size_t)W > d->unrot_cap) { d->unrot = xrealloc(d->unrot, (size_t)W * sizeof(float)); d->unrot_cap = (size_t)W; }
        memcpy(d->unrot, x_in, (size_t)W * sizeof(float));
        kvq_rope_rows(d->unrot, 1, d->rope_heads[s], d->rope_dim[s], pos, d->m->cfg.rope_theta, -1);
        x = d->unrot;
    }
    if (d->is_block[s] == STREAM_RECORDS) {
        const Codec *c = &d->codecs[s];
        const CodecTraits *t = codec_traits(c->kind);
        int id = block_id_at(d, seq, pos);
        if (pos - d->pos0[id] != 0 && d->rec_len[s][id] == 0) die("internal error: position %d written into a block out of order", pos);
        size_t size = t->token_size(c, x, W, pos);
        if (d->rec_len[s][id] + size > d->rec_cap[s][id]) {
            size_t cap = 2 * (d->rec_len[s][id] + size);
            d->rec[s][id] = xrealloc(d->rec[s][id], cap);
            d->rec_cap[s][id] = cap;
        }
        t->encode_token(c, d->rec[s][id] + d->rec_len[s][id], size, x, W, pos);
        d->rec_len[s][id] += size;
        return;
    }
    if (d->is_block[s] == STREAM_WINDOW) {
        uint16_t *st = d->stage[s][block_id_at(d, seq, pos)];
        if (!st) die("internal error: position %d written into an encoded block", pos);
        st += (size_t)(pos % d->bt) * W;
        for (int j = 0; j < W; j++) {
            if (!(fabsf(x[j]) <= 65504.0f))
                die("cache part %s: value %g at position %d is beyond the fp16 window's range: serve this model with another codec",
                    cache_part_name(d->cl.streams[s].part), (double)x[j], pos);
            st[j] = fp16_from_float(x[j]);
        }
        return;
    }
    codec_encode(&d->codecs[s], d->tok, x, 1, W);
    d->m->be->upload(token_ptr(d, s, seq, pos), d->tok, d->ps[s].token_bytes);
}

// Encodes rows of the streams layer l writes: row r of the model's batch goes to sequence
// row_seq[r], position row_pos[r]; rows with pos < 0 are skipped.
static void write_layer(Decoder *d, int l, int rows, const int *row_seq, const int *row_pos) {
    Model *m = d->m;
    for (int s = 0; s < d->cl.n_streams; s++) {
        if (d->cl.streams[s].layer != l) continue;
        int W = d->cl.part[d->cl.streams[s].part].width;
        size_t need = (size_t)rows * W;
        if (need > d->row_cap) { d->row = xrealloc(d->row, need * sizeof(float)); d->row_cap = need; }
        m->be->act_to_host(d->row, stream_source(d, s), need);
        for (int r = 0; r < rows; r++)
            if (row_pos[r] >= 0) write_token(d, s, row_seq[r], row_pos[r], d->row + (size_t)r * W);
    }
}

// ---------------------------------------------------------------- setup

Decoder *decoder_new(Model *m, const CacheLayout *layout, int max_seqs, int max_len) {
    return decoder_new_slabs(m, layout, max_seqs, max_len, SLAB_BYTES);
}

Decoder *decoder_new_slabs(Model *m, const CacheLayout *layout, int max_seqs, int max_len, size_t slab_bytes) {
    const ModelConfig *c = &m->cfg;
    const Backend *be = m->be;
    const char *missing = backend_missing_op(be, BACKEND_OPS_DECODE);
    if (missing) die("backend '%s' lacks the decoding op '%s': decode with --device cpu or cpu-bf16", be->name, missing);
    if (max_seqs < 1) die("decoder: at least one sequence (got %d)", max_seqs);
    if (max_len < 1 || max_len > c->max_position_embeddings)
        die("decoder: sequence length %d outside 1..max_position_embeddings (%d)", max_len, c->max_position_embeddings);
    Decoder *d = xcalloc(1, sizeof(Decoder));
    d->m = m;
    if (layout) cache_layout_copy(&d->cl, layout);
    else cache_layout(&d->cl, c);
    if (d->cl.n_layers != c->num_hidden_layers || d->cl.share_factor != c->share_factor)
        die("decoder: the cache layout was made for another model");
    d->max_seqs = max_seqs;
    d->max_len = max_len;
    char err[512];
    d->bt = cache_layout_block_tokens(&d->cl, err, sizeof(err));
    if (d->bt < 0) die("%s", err);
    d->has_blocks = cache_layout_has_blocks(&d->cl);
    d->max_blocks = (max_len + d->bt - 1) / d->bt;
    d->blocks = xcalloc((size_t)(d->cl.n_streams ? d->cl.n_streams : 1), sizeof(uint8_t **));
    const size_t ns = (size_t)(d->cl.n_streams ? d->cl.n_streams : 1);
    d->stage = xcalloc(ns, sizeof(uint16_t **));
    d->slabs = xcalloc(ns, sizeof(uint8_t **));
    d->stride = xcalloc(ns, sizeof(size_t));
    d->slab_blocks = xcalloc(ns, sizeof(int));
    d->rec = xcalloc(ns, sizeof(uint8_t **));
    d->rec_len = xcalloc(ns, sizeof(size_t *));
    d->rec_cap = xcalloc(ns, sizeof(size_t *));
    d->is_block = xcalloc(ns, sizeof(int));
    d->rope_heads = xcalloc(ns, sizeof(int));
    d->rope_dim = xcalloc(ns, sizeof(int));
    d->rd = xcalloc((size_t)(d->cl.n_streams ? d->cl.n_streams : 1), sizeof(StreamRead));
    d->table = xcalloc((size_t)max_seqs * d->max_blocks, sizeof(int));
    d->len = xcalloc((size_t)max_seqs, sizeof(int));
    if (cache_layout_check_fitted(&d->cl, err, sizeof(err)) != 0) die("%s", err);
    d->ps = xcalloc((size_t)(d->cl.n_streams ? d->cl.n_streams : 1), sizeof(PagedStream));
    d->codecs = xcalloc((size_t)(d->cl.n_streams ? d->cl.n_streams : 1), sizeof(Codec));
    size_t widest = 1;   // bytes of one encoded token (per-token streams)
    for (int s = 0; s < d->cl.n_streams; s++) {
        const CachePart *part = &d->cl.part[d->cl.streams[s].part];
        d->codecs[s] = cache_stream_codec(&d->cl, s);
        codec_bind(&d->codecs[s], part->width);
        const Codec *codec = &d->codecs[s];
        int kind = codec->kind == CODEC_FP32 ? PAGED_F32 : codec->kind == CODEC_BF16 ? PAGED_BF16
                 : codec->kind == CODEC_INT_GROUP ? PAGED_INT_GROUP : PAGED_OTHER;
        // a codec read only through the host decode callback (backend/backend.h) needs its blocks
        // in host memory: refused here, not at the first attention step after a whole prefill
        if (kind == PAGED_OTHER && !be->host_memory)
            die("the %s cache codec decodes only on the host, and backend '%s' keeps the cache in device memory (it reads "
                "fp32, bf16 and int_group caches): use one of those codecs, or --device cpu or cpu-bf16",
                codec_name(codec), be->name);
        d->is_block[s] = codec_is_variable(codec) ? STREAM_RECORDS : codec_is_blocked(codec) ? STREAM_WINDOW : STREAM_TOKENS;
        int p = d->cl.streams[s].part;
        if (codec_traits(codec->kind)->pre_rope && (p == PART_K || p == PART_KROPE || p == PART_OWN_KROPE)) {
            // rotated as the model rotates them (model/attention.c): every head's full width
            d->rope_dim[s] = part->head;
            d->rope_heads[s] = part->width / part->head;
        }
        d->rd[s] = (StreamRead){d, s};
        d->ps[s] = (PagedStream){part->width, d->is_block[s] != STREAM_TOKENS ? 0 : codec_bytes_per_token(codec, part->width), d->bt, NULL, 0,
                                 &d->rd[s], stream_decode,
                                 codec_has_scores(codec) ? codec_traits(codec->kind)->query_prep_doubles(codec, part->width) : 0,
                                 codec_has_scores(codec) ? stream_prep : NULL, codec_has_scores(codec) ? stream_score : NULL,
                                 kind == PAGED_F32, kind, codec->bits, codec->group};
        if (d->ps[s].token_bytes > widest) widest = d->ps[s].token_bytes;
        // a variable-size stream keeps its records on the host (rec): its block storage is a
        // placeholder; the others' strides are whole 64-byte lines, so every block keeps its
        // slab's alignment (16 bytes from calloc, 256 from cudaMalloc)
        const size_t span = d->is_block[s] == STREAM_RECORDS ? 1 : codec_span_bytes(codec, part->width, d->bt);
        int64_t slab;
        d->stride[s] = (span + 63) / 64 * 64;
        const size_t fill = slab_bytes / d->stride[s] + (slab_bytes % d->stride[s] != 0);
        if (fill > INT_MAX) die("decoder: slabs of %zu bytes hold more blocks than an int counts", slab_bytes);
        d->slab_blocks[s] = fill > SLAB_MIN_BLOCKS ? (int)fill : SLAB_MIN_BLOCKS;
        if (ck_mul(d->slab_blocks[s], (int64_t)d->stride[s], &slab) != 0) die("decoder: a slab of cache blocks overflows size_t");
    }
    d->tok = xmalloc(widest);
    d->max_rows = max_seqs > DECODE_CHUNK_ROWS ? max_seqs : DECODE_CHUNK_ROWS;
    d->row_seq = xcalloc((size_t)d->max_rows, sizeof(int));
    d->h_pos = xcalloc((size_t)d->max_rows, sizeof(int));
    d->d_pos = be->alloc((size_t)d->max_rows * sizeof(int));
    d->step_table = xcalloc((size_t)d->max_rows * d->max_blocks, sizeof(int));
    d->step_lens = xcalloc((size_t)d->max_rows, sizeof(int));
    d->saved_inference = m->inference;
    d->saved_apply = m->apply_codecs;
    m->inference = 1;

    if (config_is_latent(c)) {
        int L = c->num_hidden_layers, NH = c->num_attention_heads, D = c->head_dim, DV = c->v_head_dim;
        int R = c->kv_lora_rank, DR = c->qk_rope_head_dim;
        int64_t N = d->max_rows;
        TensorTable *tt = &d->scratch;
        int64_t sh[2];
#define ADD(rows, cols, ...) (sh[0] = (rows), sh[1] = (cols), table_addf(tt, -1, 0, DT_STORE, 2, sh, __VA_ARGS__))
        d->qn = ADD(N, D, "qn%d", 0);
        d->ql = ADD(N, R, "ql%d", 0);
        d->qabs = ADD(N, (int64_t)NH * (R + DR), "qabs%d", 0);
        d->olat = ADD(N, (int64_t)NH * R, "olat%d", 0);
        d->ol = ADD(N, R, "ol%d", 0);
        d->oh = ADD(N, DV, "oh%d", 0);
        d->uk = xcalloc((size_t)L * NH, sizeof(int));
        d->uv = xcalloc((size_t)L * NH, sizeof(int));
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NH; h++) {
                if (d->cl.role[l].kv_b_layer != l) { d->uk[l * NH + h] = d->uv[l * NH + h] = -1; continue; }
                d->uk[l * NH + h] = ADD(D, R, "uk.%d", l * NH + h);
                d->uv[l * NH + h] = ADD(DV, R, "uv.%d", l * NH + h);
            }
#undef ADD
        table_layout(tt, be->act_bytes);
        d->scratch_buf = be->alloc(tt->bytes_store);
        // W_UK_h, W_UV_h: rows [h (D+DV), h (D+DV) + D) and [.. + D, .. + D + DV) of kv_b (NH (D+DV), R),
        // copied as one row of D*R (DV*R) elements
        for (int l = 0; l < L; l++) {
            if (d->cl.role[l].kv_b_layer != l) continue;
            float *kvb = P(m->lp[l].kv_b_proj);
            for (int h = 0; h < NH; h++) {
                size_t row0 = (size_t)h * (D + DV) * R;
                be->copy_cols(S(d->uk[l * NH + h]), D * R, 0, kvb, (int)((size_t)NH * (D + DV) * R), (int)row0, 1, D * R, 0);
                be->copy_cols(S(d->uv[l * NH + h]), DV * R, 0, kvb, (int)((size_t)NH * (D + DV) * R),
                              (int)(row0 + (size_t)D * R), 1, DV * R, 0);
            }
        }
    }
    return d;
}

void decoder_free(Decoder *d) {
    if (!d) return;
    Model *m = d->m;
    for (int s = 0; s < d->cl.n_streams; s++) {
        for (int i = 0; i < d->n_ids; i++) {
            free(d->stage[s][i]);
            free(d->rec[s][i]);
        }
        for (int i = 0; i < d->n_ids; i += d->slab_blocks[s]) m->be->release(d->slabs[s][i / d->slab_blocks[s]]);
        free(d->slabs[s]);
        free(d->blocks[s]);
        free(d->stage[s]);
        free(d->rec[s]);
        free(d->rec_len[s]);
        free(d->rec_cap[s]);
    }
    free(d->blocks);
    free(d->slabs);
    free(d->stride);
    free(d->slab_blocks);
    free(d->stage);
    free(d->rec);
    free(d->rec_len);
    free(d->rec_cap);
    free(d->is_block);
    free(d->rope_heads);
    free(d->rope_dim);
    free(d->pos0);
    free(d->unrot);
    free(d->rd);
    free(d->free_ids);
    free(d->refs);
    free(d->closed);
    free(d->table);
    free(d->len);
    free(d->ps);
    for (int s = 0; s < d->cl.n_streams; s++) codec_unbind(&d->codecs[s]);
    free(d->codecs);
    free(d->row_seq);
    free(d->h_pos);
    m->be->release(d->d_pos);
    free(d->step_table);
    free(d->step_lens);
    free(d->row);
    free(d->tok);
    if (d->scratch_buf) m->be->release(d->scratch_buf);
    table_free(&d->scratch);
    free(d->uk);
    free(d->uv);
    m->inference = d->saved_inference;
    m->apply_codecs = d->saved_apply;
    m->rope_pos = NULL;
    cache_layout_free(&d->cl);
    free(d);
}

// ---------------------------------------------------------------- attention of a step

static void step_attend(Model *m, int l, void *ctx) {
    Decoder *d = ctx;
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerRole *role = &d->cl.role[l];
    int n = d->n, NH = c->num_attention_heads, D = c->head_dim, DV = c->v_head_dim;
    attention_query_forward(m, l);
    attention_kv_forward(m, l);
    write_layer(d, l, n, d->row_seq, d->h_pos);
    const LayerActs *x = &m->la[l];
    if (!config_is_latent(c)) {
        float scale = 1.0f / sqrtf((float)D);
        be->paged_attention(A(x->att_out), A(x->q), &d->ps[role->stream[PART_K]], NULL, &d->ps[role->stream[PART_V]],
                            d->step_table, d->max_blocks, d->step_lens, n, NH, c->num_key_value_heads, D, 0, DV, scale);
        return;
    }
    int R = c->kv_lora_rank, DR = c->qk_rope_head_dim, DQK = D + DR, kvb = role->kv_b_layer;
    float scale = 1.0f / sqrtf((float)DQK);
    // q_abs head h = [W_UK_h^T q_nope_h | q_rope_h]
    for (int h = 0; h < NH; h++) {
        be->copy_cols(S(d->qn), D, 0, A(x->q), NH * DQK, h * DQK, n, D, 0);
        be->zero(S(d->ql), (size_t)n * R * be->act_bytes);
        be->matmul_backward(S(d->ql), NULL, S(d->qn), NULL, S(d->uk[kvb * NH + h]), n, R, D);   // (n, D) @ (D, R)
        be->copy_cols(S(d->qabs), NH * (R + DR), h * (R + DR), S(d->ql), R, 0, n, R, 0);
        be->copy_cols(S(d->qabs), NH * (R + DR), h * (R + DR) + R, A(x->q), NH * DQK, h * DQK + D, n, DR, 0);
    }
    const PagedStream *lat = &d->ps[role->stream[PART_LATENT]];
    be->paged_attention(S(d->olat), S(d->qabs), lat, &d->ps[role->stream[PART_KROPE]], lat, d->step_table,
                        d->max_blocks, d->step_lens, n, NH, 1, R, DR, R, scale);
    // out_h = W_UV_h (sum_t p_t c_t)
    for (int h = 0; h < NH; h++) {
        be->copy_cols(S(d->ol), R, 0, S(d->olat), NH * R, h * R, n, R, 0);
        be->matmul_forward(S(d->oh), S(d->ol), S(d->uv[kvb * NH + h]), n, R, DV);
        be->copy_cols(A(x->att_out), NH * DV, h * DV, S(d->oh), DV, 0, n, DV, 0);
    }
}

// ---------------------------------------------------------------- prefill and steps

typedef struct PrefillRows {
    Decoder *d;
    int rows;
    const int *row_seq, *row_pos;
} PrefillRows;

// Prefill's attention: the full-sequence block, with what each layer computed for the cache
// encoded before the block applies the codec round trip (so the cache holds the encoding of
// the value itself, not of its round trip).
static void prefill_attend(Model *m, int l, void *ctx) {
    PrefillRows *pr = ctx;
    attention_query_forward(m, l);
    attention_kv_forward(m, l);
    write_layer(pr->d, l, pr->rows, pr->row_seq, pr->row_pos);
    attention_cached_forward(m, l);
}

// The logits of rows row_of[0..rows-1] (ascending) into logits (rows x V), a copy per run of
// consecutive rows.
static void logits_to_host(Decoder *d, int rows, const int *row_of, float *logits) {
    const size_t V = (size_t)d->m->cfg.vocab_size;
    for (int i = 0; i < rows;) {
        int run = 1;
        while (i + run < rows && row_of[i + run] == row_of[i] + run) run++;
        model_logits_to_host(d->m, (size_t)row_of[i], (size_t)run, logits + (size_t)i * V);
        i += run;
    }
}

static void check_seq(const Decoder *d, int seq) {
    if (seq < 0 || seq >= d->max_seqs) die("decoder: sequence id %d outside 0..%d", seq, d->max_seqs - 1);
}

// One right-padded forward of n prompts (checked by decoder_prefill) of at most T tokens.
static void prefill_padded(Decoder *d, int n, int T, const int *seq_ids, const int32_t *const *prompts, const int *lens,
                           float *logits) {
    Model *m = d->m;
    // right-padded batch: causal attention keeps the padding out of every real position
    int32_t *in = xcalloc((size_t)n * T, sizeof(int32_t));
    int *row_seq = xmalloc((size_t)n * T * sizeof(int)), *row_pos = xmalloc((size_t)n * T * sizeof(int));
    int *last = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        memcpy(in + (size_t)i * T, prompts[i], (size_t)lens[i] * sizeof(int32_t));
        for (int t = 0; t < T; t++) {
            row_seq[(size_t)i * T + t] = seq_ids[i];
            row_pos[(size_t)i * T + t] = t < lens[i] ? t : -1;
        }
        for (int t = 0; t < lens[i]; t++) reserve(d, seq_ids[i], t);
        last[i] = i * T + lens[i] - 1;
    }
    model_set_batch(m, n, T);
    m->rope_pos = NULL;
    // prefill attends over what the cache gives back, as later steps do: the round trips of
    // the decoder's codecs (which may differ from the model's own layout), restored afterwards
    CachePart saved[N_PARTS];
    memcpy(saved, m->cache.part, sizeof(saved));
    model_use_cache_codecs(m, &d->cl);
    m->apply_codecs = 1;
    PrefillRows pr = {d, n * T, row_seq, row_pos};
    model_forward_with(m, in, NULL, prefill_attend, &pr);
    m->apply_codecs = d->saved_apply;
    memcpy(m->cache.part, saved, sizeof(saved));
    for (int i = 0; i < n; i++) d->len[seq_ids[i]] = lens[i];
    if (logits) logits_to_host(d, n, last, logits);
    free(in);
    free(row_seq);
    free(row_pos);
    free(last);
}

// The prompts go in right-padded groups, longest first, each group taking the prompts after its
// first while (count + 1) x the first's length stays within the n prompts' total tokens: a
// group's positions, padding included, never exceed the tokens prefilled (decode.h). Equal
// lengths stay one forward; one long prompt beside short ones is prefilled apart from them, where
// padding every prompt to it made the prefill's memory and time grow with the prompts times the
// longest (one 2000-token prompt and 15 of 4 tokens: 16 x 2000 positions for 2060 tokens).
static int int_desc(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

static int by_len_desc(const void *a, const void *b) {
    const int *x = a, *y = b;   // (length, index) pairs; ties in index order
    return x[0] != y[0] ? (x[0] < y[0] ? 1 : -1) : (x[1] > y[1]) - (x[1] < y[1]);
}

long long decoder_prefill_positions(const int *lens, int n, int batch) {
    // a group holds at most the tokens of the prompts of its call, and a call at most `batch` prompts
    int *sorted = xmalloc((size_t)n * sizeof(int));
    memcpy(sorted, lens, (size_t)n * sizeof(int));
    qsort(sorted, (size_t)n, sizeof(int), int_desc);
    long long most = 0;
    for (int i = 0; i < n && i < batch; i++) most += sorted[i];
    free(sorted);
    return most;
}

void decoder_prefill(Decoder *d, int n, const int *seq_ids, const int32_t *const *prompts, const int *lens,
                     float *logits) {
    Model *m = d->m;
    if (n < 1 || n > d->max_seqs) die("decoder: prefill of %d sequences (1..%d)", n, d->max_seqs);
    long long total = 0;
    for (int i = 0; i < n; i++) {
        check_seq(d, seq_ids[i]);
        if (d->len[seq_ids[i]]) die("decoder: sequence %d is not empty: prefill starts a sequence", seq_ids[i]);
        if (lens[i] < 1 || lens[i] > d->max_len) die("decoder: prompt of %d tokens (1..%d)", lens[i], d->max_len);
        total += lens[i];
        for (int j = 0; j < i; j++)
            if (seq_ids[j] == seq_ids[i]) die("decoder: sequence %d twice in one prefill", seq_ids[i]);
    }
    const size_t V = (size_t)m->cfg.vocab_size;
    if (d->has_blocks) {
        // a block codec has no full-sequence round trip (its window depends on the query's
        // position): the prompt goes through the cache a block at a time, as steps would read it
        for (int i = 0; i < n; i++) decoder_extend(d, seq_ids[i], prompts[i], lens[i], logits ? logits + (size_t)i * V : NULL);
        return;
    }
    int *order = xmalloc((size_t)n * 2 * sizeof(int)), *gs = xmalloc((size_t)n * sizeof(int)), *gl = xmalloc((size_t)n * sizeof(int));
    const int32_t **gp = xmalloc((size_t)n * sizeof(int32_t *));
    for (int i = 0; i < n; i++) { order[2 * i] = lens[i]; order[2 * i + 1] = i; }
    qsort(order, (size_t)n, 2 * sizeof(int), by_len_desc);
    float *glogits = logits ? xmalloc((size_t)n * V * sizeof(float)) : NULL;
    for (int a = 0; a < n;) {
        const int T = order[2 * a];
        int c = 1;
        while (a + c < n && (long long)(c + 1) * T <= total) c++;
        for (int g = 0; g < c; g++) {
            const int i = order[2 * (a + g) + 1];
            gs[g] = seq_ids[i];
            gp[g] = prompts[i];
            gl[g] = lens[i];
        }
        prefill_padded(d, c, T, gs, gp, gl, glogits);
        for (int g = 0; logits && g < c; g++)
            memcpy(logits + (size_t)order[2 * (a + g) + 1] * V, glogits + (size_t)g * V, V * sizeof(float));
        a += c;
    }
    free(order); free(gs); free(gl); free(gp); free(glogits);
}

// Runs n rows (row_seq, and positions in h_pos, set by the caller) through the model: each row
// writes its cache values at its position, then attends over its sequence's tokens up to and
// including its own. Rows of one sequence come in position order.
static void run_rows(Decoder *d, int n, const int32_t *tokens, float *logits) {
    Model *m = d->m;
    d->n = n;
    for (int i = 0; i < n; i++) {
        int s = d->row_seq[i];
        reserve(d, s, d->h_pos[i]);
        d->step_lens[i] = d->h_pos[i] + 1;
    }
    for (int i = 0; i < n; i++)   // after every reserve: the rows of one sequence share its table
        memcpy(d->step_table + (size_t)i * d->max_blocks, d->table + (size_t)d->row_seq[i] * d->max_blocks,
               (size_t)d->max_blocks * sizeof(int));
    m->be->upload(d->d_pos, d->h_pos, (size_t)n * sizeof(int));
    model_set_batch(m, n, 1);
    m->rope_pos = d->d_pos;
    model_forward_with(m, tokens, NULL, step_attend, d);
    m->rope_pos = NULL;
    if (logits) {
        int *rows = xmalloc((size_t)n * sizeof(int));
        for (int i = 0; i < n; i++) rows[i] = i;
        logits_to_host(d, n, rows, logits);
        free(rows);
    }
}

void decoder_step(Decoder *d, int n, const int *seq_ids, const int32_t *tokens, float *logits) {
    if (n < 1 || n > d->max_seqs) die("decoder: step of %d sequences (1..%d)", n, d->max_seqs);
    for (int i = 0; i < n; i++) {
        int s = seq_ids[i];
        check_seq(d, s);
        if (d->len[s] < 1) die("decoder: sequence %d is empty: prefill it first", s);
        if (d->len[s] >= d->max_len) die("decoder: sequence %d is full (%d tokens)", s, d->max_len);
        for (int j = 0; j < i; j++)
            if (seq_ids[j] == s) die("decoder: sequence %d twice in one step", s);
        d->row_seq[i] = s;
        d->h_pos[i] = d->len[s];
    }
    run_rows(d, n, tokens, logits);
    for (int i = 0; i < n; i++) d->len[seq_ids[i]]++;
}

// decoder_extend and decoder_extend_all: logits (V) after the last token, or all (n, V) after each.
static void extend(Decoder *d, int seq, const int32_t *tokens, int n, float *logits, float *all) {
    check_seq(d, seq);
    if (n < 1 || d->len[seq] + n > d->max_len)
        die("decoder: extending sequence %d of %d tokens by %d exceeds %d", seq, d->len[seq], n, d->max_len);
    const size_t V = (size_t)d->m->cfg.vocab_size;
    for (int done = 0; done < n;) {
        int c = n - done < d->max_rows ? n - done : d->max_rows;
        // with block codecs a chunk stays within one block: its rows then read the cache as steps would
        int room = d->bt - d->len[seq] % d->bt;
        if (d->has_blocks && c > room) c = room;
        for (int i = 0; i < c; i++) {
            d->row_seq[i] = seq;
            d->h_pos[i] = d->len[seq] + i;
        }
        int last = done + c == n;
        float *rows_logits = all ? all + (size_t)done * V : last && logits ? xmalloc((size_t)c * V * sizeof(float)) : NULL;
        run_rows(d, c, tokens + done, rows_logits);
        if (last && logits) memcpy(logits, rows_logits + (size_t)(c - 1) * V, V * sizeof(float));
        if (rows_logits && !all) free(rows_logits);
        d->len[seq] += c;
        done += c;
    }
}

void decoder_extend(Decoder *d, int seq, const int32_t *tokens, int n, float *logits) { extend(d, seq, tokens, n, logits, NULL); }
void decoder_extend_all(Decoder *d, int seq, const int32_t *tokens, int n, float *logits) { extend(d, seq, tokens, n, NULL, logits); }

int decoder_seq_len(const Decoder *d, int seq) {
    check_seq(d, seq);
    return d->len[seq];
}

void decoder_release(Decoder *d, int seq) {
    check_seq(d, seq);
    int blocks = (d->len[seq] + d->bt - 1) / d->bt;
    for (int b = 0; b < blocks; b++) {
        int id = d->table[(size_t)seq * d->max_blocks + b];
        if (--d->refs[id] == 0) d->free_ids[d->n_free++] = id;
    }
    d->len[seq] = 0;
}

// Full blocks are never written again (a sequence only appends), so the fork shares them (a full
// block still open is closed by whichever sequence moves past it first); the partial last block
// is the one place both sequences will write next, so dst gets a copy.
void decoder_fork(Decoder *d, int src, int dst) {
    check_seq(d, src);
    check_seq(d, dst);
    if (src == dst) die("decoder: a sequence cannot be forked into itself (%d)", src);
    if (d->len[src] < 1) die("decoder: sequence %d is empty: nothing to fork", src);
    if (d->len[dst]) die("decoder: sequence %d is not empty: a fork starts a sequence", dst);
    int len = d->len[src], full = len / d->bt, rest = len % d->bt;
    int *from = d->table + (size_t)src * d->max_blocks, *to = d->table + (size_t)dst * d->max_blocks;
    for (int b = 0; b < full; b++) {
        to[b] = from[b];
        d->refs[from[b]]++;
    }
    if (rest) {
        const int id = to[full] = block_open(d, full * d->bt), src_id = from[full];
        for (int s = 0; s < d->cl.n_streams; s++) {
            if (d->is_block[s] == STREAM_WINDOW) memcpy(d->stage[s][id], d->stage[s][src_id], (size_t)rest * width_of(d, s) * sizeof(uint16_t));
            else if (d->is_block[s] == STREAM_RECORDS) {   // the partial block holds src's tokens only: all its records
                d->rec[s][id] = xrealloc(d->rec[s][id], d->rec_len[s][src_id] ? d->rec_len[s][src_id] : 1);
                memcpy(d->rec[s][id], d->rec[s][src_id], d->rec_len[s][src_id]);
                d->rec_len[s][id] = d->rec_cap[s][id] = d->rec_len[s][src_id];
            } else d->m->be->copy(d->blocks[s][id], d->blocks[s][src_id], (size_t)rest * d->ps[s].token_bytes);
        }
    }
    d->len[dst] = len;
}

size_t decoder_blocks_in_use(const Decoder *d) {
    size_t n = 0;
    for (int i = 0; i < d->n_ids; i++) n += d->refs[i] > 0;
    return n;
}

double decoder_bytes_per_token(const Decoder *d) { return cache_layout_bytes_per_token(&d->cl); }
int decoder_block_tokens(const Decoder *d) { return d->bt; }

size_t decoder_cache_bytes(const Decoder *d) {
    size_t total = 0;
    for (int s = 0; s < d->cl.n_streams; s++) {
        int W = width_of(d, s);
        if (d->is_block[s] != STREAM_RECORDS) total += (size_t)d->n_ids * codec_span_bytes(&d->codecs[s], W, d->bt);
        for (int i = 0; i < d->n_ids; i++) total += (d->stage[s][i] ? (size_t)d->bt * W * sizeof(uint16_t) : 0) + d->rec_cap[s][i];
    }
    return total;
}

// From the blocks' state: encoded blocks at their size, open ones at their tokens in fp16,
// variable-size records at theirs.
size_t decoder_stream_seq_bytes(const Decoder *d, int s, int seq) {
    check_seq(d, seq);
    if (s < 0 || s >= d->cl.n_streams) die("decoder: no stream %d", s);
    size_t total = 0;
    const int len = d->len[seq], W = width_of(d, s);
    for (int b = 0; b * d->bt < len; b++) {
        const int id = d->table[(size_t)seq * d->max_blocks + b], tokens = len - b * d->bt < d->bt ? len - b * d->bt : d->bt;
        if (d->is_block[s] == STREAM_TOKENS) total += (size_t)tokens * d->ps[s].token_bytes;
        else if (d->is_block[s] == STREAM_RECORDS) total += d->rec_len[s][id];   // the block's tokens are this sequence's
        else if (d->stage[s][id]) total += (size_t)tokens * W * sizeof(uint16_t);
        else total += codec_span_bytes(&d->codecs[s], W, d->bt);
    }
    return total;
}

size_t decoder_seq_bytes(const Decoder *d, int seq) {
    size_t total = 0;
    for (int s = 0; s < d->cl.n_streams; s++) total += decoder_stream_seq_bytes(d, s, seq);
    return total;
}

const CacheLayout *decoder_layout(const Decoder *d) { return &d->cl; }

void decoder_read(const Decoder *d, int s, int seq, int pos, float *out) {
    check_seq(d, seq);
    if (s < 0 || s >= d->cl.n_streams || pos < 0 || pos >= d->len[seq]) die("decoder_read: no stream %d position %d", s, pos);
    int W = width_of(d, s), id = block_id_at(d, seq, pos);
    if (d->is_block[s] == STREAM_TOKENS && !d->rope_dim[s]) {
        d->m->be->download(d->tok, token_ptr(d, s, seq, pos), d->ps[s].token_bytes);
        codec_decode(&d->codecs[s], out, d->tok, 1, W);
        return;
    }
    const int n = d->is_block[s] == STREAM_WINDOW && !d->stage[s][id] ? d->bt : pos % d->bt + 1;
    float *all = xmalloc((size_t)n * W * sizeof(float));
    stream_decode(&d->rd[s], all, id, n);
    memcpy(out, all + (size_t)(pos % d->bt) * W, (size_t)W * sizeof(float));
    free(all);
}

void model_use_cache_codecs(Model *m, const CacheLayout *layout) {
    if (layout->n_layers != m->cache.n_layers || layout->share_factor != m->cache.share_factor)
        die("internal error: a cache layout of another model");
    if (layout->n_streams != m->cache.n_streams) die("internal error: a cache layout of another model");
    char err[512];
    if (cache_layout_check_fitted(layout, err, sizeof(err)) != 0) die("%s", err);
    for (int p = 0; p < N_PARTS; p++) m->cache.part[p].codec = layout->part[p].codec;
    // the fitted states are the layout's (it outlives the model's use of them); the model's
    // layout keeps its own array of pointers to them
    if (m->cache.fit && m->cache.owns_fit) die("internal error: the model's cache layout owns fitted states");
    if (!layout->fit) {
        free(m->cache.fit);
        m->cache.fit = NULL;
        return;
    }
    if (!m->cache.fit) m->cache.fit = xmalloc((size_t)m->cache.n_streams * sizeof(void *));
    memcpy(m->cache.fit, layout->fit, (size_t)m->cache.n_streams * sizeof(void *));
    m->cache.owns_fit = 0;
}

void decoder_fill_synthetic(Decoder *d, int seq, int n, uint64_t seed) {
    check_seq(d, seq);
    if (n < 0 || d->len[seq] + n > d->max_len) die("decoder: synthetic fill of %d tokens exceeds %d", n, d->max_len);
    // token after token, stream after stream, the values rng_normal would give in turn; drawn
    // for a run of tokens at once by rng_fill_normal (the benchmarks' 16k-token caches took half
    // a minute one value at a time)
    size_t per_token = 0;
    for (int s = 0; s < d->cl.n_streams; s++) per_token += (size_t)width_of(d, s);
    const size_t run = per_token ? ((size_t)1 << 18) / per_token + 1 : 1;
    float *vals = xmalloc((run * per_token + 1) * sizeof(float));
    uint64_t *draws = xmalloc(2 * RNG_FILL_CHUNK * sizeof(uint64_t));
    Rng r;
    rng_seed(&r, seed);
    for (int t0 = 0; t0 < n; t0 += (int)run) {
        const int tn = n - t0 < (int)run ? n - t0 : (int)run;
        rng_fill_normal(vals, (size_t)tn * per_token, 1.0, &r, draws);
        const float *x = vals;
        for (int t = t0; t < t0 + tn; t++) {
            int pos = d->len[seq] + t;
            reserve(d, seq, pos);
            for (int s = 0; s < d->cl.n_streams; s++) {
                write_token(d, s, seq, pos, x);
                x += width_of(d, s);
            }
        }
    }
    free(vals);
    free(draws);
    d->len[seq] += n;
}
