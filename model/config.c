// Config parsing: a key table drives reading, --set overrides, writing and the
// "unknown key" error, so a knob is declared once.
#include "model/config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json_strict.h"
#include "common/num.h"
#include "common/util.h"
#include "model/config_hf.h"
#include "model/hf_config.h"

// K_AUTO: true, false or "auto", stored as 1, 0 or -1
typedef enum { K_INT, K_LLONG, K_ULLONG, K_FLOAT, K_DOUBLE, K_BOOL, K_AUTO, K_STR, K_SHARE } KeyType;

typedef struct KeyDef {
    const char *name;
    const char *alias;      // HF name of the same knob in another model family (or NULL)
    KeyType type;
    size_t offset;
    size_t size;            // for strings
} KeyDef;

#define M_(field) offsetof(ModelConfig, field)
#define T_(field) offsetof(TrainConfig, field)

static const KeyDef MODEL_KEYS[] = {
    {"attention", NULL, K_STR, M_(attention), sizeof(((ModelConfig *)0)->attention)},
    {"vocab_size", NULL, K_INT, M_(vocab_size), 0},
    {"hidden_size", NULL, K_INT, M_(hidden_size), 0},
    {"num_hidden_layers", NULL, K_INT, M_(num_hidden_layers), 0},
    {"num_attention_heads", NULL, K_INT, M_(num_attention_heads), 0},
    {"num_key_value_heads", NULL, K_INT, M_(num_key_value_heads), 0},
    {"head_dim", "qk_nope_head_dim", K_INT, M_(head_dim), 0},
    {"v_head_dim", NULL, K_INT, M_(v_head_dim), 0},
    {"intermediate_size", NULL, K_INT, M_(intermediate_size), 0},
    {"q_lora_rank", NULL, K_INT, M_(q_lora_rank), 0},
    {"kv_lora_rank", NULL, K_INT, M_(kv_lora_rank), 0},
    {"qk_rope_head_dim", NULL, K_INT, M_(qk_rope_head_dim), 0},
    {"share_factor", "cla_share_factor", K_INT, M_(share_factor), 0},
    {"share", NULL, K_SHARE, M_(share), 0},
    {"latent_quant_bits", NULL, K_INT, M_(latent_quant_bits), 0},
    {"latent_quant_group", NULL, K_INT, M_(latent_quant_group), 0},
    {"n_routed_experts", NULL, K_INT, M_(n_routed_experts), 0},
    {"n_shared_experts", NULL, K_INT, M_(n_shared_experts), 0},
    {"num_experts_per_tok", NULL, K_INT, M_(num_experts_per_tok), 0},
    {"moe_intermediate_size", NULL, K_INT, M_(moe_intermediate_size), 0},
    {"shared_expert_intermediate_size", NULL, K_INT, M_(shared_expert_intermediate_size), 0},
    {"first_k_dense_layers", "first_k_dense_replace", K_INT, M_(first_k_dense_layers), 0},
    {"moe_aux_loss_coef", "aux_loss_alpha", K_FLOAT, M_(moe_aux_loss_coef), 0},
    {"moe_z_loss_coef", NULL, K_FLOAT, M_(moe_z_loss_coef), 0},
    {"moe_capacity_factor", NULL, K_DOUBLE, M_(moe_capacity_factor), 0},
    {"norm_topk_prob", NULL, K_BOOL, M_(norm_topk_prob), 0},
    {"rms_norm_eps", NULL, K_FLOAT, M_(rms_norm_eps), 0},
    {"rope_theta", NULL, K_FLOAT, M_(rope_theta), 0},
    {"max_position_embeddings", NULL, K_INT, M_(max_position_embeddings), 0},
    {"tie_word_embeddings", NULL, K_BOOL, M_(tie_word_embeddings), 0},
    {"initializer_range", NULL, K_FLOAT, M_(initializer_range), 0},
};

static const KeyDef TRAIN_KEYS[] = {
    {"data", NULL, K_STR, T_(data), sizeof(((TrainConfig *)0)->data)},
    {"val_data", NULL, K_STR, T_(val_data), sizeof(((TrainConfig *)0)->val_data)},
    {"tokenizer", NULL, K_STR, T_(tokenizer), sizeof(((TrainConfig *)0)->tokenizer)},
    {"tokenizer_hash", NULL, K_STR, T_(tokenizer_hash), sizeof(((TrainConfig *)0)->tokenizer_hash)},
    {"out_dir", NULL, K_STR, T_(out_dir), sizeof(((TrainConfig *)0)->out_dir)},
    {"init_from", NULL, K_STR, T_(init_from), sizeof(((TrainConfig *)0)->init_from)},
    {"metrics", NULL, K_STR, T_(metrics), sizeof(((TrainConfig *)0)->metrics)},
    {"seq_len", NULL, K_INT, T_(seq_len), 0},
    {"micro_batch", NULL, K_INT, T_(micro_batch), 0},
    {"global_batch_tokens", NULL, K_LLONG, T_(global_batch_tokens), 0},
    {"max_steps", NULL, K_INT, T_(max_steps), 0},
    {"warmup_steps", NULL, K_INT, T_(warmup_steps), 0},
    {"lr", NULL, K_FLOAT, T_(lr), 0},
    {"min_lr", NULL, K_FLOAT, T_(min_lr), 0},
    {"beta1", NULL, K_FLOAT, T_(beta1), 0},
    {"beta2", NULL, K_FLOAT, T_(beta2), 0},
    {"eps", NULL, K_FLOAT, T_(eps), 0},
    {"weight_decay", NULL, K_FLOAT, T_(weight_decay), 0},
    {"grad_clip", NULL, K_FLOAT, T_(grad_clip), 0},
    {"seed", NULL, K_ULLONG, T_(seed), 0},
    {"log_every", NULL, K_INT, T_(log_every), 0},
    {"val_every", NULL, K_INT, T_(val_every), 0},
    {"val_batches", NULL, K_INT, T_(val_batches), 0},
    {"threads", NULL, K_INT, T_(threads), 0},
    {"save_every", NULL, K_INT, T_(save_every), 0},
    {"keep_checkpoints", NULL, K_INT, T_(keep_checkpoints), 0},
    {"max_consecutive_skips", NULL, K_INT, T_(max_consecutive_skips), 0},
    {"zero_stage", NULL, K_INT, T_(zero_stage), 0},
    {"dist_timeout_s", NULL, K_FLOAT, T_(dist_timeout_s), 0},
    {"overlap_grad_reduce", NULL, K_AUTO, T_(overlap_grad_reduce), 0},
    {"grad_bucket_elements", NULL, K_LLONG, T_(grad_bucket_elements), 0},
};
#define N_MODEL_KEYS (sizeof(MODEL_KEYS) / sizeof(MODEL_KEYS[0]))
#define N_TRAIN_KEYS (sizeof(TRAIN_KEYS) / sizeof(TRAIN_KEYS[0]))

