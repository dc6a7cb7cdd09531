#include "model/mem_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"
#include "model/model.h"
#include "model/moe.h"

long long mem_micro_steps(const Config *cfg, int ranks) {
    const long long per = (long long)cfg->train.micro_batch * cfg->train.seq_len * (ranks > 0 ? ranks : 1);
    if (!cfg->train.global_batch_tokens || per <= 0) return 1;
    return (cfg->train.global_batch_tokens + per - 1) / per;
}

int mem_grad_tree_buffers(long long micro) {
    int n = 0;
    for (long long x = micro; x > 1; x >>= 1) n++;
    return n;
}

void mem_plan(const Config *cfg, size_t store_bytes, int separate_master, int tree_ranks, MemPlan *c) {
    Model m;
    model_plan_table(&m, &cfg->model, store_bytes);   // sizes only: instant at 100,000 layers
    memset(c, 0, sizeof(*c));
    c->total = (long long)m.params.numel;
    c->embedding = model_embedding_params(&cfg->model);
    // activated = every non-embedding parameter a token passes through: all of them in a dense
    // model; with MoE, the shared experts, the router and K of the E routed experts per layer
    c->activated = c->total - c->embedding - moe_inactive_params(&m);
    c->params = (double)m.params.bytes_store;
    c->master = separate_master ? (double)m.params.bytes_f32 : 0.0;
    c->grads = (double)m.params.bytes_f32;
    c->adam = 2.0 * (double)m.params.bytes_f32;
    if (tree_ranks > 0) c->grad_accum = mem_grad_tree_buffers(mem_micro_steps(cfg, tree_ranks)) * (double)m.params.bytes_f32;
    c->numel_f32 = m.params.bytes_f32 / 4;
    model_layout_acts(&m, cfg->train.micro_batch, cfg->train.seq_len, store_bytes);
    c->acts = (double)m.acts.bytes_store;
    c->act_grads = (double)m.gacts.bytes_store;
    model_free(&m);
}

double mem_plan_bytes(const MemPlan *p) { return p->params + p->master + p->grads + p->grad_accum + p->adam + p->acts + p->act_grads; }

// A small /proc or /sys file, NUL-terminated, into buf (their size reads as 0, so read_file
// cannot be used). Returns 0 when it cannot be read.
static int read_small(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t got = fread(buf, 1, n - 1, f);
    int ok = !ferror(f);
    fclose(f);
    buf[got] = 0;
    return ok && got > 0;
}

unsigned long long mem_parse_meminfo(const char *text) {
    const char *line = strstr(text, "MemAvailable:");
    if (!line) return 0;
    unsigned long long kb = 0;
    if (sscanf(line + strlen("MemAvailable:"), " %llu kB", &kb) != 1) return 0;
    return kb * 1024ull;
}

// A cgroup file holding one number ("max" = no limit); 0 when absent or unlimited.
static unsigned long long read_number(const char *path) {
    char t[64];
    if (!read_small(path, t, sizeof(t))) return 0;
    char *nl = strchr(t, '\n');
    if (nl) *nl = 0;
    uint64_t x = 0;
    int ok = num_parse_u64(t, UINT64_MAX, &x) == NUM_OK;
    return ok && x < (1ull << 62) ? x : 0;   // v1 writes "no limit" as ~2^63
}

// limit - usage of the cgroup whose files are dir/<limit_name> and dir/<usage_name>; 0 = none.
static unsigned long long cgroup_room(const char *dir, const char *limit_name, const char *usage_name,
                                      unsigned long long *limit) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, limit_name);
    *limit = read_number(path);
    if (!*limit) return 0;
    snprintf(path, sizeof(path), "%s/%s", dir, usage_name);
    unsigned long long used = read_number(path);
    return used < *limit ? *limit - used : 1;
}

// The process's cgroup path for a controller ("" for v2's unified line), from /proc/self/cgroup.
static int cgroup_path(const char *controller, char *out, size_t n) {
    char t[4096];
    if (!read_small("/proc/self/cgroup", t, sizeof(t))) return 0;
    int found = 0;
    for (char *line = strtok(t, "\n"); line && !found; line = strtok(NULL, "\n")) {
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *ctrls = c1 + 1;
        int match = controller[0] ? strstr(ctrls, controller) != NULL : ctrls[0] == 0;
        if (match) { snprintf(out, n, "%s", c2 + 1); found = 1; }
    }
    return found;
}

// The cgroup's room: the process's own cgroup directory when mounted where /proc/self/cgroup
// says, else the mount's root (a container sees its own cgroup there).
static unsigned long long cgroup_available(unsigned long long *limit) {
    char rel[512], dir[1024];
    unsigned long long room;
    if (cgroup_path("", rel, sizeof(rel))) {   // v2
        snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", rel);
        if ((room = cgroup_room(dir, "memory.max", "memory.current", limit))) return room;
        if ((room = cgroup_room("/sys/fs/cgroup", "memory.max", "memory.current", limit))) return room;
    }
    if (cgroup_path("memory", rel, sizeof(rel))) {   // v1
        snprintf(dir, sizeof(dir), "/sys/fs/cgroup/memory%s", rel);
        if ((room = cgroup_room(dir, "memory.limit_in_bytes", "memory.usage_in_bytes", limit))) return room;
        if ((room = cgroup_room("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", limit))) return room;
    }
    *limit = 0;
    return 0;
}

