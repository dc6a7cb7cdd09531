#include "model/safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend/bf16.h"
#include "common/json_strict.h"
#include "common/unfinished.h"
#include "common/util.h"

static const char *DTYPE_NAMES[] = {"F32", "BF16", "F16", "F64", "I32", "I64", "U8", "I8", "U16", "U32"};
static const size_t DTYPE_SIZES[] = {4, 2, 2, 8, 4, 8, 1, 1, 2, 4};
#define N_DTYPES 10
// Upper bound on the header: the format's reference implementation refuses > 100 MB too.
#define ST_MAX_HEADER (100u * 1024u * 1024u)

size_t st_dtype_size(int dtype) { return (dtype >= 0 && dtype < N_DTYPES) ? DTYPE_SIZES[dtype] : 0; }
const char *st_dtype_name(int dtype) { return (dtype >= 0 && dtype < N_DTYPES) ? DTYPE_NAMES[dtype] : "?"; }


// by begin, then end: an empty tensor at an offset sorts before a tensor starting there
static int cmp_begin(const void *a, const void *b) {
    const StEntry *x = *(const StEntry *const *)a, *y = *(const StEntry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
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
    if (file_size < 8 || hdr_len > file_size - 8) return fail_with(err, errlen, "header length %llu runs past the end of the file (%llu bytes)", (unsigned long long)hdr_len, (unsigned long long)file_size);
    sf->data_start = 8 + hdr_len;
    sf->data_size = file_size - sf->data_start;
    const char *json_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hdr_len, &json_end, 0);
    if (!root || !cJSON_IsObject(root)) { cJSON_Delete(root); return fail_with(err, errlen, "header is not a JSON object"); }
    // after the object only the spaces that pad the data area to alignment (the format's rule)
    for (const char *p = json_end; p && p < hdr + hdr_len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return fail_with(err, errlen, "header has text after its JSON object (at byte %llu of %llu): not a safetensors header",
                             (unsigned long long)(p - hdr), (unsigned long long)hdr_len);
        }
    int count = cJSON_GetArraySize(root);
    sf->e = xcalloc((size_t)count + 1, sizeof(StEntry));
    int rc = 0;
    for (cJSON *it = root->child; it; it = it->next) {
        if (!it->string) { rc = fail_with(err, errlen, "header entry without a name"); break; }
        if (!strcmp(it->string, "__metadata__")) {
            if (!cJSON_IsObject(it)) { rc = fail_with(err, errlen, "__metadata__ is not an object"); break; }
            if (sf->metadata_json) { rc = fail_with(err, errlen, "duplicate __metadata__"); break; }
            sf->metadata_json = cJSON_PrintUnformatted(it);
            continue;
        }
        if (!cJSON_IsObject(it)) { rc = fail_with(err, errlen, "tensor '%s': entry is not an object", it->string); break; }
        for (int i = 0; i < sf->n; i++)
            if (!strcmp(sf->e[i].name, it->string)) { rc = fail_with(err, errlen, "tensor '%s' appears twice", it->string); break; }
        if (rc) break;
        StEntry *e = &sf->e[sf->n];
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(dt)) { rc = fail_with(err, errlen, "tensor '%s': missing dtype", it->string); break; }
        e->dtype = -1;
        for (int d = 0; d < N_DTYPES; d++) if (!strcmp(dt->valuestring, DTYPE_NAMES[d])) e->dtype = d;
        if (e->dtype < 0) { rc = fail_with(err, errlen, "tensor '%s': unsupported dtype '%s'", it->string, dt->valuestring); break; }
        if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > ST_MAX_DIMS) { rc = fail_with(err, errlen, "tensor '%s': shape must be an array of at most %d dims", it->string, ST_MAX_DIMS); break; }
        e->ndim = cJSON_GetArraySize(sh);
        // numel with overflow check: every dim a whole number in [0, 2^40]
        unsigned long long numel = 1;
        int d = 0;
        for (const cJSON *x = sh->child; x; x = x->next, d++) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1099511627776.0 || x->valuedouble != floor(x->valuedouble)) {
                rc = fail_with(err, errlen, "tensor '%s': dim %d is not a valid size", it->string, d);
                break;
            }
            e->shape[d] = (int64_t)x->valuedouble;
            if (e->shape[d] && numel > (1ull << 50) / (unsigned long long)e->shape[d]) { rc = fail_with(err, errlen, "tensor '%s': shape too large", it->string); break; }
            numel *= (unsigned long long)e->shape[d];
        }
        if (rc) break;
        if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !cJSON_IsNumber(off->child) || !cJSON_IsNumber(off->child->next)) {
            rc = fail_with(err, errlen, "tensor '%s': data_offsets must be [begin, end]", it->string);
            break;
        }
        double b = off->child->valuedouble, en = off->child->next->valuedouble;
        if (b != floor(b) || en != floor(en)) {
            rc = fail_with(err, errlen, "tensor '%s': data_offsets [%.17g, %.17g] are not whole numbers", it->string, b, en);
            break;
        }
        if (b < 0 || en < b || en > (double)sf->data_size) {
            rc = fail_with(err, errlen, "tensor '%s': data_offsets [%.0f, %.0f] outside the data area of %llu bytes (truncated file?)", it->string, b, en, (unsigned long long)sf->data_size);
            break;
        }
        e->begin = (uint64_t)b;
        e->end = (uint64_t)en;
        if (e->end - e->begin != numel * DTYPE_SIZES[e->dtype]) {
            rc = fail_with(err, errlen, "tensor '%s': %llu bytes of data for a shape needing %llu", it->string, (unsigned long long)(e->end - e->begin), numel * (unsigned long long)DTYPE_SIZES[e->dtype]);
            break;
        }
        e->name = xstrdup(it->string);
        sf->n++;
    }
    cJSON_Delete(root);
    if (!rc) {
        // the tensors tile the data area: no overlap, no hole, nothing after the last (the
        // format's rule; the reference library refuses such files too)
        StEntry **order = xmalloc((size_t)(sf->n ? sf->n : 1) * sizeof(StEntry *));
        for (int i = 0; i < sf->n; i++) order[i] = &sf->e[i];
        qsort(order, (size_t)sf->n, sizeof(StEntry *), cmp_begin);
        uint64_t at = 0;
        for (int i = 0; i < sf->n && !rc; i++) {
            if (order[i]->begin < at)
                rc = fail_with(err, errlen, "tensors '%s' and '%s' overlap in the data area", order[i - 1]->name, order[i]->name);
            else if (order[i]->begin > at)
                rc = fail_with(err, errlen, "bytes [%llu, %llu) of the data area belong to no tensor (before '%s'): a safetensors file has no holes",
                               (unsigned long long)at, (unsigned long long)order[i]->begin, order[i]->name);
            else at = order[i]->end;
        }
        if (!rc && at != sf->data_size)
            rc = fail_with(err, errlen, "%llu bytes after the last tensor's data (the data area holds %llu): a safetensors file has no trailing bytes",
                           (unsigned long long)(sf->data_size - at), (unsigned long long)sf->data_size);
        free(order);
    }
    if (rc) free_entries(sf);
    return rc;
}