static const char *SHARE_NAMES[] = {"kv", "latent", "latent_krope", "latent_kvproj"};

static const KeyDef *find_key(const KeyDef *keys, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(keys[i].name, name) || (keys[i].alias && !strcmp(keys[i].alias, name))) return &keys[i];
    return NULL;
}

// "unknown key" with the closest key of the table as a "did you mean".
static void die_unknown(const KeyDef *keys, size_t n, const char *name, const char *origin, const char *prefix, const char *hint) {
    if (!prefix[0] && (!strcmp(name, "package") || !strcmp(name, "cache")))
        die("%s: key '%s' makes this an inference package's config (clla export): give the package directory to clla generate, "
            "eval or export as a model, or use the model's training config here", origin, name);
    const char *cands[2 * (N_MODEL_KEYS > N_TRAIN_KEYS ? N_MODEL_KEYS : N_TRAIN_KEYS)];
    size_t nc = 0;
    for (size_t i = 0; i < n; i++) {
        cands[nc++] = keys[i].name;
        if (keys[i].alias) cands[nc++] = keys[i].alias;
    }
    const char *near = config_closest(name, cands, nc);
    if (near) die("%s: unknown key '%s%s' (did you mean '%s%s'?): %s", origin, prefix, name, prefix, near, hint);
    die("%s: unknown key '%s%s': %s", origin, prefix, name, hint);
}

