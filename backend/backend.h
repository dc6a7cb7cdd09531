// The op interface between the model orchestration (model/) and a backend.
//
// The model is written once against this table of function pointers; the CPU
// reference (layers/, fp32) and the CUDA backend (kernels/, bf16 storage) fill it.
//
// Pointer conventions (read these before adding an op):
//  - "act" buffers (activations, activation gradients) and "weight" buffers hold
//    elements of the backend's storage type: fp32 on the CPU, bf16 on CUDA. They are
//    typed float* here so that the CPU ops keep natural signatures; the CUDA backend
//    reinterprets them. The orchestration never dereferences them and never does
//    pointer arithmetic on them: every sub-buffer it uses is a named entry of a tensor
//    table whose byte offsets were computed with the backend's element sizes.
//  - Weight gradients, optimizer state, master weights and per-token losses are fp32
//    on every backend (fp32 gradient accumulation).
//  - Token ids are int32 and live in backend memory (uploaded with upload()).
//  - All shapes are row-major; weights use the PyTorch [out, in] layout.
//  - Every *_backward ACCUMULATES (+=) into the gradients it produces, so that
//    gradient accumulation, residual streams and cross-layer sharing (a producer's
//    cache receives the sum of its consumers' gradients) need no extra adds. The
//    orchestration zeroes gradient buffers when a new accumulation starts.
//  - Ops must be deterministic for a fixed thread count: no atomics in reductions.
#ifndef CLLA_BACKEND_BACKEND_H
#define CLLA_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

// One stream of a paged KV cache as a backend reads it (model/decode.c builds them from the
// cache layer): tokens in blocks of block_tokens, token_bytes bytes each, in backend memory.
// A host backend may call decode, which turns the first n tokens of block block_id into fp32
// vectors of `width` (the stream's codec, any kind; a block codec's block is whole or its fp16
// window, which the owner of ctx knows). A device backend reads the layouts it knows itself,
// named by kind: PAGED_F32 (fp32 values), PAGED_BF16 (bf16 values), PAGED_INT_GROUP ([scales:
// width/group bf16][codes: width values of `bits` bits, two's complement, packed little-endian],
// model/cache.c); PAGED_OTHER only through decode.
enum { PAGED_F32 = 0, PAGED_BF16, PAGED_INT_GROUP, PAGED_OTHER };
typedef struct PagedStream {
    int width;
    size_t token_bytes;          // 0 for a block codec (PAGED_OTHER: read only through decode)
    int block_tokens;
    uint8_t *const *blocks;      // block id -> its storage (a host array of backend pointers)
    int n_blocks;                // ids in blocks
    const void *ctx;             // passed to decode and score
    void (*decode)(const void *ctx, float *dst, int block_id, int n);
    // A key stream whose codec scores without decoding (qjl; NULL otherwise): sc[j] = q . k_j for
    // the first n tokens of block block_id, k_j the `head`-th vector of width DK of token j (a host
    // backend calls it instead of decode for the keys; the values of the same stream still decode).
    // Each query is prepared once by prep into prep_doubles doubles and handed to every score call.
    size_t prep_doubles;
    void (*prep)(const void *ctx, double *out, const float *q);
    void (*score)(const void *ctx, float *sc, const float *q, const double *prep, int head, int block_id, int n);
    int is_f32;                  // kind == PAGED_F32: read in place
    int kind, bits, group;       // PAGED_*; bits and group of PAGED_INT_GROUP
} PagedStream;

