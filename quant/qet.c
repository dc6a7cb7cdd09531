// QET, quantum entanglement trees: see quant/qet.h and docs/QUANTIZERS.md "QET".
#include "quant/qet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"
#include "quant/bitpack.h"
#include "quant/fp16.h"
#include "quant/kmeans.h"

QetSettings qet_settings_default(int dim) {
    QetSettings s = {.dim = dim, .levels = 3, .width = 8, .stages = 2, .in_bits = 16, .cb_bits = 10,
                     .theta = 4, .share = {0.7, 0.3}, .iters = 20, .init = KMEANS_INIT_POINTS, .seed = 123};
    return s;
}

int qet_settings_check(const QetSettings *s, char *err, size_t errlen) {
    if (s->dim < 1 || s->dim > QET_MAX_DIM) {
        snprintf(err, errlen, "qet: dim=%d: expected a row width in 1..%d", s->dim, QET_MAX_DIM);
        return -1;
    }
    if (s->levels < 0 || s->levels > 12 || s->dim % (1 << s->levels) != 0) {
        snprintf(err, errlen, "qet: levels=%d: 2^levels must divide dim=%d: choose levels in 0..%d",
                 s->levels, s->dim, __builtin_ctz((unsigned)s->dim));
        return -1;
    }
    if (s->width < 1 || s->dim % s->width != 0) {
        snprintf(err, errlen, "qet: width=%d does not divide dim=%d: choose a divisor (paper: 8)", s->width, s->dim);
        return -1;
    }
    if (s->stages < 1 || s->stages > QET_MAX_STAGES) {
        snprintf(err, errlen, "qet: stages=%d: expected 1..%d (paper: 2)", s->stages, QET_MAX_STAGES);
        return -1;
    }
    if (s->in_bits != 16 && s->in_bits != 32) {
        snprintf(err, errlen, "qet: in_bits=%d: expected 16 (fp16 cache) or 32", s->in_bits);
        return -1;
    }
    if (s->cb_bits < 0 || s->cb_bits > 16) {
        snprintf(err, errlen, "qet: cb_bits=%d: expected 1..16 codebook bits, or 0 for no codebook quantization (paper: 10)", s->cb_bits);
        return -1;
    }
    if (s->iters < 1 || s->iters > 100000) {
        snprintf(err, errlen, "qet: iters=%d: expected 1..100000 k-means iterations (paper: 20)", s->iters);
        return -1;
    }
    if (s->init != KMEANS_INIT_POINTS && s->init != KMEANS_INIT_PLUSPLUS) {
        snprintf(err, errlen, "qet: init=%d: expected %d (random points, paper) or %d (k-means++)", s->init,
                 KMEANS_INIT_POINTS, KMEANS_INIT_PLUSPLUS);
        return -1;
    }
    if (s->theta == 0) {
        for (int i = 0; i < s->stages; i++)
            if (s->k[i] < 1 || s->k[i] > 65536) {
                snprintf(err, errlen, "qet: k[%d]=%d: with theta=0 every stage needs 1..65536 centroids", i, s->k[i]);
                return -1;
            }
        return 0;
    }
    if (!(s->theta >= 1 && s->theta <= 1024)) {
        snprintf(err, errlen, "qet: theta=%g: expected a compression ratio in 1..1024, or 0 with k[] given", s->theta);
        return -1;
    }
    double total = 0;
    for (int i = 0; i < s->stages; i++) {
        if (!(s->share[i] > 0 && s->share[i] <= 1)) {
            snprintf(err, errlen, "qet: share[%d]=%g: every stage needs a share of the budget in (0, 1]", i, s->share[i]);
            return -1;
        }
        total += s->share[i];
    }
    if (total > 1 + 1e-9) {
        snprintf(err, errlen, "qet: stage shares sum to %g: they split one budget, so at most 1", total);
        return -1;
    }
    double left = (double)s->in_bits / s->theta - 0.5 * s->levels;
    if (left <= 0) {
        snprintf(err, errlen, "qet: theta=%g gives %g bits per element, all taken by the %g bits of %d swap levels: lower theta or levels",
                 s->theta, (double)s->in_bits / s->theta, 0.5 * s->levels, s->levels);
        return -1;
    }
    return 0;
}

