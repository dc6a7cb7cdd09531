// QJL keys, per-token values, the head cache and the bits accounting (quant/qjl.h).
#include "quant/qjl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/rng.h"
#include "common/util.h"
#include "quant/qpack.h"

static int fail(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *msg, size_t cap, const char *fmt, ...) {
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// ---- fp16 (IEEE binary16) as its 16 bits: norms, value mins and scales, the buffers. The
// conversions and the packing helpers are quant/qpack.h's, shared by the quantizers.

// A double to fp16 with one rounding: the double goes to float rounded to odd (an inexact result
// keeps its last bit set), which has bits enough (24 > 11 + 1) that the float-to-fp16 rounding
// then equals rounding the double directly (no double-rounding error at fp16 midpoints).
static uint16_t f16_from_f64(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((double)f != x && !(u & 1) && isfinite(f)) f = nextafterf(f, (double)f < x ? INFINITY : -INFINITY);
    return qp_f32_to_f16(f);
}
static int f16_finite(uint16_t h) { return ((h >> 10) & 31) != 31; }

// ---- settings

QjlSettings qjl_settings_default(int head_dim) {
    QjlSettings s = {0};
    s.head_dim = head_dim;
    s.proj_dim = 256;
    s.outlier_count = 8;
    s.outlier_proj_dim = 256;
    s.group_tokens = 32;
    s.buffer_tokens = 128;
    s.value_bits = 2;
    s.value_group = head_dim > 0 && head_dim % 32 == 0 ? 32 : head_dim;
    s.proj_kind = QJL_PROJ_ORTHO;
    s.outlier_independent = 0;
    s.seed = 42;
    return s;
}

int qjl_settings_set(QjlSettings *s, const char *key, const char *value, char *msg, size_t cap) {
    if (!strcmp(key, "proj")) {
        if (!strcmp(value, "ortho")) s->proj_kind = QJL_PROJ_ORTHO;
        else if (!strcmp(value, "gaussian")) s->proj_kind = QJL_PROJ_GAUSSIAN;
        else if (!strcmp(value, "chi")) s->proj_kind = QJL_PROJ_ORTHO_CHI;
        else return fail(msg, cap, "qjl: proj=%s: expected ortho, gaussian or chi", value);
        return 0;
    }
    if (!strcmp(key, "outliers")) {
        if (!strcmp(value, "shared")) s->outlier_independent = 0;
        else if (!strcmp(value, "independent")) s->outlier_independent = 1;
        else return fail(msg, cap, "qjl: outliers=%s: expected shared or independent", value);
        return 0;
    }
    if (!strcmp(key, "seed")) {
        uint64_t v;
        if (num_parse_u64(value, UINT64_MAX, &v) != NUM_OK)
            return fail(msg, cap, "qjl: seed=%s: expected a whole number in 0..%llu", value, (unsigned long long)UINT64_MAX);
        s->seed = v;
        return 0;
    }
    static const char *const names[] = {"d", "m", "o", "mo", "group", "buffer", "vbits", "vgroup"};
    int *const fields[] = {&s->head_dim, &s->proj_dim, &s->outlier_count, &s->outlier_proj_dim,
                           &s->group_tokens, &s->buffer_tokens, &s->value_bits, &s->value_group};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(key, names[i])) continue;
        int64_t v;
        if (num_parse_i64(value, 0, 1 << 30, &v) != NUM_OK)
            return fail(msg, cap, "qjl: %s=%s: expected a whole number in 0..%d", key, value, 1 << 30);
        *fields[i] = (int)v;
        return 0;
    }
    return fail(msg, cap, "qjl: unknown setting '%s': expected d, m, o, mo, group, buffer, vbits, vgroup, proj, outliers or seed", key);
}

