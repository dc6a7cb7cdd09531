// Shard format and loader tests: write/read for both token widths, the epoch order
// (every window once, deterministic per seed), rank partitions whose union is the
// 1-rank global batch, exact resume (also across an epoch boundary), directory and glob
// paths, the plain uint32 fallback, and every bad input (run in a forked child: the
// loader dies) exiting non-zero with a message naming the file and the offset.
// Output: one line per check, then "N passed, M failed"; exit status 1 on any failure.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/bytes.h"
#include "data/loader.h"
#include "data/shard.h"
#include "tests/lib/death.h"

static int n_passed, n_failed;
static char dir[64];

static void check(int ok, const char *what) {
    if (ok) n_passed++;
    else n_failed++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

// Token i of shard s is (s * 60000 + i) % vocab: with vocab 200000 and shards shorter than
// 60000 tokens, a window's first token tells where it came from, and consecutive tokens
// prove it is contiguous.
static uint32_t tok_at(int s, uint64_t i, uint32_t vocab) { return (uint32_t)(((uint64_t)s * 60000u + i) % vocab); }

static char *write_shard(const char *name, int s, uint64_t n, uint32_t vocab, uint32_t chunk, uint64_t hash) {
    char *p = path_join(dir, name);
    ShardWriter *w = shard_writer_open(p, vocab, hash, chunk, 1);
    uint32_t buf[777];
    for (uint64_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < 777 && i < n; k++, i++) buf[k] = tok_at(s, i, vocab);
        shard_writer_add(w, buf, k);
    }
    shard_writer_close(w);
    return p;
}

static void test_roundtrip(void) {
    const uint32_t vocabs[2] = {50257, 1u << 20};
    for (int v = 0; v < 2; v++) {
        char *p = write_shard("rt.bin", 3, 100000, vocabs[v], 4096, 77);
        Shard s;
        char err[512];
        int ok = shard_open(&s, p, err, sizeof(err)) == 0 && s.n_tokens == 100000 && s.token_bytes == (v ? 4u : 2u) &&
                 s.vocab_size == vocabs[v] && s.tokenizer_hash == 77 && s.n_chunks == (100000 + 4095) / 4096;
        ShardReadBuf *rb = shard_readbuf_new();
        uint32_t *buf = malloc(4096 * sizeof(uint32_t));
        for (uint32_t c = 0; ok && c < s.n_chunks; c++) {
            ok = shard_read_chunk(&s, c, rb, buf, err, sizeof(err)) == 0;
            for (uint32_t i = 0; ok && i < s.chunks[c].n_tokens; i++) ok = buf[i] == tok_at(3, s.chunks[c].first_token + i, vocabs[v]);
        }
        check(ok, v ? "uint32 shard (vocab 2^20) reads back every token" : "uint16 shard (vocab 50257) reads back every token");
        free(buf);
        shard_readbuf_free(rb);
        shard_close(&s);
        unlink(p);
        free(p);
    }
}

// Reads n batches; returns B*T*n inputs (targets checked to be inputs shifted by one).
static int32_t *read_batches(DataLoader *dl, int B, int T, int n, int *shift_ok) {
    int32_t *all = malloc(((size_t)n * B * T + 1) * sizeof(int32_t));
    int32_t *tg = malloc((size_t)B * T * sizeof(int32_t));
    *shift_ok = 1;
    for (int k = 0; k < n; k++) {
        int32_t *in = all + (size_t)k * B * T;
        loader_next(dl, in, tg);
        for (int b = 0; b < B; b++)
            for (int t = 0; t + 1 < T; t++)
                if (tg[b * T + t] != in[b * T + t + 1]) *shift_ok = 0;
    }
    free(tg);
    return all;
}

