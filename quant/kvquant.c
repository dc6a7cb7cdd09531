// KVQuant: per-channel pre-RoPE keys, per-token values, Fisher-weighted non-uniform datatypes,
// dense-and-sparse outliers, an fp16 attention sink, Q-Norm. What each step follows (paper,
// reference code, or our reading of an ambiguity) is in docs/QUANTIZERS.md (KVQuant).
#include "quant/kvquant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"
#include "quant/qpack.h"

KvqSettings kvq_defaults(void) {
    KvqSettings s = {4, 0.01, 1, -1, 50, 0};
    return s;
}

int kvq_settings_parse(const char *spec, KvqSettings *s, char *err, size_t errlen) {
    char key[32], val[64];
    int rc;
    while ((rc = qp_spec_next(&spec, key, sizeof(key), val, sizeof(val), err, errlen)) == 1) {
        if (!strcmp(key, "bits")) rc = qp_spec_int(key, val, 2, 4, &s->bits, err, errlen);
        else if (!strcmp(key, "outliers")) rc = qp_spec_f64(key, val, 0, 0.4999, &s->outliers, err, errlen);
        else if (!strcmp(key, "sink")) rc = qp_spec_int(key, val, 0, 1 << 20, &s->sink, err, errlen);
        else if (!strcmp(key, "iters")) rc = qp_spec_int(key, val, 1, 10000, &s->kmeans_iters, err, errlen);
        else if (!strcmp(key, "vgroup")) rc = qp_spec_int(key, val, 0, 65536, &s->value_group, err, errlen);
        else if (!strcmp(key, "qnorm")) {
            rc = 0;
            if (!strcmp(val, "auto")) s->qnorm = -1;
            else if (!strcmp(val, "on")) s->qnorm = 1;
            else if (!strcmp(val, "off")) s->qnorm = 0;
            else {
                snprintf(err, errlen, "qnorm=%s: expected auto, on or off", val);
                rc = -1;
            }
        } else {
            snprintf(err, errlen, "kvquant: unknown setting '%s' (known: bits, outliers, sink, qnorm, iters, vgroup)", key);
            return -1;
        }
        if (rc) return qp_prefix_err("kvquant", err, errlen);
    }
    return rc ? qp_prefix_err("kvquant", err, errlen) : 0;
}

int64_t kvq_value_group(const KvqSettings *s, int64_t H) { return s->value_group > 0 ? s->value_group : H; }

int64_t kvq_value_outliers_per_side(const KvqSettings *s, int64_t H) {
    return s->outliers > 0 ? (int64_t)ceil(s->outliers * (double)kvq_value_group(s, H) / 2 - 1e-9) : 0;
}

int kvq_settings_check(const KvqSettings *s, KvqPart part, int64_t H, char *err, size_t errlen) {
    if (s->bits < 2 || s->bits > 4) {
        snprintf(err, errlen, "kvquant: bits=%d is not supported: use 2, 3 or 4 (the paper's nuq2..nuq4)", s->bits);
        return -1;
    }
    if (!(s->outliers >= 0 && s->outliers < 0.5)) {
        snprintf(err, errlen, "kvquant: outliers=%g: use a fraction in [0, 0.5) (the paper uses 0.01)", s->outliers);
        return -1;
    }
    if (s->sink < 0 || s->kmeans_iters < 1 || s->qnorm < -1 || s->qnorm > 1) {
        snprintf(err, errlen, "kvquant: sink=%d, iters=%d, qnorm=%d: use sink >= 0, iters >= 1, qnorm in {-1, 0, 1}",
                 s->sink, s->kmeans_iters, s->qnorm);
        return -1;
    }
    if (H < 1 || H > 65536) {
        snprintf(err, errlen, "kvquant: width %lld outside 1..65536 (sparse entries store 16-bit channels)", (long long)H);
        return -1;
    }
    // vgroup groups the values' scales; keys ignore it (one spec may serve both parts)
    if (s->value_group < 0 || (part == KVQ_VALUES && s->value_group > 0 && H % s->value_group)) {
        snprintf(err, errlen, "kvquant: vgroup=%d does not divide the width %lld: use a divisor (the head dim for "
                 "per-head values) or 0 for the whole width", s->value_group, (long long)H);
        return -1;
    }
    if (part == KVQ_VALUES && 2 * kvq_value_outliers_per_side(s, H) >= kvq_value_group(s, H)) {
        snprintf(err, errlen, "kvquant: outliers=%g leaves no dense value in a value group of %lld channels: lower it",
                 s->outliers, (long long)kvq_value_group(s, H));
        return -1;
    }
    return 0;
}