static void set_value(void *base, const KeyDef *k, const cJSON *v, const char *origin, const char *prefix) {
    char *dst = (char *)base + k->offset;
    const char *name = k->name;
    char val[64];
    switch (k->type) {
    case K_INT: case K_LLONG: case K_ULLONG: {
        if (!cJSON_IsNumber(v))
            die("%s: key '%s%s' must be a number, got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        int64_t lo = k->type == K_INT ? INT_MIN : k->type == K_LLONG ? INT64_MIN : 0;
        int64_t hi = k->type == K_INT ? INT_MAX : INT64_MAX;
        int64_t x = 0;
        int rc = num_f64_to_i64(v->valuedouble, lo, hi, &x);
        if (rc == NUM_SYNTAX) die("%s: key '%s%s' must be a whole number, got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        if (rc != NUM_OK) {   // the key's own range is checked later (config_validate): say which side this one left
            if (v->valuedouble > 0)
                die("%s: key '%s%s' = %s is too large: at most %lld", origin, prefix, name, json_snippet(v, val, sizeof(val)),
                    (long long)(hi > 9007199254740992LL ? 9007199254740992LL : hi));
            die("%s: key '%s%s' = %s is %s", origin, prefix, name, json_snippet(v, val, sizeof(val)),
                lo == 0 ? "negative: it must be >= 0" : "too small");
        }
        if (k->type == K_INT) *(int *)dst = (int)x;
        else if (k->type == K_LLONG) *(long long *)dst = (long long)x;
        else *(unsigned long long *)dst = (unsigned long long)x;
        break;
    }
    case K_FLOAT:
        if (!cJSON_IsNumber(v)) die("%s: key '%s%s' must be a number, got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        // cJSON reads 1e999 as inf: a non-finite or float-overflowing value would train on inf/nan
        if (!isfinite(v->valuedouble) || fabs(v->valuedouble) > FLT_MAX)
            die("%s: key '%s%s' = %s is not a finite 32-bit float: use a number of magnitude below %g", origin, prefix, name,
                json_snippet(v, val, sizeof(val)), (double)FLT_MAX);
        // nor one that vanishes in it: 1e-50 became 0 without a word (lr 0), or a subnormal
        if (v->valuedouble != 0 && fabs(v->valuedouble) < FLT_MIN)
            die("%s: key '%s%s' = %s is below the smallest normal 32-bit float (%g): use 0 or a larger magnitude", origin, prefix,
                name, json_snippet(v, val, sizeof(val)), (double)FLT_MIN);
        *(float *)dst = (float)v->valuedouble;
        break;
    case K_DOUBLE:   // a value used in double arithmetic, where its float rounding would show (a capacity)
        if (!cJSON_IsNumber(v)) die("%s: key '%s%s' must be a number, got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        if (!isfinite(v->valuedouble)) die("%s: key '%s%s' = %s is not a finite number", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        *(double *)dst = v->valuedouble;
        break;
    case K_BOOL:
        if (cJSON_IsBool(v)) *(int *)dst = cJSON_IsTrue(v);
        else if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) *(int *)dst = (int)v->valuedouble;
        else die("%s: key '%s%s' must be true or false, got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        break;
    case K_AUTO:
        if (cJSON_IsBool(v)) *(int *)dst = cJSON_IsTrue(v);
        else if (cJSON_IsString(v) && !strcmp(v->valuestring, "auto")) *(int *)dst = -1;
        else die("%s: key '%s%s' must be true, false or \"auto\", got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        break;
    case K_STR:
        if (!cJSON_IsString(v)) die("%s: key '%s%s' must be a string, got %s", origin, prefix, name, json_snippet(v, val, sizeof(val)));
        if (strlen(v->valuestring) >= k->size) die("%s: key '%s%s' is longer than %zu characters", origin, prefix, name, k->size - 1);
        strcpy(dst, v->valuestring);
        break;
    case K_SHARE: {
        if (!cJSON_IsString(v)) die("%s: key '%s%s' must be one of kv, latent, latent_krope, latent_kvproj", origin, prefix, name);
        int found = -1;
        for (int i = 0; i < 4; i++) if (!strcmp(v->valuestring, SHARE_NAMES[i])) found = i;
        if (found < 0) die("%s: key '%s%s' = '%s': use one of kv, latent, latent_krope, latent_kvproj", origin, prefix, name, v->valuestring);
        *(int *)dst = found;
        break;
    }
    }
}

static cJSON *value_to_json(const void *base, const KeyDef *k) {
    const char *src = (const char *)base + k->offset;
    switch (k->type) {
    case K_INT: return cJSON_CreateNumber(*(const int *)src);
    case K_LLONG: return cJSON_CreateNumber((double)*(const long long *)src);
    case K_ULLONG: return cJSON_CreateNumber((double)*(const unsigned long long *)src);
    case K_FLOAT: {
        // the shortest decimal that reads back as the same float (1e-05, not 9.99999975e-06)
        float f = *(const float *)src;
        char buf[32];
        for (int prec = 6; prec <= 9; prec++) {
            snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
            if ((float)strtod(buf, NULL) == f) break;
        }
        return cJSON_CreateNumber(strtod(buf, NULL));
    }
    case K_DOUBLE: return cJSON_CreateNumber(*(const double *)src);
    case K_BOOL: return cJSON_CreateBool(*(const int *)src);
    case K_AUTO: return *(const int *)src < 0 ? cJSON_CreateString("auto") : cJSON_CreateBool(*(const int *)src);
    case K_STR: return cJSON_CreateString(src);
    case K_SHARE: return cJSON_CreateString(SHARE_NAMES[*(const int *)src]);
    }
    return NULL;
}

static void defaults(Config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    ModelConfig *m = &cfg->model;
    strcpy(m->attention, "mha");
    m->share_factor = 1;
    m->share = SHARE_KV;
    m->latent_quant_group = 32;
    m->num_experts_per_tok = 1;
    m->moe_capacity_factor = 0.0;
    m->rms_norm_eps = 1e-6f;
    m->rope_theta = 10000.0f;
    m->max_position_embeddings = 4096;
    m->initializer_range = 0.02f;
    TrainConfig *t = &cfg->train;
    strcpy(t->out_dir, "runs/default");
    t->seq_len = 256;
    t->micro_batch = 4;
    t->max_steps = 100;
    t->warmup_steps = 10;
    t->lr = 3e-4f;
    t->min_lr = 3e-5f;
    t->beta1 = 0.9f;
    t->beta2 = 0.95f;
    t->eps = 1e-8f;
    t->weight_decay = 0.1f;
    t->grad_clip = 1.0f;
    t->seed = 1234;
    t->log_every = 1;
    t->val_batches = 8;
    t->max_consecutive_skips = 1;   // a non-finite step stops the run at once (docs/CHECKPOINTS.md)
    t->dist_timeout_s = 600;   // torch.distributed's default collective timeout
    t->overlap_grad_reduce = -1;   // auto: when the ranks span hosts; the same bits either way (docs/DISTRIBUTED.md)
    t->grad_bucket_elements = 1 << 20;   // 4 MiB messages, DIST_PIECE's
}

// Preset knobs (docs/DESIGN.md section 1). -1 for n_kv_heads_rule means "as configured".
typedef struct Preset {
    const char *name;
    int latent;        // needs kv_lora_rank > 0
    int kv_rule;       // 0: = heads (MHA), 1: must be configured (GQA), 2: one (MQA)
    int share_factor;
    int share;
    int quant_bits;
} Preset;

static const Preset PRESETS[] = {
    {"mha", 0, 0, 1, SHARE_KV, 0},
    {"gqa", 0, 1, 1, SHARE_KV, 0},
    {"mqa", 0, 2, 1, SHARE_KV, 0},
    {"mla", 1, 0, 1, SHARE_LATENT, 0},
    {"cla", 0, 0, 2, SHARE_KV, 0},
    {"gqa_cla", 0, 1, 2, SHARE_KV, 0},
    {"clla", 1, 0, 2, SHARE_LATENT, 0},
    {"clla_share_krope", 1, 0, 2, SHARE_LATENT_KROPE, 0},
    {"clla_share_kvproj", 1, 0, 2, SHARE_LATENT_KVPROJ, 0},
    {"clla_quant", 1, 0, 2, SHARE_LATENT, 4},
    {"clla_quant_share_kvproj", 1, 0, 2, SHARE_LATENT_KVPROJ, 4},
};
#define N_PRESETS (sizeof(PRESETS) / sizeof(PRESETS[0]))

static const Preset *find_preset(const char *name) {
    for (size_t i = 0; i < N_PRESETS; i++) if (!strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

int config_apply_preset(ModelConfig *m, const char *name) {
    const Preset *p = find_preset(name);
    if (!p) return 0;
    snprintf(m->attention, sizeof(m->attention), "%s", name);
    m->share_factor = p->share_factor;
    m->share = p->share;
    m->latent_quant_bits = p->quant_bits;
    if (p->quant_bits) m->latent_quant_group = 32;
    return 1;
}

// A preset switched on the command line (--set attention=X) owns these keys: it removes them
// from the JSON so that its own values apply; --set keys after it override them again
// (docs/CONFIG.md, "Switching the preset with --set").
static void drop_preset_keys(cJSON *root, const Preset *p) {
    static const char *ALWAYS[] = {"share_factor", "cla_share_factor", "share", "latent_quant_bits"};
    static const char *PLAIN[] = {"kv_lora_rank", "qk_rope_head_dim", "q_lora_rank"};
    for (size_t i = 0; i < sizeof(ALWAYS) / sizeof(ALWAYS[0]); i++) cJSON_DeleteItemFromObjectCaseSensitive(root, ALWAYS[i]);
    if (p->quant_bits) cJSON_DeleteItemFromObjectCaseSensitive(root, "latent_quant_group");
    if (p->kv_rule != 1) cJSON_DeleteItemFromObjectCaseSensitive(root, "num_key_value_heads");
    if (!p->latent)
        for (size_t i = 0; i < sizeof(PLAIN) / sizeof(PLAIN[0]); i++) cJSON_DeleteItemFromObjectCaseSensitive(root, PLAIN[i]);
}

// --set key=value: the value is JSON when the whole of it parses as JSON, otherwise a string
// ("2024_shards", "64k"); for a string key any value that is not a JSON string is its text
// ("--set train.data=2024" is the path "2024").
static void apply_set(cJSON *root, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) die("--set '%s': expected key=value (for example --set train.lr=1e-3)", assignment);
    char *key = xstrdup(assignment);
    key[eq - assignment] = 0;
    const char *text = eq + 1;
    cJSON *obj = root;
    char *leaf = key;
    char *dot = strchr(key, '.');
    const KeyDef *def;
    if (dot) {
        *dot = 0;
        if (strcmp(key, "train") != 0)
            die("--set '%s': only train.<key> may be dotted; model keys are top-level (e.g. --set hidden_size=256)", assignment);
        obj = cJSON_GetObjectItemCaseSensitive(root, "train");
        if (obj && !cJSON_IsObject(obj) && !cJSON_IsNull(obj)) {   // left for read_config to refuse, naming the file
            free(key);
            return;
        }
        if (!obj || cJSON_IsNull(obj)) {
            cJSON_DeleteItemFromObjectCaseSensitive(root, "train");
            obj = cJSON_AddObjectToObject(root, "train");
        }
        leaf = dot + 1;
        def = find_key(TRAIN_KEYS, N_TRAIN_KEYS, leaf);
    } else {
        def = find_key(MODEL_KEYS, N_MODEL_KEYS, leaf);
    }
    // strict, as a config file is read: a value it refuses (032, 32.) stays text, which a number
    // key then refuses by its type
    char jerr[256];
    cJSON *val = json_parse_strict(text, strlen(text), jerr, sizeof(jerr));
    int string_key = def && (def->type == K_STR || def->type == K_SHARE);
    // a number key given an integer beyond 2^53: that reason, as for the same value in a file (as
    // text it was "must be a number"); other text ("64k", "032") stays text, refused by the key's type
    const char *beyond = !val && def && !string_key ? strstr(jerr, "an integer beyond 2^53") : NULL;
    if (beyond) die("--set '%s': %s", assignment, beyond);
    if (!val || (string_key && !cJSON_IsString(val) && !cJSON_IsNull(val))) {
        cJSON_Delete(val);
        val = cJSON_CreateString(text);
    }
    if (!dot && !strcmp(leaf, "attention") && cJSON_IsString(val)) {
        const Preset *p = find_preset(val->valuestring);
        if (p) drop_preset_keys(root, p);
    }
    // the override replaces the knob under either of its names (head_dim, qk_nope_head_dim)
    if (def && def->alias) cJSON_DeleteItemFromObjectCaseSensitive(obj, strcmp(leaf, def->name) ? def->name : def->alias);
    if (cJSON_GetObjectItemCaseSensitive(obj, leaf)) cJSON_ReplaceItemInObjectCaseSensitive(obj, leaf, val);
    else cJSON_AddItemToObject(obj, leaf, val);
    free(key);
}

cJSON *config_parse(const char *text, size_t len, const char *origin) {
    char err[256];
    cJSON *root = json_parse_strict(text, len, err, sizeof(err));
    if (!root) die("%s: %s", origin, err);
    if (!cJSON_IsObject(root)) die("%s: the top level must be a JSON object", origin);
    return root;
}

// Relative paths of the file's run settings are relative to the file's directory; they are
// made absolute so that the config.json a run writes means the same wherever it is read.
static const char *PATH_KEYS[] = {"data", "val_data", "tokenizer", "init_from", "out_dir", "metrics"};

static void resolve_paths(cJSON *root, const char *config_path) {
    cJSON *train = cJSON_GetObjectItemCaseSensitive(root, "train");
    if (!cJSON_IsObject(train)) return;
    char *copy = xstrdup(config_path);
    char *slash = strrchr(copy, '/');
    const char *dir = ".";
    if (slash) { *slash = 0; dir = slash == copy ? "/" : copy; }
    char *base = NULL;
    if (dir[0] == '/') {
        base = xstrdup(dir);
    } else {
        char *cwd = getcwd(NULL, 0);
        if (!cwd) die("%s: cannot resolve its relative paths: the current directory is unreadable", config_path);
        base = !strcmp(dir, ".") ? xstrdup(cwd) : path_join(cwd, dir);
        free(cwd);
    }
    for (size_t i = 0; i < sizeof(PATH_KEYS) / sizeof(PATH_KEYS[0]); i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(train, PATH_KEYS[i]);
        if (!cJSON_IsString(v) || !v->valuestring[0] || v->valuestring[0] == '/') continue;
        char *abs = path_join(base, v->valuestring);
        cJSON_ReplaceItemInObjectCaseSensitive(train, PATH_KEYS[i], cJSON_CreateString(abs));
        free(abs);
    }
    free(base);
    free(copy);
}

// The paths still relative after resolve_paths (from --set, or defaults such as out_dir's
// runs/default) mean the current directory: made absolute too, so the config.json a run
// writes reads back to the same paths from anywhere.
static void absolutize_cwd_paths(TrainConfig *t, const char *origin) {
    char *fields[] = {t->data, t->val_data, t->tokenizer, t->init_from, t->out_dir, t->metrics};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (!fields[i][0] || fields[i][0] == '/') continue;
        char *abs = path_absolute(fields[i]);
        if (!abs) die("%s: cannot resolve its relative paths: the current directory is unreadable", origin);
        if (strlen(abs) >= sizeof(t->data)) die("%s: the path '%s' is longer than %zu bytes", origin, abs, sizeof(t->data) - 1);
        strcpy(fields[i], abs);
        free(abs);
    }
}

// Reads the (already --set) JSON into cfg. A key whose value is null is absent (HF writes
// "q_lora_rank": null for "none").
static void read_config(Config *cfg, const cJSON *root, const char *origin) {
    defaults(cfg);
    ModelConfig *m = &cfg->model;
    // 1. preset first, so explicit keys override its knobs
    const cJSON *att = cJSON_GetObjectItemCaseSensitive(root, "attention");
    const char *preset = NULL;
    if (att && !cJSON_IsNull(att)) {
        if (!cJSON_IsString(att)) die("%s: key 'attention' must be a preset name string", origin);
        preset = att->valuestring;
    } else {
        // an HF config without our key: infer the preset from its knobs
        const cJSON *lora = cJSON_GetObjectItemCaseSensitive(root, "kv_lora_rank");
        const cJSON *nkv = cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
        const cJSON *nh = cJSON_GetObjectItemCaseSensitive(root, "num_attention_heads");
        if (cJSON_IsNumber(lora) && lora->valuedouble > 0) preset = "mla";
        else if (cJSON_IsNumber(nkv) && cJSON_IsNumber(nh) && nkv->valuedouble == 1 && nh->valuedouble > 1) preset = "mqa";
        else if (cJSON_IsNumber(nkv) && cJSON_IsNumber(nh) && nkv->valuedouble < nh->valuedouble) preset = "gqa";
        else preset = "mha";
    }
    if (!config_apply_preset(m, preset)) {
        char list[512] = "";
        for (size_t i = 0; i < N_PRESETS; i++) {
            strcat(list, PRESETS[i].name);
            if (i + 1 < N_PRESETS) strcat(list, ", ");
        }
        die("%s: unknown attention preset '%s': use one of %s", origin, preset, list);
    }
    // 2. every key. transformers' DeepseekV3Config writes head_dim = qk_rope_head_dim beside
    // qk_nope_head_dim: that head_dim is HF's, not this one (qk_nope_head_dim's alias), and is skipped
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim"), *nope = cJSON_GetObjectItemCaseSensitive(root, "qk_nope_head_dim");
    const cJSON *rope_w = cJSON_GetObjectItemCaseSensitive(root, "qk_rope_head_dim");
    const int hf_head_dim = cJSON_IsNumber(hd) && cJSON_IsNumber(nope) && cJSON_IsNumber(rope_w) && hd->valuedouble == rope_w->valuedouble;
    int seen_nkv = 0, seen_head_dim = 0, seen_v_head_dim = 0, seen_seq_len = 0;
    char seen_key[N_MODEL_KEYS] = {0};
    char ignored[512] = "";
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!strcmp(it->string, "attention") || !strcmp(it->string, "use_cla")) continue;   // use_cla: below
        if (hf_head_dim && !strcmp(it->string, "head_dim")) continue;
        if (!strcmp(it->string, "train")) {
            if (cJSON_IsNull(it)) continue;
            if (!cJSON_IsObject(it)) die("%s: key 'train' must be an object of run settings", origin);
            for (const cJSON *t = it->child; t; t = t->next) {
                const KeyDef *k = find_key(TRAIN_KEYS, N_TRAIN_KEYS, t->string);
                if (!k) die_unknown(TRAIN_KEYS, N_TRAIN_KEYS, t->string, origin, "train.", "see docs/CONFIG.md for the run settings");
                if (cJSON_IsNull(t)) continue;
                if (!strcmp(k->name, "seq_len")) seen_seq_len = 1;
                set_value(&cfg->train, k, t, origin, "train.");
            }
            continue;
        }
        const KeyDef *k = find_key(MODEL_KEYS, N_MODEL_KEYS, it->string);
        if (!k) {
            if (!strcmp(it->string, "comment")) continue;   // notes in our own configs
            if (config_hf_key(root, it, origin)) {
                // the identity keys every config.json carries, which clla writes too
                // (model/hf_config.c; a package's dtype and end-of-text ids, cli/package_out.c):
                // accepted without a word
                static const char *const WRITTEN[] = {"model_type", "architectures", "torch_dtype", "bos_token_id", "eos_token_id"};
                int written = 0;
                for (size_t w = 0; w < sizeof(WRITTEN) / sizeof(WRITTEN[0]); w++) written |= !strcmp(it->string, WRITTEN[w]);
                if (written) continue;
                size_t n = strlen(ignored);
                if (n + strlen(it->string) + 8 < sizeof(ignored))
                    snprintf(ignored + n, sizeof(ignored) - n, "%s%s", n ? ", " : "", it->string);
                continue;
            }
            die_unknown(MODEL_KEYS, N_MODEL_KEYS, it->string, origin, "",
                        "see docs/CONFIG.md for the model keys (run settings go under \"train\")");
        }
        if (cJSON_IsNull(it)) continue;
        // parse_config refuses a key given twice; a knob under both of its names is the same thing
        if (seen_key[k - MODEL_KEYS])
            die("%s: '%s' and '%s' are two names of one knob: keep one", origin, k->name, k->alias);
        seen_key[k - MODEL_KEYS] = 1;
        if (!strcmp(k->name, "num_key_value_heads")) seen_nkv = 1;
        if (!strcmp(k->name, "head_dim")) seen_head_dim = 1;
        if (!strcmp(k->name, "v_head_dim")) seen_v_head_dim = 1;
        set_value(m, k, it, origin, "");
    }
    if (ignored[0]) fprintf(stderr, "clla: %s: ignoring keys that do not change the model here: %s\n", origin, ignored);
    // Hunyuan's use_cla turns its cla_share_factor on or off (vLLM's hunyuan_v1.py: cla_factor =
    // cla_share_factor if use_cla else 1): with false, every layer has its own KV
    const cJSON *use_cla = cJSON_GetObjectItemCaseSensitive(root, "use_cla");
    if (use_cla && !cJSON_IsNull(use_cla)) {
        if (!cJSON_IsBool(use_cla)) die("%s: key 'use_cla' must be true or false", origin);
        if (cJSON_IsFalse(use_cla) && m->share_factor > 1) {
            fprintf(stderr, "clla: %s: use_cla is false: share_factor (cla_share_factor) = %d is not applied, every layer keeps its own KV\n",
                    origin, m->share_factor);
            m->share_factor = 1;
        }
    }
    // DeepSeek's seq_aux asks for the balance loss per sequence; clla's is per micro-batch
    const cJSON *seq_aux = cJSON_GetObjectItemCaseSensitive(root, "seq_aux");
    if (cJSON_IsTrue(seq_aux) && m->moe_aux_loss_coef > 0)
        fprintf(stderr, "clla: %s: seq_aux = true: the balance loss is computed per micro-batch here, not per sequence (docs/MOE.md)\n", origin);
    // 3. knobs derived from the preset when the config leaves them out
    const Preset *p = find_preset(m->attention);
    if (m->num_attention_heads > 0) {
        if (!seen_head_dim && m->hidden_size > 0) m->head_dim = m->hidden_size / m->num_attention_heads;
        if (p->kv_rule == 0 && !seen_nkv) m->num_key_value_heads = m->num_attention_heads;
        if (p->kv_rule == 2 && !seen_nkv) m->num_key_value_heads = 1;
        if (p->kv_rule == 1 && !seen_nkv)
            die("%s: preset '%s' needs num_key_value_heads (a divisor of num_attention_heads = %d)", origin, p->name, m->num_attention_heads);
    }
    if (!seen_v_head_dim) m->v_head_dim = m->head_dim;
    // train.seq_len's default is 256, or the model's whole context when that is shorter (an HF
    // config.json of max_position_embeddings 128 has no train section to lower it in)
    if (!seen_seq_len && m->max_position_embeddings > 0 && cfg->train.seq_len > m->max_position_embeddings)
        cfg->train.seq_len = m->max_position_embeddings;
    config_validate(cfg, origin);
}

void config_warn_training(const Config *cfg, const char *origin) {
    const TrainConfig *t = &cfg->train;
    const ModelConfig *m = &cfg->model;
    // Megatron refuses top-1 softmax routing renormalized after the top-k (its issue #894)
    if (m->n_routed_experts > 0 && m->num_experts_per_tok == 1 && m->norm_topk_prob)
        warn("%s: num_experts_per_tok = 1 with norm_topk_prob = true: every combine weight is 1, so the router learns only from "
             "the balance and z losses (moe_aux_loss_coef = %g, moe_z_loss_coef = %g), never from the language-model loss; "
             "norm_topk_prob = false routes by the same experts and lets it learn",
             origin, (double)m->moe_aux_loss_coef, (double)m->moe_z_loss_coef);
    if (t->warmup_steps > t->max_steps)
        warn("%s: train.warmup_steps = %d is longer than train.max_steps = %d: the learning rate never reaches train.lr = %g (lower train.warmup_steps)",
             origin, t->warmup_steps, t->max_steps, (double)t->lr);
}

void config_from_object(Config *cfg, cJSON *root, const char *origin, int n_sets, char **sets) {
    if (!cJSON_IsObject(root)) die("%s: the top level must be a JSON object", origin);
    for (int i = 0; i < n_sets; i++) apply_set(root, sets[i]);
    read_config(cfg, root, origin);
}

void config_from_json(Config *cfg, const char *json, const char *origin, int n_sets, char **sets) {
    cJSON *root = config_parse(json, strlen(json), origin);
    config_from_object(cfg, root, origin, n_sets, sets);
    cJSON_Delete(root);
}

void config_load(Config *cfg, const char *path, int n_sets, char **sets) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) die("cannot read config '%s': %s: check the path", path, strerror(errno));
    cJSON *root = config_parse(text, len, path);
    free(text);
    resolve_paths(root, path);
    for (int i = 0; i < n_sets; i++) apply_set(root, sets[i]);
    read_config(cfg, root, path);
    cJSON_Delete(root);
    absolutize_cwd_paths(&cfg->train, path);
}