int st_open(StFile *sf, const char *path, char *err, size_t errlen) {
    memset(sf, 0, sizeof(*sf));
    FILE *f = fopen_read(path);
    if (!f) return fail_with(err, errlen, "cannot open: %s", strerror(errno));
    unsigned char lenbuf[8];
    if (fseeko(f, 0, SEEK_END) != 0) { fclose(f); return fail_with(err, errlen, "cannot seek"); }
    off_t size = ftello(f);
    rewind(f);
    if (size < 8 || fread(lenbuf, 1, 8, f) != 8) { fclose(f); return fail_with(err, errlen, "file shorter than the 8-byte header length"); }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    if (hlen > ST_MAX_HEADER || hlen > (uint64_t)size - 8) { fclose(f); return fail_with(err, errlen, "header length %llu is larger than the file allows (%lld bytes)", (unsigned long long)hlen, (long long)size); }
    char *hdr = xmalloc((size_t)hlen + 1);
    if (fread(hdr, 1, (size_t)hlen, f) != hlen) { free(hdr); fclose(f); return fail_with(err, errlen, "truncated header"); }
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
        return fail_with(err, errlen, "tensor '%s' has dtype %s, not a float type", e->name, DTYPE_NAMES[e->dtype]);
    if (fseeko(sf->f, (off_t)(sf->data_start + e->begin), SEEK_SET) != 0) return fail_with(err, errlen, "seek failed for '%s'", e->name);
    unsigned char *raw = e->dtype == ST_F32 ? (unsigned char *)out : xmalloc(bytes);
    size_t got = fread(raw, 1, bytes, sf->f);
    if (got != bytes) {
        if (raw != (unsigned char *)out) free(raw);
        return fail_with(err, errlen, "tensor '%s': file ended early (truncated?)", e->name);
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

int st_save(const char *path, OutMode mode, const StTensor *t, int n, int out_dtype, const char *metadata_json, char *err, size_t errlen) {
    if (out_dtype != ST_F32 && out_dtype != ST_BF16) return fail_with(err, errlen, "st_save writes F32 or BF16 only");
    size_t es = DTYPE_SIZES[out_dtype];
    cJSON *root = cJSON_CreateObject();
    if (metadata_json) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!meta) { cJSON_Delete(root); return fail_with(err, errlen, "metadata is not JSON"); }
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
    if (atomic_open(&af, path, mode) != 0) { free(hdr); return fail_with(err, errlen, "cannot create '%s': %s", path, strerror(errno)); }
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
        return fail_with(err, errlen, "writing '%s' failed: %s", path, strerror(e));
    }
    if (atomic_commit(&af) != 0) {
        atomic_commit_message(err, errlen, path, mode, errno);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- sharded sets (HF layout)

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

// A shard named by an index is a plain file name beside the index: never a path elsewhere.
static int plain_file_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    if (slash == path) return xstrdup("/");
    char *d = xstrdup(path);
    d[slash - path] = 0;
    return d;
}

static int is_regular(const char *path) {
    struct stat stt;
    return stat(path, &stt) == 0 && S_ISREG(stt.st_mode);
}

// Reads and checks an index: an object with "weight_map" {name: "file"} and an optional
// "metadata" object. files receives the distinct shard names in order of first appearance.
static int index_read(const char *path, cJSON **out, char ***files, int *n_files, char *err, size_t errlen) {
    *out = NULL;
    *files = NULL;
    *n_files = 0;
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) return fail_with(err, errlen, "cannot read index '%s': %s", path, strerror(errno));
    // strict, as a config is read: text after the object, or a key twice (cJSON keeps the first
    // copy, Python's json the last), would make two readers see two indexes
    char jerr[256];
    cJSON *root = json_parse_strict(text, len, jerr, sizeof(jerr));
    free(text);
    if (!root) return fail_with(err, errlen, "index '%s': %s", path, jerr);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); return fail_with(err, errlen, "index '%s' is not a JSON object", path); }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const char *why = NULL;
    if (meta && !cJSON_IsObject(meta)) why = "\"metadata\" is not an object";
    else if (!cJSON_IsObject(map)) why = "it has no \"weight_map\" object";
    else if (!map->child) why = "its \"weight_map\" is empty";
    if (why) { cJSON_Delete(root); return fail_with(err, errlen, "index '%s': %s", path, why); }
    int cap = 0;
    for (const cJSON *it = map->child; it; it = it->next) {
        if (!cJSON_IsString(it) || !plain_file_name(it->valuestring)) {
            // the message first: it quotes the tensor's name, which lives in root
            fail_with(err, errlen, "index '%s': tensor '%s' must map to a file name beside the index (a plain name, no '/')", path,
                      it->string);
            cJSON_Delete(root);
            for (int i = 0; i < *n_files; i++) free((*files)[i]);
            free(*files);
            *files = NULL;
            *n_files = 0;
            return -1;
        }
        int seen = 0;
        for (int i = *n_files - 1; i >= 0 && !seen; i--) seen = !strcmp((*files)[i], it->valuestring);
        if (seen) continue;
        if (*n_files == cap) {
            cap = cap ? 2 * cap : 8;
            *files = realloc(*files, (size_t)cap * sizeof(char *));
            if (!*files) die("out of memory reading '%s'", path);
        }
        (*files)[(*n_files)++] = xstrdup(it->valuestring);
    }
    *out = root;
    return 0;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const StRef *)a)->name, ((const StRef *)b)->name);
}

