#include "model/safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "backend/bf16.h"

static const char *DTYPE_NAMES[] = {"F32", "BF16", "F16", "F64", "I32", "I64", "U8", "I8", "U16", "U32"};
static const size_t DTYPE_SIZES[] = {4, 2, 2, 8, 4, 8, 1, 1, 2, 4};
#define N_DTYPES 10
// Upper bound on the header: the format's reference implementation refuses > 100 MB too.
#define ST_MAX_HEADER (100u * 1024u * 1024u)

size_t st_dtype_size(int dtype) { return (dtype >= 0 && dtype < N_DTYPES) ? DTYPE_SIZES[dtype] : 0; }
const char *st_dtype_name(int dtype) { return (dtype >= 0 && dtype < N_DTYPES) ? DTYPE_NAMES[dtype] : "?"; }

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int cmp_begin(const void *a, const void *b) {
    const StEntry *x = *(const StEntry *const *)a, *y = *(const StEntry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static void free_entries(StFile *sf) {
    for (int i = 0; i < sf->n; i++) free(sf->e[i].name);
    free(sf->e);
    free(sf->metadata_json);
    sf->e = NULL;
    sf->n = 0;
    sf->metadata_json = NULL;
}

int st_parse_header(StFile *sf, const char *hdr, uint64_t hdr_len, uint64_t file_size, char *err, size_t errlen) {
    sf->e = NULL;
    sf->n = 0;
    sf->metadata_json = NULL;
    if (file_size < 8 || hdr_len > file_size - 8) return fail(err, errlen, "header length %llu runs past the end of the file (%llu bytes)", (unsigned long long)hdr_len, (unsigned long long)file_size);
    sf->data_start = 8 + hdr_len;
    sf->data_size = file_size - sf->data_start;
    cJSON *root = cJSON_ParseWithLength(hdr, (size_t)hdr_len);
    if (!root || !cJSON_IsObject(root)) { cJSON_Delete(root); return fail(err, errlen, "header is not a JSON object"); }
    int count = cJSON_GetArraySize(root);
    sf->e = xcalloc((size_t)count + 1, sizeof(StEntry));
    int rc = 0;
    for (cJSON *it = root->child; it; it = it->next) {
        if (!it->string) { rc = fail(err, errlen, "header entry without a name"); break; }
        if (!strcmp(it->string, "__metadata__")) {
            if (!cJSON_IsObject(it)) { rc = fail(err, errlen, "__metadata__ is not an object"); break; }
            if (sf->metadata_json) { rc = fail(err, errlen, "duplicate __metadata__"); break; }
            sf->metadata_json = cJSON_PrintUnformatted(it);
            continue;
        }
        if (!cJSON_IsObject(it)) { rc = fail(err, errlen, "tensor '%s': entry is not an object", it->string); break; }
        for (int i = 0; i < sf->n; i++)
            if (!strcmp(sf->e[i].name, it->string)) { rc = fail(err, errlen, "tensor '%s' appears twice", it->string); break; }
        if (rc) break;
        StEntry *e = &sf->e[sf->n];
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(dt)) { rc = fail(err, errlen, "tensor '%s': missing dtype", it->string); break; }
        e->dtype = -1;
        for (int d = 0; d < N_DTYPES; d++) if (!strcmp(dt->valuestring, DTYPE_NAMES[d])) e->dtype = d;
        if (e->dtype < 0) { rc = fail(err, errlen, "tensor '%s': unsupported dtype '%s'", it->string, dt->valuestring); break; }
        if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > ST_MAX_DIMS) { rc = fail(err, errlen, "tensor '%s': shape must be an array of at most %d dims", it->string, ST_MAX_DIMS); break; }
        e->ndim = cJSON_GetArraySize(sh);
        // numel with overflow check: every dim a whole number in [0, 2^40]
        unsigned long long numel = 1;
        int d = 0;
        for (const cJSON *x = sh->child; x; x = x->next, d++) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1099511627776.0 || x->valuedouble != floor(x->valuedouble)) {
                rc = fail(err, errlen, "tensor '%s': dim %d is not a valid size", it->string, d);
                break;
            }
            e->shape[d] = (int64_t)x->valuedouble;
            if (e->shape[d] && numel > (1ull << 50) / (unsigned long long)e->shape[d]) { rc = fail(err, errlen, "tensor '%s': shape too large", it->string); break; }
            numel *= (unsigned long long)e->shape[d];
        }
        if (rc) break;
        if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !cJSON_IsNumber(off->child) || !cJSON_IsNumber(off->child->next)) {
            rc = fail(err, errlen, "tensor '%s': data_offsets must be [begin, end]", it->string);
            break;
        }
        double b = off->child->valuedouble, en = off->child->next->valuedouble;
        if (b < 0 || en < b || b != floor(b) || en != floor(en) || en > (double)sf->data_size) {
            rc = fail(err, errlen, "tensor '%s': data_offsets [%.0f, %.0f] outside the data area of %llu bytes (truncated file?)", it->string, b, en, (unsigned long long)sf->data_size);
            break;
        }
        e->begin = (uint64_t)b;
        e->end = (uint64_t)en;
        if (e->end - e->begin != numel * DTYPE_SIZES[e->dtype]) {
            rc = fail(err, errlen, "tensor '%s': %llu bytes of data for a shape needing %llu", it->string, (unsigned long long)(e->end - e->begin), numel * (unsigned long long)DTYPE_SIZES[e->dtype]);
            break;
        }
        e->name = xstrdup(it->string);
        sf->n++;
    }
    cJSON_Delete(root);
    if (!rc && sf->n > 1) {
        StEntry **order = xmalloc((size_t)sf->n * sizeof(StEntry *));
        for (int i = 0; i < sf->n; i++) order[i] = &sf->e[i];
        qsort(order, (size_t)sf->n, sizeof(StEntry *), cmp_begin);
        for (int i = 1; i < sf->n && !rc; i++)
            if (order[i]->begin < order[i - 1]->end)
                rc = fail(err, errlen, "tensors '%s' and '%s' overlap in the data area", order[i - 1]->name, order[i]->name);
        free(order);
    }
    if (rc) free_entries(sf);
    return rc;
}

