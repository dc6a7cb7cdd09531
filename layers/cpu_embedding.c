// Token embedding lookup and its scatter-add backward.
#include "layers/cpu_ops.h"

#include <assert.h>
#include <string.h>

// Channels per backward work item: 32 floats = two cache lines, so two threads never
// write the same line of dwte, and C = 512 still yields 16 independent items.
#define EMB_BWD_CBLOCK 32

// out (N, C) = wte[tokens[n]] ; wte (V, C). tokens are trusted (the data loader checks them
// against V), only asserted non-negative here.
void cpu_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C) {
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= ((size_t)1 << 15))   // a copy: threads pay past 32K
    for (int n = 0; n < N; n++) {
        assert(tokens[n] >= 0);
        memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, (size_t)C * sizeof(float));
    }
}

// dwte (V, C) += sum over n with tokens[n] == v of dout[n] (N, C).
// Repeated tokens make rows of dwte receive several adds, so parallelizing over n would
// race. Instead each thread owns a block of channels and walks the tokens in order: every
// element of dwte is summed in token order whatever the thread count (deterministic).
void cpu_embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C) {
    const int nblocks = (C + EMB_BWD_CBLOCK - 1) / EMB_BWD_CBLOCK;
    #pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * EMB_BWD_CBLOCK;
        const int c1 = c0 + EMB_BWD_CBLOCK < C ? c0 + EMB_BWD_CBLOCK : C;
        for (int n = 0; n < N; n++) {
            float *drow = dwte + (size_t)tokens[n] * C;
            const float *grow = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) drow[c] += grow[c];
        }
    }
}