int kvq_qnorm_on(const KvqSettings *s) { return s->qnorm < 0 ? s->bits == 2 : s->qnorm; }

void kvq_free(KvqCodec *c) {
    free(c->lut);
    free(c->zero);
    free(c->range);
    memset(c, 0, sizeof(*c));
}

int kvq_nearest(const float *lut, int k, float v) {
    int i = 0;
    while (i + 1 < k && v > 0.5f * (lut[i] + lut[i + 1])) i++;
    return i;
}

// kvq_nearest with the k - 1 midpoints 0.5f * (lut[i] + lut[i + 1]) computed once by the caller.
static inline int nearest_mid(const float *mid, int k, float v) {
    int i = 0;
    while (i + 1 < k && v > mid[i]) i++;
    return i;
}

// ---- the datatype fit

typedef struct { float x, w; } Sample;

static int cmp_sample(const void *a, const void *b) {
    const float x = ((const Sample *)a)->x, y = ((const Sample *)b)->x;
    return (x > y) - (x < y);
}

int kvq_kmeans_1d(const float *x, const float *w, int64_t n, int k, int iters, float *centroids) {
    if (n < k || k < 2) return -1;
    Sample *smp = xmalloc(sizeof(Sample) * (size_t)n);
    for (int64_t i = 0; i < n; i++) smp[i] = (Sample){x[i], w ? w[i] : 1.0f};
    qsort(smp, (size_t)n, sizeof(Sample), cmp_sample);
    // prefix sums: a cluster is a contiguous run of the sorted samples, its weighted mean a
    // difference of two prefix sums
    double *W = xmalloc(sizeof(double) * (size_t)(n + 1)), *S = xmalloc(sizeof(double) * (size_t)(n + 1));
    W[0] = S[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        W[i + 1] = W[i] + smp[i].w;
        S[i + 1] = S[i] + (double)smp[i].w * smp[i].x;
    }
    if (!(W[n] > 0)) {
        free(smp); free(W); free(S);
        return -1;
    }
    double *c = xmalloc(sizeof(double) * (size_t)k);
    for (int j = 0; j < k; j++) c[j] = -1.0 + 2.0 * j / (k - 1);
    for (int it = 0; it < iters; it++) {
        int moved = 0;
        int64_t lo = 0;
        for (int j = 0; j < k; j++) {
            // cluster j: samples with x <= the midpoint to the next centroid (ties go low,
            // as kvq_nearest), found by binary search on the sorted samples
            int64_t hi = n;
            if (j + 1 < k) {
                const float mid = 0.5f * ((float)c[j] + (float)c[j + 1]);
                int64_t a = lo, b = n;
                while (a < b) {
                    const int64_t m = a + (b - a) / 2;
                    if (smp[m].x <= mid) a = m + 1;
                    else b = m;
                }
                hi = a;
            }
            const double wsum = W[hi] - W[lo];
            if (wsum > 0) {
                const double nc = (S[hi] - S[lo]) / wsum;
                if (nc != c[j]) moved = 1;
                c[j] = nc;
            }
            lo = hi;
        }
        if (!moved) break;
    }
    for (int j = 0; j < k; j++) centroids[j] = (float)c[j];
    free(smp); free(W); free(S); free(c);
    return 0;
}

void kvq_qnorm(const float *centroids, int k, const float *x, int64_t n, float *out) {
    double s1 = 0, q1 = 0, s2 = 0, q2 = 0;
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i], q = centroids[kvq_nearest(centroids, k, x[i])];
        s1 += v; q1 += v * v; s2 += q; q2 += q * q;
    }
    const double mu1 = s1 / n, mu2 = s2 / n;
    const double var1 = q1 / n - mu1 * mu1, var2 = q2 / n - mu2 * mu2;
    const double sd1 = var1 > 0 ? sqrt(var1) : 0, sd2 = var2 > 0 ? sqrt(var2) : 0;
    for (int j = 0; j < k; j++) out[j] = sd2 > 0 ? (float)((centroids[j] - mu2) * sd1 / sd2 + mu1) : centroids[j];
}

