// Byte-level BPE tokenizer with tiktoken semantics: a token id is the rank of its byte
// string; a piece of pre-tokenized text is encoded by repeatedly merging the adjacent
// pair whose concatenation has the lowest rank (leftmost first). Special tokens such as
// <|endoftext|> are matched in text only when the caller allows it.
// File format: docs/FORMAT.md, "Tokenizer file". Functions that take err/errlen report
// problems there and return NULL/-1 instead of exiting, so fuzzers can drive them;
// tok_load() is the dying wrapper for commands.
#ifndef CLLA_DATA_TOKENIZER_H
#define CLLA_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/util.h"
#include "data/bytes.h"

#define TOK_MAX_ID (1u << 22)       // ids (ranks) at or above this are rejected as implausible
#define TOK_MAX_TOKEN_BYTES 4096    // longest token byte string accepted
#define TOK_NONE UINT32_MAX

typedef struct Tokenizer Tokenizer;
typedef struct TokEncoder TokEncoder;

// Building: tok_new(), tok_add() for each token (ordinary or special), tok_finish().
Tokenizer *tok_new(const char *pattern, char *err, size_t errlen);
// May this text be a special token's? Non-empty and without ASCII white space (space, \t, \n, \v,
// \f, \r), which the tokenizer file's "#special TEXT ID" line could not hold (docs/FORMAT.md).
// The one rule for the loader, the trainer and the command line.
int tok_special_text_ok(const char *s, size_t n);
int tok_add(Tokenizer *t, uint32_t id, const uint8_t *bytes, size_t len, int special, char *err, size_t errlen);
// Checks that every single byte is a token (so any input can be encoded), indexes the
// vocabulary and computes the hash. 0 on success.
int tok_finish(Tokenizer *t, char *err, size_t errlen);
void tok_free(Tokenizer *t);

// The text file: parse from memory (name is used in messages), load (dies), save (atomic).
Tokenizer *tok_parse(const char *buf, size_t len, const char *name, char *err, size_t errlen);
Tokenizer *tok_load(const char *path);
int tok_save(const Tokenizer *t, const char *path, OutMode mode);   // -1 (errno; EEXIST: see AtomicFile)

uint32_t tok_vocab_size(const Tokenizer *t);   // largest id + 1
uint64_t tok_hash(const Tokenizer *t);         // identifies the vocabulary, pattern and specials
const char *tok_pattern(const Tokenizer *t);
int tok_n_special(const Tokenizer *t);
uint32_t tok_special_id(const Tokenizer *t, const char *text);   // TOK_NONE when absent
// Bytes of id (NULL when id is unused); *special tells whether it is a special token.
const uint8_t *tok_bytes(const Tokenizer *t, uint32_t id, size_t *len, int *special);
// Id of an ordinary token's exact byte string, TOK_NONE when it is not in the vocabulary.
uint32_t tok_lookup(const Tokenizer *t, const uint8_t *bytes, size_t len);

// Per-thread encoding state (PCRE2 match data, merge buffers).
TokEncoder *tok_encoder_new(const Tokenizer *t);
void tok_encoder_free(TokEncoder *e);
// Appends the ids of text[0, len) to out. With allow_special, exact occurrences of special
// token strings become their ids; otherwise they are encoded as ordinary text.
void tok_encode(TokEncoder *e, const char *text, size_t len, int allow_special, U32Vec *out);
// Appends the bytes of ids to out. Returns -1 (and *bad = index of the offending id) when
// an id is not in the vocabulary, else 0.
int tok_decode(const Tokenizer *t, const uint32_t *ids, size_t n, ByteVec *out, size_t *bad);

#endif
