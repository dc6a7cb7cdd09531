// The formats behind data/loader.h; loader.c picks one by the file's magic.
#ifndef CLLA_DATA_LOADER_INTERNAL_H
#define CLLA_DATA_LOADER_INTERNAL_H

#include "data/loader.h"

typedef struct PlainLoader PlainLoader;
PlainLoader *plain_open(const char *path, const LoaderOptions *opt);
void plain_next(PlainLoader *pl, int32_t *inputs, int32_t *targets);
long long plain_num_batches(const PlainLoader *pl);
void plain_get_state(const PlainLoader *pl, LoaderState *st);
void plain_set_state(PlainLoader *pl, const LoaderState *st);
void plain_close(PlainLoader *pl);

typedef struct ShardLoader ShardLoader;
// paths: the shard files, in order.
ShardLoader *shards_open(char **paths, int n_paths, const LoaderOptions *opt);
// -1 with err when the batch touches a damaged chunk (the state stays before it).
int shards_next(ShardLoader *sl, int32_t *inputs, int32_t *targets, char *err, size_t errlen);
long long shards_num_batches(const ShardLoader *sl);
unsigned long long shards_tokenizer_hash(const ShardLoader *sl);
void shards_get_state(const ShardLoader *sl, LoaderState *st);
void shards_set_state(ShardLoader *sl, const LoaderState *st);
void shards_close(ShardLoader *sl);

#endif
