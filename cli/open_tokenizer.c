#include "cli/open_tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

Tokenizer *open_tokenizer(const char *arg, const ModelDir *md, int vocab) {
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
    if (tok_vocab_size(t) > (uint32_t)vocab)
        die("tokenizer '%s' has %u ids, more than the model's vocab_size %d: pass the tokenizer the model was trained with", path,
            tok_vocab_size(t), vocab);
    return t;
}
