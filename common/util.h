// Small host-side helpers shared by every subcommand: fatal errors that name the
// problem and the fix, checked allocation, wall-clock time, whole-file reads and
// atomic (write to temporary, fsync, rename) file output.
#ifndef CLLA_COMMON_UTIL_H
#define CLLA_COMMON_UTIL_H

#include <stddef.h>
#include <stdio.h>

// Prints "clla: error: <message>" on one line to stderr and exits with status 1.
// Messages say what is wrong and what to do, e.g. "... : set num_key_value_heads to a divisor of 8".
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
// A write to stdout failed (a full disk, > /dev/full): one line saying so and exit 1, as die().
// What stdout still buffers is dropped, so that the check at exit (cli/main.c) does not report
// the failure a second time.
void die_stdout(void) __attribute__((noreturn));
// Prints "clla: warning: <message>" to stderr.
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The message into err (errlen bytes, truncated), for the functions that return -1 with one line
// in err instead of dying; returns -1.
int fail_with(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// A 0/1 switch from the environment (docs/CONFIG.md, "Environment variables"): dflt when unset
// or empty; any other value than 0 and 1 ends the process with one line naming the variable and
// what its two values do (what0, what1).
int env_switch(const char *name, int dflt, const char *what0, const char *what1);

// n bytes of fd at offset off into dst, through as many pread calls as it takes (EINTR retried).
// 0, or -1 with errno set (0 when the file ended first).
int pread_full(int fd, void *dst, size_t n, unsigned long long off);

void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t bytes);
char *xstrdup(const char *s);

// Seconds since an arbitrary fixed point (monotonic clock).
double now_seconds(void);

// Reads a whole file into a NUL-terminated buffer; *len receives the byte count
// (excluding the NUL). Returns NULL (errno set) when the file cannot be read; a directory
// fails with EISDIR (see fopen_read).
char *read_file(const char *path, size_t *len);
// The lines of a buffer from read_file, one at a time: the line at *pos (NUL-terminated in
// place, its "\n" and a trailing "\r" dropped, its length in *n), *pos moved past it; NULL at
// the end. Every line counts, blank ones too, so a caller's line numbers are the file's.
char *buf_next_line(char *buf, size_t len, size_t *pos, size_t *n);

// rename(2) that never replaces: -1 with errno EEXIST when `to` exists, file or directory
// (renameat2 RENAME_NOREPLACE; on a filesystem without it, link + unlink for a file and a
// check before the rename for a directory).
int rename_noreplace(const char *from, const char *to);
// Swaps two existing names in one step (renameat2 RENAME_EXCHANGE): 0, or -1 with errno (EINVAL or
// ENOSYS where the filesystem cannot, which the caller handles with two renames).
int rename_exchange(const char *a, const char *b);

// fsync of a directory makes the names in it (creations, renames) durable: 0, or -1 with errno. A
// file system that cannot fsync a directory (EINVAL, EROFS) counts as done: its renames are as
// durable as they get. fsync_parent_dir: the directory that holds path.
int fsync_dir(const char *dir);
int fsync_parent_dir(const char *path);