// The string value of key in a JSON object text, copied into buf ("" when absent).
static void meta_string(const char *json, const char *key, char *buf, size_t n) {
    buf[0] = 0;
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsString(v)) snprintf(buf, n, "%s", v->valuestring);
    cJSON_Delete(j);
}

#define SAVE_ID_KEY "clla_save_id"

static int set_open_index(StSet *s, const char *path, char *err, size_t errlen) {
    cJSON *root;
    char **names;
    int n_names;
    if (index_read(path, &root, &names, &n_names, err, errlen) != 0) return -1;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    char index_id[64] = "";
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    const cJSON *sid = cJSON_GetObjectItemCaseSensitive(meta, SAVE_ID_KEY);
    if (cJSON_IsString(sid)) snprintf(index_id, sizeof(index_id), "%s", sid->valuestring);
    char *dir = dir_of(path);
    s->files = xcalloc((size_t)n_names, sizeof(StFile));
    int rc = 0;
    for (int i = 0; i < n_names && !rc; i++) {
        char *sp = path_join(dir, names[i]);
        char why[512];
        if (st_open(&s->files[i], sp, why, sizeof(why)) != 0) {
            rc = fail_with(err, errlen, "shard '%s' of index '%s': %s", sp, path, why);
        } else {
            s->n_files++;
            char shard_id[64];
            meta_string(s->files[i].metadata_json, SAVE_ID_KEY, shard_id, sizeof(shard_id));
            if (index_id[0] && shard_id[0] && strcmp(index_id, shard_id))
                rc = fail_with(err, errlen, "shard '%s' was written by another save than index '%s' (an interrupted save?): save the model again", sp, path);
        }
        free(sp);
    }
    free(dir);
    int total = 0;
    for (int i = 0; i < s->n_files; i++) total += s->files[i].n;
    s->refs = xcalloc((size_t)total + 1, sizeof(StRef));
    for (int i = 0; i < s->n_files && !rc; i++)
        for (int j = 0; j < s->files[i].n; j++) s->refs[s->n++] = (StRef){s->files[i].e[j].name, i, j};
    if (!rc) qsort(s->refs, (size_t)s->n, sizeof(StRef), cmp_ref);
    for (int r = 1; r < s->n && !rc; r++)
        if (!strcmp(s->refs[r].name, s->refs[r - 1].name))
            rc = fail_with(err, errlen, "tensor '%s' is in two shards, '%s' and '%s'", s->refs[r].name,
                      s->files[s->refs[r - 1].file].path, s->files[s->refs[r].file].path);
    // every weight_map entry once, in the shard it names; then no shard tensor left unmapped
    char *seen = xcalloc((size_t)s->n + 1, 1);
    for (const cJSON *it = map->child; it && !rc; it = it->next) {
        int r = st_set_find(s, it->string);
        if (r < 0) rc = fail_with(err, errlen, "index '%s' maps tensor '%s' to '%s', which does not hold it", path, it->string, it->valuestring);
        else if (seen[r]) rc = fail_with(err, errlen, "index '%s' lists tensor '%s' twice", path, it->string);
        else if (strcmp(names[s->refs[r].file], it->valuestring))
            rc = fail_with(err, errlen, "index '%s' maps tensor '%s' to '%s', but it is in '%s'", path, it->string, it->valuestring, s->files[s->refs[r].file].path);
        else seen[r] = 1;
    }
    for (int r = 0; r < s->n && !rc; r++)
        if (!seen[r]) rc = fail_with(err, errlen, "tensor '%s' of shard '%s' is not in index '%s'", s->refs[r].name, s->files[s->refs[r].file].path, path);
    free(seen);
    free_names(names, n_names);
    cJSON_Delete(root);
    return rc;
}

