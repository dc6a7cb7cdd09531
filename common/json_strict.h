// Strict JSON for files a user writes (configs): cJSON reads a prefix and ignores what follows
// ("64k" is 64), keeps duplicate keys (the first wins when looked up, the last when iterated)
// and reports every failure as a bare offset. This reads the whole text or refuses it with the
// line and column: syntax errors, text after the value, duplicate keys in an object, NUL
// bytes, nesting deeper than cJSON allows (said as such, not as a syntax error), and what
// cJSON reads more loosely than JSON: numbers such as 032, 32. or +1, integers beyond 2^53
// (not held exactly), control characters outside strings or raw in them, and \u0000.
#ifndef CLLA_COMMON_JSON_STRICT_H
#define CLLA_COMMON_JSON_STRICT_H

#include <stddef.h>

#include <cjson/cJSON.h>

// Parses text[0..len). Returns the tree (the caller frees it with cJSON_Delete), or NULL with
// "line L, column C: <problem>" in err.
cJSON *json_parse_strict(const char *text, size_t len, char *err, size_t errlen);

// One line of a JSONL file, text[0..len) (no NUL needed after it): json_parse_strict on it, a
// failure said as "column C: <problem>" in err (the caller names the file and the line).
cJSON *json_parse_line(const char *text, size_t len, char *err, size_t errlen);

// The JSON text of a value for messages, shortened to fit buf ("..." when cut).
const char *json_snippet(const cJSON *v, char *buf, size_t n);

#endif