static void test_loader(const char *data) {
    const int T = 64, B = 4;
    // data: shards 0..2 of 50000, 30001, 20000 tokens, chunks of 1000 tokens.
    DataLoader *dl = loader_open(data, &(LoaderOptions){.B = B, .T = T, .seed = 5, .rank = 0, .world = 1, .vocab_size = 200000});
    long long nb = loader_num_batches(dl);
    long long windows = (50000 - 1) / T + (30001 - 1) / T + (20000 - 1) / T;
    check(nb == windows / B, "batches per epoch = windows / global batch");
    int shift_ok;
    int32_t *e1 = read_batches(dl, B, T, (int)nb, &shift_ok);
    check(shift_ok, "targets are the inputs shifted by one");
    // Every window: contiguous, starts at a multiple of T in its shard, seen once.
    int contiguous = 1, aligned = 1;
    char *seen = calloc(200000, 1);
    int dup = 0;
    for (long long w = 0; w < nb * B; w++) {
        const int32_t *row = e1 + w * T;
        for (int t = 1; t < T; t++) contiguous &= row[t] == row[t - 1] + 1;
        int s = row[0] / 60000, pos = row[0] % 60000;  // (shard, position) of the window
        aligned &= pos % T == 0;
        dup += seen[(size_t)s * 60000 + (size_t)pos / T]++;
    }
    check(contiguous, "every window is T+1 contiguous tokens (across chunk boundaries too)");
    check(aligned && !dup, "an epoch visits windows at multiples of T, none twice");
    free(seen);
    // Same seed: same order; the next epoch: a different order.
    DataLoader *dl2 = loader_open(data, &(LoaderOptions){.B = B, .T = T, .seed = 5, .rank = 0, .world = 1, .vocab_size = 200000});
    int32_t *again = read_batches(dl2, B, T, (int)nb, &shift_ok);
    check(!memcmp(e1, again, (size_t)nb * B * T * sizeof(int32_t)), "same seed, same batches");
    int32_t *e2 = read_batches(dl, B, T, (int)nb, &shift_ok);
    check(memcmp(e1, e2, (size_t)nb * B * T * sizeof(int32_t)) != 0, "the next epoch is shuffled differently");
    DataLoader *dl3 = loader_open(data, &(LoaderOptions){.B = B, .T = T, .seed = 6, .rank = 0, .world = 1, .vocab_size = 200000});
    int32_t *other = read_batches(dl3, B, T, 4, &shift_ok);
    check(memcmp(e1, other, (size_t)4 * B * T * sizeof(int32_t)) != 0, "another seed, other batches");
    loader_close(dl3);
    free(other);
    free(again);
    free(e2);
    loader_close(dl2);
    // Ranks: world R with B/R each; rank r's rows are rows [r*B/R, (r+1)*B/R) of the
    // 1-rank global batch, for every step (so disjoint, and the union is the batch).
    const int steps = 40;
    loader_reset(dl);
    int32_t *one = read_batches(dl, B, T, steps, &shift_ok);
    const int worlds[2] = {2, 4};
    for (int wi = 0; wi < 2; wi++) {
        int R = worlds[wi], b = B / R, ok = 1;
        for (int r = 0; r < R; r++) {
            DataLoader *d = loader_open(data, &(LoaderOptions){.B = b, .T = T, .seed = 5, .rank = r, .world = R, .vocab_size = 200000});
            int32_t *mine = read_batches(d, b, T, steps, &shift_ok);
            for (int k = 0; k < steps; k++)
                ok &= !memcmp(mine + (size_t)k * b * T, one + ((size_t)k * B + (size_t)r * b) * T, (size_t)b * T * sizeof(int32_t));
            free(mine);
            loader_close(d);
        }
        check(ok, R == 2 ? "2 ranks x B/2: disjoint parts whose union is the 1-rank global batch"
                         : "4 ranks x B/4: disjoint parts whose union is the 1-rank global batch");
    }
    free(one);
    // Resume: state after k batches (also past the epoch end) gives the same continuation.
    const int ks[2] = {7, (int)nb - 2};
    for (int i = 0; i < 2; i++) {
        loader_reset(dl);
        int32_t *skip = read_batches(dl, B, T, ks[i], &shift_ok);
        LoaderState st;
        loader_get_state(dl, &st);
        int32_t *cont = read_batches(dl, B, T, 6, &shift_ok);
        DataLoader *d = loader_open(data, &(LoaderOptions){.B = B, .T = T, .seed = 5, .rank = 0, .world = 1, .vocab_size = 200000});
        loader_set_state(d, &st);
        int32_t *res = read_batches(d, B, T, 6, &shift_ok);
        check(!memcmp(cont, res, (size_t)6 * B * T * sizeof(int32_t)),
              i ? "resume across the epoch boundary is exact" : "resume from a saved state is exact");
        // The state is rank-independent: rank 1 of 2 resumes into its part of the same batches.
        DataLoader *r1 = loader_open(data, &(LoaderOptions){.B = B / 2, .T = T, .seed = 5, .rank = 1, .world = 2, .vocab_size = 200000});
        LoaderState st2;
        loader_get_state(r1, &st2);
        loader_set_state(r1, &st);
        int32_t *half = read_batches(r1, B / 2, T, 1, &shift_ok);
        if (i == 0) check(st2.fingerprint == st.fingerprint && !memcmp(half, cont + (size_t)(B / 2) * T, (size_t)(B / 2) * T * sizeof(int32_t)),
                          "a state saved with 1 rank resumes on 2 ranks (same global batch)");
        free(half);
        loader_close(r1);
        free(skip);
        free(cont);
        free(res);
        loader_close(d);
    }
    loader_close(dl);
    free(e1);
}