int st_set_open(StSet *s, const char *path, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    struct stat stt;
    if (stat(path, &stt) != 0) return fail_with(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    int rc;
    if (S_ISDIR(stt.st_mode)) {
        char *single = path_join(path, ST_SINGLE_FILE), *index = path_join(path, ST_INDEX_FILE);
        int has_single = is_regular(single), has_index = is_regular(index);
        if (has_single && has_index)
            rc = fail_with(err, errlen, "'%s' holds both %s and %s: remove the stale one", path, ST_SINGLE_FILE, ST_INDEX_FILE);
        else if (!has_single && !has_index)
            rc = fail_with(err, errlen, "'%s' is a directory without %s or %s", path, ST_SINGLE_FILE, ST_INDEX_FILE);
        else
            rc = st_set_open(s, has_index ? index : single, err, errlen);
        free(single);
        free(index);
        return rc;
    }
    if (ends_with(path, ".json")) {
        rc = set_open_index(s, path, err, errlen);
    } else {
        s->files = xcalloc(1, sizeof(StFile));
        char why[512];
        rc = st_open(&s->files[0], path, why, sizeof(why));
        if (rc) {
            fail_with(err, errlen, "'%s': %s", path, why);
        } else {
            s->n_files = 1;
            s->refs = xcalloc((size_t)s->files[0].n + 1, sizeof(StRef));
            for (int j = 0; j < s->files[0].n; j++) s->refs[s->n++] = (StRef){s->files[0].e[j].name, 0, j};
            qsort(s->refs, (size_t)s->n, sizeof(StRef), cmp_ref);
        }
    }
    if (rc) st_set_close(s);
    return rc;
}

void st_set_close(StSet *s) {
    for (int i = 0; i < s->n_files; i++) st_close(&s->files[i]);
    free(s->files);
    free(s->refs);
    memset(s, 0, sizeof(*s));
}

int st_set_find(const StSet *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(s->refs[mid].name, name);
        if (!c) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

const StEntry *st_set_entry(const StSet *s, int r) { return &s->files[s->refs[r].file].e[s->refs[r].idx]; }

int st_set_read_f32(StSet *s, int r, float *out, char *err, size_t errlen) {
    return st_read_f32(&s->files[s->refs[r].file], s->refs[r].idx, out, err, errlen);
}

static uint64_t tensor_bytes(const StTensor *t, size_t es) {
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
    return numel * es;
}

// The metadata object text with the save id added (the caller frees it).
static char *meta_with_id(const char *metadata_json, const char *id) {
    cJSON *j = metadata_json ? cJSON_Parse(metadata_json) : cJSON_CreateObject();
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); j = cJSON_CreateObject(); }
    cJSON_DeleteItemFromObjectCaseSensitive(j, SAVE_ID_KEY);
    cJSON_AddStringToObject(j, SAVE_ID_KEY, id);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

int st_is_shard_name(const char *name) {
    const char *p = name;
    if (strncmp(p, "model-", 6)) return 0;
    p += 6;
    size_t d = strspn(p, "0123456789");
    if (!d || strncmp(p + d, "-of-", 4)) return 0;
    p += d + 4;
    d = strspn(p, "0123456789");
    return d && !strcmp(p + d, ".safetensors");
}

// Removes what a previous save left that the new one (keep[0..n_keep)) does not use: the single
// file, the index and the shards it named, never another file an index names (an index is
// outside data: one naming notes.txt deleted it) nor what is not a regular file.
static void remove_stale(const char *dir, char **old, int n_old, char **keep, int n_keep) {
    for (int i = 0; i < n_old; i++) {
        int used = 0;
        for (int k = 0; k < n_keep && !used; k++) used = !strcmp(old[i], keep[k]);
        if (used) continue;
        if (strcmp(old[i], ST_SINGLE_FILE) && strcmp(old[i], ST_INDEX_FILE) && !st_is_shard_name(old[i])) continue;
        char *p = path_join(dir, old[i]);
        struct stat sb;
        if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(p);
            continue;
        }
        if (unlink(p) != 0 && errno != ENOENT) warn("could not remove the stale '%s': %s", p, strerror(errno));
        free(p);
    }
}

