// Matmuls through cuBLASLt: bf16 inputs, fp32 compute and accumulation.
//   forward  out (N, OC) bf16  = inp (N, C) @ W (OC, C)^T
//   backward dinp (N, C) bf16 += dout (N, OC) @ W          (fp32 product, then one rounding)
//            dW (OC, C)  fp32 += dout^T @ inp              (beta = 1, fp32 output)
//
// dinp is not accumulated through cuBLASLt's C input (beta = 1 with a bf16 C and D): on an H200
// (scripts/gpu_check.sh, docs/GPU.md "Measured") that rounded twice, the product to bf16 and
// then the sum, one bf16 ulp off the single rounding the cpu-bf16 emulation and the GPU op
// tests' tolerances assume. The product goes to an fp32 scratch (beta = 0, exact fp32
// accumulation like dW) in chunks of rows, and one elementwise kernel adds it to dinp in fp32
// and rounds once.
//
// cuBLASLt is column-major: a row-major (R, K) matrix is the column-major (K, R) matrix
// with leading dimension K, i.e. its transpose. So every product below is written for
// the transposes: out^T = W * inp^T, dinp^T = W^T * dout^T, dW^T = inp^T * dout.
#include "kernels/cuda_common.cuh"

// The fp32 scratch of one dinp chunk: 64 MiB (e.g. 2978 rows of a 5632-wide product), large
// enough that a chunk's product runs at the full-matrix rate.
#define DINP_CHUNK_BYTES ((size_t)64 << 20)

// The largest power of two (at most 256) dividing the address. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and sub-buffers of a tensor table can
// start anywhere: tell it the truth so it never picks a kernel that needs more.
static uint32_t alignment_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 2 && (a % al) != 0) al >>= 1;
    return al;
}

// What cuBLASLt needs to run one product, apart from the pointers and beta: the operation and
// layout descriptors and the algorithm its heuristic chose. Creating them and asking the
// heuristic costs more host time than a small GEMM takes on the GPU, and a training step asks
// for the same few dozen shapes again and again, so each shape is planned once.
typedef struct LtKey {
    int m, n, k, lda, ldb, ldd;
    int trans_a, trans_b;
    cudaDataType_t dtype;
    uint32_t al_a, al_b, al_c, al_d;   // operand alignments: the heuristic's choice depends on them
} LtKey;

typedef struct LtPlan {
    LtKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} LtPlan;

// Process-wide CUDA state, like the handles of cuda_context.cu: filled on first use of a shape,
// never freed. Past LT_PLANS shapes (no model here has that many) a product is planned per call.
#define LT_PLANS 512
typedef struct LtPlanCache {
    LtPlan plan[LT_PLANS];
    int n;
    int last;   // the plan used last: consecutive identical shapes (layers) skip the search
} LtPlanCache;
static LtPlanCache g_lt_plans;

static int same_key(const LtKey *a, const LtKey *b) {
    return a->m == b->m && a->n == b->n && a->k == b->k && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldd == b->ldd && a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->dtype == b->dtype &&
           a->al_a == b->al_a && a->al_b == b->al_b && a->al_c == b->al_c && a->al_d == b->al_d;
}

static void lt_plan_make(LtPlan *p, const LtKey *key) {
    p->key = *key;
    cublasLtHandle_t lt = cuda_cublaslt();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Layouts describe the stored matrices (before the transpose op).
    const int m = key->m, n = key->n, k = key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, key->trans_a ? k : m, key->trans_a ? m : k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, key->trans_b ? n : k, key->trans_b ? k : n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, key->dtype, m, n, key->ldd));

    size_t ws_bytes = 0;
    (void)cuda_lt_workspace(&ws_bytes);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws_bytes, sizeof ws_bytes));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al_a, sizeof key->al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b, sizeof key->al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al_c, sizeof key->al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_d, sizeof key->al_d));
    // Split-K partial sums reduced in the output type would round a bf16 output more than once
    // (the cpu-bf16 emulation and the GPU tests' tolerances assume one rounding, docs/GPU.md):
    // only no reduction or one in the fp32 compute type.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &heur, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0)
        die("cuBLASLt found no algorithm for a bf16 matmul (m=%d n=%d k=%d, %s output): "
            "this GPU or cuBLAS version may not support it", m, n, k,
            key->dtype == CUDA_R_32F ? "fp32" : "bf16");
    p->algo = heur.algo;
}

static void lt_plan_destroy(LtPlan *p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->op));
}

