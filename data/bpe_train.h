// Learning a byte-level BPE vocabulary from a corpus: pre-tokenize with the named
// pattern, count distinct pieces, then repeatedly merge the most frequent adjacent pair.
#ifndef CLLA_DATA_BPE_TRAIN_H
#define CLLA_DATA_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

typedef struct BpeTrainer BpeTrainer;

BpeTrainer *bpe_trainer_new(const char *pattern, char *err, size_t errlen);
void bpe_trainer_free(BpeTrainer *bt);
// Counts the pieces of one document (not thread-safe).
void bpe_trainer_add(BpeTrainer *bt, const char *text, size_t len);
uint64_t bpe_trainer_distinct_pieces(const BpeTrainer *bt);
// Pieces longer than BPE_MAX_PIECE bytes are skipped (not counted, nothing merged from them):
// how many were, and their bytes in *bytes.
#define BPE_MAX_PIECE 256
uint64_t bpe_trainer_long_pieces(const BpeTrainer *bt, uint64_t *bytes);

// Learns merges until the vocabulary holds vocab_size ids in all: 256 bytes, the merges,
// then the special tokens (last ids). Ties between equally frequent pairs go to the
// smaller (left id, right id), so the result is deterministic. Progress goes to stderr
// when verbose. Returns NULL with err filled when vocab_size is too small.
Tokenizer *bpe_trainer_finish(BpeTrainer *bt, uint32_t vocab_size, const char *const *specials, int n_specials,
                              int verbose, char *err, size_t errlen);

#endif
