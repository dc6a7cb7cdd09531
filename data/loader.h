// Training/validation batch source. The trainer only sees this interface; the file
// format behind it is chosen by the file's magic (data issue: compressed shards),
// falling back to a plain headerless little-endian uint32 token file.
#ifndef CLLA_DATA_LOADER_H
#define CLLA_DATA_LOADER_H

#include <stdint.h>

typedef struct DataLoader DataLoader;

typedef struct LoaderOptions {
    int B, T;                       // sequences per micro-batch, tokens per sequence
    unsigned long long seed;        // shuffling seed (formats that shuffle)
    int rank, world;                // this process's part of each global batch
    int vocab_size;                 // every token id must be < vocab_size (validated)
} LoaderOptions;

// Opens and validates path; dies with a message naming the file on any problem
// (missing, empty, shorter than one window, token id >= vocab_size).
DataLoader *loader_open(const char *path, const LoaderOptions *opt);
// Fills inputs (B*T) and targets (B*T): row b is a window of T+1 consecutive tokens.
void loader_next(DataLoader *dl, int32_t *inputs, int32_t *targets);
// Number of distinct windows of T+1 tokens one pass yields (for eval over a file).
long long loader_num_batches(const DataLoader *dl);
void loader_reset(DataLoader *dl);
void loader_close(DataLoader *dl);

#endif