int st_save_dir(const char *dir, const StTensor *t, int n, int out_dtype, const char *metadata_json,
                unsigned long long shard_bytes, char *err, size_t errlen) {
    size_t es = st_dtype_size(out_dtype);
    // what the previous save left: the single file, the index and its shards
    char **old = NULL;
    int n_old = 0;
    char *index_path = path_join(dir, ST_INDEX_FILE);
    if (is_regular(index_path)) {
        cJSON *root;
        char why[512];
        if (index_read(index_path, &root, &old, &n_old, why, sizeof(why)) == 0) cJSON_Delete(root);
    }
    old = realloc(old, (size_t)(n_old + 2) * sizeof(char *));
    if (!old) die("out of memory saving to '%s'", dir);
    old[n_old++] = xstrdup(ST_SINGLE_FILE);
    old[n_old++] = xstrdup(ST_INDEX_FILE);

    // HF's packing: tensors in order, a new shard when the next one would not fit
    int *shard_of = xcalloc((size_t)n + 1, sizeof(int));
    int n_shards = n ? 1 : 0;
    uint64_t fill = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = tensor_bytes(&t[i], es);
        if (shard_bytes && fill > 0 && fill + b > shard_bytes) { n_shards++; fill = 0; }
        fill += b;
        total += b;
        shard_of[i] = n_shards - 1;
    }
    int rc = 0;
    if (n_shards <= 1) {
        char *single = path_join(dir, ST_SINGLE_FILE);
        rc = st_save(single, OUT_REPLACE, t, n, out_dtype, metadata_json, err, errlen);
        free(single);
        char *keep[] = {ST_SINGLE_FILE};
        if (!rc) remove_stale(dir, old, n_old, keep, 1);
    } else {
        char id[64];
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(id, sizeof(id), "%llx-%lx", (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec, (long)getpid());
        char *meta = meta_with_id(metadata_json, id);
        char **names = xcalloc((size_t)n_shards, sizeof(char *)), **partial = xcalloc((size_t)n_shards, sizeof(char *));
        int *unfinished = xmalloc((size_t)n_shards * sizeof(int));   // removed if the process ends before the renames
        int written = 0;
        for (int k = 0, first = 0; k < n_shards && !rc; k++) {
            int last = first;
            while (last < n && shard_of[last] == k) last++;
            char name[64], part[96];
            snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", k + 1, n_shards);
            snprintf(part, sizeof(part), "%s.partial.%ld", name, (long)getpid());
            names[k] = xstrdup(name);
            partial[k] = path_join(dir, part);
            // tracked before it exists: st_save renames its temporary to this name, and a signal
            // right after the rename would otherwise leave it behind
            unfinished[k] = unfinished_add(partial[k], UNFINISHED_FILE);
            rc = st_save(partial[k], OUT_REPLACE, t + first, last - first, out_dtype, meta, err, errlen);
            if (rc) unfinished_done(unfinished[k]);
            if (!rc) written++;
            first = last;
        }
        // the index is written whole before any shard replaces a previous save's of its name, and
        // renamed after them: a full disk fails it while the previous save is still whole (its
        // shards had been replaced and its index kept, which no longer loaded)
        AtomicFile index_file;
        int index_staged = 0;
        if (!rc) {
            cJSON *root = cJSON_CreateObject();
            cJSON *md = cJSON_AddObjectToObject(root, "metadata");
            cJSON_AddNumberToObject(md, "total_size", (double)total);
            cJSON_AddStringToObject(md, SAVE_ID_KEY, id);
            cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
            for (int i = 0; i < n; i++) cJSON_AddStringToObject(map, t[i].name, names[shard_of[i]]);
            char *text = cJSON_Print(root);
            cJSON_Delete(root);
            if (atomic_open(&index_file, index_path, OUT_REPLACE) != 0) {
                rc = fail_with(err, errlen, "cannot create '%s': %s", index_path, strerror(errno));
            } else if (fputs(text, index_file.f) < 0 || fputc('\n', index_file.f) == EOF) {
                int e = errno;
                atomic_abort(&index_file);
                rc = fail_with(err, errlen, "writing '%s' failed: %s", index_path, strerror(e));
            } else if (atomic_finish(&index_file) != 0) {
                rc = fail_with(err, errlen, "writing '%s' failed: %s", index_path, strerror(errno));
            } else {
                index_staged = 1;
            }
            free(text);
        }
        // the shards' renames (over a previous save's of the same names), the index and the
        // removal of stale shards are one commit: a signal between them left shards of two saves
        sigset_t before;
        unfinished_hold_stops(&before);
        for (int k = 0; k < written && !rc; k++) {
            char *final = path_join(dir, names[k]);
            if (rename(partial[k], final) != 0) rc = fail_with(err, errlen, "cannot rename '%s' to '%s': %s", partial[k], final, strerror(errno));
            else { free(partial[k]); partial[k] = NULL; }
            free(final);
        }
        for (int k = 0; k < written; k++) {
            if (partial[k]) unlink(partial[k]);
            unfinished_done(unfinished[k]);
        }
        free(unfinished);
        if (!rc) {
            if (atomic_commit(&index_file) != 0) rc = fail_with(err, errlen, "writing '%s' failed: %s", index_path, strerror(errno));
        } else if (index_staged) {
            atomic_abort(&index_file);
        }
        if (!rc) {
            char **keep = xcalloc((size_t)n_shards + 1, sizeof(char *));
            for (int k = 0; k < n_shards; k++) keep[k] = names[k];
            keep[n_shards] = ST_INDEX_FILE;
            remove_stale(dir, old, n_old, keep, n_shards + 1);
            free(keep);
        }
        unfinished_release_stops(&before);
        for (int k = 0; k < n_shards; k++) { free(names[k]); free(partial[k]); }
        free(names);
        free(partial);
        free(meta);
    }
    free_names(old, n_old);
    free(shard_of);
    free(index_path);
    return rc;
}
