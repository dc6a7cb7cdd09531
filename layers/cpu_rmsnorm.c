// RMSNorm: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps), per row of C.
#include "layers/cpu_ops.h"

#include <math.h>

#include "common/sumsq.h"

// Channels per dweight work item in the backward (see there).
#define RMS_BWD_CBLOCK 64
// Rows go to the threads only past this many elements: a decode step normalizes one row per
// sequence, and waking the other thread for it cost more than the row (bench_decode at batch 1
// forked about 27 times a step here).
#define RMS_PAR_MIN ((size_t)1 << 13)

// out (N, C), rstd (N) saved for the backward; inp (N, C), weight (C).
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                         int N, int C, float eps) {
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= RMS_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        // The mean square in double (this backend is the numerical reference), in eight running
        // sums (common/sumsq.h): one dependent chain of double adds cost a few cycles a channel.
        const double ss = sumsq_block(x, (size_t)C);
        const float r = (float)(1.0 / sqrt(ss / C + (double)eps));
        for (int c = 0; c < C; c++) y[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

// sum over c of dy[c] w[c] (x[c] r) in double, in eight running sums (channel c into sum
// c mod 8) added by sum8_pairwise, as sumsq_block (common/sumsq.h) sums its squares
static double dot_dy_w_xhat(const float *dy, const float *w, const float *x, float r, int C) {
    double s[8] = {0};
    int c = 0;
    for (; c + 8 <= C; c += 8)
        for (int j = 0; j < 8; j++) s[j] += (double)dy[c + j] * w[c + j] * (x[c + j] * r);
    for (int j = 0; c < C; c++, j++) s[j] += (double)dy[c] * w[c] * (x[c] * r);
    return sum8_pairwise(s);
}

// With xhat = x * r and r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so
//   dinp_i   += r * (dout_i w_i - xhat_i * mean_j(dout_j w_j xhat_j))
//   dweight_i += sum over rows of dout_i xhat_i
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C) {
    // dinp: rows are independent.
    #pragma omp parallel for schedule(static) if ((size_t)N * C >= RMS_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        const float r = rstd[n];
        const float mean_dot = (float)(dot_dy_w_xhat(dy, weight, x, r, C) / C);
        for (int c = 0; c < C; c++) {
            const float xhat = x[c] * r;
            dx[c] += r * (dy[c] * weight[c] - xhat * mean_dot);
        }
    }
    // dweight: a reduction over rows. Per-thread partials merged at the end would make the
    // sum order depend on the thread count; instead each thread owns a block of channels
    // and walks all rows in order (deterministic), summing in double before the single +=.
    const int nblocks = (C + RMS_BWD_CBLOCK - 1) / RMS_BWD_CBLOCK;
    #pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * RMS_BWD_CBLOCK;
        const int c1 = c0 + RMS_BWD_CBLOCK < C ? c0 + RMS_BWD_CBLOCK : C;
        double acc[RMS_BWD_CBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            const float r = rstd[n];
            for (int c = c0; c < c1; c++) acc[c - c0] += (double)(dy[c] * (x[c] * r));
        }
        for (int c = c0; c < c1; c++) dweight[c] += (float)acc[c - c0];
    }
}
