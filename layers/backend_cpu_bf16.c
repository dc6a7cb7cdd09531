// The CPU backend in bf16 emulation ("cpu-bf16"): a prediction of the CUDA backend on any
// machine. Every entry wraps the CPU op (the op math is never copied) and then rounds to
// bf16 exactly the outputs that the CUDA kernels (kernels/*.cu) store in bf16:
//  - act buffers (activations and activation gradients) are rounded to nearest-even, once
//    per op, as the kernels' stores do. A backward "+=" into an act buffer that already holds
//    bf16 values then gives round(old + update), the CUDA rule (read, add in fp32, round once;
//    cuBLAS beta = 1 on a bf16 output included);
//  - weights are rounded from separate fp32 masters with the CUDA backend's stochastic
//    rounding (backend/bf16.h), bit for bit;
//  - weight gradients, optimizer state, rstd, lse, losses and the MoE router buffers stay
//    fp32, as on the GPU;
//  - attention rounds P and dS to bf16 where the CUDA GEMMs read them (the *_bf16p ops).
// Storage stays fp32 (act_bytes 4) holding bf16-representable values, so every CPU op runs
// unchanged on it; separate_master = 1 makes model_build allocate the fp32 masters apart.
//
// What still differs from the GPU, by design: summation order and fp32-vs-double
// accumulators inside the ops (the CPU sums some reductions in double), fma contraction, and
// the expf / sqrtf implementations. Those are fp32-level differences; the bf16 roundings
// (2^-9 relative) dominate, so the remaining CPU/GPU gap is mostly a rounding that lands on
// the other side of a tie-break.

#include "backend/bf16.h"
#include "backend/backend.h"
#include "layers/cpu_ops.h"
#include "backend/moe_routing.h"

static inline float bf16_rne(float x) { return sr_bf16_to_f32(sr_f32_to_bf16_rne(x)); }

// x[i] = bf16(x[i]), i < n. Idempotent, so rounding a region wider than an op wrote leaves
// the untouched (already bf16) values as they are.
static void round_n(float *x, size_t n) {
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = bf16_rne(x[i]);
}

// Columns [off, off + width) of N rows with row stride ld.
static void round_cols(float *x, int ld, int off, int N, int width) {
    if (N <= 0 || width <= 0) return;
    #pragma omp parallel for schedule(static) if ((size_t)N * width > 65536)
    for (int n = 0; n < N; n++) {
        float *row = x + (size_t)n * ld + off;
        for (int j = 0; j < width; j++) row[j] = bf16_rne(row[j]);
    }
}

// ---- memory: CPU memory; weights and act uploads rounded as the CUDA backend rounds them ----

static void emu_store_weights(float *dst, const float *master, size_t n, unsigned long long seed) {
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = sr_bf16_to_f32(sr_round_weight(master[i], seed, i));
}

static void emu_act_from_host(float *dst, const float *src_host, size_t n) {
    cpu_act_from_host(dst, src_host, n);
    round_n(dst, n);
}

// ---- elementwise ----

static void emu_add_forward(float *out, const float *a, const float *b, size_t n) {
    cpu_add_forward(out, a, b, n);
    round_n(out, n);
}

static void emu_accumulate(float *dst, const float *src, size_t n) {
    cpu_accumulate(dst, src, n);
    round_n(dst, n);
}

// ---- embedding: the forward copies bf16 weights (exact); dwte is fp32 ----

static void emu_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C) {
    cpu_embedding_forward(out, tokens, wte, N, C);
    round_n(out, (size_t)N * C);
}

// ---- matmul: bf16 out and dinp (beta = 1), fp32 dweight ----

static void emu_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    cpu_matmul_forward(out, inp, weight, N, C, OC);
    round_n(out, (size_t)N * OC);
}

static void emu_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, int N, int C, int OC) {
    cpu_matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC);
    if (dinp) round_n(dinp, (size_t)N * C);
}

// residual + product in fp32, rounded once (backend/backend.h: cuBLASLt reads the bf16 C into its
// fp32 epilogue)
static void emu_matmul_residual_forward(float *out, const float *residual, const float *inp, const float *weight,
                                        int N, int C, int OC) {
    cpu_matmul_residual_forward(out, residual, inp, weight, N, C, OC);
    round_n(out, (size_t)(N > 0 ? N : 0) * (size_t)(OC > 0 ? OC : 0));
}

// ---- RMSNorm: bf16 out and dinp, fp32 rstd and dweight ----

static void emu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                                float eps) {
    cpu_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    round_n(out, (size_t)N * C);
}

static void emu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int N, int C) {
    cpu_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    round_n(dinp, (size_t)N * C);
}

// ---- RoPE in place: the rotated dims of each head are rewritten in bf16 ----