static void test_plain(void) {
    char *p = path_join(dir, "plain.u32");
    FILE *f = fopen(p, "wb");
    for (uint32_t i = 0; i < 1000; i++) fwrite(&i, 4, 1, f);
    fclose(f);
    DataLoader *dl = loader_open(p, &(LoaderOptions){.B = 2, .T = 10, .seed = 1, .rank = 0, .world = 1, .vocab_size = 2000});
    int32_t in[20], tg[20];
    int ok = 1;
    for (int k = 0; k < 60; k++) {
        loader_next(dl, in, tg);
        long long pos = (long long)k * 20 % (49 * 20);  // wraps when fewer than B*T+1 tokens remain
        for (int i = 0; i < 20; i++) ok &= in[i] == pos + i && tg[i] == pos + i + 1;
    }
    check(ok && loader_num_batches(dl) == 49, "plain uint32 file: consecutive batches, wrap to 0 (the documented order)");
    LoaderState st;
    loader_get_state(dl, &st);
    loader_next(dl, in, tg);
    loader_set_state(dl, &st);
    int32_t in2[20];
    loader_next(dl, in2, tg);
    check(!memcmp(in, in2, sizeof(in)), "plain file: resume is exact");
    loader_close(dl);
    unlink(p);
    free(p);
}

// Runs fn(arg) in a child; passes when it exits non-zero and stderr has every needle.
static void expect_death(void (*fn)(const void *), const char *arg, const char *n1, const char *n2, const char *what) {
    char msg[2048];
    const int ok = died_with(fn, arg, n1, n2, msg, sizeof(msg));
    check(ok, what);
    if (!ok) printf("     stderr: %s\n", msg);
    else printf("     %s", msg);
}

static void open_and_read(const void *arg) {
    const char *path = arg;
    DataLoader *dl = loader_open(path, &(LoaderOptions){.B = 2, .T = 16, .seed = 1, .rank = 0, .world = 1, .vocab_size = 60000});
    int32_t in[32], tg[32];
    for (long long k = 0; k < 2 * loader_num_batches(dl) + 2; k++) loader_next(dl, in, tg);
    loader_close(dl);
}

static void open_small_vocab(const void *arg) {
    const char *path = arg;
    loader_open(path, &(LoaderOptions){.B = 2, .T = 16, .seed = 1, .rank = 0, .world = 1, .vocab_size = 999});
}

static void open_other_tokenizer(const void *arg) {
    const char *path = arg;
    loader_open(path, &(LoaderOptions){.B = 2, .T = 16, .seed = 1, .rank = 0, .world = 1, .vocab_size = 60000,
                                       .tokenizer_hash = 0x1234});
}

static void open_big_batch(const void *arg) {
    const char *path = arg;
    loader_open(path, &(LoaderOptions){.B = 64, .T = 1024, .seed = 1, .rank = 0, .world = 1, .vocab_size = 60000});
}

