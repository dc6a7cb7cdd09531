// Training/validation batch source. The trainer only sees this interface; the file
// format behind it is chosen by the file's magic (data issue: compressed shards),
// falling back to a plain headerless little-endian uint32 token file.
#ifndef CLLA_DATA_LOADER_H
#define CLLA_DATA_LOADER_H

#include <stddef.h>
#include <stdint.h>

typedef struct DataLoader DataLoader;

typedef struct LoaderOptions {
    int B, T;                       // sequences per micro-batch, tokens per sequence
    unsigned long long seed;        // shuffling seed (formats that shuffle)
    int rank, world;                // this process's part of each global batch
    int vocab_size;                 // every token id must be < vocab_size (validated)
    unsigned long long tokenizer_hash;  // shards: must equal the shards' tokenizer hash (0 = not checked)
} LoaderOptions;

// The exact position in the batch sequence, for checkpoints (state.json). fingerprint ties
// it to the data and the global batch layout, so it cannot be applied to other data.
typedef struct LoaderState {
    unsigned long long epoch;        // shards: completed passes over the data
    unsigned long long position;     // shards: next window of the epoch order; plain: token cursor
    unsigned long long fingerprint;  // data, T, B * world and seed
} LoaderState;

// Opens and validates path; dies with a message naming the file on any problem
// (missing, empty, shorter than one window, token id >= vocab_size).
// path: a shard file, a directory (its *.bin shards, in name order) or a glob of shards
// (docs/FORMAT.md); a single file without the shard magic is read as plain uint32 tokens.
DataLoader *loader_open(const char *path, const LoaderOptions *opt);
// Fills inputs (B*T) and targets (B*T): row b is a window of T+1 consecutive tokens.
// Dies with one line when the batch touches a damaged chunk.
void loader_next(DataLoader *dl, int32_t *inputs, int32_t *targets);
// The same, returning -1 with one line in err on a damaged chunk instead of dying (the state
// stays before that batch), so that a trainer can save its good state first.
int loader_next_checked(DataLoader *dl, int32_t *inputs, int32_t *targets, char *err, size_t errlen);
// The tokenizer hash the data was made with (shard header offset 32); 0 for a plain token file.
unsigned long long loader_data_tokenizer_hash(const DataLoader *dl);
// Number of micro-batches in one pass over the data (for eval over a file or a fixed
// validation set: loader_reset() then this many loader_next() calls).
long long loader_num_batches(const DataLoader *dl);
void loader_reset(DataLoader *dl);
// 1 when the data is a plain uint32 token file (rank/world do not apply: every rank would
// read the same batches), 0 for token shards.
int loader_is_plain(const DataLoader *dl);
void loader_close(DataLoader *dl);
// The state before the next loader_next(); setting it makes the following batches exactly
// those that followed when it was taken. Dies when the fingerprint does not match.
void loader_get_state(const DataLoader *dl, LoaderState *st);
void loader_set_state(DataLoader *dl, const LoaderState *st);
// train.tokenizer_hash text (16 hex digits) <-> the hash. parse: 0, or -1 when malformed.
int loader_parse_tokenizer_hash(const char *hex, unsigned long long *hash);
void loader_format_tokenizer_hash(unsigned long long hash, char buf[24]);
// Tokenizer hash for LoaderOptions.tokenizer_hash, read from a tokenizer file (dies on error).
unsigned long long loader_tokenizer_hash(const char *tokenizer_path);

#endif
