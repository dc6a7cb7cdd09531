// Resolving a data path to shard files: a file, a directory's *.bin files, or a glob.
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "data/shard.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }


// The *.bin files of a directory, sorted by name.
static char **list_dir(const char *dir, int *n) {
    DIR *d = opendir(dir);
    if (!d) die("cannot list data directory '%s': %s", dir, strerror(errno));
    char **v = NULL;
    int cap = 0;
    *n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !path_has_ext(e->d_name, ".bin")) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            v = realloc(v, (size_t)cap * sizeof(*v));
            if (!v) die("out of memory listing '%s'", dir);
        }
        v[(*n)++] = path_join(dir, e->d_name);
    }
    closedir(d);
    if (*n == 0) die("data directory '%s' has no *.bin shards: make them with 'clla prep --out DIR' and pass DIR/train or DIR/val", dir);
    qsort(v, (size_t)*n, sizeof(*v), cmp_str);
    return v;
}

static char **expand_glob(const char *pattern, int *n) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) die("no file matches the data pattern '%s'", pattern);
    char **v = xmalloc(g.gl_pathc * sizeof(*v));
    for (size_t i = 0; i < g.gl_pathc; i++) v[i] = xstrdup(g.gl_pathv[i]);  // glob sorts them
    *n = (int)g.gl_pathc;
    globfree(&g);
    return v;
}

char **shard_list(const char *path, int *n) {
    struct stat st;
    int found = stat(path, &st) == 0;
    int e = errno;
    if (found) {
        if (S_ISDIR(st.st_mode)) return list_dir(path, n);
        char **v = xmalloc(sizeof(*v));
        v[0] = xstrdup(path);
        *n = 1;
        return v;
    }
    if (strpbrk(path, "*?[")) return expand_glob(path, n);
    if (e != ENOENT) die("cannot open data path '%s': %s", path, strerror(e));   // ELOOP, EACCES, ...
    die("data path '%s' does not exist: give a shard file, a directory of *.bin shards or a glob", path);
}