int qjl_settings_check(const QjlSettings *s, char *msg, size_t cap) {
    const int d = s->head_dim;
    if (d < 1 || d > 4096) return fail(msg, cap, "qjl: head dimension %d: expected 1..4096", d);
    if (s->proj_dim < 8 || s->proj_dim > 65536 || s->proj_dim % 8)
        return fail(msg, cap, "qjl: m=%d: the projection dimension must be a multiple of 8 in 8..65536", s->proj_dim);
    if (s->outlier_count < 0 || s->outlier_count >= d)
        return fail(msg, cap, "qjl: o=%d: the outlier channel count must be in 0..%d (below the head dimension)", s->outlier_count, d - 1);
    if (s->outlier_proj_dim < 0 || s->outlier_proj_dim > 65536 || s->outlier_proj_dim % 8)
        return fail(msg, cap, "qjl: mo=%d: the outlier projection dimension must be a multiple of 8 in 0..65536", s->outlier_proj_dim);
    if ((s->outlier_count == 0) != (s->outlier_proj_dim == 0))
        return fail(msg, cap, "qjl: o=%d with mo=%d: set mo to 0 exactly when o is 0", s->outlier_count, s->outlier_proj_dim);
    if (s->outlier_independent != 0 && s->outlier_independent != 1)
        return fail(msg, cap, "qjl: outliers=%d: expected 0 (shared) or 1 (independent)", s->outlier_independent);
    if (!s->outlier_independent && s->outlier_proj_dim > s->proj_dim)
        return fail(msg, cap, "qjl: mo=%d exceeds m=%d: the shared outlier projection uses the first mo rows of S; lower mo or use outliers=independent",
                    s->outlier_proj_dim, s->proj_dim);
    if (s->group_tokens < 1 || s->group_tokens > 65536)
        return fail(msg, cap, "qjl: group=%d: the key token group must be in 1..65536", s->group_tokens);
    if (s->buffer_tokens < s->group_tokens || s->buffer_tokens > (1 << 20) || s->buffer_tokens % s->group_tokens)
        return fail(msg, cap, "qjl: buffer=%d: the full-precision buffer must be a multiple of group=%d, at most %d",
                    s->buffer_tokens, s->group_tokens, 1 << 20);
    if (s->value_bits < 1 || s->value_bits > 8)
        return fail(msg, cap, "qjl: vbits=%d: value bits must be in 1..8", s->value_bits);
    if (s->value_group < 1 || s->value_group > d || d % s->value_group)
        return fail(msg, cap, "qjl: vgroup=%d: the value channel group must divide the head dimension %d", s->value_group, d);
    if (s->proj_kind != QJL_PROJ_ORTHO && s->proj_kind != QJL_PROJ_GAUSSIAN && s->proj_kind != QJL_PROJ_ORTHO_CHI)
        return fail(msg, cap, "qjl: projection kind %d: expected ortho, gaussian or chi", s->proj_kind);
    return 0;
}

// ---- projection

double qjl_estimator_constant(int proj_kind, int head_dim) {
    if (proj_kind == QJL_PROJ_ORTHO) {
        // Rows of norm sqrt(d), uniform on the sphere: E|s.u| = sqrt(d) Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))
        // for a unit u, and C = 1 / E|s.u| (E[(s.q) sign(s.k)] = <q,k>/|k| E|s.u|).
        const double d = head_dim;
        return sqrt(M_PI / d) * exp(lgamma((d + 1) / 2) - lgamma(d / 2));
    }
    return sqrt(M_PI / 2);  // E|g| = sqrt(2/pi) for g ~ N(0, 1) (Lemma 3.2); chi-scaled rows are Gaussian
}

// Fills rows [r0, r0 + rows) of P (rows x d used, rows <= d) with orthonormal directions: the
// QR factor Q of a d x rows Gaussian block (modified Gram-Schmidt, twice, in double), one row per
// column of Q, then scaled by sqrt(d) (ORTHO) or by the norm of a fresh d-dim Gaussian (CHI).
// A column that Gram-Schmidt cannot normalize (probability 0) is redrawn.
static void ortho_block(Rng *r, int d, int rows, int chi, float *P) {
    double *Q = xmalloc((size_t)rows * d * sizeof *Q);
    for (int j = 0; j < rows; j++) {
        double *v = Q + (size_t)j * d;
        for (;;) {
            for (int c = 0; c < d; c++) v[c] = rng_normal(r);
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < j; i++) {
                    const double *u = Q + (size_t)i * d;
                    double dot = 0;
                    for (int c = 0; c < d; c++) dot += u[c] * v[c];
                    for (int c = 0; c < d; c++) v[c] -= dot * u[c];
                }
            double nn = 0;
            for (int c = 0; c < d; c++) nn += v[c] * v[c];
            if (nn > 1e-20) {
                const double inv = 1 / sqrt(nn);
                for (int c = 0; c < d; c++) v[c] *= inv;
                break;
            }
        }
    }
    for (int j = 0; j < rows; j++) {
        double scale = sqrt((double)d);
        if (chi) {
            double nn = 0;
            for (int c = 0; c < d; c++) {
                const double g = rng_normal(r);
                nn += g * g;
            }
            scale = sqrt(nn);
        }
        for (int c = 0; c < d; c++) P[(size_t)j * d + c] = (float)(Q[(size_t)j * d + c] * scale);
    }
    free(Q);
}

