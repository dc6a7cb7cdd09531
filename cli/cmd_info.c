// clla info: parameter counts, training memory by category and KV-cache bytes per
// token for any config, without allocating the model.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "model/cache.h"
#include "model/mem_plan.h"
#include "model/model.h"
#include "model/moe.h"
#include "cli/commands.h"
#include "train/grad_sync.h"

static const ArgSpec SPECS[] = {
    {"config", 1, "config JSON (required)", "FILE"},
    {"set", 1, "override a key (repeatable)", "KEY=VALUE"},
    {"json", 0, "print one JSON object instead of text", NULL},
    {"device", 1, "storage to plan memory for: cpu (fp32, default), cpu-bf16 (fp32 storage + fp32 masters) or cuda (bf16 + fp32 masters)", "cpu|cpu-bf16|cuda"},
    {"cache-table", 0, "KV-cache bytes/token of every attention preset at this config's shape", NULL},
    {"ranks", 1, "data parallel: also print the AdamW (and, with separate masters, fp32 master) memory per rank for R ranks, without and with ZeRO-1", "R"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// Every preset at the config's shape: gqa rows use its num_key_value_heads (or half the heads
// when the config is MHA); latent rows need kv_lora_rank and qk_rope_head_dim in the config.
static void print_cache_table(const ModelConfig *base) {
    static const char *presets[] = {"mha", "gqa", "mqa", "cla", "gqa_cla", "mla", "clla", "clla_share_krope",
                                     "clla_share_kvproj", "clla_quant", "clla_quant_share_kvproj"};
    printf("%-24s %14s %12s %10s %18s\n", "preset", "bytes/token", "per layer", "% of MHA", "paper Table 4 way");
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        ModelConfig m = *base;
        config_apply_preset(&m, presets[i]);
        int latent = !strncmp(presets[i], "mla", 3) || !strncmp(presets[i], "clla", 4);
        if (latent && (m.kv_lora_rank <= 0 || m.qk_rope_head_dim <= 0)) {
            printf("%-24s %14s   (set kv_lora_rank and qk_rope_head_dim to see latent rows)\n", presets[i], "n/a");
            continue;
        }
        if (m.latent_quant_bits && (m.latent_quant_group <= 0 || m.kv_lora_rank % m.latent_quant_group)) {
            // the preset's config would be refused (config_validate): no figure for it
            printf("%-24s %14s   (latent_quant_group = %d does not divide kv_lora_rank = %d)\n", presets[i], "n/a",
                   m.latent_quant_group, m.kv_lora_rank);
            continue;
        }
        if (!latent) m.kv_lora_rank = 0, m.latent_quant_bits = 0;
        if (!strcmp(presets[i], "mha") || !strcmp(presets[i], "cla")) m.num_key_value_heads = m.num_attention_heads;
        if (!strcmp(presets[i], "mqa")) m.num_key_value_heads = 1;
        if (!strncmp(presets[i], "gqa", 3) && m.num_key_value_heads >= m.num_attention_heads)
            m.num_key_value_heads = m.num_attention_heads / 2 > 0 ? m.num_attention_heads / 2 : 1;
        CacheBytes kv;
        cache_bytes_per_token(&m, &kv);
        printf("%-24s %14.0f %12.1f %9.2f%% %18.0f\n", presets[i], kv.total, kv.per_layer, 100.0 * kv.total / kv.mha_total, kv.paper);
    }
}

static double mib(double b) { return b / (1024.0 * 1024.0); }

int cmd_info(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla info --config FILE [--set key=value ...] [--json] [--device cpu|cpu-bf16|cuda]\n"
               "Prints parameter counts (total, activated non-embedding, embedding), training memory\n"
               "by category for train.micro_batch x train.seq_len, and KV-cache bytes per token.",
               NULL, NULL, 0);
    const char *path = args_get(&a, SPECS, N_SPECS, "config");
    if (!path) die("clla info needs --config FILE: see clla info --help");
    const char *ranks_s = args_get(&a, SPECS, N_SPECS, "ranks");
    int ranks = 1;
    if (ranks_s) ranks = (int)opt_i64("--ranks", ranks_s, 1, 1000000);
    const char *dev = args_get(&a, SPECS, N_SPECS, "device");
    if (dev && strcmp(dev, "cuda") && strcmp(dev, "cpu") && strcmp(dev, "cpu-bf16"))
        die("unknown --device '%s': use cpu, cpu-bf16 or cuda", dev);
    size_t store = dev && !strcmp(dev, "cuda") ? 2 : 4;
    int separate = dev && strcmp(dev, "cpu") != 0;   // cuda and cpu-bf16 keep fp32 masters apart
    if (args_get(&a, SPECS, N_SPECS, "cache-table") && args_get(&a, SPECS, N_SPECS, "json"))
        die("--cache-table prints a text table and --json one JSON object: give one of them (--json has the cache bytes of this config)");
    Config cfg;
    config_load(&cfg, path, a.n_sets, a.sets);
    if (args_get(&a, SPECS, N_SPECS, "cache-table")) {
        print_cache_table(&cfg.model);
        return 0;
    }
    MemPlan c;
    mem_plan(&cfg, store, separate, grad_sync_sums_in_tree(dev ? dev : "cpu") ? ranks : 0, &c);
    CacheBytes kv;
    cache_bytes_per_token(&cfg.model, &kv);
    double mem_total = mem_plan_bytes(&c);
    if (args_get(&a, SPECS, N_SPECS, "json")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "attention", cfg.model.attention);
        cJSON_AddNumberToObject(o, "params_total", (double)c.total);
        cJSON_AddNumberToObject(o, "params_activated", (double)c.activated);
        cJSON_AddNumberToObject(o, "params_embedding", (double)c.embedding);
        cJSON *mem = cJSON_AddObjectToObject(o, "train_memory_bytes");
        cJSON_AddNumberToObject(mem, "params", c.params);
        cJSON_AddNumberToObject(mem, "master_weights", c.master);
        cJSON_AddNumberToObject(mem, "grads", c.grads);
        cJSON_AddNumberToObject(mem, "grad_accumulation", c.grad_accum);
        cJSON_AddNumberToObject(mem, "adamw_m_v", c.adam);
        cJSON_AddNumberToObject(mem, "activations", c.acts);
        cJSON_AddNumberToObject(mem, "activation_grads", c.act_grads);
        cJSON_AddNumberToObject(mem, "total", mem_total);
        if (ranks_s) {
            cJSON *dp = cJSON_AddObjectToObject(o, "data_parallel");
            cJSON_AddNumberToObject(dp, "ranks", ranks);
            cJSON_AddNumberToObject(dp, "adamw_m_v_per_rank_zero0", grad_sync_optimizer_bytes(c.numel_f32, ranks, 0));
            cJSON_AddNumberToObject(dp, "adamw_m_v_per_rank_zero1", grad_sync_optimizer_bytes(c.numel_f32, ranks, 1));
            cJSON_AddNumberToObject(dp, "master_weights_per_rank_zero0", grad_sync_master_bytes(c.numel_f32, ranks, 0, separate));
            cJSON_AddNumberToObject(dp, "master_weights_per_rank_zero1", grad_sync_master_bytes(c.numel_f32, ranks, 1, separate));
            cJSON_AddNumberToObject(dp, "total_per_rank_zero1", mem_total - c.adam - c.master +
                                    grad_sync_optimizer_bytes(c.numel_f32, ranks, 1) +
                                    grad_sync_master_bytes(c.numel_f32, ranks, 1, separate));
        }
        // the run settings as clla train reads them (defaults and --set applied): launch/sweep
        // computes its budgets from these rather than knowing the defaults itself
        const TrainConfig *tc = &cfg.train;
        cJSON *tr = cJSON_AddObjectToObject(o, "train");
        cJSON_AddNumberToObject(tr, "seq_len", tc->seq_len);
        cJSON_AddNumberToObject(tr, "micro_batch", tc->micro_batch);
        cJSON_AddNumberToObject(tr, "global_batch_tokens", (double)tc->global_batch_tokens);
        cJSON_AddNumberToObject(tr, "max_steps", tc->max_steps);
        cJSON_AddNumberToObject(tr, "seed", (double)tc->seed);   // at most 2^53: exact in a double
        if (tc->val_data[0]) cJSON_AddStringToObject(tr, "val_data", tc->val_data);
        else cJSON_AddNullToObject(tr, "val_data");
        cJSON *k = cJSON_AddObjectToObject(o, "kv_cache_bytes_per_token");
        cJSON_AddNumberToObject(k, "model", kv.total);
        cJSON_AddNumberToObject(k, "per_layer", kv.per_layer);
        cJSON_AddNumberToObject(k, "mha_equivalent", kv.mha_total);
        cJSON_AddNumberToObject(k, "fraction_of_mha", kv.total / kv.mha_total);
        cJSON_AddNumberToObject(k, "paper_table4_per_layer", kv.paper);
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
        return 0;
    }
    printf("config            %s (attention %s)\n", path, cfg.model.attention);
    printf("parameters        %lld total | %lld activated (non-embedding) | %lld embedding\n", c.total, c.activated, c.embedding);
    const ModelConfig *mc = &cfg.model;
    if (mc->n_routed_experts > 0)
        printf("experts           %d routed (top-%d, %d wide) + %d shared, in layers %d..%d; capacity factor %g (%s)\n",
               mc->n_routed_experts, mc->num_experts_per_tok, mc->moe_intermediate_size, mc->n_shared_experts,
               mc->first_k_dense_layers, mc->num_hidden_layers - 1, mc->moe_capacity_factor,
               mc->moe_capacity_factor > 0 ? "drops over capacity" : "no dropping");
    printf("training memory   (B=%d, T=%d, %s storage)\n", cfg.train.micro_batch, cfg.train.seq_len, store == 2 ? "bf16" : "fp32");
    printf("  params          %10.1f MiB\n", mib(c.params));
    if (c.master > 0) printf("  fp32 masters    %10.1f MiB\n", mib(c.master));
    printf("  grads (fp32)    %10.1f MiB\n", mib(c.grads));
    if (c.grad_accum > 0)
        printf("  grad tree       %10.1f MiB (%d fp32 gradient buffer%s summing %lld micro-steps%s)\n", mib(c.grad_accum),
               mem_grad_tree_buffers(mem_micro_steps(&cfg, ranks)), mem_grad_tree_buffers(mem_micro_steps(&cfg, ranks)) > 1 ? "s" : "",
               mem_micro_steps(&cfg, ranks), ranks_s ? " per rank" : "");
    printf("  AdamW m, v      %10.1f MiB\n", mib(c.adam));
    printf("  activations     %10.1f MiB\n", mib(c.acts));
    printf("  act. gradients  %10.1f MiB\n", mib(c.act_grads));
    printf("  total           %10.1f MiB\n", mib(mem_total));
    if (ranks_s) {
        double z1 = grad_sync_optimizer_bytes(c.numel_f32, ranks, 1);
        printf("optimizer / rank  %d ranks: AdamW m, v %.1f MiB (train.zero_stage 0) | %.1f MiB (ZeRO-1, %zu of %zu elements per rank)\n",
               ranks, mib(grad_sync_optimizer_bytes(c.numel_f32, ranks, 0)), mib(z1), (size_t)(z1 / 8), c.numel_f32);
        double m1 = grad_sync_master_bytes(c.numel_f32, ranks, 1, separate);
        if (separate)
            printf("                  fp32 masters %.1f MiB (train.zero_stage 0) | %.1f MiB (ZeRO-1)\n",
                   mib(grad_sync_master_bytes(c.numel_f32, ranks, 0, separate)), mib(m1));
        printf("                  total per rank with ZeRO-1: %.1f MiB\n", mib(mem_total - c.adam - c.master + z1 + m1));
    }
    printf("KV cache          %.1f bytes/token for the model | %.1f per layer on average | %.2f%% of MHA (%.0f bytes/token, bf16)\n",
           kv.total, kv.per_layer, 100.0 * kv.total / kv.mha_total, kv.mha_total);
    printf("                  paper's Table 4 convention: %.0f per layer (see docs/CACHE.md for what it leaves out)\n", kv.paper);
    return 0;
}