void config_set_out_dir(Config *cfg, const char *out) {
    TrainConfig *t = &cfg->train;
    char *abs = path_absolute(out);
    if (!abs) die("--out %s: cannot make it absolute: the current directory is unreadable", out);
    if (strlen(abs) >= sizeof(t->out_dir)) die("--out: the path '%s' is longer than %zu bytes", abs, sizeof(t->out_dir) - 1);
    snprintf(t->out_dir, sizeof(t->out_dir), "%s", abs);
    free(abs);
}

#define NEED(cond, ...) do { if (!(cond)) die(__VA_ARGS__); } while (0)

void config_validate(const Config *cfg, const char *origin) {
    const ModelConfig *m = &cfg->model;
    const TrainConfig *t = &cfg->train;
    const Preset *p = find_preset(m->attention);
    if (!p) die("%s: unknown attention preset '%s'", origin, m->attention);
    // no knob is negative (a negative width would wrap in the size arithmetic)
    for (size_t i = 0; i < N_MODEL_KEYS; i++)
        if (MODEL_KEYS[i].type == K_INT && *(const int *)((const char *)m + MODEL_KEYS[i].offset) < 0)
            die("%s: %s = %d must not be negative", origin, MODEL_KEYS[i].name, *(const int *)((const char *)m + MODEL_KEYS[i].offset));
    NEED(m->vocab_size > 0, "%s: vocab_size must be set (> 0)", origin);
    NEED(m->hidden_size > 0, "%s: hidden_size must be set (> 0)", origin);
    NEED(m->num_hidden_layers > 0, "%s: num_hidden_layers must be set (> 0)", origin);
    NEED(m->num_attention_heads > 0, "%s: num_attention_heads must be set (> 0)", origin);
    NEED(m->head_dim > 0, "%s: head_dim must be > 0 (it defaults to hidden_size / num_attention_heads)", origin);
    NEED(m->v_head_dim > 0, "%s: v_head_dim must be > 0", origin);
    NEED(m->intermediate_size > 0 || m->n_routed_experts > 0, "%s: intermediate_size must be set (> 0)", origin);
    NEED(m->share_factor >= 1, "%s: share_factor must be >= 1", origin);
    if (!config_is_latent(m)) {
        NEED(!p->latent, "%s: preset '%s' needs kv_lora_rank > 0 (the latent width)", origin, p->name);
        NEED(m->q_lora_rank == 0, "%s: q_lora_rank applies to latent models only (preset mla/clla*); remove it or set 0", origin);
        NEED(m->qk_rope_head_dim == 0, "%s: qk_rope_head_dim applies to latent models only (plain models rotate the whole head); remove it or set 0", origin);
        NEED(m->num_key_value_heads > 0 && m->num_attention_heads % m->num_key_value_heads == 0,
             "%s: num_key_value_heads = %d does not divide num_attention_heads = %d: choose a divisor", origin,
             m->num_key_value_heads, m->num_attention_heads);
        NEED(m->head_dim % 2 == 0, "%s: head_dim = %d must be even for RoPE", origin, m->head_dim);
        NEED(m->share == SHARE_KV, "%s: share = latent* needs a latent model (kv_lora_rank > 0, preset mla/clla*)", origin);
        NEED(m->latent_quant_bits == 0, "%s: latent_quant_bits needs a latent model (kv_lora_rank > 0)", origin);
        if (p->kv_rule == 0)
            NEED(m->num_key_value_heads == m->num_attention_heads, "%s: preset '%s' has num_key_value_heads = num_attention_heads; use preset gqa for fewer", origin, p->name);
        if (p->kv_rule == 2)
            NEED(m->num_key_value_heads == 1, "%s: preset mqa has num_key_value_heads = 1; use preset gqa for more", origin);
    } else {
        NEED(p->latent, "%s: kv_lora_rank > 0 makes a latent model: use preset mla or clla*", origin);
        NEED(m->share != SHARE_KV, "%s: share = kv is for plain K/V (cla presets); latent models share latent, latent_krope or latent_kvproj", origin);
        NEED(m->qk_rope_head_dim > 0 && m->qk_rope_head_dim % 2 == 0, "%s: latent models need an even qk_rope_head_dim > 0", origin);
        NEED(m->q_lora_rank >= 0, "%s: q_lora_rank must be >= 0", origin);
        NEED(m->num_key_value_heads == m->num_attention_heads,
             "%s: num_key_value_heads = %d: latent models (preset %s) have a key and a value per query head (num_attention_heads = %d); remove it, or use preset gqa for fewer kv heads",
             origin, m->num_key_value_heads, p->name, m->num_attention_heads);
        if (m->latent_quant_bits) {
            NEED(m->latent_quant_bits >= 2 && m->latent_quant_bits <= 8, "%s: latent_quant_bits must be 0 (off) or 2..8", origin);
            NEED(m->latent_quant_group > 0 && m->kv_lora_rank % m->latent_quant_group == 0,
                 "%s: latent_quant_group = %d must divide kv_lora_rank = %d", origin, m->latent_quant_group, m->kv_lora_rank);
        }
    }
    if (m->n_routed_experts == 0) {
        // knobs of the MoE FFN on a dense model would be taken and ignored: a user who set them
        // expects experts (the values clla writes for a dense model are the defaults, 0 and 1)
        const struct { const char *name; int value, dflt; } moe[] = {
            {"n_shared_experts", m->n_shared_experts, 0}, {"moe_intermediate_size", m->moe_intermediate_size, 0},
            {"shared_expert_intermediate_size", m->shared_expert_intermediate_size, 0},
            {"num_experts_per_tok", m->num_experts_per_tok, 1}, {"first_k_dense_layers", m->first_k_dense_layers, 0}};
        for (size_t i = 0; i < sizeof(moe) / sizeof(moe[0]); i++)
            NEED(moe[i].value == moe[i].dflt,
                 "%s: %s = %d shapes the MoE FFN, and n_routed_experts = 0 makes the model dense: set n_routed_experts, or remove %s",
                 origin, moe[i].name, moe[i].value, moe[i].name);
    }
    if (m->n_routed_experts > 0) {
        NEED(m->num_experts_per_tok >= 1 && m->num_experts_per_tok <= m->n_routed_experts,
             "%s: num_experts_per_tok must be in 1..n_routed_experts (%d)", origin, m->n_routed_experts);
        NEED(m->moe_intermediate_size > 0, "%s: moe_intermediate_size must be > 0 with n_routed_experts > 0", origin);
        NEED(m->first_k_dense_layers >= 0, "%s: first_k_dense_layers must be >= 0", origin);
        NEED(m->first_k_dense_layers == 0 || m->intermediate_size > 0, "%s: first_k_dense_layers > 0 needs intermediate_size for the dense MLP", origin);
        NEED(m->moe_capacity_factor >= 0, "%s: moe_capacity_factor must be >= 0 (0 = no dropping)", origin);
        NEED(m->first_k_dense_layers < m->num_hidden_layers,
             "%s: first_k_dense_layers = %d leaves no MoE layer of the %d: lower it, or set n_routed_experts 0 for a dense model", origin,
             m->first_k_dense_layers, m->num_hidden_layers);
        // a negative coefficient rewards the imbalance (or the large logits) the loss exists to penalize
        NEED(m->moe_aux_loss_coef >= 0, "%s: moe_aux_loss_coef must be >= 0 (0 = off)", origin);
        NEED(m->moe_z_loss_coef >= 0, "%s: moe_z_loss_coef must be >= 0 (0 = off)", origin);
    }
    NEED(m->rms_norm_eps > 0, "%s: rms_norm_eps must be > 0", origin);
    NEED(m->rope_theta > 0, "%s: rope_theta must be > 0", origin);
    NEED(m->initializer_range > 0, "%s: initializer_range must be > 0", origin);

    NEED(t->seq_len > 0, "%s: train.seq_len must be > 0", origin);
    NEED(t->seq_len <= m->max_position_embeddings,
         "%s: train.seq_len = %d exceeds max_position_embeddings = %d: lower train.seq_len (--set train.seq_len=N) or raise max_position_embeddings",
         origin, t->seq_len, m->max_position_embeddings);
    NEED(t->micro_batch > 0, "%s: train.micro_batch must be > 0", origin);
    long long bt = (long long)t->micro_batch * t->seq_len;
    NEED(t->global_batch_tokens >= 0, "%s: train.global_batch_tokens = %lld is negative: give 0 (one micro-batch a step) or a positive multiple of micro_batch * seq_len = %lld",
         origin, t->global_batch_tokens, bt);
    if (t->global_batch_tokens)
        NEED(t->global_batch_tokens % bt == 0,
             "%s: train.global_batch_tokens = %lld must be a multiple of micro_batch * seq_len = %lld", origin, t->global_batch_tokens, bt);
    // the loader's global batch, global_batch_tokens / seq_len rows on all ranks together, is an
    // int (as the trainer's check for a rank count says too; clla info and sweeps check it here)
    NEED(t->global_batch_tokens / t->seq_len <= INT_MAX,
         "%s: train.global_batch_tokens = %lld is %lld rows of seq_len %d a step, more than %d: use a smaller global batch",
         origin, t->global_batch_tokens, t->global_batch_tokens / t->seq_len, t->seq_len, INT_MAX);
    NEED(t->max_steps >= 0, "%s: train.max_steps must be >= 0", origin);
    NEED(t->warmup_steps >= 0, "%s: train.warmup_steps must be >= 0", origin);
    NEED(t->lr >= 0 && t->min_lr >= 0 && t->min_lr <= t->lr, "%s: need 0 <= train.min_lr <= train.lr", origin);
    uint64_t hash;
    NEED(!t->tokenizer_hash[0] || num_parse_hex64(t->tokenizer_hash, &hash) == 0,
         "%s: train.tokenizer_hash '%s' is not 16 hex digits: give the hash `clla tokenizer info` prints, or leave it out", origin,
         t->tokenizer_hash);
    NEED(t->beta1 >= 0 && t->beta1 < 1 && t->beta2 >= 0 && t->beta2 < 1, "%s: train.beta1 and train.beta2 must be in [0, 1)", origin);
    NEED(t->eps > 0, "%s: train.eps must be > 0", origin);
    NEED(t->weight_decay >= 0, "%s: train.weight_decay must be >= 0", origin);
    NEED(t->grad_clip >= 0, "%s: train.grad_clip must be >= 0 (0 = off)", origin);
    NEED(t->log_every >= 1, "%s: train.log_every must be >= 1", origin);
    NEED(t->val_every >= 0 && t->val_batches >= 0, "%s: train.val_every and train.val_batches must be >= 0", origin);
    NEED(t->threads >= 0, "%s: train.threads must be >= 0 (0 = OpenMP default)", origin);
    NEED(t->threads <= CLLA_MAX_THREADS, "%s: train.threads = %d is more than %d: use at most %d (this machine has %ld cores; 0 = all)",
         origin, t->threads, CLLA_MAX_THREADS, CLLA_MAX_THREADS, sysconf(_SC_NPROCESSORS_ONLN));
    NEED(t->save_every >= 0 && t->keep_checkpoints >= 0, "%s: train.save_every and train.keep_checkpoints must be >= 0 (0 = off / keep all)", origin);
    NEED(t->max_consecutive_skips >= 1, "%s: train.max_consecutive_skips must be >= 1", origin);
    NEED(t->zero_stage == 0 || t->zero_stage == 1, "%s: train.zero_stage must be 0 (replicated AdamW state) or 1 (ZeRO-1, sharded)", origin);
    // its milliseconds are a long long: 1e9 s (31 years) stands for "never" as well as 0 does
    NEED(t->dist_timeout_s >= 0 && t->dist_timeout_s <= 1e9f, "%s: train.dist_timeout_s = %g is out of range: give 0 (no timeout) to 1e9 seconds",
         origin, (double)t->dist_timeout_s);
    NEED(t->grad_bucket_elements >= 1 && t->grad_bucket_elements <= 2147483647,
         "%s: train.grad_bucket_elements must be 1 to 2147483647 (MPI's int counts); the default is 1048576", origin);
    config_check_sizes(cfg, origin);
}

cJSON *config_model_to_json(const ModelConfig *m) {
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; i < N_MODEL_KEYS; i++) cJSON_AddItemToObject(o, MODEL_KEYS[i].name, value_to_json(m, &MODEL_KEYS[i]));
    return o;
}

cJSON *config_to_json(const Config *cfg) {
    cJSON *o = config_model_to_json(&cfg->model);
    cJSON *t = cJSON_CreateObject();
    for (size_t i = 0; i < N_TRAIN_KEYS; i++) cJSON_AddItemToObject(t, TRAIN_KEYS[i].name, value_to_json(&cfg->train, &TRAIN_KEYS[i]));
    cJSON_AddItemToObject(o, "train", t);
    return config_add_hf_identity(o, &cfg->model);   // model_type, architectures (model/hf_config.c)
}