static int stage_value_bits(const QetSettings *s) { return s->cb_bits ? s->cb_bits : s->in_bits; }

// Codebook bits of one stage with K entries, the paper's count (no padding).
static double stage_codebook_bits(const QetSettings *s, int64_t k) {
    return (double)k * s->dim * stage_value_bits(s) + (s->cb_bits ? 2.0 * s->in_bits : 0);
}

int qet_choose_k(const QetSettings *s, int64_t n, int stage) {
    int m = s->dim / s->width;
    // The flags of stage 1 are taken off the whole budget before it is shared (paper B3).
    double budget = ((double)n * s->dim * s->in_bits / s->theta - 0.5 * (double)n * s->dim * s->levels) * s->share[stage];
    int64_t lo = 0, hi = n < 65536 ? n : 65536;   // invariant: cost(lo) fits (lo = 0: nothing yet)
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        double cost = stage_codebook_bits(s, mid) + (double)n * m * bits_for(mid);
        if (cost <= budget) lo = mid;
        else hi = mid - 1;
    }
    return (int)lo;
}

void qet_swap_row(const float *x, int dim, int levels, float *xs, uint8_t *flags) {
    float in[QET_MAX_DIM];
    memcpy(xs, x, sizeof(float) * dim);
    for (int k = 1; k <= levels; k++) {
        memcpy(in, xs, sizeof(float) * dim);
        int w = dim >> (k - 1), half = w / 2;
        for (int b0 = 0; b0 < dim; b0 += w)
            for (int t = 0; t < half; t++) {
                float left = in[b0 + 2 * t], right = in[b0 + 2 * t + 1];
                int flag = left < right;              // ties and NaN: 0 (the reference code's rule)
                xs[b0 + t] = flag ? left : right;     // S: the smaller (the left one on a tie)
                xs[b0 + half + t] = flag ? right : left;
                if (flags) flags[(int64_t)(k - 1) * (dim / 2) + b0 / 2 + t] = (uint8_t)flag;
            }
    }
}

void qet_unswap_row(const float *xs, int dim, int levels, const uint8_t *flags, float *x) {
    float tmp[QET_MAX_DIM];
    memcpy(x, xs, sizeof(float) * dim);
    for (int k = levels; k >= 1; k--) {               // the deepest level first
        memcpy(tmp, x, sizeof(float) * dim);
        int w = dim >> (k - 1), half = w / 2;
        for (int b0 = 0; b0 < dim; b0 += w)
            for (int t = 0; t < half; t++) {
                float S = tmp[b0 + t], L = tmp[b0 + half + t];
                int flag = flags[(int64_t)(k - 1) * (dim / 2) + b0 / 2 + t];
                x[b0 + 2 * t] = flag ? S : L;
                x[b0 + 2 * t + 1] = flag ? L : S;
            }
    }
}

// Rounding to the stored precision of the CQO minimum and step, downwards or upwards, so that
// [min, min + (2^a' - 1) step] still covers every codebook value after rounding.
static float round_dir(float v, int in_bits, int up) {
    if (in_bits == 32) return v;
    uint16_t u = fp16_from_float(v);
    float f = fp16_to_float(u);
    if (up && f < v) u = (u & 0x8000u) ? (u == 0x8000u ? 0x0001u : (uint16_t)(u - 1)) : (uint16_t)(u + 1);
    if (!up && f > v) u = (u & 0x8000u) ? (uint16_t)(u + 1) : (u == 0 ? 0x8001u : (uint16_t)(u - 1));
    return fp16_to_float(u);
}

