// CQ, coupled quantization: see quant/cq.h and docs/QUANTIZERS.md "CQ".
#include "quant/cq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"
#include "quant/bitpack.h"
#include "quant/fp16.h"
#include "quant/kmeans.h"

CqSettings cq_settings_default(int dim) {
    CqSettings s = {.dim = dim, .c = 4, .bits = 8, .iters = 100, .seed = 1};
    return s;
}

int cq_settings_check(const CqSettings *s, char *err, size_t errlen) {
    if (s->dim < 1 || s->dim > 65536) {
        snprintf(err, errlen, "cq: dim=%d: expected a vector width in 1..65536", s->dim);
        return -1;
    }
    if (s->c < 1 || s->c > s->dim || s->dim % s->c != 0) {
        snprintf(err, errlen, "cq: c=%d does not divide dim=%d: choose c among the divisors of %d", s->c, s->dim, s->dim);
        return -1;
    }
    if (s->bits < 1 || s->bits > CQ_MAX_BITS) {
        snprintf(err, errlen, "cq: bits=%d not supported: choose 1..%d bits per code (2^b centroids per group)", s->bits, CQ_MAX_BITS);
        return -1;
    }
    if (s->iters < 1 || s->iters > 100000) {
        snprintf(err, errlen, "cq: iters=%d: expected 1..100000 k-means iterations (paper: 100)", s->iters);
        return -1;
    }
    return 0;
}

static int alloc_state(CqState *st, const CqSettings *s, char *err, size_t errlen) {
    memset(st, 0, sizeof(*st));
    if (cq_settings_check(s, err, errlen)) return -1;
    st->s = *s;
    st->groups = s->dim / s->c;
    st->entries = 1 << s->bits;
    int64_t nval;
    if (ck_mul((int64_t)st->entries, s->dim, &nval) || nval > (int64_t)1 << 40) {
        snprintf(err, errlen, "cq: a codebook of 2^%d x %d values is too large", s->bits, s->dim);
        return -1;
    }
    st->codebook = xcalloc((size_t)nval, sizeof(float));
    return 0;
}

int cq_fit(CqState *st, const CqSettings *s, const float *x, int64_t n, const float *fisher,
           char *err, size_t errlen) {
    if (alloc_state(st, s, err, errlen)) return -1;
    int64_t nel;
    if (n < st->entries) {
        snprintf(err, errlen, "cq: %lld calibration vectors for a codebook of 2^%d = %d centroids: give at least %d vectors (the paper uses 32768) or fewer bits",
                 (long long)n, s->bits, st->entries, st->entries);
        goto fail;
    }
    if (ck_mul(n, s->dim, &nel)) {
        snprintf(err, errlen, "cq: %lld calibration vectors of %d channels overflow", (long long)n, s->dim);
        goto fail;
    }
    for (int64_t i = 0; i < nel; i++) {
        if (!isfinite(x[i])) {
            snprintf(err, errlen, "cq: calibration value %lld (vector %lld) is not finite: clean the calibration activations",
                     (long long)i, (long long)(i / s->dim));
            goto fail;
        }
        if (fisher && !(fisher[i] >= 0 && isfinite(fisher[i]))) {
            snprintf(err, errlen, "cq: Fisher value %lld is negative or not finite: pass squared gradients", (long long)i);
            goto fail;
        }
    }
    int c = s->c;
    float *w = fisher ? xmalloc(sizeof(float) * (size_t)n) : NULL;
    for (int g = 0; g < st->groups; g++) {
        if (w)
            for (int64_t j = 0; j < n; j++) {   // w_ij = sum of the group's squared gradients (Eq. 6)
                double t = 0;
                for (int r = 0; r < c; r++) t += fisher[j * s->dim + g * c + r];
                w[j] = (float)t;
            }
        float *cb = st->codebook + (int64_t)g * st->entries * c;
        kmeans_fit(x + g * c, n, c, s->dim, w, st->entries, s->iters, KMEANS_INIT_PLUSPLUS,
                   s->seed + (uint64_t)g, cb, NULL, NULL);
        for (int64_t e = 0; e < (int64_t)st->entries * c; e++) {
            cb[e] = fp16_round(cb[e]);      // stored as fp16: encode against what decode will see
            if (!isfinite(cb[e])) {
                snprintf(err, errlen, "cq: a centroid of group %d exceeds the fp16 range (|x| > 65504): scale the activations", g);
                free(w);
                goto fail;
            }
        }
    }
    free(w);
    return 0;
fail:
    cq_free(st);
    return -1;
}

void cq_free(CqState *st) {
    free(st->codebook);
    memset(st, 0, sizeof(*st));
}

int64_t cq_bytes_per_token(const CqSettings *s) {
    return ((int64_t)(s->dim / s->c) * s->bits + 7) / 8;
}

int64_t cq_encode(const CqState *st, const float *x, int64_t n, uint8_t *out) {
    int64_t bpt = cq_bytes_per_token(&st->s), total;
    if (ck_mul(n, bpt, &total)) return -1;
    memset(out, 0, (size_t)total);
    int c = st->s.c, b = st->s.bits;
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++)
        for (int g = 0; g < st->groups; g++) {
            int code = kmeans_nearest(st->codebook + (int64_t)g * st->entries * c, st->entries, c,
                                      x + j * st->s.dim + g * c, NULL);
            bits_put(out + j * bpt, (int64_t)g * b, b, (uint32_t)code);
        }
    return total;
}

