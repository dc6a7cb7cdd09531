// Import of GPT-2's encoder.json + vocab.bpe into the rank-format tokenizer.
#ifndef CLLA_DATA_GPT2_IMPORT_H
#define CLLA_DATA_GPT2_IMPORT_H

#include "data/tokenizer.h"

// Dies with a message naming the file on any inconsistency.
Tokenizer *gpt2_import(const char *encoder_json, const char *vocab_bpe);

#endif
