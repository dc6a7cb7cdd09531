// The tokenizer a command runs a model with: --tokenizer FILE, else the model directory's
// (docs/INFERENCE.md, "Model directories"). Shared by generate and eval --bench.
#ifndef CLLA_CLI_OPEN_TOKENIZER_H
#define CLLA_CLI_OPEN_TOKENIZER_H

#include "data/tokenizer.h"
#include "model/model_dir.h"

// arg: the --tokenizer value or NULL. Dies with one line when there is none, it cannot be read,
// or it has more ids than the model's vocab.
Tokenizer *open_tokenizer(const char *arg, const ModelDir *md, int vocab);

#endif
