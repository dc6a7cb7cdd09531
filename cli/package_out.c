#include "cli/package_out.h"

#include "cli/model_source.h"
#include "cli/open_tokenizer.h"
#include "cli/cache_codec_args.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/bf16.h"
#include "common/unfinished.h"
#include "common/util.h"
#include "data/tokenizer.h"
#include "model/model_dir.h"
#include "model/safetensors.h"

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
// holding nothing but the files a package is made of (write_package's): never a directory that
// is something else, nor a link (the old package is moved aside and removed: through a link that
// would empty the target), nor one holding a file of the user's (--overwrite replaces only what
// the command writes: docs/COMMANDS.md, "Outputs").
static void check_replaceable(const char *out) {
    struct stat sb;
    if (lstat(out, &sb) == 0 && S_ISLNK(sb.st_mode))
        die("refusing to replace '%s' with --overwrite: it is a symbolic link: give the package directory it points to", out);
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
        static const char *const PACKAGE_FILES[] = {MODEL_DIR_CONFIG, MODEL_DIR_WEIGHTS, PACKAGE_TOKENIZER, PACKAGE_CACHE_CODECS};
        int ours = 0;
        for (size_t i = 0; i < sizeof(PACKAGE_FILES) / sizeof(PACKAGE_FILES[0]); i++) ours |= !strcmp(de->d_name, PACKAGE_FILES[i]);
        // die() exits: the directory is not closed first, since de->d_name lies in its buffer
        // (closedir before the message read freed memory: ASan)
        if (!plain || !ours)
            die("refusing to replace '%s' with --overwrite: it holds '%s', which is not a package file: move it out first", out, de->d_name);
    }
    closedir(d);
}