static void resume_other(const void *arg) {
    const char *path = arg;
    DataLoader *dl = loader_open(path, &(LoaderOptions){.B = 2, .T = 16, .seed = 1, .rank = 0, .world = 1, .vocab_size = 60000});
    LoaderState st;
    loader_get_state(dl, &st);
    st.fingerprint ^= 1;
    loader_set_state(dl, &st);
}

// The state of a loader over one shard set applied to a loader over another (arg: "A|B"): the
// same token count, other content (or other chunking) must be refused.
static void resume_same_count(const void *arg) {
    char a[256], *b;
    snprintf(a, sizeof(a), "%s", (const char *)arg);
    b = strchr(a, '|');
    *b++ = 0;
    const LoaderOptions opt = {.B = 2, .T = 16, .seed = 1, .rank = 0, .world = 1, .vocab_size = 200000};
    DataLoader *da = loader_open(a, &opt), *db = loader_open(b, &opt);
    LoaderState st;
    loader_get_state(da, &st);
    loader_set_state(db, &st);
}

// A checkpoint written before content fingerprints (2026-11-28) holds the fingerprint of B * world,
// seed, T and each shard's token count and tokenizer hash: still taken (with a warning).
static void test_legacy_fingerprint(const char *path) {
    const LoaderOptions opt = {.B = 2, .T = 16, .seed = 1, .rank = 0, .world = 1, .vocab_size = 200000};
    DataLoader *dl = loader_open(path, &opt);
    Shard s;
    char err[512];
    if (shard_open(&s, path, err, sizeof(err)) != 0) { check(0, err); return; }
    const uint64_t gb = 2, seed = 1;
    const int T = 16;
    uint64_t fp = fnv1a64_update(FNV64_OFFSET, &gb, sizeof(gb));
    fp = fnv1a64_update(fp, &seed, sizeof(seed));
    fp = fnv1a64_update(fp, &T, sizeof(T));
    fp = fnv1a64_update(fp, &s.n_tokens, sizeof(s.n_tokens));
    fp = fnv1a64_update(fp, &s.tokenizer_hash, sizeof(s.tokenizer_hash));
    shard_close(&s);
    LoaderState st;
    loader_get_state(dl, &st);
    check(st.fingerprint != fp, "the fingerprint covers more than the token counts");
    st.fingerprint = fp;
    loader_set_state(dl, &st);   // dies when refused
    check(1, "a checkpoint's counts-only fingerprint (before 2026-11-28) is still taken");
    loader_close(dl);
}

