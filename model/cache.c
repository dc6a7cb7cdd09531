#include "model/cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "layers/int_group_math.h"

const char *codec_name(const Codec *c) {
    switch (c->kind) {
    case CODEC_FP32: return "fp32";
    case CODEC_BF16: return "bf16";
    case CODEC_INT_GROUP: return "int_group";
    }
    return "?";
}

size_t codec_bytes_per_token(const Codec *c, int W) {
    switch (c->kind) {
    case CODEC_FP32: return (size_t)W * 4;
    case CODEC_BF16: return (size_t)W * 2;
    case CODEC_INT_GROUP:
        // packed codes (bits per value, rounded up to whole bytes per token) + one bf16 scale per group
        return ((size_t)W * (size_t)c->bits + 7) / 8 + (size_t)(W / c->group) * 2;
    }
    return 0;
}

static uint16_t bf16_bits_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// int_group layout per token: [scales: G x bf16][codes: W values of `bits` bits, two's
// complement, packed little-endian from bit 0 of byte 0].
static void int_group_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    int G = W / c->group, bits = c->bits;
    size_t tok = codec_bytes_per_token(c, W);
    for (int n = 0; n < N; n++) {
        uint8_t *o = dst + (size_t)n * tok;
        memset(o, 0, tok);
        uint8_t *codes = o + (size_t)G * 2;
        const float *x = src + (size_t)n * W;
        size_t bit = 0;
        for (int g = 0; g < G; g++) {
            float absmax = 0.0f;
            for (int j = 0; j < c->group; j++) absmax = fmaxf(absmax, fabsf(x[g * c->group + j]));
            float scale = int_group_scale(absmax, bits);
            uint16_t sb = (uint16_t)(((uint32_t)0) | bf16_bits_rne(scale));   // exact: scale is a bf16 value
            o[2 * g] = (uint8_t)sb;
            o[2 * g + 1] = (uint8_t)(sb >> 8);
            for (int j = 0; j < c->group; j++, bit += (size_t)bits) {
                uint32_t code = (uint32_t)int_group_code(x[g * c->group + j], scale, bits) & ((1u << bits) - 1);
                for (int b = 0; b < bits; b++)
                    if (code >> b & 1u) codes[(bit + b) >> 3] |= (uint8_t)(1u << ((bit + b) & 7));
            }
        }
    }
}

static void int_group_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    int G = W / c->group, bits = c->bits;
    size_t tok = codec_bytes_per_token(c, W);
    for (int n = 0; n < N; n++) {
        const uint8_t *o = src + (size_t)n * tok;
        const uint8_t *codes = o + (size_t)G * 2;
        float *y = dst + (size_t)n * W;
        size_t bit = 0;
        for (int g = 0; g < G; g++) {
            float scale = bf16_value((uint16_t)(o[2 * g] | (o[2 * g + 1] << 8)));
            for (int j = 0; j < c->group; j++, bit += (size_t)bits) {
                uint32_t code = 0;
                for (int b = 0; b < bits; b++) code |= (uint32_t)(codes[(bit + b) >> 3] >> ((bit + b) & 7) & 1u) << b;
                int v = (code >> (bits - 1)) & 1u ? (int)code - (1 << bits) : (int)code;   // sign-extend
                y[g * c->group + j] = (float)v * scale;
            }
        }
    }
}

void codec_encode(const Codec *c, uint8_t *dst, const float *src, int N, int W) {
    size_t n = (size_t)N * W;
    switch (c->kind) {
    case CODEC_FP32: memcpy(dst, src, n * 4); break;
    case CODEC_BF16:
        for (size_t i = 0; i < n; i++) { uint16_t h = bf16_bits_rne(src[i]); dst[2 * i] = (uint8_t)h; dst[2 * i + 1] = (uint8_t)(h >> 8); }
        break;
    case CODEC_INT_GROUP: int_group_encode(c, dst, src, N, W); break;
    }
}

