// Reading documents from user corpora: JSONL (one JSON object per line, the text in a
// named string field; chosen by the .jsonl/.json extension) or plain text (the whole
// file is one document, or documents end at lines equal to a separator).
#ifndef CLLA_DATA_CORPUS_H
#define CLLA_DATA_CORPUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct DocOptions {
    const char *text_key;   // JSONL field holding the text ("text")
    const char *separator;  // plain text: a line equal to this ends a document (NULL: one per file)
} DocOptions;

typedef struct DocReader DocReader;

// Dies with a message naming the file when it cannot be read.
// Is path read as JSONL (one JSON object per line): .jsonl or .json, in any letter case.
int corpus_path_is_jsonl(const char *path);
DocReader *doc_open(const char *path, const DocOptions *opt);
// Returns 1 and the next document (valid until the next call), 0 at the end of the file.
// Dies naming file, line and byte offset on malformed JSONL.
int doc_next(DocReader *r, const char **text, size_t *len);
// Bytes of the file consumed so far (for progress).
uint64_t doc_offset(const DocReader *r);
void doc_close(DocReader *r);

// The project's data cache (scripts/setup.sh fills it): $CLLA_DATA_CACHE, else ./data_cache
// when it exists, else data_cache/ in the source tree this binary was built from.
// Returns a new string.
char *data_cache_dir(void);

#endif
