#include "model/hf_config.h"

#include <stdio.h>
#include <string.h>

int config_is_llama(const ModelConfig *m) {
    return m->kv_lora_rank == 0 && m->q_lora_rank == 0 && m->share_factor <= 1 && m->latent_quant_bits == 0 &&
           m->n_routed_experts == 0 && m->v_head_dim == m->head_dim;
}

// clla's key -> DeepSeek-V2's, for a clla model (model/config.c declares both as one knob).
static const char *deepseek_name(const char *key, const ModelConfig *m) {
    if (!strcmp(key, "head_dim") && m->kv_lora_rank > 0) return "qk_nope_head_dim";
    if (!strcmp(key, "first_k_dense_layers") && m->n_routed_experts > 0) return "first_k_dense_replace";
    if (!strcmp(key, "moe_aux_loss_coef") && m->n_routed_experts > 0) return "aux_loss_alpha";
    return key;
}

cJSON *config_add_hf_identity(cJSON *o, const ModelConfig *m) {
    int llama = config_is_llama(m);
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "model_type", llama ? "llama" : "clla");
    cJSON *arch = cJSON_AddArrayToObject(n, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(llama ? "LlamaForCausalLM" : "CllaForCausalLM"));
    while (o->child) {
        cJSON *it = cJSON_DetachItemViaPointer(o, o->child);
        if (!strcmp(it->string, "model_type") || !strcmp(it->string, "architectures")) { cJSON_Delete(it); continue; }
        const char *name = llama ? it->string : deepseek_name(it->string, m);
        char copy[64];
        snprintf(copy, sizeof(copy), "%s", name);   // AddItemToObject frees the item's old name
        cJSON_AddItemToObject(n, copy, it);
    }
    cJSON_Delete(o);
    return n;
}