static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

// "1.50 GiB", "12.3 MiB" or "4.0 KiB"
static const char *human(double b, char *buf, size_t n) {
    if (b >= 1024.0 * 1024.0 * 1024.0) snprintf(buf, n, "%.2f GiB", gib(b));
    else if (b >= 1024.0 * 1024.0) snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024.0));
    else snprintf(buf, n, "%.1f KiB", b / 1024.0);
    return buf;
}

unsigned long long mem_available(char *how, size_t howlen) {
    char t[16384];
    unsigned long long avail = read_small("/proc/meminfo", t, sizeof(t)) ? mem_parse_meminfo(t) : 0;
    unsigned long long limit = 0, room = cgroup_available(&limit);
    char a[32], l[32], r[32];
    int n = snprintf(how, howlen, "MemAvailable %s", human((double)avail, a, sizeof(a)));
    if (limit && n >= 0 && (size_t)n < howlen)
        snprintf(how + n, howlen - (size_t)n, ", cgroup limit %s with %s free", human((double)limit, l, sizeof(l)),
                 human((double)room, r, sizeof(r)));
    if (room && (!avail || room < avail)) avail = room;
    return avail;
}

// The memory a check compares with: CLLA_TEST_MEM_AVAILABLE in tests, else mem_available();
// 0 when nothing is readable (no check: not Linux, or /proc hidden).
static unsigned long long available_for_check(char *how, size_t howlen) {
    const char *test = getenv("CLLA_TEST_MEM_AVAILABLE");
    uint64_t forced = 0;
    if (test && num_parse_u64(test, UINT64_MAX, &forced) == NUM_OK) {
        snprintf(how, howlen, "CLLA_TEST_MEM_AVAILABLE");
        return forced;
    }
    return mem_available(how, howlen);
}

void mem_check_activations(const Backend *be, double bytes, int B, int T) {
    if (!be->host_memory) return;
    char how[256];
    const unsigned long long avail = available_for_check(how, sizeof(how));
    char a[32], b[32];
    if (avail && bytes > (double)avail)
        die("a forward over %d rows of %d tokens needs %s of activations (its logits among them) but only %s are available "
            "to this process (%s): use a smaller batch (--batch) or shorter sequences",
            B, T, human(bytes, a, sizeof(a)), human((double)avail, b, sizeof(b)), how);
}

void mem_check_host(double bytes, const char *what, const char *fix) {
    char how[256];
    const unsigned long long avail = available_for_check(how, sizeof(how));
    char a[32], b[32];
    if (avail && bytes > (double)avail)
        die("%s need %s but only %s are available to this process (%s): %s", what, human(bytes, a, sizeof(a)),
            human((double)avail, b, sizeof(b)), how, fix);
}

void mem_check_fits_decode(const Config *cfg, const Backend *be, int batch, int prefill_T, double cache_bytes) {
    if (!strcmp(be->name, "cuda")) return;
    char how[256];
    const unsigned long long avail = available_for_check(how, sizeof(how));
    if (!avail) return;
    Model m;
    model_plan_table(&m, &cfg->model, be->act_bytes);
    model_layout_acts(&m, batch, prefill_T, be->act_bytes);
    const double acts = (double)m.acts.bytes_store;
    model_free(&m);
    char a[32], b[32], c[32], d[32];
    if (acts + cache_bytes > (double)avail)
        die("generating needs %s more memory (the prefill's activations, %d rows of up to %d tokens, %s; the KV cache "
            "for %d sequences at their longest, %s) but only %s are available to this process (%s): lower --batch or "
            "--max-new-tokens, or shorten the prompts",
            human(acts + cache_bytes, a, sizeof(a)), batch, prefill_T, human(acts, b, sizeof(b)), batch,
            human(cache_bytes, c, sizeof(c)), human((double)avail, d, sizeof(d)), how);
}

void mem_check_fits(const Config *cfg, const Backend *be, int tree_ranks) {
    if (!strcmp(be->name, "cuda")) return;   // the big buffers live on the GPU
    char how[256];
    const unsigned long long avail = available_for_check(how, sizeof(how));
    if (!avail) return;   // nothing readable: no check (not Linux, or /proc hidden)
    MemPlan p;
    mem_plan(cfg, be->act_bytes, be->act_bytes != 4 || be->separate_master, tree_ranks, &p);
    double need = mem_plan_bytes(&p);
    char a[32], b[32];
    if (need > (double)avail)
        die("the run needs %s (clla info's training memory for B=%d, T=%d on %s) but only %s are available to this process (%s): lower train.micro_batch or train.seq_len, or use a smaller model",
            human(need, a, sizeof(a)), cfg->train.micro_batch, cfg->train.seq_len, be->name, human((double)avail, b, sizeof(b)), how);
}