void codec_decode(const Codec *c, float *dst, const uint8_t *src, int N, int W) {
    size_t n = (size_t)N * W;
    switch (c->kind) {
    case CODEC_FP32: memcpy(dst, src, n * 4); break;
    case CODEC_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = bf16_value((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        break;
    case CODEC_INT_GROUP: int_group_decode(c, dst, src, N, W); break;
    }
}

void codec_roundtrip(const Codec *c, const Backend *be, float *out, const float *in, int N, int W) {
    size_t n = (size_t)N * W;
    switch (c->kind) {
    case CODEC_FP32:
        if (out != in) be->copy_cols(out, W, 0, in, W, 0, N, W, 0);
        return;
    case CODEC_INT_GROUP:
        be->int_group_roundtrip(out, in, N, W, c->bits, c->group);
        return;
    case CODEC_BF16: {
        // evaluation only: through the host codec, so it is exactly what encode/decode give
        float *h = xmalloc(n * sizeof(float));
        uint8_t *bytes = xmalloc(n * 2);
        be->act_to_host(h, in, n);
        codec_encode(c, bytes, h, N, W);
        codec_decode(c, h, bytes, N, W);
        be->act_from_host(out, h, n);
        free(bytes);
        free(h);
        return;
    }
    }
}

int cache_consumer_owns_krope(const ModelConfig *m) {
    return config_is_latent(m) && (m->share == SHARE_LATENT || m->share == SHARE_LATENT_KVPROJ);
}

void cache_layout(CacheLayout *cl, const ModelConfig *m) {
    memset(cl, 0, sizeof(*cl));
    cl->n_layers = m->num_hidden_layers;
    cl->share_factor = m->share_factor;
    cl->share = m->share;
    cl->n_slots = (m->num_hidden_layers - 1) / m->share_factor + 1;   // ceil(L / F), no overflow at F = INT_MAX
    Codec bf16 = {CODEC_BF16, 0, 0};
    if (!config_is_latent(m)) {
        cl->part[PART_K] = (CachePart){1, m->num_key_value_heads * m->head_dim, bf16};
        cl->part[PART_V] = (CachePart){1, m->num_key_value_heads * m->v_head_dim, bf16};
        return;
    }
    Codec latent = bf16;
    if (m->latent_quant_bits) latent = (Codec){CODEC_INT_GROUP, m->latent_quant_bits, m->latent_quant_group};
    cl->part[PART_LATENT] = (CachePart){1, m->kv_lora_rank, latent};
    cl->part[PART_KROPE] = (CachePart){1, m->qk_rope_head_dim, bf16};
    if (m->share_factor > 1 && cache_consumer_owns_krope(m))
        cl->part[PART_OWN_KROPE] = (CachePart){1, m->qk_rope_head_dim, bf16};
}

void cache_bytes_per_token(const ModelConfig *m, CacheBytes *out) {
    CacheLayout cl;
    cache_layout(&cl, m);
    int L = m->num_hidden_layers;
    double total = 0, paper = 0;
    for (int l = 0; l < L; l++) {
        int producer = cache_is_producer(&cl, l);
        for (int p = 0; p < N_PARTS; p++) {
            const CachePart *part = &cl.part[p];
            if (!part->present || (p == PART_OWN_KROPE) == producer) continue;
            total += (double)codec_bytes_per_token(&part->codec, part->width);
        }
        // The paper's Table 4 figure, per layer on average: K and V in bf16 bytes for MHA/GQA;
        // elements (not bytes) of latent + k_rope for MLA/CLLA, consumers' own k_rope included;
        // for CLLA-quant only the packed latent codes (no k_rope, no scales).
        if (!config_is_latent(m)) {
            if (producer) paper += 2.0 * (cl.part[PART_K].width + cl.part[PART_V].width);
        } else if (m->latent_quant_bits) {
            if (producer) paper += m->kv_lora_rank * m->latent_quant_bits / 8.0;
        } else {
            if (producer) paper += m->kv_lora_rank + m->qk_rope_head_dim;
            else if (cl.part[PART_OWN_KROPE].present) paper += m->qk_rope_head_dim;
        }
    }
    out->total = total;
    out->per_layer = total / L;
    out->paper = paper / L;
    out->mha_total = (double)L * m->num_attention_heads * (m->head_dim + m->v_head_dim) * 2.0;
}
