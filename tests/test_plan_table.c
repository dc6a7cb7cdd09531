// Plan-only tensor tables (model/tensor_table.h, model_plan_table) against the full tables:
// clla info and the memory check before a run read the plan, training allocates from the
// full layout, so every total must agree: element counts, storage and fp32 byte sizes (with
// their 256-byte alignment) of the parameters, activations and activation gradients, and
// the embedding count against the tensors named model.embed_tokens.weight / lm_head.weight.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/mem_plan.h"
#include "model/model.h"
#include "tests/lib/check.h"

static int compared = 0;

static void same_totals(const char *what, const char *cfg, const TensorTable *full, const TensorTable *plan) {
    CHECK(full->n == plan->n, "%s %s: %d tensors, plan counts %d", cfg, what, full->n, plan->n);
    CHECK(full->numel == plan->numel, "%s %s: %zu elements, plan %zu", cfg, what, full->numel, plan->numel);
    CHECK(full->bytes_store == plan->bytes_store, "%s %s: %zu storage bytes, plan %zu", cfg, what, full->bytes_store, plan->bytes_store);
    CHECK(full->bytes_f32 == plan->bytes_f32, "%s %s: %zu fp32 bytes, plan %zu", cfg, what, full->bytes_f32, plan->bytes_f32);
    CHECK(plan->t == NULL, "%s %s: the plan stored entries", cfg, what);
}

static void compare(const char *label, const ModelConfig *mc, size_t store, int B, int T) {
    Model full, plan;
    model_build_table(&full, mc, store);
    model_plan_table(&plan, mc, store);
    same_totals("params", label, &full.params, &plan.params);
    long long named = 0;
    for (int i = 0; i < full.params.n; i++)
        if (!strcmp(full.params.t[i].name, "model.embed_tokens.weight") || !strcmp(full.params.t[i].name, "lm_head.weight"))
            named += (long long)full.params.t[i].numel;
    CHECK(named == model_embedding_params(mc), "%s: embedding tensors hold %lld elements, model_embedding_params says %lld", label,
          named, model_embedding_params(mc));
    model_layout_acts(&full, B, T, store);
    model_layout_acts(&plan, B, T, store);
    same_totals("activations", label, &full.acts, &plan.acts);
    same_totals("activation grads", label, &full.gacts, &plan.gacts);
    model_free(&full);
    model_free(&plan);
    compared++;
}

static void compare_dir(const char *src, const char *dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", src, dir);
    DIR *d = opendir(path);
    if (!d) { CHECK(0, "cannot open %s", path); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json")) continue;
        snprintf(path, sizeof(path), "%s/%s/%s", src, dir, e->d_name);
        Config cfg;
        config_load(&cfg, path, 0, NULL);
        for (size_t store = 2; store <= 4; store += 2) compare(path, &cfg.model, store, 2, 24);
        // a deeper model, and MoE in every layer but the first, for the same preset
        char *sets[] = {"num_hidden_layers=7", "n_routed_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=40",
                        "n_shared_experts=1", "first_k_dense_layers=1"};
        config_load(&cfg, path, 6, sets);
        compare(path, &cfg.model, 4, 3, 8);
    }
    closedir(d);
}

int main(void) {
    const char *src = getenv("SRC");
    if (!src) src = ".";
    compare_dir(src, "configs/tiny");
    compare_dir(src, "configs/paper");
    char path[4096];
    snprintf(path, sizeof(path), "%s/configs/quickstart.json", src);
    Config cfg;
    config_load(&cfg, path, 0, NULL);
    compare(path, &cfg.model, 4, cfg.train.micro_batch, cfg.train.seq_len);
    // what clla info reads: the plan's totals equal the full table's
    MemPlan p;
    mem_plan(&cfg, 4, 0, 0, &p);
    Model full;
    model_build_table(&full, &cfg.model, 4);
    CHECK(p.total == (long long)full.params.numel, "mem_plan total %lld, table %zu", p.total, full.params.numel);
    CHECK(p.params == (double)full.params.bytes_store, "mem_plan params bytes %.0f, table %zu", p.params, full.params.bytes_store);
    model_free(&full);
    if (compared < 40) CHECK(0, "only %d configurations compared: are configs/tiny and configs/paper there?", compared);
    printf("%d configurations x storage sizes compared: %s\n", compared, failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
