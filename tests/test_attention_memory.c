// Memory of a training step grows linearly with the sequence length (no T x T activation:
// layers/cpu_attention.c keeps out and the row log-sum-exp only).
//
// For T = 256, 1024 and 4096 (B = 1), a small MHA model and a CLLA one are built, run one
// forward and backward, and the bytes the C allocator holds then (glibc's own accounting,
// mallinfo2: arena bytes in use plus mmap'd blocks) are taken against the bytes before the
// build, the backend's buffers taken from calloc (CLLA_HUGE_PAGES=0). Linear memory a + bT
// gives (m(4096) - m(1024)) / (m(1024) - m(256)) = 4; the old contract's probabilities and
// score gradients (B NH T T fp32 per layer, one more for the backward) made it about 16 at
// these sizes. The test allows 4.5. The model's activation
// tables must grow exactly 4x from 1024 to 4096 (every activation is per token).
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/config.h"
#include "model/model.h"
#include "tests/lib/check.h"

static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

// Heap bytes held after a forward and backward at length T; *tables: activation table bytes.
static size_t step_bytes(const char *json, const char *name, int T, size_t *tables) {
    size_t before = heap_in_use();
    Config cfg;
    config_from_json(&cfg, json, name, 0, NULL);
    Model m;
    model_build(&m, &cfg.model, backend_cpu());
    model_init_weights(&m, 1);
    model_set_batch(&m, 1, T);
    int32_t *in = malloc((size_t)T * sizeof(int32_t)), *tg = malloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) { in[t] = (t * 7) % cfg.model.vocab_size; tg[t] = (t * 7 + 3) % cfg.model.vocab_size; }
    model_zero_grad(&m);
    model_forward(&m, in, tg);
    model_backward(&m, 1.0f);
    size_t used = heap_in_use() - before;
    *tables = m.acts.bytes_store + m.gacts.bytes_store;
    free(in);
    free(tg);
    model_free(&m);
    return used;
}

#define BASE "\"vocab_size\":64,\"hidden_size\":32,\"num_attention_heads\":4,\"head_dim\":8,\"intermediate_size\":48," \
             "\"max_position_embeddings\":4096,\"num_hidden_layers\":2,"

int main(void) {
    // malloc's accounting sees the backend's buffers only when they come from calloc: the CPU
    // backend maps its large ones itself, in huge pages, unless told not to (layers/cpu_memory.c)
    setenv("CLLA_HUGE_PAGES", "0", 1);
    static const struct { const char *name, *json; } CASES[] = {
        {"mha", "{" BASE "\"attention\":\"mha\"}"},
        {"clla", "{" BASE "\"attention\":\"clla\",\"kv_lora_rank\":16,\"qk_rope_head_dim\":4}"},
    };
    static const int LENS[3] = {256, 1024, 4096};
    for (size_t c = 0; c < sizeof(CASES) / sizeof(CASES[0]); c++) {
        size_t mem[3], tab[3];
        for (int i = 0; i < 3; i++) mem[i] = step_bytes(CASES[c].json, CASES[c].name, LENS[i], &tab[i]);
        double growth = (double)(mem[2] - mem[1]) / (double)(mem[1] - mem[0]);
        printf("%-5s heap after a step: T=256 %.2f MiB, T=1024 %.2f MiB, T=4096 %.2f MiB; growth ratio %.2f (linear 4)\n",
               CASES[c].name, mem[0] / 1048576.0, mem[1] / 1048576.0, mem[2] / 1048576.0, growth);
        CHECK(mem[1] > mem[0] && mem[2] > mem[1] && growth <= 4.5, "%s: memory grows linearly with T (ratio %.2f)",
              CASES[c].name, growth);
        CHECK(tab[2] == 4 * tab[1], "%s: activation tables 4x from T=1024 to 4096 (%zu, %zu)", CASES[c].name, tab[1], tab[2]);
    }
    printf("test_attention_memory: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
