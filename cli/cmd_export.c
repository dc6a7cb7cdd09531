// clla export: an inference package from a checkpoint, a run directory or another package
// (docs/INFERENCE.md, "clla export"): config.json with "cache" and "package" sections,
// model.safetensors in fp32 or bf16, the tokenizer. Everything is checked and loaded before
// anything is written; the package is built in PACKAGE.tmp.<pid> and renamed into place, and
// any failure removes the temporary, so PACKAGE is either complete or absent.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/args.h"
#include "common/util.h"
#include "data/tokenizer.h"
#include "model/model_dir.h"
#include "model/safetensors.h"
#include "cli/commands.h"
#include "train/checkpoint.h"

static const ArgSpec SPECS[] = {
    {"out", 1, "the package directory to write (required; must not exist unless --overwrite)", "DIR"},
    {"dtype", 1, "weights in the package: fp32 (default) or bf16 (round to nearest even)", "fp32|bf16"},
    {"cache-codec", ARG_REPEAT, "cache codec, CODEC or PART=CODEC (repeatable): fp32, bf16, int_group:bits=B,group=G", "SPEC"},
    {"tokenizer", 1, "tokenizer file to include (default: the model's train.tokenizer)", "FILE"},
    {"overwrite", 0, "replace an existing package at --out", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// Removes a flat directory (files only) and the directory; 0 on success.
static int remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = path_join(dir, de->d_name);
        if (unlink(p) != 0) rc = -1;
        free(p);
    }
    closedir(d);
    return rmdir(dir) == 0 ? rc : -1;
}

