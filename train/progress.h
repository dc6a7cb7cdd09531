// Progress and metrics: a human line per logged step on stderr (with tokens/s and ETA)
// and one JSON object per line in the metrics file, for machines.
#ifndef CLLA_TRAIN_PROGRESS_H
#define CLLA_TRAIN_PROGRESS_H

#include <stddef.h>

#include <cjson/cJSON.h>

// Formats seconds as "1h02m", "3m05s" or "12s".
void format_duration(char *buf, size_t len, double seconds);
// Whether a progress line is due: on a terminal (tty) every update, one line rewritten; in a
// log a line every PROGRESS_LOG_SECONDS since *last (updated), none for work shorter than that.
#define PROGRESS_LOG_SECONDS 10.0
int progress_due(int tty, double *last);
// Appends obj as one line to the metrics file open for appending on fd (the caller keeps
// ownership of obj). Returns 0, or -1 with one line in err when the write fails (disk full,
// file-size limit): then the file is cut back to its last whole line, never left mid-line.
int metrics_write(int fd, const char *path, const cJSON *obj, char *err, size_t errlen);

#endif
