#include "eval/through_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/decode.h"

// -log softmax(logits)[target], in double.
double eval_token_nll(const float *logits, int V, int target) {
    double mx = logits[0], sum = 0;
    for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
    return log(sum) + mx - (double)logits[target];
}

void eval_through_cache(Model *m, const CacheLayout *layout, const int32_t *inputs, const int32_t *targets,
                        int B, int T, CacheLoss *acc) {
    int V = m->cfg.vocab_size;
    // CHUNK rows of a window's logits at a time, or one step's (B x V): never all B x T x V, nor a
    // window's T x V, on the host beside the forward's own logits
    enum { CHUNK = 256 };
    const int rows = T < CHUNK ? T : CHUNK;
    float *logits = xmalloc((size_t)(rows > B ? rows : B) * V * sizeof(float));
    Decoder *d = decoder_new(m, layout, B, T);
    const int blocks = cache_layout_has_blocks(layout);
    int saved_inference = m->inference, saved_apply = m->apply_codecs;
    if (!blocks) {
        // full forward, every codec's round trip applied where the cache holds a value
        m->inference = 1;
        m->apply_codecs = 1;
        model_use_cache_codecs(m, layout);
        model_set_batch(m, B, T);
        model_forward(m, inputs, NULL);
    }
    for (int b = 0; b < B; b++) {
        for (int t0 = 0; t0 < T; t0 += rows) {
            const int n = T - t0 < rows ? T - t0 : rows;
            if (!blocks) model_logits_to_host(m, (size_t)b * T + t0, (size_t)n, logits);
            // a block codec's window depends on the query's position, so no single forward holds
            // what each query reads: the whole window goes through the cache a block per forward
            // (decoder_extend; in chunks, as one call splits it), the chunked prefill of a served model
            else decoder_extend_all(d, b, inputs + (size_t)b * T + t0, n, logits);
            for (int t = 0; t < n; t++) {
                const int32_t target = targets[(size_t)b * T + t0 + t];
                if (target == IGNORE_INDEX) continue;
                acc->full_sum += eval_token_nll(logits + (size_t)t * V, V, target);
                acc->count++;
            }
        }
        if (blocks) decoder_release(d, b);
    }
    m->inference = saved_inference;
    m->apply_codecs = saved_apply;

    // token by token through the cache: prefill the first token of every window, then steps
    int *ids = xmalloc((size_t)B * sizeof(int)), *one = xmalloc((size_t)B * sizeof(int));
    const int32_t **first = xmalloc((size_t)B * sizeof(int32_t *));
    int32_t *tok = xmalloc((size_t)B * sizeof(int32_t));
    for (int b = 0; b < B; b++) { ids[b] = b; one[b] = 1; first[b] = inputs + (size_t)b * T; }
    for (int t = 0; t < T; t++) {
        if (t == 0) decoder_prefill(d, B, ids, first, one, logits);
        else {
            for (int b = 0; b < B; b++) tok[b] = inputs[(size_t)b * T + t];
            decoder_step(d, B, ids, tok, logits);
        }
        for (int b = 0; b < B; b++) {
            int32_t target = targets[(size_t)b * T + t];
            if (target != IGNORE_INDEX) acc->decode_sum += eval_token_nll(logits + (size_t)b * V, V, target);
        }
    }
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < layout->n_streams; s++) acc->stored[layout->streams[s].part] += (double)decoder_stream_seq_bytes(d, s, b);
        acc->stored_tokens += decoder_seq_len(d, b);
    }
    decoder_free(d);
    free(ids); free(one); free(first); free(tok); free(logits);
}
