// HF keys clla reads past. A key is harmless when it is metadata (architectures, token ids,
// dtype), or when its value is the one clla implements (hidden_act "silu", no biases, no
// dropout, plain RoPE, top-k softmax routing without groups). Any other value would make a
// model clla cannot build faithfully, so it is refused rather than ignored.
#include "model/config_hf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/json_strict.h"
#include "common/util.h"

// Metadata: never changes the model.
static const char *METADATA[] = {
    "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "model_type",
    "torch_dtype", "dtype", "transformers_version", "use_cache", "pretraining_tp", "_name_or_path",
    "ep_size", "seq_aux", "max_window_layers", "output_router_logits",
};

static int is_num(const cJSON *v, double x) { return cJSON_IsNumber(v) && v->valuedouble == x; }
static int is_str(const cJSON *v, const char *s) { return cJSON_IsString(v) && !strcmp(v->valuestring, s); }

// Is the sliding window of root in force? (Mistral: sliding_window alone; Qwen2: only with
// use_sliding_window true.) A window at least max_position_embeddings long never cuts anything.
static int sliding_window_active(const cJSON *root) {
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    const cJSON *use = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (!sw || cJSON_IsNull(sw) || cJSON_IsFalse(use)) return 0;
    const cJSON *maxpos = cJSON_GetObjectItemCaseSensitive(root, "max_position_embeddings");
    if (cJSON_IsNumber(sw) && cJSON_IsNumber(maxpos) && sw->valuedouble >= maxpos->valuedouble) return 0;
    return 1;
}

int config_hf_key(const cJSON *root, const cJSON *v, const char *origin) {
    const char *k = v->string;
    for (size_t i = 0; i < sizeof(METADATA) / sizeof(METADATA[0]); i++)
        if (!strcmp(METADATA[i], k)) return 1;
    const char *why = NULL;   // what the value asks for that clla lacks; NULL: harmless or unknown
    int known = 1;
    if (!strcmp(k, "rope_scaling")) {
        if (!cJSON_IsNull(v)) why = "RoPE scaling (YaRN, linear, dynamic, llama3) is not implemented: clla uses plain RoPE with rope_theta";
    } else if (!strcmp(k, "attention_bias") || !strcmp(k, "mlp_bias")) {
        if (!cJSON_IsFalse(v) && !cJSON_IsNull(v)) why = "biases are not implemented: clla's projections have none";
    } else if (!strcmp(k, "hidden_act")) {
        if (!is_str(v, "silu") && !cJSON_IsNull(v)) why = "the MLP activation is SiLU (SwiGLU) in clla";
    } else if (!strcmp(k, "attention_dropout")) {
        if (!is_num(v, 0) && !cJSON_IsNull(v)) why = "dropout is not implemented";
    } else if (!strcmp(k, "sliding_window") || !strcmp(k, "use_sliding_window")) {
        if (sliding_window_active(root)) why = "sliding-window attention is not implemented (set use_sliding_window false or sliding_window null for full attention)";
    } else if (!strcmp(k, "topk_method")) {
        if (!is_str(v, "greedy") && !is_str(v, "group_limited_greedy") && !cJSON_IsNull(v))
            why = "routing is top-k over softmax scores (greedy) in clla";
    } else if (!strcmp(k, "n_group") || !strcmp(k, "topk_group")) {
        if (!is_num(v, 1) && !cJSON_IsNull(v)) why = "group-limited routing is not implemented (1 group)";
    } else if (!strcmp(k, "scoring_func")) {
        if (!is_str(v, "softmax") && !cJSON_IsNull(v)) why = "router scores are a softmax in clla";
    } else if (!strcmp(k, "routed_scaling_factor")) {
        if (!is_num(v, 1) && !cJSON_IsNull(v)) why = "routed expert outputs are not rescaled in clla (factor 1)";
    } else if (!strcmp(k, "moe_layer_freq")) {
        if (!is_num(v, 1) && !cJSON_IsNull(v)) why = "every layer from first_k_dense_layers on is MoE in clla (frequency 1)";
    } else if (!strcmp(k, "num_nextn_predict_layers")) {
        if (!is_num(v, 0) && !cJSON_IsNull(v)) why = "multi-token prediction layers are not implemented";
    } else {
        known = 0;
    }
    if (why) {
        char val[96];
        die("%s: key '%s' = %s changes the model and clla does not implement it: %s; remove the key (or set it to null) to build the model without it",
            origin, k, json_snippet(v, val, sizeof(val)), why);
    }
    return known;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return (size_t)-1;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *config_closest(const char *name, const char *const *cands, size_t n) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(name, cands[i]);
        if (d < best_d) { best_d = d; best = cands[i]; }
    }
    // a typo: a couple of edits, and fewer than a third of the name
    size_t len = strlen(name);
    return best && best_d <= 3 && best_d * 3 <= len ? best : NULL;
}