// An existing --out may be replaced only when it is a package (config.json with "package")
// holding nothing but files: never a directory that is something else.
static void check_replaceable(const char *out) {
    struct stat sb;
    char *cp = path_join(out, MODEL_DIR_CONFIG), *wp = path_join(out, MODEL_DIR_WEIGHTS);
    int looks = stat(out, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(cp, &sb) == 0 && stat(wp, &sb) == 0;
    free(cp);
    free(wp);
    if (!looks || model_dir_kind(out) != MODEL_DIR_PACKAGE)
        die("refusing to replace '%s' with --overwrite: it is not a clla package: choose another --out", out);
    DIR *d = opendir(out);
    if (!d) die("cannot read '%s': %s", out, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = path_join(out, de->d_name);
        struct stat fs;
        int plain = lstat(p, &fs) == 0 && S_ISREG(fs.st_mode);
        free(p);
        if (!plain) {
            closedir(d);
            die("refusing to replace '%s' with --overwrite: it holds '%s', which is not a package file: remove it yourself", out, de->d_name);
        }
    }
    closedir(d);
}

static void fsync_dir_of(const char *path) {
    char *copy = xstrdup(path), *slash = strrchr(copy, '/');
    const char *dir = slash ? (slash == copy ? "/" : (*slash = 0, copy)) : ".";
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
    free(copy);
}

static int write_bytes(const char *path, const void *buf, size_t n, char *err, size_t errlen) {
    AtomicFile af;
    if (atomic_open(&af, path) != 0) { snprintf(err, errlen, "cannot create '%s': %s", path, strerror(errno)); return -1; }
    if (fwrite(buf, 1, n, af.f) != n) {
        int e = errno;
        atomic_abort(&af);
        snprintf(err, errlen, "writing '%s' failed: %s", path, strerror(e));
        return -1;
    }
    if (atomic_commit(&af) != 0) { snprintf(err, errlen, "writing '%s' failed: %s", path, strerror(errno)); return -1; }
    return 0;
}

// The package's files into dir; 0, or -1 with err.
static int write_package(const char *dir, const Model *model, const float *host, int st_dtype, const char *config_text,
                         const char *tok_text, size_t tok_len, char *err, size_t errlen) {
    char *wp = path_join(dir, MODEL_DIR_WEIGHTS), *cp = path_join(dir, MODEL_DIR_CONFIG), *tp = path_join(dir, PACKAGE_TOKENIZER);
    int rc = model_save_host(model, host, wp, st_dtype, err, errlen);
    if (rc == 0 && tok_text) rc = write_bytes(tp, tok_text, tok_len, err, errlen);
    // config.json last: a directory with it is a package (model_dir_kind)
    if (rc == 0) rc = write_bytes(cp, config_text, strlen(config_text), err, errlen);
    free(wp);
    free(cp);
    free(tp);
    return rc;
}

int cmd_export(int argc, char **argv) {
    Args a;
    char *pos[1];
    int n_pos = 0;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla export MODEL_DIR --out PACKAGE [--dtype fp32|bf16] [--cache-codec SPEC ...] [--tokenizer FILE] [--overwrite]\n"
               "Writes an inference package (config.json with the cache codecs, model.safetensors, the tokenizer) from a\n"
               "checkpoint (<run>/checkpoints/step_N), a finished run directory or another package.",
               pos, &n_pos, 1);
    const char *out_arg = args_get(&a, SPECS, N_SPECS, "out");
    if (n_pos != 1 || !out_arg) die("clla export needs a model directory and --out PACKAGE: see clla export --help");
    const char *src = pos[0];
    const char *dtype = args_get(&a, SPECS, N_SPECS, "dtype");
    if (!dtype) dtype = "fp32";
    int st_dtype = !strcmp(dtype, "fp32") ? ST_F32 : !strcmp(dtype, "bf16") ? ST_BF16 : -1;
    if (st_dtype < 0) die("--dtype '%s' is not a package dtype: use fp32 or bf16", dtype);
    char *out = xstrdup(out_arg);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
    const int overwrite = args_get(&a, SPECS, N_SPECS, "overwrite") != NULL;
    struct stat sb;
    int exists = lstat(out, &sb) == 0;
    if (exists && !overwrite) die("'%s' already exists: pass --overwrite to replace it, or choose another --out", out);
    if (exists) check_replaceable(out);

    // ---- read and check everything first
    ModelDirKind kind = model_dir_kind(src);
    if (kind == MODEL_DIR_CHECKPOINT) {
        char err[1024];
        if (ckpt_validate(src, err, sizeof(err)) != 0) die("checkpoint '%s' is damaged: %s", src, err);
    }
    Config cfg;
    Model model;
    ModelDir md;
    model_dir_load(&md, &model, &cfg, src, backend_cpu(), 0, NULL);
    CacheLayout layout = md.cache;
    const char *specs[64];
    int n_specs = args_get_all(&a, SPECS, N_SPECS, "cache-codec", specs, 64);
    for (int i = 0; i < n_specs; i++) {
        char err[512];
        if (cache_layout_apply_spec(&layout, specs[i], err, sizeof(err)) != 0) die("--cache-codec '%s': %s", specs[i], err);
    }
    const char *tok_arg = args_get(&a, SPECS, N_SPECS, "tokenizer");
    const char *tok_path = tok_arg ? tok_arg : md.tokenizer;
    char *tok_text = NULL;
    size_t tok_len = 0;
    if (tok_path) {
        tok_text = read_file(tok_path, &tok_len);
        if (!tok_text)
            die("cannot read tokenizer '%s'%s: %s: pass --tokenizer FILE", tok_path,
                tok_arg ? "" : " (the model's train.tokenizer)", strerror(errno));
        char err[512];
        Tokenizer *tok = tok_parse(tok_text, tok_len, tok_path, err, sizeof(err));
        if (!tok) die("%s", err);
        if (tok_vocab_size(tok) > (uint32_t)cfg.model.vocab_size)
            die("tokenizer '%s' has %u ids, more than the model's vocab_size %d: pass the tokenizer the model was trained with",
                tok_path, tok_vocab_size(tok), cfg.model.vocab_size);
        tok_free(tok);
    } else {
        warn("the model names no tokenizer (train.tokenizer is empty) and --tokenizer was not given: the package holds none, "
             "and clla generate will need --tokenizer");
    }
    cJSON *cj = model_dir_package_json(&cfg, &layout, dtype, tok_text != NULL);
    char *config_text = cJSON_Print(cj);
    cJSON_Delete(cj);
    size_t cl = strlen(config_text);
    config_text = realloc(config_text, cl + 2);
    if (!config_text) die("out of memory");
    config_text[cl] = '\n';
    config_text[cl + 1] = 0;
    float *host = xmalloc(model.params.bytes_f32);
    model.be->download(host, model.master, model.params.bytes_f32);

    // ---- write PACKAGE.tmp.<pid>, then rename
    signal(SIGXFSZ, SIG_IGN);   // a file-size limit fails the write (and is cleaned up) instead of killing us
    size_t tl = strlen(out) + 32;
    char *tmp = xmalloc(tl), *old = xmalloc(tl);
    snprintf(tmp, tl, "%s.tmp.%ld", out, (long)getpid());
    snprintf(old, tl, "%s.old.%ld", out, (long)getpid());
    if (mkdir(tmp, 0755) != 0) die("cannot create '%s': %s: check that the parent directory of --out exists and is writable", tmp, strerror(errno));
    char err[1024];
    if (write_package(tmp, &model, host, st_dtype, config_text, tok_text, tok_len, err, sizeof(err)) != 0) {
        remove_flat_dir(tmp);
        die("%s: nothing was written to '%s'", err, out);
    }
    if (exists && rename(out, old) != 0) {
        int e = errno;
        remove_flat_dir(tmp);
        die("cannot move the old package '%s' aside: %s: nothing was changed", out, strerror(e));
    }
    if (rename(tmp, out) != 0) {
        int e = errno;
        if (exists) rename(old, out);
        remove_flat_dir(tmp);
        die("cannot rename '%s' to '%s': %s: nothing was changed", tmp, out, strerror(e));
    }
    fsync_dir_of(out);
    if (exists && remove_flat_dir(old) != 0) warn("the replaced package was left at '%s': remove it", old);

    char codecs[512];
    model_dir_describe_cache(&layout, codecs, sizeof(codecs));
    printf("wrote %s: %s %s weights (%lld parameters) from %s %s, cache %s, tokenizer %s\n", out, dtype,
           cfg.model.attention, model_num_params(&model), model_dir_kind_name(md.kind), src, codecs,
           tok_text ? PACKAGE_TOKENIZER : "none");
    free(host);
    free(config_text);
    free(tok_text);
    free(tmp);
    free(old);
    free(out);
    model_dir_free(&md);
    model_free(&model);
    return 0;
}
