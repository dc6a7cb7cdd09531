#include "model/cache_bytes.h"

void cache_bytes_per_token(const ModelConfig *m, CacheBytes *out) {
    const double bf16 = 2.0;
    int L = m->num_hidden_layers, F = m->share_factor;
    double total = 0, paper = 0;
    for (int l = 0; l < L; l++) {
        int producer = l % F == 0;
        if (!config_is_latent(m)) {
            if (producer) {
                double elems = (double)m->num_key_value_heads * (m->head_dim + m->v_head_dim);
                total += elems * bf16;
                paper += elems;
            }
            continue;
        }
        if (producer) {
            double r = m->kv_lora_rank;
            if (m->latent_quant_bits) total += r * m->latent_quant_bits / 8.0 + (r / m->latent_quant_group) * bf16;
            else total += r * bf16;
            total += m->qk_rope_head_dim * bf16;
            paper += r + m->qk_rope_head_dim;
        } else if (m->share == SHARE_LATENT || m->share == SHARE_LATENT_KVPROJ) {
            // a consumer projects its own k_rope from its own input: it must be cached too
            total += m->qk_rope_head_dim * bf16;
        }
    }
    out->total = total;
    out->per_layer = total / L;
    out->paper_elements = paper / L;
    out->mha_total = (double)L * m->num_attention_heads * (m->head_dim + m->v_head_dim) * bf16;
}