// CQO (paper's codebook quantization): one global minimum and step over the stage's codebook,
// q = round((c - min) / step) on a' bits; the codebook is replaced by its dequantized values.
static void quantize_codebook(const QetSettings *s, QetStage *g, int64_t nval) {
    float *c = g->codebook;
    if (!s->cb_bits) {
        if (s->in_bits == 16)
            for (int64_t i = 0; i < nval; i++) c[i] = fp16_round(c[i]);
        return;
    }
    float lo = c[0], hi = c[0];
    for (int64_t i = 1; i < nval; i++) { lo = fminf(lo, c[i]); hi = fmaxf(hi, c[i]); }
    int64_t qmax = ((int64_t)1 << s->cb_bits) - 1;
    g->cb_min = round_dir(lo, s->in_bits, 0);
    double step = ((double)hi - g->cb_min) / (double)qmax;
    float fstep = (float)step;
    if ((double)fstep < step) fstep = nextafterf(fstep, INFINITY);
    g->cb_step = round_dir(fstep, s->in_bits, 1);
    g->cb_q = xmalloc(sizeof(uint16_t) * (size_t)nval);
    for (int64_t i = 0; i < nval; i++) {
        double q = g->cb_step > 0 ? nearbyint(((double)c[i] - g->cb_min) / g->cb_step) : 0;
        if (q < 0) q = 0;
        if (q > qmax) q = (double)qmax;
        g->cb_q[i] = (uint16_t)q;
        c[i] = (float)((double)g->cb_min + q * (double)g->cb_step);
    }
}

// The stage's reconstruction of one (already permuted, for stage 1) row: codes[m] and rec[dim].
static void stage_row(const QetState *st, int stage, const float *row, int *codes, float *rec) {
    const QetStage *g = &st->st[stage];
    int w = st->s.width;
    for (int i = 0; i < st->m; i++) {
        const float *cb = g->codebook + (int64_t)i * g->k * w;
        codes[i] = kmeans_nearest(cb, g->k, w, row + i * w, NULL);
        memcpy(rec + i * w, cb + (int64_t)codes[i] * w, sizeof(float) * w);
    }
}

// Encodes one row: flags and codes into out (the caller clears it). Each residual stage codes
// what the stages before it left: x minus their reconstruction.
static void encode_row(const QetState *st, const float *x, uint8_t *out) {
    const QetSettings *s = &st->s;
    int d = s->dim, m = st->m;
    float xs[QET_MAX_DIM], rec[QET_MAX_DIM], back[QET_MAX_DIM], resid[QET_MAX_DIM];
    uint8_t flags[QET_MAX_DIM / 2 * 12];
    int codes[QET_MAX_DIM];
    int64_t pos = 0;
    qet_swap_row(x, d, s->levels, xs, flags);
    for (int64_t f = 0; f < (int64_t)s->levels * d / 2; f++) bits_put(out, pos++, 1, flags[f]);
    for (int stage = 0; stage < s->stages; stage++) {
        const QetStage *g = &st->st[stage];
        if (stage == 0) {
            stage_row(st, 0, xs, codes, rec);
            qet_unswap_row(rec, d, s->levels, flags, back);
            for (int j = 0; j < d; j++) resid[j] = x[j] - back[j];
        } else {
            stage_row(st, stage, resid, codes, rec);
            for (int j = 0; j < d; j++) resid[j] -= rec[j];
        }
        for (int i = 0; i < m; i++) { bits_put(out, pos, g->code_bits, (uint32_t)codes[i]); pos += g->code_bits; }
    }
}