// numpy's percentile (linear interpolation) of sorted v[0..n)
static float percentile_sorted(const float *v, int64_t n, double q) {
    const double pos = q * (double)(n - 1);
    const int64_t i = (int64_t)floor(pos);
    if (i >= n - 1) return v[n - 1];
    const double fr = pos - (double)i;
    return (float)((double)v[i] + fr * ((double)v[i + 1] - v[i]));
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct { float v; int32_t c; } Elem;

// (value, channel) order: the total order the value outliers are picked by, so ties are
// deterministic (the lower channel counts as the smaller).
static inline int elem_less(Elem a, Elem b) { return a.v < b.v || (a.v == b.v && a.c < b.c); }

// One value group of H channels (a token's whole width by default): marks its kout largest and
// kout smallest in mask (1 = sparse) and returns its fp16 zero and range from the max and min of
// the rest (paper: per-token, online). scratch holds 2 * kout + 2 Elems: the kout + 1 smallest
// and the kout + 1 largest so far, kept sorted by insertion (kout is ~fH/2, small, so this is
// a single pass over the group, where a sort would cost H log H per token).
static void value_stats(int64_t kout, const float *x, int64_t H, Elem *scratch, uint8_t *mask,
                        uint16_t *zero_h, uint16_t *range_h) {
    memset(mask, 0, (size_t)H);
    const int64_t keep = kout + 1;   // the outliers and the first dense value on each side
    Elem *lo = scratch, *hi = scratch + keep;   // lo ascending, hi descending
    int64_t nlo = 0, nhi = 0;
    for (int64_t i = 0; i < H; i++) {
        const Elem e = {x[i], (int32_t)i};
        if (nlo < keep || elem_less(e, lo[nlo - 1])) {
            int64_t j = nlo < keep ? nlo++ : keep - 1;
            for (; j > 0 && elem_less(e, lo[j - 1]); j--) lo[j] = lo[j - 1];
            lo[j] = e;
        }
        if (nhi < keep || elem_less(hi[nhi - 1], e)) {
            int64_t j = nhi < keep ? nhi++ : keep - 1;
            for (; j > 0 && elem_less(hi[j - 1], e); j--) hi[j] = hi[j - 1];
            hi[j] = e;
        }
    }
    for (int64_t i = 0; i < kout; i++) mask[lo[i].c] = mask[hi[i].c] = 1;
    const float mn = lo[kout].v, mx = hi[kout].v;   // 2 kout < H: both exist and are dense
    *zero_h = qp_f32_to_f16(0.5f * (mx + mn));
    *range_h = qp_f32_to_f16(0.5f * (mx - mn));
}

// Normalized value of x with zero z and range r (fp16-representable); r == 0 maps to 0.
static inline float normalize(float x, float z, float r) {
    if (!(r > 0)) return 0.0f;
    const float v = (x - z) / r;
    return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
}

// Keys: x is an outlier of channel ch iff the codec keeps a sparse part (outliers > 0) and x lies
// outside [zero - range, zero + range]. With no sparse part (f = 0) the range is the calibration's
// min and max, and a key outside it clamps to the edge code, as the paper's nuqX without sparsity
// does (it was stored as a sparse fp16 entry, about 0.65% of the keys at 3 bits).
static inline int key_outlier(const KvqCodec *c, float x, int64_t ch) {
    return c->s.outliers > 0 && (x < c->zero[ch] - c->range[ch] || x > c->zero[ch] + c->range[ch]);
}

// Keys: calibrates each channel's zero and range (the f/2 and 1 - f/2 quantiles: the reference
// code's t = 1 - f/2), then collects the normalized non-outliers of the calibration rows and
// their weights into xs/ws. Returns their count.
static int64_t key_samples(KvqCodec *c, const float *x, const float *fisher, const int64_t *rows, int64_t ncal,
                           float *xs, float *ws) {
    const int64_t H = c->H;
    c->zero = xmalloc(sizeof(float) * (size_t)H);
    c->range = xmalloc(sizeof(float) * (size_t)H);
    float *col = xmalloc(sizeof(float) * (size_t)ncal);
    const double t = 1.0 - c->s.outliers / 2;
    for (int64_t ch = 0; ch < H; ch++) {
        for (int64_t i = 0; i < ncal; i++) col[i] = x[rows[i] * H + ch];
        qsort(col, (size_t)ncal, sizeof(float), cmp_float);
        const float up = percentile_sorted(col, ncal, t), lo = percentile_sorted(col, ncal, 1 - t);
        c->zero[ch] = qp_f16_round(0.5f * (up + lo));
        c->range[ch] = qp_f16_round(0.5f * (up - lo));
    }
    free(col);
    int64_t m = 0;
    for (int64_t i = 0; i < ncal; i++)
        for (int64_t ch = 0; ch < H; ch++) {
            const float v = x[rows[i] * H + ch];
            if (key_outlier(c, v, ch)) continue;
            xs[m] = normalize(v, c->zero[ch], c->range[ch]);
            ws[m++] = fisher ? fisher[rows[i] * H + ch] : 1.0f;
        }
    return m;
}

// Values: each calibration row normalized per group exactly as online (value_stats), so the
// datatype is fitted to what inference will quantize; collects the non-outliers into xs/ws.
static int64_t value_samples(const KvqSettings *s, const float *x, const float *fisher, int64_t H, const int64_t *rows,
                             int64_t ncal, float *xs, float *ws) {
    const int64_t Gv = kvq_value_group(s, H), kout = kvq_value_outliers_per_side(s, H);
    Elem *scratch = xmalloc(sizeof(Elem) * (size_t)(2 * kout + 2));
    uint8_t *mask = xmalloc((size_t)H);
    int64_t m = 0;
    for (int64_t i = 0; i < ncal; i++)
        for (int64_t g0 = 0; g0 < H; g0 += Gv) {
            const float *v = x + rows[i] * H + g0;
            uint16_t zh, rh;
            value_stats(kout, v, Gv, scratch, mask, &zh, &rh);
            const float z = qp_f16_to_f32(zh), r = qp_f16_to_f32(rh);
            for (int64_t ch = 0; ch < Gv; ch++) {
                if (mask[ch]) continue;
                xs[m] = normalize(v[ch], z, r);
                ws[m++] = fisher ? fisher[rows[i] * H + g0 + ch] : 1.0f;
            }
        }
    free(scratch);
    free(mask);
    return m;
}

int kvq_fit(KvqCodec *c, const KvqSettings *s, KvqPart part, const float *x, const float *fisher,
            int64_t N, int64_t H, int64_t seq_len, char *err, size_t errlen) {
    memset(c, 0, sizeof(*c));
    if (kvq_settings_check(s, part, H, err, errlen)) return -1;
    int64_t n, bad;
    if (N < 1 || seq_len < 1 || N % seq_len || ck_mul(N, H, &n)) {
        snprintf(err, errlen, "kvquant: %lld calibration tokens are not whole sequences of %lld", (long long)N,
                 (long long)seq_len);
        return -1;
    }
    if (qp_check_f16_range(x, n, &bad)) {
        snprintf(err, errlen, "kvquant: calibration value %g at token %lld is not finite or beyond fp16's range",
                 (double)x[bad], (long long)(bad / H));
        return -1;
    }
    if (fisher)
        for (int64_t i = 0; i < n; i++)
            if (!(fisher[i] >= 0) || !isfinite(fisher[i])) {
                snprintf(err, errlen, "kvquant: Fisher weight %g at token %lld is not a finite square: pass squared "
                         "gradients", (double)fisher[i], (long long)(i / H));
                return -1;
            }
    // the calibration tokens: all but the first `sink` of each sequence
    const int64_t skip = s->sink < seq_len ? s->sink : seq_len;
    const int64_t ncal = N / seq_len * (seq_len - skip);
    if (ncal < 1) {
        snprintf(err, errlen, "kvquant: no calibration token is left once the first %d of each sequence (the "
                 "sink) are set aside: use longer sequences", s->sink);
        return -1;
    }
    int64_t *rows = xmalloc(sizeof(int64_t) * (size_t)ncal);
    for (int64_t t = 0, m = 0; t < N; t++)
        if (t % seq_len >= skip) rows[m++] = t;
    c->s = *s;
    c->part = part;
    c->H = H;
    c->k = 1 << s->bits;
    c->lut = xcalloc((size_t)c->k, sizeof(float));
    float *xs = xmalloc(sizeof(float) * (size_t)ncal * (size_t)H), *ws = xmalloc(sizeof(float) * (size_t)ncal * (size_t)H);
    const int64_t m = part == KVQ_KEYS ? key_samples(c, x, fisher, rows, ncal, xs, ws)
                                       : value_samples(s, x, fisher, H, rows, ncal, xs, ws);
    free(rows);
    int rc = 0;
    if (m < c->k) {
        snprintf(err, errlen, "kvquant: %lld non-outlier calibration elements for a %d-entry datatype: the "
                 "calibration set is smaller than the codebook, or its channels hold one value each (no range to "
                 "normalize by): give more, or more varied, tokens", (long long)m, c->k);
        rc = -1;
    } else if (kvq_kmeans_1d(xs, ws, m, c->k, s->kmeans_iters, c->lut)) {
        snprintf(err, errlen, "kvquant: the Fisher weights of the calibration elements sum to 0 (the loss does not "
                 "depend on these values): fit without them, unweighted (clla calibrate --no-fisher)");
        rc = -1;
    } else {
        if (kvq_qnorm_on(s)) kvq_qnorm(c->lut, c->k, xs, m, c->lut);
        for (int j = 0; j < c->k; j++) c->lut[j] = qp_f16_round(c->lut[j]);
    }
    free(xs);
    free(ws);
    if (rc) kvq_free(c);
    return rc;
}

// ---- layout, encode, decode

// How many of T tokens from position pos0 are sink tokens (position < sink): the first ones.
static int64_t sink_rows(const KvqCodec *c, int64_t T, int64_t pos0) {
    const int64_t ns = c->s.sink - pos0;
    return ns < 0 ? 0 : ns > T ? T : ns;
}

int kvq_layout(const KvqCodec *c, int64_t T, int64_t pos0, int64_t nnz, KvqLayout *L) {
    memset(L, 0, sizeof(*L));
    if (T < 0 || pos0 < 0 || nnz < 0 || nnz > (int64_t)UINT32_MAX) return -1;   // u32 pointers
    const int64_t ns = sink_rows(c, T, pos0);
    L->ns = ns;
    L->nq = T - ns;
    L->nnz = nnz;
    int64_t codebits, a, b, d, e;
    if (ck_mul(c->H, c->s.bits, &codebits)) return -1;
    L->row_bytes = (codebits + 7) / 8 + (c->part == KVQ_VALUES ? 4 * (c->H / kvq_value_group(&c->s, c->H)) : 0);
    L->sink_off = 0;
    if (ck_mul(ns, c->H, &a) || ck_mul(a, 2, &a)) return -1;
    L->dense_off = a;
    if (ck_mul(L->nq, L->row_bytes, &b) || ck_add(a, b, &L->ptr_off)) return -1;
    if (ck_mul(L->nq, 4, &d) || ck_add(L->ptr_off, d, &L->entry_off)) return -1;
    if (ck_mul(nnz, 4, &e) || ck_add(L->entry_off, e, &L->total)) return -1;
    return 0;
}

int kvq_count(const KvqCodec *c, const float *x, int64_t T, int64_t pos0, int64_t *nnz, char *err, size_t errlen) {
    int64_t n, bad;
    if (T < 0 || pos0 < 0 || ck_mul(T, c->H, &n)) {
        snprintf(err, errlen, "kvquant: %lld tokens at position %lld overflow the size arithmetic", (long long)T,
                 (long long)pos0);
        return -1;
    }
    if (qp_check_f16_range(x, n, &bad)) {
        snprintf(err, errlen, "kvquant: value %g at token %lld, channel %lld is not finite or beyond fp16's range "
                 "(|x| <= 65504)", (double)x[bad], (long long)(bad / c->H), (long long)(bad % c->H));
        return -1;
    }
    int64_t cnt = 0;
    for (int64_t t = sink_rows(c, T, pos0); t < T; t++) {
        if (c->part == KVQ_VALUES)
            cnt += 2 * kvq_value_outliers_per_side(&c->s, c->H) * (c->H / kvq_value_group(&c->s, c->H));
        else
            for (int64_t ch = 0; ch < c->H; ch++) cnt += key_outlier(c, x[t * c->H + ch], ch);
    }
    *nnz = cnt;
    return 0;
}

int64_t kvq_encode(const KvqCodec *c, const float *x, int64_t T, int64_t pos0, uint8_t *out, int64_t cap,
                   char *err, size_t errlen) {
    int64_t nnz;
    KvqLayout L;
    if (kvq_count(c, x, T, pos0, &nnz, err, errlen)) return -1;
    if (kvq_layout(c, T, pos0, nnz, &L)) {
        snprintf(err, errlen, "kvquant: %lld tokens overflow the size arithmetic", (long long)T);
        return -1;
    }
    if (L.total > cap) {
        snprintf(err, errlen, "kvquant: output buffer of %lld bytes, %lld needed", (long long)cap, (long long)L.total);
        return -1;
    }
    memset(out, 0, (size_t)L.total);
    const int64_t H = c->H;
    for (int64_t t = 0; t < L.ns; t++)
        for (int64_t ch = 0; ch < H; ch++) qp_put_u16(out + 2 * (t * H + ch), qp_f32_to_f16(x[t * H + ch]));
    const int64_t Gv = kvq_value_group(&c->s, H), ng = H / Gv, kout = kvq_value_outliers_per_side(&c->s, H);
    Elem *scratch = c->part == KVQ_VALUES ? xmalloc(sizeof(Elem) * (size_t)(2 * kout + 2)) : NULL;
    float mid[15];   // k <= 16
    for (int j = 0; j + 1 < c->k; j++) mid[j] = 0.5f * (c->lut[j] + c->lut[j + 1]);
    uint8_t *mask = xmalloc((size_t)H);
    int64_t e = 0;
    for (int64_t r = 0; r < L.nq; r++) {
        const float *v = x + (L.ns + r) * H;
        uint8_t *row = out + L.dense_off + r * L.row_bytes, *codes = row;
        if (c->part == KVQ_VALUES)   // the zero/range of every value group, in front of the codes
            for (int64_t g = 0; g < ng; g++) {
                uint16_t zh, rh;
                value_stats(kout, v + g * Gv, Gv, scratch, mask + g * Gv, &zh, &rh);
                qp_put_u16(row + 4 * g, zh);
                qp_put_u16(row + 4 * g + 2, rh);
                codes = row + 4 * ng;
            }
        float z = 0, rg = 0;
        for (int64_t ch = 0; ch < H; ch++) {
            if (c->part == KVQ_KEYS) {
                z = c->zero[ch];
                rg = c->range[ch];
                mask[ch] = (uint8_t)key_outlier(c, v[ch], ch);
            } else if (ch % Gv == 0) {   // a new value group: its zero and range
                z = qp_f16_to_f32(qp_get_u16(row + 4 * (ch / Gv)));
                rg = qp_f16_to_f32(qp_get_u16(row + 4 * (ch / Gv) + 2));
            }
            qp_put_code(codes, ch, c->s.bits, (unsigned)nearest_mid(mid, c->k, normalize(v[ch], z, rg)));
            if (mask[ch] && e < L.nnz) {   // (e < nnz always: kvq_count's pass decided nnz)
                uint8_t *p = out + L.entry_off + 4 * e++;
                qp_put_u16(p, (uint16_t)ch);
                qp_put_u16(p + 2, qp_f32_to_f16(v[ch]));
            }
        }
        qp_put_u32(out + L.ptr_off + 4 * r, (uint32_t)e);
    }
    free(scratch);
    free(mask);
    return L.total;
}

// Reads and checks the pointers: nondecreasing, the last one the entry count nbytes implies,
// channels in range. Fills *L.
static int check_stream(const KvqCodec *c, const uint8_t *in, int64_t nbytes, int64_t T, int64_t pos0,
                        KvqLayout *L, char *err, size_t errlen) {
    if (kvq_layout(c, T, pos0, 0, L) || nbytes < L->total || (nbytes - L->total) % 4) goto bad;
    const int64_t nnz = (nbytes - L->total) / 4;
    if (kvq_layout(c, T, pos0, nnz, L)) goto bad;
    uint32_t prev = 0;
    for (int64_t r = 0; r < L->nq; r++) {
        const uint32_t p = qp_get_u32(in + L->ptr_off + 4 * r);
        if (p < prev || p > (uint64_t)nnz) goto bad;
        prev = p;
    }
    if ((int64_t)prev != nnz) goto bad;
    for (int64_t i = 0; i < nnz; i++)
        if (qp_get_u16(in + L->entry_off + 4 * i) >= c->H) goto bad;
    return 0;
bad:
    snprintf(err, errlen, "kvquant: %lld bytes are not an encoding of %lld tokens of width %lld from position %lld",
             (long long)nbytes, (long long)T, (long long)c->H, (long long)pos0);
    return -1;
}

// The dense value of channel ch in dense row r (before outliers replace it).
static inline float dense_value(const KvqCodec *c, const uint8_t *row, int64_t ch) {
    float z, rg;
    const uint8_t *codes = row;
    if (c->part == KVQ_VALUES) {
        const int64_t Gv = kvq_value_group(&c->s, c->H), g = ch / Gv;
        z = qp_f16_to_f32(qp_get_u16(row + 4 * g));
        rg = qp_f16_to_f32(qp_get_u16(row + 4 * g + 2));
        codes = row + 4 * (c->H / Gv);
    } else {
        z = c->zero[ch];
        rg = c->range[ch];
    }
    return c->lut[qp_get_code(codes, ch, c->s.bits)] * rg + z;
}

// A whole dense row (before outliers replace some of it), each value group's zero and range
// read once: what dense_value gives channel by channel.
static void dense_row(const KvqCodec *c, const uint8_t *row, float *y) {
    const int bits = c->s.bits;
    if (c->part == KVQ_KEYS) {
        for (int64_t ch = 0; ch < c->H; ch++) y[ch] = c->lut[qp_get_code(row, ch, bits)] * c->range[ch] + c->zero[ch];
        return;
    }
    const int64_t Gv = kvq_value_group(&c->s, c->H), ng = c->H / Gv;
    const uint8_t *codes = row + 4 * ng;
    for (int64_t g = 0; g < ng; g++) {
        const float z = qp_f16_to_f32(qp_get_u16(row + 4 * g)), rg = qp_f16_to_f32(qp_get_u16(row + 4 * g + 2));
        for (int64_t ch = g * Gv; ch < (g + 1) * Gv; ch++) y[ch] = c->lut[qp_get_code(codes, ch, bits)] * rg + z;
    }
}

int kvq_decode(const KvqCodec *c, const uint8_t *in, int64_t nbytes, int64_t T, int64_t pos0, float *x,
               char *err, size_t errlen) {
    KvqLayout L;
    if (check_stream(c, in, nbytes, T, pos0, &L, err, errlen)) return -1;
    const int64_t H = c->H;
    for (int64_t i = 0; i < L.ns * H; i++) x[i] = qp_f16_to_f32(qp_get_u16(in + 2 * i));
    uint32_t e0 = 0;
    for (int64_t r = 0; r < L.nq; r++) {
        float *y = x + (L.ns + r) * H;
        const uint8_t *row = in + L.dense_off + r * L.row_bytes;
        dense_row(c, row, y);
        const uint32_t e1 = qp_get_u32(in + L.ptr_off + 4 * r);
        for (uint32_t e = e0; e < e1; e++) {   // outliers replace the dense value
            const uint8_t *p = in + L.entry_off + 4 * (int64_t)e;
            y[qp_get_u16(p)] = qp_f16_to_f32(qp_get_u16(p + 2));
        }
        e0 = e1;
    }
    return 0;
}

int kvq_scores(const KvqCodec *c, const uint8_t *in, int64_t nbytes, int64_t T, int64_t pos0, const float *q_rot,
               int n_q_heads, int n_kv_heads, int d_head, float theta, float *out, char *err, size_t errlen) {
    KvqLayout L;
    if (c->part != KVQ_KEYS || n_kv_heads < 1 || n_q_heads < 1 || d_head < 2 || d_head % 2 || n_q_heads % n_kv_heads
        || (int64_t)n_kv_heads * d_head != c->H) {
        snprintf(err, errlen, "kvquant: scores need a key codec of width n_kv_heads x d_head (even d_head) and "
                 "n_q_heads a multiple of n_kv_heads; got %d x %d for width %lld, %d query heads",
                 n_kv_heads, d_head, (long long)c->H, n_q_heads);
        return -1;
    }
    if (check_stream(c, in, nbytes, T, pos0, &L, err, errlen)) return -1;
    const int half = d_head / 2, rep = n_q_heads / n_kv_heads;
    float *cs = xmalloc(sizeof(float) * (size_t)d_head);   // cos[i], sin[i] of this token, i < half
    uint32_t e0 = 0;
    for (int64_t t = 0; t < T; t++) {
        const double pos = (double)(pos0 + t);
        // the angles exactly as layers/cpu_rope.c forms them
        for (int i = 0; i < half; i++) {
            const double a = pos * pow((double)theta, -2.0 * i / d_head);
            cs[i] = (float)cos(a);
            cs[half + i] = (float)sin(a);
        }
        const int sink = t < L.ns;
        const uint8_t *row = sink ? in + 2 * t * c->H : in + L.dense_off + (t - L.ns) * L.row_bytes;
        for (int h = 0; h < n_q_heads; h++) {
            const int64_t base = (int64_t)(h / rep) * d_head;
            const float *q = q_rot + (int64_t)h * d_head;
            double acc = 0;
            for (int i = 0; i < half; i++) {   // the pair (i, i + d/2) decoded, rotated, dotted
                float k0, k1;
                if (sink) {
                    k0 = qp_f16_to_f32(qp_get_u16(row + 2 * (base + i)));
                    k1 = qp_f16_to_f32(qp_get_u16(row + 2 * (base + i + half)));
                } else {
                    k0 = dense_value(c, row, base + i);
                    k1 = dense_value(c, row, base + i + half);
                }
                const float co = cs[i], si = cs[half + i];
                acc += (double)q[i] * (k0 * co - k1 * si) + (double)q[i + half] * (k1 * co + k0 * si);
            }
            out[t * n_q_heads + h] = (float)acc;
        }
        if (sink) continue;
        // sparse outliers: channel j of its head adds delta (cos q[j] + sgn sin q[(j + d/2) mod d]),
        // delta = the exact value minus the dense value it replaces
        const uint32_t e1 = qp_get_u32(in + L.ptr_off + 4 * (t - L.ns));
        for (uint32_t e = e0; e < e1; e++) {
            const uint8_t *p = in + L.entry_off + 4 * (int64_t)e;
            const int64_t ch = qp_get_u16(p);
            const float delta = qp_f16_to_f32(qp_get_u16(p + 2)) - dense_value(c, row, ch);
            const int kvh = (int)(ch / d_head), j = (int)(ch % d_head), i = j % half;
            const float sgn = j < half ? 1.0f : -1.0f;
            for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
                const float *q = q_rot + (int64_t)h * d_head;
                out[t * n_q_heads + h] += delta * (cs[i] * q[j] + sgn * cs[half + i] * q[(j + half) % d_head]);
            }
        }
        e0 = e1;
    }
    free(cs);
    return 0;
}