int cq_code(const CqState *st, const uint8_t *codes, int64_t token, int group) {
    return (int)bits_get(codes + token * cq_bytes_per_token(&st->s), (int64_t)group * st->s.bits, st->s.bits);
}

void cq_decode(const CqState *st, const uint8_t *codes, int64_t n, float *x) {
    int c = st->s.c;
    for (int64_t j = 0; j < n; j++)
        for (int g = 0; g < st->groups; g++) {
            int code = cq_code(st, codes, j, g);
            memcpy(x + j * st->s.dim + g * c, st->codebook + ((int64_t)g * st->entries + code) * c, sizeof(float) * c);
        }
}

void cq_weighted_sum(const CqState *st, const uint8_t *codes, int64_t n, const float *p,
                     double *hist, float *out) {
    int c = st->s.c, E = st->entries;
    memset(hist, 0, sizeof(double) * (size_t)st->groups * E);
    for (int64_t j = 0; j < n; j++)             // W_i[e] = sum of p_j over the tokens with code e
        for (int g = 0; g < st->groups; g++) hist[(int64_t)g * E + cq_code(st, codes, j, g)] += p[j];
    for (int g = 0; g < st->groups; g++)        // o_i = sum_e W_i[e] C_i[e]
        for (int r = 0; r < c; r++) {
            double acc = 0;
            for (int e = 0; e < E; e++) acc += hist[(int64_t)g * E + e] * st->codebook[((int64_t)g * E + e) * c + r];
            out[g * c + r] = (float)acc;
        }
}

int64_t cq_codebook_bytes(const CqSettings *s) {
    return (int64_t)2 * ((int64_t)1 << s->bits) * s->dim;
}

void cq_codebook_write(const CqState *st, uint8_t *out) {
    int64_t nval = (int64_t)st->entries * st->s.dim;
    for (int64_t i = 0; i < nval; i++) {
        uint16_t h = fp16_from_float(st->codebook[i]);
        out[2 * i] = (uint8_t)(h & 0xff);
        out[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

int cq_codebook_read(CqState *st, const CqSettings *s, const uint8_t *buf, int64_t nbytes,
                     char *err, size_t errlen) {
    if (alloc_state(st, s, err, errlen)) return -1;
    int64_t want = cq_codebook_bytes(s);
    if (nbytes != want) {
        snprintf(err, errlen, "cq: codebook of %lld bytes where CQ-%dc%db on dim %d stores %lld: the codec tensor does not match its settings",
                 (long long)nbytes, s->c, s->bits, s->dim, (long long)want);
        cq_free(st);
        return -1;
    }
    for (int64_t i = 0; i < want / 2; i++) {
        st->codebook[i] = fp16_to_float((uint16_t)(buf[2 * i] | buf[2 * i + 1] << 8));
        if (!isfinite(st->codebook[i])) {
            snprintf(err, errlen, "cq: codebook value %lld is not finite: the codec tensor is damaged", (long long)i);
            cq_free(st);
            return -1;
        }
    }
    return 0;
}

double cq_bits_everything(const CqSettings *s, int64_t tokens) {
    double code_bits = 8.0 * (double)cq_bytes_per_token(s) * (double)tokens;
    double book_bits = 8.0 * (double)cq_codebook_bytes(s);
    return (code_bits + book_bits) / ((double)tokens * s->dim);
}

double cq_bits_paper(const CqSettings *s) { return (double)s->bits / s->c; }

int64_t cq_centroid_params(int64_t layers, int64_t kv_heads, int64_t dim, int bits) {
    int64_t r = 2, t;
    if (ck_mul(r, layers, &t) || ck_mul(t, kv_heads, &t) || ck_mul(t, dim, &t) || ck_mul(t, (int64_t)1 << bits, &t)) return -1;
    return t;
}

double cq_joint_entropy(const float *x, int64_t n, int dim, int ch0, int c, int bins) {
    if (n < 1 || c < 1 || ch0 < 0 || ch0 + c > dim || bins < 2) return -1;
    int64_t cells = 1;
    for (int r = 0; r < c; r++)
        if (ck_mul(cells, bins, &cells) || cells > (int64_t)1 << 20) return -1;
    double lo[64], hi[64];
    if (c > 64) return -1;
    for (int r = 0; r < c; r++) {
        lo[r] = INFINITY; hi[r] = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            double v = x[j * dim + ch0 + r];
            if (v < lo[r]) lo[r] = v;
            if (v > hi[r]) hi[r] = v;
        }
    }
    int64_t *count = xcalloc((size_t)cells, sizeof(int64_t));
    for (int64_t j = 0; j < n; j++) {
        int64_t cell = 0;
        for (int r = 0; r < c; r++) {
            double width = (hi[r] - lo[r]) / bins;
            int bin = width > 0 ? (int)((x[j * dim + ch0 + r] - lo[r]) / width) : 0;
            if (bin >= bins) bin = bins - 1;    // the maximum lands in the last bin
            cell = cell * bins + bin;
        }
        count[cell]++;
    }
    double h = 0;
    for (int64_t i = 0; i < cells; i++)
        if (count[i]) {
            double p = (double)count[i] / (double)n;
            h -= p * log2(p);
        }
    free(count);
    return h;
}