// Copies src to a new file in dir with bytes changed by edit().
static char *damaged(const char *src, const char *name, void (*edit)(uint8_t *buf, size_t *len)) {
    size_t len;
    uint8_t *buf = (uint8_t *)read_file(src, &len);
    edit(buf, &len);
    char *sub = path_join(dir, name);
    mkdir(sub, 0755);
    char *p = path_join(sub, "shard_000000.bin");
    FILE *f = fopen(p, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    free(buf);
    free(sub);
    return p;
}

static void edit_magic(uint8_t *b, size_t *n) { (void)n; b[0] = 'X'; }
static void edit_truncate(uint8_t *b, size_t *n) { (void)b; *n -= 100; }
static void edit_chunk(uint8_t *b, size_t *n) { (void)n; b[SHARD_HEADER_BYTES + 5] ^= 0x40; }
static void edit_header(uint8_t *b, size_t *n) { (void)n; b[20] ^= 1; }
// Claims a vocabulary of 500 (checksum fixed up), so stored ids up to 999 are out of range.
static void edit_vocab(uint8_t *b, size_t *n) {
    (void)n;
    put_le32(b + 24, 500);
    put_le64(b + 56, fnv1a64(b, 56));
}

static void test_bad_inputs(const char *good) {
    char *p;
    p = damaged(good, "bad_magic", edit_magic);
    char *d = strdup(p);
    *strrchr(d, '/') = 0;
    expect_death(open_and_read, d, "shard_000000.bin", "wrong magic at offset 0", "wrong magic: error names file and offset");
    free(d);
    free(p);
    p = damaged(good, "bad_trunc", edit_truncate);
    expect_death(open_and_read, p, "bad_trunc/shard_000000.bin", "truncated", "truncated file: error names file and offset");
    free(p);
    p = damaged(good, "bad_chunk", edit_chunk);
    expect_death(open_and_read, p, "bad_chunk/shard_000000.bin", "checksum mismatch in chunk 0 at offset 64",
                 "damaged chunk: checksum error names file and offset");
    free(p);
    p = damaged(good, "bad_header", edit_header);
    expect_death(open_and_read, p, "bad_header/shard_000000.bin", "header checksum mismatch at offset 56",
                 "damaged header: checksum error names file and offset");
    free(p);
    p = damaged(good, "bad_vocab", edit_vocab);
    expect_death(open_and_read, p, "bad_vocab/shard_000000.bin", ">= vocab size 500", "token id beyond the vocabulary: error names file and offset");
    free(p);
    expect_death(open_small_vocab, good, "good.bin", "vocab_size 999", "shards of a larger vocabulary than the model: error");
    expect_death(open_other_tokenizer, good, "good.bin", "another tokenizer (hash", "tokenizer hash mismatch: error names file and offset");
    expect_death(open_big_batch, good, "good.bin", "fewer than one global batch", "too little data for one batch: error");
    expect_death(resume_other, good, "good.bin", "saved data position", "resume with a state of other data: error");
    {
        char *a = write_shard("same_a.bin", 3, 5000, 200000, 1000, 9), *b = write_shard("same_b.bin", 4, 5000, 200000, 1000, 9);
        char *c = write_shard("same_c.bin", 3, 5000, 200000, 500, 9), pair[600];
        snprintf(pair, sizeof(pair), "%s|%s", a, b);
        expect_death(resume_same_count, pair, "same_b.bin", "saved data position", "resume on other tokens of the same count: error");
        snprintf(pair, sizeof(pair), "%s|%s", a, c);
        expect_death(resume_same_count, pair, "same_c.bin", "saved data position", "resume on the same tokens in other chunks: error");
        test_legacy_fingerprint(a);
        free(a); free(b); free(c);
    }
    char *missing = path_join(dir, "nothing*.bin");
    expect_death(open_and_read, missing, "nothing*.bin", "no file matches", "glob without matches: error");
    free(missing);
    char *empty = path_join(dir, "empty");
    mkdir(empty, 0755);
    expect_death(open_and_read, empty, "empty", "no *.bin shards", "directory without shards: error");
    free(empty);
}

int main(void) {
    snprintf(dir, sizeof(dir), "/tmp/clla_shards_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    test_roundtrip();
    char *sub = path_join(dir, "set");
    mkdir(sub, 0755);
    char *names[3] = {"set/a_000.bin", "set/a_001.bin", "set/a_002.bin"};
    uint64_t lens[3] = {50000, 30001, 20000};
    for (int s = 0; s < 3; s++) free(write_shard(names[s], s, lens[s], 200000, 1000, 99));
    test_loader(sub);
    char *glob = path_join(dir, "set/a_00*.bin");
    DataLoader *a = loader_open(sub, &(LoaderOptions){.B = 2, .T = 32, .seed = 3, .rank = 0, .world = 1, .vocab_size = 200000});
    DataLoader *b = loader_open(glob, &(LoaderOptions){.B = 2, .T = 32, .seed = 3, .rank = 0, .world = 1, .vocab_size = 200000});
    int32_t x[64], y[64], tg[64];
    loader_next(a, x, tg);
    loader_next(b, y, tg);
    check(!memcmp(x, y, sizeof(x)) && loader_num_batches(a) == loader_num_batches(b), "a glob and a directory name the same shards");
    loader_close(a);
    loader_close(b);
    test_plain();
    char *good = write_shard("good.bin", 0, 5000, 1000, 700, 42);
    test_bad_inputs(good);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("     (could not remove %s)\n", dir);
    free(good); free(glob); free(sub);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