static void draw_projection(Rng *r, int kind, int rows, int d, float *P) {
    if (kind == QJL_PROJ_GAUSSIAN) {
        for (size_t i = 0; i < (size_t)rows * d; i++) P[i] = (float)rng_normal(r);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += d)
        ortho_block(r, d, rows - r0 < d ? rows - r0 : d, kind == QJL_PROJ_ORTHO_CHI, P + (size_t)r0 * d);
}

int qjl_fit(QjlState *st, const QjlSettings *s, char *msg, size_t cap) {
    memset(st, 0, sizeof *st);
    if (qjl_settings_check(s, msg, cap)) return -1;
    st->set = *s;
    const int d = s->head_dim, m = s->proj_dim, mo = s->outlier_proj_dim;
    Rng r;
    rng_seed(&r, s->seed);
    st->S = xmalloc((size_t)m * d * sizeof *st->S);
    draw_projection(&r, s->proj_kind, m, d, st->S);
    if (s->outlier_independent && mo > 0) {
        st->S_out = xmalloc((size_t)mo * d * sizeof *st->S_out);
        draw_projection(&r, s->proj_kind, mo, d, st->S_out);  // the same stream, after S
    } else {
        st->S_out = st->S;
    }
    st->c_est = qjl_estimator_constant(s->proj_kind, d);
    return 0;
}

void qjl_free(QjlState *st) {
    if (st->S_out != st->S) free(st->S_out);
    free(st->S);
    memset(st, 0, sizeof *st);
}

// ---- keys

static int idx_bytes(const QjlSettings *s) { return s->head_dim <= 256 ? 1 : 2; }

int qjl_key_record_bytes(const QjlSettings *s) {
    return (s->outlier_count > 0 ? 4 : 2) + s->proj_dim / 8 + s->outlier_proj_dim / 8;
}

int64_t qjl_key_bytes(const QjlSettings *s, int64_t n) {
    if (n < 0) return -1;
    const int64_t g = s->group_tokens, groups = (n + g - 1) / g;
    int64_t a, b, t;
    if (ck_mul(groups, (int64_t)s->outlier_count * idx_bytes(s), &a) || ck_mul(n, qjl_key_record_bytes(s), &b) ||
        ck_add(a, b, &t))
        return -1;
    return t;
}

// The o channels of largest norm over the group's tokens (ties to the lower channel), ascending.
static void pick_outliers(const float *K, int64_t rows, int d, int o, double *cn, int *idx, uint8_t *mask) {
    for (int c = 0; c < d; c++) cn[c] = 0;
    for (int64_t t = 0; t < rows; t++)
        for (int c = 0; c < d; c++) cn[c] += (double)K[t * d + c] * K[t * d + c];
    memset(mask, 0, (size_t)d);
    for (int j = 0; j < o; j++) {
        int best = -1;
        for (int c = 0; c < d; c++)
            if (!mask[c] && (best < 0 || cn[c] > cn[best])) best = c;
        mask[best] = 1;
    }
    int k = 0;
    for (int c = 0; c < d; c++)
        if (mask[c]) idx[k++] = c;
}