static void decode_row(const QetState *st, const uint8_t *in, float *x) {
    const QetSettings *s = &st->s;
    int d = s->dim, w = s->width;
    float rec[QET_MAX_DIM];
    uint8_t flags[QET_MAX_DIM / 2 * 12];
    int64_t pos = 0;
    for (int64_t f = 0; f < (int64_t)s->levels * d / 2; f++) flags[f] = (uint8_t)bits_get(in, pos++, 1);
    for (int stage = 0; stage < s->stages; stage++) {
        const QetStage *g = &st->st[stage];
        for (int i = 0; i < st->m; i++) {
            int code = (int)bits_get(in, pos, g->code_bits);
            pos += g->code_bits;
            if (code >= g->k) code = g->k - 1;      // a damaged record must not read past the codebook
            memcpy(rec + i * w, g->codebook + ((int64_t)i * g->k + code) * w, sizeof(float) * w);
        }
        if (stage == 0) qet_unswap_row(rec, d, s->levels, flags, x);
        else
            for (int j = 0; j < d; j++) x[j] += rec[j];
    }
}

int qet_fit(QetState *st, const QetSettings *s, const float *x, int64_t n, char *err, size_t errlen) {
    memset(st, 0, sizeof(*st));
    if (qet_settings_check(s, err, errlen)) return -1;
    st->s = *s;
    st->m = s->dim / s->width;
    int d = s->dim, w = s->width, m = st->m;
    int64_t nel, nflag, fstride = (int64_t)s->levels * d / 2 + 1;
    if (n < 1 || ck_mul(n, d, &nel) || ck_mul(n, fstride, &nflag)) {
        snprintf(err, errlen, "qet: %lld rows of %d columns: expected at least one row and a size that fits", (long long)n, d);
        return -1;
    }
    for (int64_t i = 0; i < nel; i++)
        if (!isfinite(x[i])) {
            snprintf(err, errlen, "qet: value %lld (row %lld) is not finite: clean the input rows", (long long)i, (long long)(i / d));
            return -1;
        }
    for (int i = 0; i < s->stages; i++) {
        int k = s->theta ? qet_choose_k(s, n, i) : s->k[i];
        if (k < 1) {
            snprintf(err, errlen, "qet: stage %d: theta=%g leaves no room for a codebook over %lld rows: lower theta or give more rows",
                     i + 1, s->theta, (long long)n);
            return -1;
        }
        if (k > n) {
            snprintf(err, errlen, "qet: stage %d: %lld rows for a codebook of %d centroids: give at least %d rows or fewer centroids",
                     i + 1, (long long)n, k, k);
            return -1;
        }
        st->st[i].k = k;
        st->st[i].code_bits = bits_for(k);
    }
    // Stage 1 fits the permuted rows, every later stage the residual of the stages before it.
    float *cur = xmalloc(sizeof(float) * (size_t)nel), *rec = xmalloc(sizeof(float) * (size_t)nel);
    uint8_t *flags = xmalloc((size_t)nflag);
    for (int64_t r = 0; r < n; r++) qet_swap_row(x + r * d, d, s->levels, cur + r * d, flags + r * fstride);
    for (int stage = 0; stage < s->stages; stage++) {
        QetStage *g = &st->st[stage];
        int64_t nval = (int64_t)m * g->k * w;
        g->codebook = xmalloc(sizeof(float) * (size_t)nval);
        for (int i = 0; i < m; i++)
            kmeans_fit(cur + i * w, n, w, d, NULL, g->k, s->iters, s->init,
                       s->seed + (uint64_t)(stage * m + i), g->codebook + (int64_t)i * g->k * w, NULL, NULL);
        quantize_codebook(s, g, nval);
        // stored in fp16 (in_bits 16), a codebook, its CQO minimum or step past 65504 becomes
        // infinite and decodes to NaN: refused here, before anything is written
        int finite = (!s->cb_bits || (isfinite(g->cb_min) && isfinite(g->cb_step)));
        for (int64_t i = 0; i < nval && finite; i++) finite = isfinite(g->codebook[i]);
        if (!finite) {
            snprintf(err, errlen, "qet: stage %d's codebook reaches beyond the %s range (|x| > %s): scale the activations "
                     "or use in_bits=32", stage + 1, s->in_bits == 16 ? "fp16" : "fp32", s->in_bits == 16 ? "65504" : "3.4e38");
            free(cur); free(rec); free(flags);
            qet_free(st);
            return -1;
        }
        int codes[QET_MAX_DIM];
        for (int64_t r = 0; r < n; r++) stage_row(st, stage, cur + r * d, codes, rec + r * d);
        if (stage == 0) {
            float back[QET_MAX_DIM];
            for (int64_t r = 0; r < n; r++) {
                qet_unswap_row(rec + r * d, d, s->levels, flags + r * fstride, back);
                for (int j = 0; j < d; j++) cur[r * d + j] = x[r * d + j] - back[j];
            }
        } else {
            for (int64_t i = 0; i < nel; i++) cur[i] -= rec[i];
        }
    }
    free(cur); free(rec); free(flags);
    return 0;
}

