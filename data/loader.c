// loader_open(): resolves the path (shard file, directory of shards, glob) and picks the
// format by magic; the other functions forward to the chosen format.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/num.h"
#include "common/util.h"
#include "data/loader_internal.h"
#include "data/shard.h"
#include "data/tokenizer.h"

struct DataLoader {
    PlainLoader *plain;
    ShardLoader *shards;
};

DataLoader *loader_open(const char *path, const LoaderOptions *opt) {
    if (opt->B <= 0 || opt->T <= 0 || opt->world <= 0 || opt->rank < 0 || opt->rank >= opt->world || opt->vocab_size <= 0)
        die("data loader for '%s': invalid options B=%d T=%d rank=%d world=%d vocab_size=%d", path, opt->B, opt->T,
            opt->rank, opt->world, opt->vocab_size);
    DataLoader *dl = xcalloc(1, sizeof(*dl));
    struct stat st;
    int is_file = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    if (is_file && !shard_has_magic(path)) {
        dl->plain = plain_open(path, opt);
        return dl;
    }
    int n = 0;
    char **paths = shard_list(path, &n);
    dl->shards = shards_open(paths, n, opt);
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
    return dl;
}

int loader_next_checked(DataLoader *dl, int32_t *inputs, int32_t *targets, char *err, size_t errlen) {
    if (dl->plain) {
        plain_next(dl->plain, inputs, targets);
        return 0;
    }
    return shards_next(dl->shards, inputs, targets, err, errlen);
}

void loader_next(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    char err[512];
    if (loader_next_checked(dl, inputs, targets, err, sizeof(err)) != 0) die("%s", err);
}

unsigned long long loader_data_tokenizer_hash(const DataLoader *dl) {
    return dl->plain ? 0 : shards_tokenizer_hash(dl->shards);
}

int loader_is_plain(const DataLoader *dl) { return dl->plain != NULL; }

long long loader_num_batches(const DataLoader *dl) {
    return dl->plain ? plain_num_batches(dl->plain) : shards_num_batches(dl->shards);
}

void loader_get_state(const DataLoader *dl, LoaderState *st) {
    if (dl->plain) plain_get_state(dl->plain, st);
    else shards_get_state(dl->shards, st);
}

void loader_set_state(DataLoader *dl, const LoaderState *st) {
    if (dl->plain) plain_set_state(dl->plain, st);
    else shards_set_state(dl->shards, st);
}

void loader_reset(DataLoader *dl) {
    LoaderState st;
    loader_get_state(dl, &st);
    st.epoch = 0;
    st.position = 0;
    loader_set_state(dl, &st);
}

void loader_close(DataLoader *dl) {
    if (!dl) return;
    plain_close(dl->plain);
    shards_close(dl->shards);
    free(dl);
}

int loader_parse_tokenizer_hash(const char *hex, unsigned long long *hash) {
    uint64_t h;
    if (num_parse_hex64(hex, &h) != 0) return -1;
    *hash = h;
    return 0;
}

void loader_format_tokenizer_hash(unsigned long long hash, char buf[24]) { snprintf(buf, 24, "%016llx", hash); }

unsigned long long loader_tokenizer_hash(const char *tokenizer_path) {
    Tokenizer *t = tok_load(tokenizer_path);
    unsigned long long h = tok_hash(t);
    tok_free(t);
    return h;
}
