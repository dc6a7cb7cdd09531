// Document readers for clla prep and clla tokenizer train.
#include "data/corpus.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/json_strict.h"
#include "common/util.h"
#include "data/bytes.h"

struct DocReader {
    char *path;
    FILE *f;
    int jsonl;
    DocOptions opt;
    char *line;
    size_t line_cap;
    long long line_no;
    uint64_t offset;
    ByteVec doc;
    cJSON *json;
    int done;
};

// In any letter case: UP.JSONL read as text put its braces and quotes into the training data.
int corpus_path_is_jsonl(const char *path) { return path_has_ext(path, ".jsonl") || path_has_ext(path, ".json"); }

DocReader *doc_open(const char *path, const DocOptions *opt) {
    DocReader *r = xcalloc(1, sizeof(*r));
    r->f = fopen_read(path);   // a directory fails here with EISDIR, not as a read error
    if (!r->f) die("cannot read corpus file '%s': %s", path, strerror(errno));
    r->path = xstrdup(path);
    r->jsonl = corpus_path_is_jsonl(path);
    r->opt = *opt;
    if (!r->opt.text_key) r->opt.text_key = "text";
    if (r->opt.separator && strpbrk(r->opt.separator, "\r\n"))
        die("--doc-separator holds a line break: it is compared with whole lines, without their line ends; give the line alone");
    if (r->opt.separator && r->jsonl)
        warn("--doc-separator does not apply to '%s': JSONL has one document per line", path);
    return r;
}

static int next_jsonl(DocReader *r, const char **text, size_t *len) {
    for (;;) {
        uint64_t at = r->offset;
        ssize_t n = getline(&r->line, &r->line_cap, r->f);
        if (n < 0) return 0;
        r->offset += (uint64_t)n;
        r->line_no++;
        size_t k = (size_t)n;
        while (k && (r->line[k - 1] == '\n' || r->line[k - 1] == '\r' || r->line[k - 1] == ' ' || r->line[k - 1] == '\t')) k--;
        if (k == 0) continue;
        cJSON_Delete(r->json);
        // strict (common/json_strict.h): a second object on the line, text after the object, or
        // \u0000 would otherwise drop the rest of the line's text without a word
        char err[256];
        r->json = json_parse_line(r->line, k, err, sizeof(err));
        if (!r->json)
            die("%s:%lld (byte offset %llu): %s (JSONL: one JSON object per line)", r->path, r->line_no, (unsigned long long)at, err);
        if (!cJSON_IsObject(r->json))
            die("%s:%lld (byte offset %llu): not a JSON object: JSONL needs one object per line", r->path, r->line_no,
                (unsigned long long)at);
        cJSON *v = cJSON_GetObjectItemCaseSensitive(r->json, r->opt.text_key);
        if (!cJSON_IsString(v))
            die("%s:%lld (byte offset %llu): no string field \"%s\": name the text field with --text-key", r->path,
                r->line_no, (unsigned long long)at, r->opt.text_key);
        *text = v->valuestring;
        *len = strlen(v->valuestring);
        return 1;
    }
}

static int next_text(DocReader *r, const char **text, size_t *len) {
    if (r->done) return 0;
    r->doc.n = 0;
    if (!r->opt.separator) {
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), r->f)) > 0) bytevec_append(&r->doc, buf, n);
        if (ferror(r->f)) die("read error in corpus file '%s' at offset %zu", r->path, r->doc.n);
        r->offset = r->doc.n;
        r->done = 1;
    } else {
        size_t sep = strlen(r->opt.separator);
        for (;;) {
            ssize_t n = getline(&r->line, &r->line_cap, r->f);
            if (n < 0) { r->done = 1; break; }
            r->offset += (uint64_t)n;
            size_t k = (size_t)n;
            if (k && r->line[k - 1] == '\n') k--;
            if (k && r->line[k - 1] == '\r') k--;
            if (k == sep && !memcmp(r->line, r->opt.separator, sep)) {
                if (r->doc.n) break;
                continue;
            }
            bytevec_append(&r->doc, r->line, (size_t)n);
        }
    }
    if (!r->doc.n) return 0;
    // a NUL is no part of a text: a shard, an archive or UTF-16 given as a corpus would be
    // tokenized as if it were one
    const uint8_t *nul = memchr(r->doc.v, 0, r->doc.n);
    if (nul)
        die("corpus file '%s' holds a NUL byte (offset %llu of its document): not UTF-8 text (a token shard, an archive, UTF-16?): "
            "give text files, or .jsonl",
            r->path, (unsigned long long)(nul - r->doc.v));
    *text = (const char *)r->doc.v;
    *len = r->doc.n;
    return 1;
}

int doc_next(DocReader *r, const char **text, size_t *len) {
    return r->jsonl ? next_jsonl(r, text, len) : next_text(r, text, len);
}

uint64_t doc_offset(const DocReader *r) { return r->offset; }

void doc_close(DocReader *r) {
    if (!r) return;
    fclose(r->f);
    cJSON_Delete(r->json);
    free(r->line);
    free(r->doc.v);
    free(r->path);
    free(r);
}

char *data_cache_dir(void) {
    const char *env = getenv("CLLA_DATA_CACHE");
    if (env && *env) return xstrdup(env);
    struct stat st;
    if (stat("data_cache", &st) == 0 && S_ISDIR(st.st_mode)) return xstrdup("data_cache");
    // __FILE__ is this source file's path as the build saw it (absolute under CMake).
    const char *self = __FILE__;
    const char *cut = strstr(self, "data/corpus.c");
    if (self[0] == '/' && cut) {
        size_t n = (size_t)(cut - self);
        char *dir = xmalloc(n + sizeof("data_cache"));
        memcpy(dir, self, n);
        strcpy(dir + n, "data_cache");
        return dir;
    }
    return xstrdup("data_cache");
}