void qet_free(QetState *st) {
    for (int i = 0; i < QET_MAX_STAGES; i++) { free(st->st[i].codebook); free(st->st[i].cb_q); }
    memset(st, 0, sizeof(*st));
}

static int64_t row_bits(const QetState *st) {
    int64_t b = (int64_t)st->s.levels * st->s.dim / 2;
    for (int i = 0; i < st->s.stages; i++) b += (int64_t)st->m * st->st[i].code_bits;
    return b;
}

int64_t qet_bytes_per_row(const QetState *st) { return (row_bits(st) + 7) / 8; }

int64_t qet_bytes_per_row_for(const QetSettings *s, const int *k) {
    QetState st;
    memset(&st, 0, sizeof(st));
    st.s = *s;
    st.m = s->dim / s->width;
    for (int i = 0; i < s->stages; i++) st.st[i].code_bits = bits_for(k[i]);
    return qet_bytes_per_row(&st);
}

int64_t qet_encode(const QetState *st, const float *x, int64_t n, uint8_t *out) {
    int64_t bpr = qet_bytes_per_row(st), total;
    if (ck_mul(n, bpr, &total)) return -1;
    memset(out, 0, (size_t)total);
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; r++) encode_row(st, x + r * st->s.dim, out + r * bpr);
    return total;
}

void qet_decode(const QetState *st, const uint8_t *codes, int64_t n, float *x) {
    int64_t bpr = qet_bytes_per_row(st);
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; r++) decode_row(st, codes + r * bpr, x + r * st->s.dim);
}

static int64_t stage_codebook_bytes(const QetSettings *s, int64_t k) {
    int64_t vals = k * s->dim;
    if (s->cb_bits) return 2 * (s->in_bits / 8) + (vals * s->cb_bits + 7) / 8;
    return vals * (s->in_bits / 8);
}

int64_t qet_codebook_bytes(const QetState *st) {
    int64_t b = 0;
    for (int i = 0; i < st->s.stages; i++) b += stage_codebook_bytes(&st->s, st->st[i].k);
    return b;
}