int st_open(StFile *sf, const char *path, char *err, size_t errlen) {
    memset(sf, 0, sizeof(*sf));
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, errlen, "cannot open: %s", strerror(errno));
    unsigned char lenbuf[8];
    if (fseeko(f, 0, SEEK_END) != 0) { fclose(f); return fail(err, errlen, "cannot seek"); }
    off_t size = ftello(f);
    rewind(f);
    if (size < 8 || fread(lenbuf, 1, 8, f) != 8) { fclose(f); return fail(err, errlen, "file shorter than the 8-byte header length"); }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    if (hlen > ST_MAX_HEADER || hlen > (uint64_t)size - 8) { fclose(f); return fail(err, errlen, "header length %llu is larger than the file allows (%lld bytes)", (unsigned long long)hlen, (long long)size); }
    char *hdr = xmalloc((size_t)hlen + 1);
    if (fread(hdr, 1, (size_t)hlen, f) != hlen) { free(hdr); fclose(f); return fail(err, errlen, "truncated header"); }
    hdr[hlen] = 0;
    int rc = st_parse_header(sf, hdr, hlen, (uint64_t)size, err, errlen);
    free(hdr);
    if (rc) { fclose(f); return rc; }
    sf->f = f;
    sf->path = xstrdup(path);
    return 0;
}

void st_close(StFile *sf) {
    if (sf->f) fclose(sf->f);
    free(sf->path);
    free_entries(sf);
    memset(sf, 0, sizeof(*sf));
}

int st_find(const StFile *sf, const char *name) {
    for (int i = 0; i < sf->n; i++) if (!strcmp(sf->e[i].name, name)) return i;
    return -1;
}

static float f16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

int st_read_f32(StFile *sf, int i, float *out, char *err, size_t errlen) {
    const StEntry *e = &sf->e[i];
    size_t bytes = (size_t)(e->end - e->begin), es = DTYPE_SIZES[e->dtype], n = bytes / es;
    if (e->dtype != ST_F32 && e->dtype != ST_BF16 && e->dtype != ST_F16 && e->dtype != ST_F64)
        return fail(err, errlen, "tensor '%s' has dtype %s, not a float type", e->name, DTYPE_NAMES[e->dtype]);
    if (fseeko(sf->f, (off_t)(sf->data_start + e->begin), SEEK_SET) != 0) return fail(err, errlen, "seek failed for '%s'", e->name);
    unsigned char *raw = e->dtype == ST_F32 ? (unsigned char *)out : xmalloc(bytes);
    size_t got = fread(raw, 1, bytes, sf->f);
    if (got != bytes) {
        if (raw != (unsigned char *)out) free(raw);
        return fail(err, errlen, "tensor '%s': file ended early (truncated?)", e->name);
    }
    // data is little-endian; this code assumes a little-endian host (x86_64, aarch64)
    for (size_t k = 0; k < n && e->dtype != ST_F32; k++) {
        if (e->dtype == ST_BF16) { uint16_t h; memcpy(&h, raw + 2 * k, 2); out[k] = sr_bf16_to_f32(h); }
        else if (e->dtype == ST_F16) { uint16_t h; memcpy(&h, raw + 2 * k, 2); out[k] = f16_to_f32(h); }
        else { double d; memcpy(&d, raw + 8 * k, 8); out[k] = (float)d; }
    }
    if (raw != (unsigned char *)out) free(raw);
    return 0;
}

int st_save(const char *path, const StTensor *t, int n, int out_dtype, const char *metadata_json, char *err, size_t errlen) {
    if (out_dtype != ST_F32 && out_dtype != ST_BF16) return fail(err, errlen, "st_save writes F32 or BF16 only");
    size_t es = DTYPE_SIZES[out_dtype];
    cJSON *root = cJSON_CreateObject();
    if (metadata_json) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!meta) { cJSON_Delete(root); return fail(err, errlen, "metadata is not JSON"); }
        cJSON_AddItemToObject(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", DTYPE_NAMES[out_dtype]);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        off += numel * es;
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToObject(root, t[i].name, e);
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;   // data area 8-byte aligned, padded with spaces
    AtomicFile af;
    if (atomic_open(&af, path) != 0) { free(hdr); return fail(err, errlen, "cannot create '%s': %s", path, strerror(errno)); }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenbuf, 1, 8, af.f) == 8 && fwrite(hdr, 1, hlen, af.f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', af.f) != EOF;
    free(hdr);
    uint16_t *tmp = NULL;
    for (int i = 0; ok && i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
        if (out_dtype == ST_F32) {
            ok = fwrite(t[i].data, 4, numel, af.f) == numel;
        } else {
            tmp = realloc(tmp, numel * 2);
            if (!tmp) die("out of memory writing %s", path);
            for (size_t k = 0; k < numel; k++) tmp[k] = sr_f32_to_bf16_rne(t[i].data[k]);
            ok = fwrite(tmp, 2, numel, af.f) == numel;
        }
    }
    free(tmp);
    if (!ok) {
        int e = errno;
        atomic_abort(&af);
        return fail(err, errlen, "writing '%s' failed: %s", path, strerror(e));
    }
    if (atomic_commit(&af) != 0) return fail(err, errlen, "writing '%s' failed: %s", path, strerror(errno));
    return 0;
}