// Sets bit i of bits (LSB first) iff row i of P (rows x d) dotted with x is > 0. Double sums (in
// four chains, for speed): the signs agree with a float64 reference for every projection farther
// from 0 than double rounding, and do not depend on float rounding of the products.
static void sign_bits_dense(const float *P, int rows, int d, const float *x, uint8_t *bits) {
    memset(bits, 0, (size_t)rows / 8);
    for (int i = 0; i < rows; i++) {
        const float *p = P + (size_t)i * d;
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int c = 0;
        for (; c + 3 < d; c += 4) {
            a0 += (double)p[c] * x[c];
            a1 += (double)p[c + 1] * x[c + 1];
            a2 += (double)p[c + 2] * x[c + 2];
            a3 += (double)p[c + 3] * x[c + 3];
        }
        for (; c < d; c++) a0 += (double)p[c] * x[c];
        if ((a0 + a1) + (a2 + a3) > 0) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
}
// The same over the o channels idx only (the outlier part: x is zero elsewhere).
static void sign_bits_sparse(const float *P, int rows, int d, const float *x, const int *idx, int o, uint8_t *bits) {
    memset(bits, 0, (size_t)rows / 8);
    for (int i = 0; i < rows; i++) {
        const float *p = P + (size_t)i * d;
        double acc = 0;
        for (int j = 0; j < o; j++) acc += (double)p[idx[j]] * x[idx[j]];
        if (acc > 0) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
}

int qjl_encode_keys(const QjlState *st, const float *K, int64_t n, uint8_t *out, char *msg, size_t cap) {
    const QjlSettings *s = &st->set;
    const int d = s->head_dim, o = s->outlier_count, m = s->proj_dim, mo = s->outlier_proj_dim, ib = idx_bytes(s);
    const int rec = qjl_key_record_bytes(s);
    for (int64_t i = 0; i < n * d; i++)
        if (!isfinite(K[i])) return fail(msg, cap, "qjl: key %lld channel %lld is not finite", (long long)(i / d), (long long)(i % d));
    double *cn = xmalloc((size_t)d * sizeof *cn);
    int *idx = xmalloc((size_t)(o > 0 ? o : 1) * sizeof *idx);
    uint8_t *mask = xcalloc((size_t)d, 1);
    float *kin = xmalloc((size_t)d * sizeof *kin);
    int rc = 0;
    uint8_t *p = out;
    for (int64_t g0 = 0; g0 < n && !rc; g0 += s->group_tokens) {
        const int64_t rows = n - g0 < s->group_tokens ? n - g0 : s->group_tokens;
        const float *Kg = K + g0 * d;
        if (o > 0) {
            pick_outliers(Kg, rows, d, o, cn, idx, mask);
            for (int j = 0; j < o; j++) {
                p[0] = (uint8_t)idx[j];
                if (ib == 2) p[1] = (uint8_t)(idx[j] >> 8);
                p += ib;
            }
        }
        for (int64_t t = 0; t < rows; t++, p += rec) {
            const float *k = Kg + t * d;
            double nn = 0, no = 0;
            for (int c = 0; c < d; c++) {
                nn += (double)k[c] * k[c];
                if (mask[c]) no += (double)k[c] * k[c];
            }
            const uint16_t nu = f16_from_f64(sqrt(nn));
            if (!f16_finite(nu)) {
                rc = fail(msg, cap, "qjl: key %lld has norm %g, beyond fp16 (65504): scale the keys down", (long long)(g0 + t), sqrt(nn));
                break;
            }
            qp_put_u16(p, nu);
            uint8_t *bits = p + 2;
            if (o > 0) {
                qp_put_u16(p + 2, f16_from_f64(sqrt(no)));  // <= nu: finite
                bits = p + 4;
            }
            for (int c = 0; c < d; c++) kin[c] = mask[c] ? 0.0f : k[c];
            sign_bits_dense(st->S, m, d, kin, bits);
            if (o > 0) sign_bits_sparse(st->S_out, mo, d, k, idx, o, bits + m / 8);
        }
    }
    free(cn);
    free(idx);
    free(mask);
    free(kin);
    return rc;
}

// S q, S q_in, S_out q_out (doubles), then the nibble tables of both parts (floats, two per double).
int64_t qjl_score_work(const QjlSettings *s) {
    return 2 * (int64_t)s->proj_dim + s->outlier_proj_dim + ((int64_t)s->proj_dim + s->outlier_proj_dim) / 4 * 8;
}

// Reads a group's outlier indices into idx and returns the pointer past them.
static const uint8_t *read_outliers(const QjlSettings *s, const uint8_t *p, int *idx) {
    const int ib = idx_bytes(s);
    for (int j = 0; j < s->outlier_count; j++, p += ib) idx[j] = ib == 2 ? qp_get_u16(p) : p[0];
    return p;
}

// sum_i x_i (2 b_i - 1) over rows bits, given total = sum_i x_i, bit by bit (small groups).
static double signed_sum(const double *x, const uint8_t *bits, int rows, double total) {
    double set = 0;  // branch-free: the bits are random, a branch would mispredict half the time
    for (int i = 0; i < rows; i++) set += x[i] * (double)(bits[i >> 3] >> (i & 7) & 1);
    return 2 * set - total;
}

// Nibble tables for groups of several keys: lut[j*16 + v] = sum of x[4j + b] over the set bits b
// of v, so a key's sum is rows/4 lookups instead of rows multiply-adds. Building costs 15 adds per
// 4 rows per group, about 0.1 add per sign bit per key at g_k = 32 (byte tables would cost 1).
static void build_lut(const double *x, int rows, float *lut) {
    for (int j = 0; j < rows / 4; j++) {
        float *t = lut + (size_t)j * 16;
        t[0] = 0;
        for (int v = 1; v < 16; v++) t[v] = t[v & (v - 1)] + (float)x[4 * j + __builtin_ctz((unsigned)v)];
    }
}
static double lut_signed_sum(const float *lut, const uint8_t *bits, int rows, double total) {
    float a0 = 0, a1 = 0;  // two chains: the adds are latency-bound otherwise; float sums of rows/8
    for (int j = 0; j < rows / 8; j++, lut += 32) {  // terms each, far below the 1e-5 the tests hold
        a0 += lut[bits[j] & 15];
        a1 += lut[16 + (bits[j] >> 4)];
    }
    return 2 * ((double)a0 + a1) - total;
}

// Keys per group from which the tables pay.
#define QJL_LUT_MIN_ROWS 8

// The inlier norm from the stored full and outlier norms (the reference stores these two).
static double inlier_norm(double nu, double nuo) { return nu > nuo ? sqrt(nu * nu - nuo * nuo) : 0; }

void qjl_project(const QjlState *st, const float *q, double *sq) {
    const int d = st->set.head_dim, m = st->set.proj_dim;
    for (int i = 0; i < m; i++) {
        const float *p = st->S + (size_t)i * d;
        double acc = 0;
        for (int c = 0; c < d; c++) acc += (double)p[c] * q[c];
        sq[i] = acc;
    }
}

void qjl_scores(const QjlState *st, const float *q, const uint8_t *enc, int64_t n, float *scores, double *work) {
    qjl_project(st, q, work);
    qjl_scores_projected(st, q, work, enc, n, scores, work);
}

void qjl_scores_projected(const QjlState *st, const float *q, const double *sq, const uint8_t *enc, int64_t n, float *scores,
                          double *work) {
    const QjlSettings *s = &st->set;
    const int d = s->head_dim, o = s->outlier_count, m = s->proj_dim, mo = s->outlier_proj_dim;
    const int rec = qjl_key_record_bytes(s);
    double *sq_in = work + m, *sq_out = work + 2 * m;
    float *lut_in = (float *)(work + 2 * m + mo), *lut_out = lut_in + (size_t)m / 4 * 16;
    int idx[4096];
    const uint8_t *p = enc;
    for (int64_t g0 = 0; g0 < n; g0 += s->group_tokens) {
        const int64_t rows = n - g0 < s->group_tokens ? n - g0 : s->group_tokens;
        p = read_outliers(s, p, idx);
        // S q_in = S q - S_O q_O; S_out q_out over the outlier columns only.
        double tin = 0, tout = 0;
        for (int i = 0; i < m; i++) {
            double a = sq[i];
            for (int j = 0; j < o; j++) a -= (double)st->S[(size_t)i * d + idx[j]] * q[idx[j]];
            sq_in[i] = a;
            tin += a;
        }
        for (int i = 0; i < mo; i++) {
            double a = 0;
            for (int j = 0; j < o; j++) a += (double)st->S_out[(size_t)i * d + idx[j]] * q[idx[j]];
            sq_out[i] = a;
            tout += a;
        }
        const int lut = rows >= QJL_LUT_MIN_ROWS;
        if (lut) {
            build_lut(sq_in, m, lut_in);
            build_lut(sq_out, mo, lut_out);
        }
        for (int64_t t = 0; t < rows; t++, p += rec) {
            const double nu = qp_f16_to_f32(qp_get_u16(p));
            const uint8_t *bin = p + (o > 0 ? 4 : 2);
            const double s_in = lut ? lut_signed_sum(lut_in, bin, m, tin) : signed_sum(sq_in, bin, m, tin);
            if (o == 0) {
                scores[g0 + t] = (float)(st->c_est / m * nu * s_in);
                continue;
            }
            const double nuo = qp_f16_to_f32(qp_get_u16(p + 2));
            const double s_out = lut ? lut_signed_sum(lut_out, bin + m / 8, mo, tout) : signed_sum(sq_out, bin + m / 8, mo, tout);
            scores[g0 + t] = (float)(st->c_est / m * inlier_norm(nu, nuo) * s_in + st->c_est / mo * nuo * s_out);
        }
    }
}

void qjl_decode_keys(const QjlState *st, const uint8_t *enc, int64_t n, float *K) {
    const QjlSettings *s = &st->set;
    const int d = s->head_dim, o = s->outlier_count, m = s->proj_dim, mo = s->outlier_proj_dim;
    const int rec = qjl_key_record_bytes(s);
    int idx[4096];
    uint8_t *mask = xmalloc((size_t)d);
    double *acc = xmalloc((size_t)d * sizeof *acc);
    const uint8_t *p = enc;
    for (int64_t g0 = 0; g0 < n; g0 += s->group_tokens) {
        const int64_t rows = n - g0 < s->group_tokens ? n - g0 : s->group_tokens;
        p = read_outliers(s, p, idx);
        memset(mask, 0, (size_t)d);
        for (int j = 0; j < o; j++) mask[idx[j]] = 1;
        for (int64_t t = 0; t < rows; t++, p += rec) {
            const double nu = qp_f16_to_f32(qp_get_u16(p)), nuo = o > 0 ? qp_f16_to_f32(qp_get_u16(p + 2)) : 0;
            const uint8_t *bin = p + (o > 0 ? 4 : 2), *bout = bin + m / 8;
            const double a_in = st->c_est / m * (o > 0 ? inlier_norm(nu, nuo) : nu);
            const double a_out = o > 0 ? st->c_est / mo * nuo : 0;
            for (int c = 0; c < d; c++) acc[c] = 0;
            for (int i = 0; i < m; i++) {
                const double sg = (bin[i >> 3] >> (i & 7) & 1) ? a_in : -a_in;
                const float *r = st->S + (size_t)i * d;
                for (int c = 0; c < d; c++)
                    if (!mask[c]) acc[c] += sg * r[c];
            }
            for (int i = 0; i < (o > 0 ? mo : 0); i++) {
                const double sg = (bout[i >> 3] >> (i & 7) & 1) ? a_out : -a_out;
                const float *r = st->S_out + (size_t)i * d;
                for (int j = 0; j < o; j++) acc[idx[j]] += sg * r[idx[j]];
            }
            for (int c = 0; c < d; c++) K[(g0 + t) * d + c] = (float)acc[c];
        }
    }
    free(mask);
    free(acc);
}

// ---- values

static int value_code_bytes(const QjlSettings *s) { return (s->value_group * s->value_bits + 7) / 8; }

int qjl_value_token_bytes(const QjlSettings *s) {
    return (s->head_dim / s->value_group) * (4 + value_code_bytes(s));
}

int qjl_encode_values(const QjlSettings *s, const float *V, int64_t n, uint8_t *out, char *msg, size_t cap) {
    const int d = s->head_dim, gv = s->value_group, b = s->value_bits, cb = value_code_bytes(s);
    const int qmax = (1 << b) - 1;
    uint8_t *p = out;
    for (int64_t t = 0; t < n; t++) {
        for (int g = 0; g < d; g += gv, p += 4 + cb) {
            const float *x = V + t * d + g;
            float mn = x[0], mx = x[0];
            for (int c = 0; c < gv; c++) {
                if (!(fabsf(x[c]) <= 65504.0f))
                    return fail(msg, cap, "qjl: value %lld channel %d is %g: not finite or beyond fp16 (65504)", (long long)t, g + c, x[c]);
                mn = fminf(mn, x[c]);
                mx = fmaxf(mx, x[c]);
            }
            const uint16_t mn_h = qp_f16_down(mn);
            const double mnf = qp_f16_to_f32(mn_h);
            uint16_t sc_h = 0;
            if ((double)mx > mnf) {
                sc_h = qp_f16_up((float)(((double)mx - mnf) / qmax));
                // (float) rounding of the quotient can land below it; qp_f16_up of that is still >= the
                // quotient unless the float is itself an fp16 just below: step once more then.
                if ((double)qp_f16_to_f32(sc_h) * qmax + mnf < (double)mx) sc_h = qp_f16_up(nextafterf(qp_f16_to_f32(sc_h), INFINITY));
                if (!f16_finite(sc_h))
                    return fail(msg, cap, "qjl: value %lld channels %d..%d span %g, beyond an fp16 scale at %d bits: raise vbits or scale the values",
                                (long long)t, g, g + gv - 1, (double)mx - mn, b);
            }
            const double sc = qp_f16_to_f32(sc_h);
            qp_put_u16(p, mn_h);
            qp_put_u16(p + 2, sc_h);
            uint8_t *codes = p + 4;
            memset(codes, 0, (size_t)cb);
            for (int c = 0; c < gv; c++) {
                long code = sc > 0 ? lrint(((double)x[c] - mnf) / sc) : 0;
                if (code < 0) code = 0;
                if (code > qmax) code = qmax;
                const int bit = c * b;
                codes[bit >> 3] |= (uint8_t)(code << (bit & 7));
                if ((bit & 7) + b > 8) codes[(bit >> 3) + 1] |= (uint8_t)(code >> (8 - (bit & 7)));
            }
        }
    }
    return 0;
}

void qjl_decode_values(const QjlSettings *s, const uint8_t *enc, int64_t n, float *V) {
    const int d = s->head_dim, gv = s->value_group, b = s->value_bits, cb = value_code_bytes(s);
    const unsigned qmask = (1u << b) - 1;
    const uint8_t *p = enc;
    for (int64_t t = 0; t < n; t++)
        for (int g = 0; g < d; g += gv, p += 4 + cb) {
            const float mn = qp_f16_to_f32(qp_get_u16(p)), sc = qp_f16_to_f32(qp_get_u16(p + 2));
            const uint8_t *codes = p + 4;
            for (int c = 0; c < gv; c++) {
                const int bit = c * b;
                unsigned w = codes[bit >> 3];
                if ((bit & 7) + b > 8) w |= (unsigned)codes[(bit >> 3) + 1] << 8;
                V[t * d + g + c] = (float)((w >> (bit & 7)) & qmask) * sc + mn;
            }
        }
}

// ---- the head cache

void qjl_head_init(QjlHead *h, const QjlState *st) {
    memset(h, 0, sizeof *h);
    h->st = st;
    const size_t bd = (size_t)st->set.buffer_tokens * st->set.head_dim;
    h->kbuf = xmalloc(bd * sizeof *h->kbuf);
    h->vbuf = xmalloc(bd * sizeof *h->vbuf);
}

void qjl_head_free(QjlHead *h) {
    free(h->kq);
    free(h->vq);
    free(h->kbuf);
    free(h->vbuf);
    memset(h, 0, sizeof *h);
}

int qjl_head_append(QjlHead *h, const float *k, const float *v, char *msg, size_t cap) {
    const QjlSettings *s = &h->st->set;
    const int d = s->head_dim, B = s->buffer_tokens;
    uint16_t *kh = xmalloc((size_t)d * sizeof *kh), *vh = xmalloc((size_t)d * sizeof *vh);
    float *tmp = NULL;
    int rc = 0;
    for (int c = 0; c < d && !rc; c++) {
        kh[c] = qp_f32_to_f16(k[c]);
        vh[c] = qp_f32_to_f16(v[c]);
        if (!f16_finite(kh[c]) || !f16_finite(vh[c]))
            rc = fail(msg, cap, "qjl: token %lld channel %d: key %g or value %g is not finite or beyond fp16 (65504)",
                      (long long)h->n, c, k[c], v[c]);
    }
    int64_t need = h->n + 1, kbytes, vbytes;
    if (!rc && need > h->cap) {  // grow both arrays to hold `ncap` tokens
        int64_t ncap = h->cap ? h->cap : B;
        while (ncap < need)
            if (ck_mul(ncap, 2, &ncap)) break;
        kbytes = qjl_key_bytes(s, ncap);
        if (ncap < need || kbytes < 0 || ck_mul(ncap, qjl_value_token_bytes(s), &vbytes)) {
            rc = fail(msg, cap, "qjl: %lld tokens overflow the cache size", (long long)need);
        } else {
            h->kq = xrealloc(h->kq, (size_t)kbytes);
            h->vq = xrealloc(h->vq, (size_t)vbytes);
            h->cap = ncap;
        }
    }
    const int64_t in_kbuf = h->n - h->n_kq;
    if (!rc && in_kbuf + 1 == B) {  // the key buffer fills: encode it as one chunk
        tmp = xmalloc((size_t)B * d * sizeof *tmp);
        for (int64_t i = 0; i < (int64_t)(B - 1) * d; i++) tmp[i] = qp_f16_to_f32(h->kbuf[i]);
        for (int c = 0; c < d; c++) tmp[(int64_t)(B - 1) * d + c] = qp_f16_to_f32(kh[c]);
        rc = qjl_encode_keys(h->st, tmp, B, h->kq + qjl_key_bytes(s, h->n_kq), msg, cap);
    }
    if (!rc && h->n - h->n_vq == B) {  // the value ring is full: encode its oldest token
        float *old = tmp ? tmp : (tmp = xmalloc((size_t)B * d * sizeof *tmp));
        const uint16_t *src = h->vbuf + (size_t)(h->n_vq % B) * d;
        for (int c = 0; c < d; c++) old[c] = qp_f16_to_f32(src[c]);
        rc = qjl_encode_values(s, old, 1, h->vq + h->n_vq * qjl_value_token_bytes(s), msg, cap);
        if (!rc) h->n_vq++;
    }
    if (!rc) {
        if (in_kbuf + 1 == B) h->n_kq += B;
        else memcpy(h->kbuf + (size_t)in_kbuf * d, kh, (size_t)d * sizeof *kh);
        memcpy(h->vbuf + (size_t)(h->n % B) * d, vh, (size_t)d * sizeof *vh);
        h->n++;
    }
    free(kh);
    free(vh);
    free(tmp);
    return rc;
}

void qjl_softmax(const float *x, int64_t n, float *p) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = fmaxf(mx, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(exp((double)x[i] - mx) / sum);
}

void qjl_head_attend(const QjlHead *h, const float *q, float *out) {
    const QjlSettings *s = &h->st->set;
    const int d = s->head_dim, B = s->buffer_tokens;
    for (int c = 0; c < d; c++) out[c] = 0;
    if (h->n == 0) return;
    float *logit = xmalloc((size_t)h->n * sizeof *logit), *vt = xmalloc((size_t)d * sizeof *vt);
    double *work = xmalloc((size_t)qjl_score_work(s) * sizeof *work);
    qjl_scores(h->st, q, h->kq, h->n_kq, logit, work);
    for (int64_t j = h->n_kq; j < h->n; j++) {
        const uint16_t *kb = h->kbuf + (size_t)(j - h->n_kq) * d;
        double acc = 0;
        for (int c = 0; c < d; c++) acc += (double)q[c] * qp_f16_to_f32(kb[c]);
        logit[j] = (float)acc;
    }
    const float inv = (float)(1 / sqrt((double)d));
    for (int64_t j = 0; j < h->n; j++) logit[j] *= inv;
    qjl_softmax(logit, h->n, logit);
    const int vtb = qjl_value_token_bytes(s);
    for (int64_t j = 0; j < h->n; j++) {
        if (j < h->n_vq) {
            qjl_decode_values(s, h->vq + j * vtb, 1, vt);
        } else {
            const uint16_t *vb = h->vbuf + (size_t)(j % B) * d;
            for (int c = 0; c < d; c++) vt[c] = qp_f16_to_f32(vb[c]);
        }
        for (int c = 0; c < d; c++) out[c] += logit[j] * vt[c];
    }
    free(logit);
    free(vt);
    free(work);
}

int64_t qjl_head_bytes(const QjlHead *h) {
    const QjlSettings *s = &h->st->set;
    return qjl_key_bytes(s, h->n_kq) + (h->n - h->n_kq) * s->head_dim * 2 + h->n_vq * qjl_value_token_bytes(s) +
           (h->n - h->n_vq) * s->head_dim * 2;
}

// ---- bits accounting

int qjl_cache_bytes(const QjlSettings *s, int64_t n, int64_t *key_bytes, int64_t *value_bytes) {
    if (n < 0) return -1;
    const int64_t B = s->buffer_tokens, d = s->head_dim;
    const int64_t n_kq = n / B * B, n_vq = n > B ? n - B : 0;
    int64_t kq = qjl_key_bytes(s, n_kq), kb, vq, vb;
    if (kq < 0 || ck_mul(n - n_kq, 2 * d, &kb) || ck_add(kq, kb, key_bytes) || ck_mul(n_vq, qjl_value_token_bytes(s), &vq) ||
        ck_mul(n - n_vq, 2 * d, &vb) || ck_add(vq, vb, value_bytes))
        return -1;
    return 0;
}

int qjl_bits_stored(const QjlSettings *s, int64_t n, QjlBits *out) {
    int64_t kb, vb, elems;
    if (n < 1 || qjl_cache_bytes(s, n, &kb, &vb) || ck_mul(n, s->head_dim, &elems)) return -1;
    out->key = 8.0 * (double)kb / (double)elems;
    out->value = 8.0 * (double)vb / (double)elems;
    out->total = (out->key + out->value) / 2;
    return 0;
}

QjlBits qjl_bits_paper(const QjlSettings *s) {
    QjlBits b;
    b.key = (double)(s->proj_dim + s->outlier_proj_dim) / s->head_dim;
    b.value = s->value_bits;
    b.total = (b.key + b.value) / 2;
    return b;
}
