// The training memory plan of a config (what `clla info` prints) and the check that it fits
// in the memory this process may use, made before anything big is allocated (issue 12: a run
// that does not fit was OOM-killed without a word).
#ifndef CLLA_MODEL_MEM_PLAN_H
#define CLLA_MODEL_MEM_PLAN_H

#include <stddef.h>

#include "backend/backend.h"
#include "model/config.h"

typedef struct MemPlan {
    long long total, embedding, activated;     // parameter counts
    double params, master, grads, adam, acts, act_grads;   // bytes by category
    double grad_accum;                         // the micro-step tree's fp32 gradient buffers
    size_t numel_f32;                          // flat fp32 layout (ZeRO-1 shards it)
} MemPlan;

// Builds the tables (no allocation of the model) for train.micro_batch x train.seq_len.
// store_bytes: 4 (fp32 storage) or 2 (bf16); separate_master: fp32 masters apart from storage;
// tree_ranks: the rank count whose micro-steps (train.global_batch_tokens) a backend that sums
// them in a tree of fp32 gradient buffers runs (train/grad_sync.h, grad_sync_sums_in_tree),
// 0 for one that accumulates in place.
void mem_plan(const Config *cfg, size_t store_bytes, int separate_master, int tree_ranks, MemPlan *p);
// Micro-steps per rank of cfg's global batch on `ranks` ranks (1 without train.global_batch_tokens;
// rounded up where the batch does not divide, which the trainer refuses).
long long mem_micro_steps(const Config *cfg, int ranks);
// Gradient buffers the micro-step tree holds beside the gradient over `micro` micro-steps: the
// most partial sums alive at once, the largest popcount of 1 .. micro - 1 = floor(log2 micro).
int mem_grad_tree_buffers(long long micro);
double mem_plan_bytes(const MemPlan *p);   // the sum of the categories

// Bytes of memory this process may still use: MemAvailable (/proc/meminfo), lowered to the
// cgroup's limit minus its usage (v2 memory.max/memory.current, v1 memory.limit_in_bytes/
// memory.usage_in_bytes) where one is set. Returns 0 when nothing can be read. `how` gets the
// figures it used, for messages.
unsigned long long mem_available(char *how, size_t howlen);
// MemAvailable of a /proc/meminfo text, in bytes (0 when absent).
unsigned long long mem_parse_meminfo(const char *text);

// Dies with the plan and the available memory when a run of cfg on be does not fit in host
// memory (the CPU backends; CUDA keeps the big buffers on the GPU). tree_ranks as for mem_plan.
// CLLA_TEST_MEM_AVAILABLE (bytes) stands in for the measured figure in tests.
void mem_check_fits(const Config *cfg, const Backend *be, int tree_ranks);
// Dies when bytes of activations for a forward of B rows of T tokens (model_set_batch) would not
// fit in the memory still available (host-memory backends): every forward, the commands' own
// checks above aside, is refused in one line rather than killed by the kernel.
void mem_check_activations(const Backend *be, double bytes, int B, int T);
// Dies when bytes more of host memory, for what (a plural: "the calibration samples"), would not
// fit in the memory still available, saying "what need X but only Y are available ...: fix".
// For a command's own buffers beside the model's, checked before they are filled.
void mem_check_host(double bytes, const char *what, const char *fix);
// The same for generating with a loaded model (so the weights are already counted out of what is
// available): the prefill's forward activations for batch prompts of up to prefill_T tokens
// (the logits of every position among them) and cache_bytes of KV cache.
void mem_check_fits_decode(const Config *cfg, const Backend *be, int batch, int prefill_T, double cache_bytes);

#endif