typedef struct Backend {
    const char *name;
    size_t act_bytes;     // bytes per act/weight storage element (4 on CPU, 2 on CUDA)
    // 1: the weight storage is a rounded copy of separate fp32 masters (store_weights does
    // the rounding), even when act_bytes is 4 (the CPU bf16 emulation keeps bf16 values in
    // fp32 storage). 0: with 4-byte storage the masters ARE the storage. act_bytes < 4
    // implies separate masters whatever this says.
    int separate_master;
    // 1: buffers are host memory the caller may read in place (the CPU backends), so a file
    // writer needs no host copy of them; 0: read them through download (a device)
    int host_memory;
    // the widest attention head (query/key or value) its attention op takes; 0: any. A model with
    // wider heads is refused when it is built on the backend (model/params.c), not at its first step
    int max_head_width;

    // ---- memory ----
    void *(*alloc)(size_t bytes);                  // zero-initialized; aborts with a message on failure
    void (*release)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*upload)(void *dst, const void *src, size_t bytes);      // host -> backend, raw bytes
    void (*download)(void *dst, const void *src, size_t bytes);    // backend -> host, raw bytes
    void (*copy)(void *dst, const void *src, size_t bytes);        // backend -> backend, raw bytes, no overlap
    // Weights: the optimizer holds fp32 masters; this writes the storage copy.
    // CPU: memcpy. CUDA: fp32 -> bf16 (stochastic rounding with the given seed).
    void (*store_weights)(float *dst, const float *master, size_t n, unsigned long long seed);
    // act buffer <-> fp32 host array of n elements (converts on CUDA).
    void (*act_to_host)(float *dst_host, const float *src, size_t n);
    void (*act_from_host)(float *dst, const float *src_host, size_t n);

    // ---- elementwise ----
    // out[i] = a[i] + b[i], i < n
    void (*add_forward)(float *out, const float *a, const float *b, size_t n);
    // dst[i] += src[i] (act buffers)
    void (*accumulate)(float *dst, const float *src, size_t n);

    // ---- token embedding ----
    // out (N, C) = wte[tokens[i]] ; wte (V, C)
    void (*embedding_forward)(float *out, const int *tokens, const float *wte, int N, int C);
    // dwte (V, C) += scatter of dout (N, C) by tokens; deterministic (fixed order per row)
    void (*embedding_backward)(float *dwte, const float *dout, const int *tokens, int N, int C);

    // ---- matmul: out (N, OC) = inp (N, C) @ weight (OC, C)^T ----
    void (*matmul_forward)(float *out, const float *inp, const float *weight, int N, int C, int OC);
    // dinp (N, C) += dout @ weight ; dweight (OC, C) += dout^T @ inp. Either may be NULL (skipped).
    void (*matmul_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC);
    // out (N, OC) = residual (N, OC) + inp (N, C) @ weight^T: a projection added to the residual
    // stream in one op, so that a device backend takes the residual as the GEMM's accumulate input
    // instead of writing the product and reading it back. residual + product is taken in fp32 and
    // rounded to the storage type once (cuBLASLt's fp32 epilogue reading a bf16 C, its split-K
    // reduction kept out of the output type: docs/GPU.md, "Tolerances"), one rounding fewer than
    // matmul_forward followed by add_forward. out aliases neither residual nor inp.
    void (*matmul_residual_forward)(float *out, const float *residual, const float *inp, const float *weight,
                                    int N, int C, int OC);

    // ---- RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * weight, rows of C ----
    // rstd (N) is fp32 on every backend, saved for backward.
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);

    // ---- RoPE, rotate-half (HF) form, IN PLACE ----
    // x is (B, T, H, S): H heads with a per-head stride of S elements; the rotation acts on
    // the D dims [off, off + D) of each head (D even), at position pos0 + t:
    //   i < D/2: f = theta^(-2i/D), a = (pos0 + t) * f
    //   y[i] = x[i] cos a - x[i + D/2] sin a ;  y[i + D/2] = x[i + D/2] cos a + x[i] sin a
    void (*rope_forward)(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta);
    // dx in place: the transpose (inverse) rotation. Not accumulating: it rewrites dx.
    void (*rope_backward)(float *dx, int B, int T, int H, int S, int off, int D, int pos0, float theta);
    // The same rotation for N independent rows (decoding: one token of each of N sequences):
    // x is (N, H, S) and row n sits at position pos[n] (int32, backend memory).
    void (*rope_rows_forward)(float *x, int N, int H, int S, int off, int D, const int *pos, float theta);

    // ---- causal softmax attention with grouped heads, no T x T matrix ----
    // q (B, T, NH, DQK), k (B, T, NKV, DQK), v (B, T, NKV, DV); query head h reads kv head
    // h / (NH / NKV). scores = scale * q.k, positions s > t masked. out (B, T, NH, DV) =
    // softmax(scores) v; lse (B, NH, T, fp32 on every backend) = the log-sum-exp of each
    // score row, all the backward needs to recompute the probabilities (FlashAttention-2).
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k, const float *v,
                              int B, int T, int NH, int NKV, int DQK, int DV, float scale);
    // dq, dk, dv accumulate; out and lse as the forward wrote them. scratch: fp32 (B, NH, T)
    // (the rows' dO . O).
    void (*attention_backward)(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *out, const float *lse, const float *q, const float *k, const float *v,
                               int B, int T, int NH, int NKV, int DQK, int DV, float scale);

    // ---- attention of one query row per sequence over a paged cache (decoding) ----
    // n sequences; q (n, NH, DK + DK2); sequence i attends its first lens[i] tokens (host array),
    // stored in blocks block_table[i * max_blocks + j] (host array). The key of token t for
    // query head h is [k head g (DK) | k2 (DK2, one head shared by all; absent when k2 is NULL)]
    // with g = h / (NH / NKV); its value is v head g (DV). v may be the same stream as k (the
    // absorbed latent form: the latent is both). out (n, NH, DV) = softmax(scale q.k) v.
    // Deterministic: the tokens are cut into chunks that do not depend on the thread count and
    // combined in order.
    void (*paged_attention)(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                            const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                            int n, int NH, int NKV, int DK, int DK2, int DV, float scale);

    // ---- SwiGLU: out (rows, cols) = silu(gate) * up, elementwise; gate and up (and dgate and
    // dup) have rows ld apart: the gate and up halves of one (rows, 2 cols) product are gate =
    // p, up = p + cols, ld = 2 cols (model/forward.c). The backward adds into dgate and dup. ----
    void (*swiglu_forward)(float *out, const float *gate, const float *up, int rows, int cols, int ld);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int rows, int cols, int ld);

    // ---- softmax cross-entropy over V classes, targets == ignore_index contribute nothing ----
    // losses (N) fp32: -log softmax(logits)[target], 0 where ignored.
    void (*xent_forward)(float *losses, const float *logits, const int *targets, int N, int V,
                         int ignore_index);
    // dlogits (N, V) += dloss * (softmax(logits) - onehot(target)); rows with ignored target get 0.
    void (*xent_backward)(float *dlogits, const float *logits, const int *targets, int N, int V,
                          int ignore_index, float dloss);

    // ---- optimizer (all fp32) ----
    // sum of squares of g (n), accumulated in double in a fixed order. Returned to the host.
    double (*sumsq)(const float *g, size_t n);
    // The same over the stripes of a ZeRO-1 shard (model/shard.h): elements [k period + lo,
    // k period + lo + stripe) of g clipped to end, every round k (period >= stripe > 0), one
    // value: sumsq of each round added in round order on the CPU, one fixed-order pass on a
    // device (one wait for the host instead of one a round).
    double (*sumsq_stripes)(const float *g, size_t lo, size_t stripe, size_t period, size_t end);
    // AdamW step t (1-based) on one tensor:
    //   g = grad * grad_scale ; m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2
    //   mhat = m / (1 - b1^t) ; vhat = v / (1 - b2^t)
    //   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)       (decoupled decay, as torch.optim.AdamW)
    void (*adamw_update)(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                         float beta1, float beta2, float eps, float wd, float grad_scale, int t);
    // Optional (NULL: the trainer calls adamw_update, then store_weights): adamw_update of one
    // whole tensor and store_weights(store, param, n, seed) of its result in one pass over the
    // masters, the same bits as the two calls. For backends whose weight storage is a rounded
    // copy of separate masters; both passes are memory-bound on a GPU.
    void (*adamw_update_store)(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                               float beta1, float beta2, float eps, float wd, float grad_scale, int t, float *store,
                               unsigned long long seed);

    // ---- column copies (splitting and concatenating per-token vectors) ----
    // For n < N, j < width: dst[n*dst_ld + dst_off + j] (= or +=) src[n*src_ld + src_off + j].
    // accumulate = 0 overwrites, 1 adds (the backward of a copy is an accumulating copy back).
    void (*copy_cols)(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off,
                      int N, int width, int accumulate);

    // ---- the int_group codec's round trip (cache layer, CLLA-quant) ----
    // Symmetric b-bit quantization of each row of width W in groups of g contiguous values:
    //   Imax = 2^(b-1) - 1, scale = max|x| / Imax per group, code = clamp(round_half_even(x / scale),
    //   -Imax, Imax), out = code * scale; an all-zero group gives zeros (no division).
    // The scale is rounded UP to bf16 before use, because the cache stores it as bf16: training
    // sees exactly what the inference cache decodes, and rounding up keeps |x / scale| <= Imax
    // (the clamp never changes a code). out may equal in.
    void (*int_group_roundtrip)(float *out, const float *in, int N, int W, int bits, int group);
    // ---- mixture of experts (model/moe.c) ----
    // N tokens, E routed experts, top-K per token. Router buffers are fp32 on every backend
    // (the routing decisions must not depend on bf16 rounding); index buffers are int32; the
    // expert-sorted row buffers (R = N*K rows at most) are act buffers. Routing is deterministic
    // (docs/DESIGN.md section 6): top-k ties go to the lower expert index; capacity drops the lowest
    // probabilities first and, among equal ones, the later token.
    //
    // Router logits in fp32: logits (N, E) f32 = inp (N, C) @ weight (E, C)^T.
    void (*moe_router_forward)(float *logits, const float *inp, const float *weight, int N, int C, int E);
    // dinp (N, C) += dlogits @ weight ; dweight (E, C) f32 += dlogits^T @ inp. dlogits is f32.
    void (*moe_router_backward)(float *dinp, float *dweight, const float *dlogits, const float *inp,
                                const float *weight, int N, int C, int E);
    // Softmax over all E, then top-K:
    //   probs (N, E) = softmax(logits) ; lse (N) = logsumexp(logits) (for the z-loss)
    //   topk_idx (N, K) int32: the K most probable experts, descending, ties to the lower index
    //   topk_w (N, K): their probabilities, divided by the sum of the K when norm_topk
    void (*moe_topk_forward)(float *probs, float *lse, int *topk_idx, float *topk_w, const float *logits,
                             int N, int E, int K, int norm_topk);
    // Dispatch plan. Assignment a = t*K + k sends token t to expert topk_idx[a].
    //   counts (E): assignments per expert BEFORE dropping (the f_e of the aux loss)
    //   capacity > 0: an expert keeps at most `capacity` assignments, those with the highest
    //   probs[t, e] (ties: the earlier token wins); capacity <= 0 keeps everything.
    //   expert_off (E+1): the kept assignments of expert e are rows [expert_off[e], expert_off[e+1])
    //   of the expert-sorted buffers, in token order; R = expert_off[E] rows are used.
    //   row_token (N*K): token of each row (-1 past R) ; assign_row (N*K): row of a, -1 if dropped.
    void (*moe_dispatch)(int *counts, int *expert_off, int *row_token, int *assign_row, const float *probs,
                         const int *topk_idx, int N, int E, int K, int capacity);
    // The layer's auxiliary losses into out[2] (f32, backend memory; the host downloads them):
    //   out[0] = aux_coef * E * sum_e f_e P_e,  f_e = counts[e] / (N K),  P_e = mean_t probs[t, e]
    //   out[1] = z_coef * mean_t lse[t]^2
    void (*moe_aux_forward)(float *out, const float *probs, const float *lse, const int *counts, int N,
                            int E, int K, float aux_coef, float z_coef);
    // Router backward (all f32): dlogits (N, E) += the softmax backward of
    //   dprobs = [dtopk_w at the selected experts, through the renormalization when norm_topk]
    //          + aux_scale * E * f_e / N      (f_e are counts: constants)
    // plus the z-loss gradient z_scale * 2 lse[t] / N * probs[t, e].
    // aux_scale, z_scale = loss scale times the coefficients. dtopk_w is 0 for dropped assignments.
    void (*moe_router_softmax_backward)(float *dlogits, const float *dtopk_w, const float *probs,
                                        const float *lse, const int *topk_idx, const float *topk_w,
                                        const int *counts, int N, int E, int K, int norm_topk,
                                        float aux_scale, float z_scale);
    // Gather token rows into expert order: out (R, C) row r = inp (N, C) row row_token[r], zeros
    // where row_token[r] is -1 (past the kept rows: moe_dispatch).
    void (*moe_gather_forward)(float *out, const float *inp, const int *row_token, int R, int C);
    // dinp (N, C) row t += sum over k (in k order, skipping -1) of dout row assign_row[t, k].
    void (*moe_gather_backward)(float *dinp, const float *dout, const int *assign_row, int N, int K, int C);
    // Weighted scatter back: out (N, C) row t += sum over k (in k order, skipping -1) of
    // topk_w[t, k] * expert_out row assign_row[t, k]. A dropped assignment adds nothing.
    void (*moe_combine_forward)(float *out, const float *expert_out, const float *topk_w,
                                const int *assign_row, int N, int K, int C);
    // dexpert_out row assign_row[t, k] += topk_w[t, k] * dout row t ;
    // dtopk_w[t, k] (f32) += dot(dout row t, expert_out row assign_row[t, k]) (kept assignments only).
    void (*moe_combine_backward)(float *dexpert_out, float *dtopk_w, const float *dout, const float *expert_out,
                                 const float *topk_w, const int *assign_row, int N, int K, int C);
    // Grouped expert matmul (one call per layer, not per expert, so a backend can spread the
    // experts over its cores or SMs and the cost follows the rows routed, not E). expert_off
    // (E+1, int32) is in BACKEND memory, as moe_dispatch wrote it, so that a device backend sizes
    // the work on the device and the layer needs no host round trip (model/moe.c); R is the rows
    // of the row buffers (N*K, a bound of expert_off[E]). The pointer arrays are HOST arrays of
    // backend pointers. Rows [expert_off[e], expert_off[e+1]) of out/inp belong to expert e, whose
    // weight (OC, C) is weights[e]:
    //   out rows (n_e, OC) = inp rows (n_e, C) @ weights[e]^T ; out rows [expert_off[E], R) = 0
    // (the rows of dropped assignments stay zero through the layer: moe_gather_forward, SwiGLU).
    void (*moe_expert_matmul_forward)(float *out, const float *inp, const float *const *weights,
                                      const int *expert_off, int E, int R, int C, int OC);
    // dinp rows (n_e, C) += dout rows @ weights[e] ; dweights[e] (OC, C) f32 += dout rows^T @ inp rows.
    // Rows of dinp past expert_off[E] are not written.
    void (*moe_expert_matmul_backward)(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                       const float *const *weights, const int *expert_off, int E, int R, int C,
                                       int OC);
} Backend;

// Feature groups of ops: what every model needs, MoE layers, incremental decoding.
enum { BACKEND_OPS_CORE = 1, BACKEND_OPS_MOE = 2, BACKEND_OPS_DECODE = 4 };
// The name of the first op of `groups` that be's table leaves NULL, or NULL when all are there
// (backend/backend_ops.c). Models and the decoder refuse a backend that lacks one, naming it.
const char *backend_missing_op(const Backend *be, int groups);

// The CPU reference backend (layers/). Always available.
const Backend *backend_cpu(void);
// The CPU backend in bf16 emulation (layers/backend_cpu_bf16.c): the CPU ops, with every
// value the CUDA backend stores in bf16 rounded to bf16 where it stores it, and weights
// rounded stochastically from fp32 masters as the CUDA backend does. Always available.
const Backend *backend_cpu_bf16(void);

#endif