void kvq_rope_rows(float *x, int64_t T, int n_heads, int d_head, int64_t pos0, float theta, int sign) {
    const int half = d_head / 2;
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)(pos0 + t) * pow((double)theta, -2.0 * i / d_head);
            const float co = (float)cos(a), si = sign * (float)sin(a);
            for (int h = 0; h < n_heads; h++) {
                float *p = x + (size_t)t * n_heads * d_head + (size_t)h * d_head;
                const float x0 = p[i], x1 = p[i + half];
                p[i] = x0 * co - x1 * si;
                p[i + half] = x1 * co + x0 * si;
            }
        }
}

// ---- mixed precision (App. P)

int kvq_sensitivity(const KvqCodec *c, const float *x, const float *fisher, int64_t N, int64_t seq_len,
                    double *omega, char *err, size_t errlen) {
    int64_t n;
    if (N < 1 || seq_len < 1 || N % seq_len || ck_mul(seq_len, c->H, &n)) {
        snprintf(err, errlen, "kvquant: %lld tokens are not whole sequences of %lld", (long long)N, (long long)seq_len);
        return -1;
    }
    float *y = xmalloc(sizeof(float) * (size_t)n);
    double om = 0;
    int rc = 0;
    for (int64_t q = 0; q < N / seq_len && !rc; q++) {
        const float *xs = x + q * n, *fs = fisher + q * n;
        int64_t nnz;
        KvqLayout L;
        if (kvq_count(c, xs, seq_len, 0, &nnz, err, errlen) || kvq_layout(c, seq_len, 0, nnz, &L)) {
            rc = -1;
            break;
        }
        uint8_t *buf = xmalloc((size_t)L.total);
        if (kvq_encode(c, xs, seq_len, 0, buf, L.total, err, errlen) != L.total
            || kvq_decode(c, buf, L.total, seq_len, 0, y, err, errlen)) rc = -1;
        for (int64_t i = 0; i < n && !rc; i++) om += (double)fs[i] * ((double)xs[i] - y[i]) * ((double)xs[i] - y[i]);
        free(buf);
    }
    free(y);
    if (!rc) *omega = om;
    return rc;
}

