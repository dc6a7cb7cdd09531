// clla train: the training loop. AdamW with warmup + cosine schedule, gradient
// accumulation to a global batch in tokens, global-norm clipping, validation, metrics.
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/num.h"
#include "common/unfinished.h"
#include "common/util.h"
#include "data/bytes.h"
#include "data/loader.h"
#include "eval/evaluate.h"
#include "model/mem_plan.h"
#include "model/model.h"
#include "model/moe.h"
#include "train/checkpoint.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "train/dist.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/run_files.h"
#include "train/run_start.h"
#include "train/signals.h"

static const ArgSpec SPECS[] = {
    {"config", 1, "config JSON (required)", "FILE"},
    {"set", 1, "override a key: --set hidden_size=256, --set train.lr=1e-3 (repeatable)", "KEY=VALUE"},
    {"device", 1, "cpu (default), cpu-bf16 (CPU emulating the CUDA bf16 roundings) or cuda", "cpu|cpu-bf16|cuda"},
    {"out", 1, "run directory (overrides train.out_dir)", "DIR"},
    {"quiet", 0, "no per-step lines on stderr (metrics are still written)", NULL},
    {"save-every", 1, "write a checkpoint every N steps to DIR/checkpoints (overrides train.save_every)", "N"},
    {"keep", 1, "keep the newest K checkpoints, 0 = all (overrides train.keep_checkpoints)", "K"},
    {"resume", 1, "auto (newest complete checkpoint of the run directory, if any) or a checkpoint directory", "auto|DIR"},
    {"stop-at", 1, "stop after this step with a checkpoint; the schedule still runs to train.max_steps", "STEP"},
    {"zero", 1, "data parallel: 0 = replicated AdamW state, 1 = ZeRO-1 sharded (overrides train.zero_stage)", "0|1"},
    {"overlap-grad-reduce", 1, "data parallel: sum the gradients over ranks during the backward (ZeRO-1: and gather the weights during the next forward); auto = on the CPU when the ranks span hosts (overrides train.overlap_grad_reduce)", "true|false|auto"},
    {"shard-size", 1, "write the final model as HF shards of at most this size (2GB, 500MB, 64MiB) with model.safetensors.index.json", "SIZE"},
    {"overwrite", 0, "the run directory may hold another run: clear what it wrote (model, config, metrics, checkpoints/) first", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// losses[0] is step first + 1 (a resumed run prints the steps it ran).
static void print_curve_summary(const float *losses, int first, int n) {
    if (n <= 0) return;
    fprintf(stderr, "loss curve:");
    int points = n < 10 ? n : 10;
    for (int k = 0; k < points; k++) {
        int i = (int)((long long)k * (n - 1) / (points > 1 ? points - 1 : 1));
        fprintf(stderr, " %d:%.4f", first + i + 1, losses[i]);
    }
    float best = losses[0];
    for (int i = 1; i < n; i++) if (losses[i] < best) best = losses[i];
    fprintf(stderr, "\nfirst %.4f  last %.4f  best %.4f  (%d steps)\n", losses[0], losses[n - 1], best, n);
}

// --name as a whole number in [lo, hi] (the range its message names is the one it takes), or fallback
static int int_option(const Args *a, const char *name, int fallback, int lo, int hi) {
    const char *v = args_get(a, SPECS, N_SPECS, name);
    if (!v) return fallback;
    char opt[64];
    snprintf(opt, sizeof(opt), "--%s", name);
    return (int)opt_i64(opt, v, lo, hi);
}

// The checkpoints a run knows about, for the advice its errors give.
//  saved:   the newest complete checkpoint (after a failed write: where to continue from);
//  pending: a checkpoint saved outside a skip streak whose weights have not yet given a
//           finite loss: it becomes `safe` when the next step is finite, and is dropped when
//           that step is not (its weights are the ones that diverged);
//  safe:    the newest checkpoint saved before the loss went non-finite;
//  resumed: the checkpoint this run resumed from (the run knows nothing of the ones before it:
//           the advice then points to them instead of to --overwrite, which would delete them).
typedef struct KnownCkpts {
    char saved[PATH_MAX], pending[PATH_MAX], safe[PATH_MAX], resumed[PATH_MAX];
    int saved_step;
} KnownCkpts;

// Every rank must run the same training: a rank started with another config (one edited while
// the job started, a node-local copy), other --set values or options would train a replica
// that drifts apart without a word, or hang or crash in a collective of another size. Their
// fingerprint (the config after --set and options, as config.json would hold it, and the options
// that are not in it) is compared with rank 0's before anything else.
static void check_ranks_agree(Dist *dist, const Config *cfg, const Args *a) {
    // train.threads aside: each rank's thread count is its own (docs/DISTRIBUTED.md), the CPU
    // ops giving the same bits at any count
    Config same = *cfg;
    same.train.threads = 0;
    unsigned long long h = dist_config_fingerprint(&same);
    const char *opts[] = {"resume", "stop-at", "overwrite", "device", "shard-size"};
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
        const char *v = args_get(a, SPECS, N_SPECS, opts[i]);
        h = fnv1a64_update(h, opts[i], strlen(opts[i]) + 1);
        h = fnv1a64_update(h, v ? v : "\1", strlen(v ? v : "\1") + 1);
    }
    dist_agree_or_die(dist, h, "was started with other settings than rank 0 (its config file after --set, or its options, "
                               "differ): every rank must get the same config, --set values and options");
}

// The run's final model (rank 0), said on stderr.
// SIGINT, SIGTERM and SIGHUP are held meanwhile: the weights and config.json are one commit,
// which a signal cut in two (weights without their config.json); one that comes is handled after.
static void save_final_model(RunFiles *rf, const Config *cfg, Model *model, const float *masters, const char *last_good) {
    sigset_t before;
    unfinished_hold_stops(&before);
    run_files_save_model(rf, cfg, model, masters, last_good);
    unfinished_release_stops(&before);
    fprintf(stderr, "saved %s/%s and config.json\n", rf->dir, rf->shard_bytes ? "model.safetensors (or its shards)" : "model.safetensors");
}

// Writes a checkpoint of the state after st->step steps and prunes old ones. A failed save, or
// weights that are not finite, end the run. Data parallel: every rank calls it (the save is
// collective); rank 0 prunes and reports.
static void save_checkpoint(const Config *cfg, Model *model, GradSync *gs, const AdamW *opt, TrainState *st,
                            const DataLoader *dl, Dist *dist, KnownCkpts *kc) {
    char path[PATH_MAX], err[1024];
    loader_get_state(dl, &st->data);
    const float *masters = grad_sync_full_masters(gs, model);
    size_t bad;
    if (dist->rank == 0 && !model_masters_finite(model, masters, &bad))
        die("step %d: weight element %zu is not finite: the model diverged; not saving it. The newest checkpoint saved before that is %s",
            st->step, bad, kc->safe[0] ? kc->safe : "(none: none is safe, start over with a lower train.lr)");
    if (ckpt_save(cfg->train.out_dir, cfg, model, masters, opt, st, dist, path, sizeof(path), err, sizeof(err)) != 0)
        die("saving the checkpoint of step %d failed: %s; the last good checkpoint is %s", st->step, err,
            kc->saved[0] ? kc->saved : "(none)");
    if (dist->rank == 0 && ckpt_prune(cfg->train.out_dir, cfg->train.keep_checkpoints, err, sizeof(err)) < 0) warn("%s", err);
    snprintf(kc->saved, sizeof(kc->saved), "%s", path);
    kc->saved_step = st->step;
    if (st->consecutive_skips == 0) snprintf(kc->pending, sizeof(kc->pending), "%s", path);
    if (dist->rank == 0) fprintf(stderr, "saved checkpoint %s\n", path);
}

// Per micro-step statistics gathered from every rank, so that every rank forms the step's
// numbers from the same values in the same (global micro-batch) order.
enum { ST_LM, ST_AUX, ST_Z, ST_MAX_SHARE, ST_MIN_SHARE, ST_ASSIGNED, ST_DROPPED, N_STATS };

int cmd_train(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: clla train --config FILE [--set key=value ...] [--device cpu|cpu-bf16|cuda] [--out DIR]\n"
               "Trains the model the config describes on train.data and writes DIR/config.json,\n"
               "DIR/model.safetensors and DIR/metrics.jsonl (one JSON object per step).\n"
               "Checkpoints: DIR/checkpoints/step_N (--save-every, --keep, --resume; docs/CHECKPOINTS.md).\n"
               "SIGINT/SIGTERM: the current step finishes, a checkpoint is saved, exit 0.\n"
               "A DIR that holds another run is refused unless --overwrite; one training per DIR at a time.",
               NULL, NULL, 0);
    const char *cfg_path = args_get(&a, SPECS, N_SPECS, "config");
    if (!cfg_path) die("clla train needs --config FILE: see clla train --help");
    Config cfg;
    config_load(&cfg, cfg_path, a.n_sets, a.sets);
    TrainConfig *tc = &cfg.train;
    const char *out = args_get(&a, SPECS, N_SPECS, "out");
    if (out) config_set_out_dir(&cfg, out);
    if (!tc->data[0]) die("%s: train.data is not set: point it at a token file (--set train.data=FILE)", cfg_path);
    int quiet = args_get(&a, SPECS, N_SPECS, "quiet") != NULL;
    const char *shard = args_get(&a, SPECS, N_SPECS, "shard-size");
    unsigned long long shard_bytes = 0;
    if (shard && parse_byte_size(shard, &shard_bytes) != 0)
        die("--shard-size '%s' is not a size: give a whole number with a unit, e.g. 2GB, 500MB or 64MiB", shard);
    const int overwrite = args_get(&a, SPECS, N_SPECS, "overwrite") != NULL;
    tc->save_every = int_option(&a, "save-every", tc->save_every, 0, INT_MAX);
    tc->keep_checkpoints = int_option(&a, "keep", tc->keep_checkpoints, 0, INT_MAX);
    const char *stop_text = args_get(&a, SPECS, N_SPECS, "stop-at");
    if (stop_text && !strcmp(stop_text, "0")) die("--stop-at 0: give the step to stop after, 1 or more (leave it out to run to train.max_steps)");
    int stop_at = int_option(&a, "stop-at", 0, 1, INT_MAX);
    if (stop_at > tc->max_steps)
        warn("--stop-at %d is after train.max_steps = %d: the run ends at step %d", stop_at, tc->max_steps, tc->max_steps);
    tc->zero_stage = int_option(&a, "zero", tc->zero_stage, 0, 1);
    const char *ogr = args_get(&a, SPECS, N_SPECS, "overlap-grad-reduce");
    if (ogr) {
        if (!strcmp(ogr, "true")) tc->overlap_grad_reduce = 1;
        else if (!strcmp(ogr, "false")) tc->overlap_grad_reduce = 0;
        else if (!strcmp(ogr, "auto")) tc->overlap_grad_reduce = -1;
        else die("--overlap-grad-reduce '%s': use true, false or auto", ogr);
    }
    // The process group (one process unless launched by mpirun/srun; docs/DISTRIBUTED.md).
    // Every rank runs the same loop; rank 0 alone writes the run files and prints.
    Dist dist;
    dist_init(&dist, tc->dist_timeout_s);
    const int rank0 = dist.rank == 0;
    if (dist.world > 1) check_ranks_agree(&dist, &cfg, &a);
    if (rank0) config_warn_training(&cfg, cfg_path);
    if (!rank0) quiet = 1;
    // Resume: the checkpoint is chosen and its config checked before anything is written.
    const char *resume = args_get(&a, SPECS, N_SPECS, "resume");
    if (resume && !strcmp(resume, "auto") && overwrite)
        die("--overwrite starts the run over and --resume auto continues it: give one of them");
    if (resume && strcmp(resume, "auto")) {
        char err[1024];
        if (ckpt_validate(resume, err, sizeof(err)) != 0) die("cannot resume from '%s': %s", resume, err);
    }
    char ckpt[PATH_MAX] = "";
    KnownCkpts kc = {0};
    // rank 0 holds the run directory's lock from here to exit and picks the checkpoint, so that
    // every rank resumes from the same directory
    int clear_run_dir = 0;
    if (rank0) {
        run_lock_acquire(tc->out_dir);
        char first[256] = "";
        const int stale = run_dir_remove_temporaries(tc->out_dir, first, sizeof(first));
        if (stale)
            fprintf(stderr, "clla train: removed %d temporar%s a killed run left in %s (%s%s)\n", stale, stale == 1 ? "y" : "ies",
                    tc->out_dir, first, stale > 1 ? ", ..." : "");
        run_metrics_check_free(tc->out_dir, tc->metrics);
        clear_run_dir = run_start_choose(tc, resume, overwrite, ckpt, sizeof(ckpt));
    }
    dist_bcast(&dist, ckpt, sizeof(ckpt), 0);
    TrainConfig saved_train = {0};   // the checkpoint's run settings (its global batch, below)
    CkptId ckpt_id;   // compared after the last read of the checkpoint's files (ckpt_load)
    if (ckpt[0]) {
        ckpt_identity(ckpt, &ckpt_id);
        Config saved;
        ckpt_read_config(ckpt, &saved);
        saved_train = saved.train;
        // the checkpoint's data tokenizer is what this run's data must have
        if (!tc->tokenizer_hash[0]) snprintf(tc->tokenizer_hash, sizeof(tc->tokenizer_hash), "%s", saved.train.tokenizer_hash);
        if (rank0) ckpt_compare_config(&saved, &cfg, ckpt);   // dies on a model change: mpirun ends the job
        snprintf(kc.saved, sizeof(kc.saved), "%s", ckpt);
        snprintf(kc.pending, sizeof(kc.pending), "%s", ckpt);
        snprintf(kc.resumed, sizeof(kc.resumed), "%s", ckpt);
    }
    if (tc->threads > 0) omp_set_num_threads(tc->threads);

    const Backend *be = device_backend(args_get(&a, SPECS, N_SPECS, "device"));
    // CUDA: this rank's GPU (and the NCCL communicator) before the model allocates anything
    dist_attach_device(&dist, be);
    mem_check_fits(&cfg, be, grad_sync_sums_in_tree(be->name) ? dist.world : 0);   // refuse a run that would be OOM-killed, before allocating (model/mem_plan.h)
    int B = tc->micro_batch, T = tc->seq_len;
    long long bt = (long long)B * T;
    // The global batch is fixed by the config; each rank runs n_micro micro-steps of B rows.
    if (tc->global_batch_tokens && tc->global_batch_tokens % (bt * dist.world) != 0)
        die("train.global_batch_tokens = %lld is not a multiple of micro_batch * seq_len * ranks = %d * %d * %d = %lld: change the global batch, micro_batch or the number of ranks",
            tc->global_batch_tokens, B, T, dist.world, bt * dist.world);
    const long long micro_per_rank = mem_micro_steps(&cfg, dist.world);   // (exact: divisibility checked above)
    // the loader's global batch (rows of every rank's micro-steps, global_batch_tokens / seq_len)
    // is an int, as are its products: the config reader refused more (model/config.c)
    int n_micro = (int)micro_per_rank;
    const int n_total = n_micro * dist.world;   // micro-batches per optimizer step, all ranks

    // One loader call per step and rank reads the rank's n_micro micro-batches: rank r gets
    // global micro-batches [r * n_micro, (r + 1) * n_micro), a contiguous run of the global
    // batch, and the loader's global batch (B * n_micro * world windows) is the same for every
    // number of ranks, so checkpoints resume across rank counts (docs/DISTRIBUTED.md).
    // train.tokenizer set: shards written with a different tokenizer are refused (hash in their header)
    unsigned long long tok_hash = tc->tokenizer[0] ? loader_tokenizer_hash(tc->tokenizer) : 0;
    LoaderOptions lo = {.B = B * n_micro, .T = T, .seed = tc->seed, .rank = dist.rank, .world = dist.world,
                        .vocab_size = cfg.model.vocab_size, .tokenizer_hash = tok_hash};
    DataLoader *train_dl = loader_open(tc->data, &lo);
    // The run records its data's tokenizer (from the shards when train.tokenizer is not set);
    // data of another tokenizer than a resumed run's or an init_from model's is refused.
    {
        char from[1200] = "";
        unsigned long long want = run_start_tokenizer_hash(tc, from, sizeof(from)), have = loader_data_tokenizer_hash(train_dl);
        if (want && have && want != have)
            die("train.data '%s' was made with tokenizer %016llx, but %s says %016llx: use data made with that tokenizer (clla prep), or start a new run",
                tc->data, have, from, want);
        if (have) loader_format_tokenizer_hash(have, tc->tokenizer_hash);
        if (!tok_hash) tok_hash = have;
    }
    if (dist.world > 1) {
        // the same data on every rank (a node-local directory, shards changed while the job
        // started): the loader's fingerprint covers the shards' sizes and tokenizers
        LoaderState ls;
        loader_get_state(train_dl, &ls);
        char msg[PATH_MAX + 160];
        snprintf(msg, sizeof(msg), "reads other data than rank 0 at train.data '%s' (other shards, or shards of other sizes): every "
                 "rank must see the same files", tc->data);
        dist_agree_or_die(&dist, ls.fingerprint, msg);
    }
    if (dist.world > 1 && loader_is_plain(train_dl))
        die("train.data '%s' is a plain uint32 token file, which gives every rank the same batches: make token shards with `clla prep` for %d ranks (docs/FORMAT.md)",
            tc->data, dist.world);
    // validation runs on rank 0 alone (the others wait in the next step's first collective),
    // through the evaluation `clla eval` runs: the same windows for the same settings
    DataLoader *val_dl = tc->val_data[0] && rank0 ? eval_open(tc->val_data, T, tc->seed, cfg.model.vocab_size, tok_hash) : NULL;

    Model model;
    model_build(&model, &cfg.model, be);
    // "auto": overlapped where the ranks span hosts (a network: docs/DISTRIBUTED.md measured it
    // faster there, or level, and level to slower over one host's shared memory), on the CPU path:
    // the NCCL path's has not run on GPUs yet, so it waits for an explicit true
    const int overlap = tc->overlap_grad_reduce > 0 ||
                        (tc->overlap_grad_reduce < 0 && dist.local_world < dist.world && be == backend_cpu());
    GradSync gs;
    grad_sync_init(&gs, &dist, &model, tc->zero_stage, n_micro, overlap ? (size_t)tc->grad_bucket_elements : 0);   // gs.bucket: taken
    AdamW opt;
    adamw_init_shard(&opt, &model, &gs.own);
    TrainState st = {.seed = tc->seed};
    if (ckpt[0]) {
        ckpt_load(ckpt, &model, &opt, &st);
        ckpt_check_same(ckpt, &ckpt_id);
        st.seed = tc->seed;
        // the data position is a place in the order of global batches: another global batch
        // (rows a step) reads other windows. Said here with the numbers; with
        // train.global_batch_tokens 0 it follows the rank count, which is easy to miss.
        if (rank0 && saved_train.seq_len == T) {
            const long long had = saved_train.global_batch_tokens ? saved_train.global_batch_tokens / T
                                                                   : (long long)saved_train.micro_batch * st.saved_world;
            const long long now = (long long)B * n_micro * dist.world;
            if (had != now)
                die("cannot resume from '%s': it was saved with a global batch of %lld sequences a step (%s%lld on %d rank%s) and this run's is %lld (%d rank%s): give the same global batch, train.global_batch_tokens = %lld, or resume on %d rank%s",
                    ckpt, had, saved_train.global_batch_tokens ? "train.global_batch_tokens / seq_len, " : "train.global_batch_tokens 0: micro_batch ",
                    saved_train.global_batch_tokens ? had : (long long)saved_train.micro_batch, st.saved_world, st.saved_world == 1 ? "" : "s",
                    now, dist.world, dist.world == 1 ? "" : "s", had * T, st.saved_world, st.saved_world == 1 ? "" : "s");
        }
        loader_set_state(train_dl, &st.data);
        kc.saved_step = st.step;
        // the resumed checkpoint is pending (safe once the next step is finite) unless it was
        // saved inside a skip streak; what was safe before it is not known here
        if (st.consecutive_skips > 0) kc.pending[0] = '\0';
        if (st.step > tc->max_steps)
            die("%s is at step %d, past train.max_steps %d: a run does not go back; give --set train.max_steps=%d or more, "
                "or resume an earlier checkpoint with --resume PATH", ckpt, st.step, tc->max_steps, st.step);
        // bad input before anything moves (the abandoned timeline below)
        if (stop_at && stop_at <= st.step)
            die("--stop-at %d is not after the checkpoint's step %d: give a later step or drop --stop-at", stop_at, st.step);
        if (rank0 && !clear_run_dir) {
            // one timeline per run: the checkpoints after this one (and a final model made from
            // them, sharded or not) belong to a timeline this run abandons; also when this run
            // ends here, whose final model is then written in their place
            char **extra = run_final_model_files(tc->out_dir);
            char moved[PATH_MAX], err[1024];
            int n = ckpt_abandon_after(tc->out_dir, st.step, (const char *const *)extra, moved, sizeof(moved), err, sizeof(err));
            if (n < 0) die("resuming at step %d: %s", st.step, err);
            if (n > 0) fprintf(stderr, "clla train: resuming at step %d: moved the later checkpoints of the abandoned timeline into %s\n", st.step, moved);
            for (char **p = extra; *p; p++) free(*p);
            free(extra);
        }
        if (st.step >= tc->max_steps) {
            // the run ended here; its final model may be missing or older when the end's write
            // failed (full disk) or the process was killed during it: written again, from the
            // checkpoint the last step saved
            int missing = rank0 && st.step == tc->max_steps && !run_final_model_current(tc->out_dir, st.step);
            if (dist.world > 1) missing = dist_max_int(&dist, missing);
            if (!missing) {
                if (rank0)
                    fprintf(stderr, "clla train: %s is at step %d and train.max_steps is %d: nothing to do (continue a finished run with --set train.max_steps=N)\n",
                            ckpt, st.step, tc->max_steps);
                dist_finalize(&dist);
                return 0;
            }
            const float *masters = grad_sync_full_masters(&gs, &model);   // collective
            if (rank0) {
                fprintf(stderr, "clla train: %s is at step %d = train.max_steps, but the run's final model of that step was not "
                        "written: writing it from the checkpoint\n", ckpt, st.step);
                // the metrics of an abandoned timeline's later steps go too, as on any resume
                RunFiles rf = {.metrics_fd = -1, .shard_bytes = shard_bytes};
                run_files_open_resume(&rf, tc->out_dir, tc->metrics, st.step);
                save_final_model(&rf, &cfg, &model, masters, ckpt);
                run_files_close(&rf);
            }
            dist_barrier(&dist);
            dist_finalize(&dist);
            return 0;
        }
        if (rank0) fprintf(stderr, "clla train: resuming from %s at step %d (%lld steps skipped so far)\n", ckpt, st.step, st.skipped_total);
    } else if (tc->init_from[0]) {
        if (rank0) run_start_compare_init_config(&cfg);
        model_load(&model, tc->init_from);
    } else {
        model_init_weights(&model, tc->seed);
    }
    model_set_batch(&model, B, T);

    if (clear_run_dir) {
        RunDirContents c;
        char what[1024];
        run_dir_inspect(tc->out_dir, tc->metrics, &c);
        run_dir_describe(&c, what, sizeof(what));
        fprintf(stderr, "clla train: --overwrite: removing the earlier run's files from %s (%s)\n", tc->out_dir, what);
        run_dir_clear(tc->out_dir, tc->metrics, 0);
    }
    RunFiles rf = {.metrics_fd = -1, .shard_bytes = shard_bytes};
    if (!rank0) {
        // no run files
    } else if (ckpt[0]) {
        run_files_open_resume(&rf, tc->out_dir, tc->metrics, st.step);
    } else {
        run_files_open(&rf, tc->out_dir, tc->metrics);
    }
    SignalWatch sig;
    signals_install(&sig);
    int start_step = st.step, stopped = 0;

    char ranks[256] = "";
    const int striped = !shard_is_contiguous(&gs.own);   // ZeRO-1 overlapped (train/grad_sync.h)
    const int gather_in_forward = striped && !gs.shard_masters;   // the CPU's masters are its weights
    if (dist.world > 1)
        snprintf(ranks, sizeof(ranks), " x %d ranks%s%s%s", dist.world,
                 !tc->zero_stage ? "" : gs.shard_masters ? " (ZeRO-1: AdamW state and fp32 masters sharded" : " (ZeRO-1: AdamW state sharded",
                 !tc->zero_stage ? "" : striped ? " in stripes of every bucket)" : ")",
                 !gs.bucket ? "" : gather_in_forward ? " (gradients summed during the backward, weights gathered during the forward)"
                                                     : " (gradients summed during the backward)");
    if (rank0)
        fprintf(stderr, "clla train: %s | %lld params | device %s | %d threads | B=%d T=%d x %d micro-steps%s = %lld tokens/step | %d steps\n",
                cfg.model.attention, model_num_params(&model), be->name, omp_get_max_threads(), B, T, n_micro, ranks,
                bt * n_total, tc->max_steps);

    int32_t *in = xmalloc((size_t)(bt * n_micro) * sizeof(int32_t)), *tg = xmalloc((size_t)(bt * n_micro) * sizeof(int32_t));
    double *stats = xcalloc((size_t)n_micro * N_STATS, sizeof(double)), *all_stats = xcalloc((size_t)n_total * N_STATS, sizeof(double));
    float *curve = xcalloc((size_t)tc->max_steps + 1, sizeof(float));
    double t_start = now_seconds(), tok_per_s = 0;
    for (int step = start_step; step < tc->max_steps && !stopped; step++) {
        double t0 = now_seconds(), comm0 = dist.comm_seconds;
        // A damaged data chunk: the state after `step` steps is good, so it is saved first.
        char data_err[512] = "";
        int bad_data = loader_next_checked(train_dl, in, tg, data_err, sizeof(data_err)) != 0;
        if (dist.world > 1) bad_data = dist_max_int(&dist, bad_data);
        if (bad_data) {
            if (kc.saved_step != step || !kc.saved[0]) save_checkpoint(&cfg, &model, &gs, &opt, &st, train_dl, &dist, &kc);
            die("step %d: %s; the state before it is saved as %s: repair or re-make the data (clla prep), then continue with --resume auto",
                step + 1, data_err[0] ? data_err : "another rank read a damaged data chunk", kc.saved);
        }
        for (int k = 0; k < n_micro; k++) {
            grad_sync_begin_micro(&gs, &model, k);
            double *row = stats + (size_t)k * N_STATS;
            row[ST_LM] = model_forward(&model, in + (size_t)k * bt, tg + (size_t)k * bt);
            // the mean over all ranks' micro-batches is what the gradient sum differentiates
            model_backward(&model, 1.0f / (float)n_total);
            // the forward's MoE statistics, read back once the backward is queued behind it (a
            // device waits for nothing in between: model/moe.c)
            MoeStats ms;
            moe_last_stats(&model, &ms);
            row[ST_AUX] = ms.aux_loss;
            row[ST_Z] = ms.z_loss;
            row[ST_MAX_SHARE] = ms.max_share;
            row[ST_MIN_SHARE] = ms.min_share;
            row[ST_ASSIGNED] = (double)ms.assignments;
            row[ST_DROPPED] = (double)ms.dropped;
            grad_sync_end_micro(&gs, &model, k);
        }
        // first: with the sum overlapped, no other MPI call may come before it (train/dist.h)
        grad_sync_reduce(&gs, &model);
        // loss = LM loss + the MoE layers' aux (+ z) losses, summed in global micro-batch order
        dist_allgather_f64(&dist, stats, n_micro * N_STATS, all_stats);
        double loss = 0, lm_loss = 0, aux_loss = 0, max_share = 0, min_share = 0;
        long long assigned = 0, dropped = 0;
        for (int j = 0; j < n_total; j++) {
            const double *row = all_stats + (size_t)j * N_STATS;
            lm_loss += row[ST_LM] / n_total;
            aux_loss += (row[ST_AUX] + row[ST_Z]) / n_total;
            loss += (row[ST_LM] + row[ST_AUX] + row[ST_Z]) / n_total;
            max_share += row[ST_MAX_SHARE] / n_total;
            min_share += row[ST_MIN_SHARE] / n_total;
            assigned += (long long)row[ST_ASSIGNED];
            dropped += (long long)row[ST_DROPPED];
        }
        double norm = grad_sync_norm(&gs, &model);
        float lr = lr_at(tc, step);
        int finite = isfinite(loss) && isfinite(norm);
        // the weights of a pending checkpoint gave a finite loss: it is safe to go back to
        if (finite && kc.pending[0]) {
            snprintf(kc.safe, sizeof(kc.safe), "%s", kc.pending);
            kc.pending[0] = '\0';
        } else if (!finite) {
            kc.pending[0] = '\0';
        }
        if (finite) {
            // one pass where nothing is gathered across ranks (train/optimizer.h), else the update
            // of this rank's range, then the gather and the storage refresh
            const float scale = clip_scale(norm, tc->grad_clip);
            if (!grad_sync_gather_is_refresh(&gs) || !adamw_step_fused(&opt, &model, tc, lr, scale)) {
                adamw_update_range(&opt, &model, tc, lr, scale);
                grad_sync_gather_params(&gs, &model, adamw_store_seed(tc->seed, opt.t));
            }
            st.consecutive_skips = 0;
        } else {
            st.consecutive_skips++;
            st.skipped_total++;
            if (st.consecutive_skips < tc->max_consecutive_skips)
                warn("step %d: non-finite loss or gradient norm (loss %g, norm %g): update skipped (%d in a row, limit train.max_consecutive_skips = %d)",
                     step + 1, loss, norm, st.consecutive_skips, tc->max_consecutive_skips);
        }
        st.step = step + 1;
        st.tokens = bt * n_total * (long long)(step + 1);
        double dt = now_seconds() - t0, comm = dist.comm_seconds - comm0;
        tok_per_s = (double)bt * n_total / dt;
        curve[step] = (float)loss;

        cJSON *rec = cJSON_CreateObject();
        cJSON_AddNumberToObject(rec, "step", step + 1);
        cJSON_AddNumberToObject(rec, "loss", loss);
        if (model.moe) {   // expert shares: mean over MoE layers and micro-batches; drops: over all of them
            cJSON_AddNumberToObject(rec, "lm_loss", lm_loss);
            cJSON_AddNumberToObject(rec, "aux_loss", aux_loss);
            cJSON_AddNumberToObject(rec, "expert_share_max", max_share);
            cJSON_AddNumberToObject(rec, "expert_share_min", min_share);
            cJSON_AddNumberToObject(rec, "dropped_frac", assigned ? (double)dropped / (double)assigned : 0.0);
        }
        cJSON_AddNumberToObject(rec, "grad_norm", norm);
        cJSON_AddNumberToObject(rec, "lr", lr);
        cJSON_AddNumberToObject(rec, "ms", dt * 1e3);
        cJSON_AddNumberToObject(rec, "tokens_per_s", tok_per_s);
        cJSON_AddNumberToObject(rec, "tokens", (double)bt * n_total * (step + 1));
        if (dist.world > 1) cJSON_AddNumberToObject(rec, "comm_ms", comm * 1e3);   // rank 0's time in collectives
        if (!finite) cJSON_AddBoolToObject(rec, "skipped", 1);
        int last = step + 1 == tc->max_steps, val_bad = 0;
        char val_err[512] = "";
        const int validate = tc->val_data[0] && ((tc->val_every && (step + 1) % tc->val_every == 0) || last);
        if (validate) grad_sync_params_ready(&gs, &model);   // on every rank: a gather may be pending (collective)
        if (val_dl && validate) {
            EvalResult vr = evaluate(&model, val_dl, B, T, (long long)tc->val_batches * B, NULL, NULL);
            if (vr.failed) {
                val_bad = 1;
                snprintf(val_err, sizeof(val_err), "%s", vr.err);
            } else {
                cJSON_AddNumberToObject(rec, "val_loss", vr.loss);
                if (!quiet) fprintf(stderr, "step %d: val loss %.4f (ppl %.2f)\n", step + 1, vr.loss, exp(vr.loss));
            }
        }
        char werr[1536];
        if (rank0 && metrics_write(rf.metrics_fd, rf.metrics_path, rec, werr, sizeof(werr)) != 0)
            die("step %d: %s; the last good checkpoint is %s", step + 1, werr, kc.saved[0] ? kc.saved : "(none)");
        cJSON_Delete(rec);
        // Non-finite steps: the update is skipped; at train.max_consecutive_skips in a row (by
        // default 1: at once), or when the run would end on one, the run stops. Nothing more is
        // saved, and the final model is not written.
        if (st.consecutive_skips >= tc->max_consecutive_skips || (last && st.consecutive_skips > 0)) {
            char safe[2 * PATH_MAX + 400];
            if (kc.safe[0]) snprintf(safe, sizeof(safe), "the newest checkpoint saved before the loss went non-finite is %s (resume from it with --resume %s and a lower train.lr, or check the data)", kc.safe, kc.safe);
            else if (kc.resumed[0])
                snprintf(safe, sizeof(safe), "no checkpoint saved since the resume from %s gave a finite step after it; one saved before "
                         "that may have (metrics.jsonl shows which steps were finite): resume it with --resume PATH and a lower train.lr",
                         kc.resumed);
            else if (kc.saved[0])
                snprintf(safe, sizeof(safe), "no checkpoint is safe: each was saved after the weights had diverged; start over with a lower train.lr (--overwrite)");
            else   // with checkpoints on, the run stopped before the first one: --save-every is set
                snprintf(safe, sizeof(safe), "no checkpoint was saved before it: start over with a lower train.lr (--overwrite)%s",
                         tc->save_every ? "" : ", and set --save-every to keep checkpoints");
            die("step %d: the loss or gradient norm is not finite (loss %g, norm %g; %d such step%s in a row, train.max_consecutive_skips = %d): stopping; %s",
                step + 1, loss, norm, st.consecutive_skips, st.consecutive_skips == 1 ? "" : "s", tc->max_consecutive_skips, safe);
        }
        // damaged validation data (read on rank 0): the state after this step is good, keep it
        if (dist.world > 1) val_bad = dist_max_int(&dist, val_bad);
        if (val_bad) {
            save_checkpoint(&cfg, &model, &gs, &opt, &st, train_dl, &dist, &kc);
            // rank 0 validates and says why; the others stop with it, quietly (one message a job)
            if (!rank0) exit(1);
            die("step %d: validation: %s; the state after step %d is saved as %s: repair or re-make train.val_data, then continue with --resume auto",
                step + 1, val_err, step + 1, kc.saved);
        }
        // every rank must take the same branch (the save is collective): the strongest request wins
        int sig_no = dist_max_int(&dist, signals_stop_requested(&sig));
        if (sig_no && rank0) fprintf(stderr, "clla train: %s received: saving a checkpoint after step %d and stopping\n", sig_no == SIGINT ? "SIGINT" : "SIGTERM", step + 1);
        // a stop at the last step is a normal end (final model written) with a checkpoint
        stopped = (sig_no || (stop_at && step + 1 >= stop_at)) && !last;
        // the last step always saves one: a finished run can be continued (--resume auto with a
        // larger train.max_steps) from its final weights and optimizer state
        if (stopped || sig_no || last || (tc->save_every && (step + 1) % tc->save_every == 0))
            save_checkpoint(&cfg, &model, &gs, &opt, &st, train_dl, &dist, &kc);
        if (!quiet && ((step + 1) % tc->log_every == 0 || last)) {
            char eta[32];
            double elapsed = now_seconds() - t_start;
            // to the step this process ends at: --stop-at's, when it comes before the schedule's end
            const int end = stop_at && stop_at < tc->max_steps ? stop_at : tc->max_steps;
            format_duration(eta, sizeof(eta), elapsed / (step + 1 - start_step) * (end > step + 1 ? end - step - 1 : 0));
            char moe[128] = "";
            if (model.moe)
                snprintf(moe, sizeof(moe), " | aux %.4f | experts max %.3f min %.3f | dropped %.1f%%", aux_loss,
                         max_share, min_share, assigned ? 100.0 * (double)dropped / (double)assigned : 0.0);
            fprintf(stderr, "step %5d/%d | loss %.4f%s | norm %.3f | lr %.2e | %.0f ms | %.0f tok/s | ETA %s\n",
                    step + 1, tc->max_steps, loss, moe, norm, lr, dt * 1e3, tok_per_s, eta);
        }
    }
    if (rank0) print_curve_summary(curve + start_step, start_step, st.step - start_step);
    if (stopped) {
        if (rank0) fprintf(stderr, "clla train: stopped after step %d of %d: continue with --resume auto\n", st.step, tc->max_steps);
    } else {
        const float *masters = grad_sync_full_masters(&gs, &model);   // collective
        if (rank0) save_final_model(&rf, &cfg, &model, masters, kc.saved[0] ? kc.saved : NULL);
    }
    // after the final model: a first signal during its save only asks for a stop, which the
    // finished run has made anyway
    signals_restore(&sig);

    if (rank0) run_files_close(&rf);
    free(curve); free(in); free(tg); free(stats); free(all_stats);
    adamw_free(&opt, &model);
    grad_sync_free(&gs, &model);
    model_free(&model);
    loader_close(train_dl);
    if (val_dl) loader_close(val_dl);
    // the other ranks wait here until rank 0 has written the final model
    dist_barrier(&dist);
    dist_finalize(&dist);
    return 0;
}
