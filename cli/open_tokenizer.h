// The tokenizer a command runs a model with: --tokenizer FILE, else the model directory's
// (docs/INFERENCE.md, "Model directories"). Shared by generate and eval --bench.
#ifndef CLLA_CLI_OPEN_TOKENIZER_H
#define CLLA_CLI_OPEN_TOKENIZER_H

#include "data/tokenizer.h"
#include "model/model_dir.h"

// arg: the --tokenizer value or NULL. Dies with one line when there is none, it cannot be read,
// or it fails tokenizer_check_model.
Tokenizer *open_tokenizer(const char *arg, const ModelDir *md, int vocab, const char *model_hash);
// The checks of the tokenizer a command serves a model with (read from path; from_arg: given by
// --tokenizer, else the model's own): no more ids than the model's vocab, and, where the model
// records the hash of its training data's tokenizer (model_hash, train.tokenizer_hash; "" when
// unknown), that hash: another tokenizer's ids would be read as the model's. Dies with one line.
void tokenizer_check_model(const Tokenizer *t, const char *path, int from_arg, int vocab, const char *model_hash);

#endif
