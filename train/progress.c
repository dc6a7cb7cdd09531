#include "train/progress.h"

#include <stdlib.h>

void format_duration(char *buf, size_t len, double s) {
    if (s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%lds", t);
}

void metrics_write(FILE *f, const cJSON *obj) {
    if (!f) return;
    char *line = cJSON_PrintUnformatted(obj);
    fprintf(f, "%s\n", line);
    fflush(f);
    free(line);
}
