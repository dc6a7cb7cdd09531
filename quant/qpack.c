#include "quant/qpack.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/num.h"

// One fp16 step towards -inf / +inf (finite inputs; -0 and +0 both step to the smallest
// subnormal of the right sign).
static uint16_t f16_step_down(uint16_t h) {
    if (h == 0x0000u || h == 0x8000u) return 0x8001u;
    return (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}
static uint16_t f16_step_up(uint16_t h) {
    if (h == 0x0000u || h == 0x8000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}

uint16_t qp_f16_down(float x) {
    uint16_t h = qp_f32_to_f16(x);
    return qp_f16_to_f32(h) > x ? f16_step_down(h) : h;
}

uint16_t qp_f16_up(float x) {
    uint16_t h = qp_f32_to_f16(x);
    return qp_f16_to_f32(h) < x ? f16_step_up(h) : h;
}

int qp_spec_next(const char **s, char *key, size_t keylen, char *val, size_t vallen, char *err, size_t errlen) {
    const char *p = *s;
    if (!p || !*p) return 0;
    const char *end = strchr(p, ','), *eq = strchr(p, '=');
    if (!end) end = p + strlen(p);
    if (!eq || eq > end) {
        snprintf(err, errlen, "'%.*s': expected key=value", (int)(end - p), p);
        return -1;
    }
    const size_t kn = (size_t)(eq - p), vn = (size_t)(end - eq - 1);
    if (kn == 0 || kn >= keylen || vn >= vallen) {
        snprintf(err, errlen, "'%.*s': expected key=value with a known key", (int)(end - p), p);
        return -1;
    }
    memcpy(key, p, kn);
    key[kn] = 0;
    memcpy(val, eq + 1, vn);
    val[vn] = 0;
    *s = *end ? end + 1 : end;
    if (*end && !**s) {
        snprintf(err, errlen, "trailing ',' in the settings");
        return -1;
    }
    return 1;
}

int qp_spec_int(const char *name, const char *val, int lo, int hi, int *out, char *err, size_t errlen) {
    int64_t v;
    if (num_parse_i64(val, lo, hi, &v) != NUM_OK) {
        snprintf(err, errlen, "%s=%s: expected a whole number in %d..%d", name, val, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int qp_spec_f64(const char *name, const char *val, double lo, double hi, double *out, char *err, size_t errlen) {
    double v;
    if (num_parse_f64(val, &v) != NUM_OK || v < lo || v > hi) {
        snprintf(err, errlen, "%s=%s: expected a number in [%g, %g]", name, val, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int qp_check_f16_range(const float *x, int64_t n, int64_t *bad) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= QP_F16_MAX)) {   // also catches NaN
            *bad = i;
            return -1;
        }
    return 0;
}

int qp_prefix_err(const char *method, char *err, size_t errlen) {
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s", err);
    if (strncmp(tmp, method, strlen(method)) != 0) snprintf(err, errlen, "%s: %s", method, tmp);
    return -1;
}