// D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C, column-major, C laid out as D.
// A and B are bf16; C and D are bf16 or fp32 (dtype). lda/ldb/ldd are the stored leading dims.
void cuda_lt_matmul_c(int m, int n, int k, const void *A, int lda, bool transA, const void *B, int ldb, bool transB,
                      const void *C, void *D, int ldd, cudaDataType_t dtype, float beta) {
    const LtKey key = {m, n, k, lda, ldb, ldd, transA, transB, dtype, alignment_of(A), alignment_of(B), alignment_of(C),
                       alignment_of(D)};
    LtPlanCache *c = &g_lt_plans;
    LtPlan *p = NULL, once;
    if (c->n > 0 && same_key(&c->plan[c->last].key, &key)) p = &c->plan[c->last];
    for (int i = 0; !p && i < c->n; i++)
        if (same_key(&c->plan[i].key, &key)) {
            p = &c->plan[i];
            c->last = i;
        }
    if (!p && c->n < LT_PLANS) {
        c->last = c->n++;
        p = &c->plan[c->last];
        lt_plan_make(p, &key);
    }
    const int cached = p != NULL;
    if (!cached) {
        p = &once;
        lt_plan_make(p, &key);
    }
    size_t ws_bytes = 0;
    void *ws = cuda_lt_workspace(&ws_bytes);
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(cuda_cublaslt(), p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->ld, D, p->ld,
                                &p->algo, ws, ws_bytes, 0));
    if (!cached) lt_plan_destroy(p);   // after the enqueue: cuBLASLt copies what it needs at the call
}

void cuda_lt_matmul(int m, int n, int k, const void *A, int lda, bool transA, const void *B, int ldb, bool transB,
                    void *D, int ldd, cudaDataType_t dtype, float beta) {
    cuda_lt_matmul_c(m, n, k, A, lda, transA, B, ldb, transB, D, D, ldd, dtype, beta);
}

extern "C" void cuda_matmul_forward(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) { CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(bf16), 0)); return; }
    // out^T (OC, N) = W (OC, C) @ inp^T: A = W stored col-major as (C, OC) ld C, transposed;
    // B = inp stored col-major (C, N) ld C.
    cuda_lt_matmul(OC, N, C, weight, C, true, inp, C, false, out, OC, CUDA_R_16BF, 0.0f);
    CUDA_OP_DONE();
}

// out = residual + inp @ W^T with the residual as cuBLASLt's accumulate input (beta = 1, bf16 C):
// the pass that wrote the product and the add that read it back are gone. The epilogue adds C to
// the fp32 accumulator and rounds once (the reduction scheme is kept out of the output type above),
// which the cpu-bf16 emulation models; test_gpu_ops's "rounds once" cases tell one rounding from two
// bit for bit (docs/GPU.md, "Tolerances": on the H100, run 9 trained every preset further from cpu-bf16
// while the emulation still rounded the product first).
extern "C" void cuda_matmul_residual_forward(float *out, const float *residual, const float *inp, const float *weight,
                                             int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) { CUDA_CHECK(cudaMemcpyAsync(out, residual, (size_t)N * OC * sizeof(bf16), cudaMemcpyDeviceToDevice, 0)); return; }
    cuda_lt_matmul_c(OC, N, C, weight, C, true, inp, C, false, residual, out, OC, CUDA_R_16BF, 1.0f);
    CUDA_OP_DONE();
}

extern "C" void cuda_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return;
    if (dinp) {
        // tmp^T (C, rows) = W stored col-major (C, OC) ld C  @  dout^T rows stored col-major (OC, rows) ld OC,
        // then dinp rows += tmp (fp32 sum, one rounding); rows chunked so tmp stays within DINP_CHUNK_BYTES
        const size_t row_bytes = (size_t)C * sizeof(float);
        size_t rows = DINP_CHUNK_BYTES / row_bytes;
        if (rows < 1) rows = 1;
        if (rows > (size_t)N) rows = (size_t)N;
        float *tmp = (float *)cuda_scratch(SCRATCH_DINP, rows * row_bytes);
        // the add's launch mark covers the product before it: both are this op's (or the outer op's)
        const char *outer = cuda_timing_label(NULL);
        cuda_timing_label(outer ? outer : __func__);
        for (size_t r0 = 0; r0 < (size_t)N; r0 += rows) {
            const int n = (int)((size_t)N - r0 < rows ? (size_t)N - r0 : rows);
            cuda_lt_matmul(C, n, OC, weight, C, false, (const bf16 *)dout + r0 * OC, OC, false, tmp, C, CUDA_R_32F, 0.0f);
            cuda_add_f32_to_bf16((bf16 *)dinp + r0 * C, tmp, (size_t)n * C);
        }
        cuda_timing_label(outer);
    }
    if (dweight) {
        // dW^T (C, OC) += inp^T stored col-major (C, N) ld C  @  (dout^T)^T: dout^T stored (OC, N) ld OC, transposed
        cuda_lt_matmul(C, OC, N, inp, C, false, dout, OC, true, dweight, C, CUDA_R_32F, 1.0f);
    }
    CUDA_OP_DONE();
}