static uint8_t *put_value(uint8_t *p, float v, int in_bits) {
    if (in_bits == 16) {
        uint16_t h = fp16_from_float(v);
        p[0] = (uint8_t)(h & 0xff); p[1] = (uint8_t)(h >> 8);
        return p + 2;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
    return p + 4;
}

void qet_codebook_write(const QetState *st, uint8_t *out) {
    const QetSettings *s = &st->s;
    uint8_t *p = out;
    for (int i = 0; i < s->stages; i++) {
        const QetStage *g = &st->st[i];
        int64_t vals = (int64_t)g->k * s->dim, nb = stage_codebook_bytes(s, g->k);
        if (s->cb_bits) {
            p = put_value(p, g->cb_min, s->in_bits);
            p = put_value(p, g->cb_step, s->in_bits);
            int64_t body = nb - 2 * (s->in_bits / 8);
            memset(p, 0, (size_t)body);
            for (int64_t v = 0; v < vals; v++) bits_put(p, v * s->cb_bits, s->cb_bits, g->cb_q[v]);
            p += body;
        } else {
            for (int64_t v = 0; v < vals; v++) p = put_value(p, g->codebook[v], s->in_bits);
        }
    }
}

static const uint8_t *get_value(const uint8_t *p, float *v, int in_bits) {
    if (in_bits == 16) {
        *v = fp16_to_float((uint16_t)(p[0] | p[1] << 8));
        return p + 2;
    }
    uint32_t u = 0;
    for (int i = 0; i < 4; i++) u |= (uint32_t)p[i] << (8 * i);
    memcpy(v, &u, 4);
    return p + 4;
}

int qet_codebook_read(QetState *st, const QetSettings *s, const int *k, const uint8_t *buf,
                      int64_t nbytes, char *err, size_t errlen) {
    memset(st, 0, sizeof(*st));
    if (qet_settings_check(s, err, errlen)) return -1;
    st->s = *s;
    st->m = s->dim / s->width;
    int64_t want = 0;
    for (int i = 0; i < s->stages; i++) {
        if (k[i] < 1 || k[i] > 65536) {
            snprintf(err, errlen, "qet: stage %d has K=%d: expected 1..65536 centroids", i + 1, k[i]);
            return -1;
        }
        st->st[i].k = k[i];
        st->st[i].code_bits = bits_for(k[i]);
        want += stage_codebook_bytes(s, k[i]);
    }
    if (nbytes != want) {
        snprintf(err, errlen, "qet: codebook of %lld bytes where these settings and K store %lld: the codec tensor does not match its settings",
                 (long long)nbytes, (long long)want);
        return -1;
    }
    const uint8_t *p = buf;
    for (int i = 0; i < s->stages; i++) {
        QetStage *g = &st->st[i];
        int64_t vals = (int64_t)g->k * s->dim;
        g->codebook = xmalloc(sizeof(float) * (size_t)vals);
        if (s->cb_bits) {
            p = get_value(p, &g->cb_min, s->in_bits);
            p = get_value(p, &g->cb_step, s->in_bits);
            g->cb_q = xmalloc(sizeof(uint16_t) * (size_t)vals);
            for (int64_t v = 0; v < vals; v++) {
                g->cb_q[v] = (uint16_t)bits_get(p, v * s->cb_bits, s->cb_bits);
                g->codebook[v] = (float)((double)g->cb_min + g->cb_q[v] * (double)g->cb_step);
            }
            p += (vals * s->cb_bits + 7) / 8;
        } else {
            for (int64_t v = 0; v < vals; v++) p = get_value(p, &g->codebook[v], s->in_bits);
        }
        for (int64_t v = 0; v < vals; v++)
            if (!isfinite(g->codebook[v]) || (s->cb_bits && !(isfinite(g->cb_min) && isfinite(g->cb_step) && g->cb_step >= 0))) {
                snprintf(err, errlen, "qet: stage %d codebook value %lld is not finite: the codec tensor is damaged", i + 1, (long long)v);
                qet_free(st);
                return -1;
            }
    }
    return 0;
}

double qet_bits_everything(const QetState *st, int64_t rows) {
    double bits = 8.0 * (double)qet_bytes_per_row(st) * (double)rows + 8.0 * (double)qet_codebook_bytes(st);
    return bits / ((double)rows * st->s.dim);
}

double qet_bits_paper(const QetState *st, int64_t rows) {
    const QetSettings *s = &st->s;
    double bits = 0.5 * (double)rows * s->dim * s->levels;
    for (int i = 0; i < s->stages; i++)
        bits += stage_codebook_bits(s, st->st[i].k) + (double)rows * st->m * st->st[i].code_bits;
    return bits / ((double)rows * s->dim);
}
