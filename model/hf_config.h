// The Hugging Face identity of a config.json clla writes: "model_type" and "architectures",
// so HF tools (AutoConfig, the Hub's viewers) can at least read it. The plain presets (no
// latent, no cross-layer sharing, no MoE, v_head_dim == head_dim) are Llama models exactly
// ("llama", ["LlamaForCausalLM"]); every other one is clla's own ("clla", ["CllaForCausalLM"])
// and names its knobs as DeepSeek-V2 does where the knob is the same (qk_nope_head_dim,
// first_k_dense_replace, aux_loss_alpha: aliases the config reader accepts back).
#ifndef CLLA_MODEL_HF_CONFIG_H
#define CLLA_MODEL_HF_CONFIG_H

#include <cjson/cJSON.h>

#include "model/config.h"

// 1 when m is a plain Llama model (HF's LlamaForCausalLM computes exactly what clla does).
int config_is_llama(const ModelConfig *m);
// Returns a new object: model_type and architectures first, then o's items (renamed to the
// DeepSeek-V2 names for a clla model). o is consumed.
cJSON *config_add_hf_identity(cJSON *o, const ModelConfig *m);

#endif
