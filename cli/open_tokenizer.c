#include "cli/open_tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/loader.h"

void tokenizer_check_model(const Tokenizer *t, const char *path, int from_arg, int vocab, const char *model_hash) {
    if (tok_vocab_size(t) > (uint32_t)vocab)
        die("tokenizer '%s' has %u ids, more than the model's vocab_size %d: pass the tokenizer the model was trained with", path,
            tok_vocab_size(t), vocab);
    unsigned long long want = 0;
    if (!model_hash[0]) return;   // a model trained on plain token files records none
    if (loader_parse_tokenizer_hash(model_hash, &want) != 0)
        die("the model's train.tokenizer_hash '%s' is not 16 hex digits: fix its config.json", model_hash);
    if (tok_hash(t) != want)
        die(from_arg ? "tokenizer '%s' (hash %016llx) is not the one the model was trained with (train.tokenizer_hash %016llx): pass that tokenizer"
                     : "the model's tokenizer '%s' (hash %016llx) has changed since the model was trained with it (train.tokenizer_hash "
                       "%016llx): pass the tokenizer it was trained with as --tokenizer FILE",
            path, (unsigned long long)tok_hash(t), want);
}

Tokenizer *open_tokenizer(const char *arg, const ModelDir *md, int vocab, const char *model_hash) {
    const char *path = arg ? arg : md->tokenizer;
    if (!path)
        die("'%s' names no tokenizer (a %s without train.tokenizer): pass --tokenizer FILE", md->dir, model_dir_kind_name(md->kind));
    size_t len;
    char *text = read_file(path, &len);
    if (!text) die("cannot read tokenizer '%s'%s: %s: pass --tokenizer FILE", path, arg ? "" : " (the model's)", strerror(errno));
    char err[512];
    Tokenizer *t = tok_parse(text, len, path, err, sizeof(err));
    free(text);
    if (!t) die("%s", err);
    tokenizer_check_model(t, path, arg != NULL, vocab, model_hash);
    return t;
}