// Atomic file output: atomic_open() creates "<path>.tmp.<pid>"; atomic_commit() flushes, fsyncs,
// closes and renames it to path and fsyncs the directory; atomic_abort() removes the
// temporary. A failing directory fsync fails the commit too (-1, errno from fsync; the file is
// then in place, but its name may not outlive a power loss). A reader therefore never sees a half-written file. OUT_REPLACE for files the run
// owns (checkpoints, metrics) and outputs the user allowed to be replaced (--overwrite);
// OUT_KEEP_EXISTING for a user's output checked to be absent at the start: if path appeared
// since (another process wrote it), the commit fails with errno EEXIST, leaves path as it is and
// keeps the finished temporary, which atomic_commit_message() names.
typedef enum OutMode { OUT_KEEP_EXISTING = 0, OUT_REPLACE = 1 } OutMode;
typedef struct AtomicFile {
    FILE *f;
    char *path;
    char *tmp;
    OutMode mode;
    int unfinished;   // its slot in common/unfinished.h: removed if the process ends first
} AtomicFile;
int atomic_open(AtomicFile *af, const char *path, OutMode mode);   // 0 on success, -1 (errno) on failure
int atomic_commit(AtomicFile *af);                      // 0 on success, -1 (errno) on failure
void atomic_abort(AtomicFile *af);
// The first half of atomic_commit: flush, fsync and close the temporary, which stays (still
// removed if the process ends first); atomic_commit then only renames it, atomic_abort removes it.
// Outputs that must change together write every byte first (a full disk fails them all before any
// rename) and rename last: a model and its config.json (train/run_files.c), shards and their index
// (model/safetensors.c). 0, or -1 (errno; the temporary is removed).
int atomic_finish(AtomicFile *af);
// The line for a failed atomic_commit of path (err: its errno): for EEXIST under
// OUT_KEEP_EXISTING, that path appeared meanwhile and where this output was kept; else the cause.
void atomic_commit_message(char *buf, size_t n, const char *path, OutMode mode, int err);

// Creates a directory and its parents (like mkdir -p). 0 on success.
int make_dirs(const char *path);
// Removes path and, if it is a directory, everything below it, depth first and without following
// links (a link is removed, not its target). 0 on success or when path does not exist; -1 with
// errno of the first failure (the rest is still tried).
int remove_tree(const char *path);
// Would remove_tree(path) stop at a directory it may not change? 0 when every directory holding
// something under path (and path's own parent) can have entries removed (write and search
// permission, a writable file system); else -1, the first such directory in blocker. A check made
// before an irreversible step, so that a removal that would fail half-way fails before it.
int tree_removable(const char *path, char *blocker, size_t len);

// Joins a directory and a file name into a new string.
char *path_join(const char *dir, const char *name);
// Does path end with ext (".jsonl", ".bin"), in any letter case?
int path_has_ext(const char *path, const char *ext);
// A command's output file, checked before any work: dies with one line when path is a directory,
// when its directory does not exist, or when path exists and overwrite is 0 (naming the option
// that gave it, e.g. "--out", and the flag that replaces it). A user's file is never replaced
// without --overwrite.
void output_file_check(const char *path, int overwrite, const char *option);
// Die with one line when the existing file out is the command's input in (the same device and
// inode, however the two paths are spelled), or when it lies inside the input directory in (at any
// depth, compared by real paths): --overwrite replaces an earlier output, never an input. Either
// check passes when out does not exist yet, or in cannot be found (its own open reports that).
void output_not_input(const char *out, const char *out_option, const char *in, const char *in_option);
// The directory an output (file or directory) is created in exists and is writable: dies with
// one line naming the option otherwise. Part of output_file_check; alone for directory outputs.
void output_parent_check(const char *path, const char *option);
// path as a new string, relative ones joined to the current directory, then cleaned lexically
// (repeated slashes, "." components and a trailing slash go, so that "run/" and "run" name one
// directory; links and .. stay as given). NULL when the current directory cannot be read.
char *path_absolute(const char *path);

// ---- opening files to read (issue 12)
// fopen(path, "rb") that refuses what is not a file: glibc opens a directory for reading and
// it then "reads" as an error or seeks to a size of 2^63, so a directory fails here with
// errno EISDIR. Other failures keep fopen's errno (ELOOP for a symlink loop, ENOENT, ...), so
// callers print strerror(errno): "Is a directory", "Too many levels of symbolic links".
FILE *fopen_read(const char *path);

// ---- byte sizes (issue 12: --shard-size)
// Parses a byte size as HF's max_shard_size: a whole number with an optional unit, B, KB,
// MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive:
// "2GB", "500MB", "1048576". Returns 0 and the size in *out (> 0), or -1 when s is anything
// else (a fraction, an unknown unit, 0, an overflow).
int parse_byte_size(const char *s, unsigned long long *out);

#endif