static void emu_rope_forward(float *x, int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    cpu_rope_forward(x, B, T, H, S, off, D, pos0, theta);
    round_cols(x, S, off, B * T * H, D);
}

static void emu_rope_backward(float *dx, int B, int T, int H, int S, int off, int D, int pos0, float theta) {
    cpu_rope_backward(dx, B, T, H, S, off, D, pos0, theta);
    round_cols(dx, S, off, B * T * H, D);
}

static void emu_rope_rows_forward(float *x, int N, int H, int S, int off, int D, const int *pos, float theta) {
    cpu_rope_rows_forward(x, N, H, S, off, D, pos, theta);
    round_cols(x, S, off, N * H, D);
}

// Decoding reads the cache as stored (its codec decides the precision); the output is stored in bf16.
static void emu_paged_attention(float *out, const float *q, const PagedStream *k, const PagedStream *k2,
                                const PagedStream *v, const int *block_table, int max_blocks, const int *lens,
                                int n, int NH, int NKV, int DK, int DK2, int DV, float scale) {
    cpu_paged_attention(out, q, k, k2, v, block_table, max_blocks, lens, n, NH, NKV, DK, DK2, DV, scale);
    round_n(out, (size_t)n * NH * DV);
}

// ---- attention: bf16 P and dS inside, bf16 out / dq / dk / dv, fp32 lse ----

static void emu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                  int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    cpu_attention_forward_bf16p(out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
    round_n(out, (size_t)B * T * NH * DV);
}

// The GPU sums dk and dv over a group's query heads in fp32 and adds them once; the CPU op
// does the same inside its fp32 buffers, so one rounding after it matches.
static void emu_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                   const float *out, const float *lse, const float *q, const float *k, const float *v,
                                   int B, int T, int NH, int NKV, int DQK, int DV, float scale) {
    cpu_attention_backward_bf16p(dq, dk, dv, scratch, dout, out, lse, q, k, v, B, T, NH, NKV, DQK, DV, scale);
    round_n(dq, (size_t)B * T * NH * DQK);
    round_n(dk, (size_t)B * T * NKV * DQK);
    round_n(dv, (size_t)B * T * NKV * DV);
}

// ---- SwiGLU ----

static void emu_swiglu_forward(float *out, const float *gate, const float *up, int rows, int cols, int ld) {
    cpu_swiglu_forward(out, gate, up, rows, cols, ld);
    round_n(out, (size_t)rows * cols);
}

static void emu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int rows,
                                int cols, int ld) {
    cpu_swiglu_backward(dgate, dup, dout, gate, up, rows, cols, ld);
    for (int r = 0; r < rows; r++) {
        round_n(dgate + (size_t)r * ld, (size_t)cols);
        round_n(dup + (size_t)r * ld, (size_t)cols);
    }
}

// ---- cross-entropy: fp32 losses, bf16 dlogits ----

static void emu_xent_backward(float *dlogits, const float *logits, const int *targets, int N, int V,
                              int ignore_index, float dloss) {
    cpu_xent_backward(dlogits, logits, targets, N, V, ignore_index, dloss);
    round_n(dlogits, (size_t)N * V);
}

// ---- optimizer: fp32 AdamW; the fused form is the two calls (the CUDA backend fuses them into one
// pass), so that the trainer's fused path runs here too ----

static void emu_adamw_update_store(float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1,
                                   float beta2, float eps, float wd, float grad_scale, int t, float *store,
                                   unsigned long long seed) {
    cpu_adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, wd, grad_scale, t);
    emu_store_weights(store, param, n, seed);
}

// ---- column copies and the int_group round trip (bf16 outputs) ----

static void emu_copy_cols(float *dst, int dst_ld, int dst_off, const float *src, int src_ld, int src_off, int N,
                          int width, int accumulate) {
    cpu_copy_cols(dst, dst_ld, dst_off, src, src_ld, src_off, N, width, accumulate);
    round_cols(dst, dst_ld, dst_off, N, width);
}

// code * scale can need more than 8 significant bits; the CUDA op rounds it for storage.
static void emu_int_group_roundtrip(float *out, const float *in, int N, int W, int bits, int group) {
    cpu_int_group_roundtrip(out, in, N, W, bits, group);
    round_n(out, (size_t)N * W);
}

// ---- MoE: fp32 router buffers untouched; bf16 row buffers rounded ----

static void emu_moe_router_backward(float *dinp, float *dweight, const float *dlogits, const float *inp,
                                    const float *weight, int N, int C, int E) {
    cpu_moe_router_backward(dinp, dweight, dlogits, inp, weight, N, C, E);
    if (dinp) round_n(dinp, (size_t)N * C);
}

static void emu_moe_gather_forward(float *out, const float *inp, const int *row_token, int R, int C) {
    cpu_moe_gather_forward(out, inp, row_token, R, C);
    if (R > 0 && C > 0) round_n(out, (size_t)R * C);
}

