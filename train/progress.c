#include "train/progress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

int progress_due(int tty, double *last) {
    if (tty) return 1;
    const double now = now_seconds();
    if (now - *last < PROGRESS_LOG_SECONDS) return 0;
    *last = now;
    return 1;
}

void format_duration(char *buf, size_t len, double s) {
    if (s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%lds", t);
}

int metrics_write(int fd, const char *path, const cJSON *obj, char *err, size_t errlen) {
    if (fd < 0) return 0;
    char *text = cJSON_PrintUnformatted(obj);
    size_t n = strlen(text);
    char *line = malloc(n + 2);
    if (!line) {
        free(text);
        snprintf(err, errlen, "out of memory writing metrics file '%s'", path);
        return -1;
    }
    memcpy(line, text, n);
    line[n++] = '\n';
    free(text);
    // write(2), not stdio: a failed write must not stay in a buffer that a later flush or
    // fclose would push out after the file was cut back
    off_t start = lseek(fd, 0, SEEK_END);
    size_t done = 0;
    int rc = 0;
    while (done < n) {
        ssize_t w = write(fd, line + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            if (start >= 0 && ftruncate(fd, start) != 0) { /* the reader drops a last line without its newline */ }
            snprintf(err, errlen, "writing metrics file '%s' failed: %s", path, strerror(e));
            rc = -1;
            break;
        }
        done += (size_t)w;
    }
    free(line);
    return rc;
}
