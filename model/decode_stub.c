// TEMPORARY stub of model/decode.h and the codec spec functions of model/cache.h, so that
// `clla generate` / `clla export` (branch gen) build and run before the real decoder lands.
// To be DROPPED at merge: model/decode.c and model/cache.c replace every function here.
// decoder_step re-runs the full forward over each whole sequence (slow, but exact logits);
// no cache is kept; the codec specs know only the three existing kinds, minimally parsed.
#include "model/decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"

struct Decoder {
    Model *m;
    CacheLayout layout;
    int max_seqs, max_len;
    int32_t *toks;   // [max_seqs][max_len]
    int *len;
};

Decoder *decoder_new(Model *m, const CacheLayout *layout, int max_seqs, int max_len) {
    if (max_seqs < 1 || max_len < 1 || max_len > m->cfg.max_position_embeddings)
        die("decoder_new: max_seqs %d, max_len %d (max_position_embeddings %d)", max_seqs, max_len,
            m->cfg.max_position_embeddings);
    Decoder *d = xcalloc(1, sizeof(*d));
    d->m = m;
    if (layout) d->layout = *layout;
    else cache_layout(&d->layout, &m->cfg);
    d->max_seqs = max_seqs;
    d->max_len = max_len;
    d->toks = xcalloc((size_t)max_seqs * (size_t)max_len, sizeof(int32_t));
    d->len = xcalloc((size_t)max_seqs, sizeof(int));
    model_set_batch(m, 1, max_len);
    return d;
}

void decoder_free(Decoder *d) {
    if (!d) return;
    free(d->toks);
    free(d->len);
    free(d);
}

// Full forward of sequence s padded to max_len (causal: padding does not change earlier rows).
static void last_logits(Decoder *d, int s, float *out) {
    Model *m = d->m;
    int V = m->cfg.vocab_size;
    model_forward(m, d->toks + (size_t)s * d->max_len, NULL);
    const float *lg = (const float *)table_ptr_store(&m->acts, m->act, m->logits);
    lg = (const float *)((const char *)lg + (size_t)(d->len[s] - 1) * V * m->be->act_bytes);
    m->be->act_to_host(out, lg, (size_t)V);
}

void decoder_prefill(Decoder *d, int n, const int *seq_ids, const int32_t *const *prompts, const int *lens, float *logits) {
    for (int i = 0; i < n; i++) {
        int s = seq_ids[i];
        if (d->len[s] != 0 || lens[i] < 1 || lens[i] > d->max_len) die("decoder_prefill: bad sequence %d", s);
        memcpy(d->toks + (size_t)s * d->max_len, prompts[i], (size_t)lens[i] * sizeof(int32_t));
        d->len[s] = lens[i];
        last_logits(d, s, logits + (size_t)i * d->m->cfg.vocab_size);
    }
}

void decoder_step(Decoder *d, int n, const int *seq_ids, const int32_t *tokens, float *logits) {
    for (int i = 0; i < n; i++) {
        int s = seq_ids[i];
        if (d->len[s] < 1 || d->len[s] >= d->max_len) die("decoder_step: bad sequence %d", s);
        d->toks[(size_t)s * d->max_len + d->len[s]++] = tokens[i];
        last_logits(d, s, logits + (size_t)i * d->m->cfg.vocab_size);
    }
}

int decoder_seq_len(const Decoder *d, int seq) { return d->len[seq]; }

void decoder_release(Decoder *d, int seq) {
    memset(d->toks + (size_t)seq * d->max_len, 0, (size_t)d->max_len * sizeof(int32_t));
    d->len[seq] = 0;
}

size_t decoder_bytes_per_token(const Decoder *d) {
    CacheBytes cb;
    cache_bytes_per_token(&d->m->cfg, &cb);
    return (size_t)cb.total;
}

size_t decoder_cache_bytes(const Decoder *d) {
    size_t t = 0;
    for (int s = 0; s < d->max_seqs; s++) t += (size_t)d->len[s];
    return t * decoder_bytes_per_token(d);
}