static void emu_moe_gather_backward(float *dinp, const float *dout, const int *assign_row, int N, int K, int C) {
    cpu_moe_gather_backward(dinp, dout, assign_row, N, K, C);
    if (N > 0 && C > 0) round_n(dinp, (size_t)N * C);
}

static void emu_moe_combine_forward(float *out, const float *expert_out, const float *topk_w, const int *assign_row,
                                    int N, int K, int C) {
    cpu_moe_combine_forward(out, expert_out, topk_w, assign_row, N, K, C);
    if (N > 0 && C > 0) round_n(out, (size_t)N * C);
}

// dexpert_out: only the rows some kept assignment points at are written (each at most once).
static void emu_moe_combine_backward(float *dexpert_out, float *dtopk_w, const float *dout, const float *expert_out,
                                     const float *topk_w, const int *assign_row, int N, int K, int C) {
    cpu_moe_combine_backward(dexpert_out, dtopk_w, dout, expert_out, topk_w, assign_row, N, K, C);
    for (size_t a = 0; a < (size_t)(N > 0 ? N : 0) * (size_t)(K > 0 ? K : 0); a++)
        if (assign_row[a] >= 0) round_n(dexpert_out + (size_t)assign_row[a] * C, (size_t)C);
}

// rows past expert_off[E]: zeros (forward) or untouched (dinp), bf16 already
static void emu_moe_expert_matmul_forward(float *out, const float *inp, const float *const *weights,
                                          const int *expert_off, int E, int R, int C, int OC) {
    cpu_moe_expert_matmul_forward(out, inp, weights, expert_off, E, R, C, OC);
    const int r0 = expert_off[0], r1 = expert_off[E];
    if (r1 > r0) round_n(out + (size_t)r0 * OC, (size_t)(r1 - r0) * OC);
}

static void emu_moe_expert_matmul_backward(float *dinp, float *const *dweights, const float *dout, const float *inp,
                                           const float *const *weights, const int *expert_off, int E, int R, int C,
                                           int OC) {
    cpu_moe_expert_matmul_backward(dinp, dweights, dout, inp, weights, expert_off, E, R, C, OC);
    const int r0 = expert_off[0], r1 = expert_off[E];
    if (dinp && r1 > r0) round_n(dinp + (size_t)r0 * C, (size_t)(r1 - r0) * C);
}

static const Backend cpu_bf16_backend = {
    .name = "cpu-bf16",
    .act_bytes = 4,          // fp32 storage of bf16 values: the CPU ops run on it unchanged
    .separate_master = 1,
    .host_memory = 1,

    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .store_weights = emu_store_weights,
    .act_to_host = cpu_act_to_host,   // exact, as bf16 -> fp32 is
    .act_from_host = emu_act_from_host,

    .add_forward = emu_add_forward,
    .accumulate = emu_accumulate,

    .embedding_forward = emu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,

    .matmul_forward = emu_matmul_forward,
    .matmul_backward = emu_matmul_backward,
    .matmul_residual_forward = emu_matmul_residual_forward,

    .rmsnorm_forward = emu_rmsnorm_forward,
    .rmsnorm_backward = emu_rmsnorm_backward,

    .rope_forward = emu_rope_forward,
    .rope_backward = emu_rope_backward,
    .rope_rows_forward = emu_rope_rows_forward,
    .paged_attention = emu_paged_attention,

    .attention_forward = emu_attention_forward,
    .attention_backward = emu_attention_backward,

    .swiglu_forward = emu_swiglu_forward,
    .swiglu_backward = emu_swiglu_backward,

    .xent_forward = cpu_xent_forward,
    .xent_backward = emu_xent_backward,

    .sumsq = cpu_sumsq,
    .sumsq_stripes = cpu_sumsq_stripes,
    .adamw_update = cpu_adamw_update,
    .adamw_update_store = emu_adamw_update_store,

    .copy_cols = emu_copy_cols,
    .int_group_roundtrip = emu_int_group_roundtrip,

    .moe_router_forward = cpu_moe_router_forward,
    .moe_router_backward = emu_moe_router_backward,
    .moe_topk_forward = moe_route_topk_forward,
    .moe_dispatch = moe_route_dispatch,
    .moe_aux_forward = moe_route_aux_forward,
    .moe_router_softmax_backward = moe_route_router_softmax_backward,
    .moe_gather_forward = emu_moe_gather_forward,
    .moe_gather_backward = emu_moe_gather_backward,
    .moe_combine_forward = emu_moe_combine_forward,
    .moe_combine_backward = emu_moe_combine_backward,
    .moe_expert_matmul_forward = emu_moe_expert_matmul_forward,
    .moe_expert_matmul_backward = emu_moe_expert_matmul_backward,
};

const Backend *backend_cpu_bf16(void) { return &cpu_bf16_backend; }