int kvq_mixed_precision(const double *omega, int n_layers, int n_low, int *low) {
    if (n_layers < 0 || n_low < 0 || n_low > n_layers) return -1;
    for (int l = 0; l < n_layers; l++) low[l] = 0;
    for (int k = 0; k < n_low; k++) {   // n_low picks of the smallest remaining (n_layers is small)
        int best = -1;
        for (int l = 0; l < n_layers; l++)
            if (!low[l] && (best < 0 || omega[l] < omega[best])) best = l;
        low[best] = 1;
    }
    return 0;
}

// ---- bits

double kvq_bits_stored(const KvqCodec *c, int64_t T, int64_t pos0, int64_t nnz) {
    KvqLayout L;
    if (T <= 0 || kvq_layout(c, T, pos0, nnz, &L)) return 0;
    const double tables = 16.0 * c->k + (c->part == KVQ_KEYS ? 32.0 * (double)c->H : 0);
    return (8.0 * (double)L.total + tables) / ((double)T * (double)c->H);
}

double kvq_bits_paper(const KvqSettings *s, KvqPart part, int64_t H) {
    return s->bits + 32.0 * s->outliers + (part == KVQ_VALUES ? 32.0 / (double)kvq_value_group(s, H) : 0);
}

double kvq_paper_cache_bytes(const KvqSettings *s, int64_t L, int64_t H, int64_t T) {
    const double elems = (double)L * (double)H * (double)T;
    return elems * (kvq_bits_paper(s, KVQ_KEYS, H) + kvq_bits_paper(s, KVQ_VALUES, H)) / 8;
}