const CacheLayout *decoder_layout(const Decoder *d) { return &d->layout; }

// ---------------------------------------------------------------- codec specs (stub)

int codec_parse(Codec *c, const char *spec, char *err, size_t errlen) {
    memset(c, 0, sizeof(*c));
    if (!strcmp(spec, "fp32")) { c->kind = CODEC_FP32; return 0; }
    if (!strcmp(spec, "bf16")) { c->kind = CODEC_BF16; return 0; }
    int bits, group, used = 0;
    if (sscanf(spec, "int_group:bits=%d,group=%d%n", &bits, &group, &used) == 2 && spec[used] == 0 &&
        (bits == 2 || bits == 4 || bits == 8) && group > 0) {
        *c = (Codec){CODEC_INT_GROUP, bits, group};
        return 0;
    }
    snprintf(err, errlen, "unknown codec '%s': use fp32, bf16 or int_group:bits=2|4|8,group=G", spec);
    return -1;
}

void codec_format(const Codec *c, char *buf, size_t n) {
    if (c->kind == CODEC_INT_GROUP) snprintf(buf, n, "int_group:bits=%d,group=%d", c->bits, c->group);
    else snprintf(buf, n, "%s", codec_name(c));
}

static const char *const PART_NAMES[N_PARTS] = {"k", "v", "latent", "k_rope", "own_k_rope"};

const char *cache_part_name(int part) { return part >= 0 && part < N_PARTS ? PART_NAMES[part] : "?"; }

static int set_part(CacheLayout *cl, int p, const char *spec, char *err, size_t errlen) {
    Codec c;
    if (codec_parse(&c, spec, err, errlen) != 0) return -1;
    if (c.kind == CODEC_INT_GROUP && cl->part[p].width % c.group) {
        snprintf(err, errlen, "codec '%s' does not fit part '%s' of width %d", spec, PART_NAMES[p], cl->part[p].width);
        return -1;
    }
    cl->part[p].codec = c;
    return 0;
}

int cache_layout_apply_spec(CacheLayout *cl, const char *spec, char *err, size_t errlen) {
    const char *eq = strchr(spec, '=');
    const char *colon = strchr(spec, ':');
    if (eq && (!colon || eq < colon)) {
        for (int p = 0; p < N_PARTS; p++)
            if (strlen(PART_NAMES[p]) == (size_t)(eq - spec) && !strncmp(spec, PART_NAMES[p], (size_t)(eq - spec))) {
                if (!cl->part[p].present) { snprintf(err, errlen, "part '%s' is not in this model's cache", PART_NAMES[p]); return -1; }
                return set_part(cl, p, eq + 1, err, errlen);
            }
        snprintf(err, errlen, "unknown cache part in '%s'", spec);
        return -1;
    }
    for (int p = 0; p < N_PARTS; p++)
        if (cl->part[p].present && set_part(cl, p, spec, err, errlen) != 0) return -1;
    return 0;
}

cJSON *cache_layout_to_json(const CacheLayout *cl) {
    cJSON *o = cJSON_CreateObject();
    char buf[64];
    for (int p = 0; p < N_PARTS; p++)
        if (cl->part[p].present) {
            codec_format(&cl->part[p].codec, buf, sizeof(buf));
            cJSON_AddStringToObject(o, PART_NAMES[p], buf);
        }
    return o;
}

int cache_layout_from_json(CacheLayout *cl, const ModelConfig *m, const cJSON *j, char *err, size_t errlen) {
    cache_layout(cl, m);
    for (const cJSON *it = j ? j->child : NULL; it; it = it->next) {
        if (!cJSON_IsString(it)) { snprintf(err, errlen, "cache part '%s' must be a codec string", it->string); return -1; }
        char spec[256];
        snprintf(spec, sizeof(spec), "%s=%s", it->string, it->valuestring);
        if (cache_layout_apply_spec(cl, spec, err, errlen) != 0) return -1;
    }
    return 0;
}
