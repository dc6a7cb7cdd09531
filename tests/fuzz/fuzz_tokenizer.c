// libFuzzer target for the tokenizer (built and run by tests/test_fuzz_data.sh).
// The first input byte picks what the rest is:
//   0-5: text to encode with one of three small trained vocabularies (gpt2, cl100k,
//        llama3 patterns; specials allowed or not); decode must give the text back;
//   6:   a tokenizer file to parse; when it parses, it must round-trip a fixed text;
//   7:   a corpus to train a 300-token vocabulary on, which must round-trip the corpus.
// Any mismatch aborts (a crash for libFuzzer); the sanitizers catch memory errors.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe_train.h"
#include "data/tokenizer.h"

static const char CORPUS[] =
    "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
    "produced no evidence that any irregularities took place. It's 1962; they'll say they've won 12345 votes!\n\n"
    "\xe5\x9c\xa8 Debian \xe8\xbf\x99\xe7\xa7\x8d\xe8\xa7\x84\xe6\xa8\xa1\xe7\x9a\x84\xe9\xa1\xb9\xe7\x9b\xae\xe4\xb8\xad"
    "\xef\xbc\x8c\xe5\xbe\x88\xe9\x9a\xbe\xe9\x81\xbf\xe5\x85\x8d   \t\r\n  spaces   and\ttabs\n";

static Tokenizer *train(const char *pattern, const uint8_t *text, size_t len, uint32_t vocab) {
    char err[256];
    BpeTrainer *bt = bpe_trainer_new(pattern, err, sizeof(err));
    if (!bt) abort();
    bpe_trainer_add(bt, (const char *)text, len);
    const char *specials[] = {"<|endoftext|>", "<s>"};
    Tokenizer *t = bpe_trainer_finish(bt, vocab, specials, 2, 0, err, sizeof(err));
    bpe_trainer_free(bt);
    if (!t) { fprintf(stderr, "training failed: %s\n", err); abort(); }
    return t;
}

static void roundtrip(const Tokenizer *t, const uint8_t *text, size_t len, int allow_special) {
    TokEncoder *e = tok_encoder_new(t);
    U32Vec ids = {0};
    ByteVec out = {0};
    tok_encode(e, (const char *)text, len, allow_special, &ids);
    if (tok_decode(t, ids.v, ids.n, &out, NULL) != 0 || out.n != len || (len && memcmp(out.v, text, len))) {
        fprintf(stderr, "round-trip mismatch: %zu bytes in, %zu out\n", len, out.n);
        abort();
    }
    free(ids.v);
    free(out.v);
    tok_encoder_free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Tokenizer *toks[3];
    if (!toks[0]) {
        const char *patterns[3] = {"gpt2", "cl100k", "llama3"};
        for (int i = 0; i < 3; i++) toks[i] = train(patterns[i], (const uint8_t *)CORPUS, sizeof(CORPUS) - 1, 400);
    }
    if (size < 1) return 0;
    uint8_t mode = data[0] % 8;
    data++;
    size--;
    if (mode < 6) {
        roundtrip(toks[mode % 3], data, size, mode >= 3);
    } else if (mode == 6) {
        char err[512];
        Tokenizer *t = tok_parse((const char *)data, size, "fuzz.tok", err, sizeof(err));
        if (t) {
            roundtrip(t, (const uint8_t *)CORPUS, sizeof(CORPUS) - 1, 1);
            tok_free(t);
        } else if (!strstr(err, "fuzz.tok")) {
            fprintf(stderr, "error message without the file name: %s\n", err);
            abort();
        }
    } else {
        Tokenizer *t = train("gpt2", data, size, 300);
        roundtrip(t, data, size, 0);
        tok_free(t);
    }
    return 0;
}
