// Progress and metrics: a human line per logged step on stderr (with tokens/s and ETA)
// and one JSON object per line in the metrics file, for machines.
#ifndef CLLA_TRAIN_PROGRESS_H
#define CLLA_TRAIN_PROGRESS_H

#include <stdio.h>

#include <cjson/cJSON.h>

// Formats seconds as "1h02m", "3m05s" or "12s".
void format_duration(char *buf, size_t len, double seconds);
// Appends obj as one line to f and flushes (the caller keeps ownership of obj).
void metrics_write(FILE *f, const cJSON *obj);

#endif