static int write_bytes(const char *path, const void *buf, size_t n, char *err, size_t errlen) {
    AtomicFile af;
    if (atomic_open(&af, path, OUT_REPLACE) != 0) { snprintf(err, errlen, "cannot create '%s': %s", path, strerror(errno)); return -1; }
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
static int write_package(const char *dir, const Model *model, const float *host, int st_dtype, const CacheLayout *layout,
                         const char *config_text, const char *tok_text, size_t tok_len, char *err, size_t errlen) {
    char *wp = path_join(dir, MODEL_DIR_WEIGHTS), *cp = path_join(dir, MODEL_DIR_CONFIG), *tp = path_join(dir, PACKAGE_TOKENIZER);
    char *fp = path_join(dir, PACKAGE_CACHE_CODECS);
    int rc = model_save_host(model, host, wp, st_dtype, err, errlen);
    if (rc == 0 && tok_text) rc = write_bytes(tp, tok_text, tok_len, err, errlen);
    if (rc == 0) rc = model_dir_save_cache_fits(layout, fp, err, errlen);
    // config.json last: a directory with it is a package (model_dir_kind)
    if (rc == 0) rc = write_bytes(cp, config_text, strlen(config_text), err, errlen);
    free(wp);
    free(cp);
    free(tp);
    free(fp);
    return rc;
}

void package_load_source(ModelDir *md, Model *model, Config *cfg, const char *src, const char *const *specs, int n_specs) {
    model_source_load(md, model, cfg, src, backend_cpu());
    apply_cache_codec_args(&md->cache, specs, n_specs);
}

void package_out_begin(PackageOut *po, const char *out, int overwrite, const char *tok_arg, const char *model_tok, int vocab_size,
                       const char *model_hash) {
    memset(po, 0, sizeof(*po));
    po->eot_id = -1;
    if (!out[0]) die("--out is empty: give the package directory to write");
    po->out = xstrdup(out);
    for (size_t n = strlen(po->out); n > 1 && po->out[n - 1] == '/'; n--) po->out[n - 1] = 0;
    struct stat sb;
    po->exists = lstat(po->out, &sb) == 0;
    if (po->exists && !overwrite) die("'%s' already exists: pass --overwrite to replace it, or choose another --out", po->out);
    if (po->exists) check_replaceable(po->out);
    output_parent_check(po->out, "--out");   // now, not after the work
    const char *tok_path = tok_arg ? tok_arg : model_tok;
    if (!tok_path) {
        warn("the model names no tokenizer (train.tokenizer is empty) and --tokenizer was not given: the package holds none, "
             "and clla generate will need --tokenizer");
        return;
    }
    po->tok_text = read_file(tok_path, &po->tok_len);
    if (!po->tok_text)
        die("cannot read tokenizer '%s'%s: %s: pass --tokenizer FILE", tok_path, tok_arg ? "" : " (the model's train.tokenizer)",
            strerror(errno));
    char err[512];
    Tokenizer *tok = tok_parse(po->tok_text, po->tok_len, tok_path, err, sizeof(err));
    if (!tok) die("%s", err);
    tokenizer_check_model(tok, tok_path, tok_arg != NULL, vocab_size, model_hash);
    const uint32_t eot = tok_special_id(tok, "<|endoftext|>");
    if (eot != TOK_NONE) po->eot_id = eot;
    tok_free(tok);
}

// bf16's largest value is about 3.39e38: an fp32 weight past it rounds to infinity, which every
// loader refuses as a damaged file, so such a package is refused before anything is written
static void refuse_past_bf16(const Model *model, const float *host) {
    for (int i = 0; i < model->params.n; i++) {
        const TensorInfo *ti = &model->params.t[i];
        const float *w = (const float *)((const char *)host + ti->off_f32);
        for (size_t k = 0; k < ti->numel; k++)
            if ((sr_f32_to_bf16_rne(w[k]) & 0x7FFFu) == 0x7F80u)
                die("--dtype bf16: tensor '%s' holds %g at element %zu, beyond bf16's largest value (3.39e38), which would be "
                    "stored as an infinity: export with --dtype fp32",
                    ti->name, (double)w[k], k);
    }
}

void package_round_masters_bf16(Model *model, unsigned long long seed) {
    float *host = xmalloc(model->params.bytes_f32);
    model->be->download(host, model->master, model->params.bytes_f32);
    refuse_past_bf16(model, host);
    const size_t n = model->params.bytes_f32 / sizeof(float);
    for (size_t i = 0; i < n; i++) host[i] = sr_bf16_to_f32(sr_f32_to_bf16_rne(host[i]));
    model_set_masters(model, host, seed);
    free(host);
}

void package_out_write(PackageOut *po, const Model *model, const Config *cfg, const CacheLayout *layout, const char *dtype) {
    const char *out = po->out;
    int st_dtype = !strcmp(dtype, "bf16") ? ST_BF16 : ST_F32;
    char err[1024];
    if (cache_layout_check_fitted(layout, err, sizeof(err)) != 0) die("%s", err);
    cJSON *cj = model_dir_package_json(cfg, layout, dtype, po->tok_text != NULL);
    // what Hugging Face's loaders read from every config.json besides the model's shape (clla
    // reads them back without a word, model/config.c): the weights' dtype, and the tokenizer's
    // end of text as GPT-2's bos and eos (its default ids, 1 and 2, are other tokens here)
    cJSON_AddStringToObject(cj, "torch_dtype", st_dtype == ST_BF16 ? "bfloat16" : "float32");
    if (po->eot_id >= 0) {
        cJSON_AddNumberToObject(cj, "bos_token_id", (double)po->eot_id);
        cJSON_AddNumberToObject(cj, "eos_token_id", (double)po->eot_id);
    }
    char *config_text = cJSON_Print(cj);
    cJSON_Delete(cj);
    size_t cl = strlen(config_text);
    config_text = realloc(config_text, cl + 2);
    if (!config_text) die("out of memory");
    config_text[cl] = '\n';
    config_text[cl + 1] = 0;
    float *host = xmalloc(model->params.bytes_f32);
    model->be->download(host, model->master, model->params.bytes_f32);
    if (st_dtype == ST_BF16) refuse_past_bf16(model, host);

    // ---- write PACKAGE.tmp.<pid>, then rename
    size_t tl = strlen(out) + 32;
    char *tmp = xmalloc(tl), *old = xmalloc(tl);
    snprintf(tmp, tl, "%s.tmp.%ld", out, (long)getpid());
    snprintf(old, tl, "%s.old.%ld", out, (long)getpid());
    const int tmp_slot = unfinished_add(tmp, UNFINISHED_DIR);   // removed if the process ends before the rename
    if (mkdir(tmp, 0755) != 0) {
        unfinished_done(tmp_slot);
        die("cannot create '%s': %s: check that the parent directory of --out exists and is writable", tmp, strerror(errno));
    }
    if (write_package(tmp, model, host, st_dtype, layout, config_text, po->tok_text, po->tok_len, err, sizeof(err)) != 0) {
        remove_flat_dir(tmp);
        die("%s: nothing was written to '%s'", err, out);
    }
    // no signal between moving the old package aside and the new one into place: out is never
    // missing when the process ends (a pending SIGINT/SIGTERM is handled after the second rename)
    sigset_t before;
    unfinished_hold_stops(&before);
    // --overwrite: the two packages swap names in one step, so that not even a SIGKILL finds out
    // missing; the replaced one is then at tmp's name. Where the filesystem cannot swap, two
    // renames, out missing between them (a window only SIGKILL or a crash can hit).
    int swapped = 0;
    if (po->exists) {
        swapped = rename_exchange(tmp, out) == 0;
        if (!swapped && errno != EINVAL && errno != ENOSYS) {
            int e = errno;
            remove_flat_dir(tmp);
            die("cannot put the package in place of '%s': %s: nothing was changed", out, strerror(e));
        }
        if (swapped) snprintf(old, tl, "%s", tmp);
    }
    if (po->exists && !swapped && rename(out, old) != 0) {
        int e = errno;
        remove_flat_dir(tmp);
        die("cannot move the old package '%s' aside: %s: nothing was changed", out, strerror(e));
    }
    // without --overwrite out was absent at the start: one that appeared since is another
    // process's, left as it is, and this package kept beside it
    if (!swapped && (po->exists ? rename(tmp, out) : rename_noreplace(tmp, out)) != 0) {
        int e = errno;
        if (!po->exists && e == EEXIST) {
            unfinished_done(tmp_slot);   // kept: the user's to move (named as an AtomicFile's, common/util.h)
            atomic_commit_message(err, sizeof(err), out, OUT_KEEP_EXISTING, e);
            die("%s", err);
        }
        if (po->exists) rename(old, out);
        remove_flat_dir(tmp);
        die("cannot rename '%s' to '%s': %s: nothing was changed", tmp, out, strerror(e));
    }
    unfinished_done(tmp_slot);
    // the replaced package, from here on only to be removed: also if a signal comes during it
    const int old_slot = po->exists ? unfinished_add(old, UNFINISHED_DIR) : -1;
    unfinished_release_stops(&before);
    const int flushed = fsync_parent_dir(out), flush_err = errno;
    if (po->exists && remove_flat_dir(old) != 0) warn("the replaced package was left at '%s': remove it", old);
    unfinished_done(old_slot);
    if (flushed != 0)
        die("'%s' is in place, but flushing the directory that holds it failed: %s: it may not outlive a power loss", out,
            strerror(flush_err));
    free(host);
    free(config_text);
    free(tmp);
    free(old);
}

void package_out_free(PackageOut *po) {
    free(po->out);
    free(po->tok_text);
    memset(po, 0, sizeof(*po));
}
