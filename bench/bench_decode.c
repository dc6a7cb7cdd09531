// bench_decode: decoding through the cache, per attention preset, against the machine's own
// roofline measured in the same run (docs/DESIGN.md section 8: only ratios taken together mean much).
//
//   build/bench/bench_decode [--presets mha,gqa,...] [--contexts 1024,4096,16384] [--batches 1,8]
//                            [--steps N] [--cache-codec SPEC] [--threads N] [--json]
//
// Model: d512, 8 layers, 8 heads of 64, SwiGLU 1408, vocab 8192; GQA presets: 2 kv heads; latent
// presets: latent 256, rope key 32 (the ratios of the paper's 1B shape). Weights random (timing does not depend on them).
//
// Per preset: prefill tokens/s of a 1024-token prompt, through the full forward (decoder_prefill)
// and in chunks through the cache (decoder_extend). Per (context, batch): the cache is filled with
// encoded random vectors (decoder_fill_synthetic) and `steps` decode steps are timed (after one
// warm-up); printed: ms per step, the cache bytes each step reads, and the roofline
//   max(bytes moved / copy bandwidth, FLOPs / sgemm rate)
// where bytes moved = cache bytes read + the weights (read once a step; of the untied embedding
// table only the batch's rows, which is all a step gathers: until 2026-11-28 the whole table was
// counted, 12% of the weights' bytes, which loosened the memory-bound rooflines) and FLOPs =
// 2 x batch x (matmul weights; a latent model's kv_b_proj only as its absorption, counted twice
// until 2026-11-28) + the attention's dot products. Cache bytes read: each layer reads
// the streams it attends over (cache_layout_read_bytes_per_token), so a slot shared by 2 layers
// counts twice; until 2026-11-26 it counted once (the bytes stored), which put the memory side of
// the CLA presets' roofline at half what their steps must move. Copy bandwidth: memcpy of 512 MiB
// shared out over the threads the steps use (read + written bytes per second; one thread's
// until 2026-11-26), sgemm: cblas_sgemm at 2048^3 on the same threads, both best of 3, measured
// before the first preset and again after each one; the roofline takes the best of all of them
// (since 2026-11-26, late night: one measurement at the start moved between 29 and 41 GB/s from
// run to run on the development VM, and every x-roofline figure of the run with it). So the
// table is printed at the end; progress goes to stderr meanwhile. The last column, x read, sets
// the step against the same roofline with the bytes over the machine's read bandwidth instead
// (bench_read_bandwidth, bench/bench_common.h, measured beside the other two): a step only reads
// its cache and weights. On the development VM the two rates moved within about 15% of each
// other, either one the higher from run to run (docs/INFERENCE.md).
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "model/decode.h"
#include "bench/bench_common.h"

static const ArgSpec SPECS[] = {
    {"presets", 1, "comma-separated presets (default: all eleven)", "LIST"},
    {"contexts", 1, "comma-separated context lengths (default 1024,4096,16384)", "LIST"},
    {"batches", 1, "comma-separated batch sizes (default 1,8)", "LIST"},
    {"steps", 1, "timed decode steps per point (default 3)", "N"},
    {"cache-codec", 1, "codec spec applied over each preset's served layout, e.g. fp32 or latent=int_group:bits=4,group=32 (cq: fitted on normal vectors)", "SPEC"},
    {"threads", 1, "OpenMP/OpenBLAS threads (default: OMP_NUM_THREADS or all cores)", "N"},
    {"json", 0, "one JSON object per line instead of the table", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

// the prompt whose prefill is timed; the model's positions cover it and its one extra token
#define PREFILL_TOKENS 1024

static const char *ALL_PRESETS = "mha,gqa,mqa,mla,cla,gqa_cla,clla,clla_share_krope,clla_share_kvproj,clla_quant,clla_quant_share_kvproj";

#define MAX_BATCH 64   // sequences decoded together at most: the size of the step's id arrays below

static int parse_list(const char *s, int *out, int max, int hi, const char *what) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (num_parse_i64(t, 1, hi, &v) != NUM_OK || n == max)
            die("--%s: '%s' is not a list of at most %d whole numbers from 1 to %d", what, s, max, hi);
        out[n++] = (int)v;
    }
    if (!n) die("--%s is empty", what);
    return n;
}

// Is tensor i a kv_b_proj? A latent model's decode step never applies it to the latent: its
// halves are folded into the query (W_UK) and applied to the attention output (W_UV), counted
// as the absorption in step_flops, once per layer (a consumer uses its producer's).
static int is_kv_b(const Model *m, int i) { return strstr(m->params.t[i].name, "kv_b_proj") != NULL; }

// FLOPs of one decode step per sequence at context ctx: every weight matmul (2 per weight
// element; the embedding is a gather, kv_b_proj is absorbed), the absorption of the latent
// models, attention.
static double step_flops(const Model *m, int ctx) {
    const ModelConfig *c = &m->cfg;
    double w = 0;
    for (int i = 0; i < m->params.n; i++)
        if (m->params.t[i].ndim == 2 && i != m->embed && !(config_is_latent(c) && is_kv_b(m, i))) w += (double)m->params.t[i].numel;
    if (m->lm_head == m->embed) w += (double)c->vocab_size * c->hidden_size;
    double f = 2.0 * w;
    int L = c->num_hidden_layers, NH = c->num_attention_heads;
    if (config_is_latent(c)) {
        double R = c->kv_lora_rank, DR = c->qk_rope_head_dim;
        f += L * 2.0 * NH * (c->head_dim * R + c->v_head_dim * R);    // W_UK into q, W_UV after
        f += L * 2.0 * NH * (double)ctx * (R + DR + R);                // scores over [c | k_rope], values c
    } else {
        f += L * 2.0 * NH * (double)ctx * (c->head_dim + c->v_head_dim);
    }
    return f;
}

// What a run measured, printed at the end against the run's best copy bandwidth and sgemm rate:
// a preset's prefill (ctx 0) or one decode point.
typedef struct Result {
    char preset[32];
    int ctx, batch;
    double prefill_full, prefill_chunk;         // tokens/s (ctx 0)
    double step_s, cache_read, bytes, flops;    // best step, cache bytes read, all bytes moved, FLOPs
    double bytes_per_token;
} Result;

// the best copy bandwidth, read bandwidth and sgemm rate so far, measured once more
static void measure(double *bw, double *rd, double *sg) {
    const double b = bench_copy_bandwidth(omp_get_max_threads()), r = bench_read_bandwidth(omp_get_max_threads()), g = bench_sgemm_rate(2048, 2048, 2048, 3);
    *bw = b > *bw ? b : *bw;
    *rd = r > *rd ? r : *rd;
    *sg = g > *sg ? g : *sg;
}

// The benchmark's d512 model of a preset (latent presets with the paper's rank 256 and rope 32,
// GQA with 2 kv heads), max_pos positions. Dies naming an unknown preset.
static void preset_config(Config *cfg, const char *preset, int max_pos) {
    char json_cfg[1024];
    snprintf(json_cfg, sizeof(json_cfg),
             "{\"attention\":\"%s\",\"vocab_size\":8192,\"hidden_size\":512,\"num_hidden_layers\":8,"
             "\"num_attention_heads\":8,\"head_dim\":64,\"v_head_dim\":64,\"intermediate_size\":1408,"
             "\"max_position_embeddings\":%d,\"tie_word_embeddings\":false%s,\"train\":{\"seq_len\":1024}}",
             preset, max_pos,
             strstr(preset, "la") && strcmp(preset, "cla") && strcmp(preset, "gqa_cla")
                 ? ",\"kv_lora_rank\":256,\"qk_rope_head_dim\":32,\"q_lora_rank\":0"
                 : strstr(preset, "gqa") ? ",\"num_key_value_heads\":2" : "");
    config_from_json(cfg, json_cfg, preset, 0, NULL);
}

int main(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: bench_decode [--presets LIST] [--contexts LIST] [--batches LIST] [--steps N] [--json]\n"
               "Decode ms per step per preset, context and batch, against the roofline measured in the same run.",
               NULL, NULL, 0);
    const char *th = args_get(&a, SPECS, N_SPECS, "threads");
    if (th) omp_set_num_threads((int)opt_i64("--threads", th, 1, CLLA_MAX_THREADS));
    int contexts[8], batches[8], steps = 3;
    int nc = parse_list(args_get(&a, SPECS, N_SPECS, "contexts") ? args_get(&a, SPECS, N_SPECS, "contexts") : "1024,4096,16384", contexts, 8, 1 << 20, "contexts");
    int nb = parse_list(args_get(&a, SPECS, N_SPECS, "batches") ? args_get(&a, SPECS, N_SPECS, "batches") : "1,8", batches, 8, MAX_BATCH, "batches");
    if (args_get(&a, SPECS, N_SPECS, "steps")) { int s[1]; parse_list(args_get(&a, SPECS, N_SPECS, "steps"), s, 1, 1 << 20, "steps"); steps = s[0]; }
    const char *codec_spec = args_get(&a, SPECS, N_SPECS, "cache-codec");
    int json = args_get(&a, SPECS, N_SPECS, "json") != NULL;
    int max_ctx = 0;
    for (int i = 0; i < nc; i++) max_ctx = contexts[i] > max_ctx ? contexts[i] : max_ctx;

    double bw = 0, rd = 0, sg = 0, t_start = now_seconds();
    Result *res = NULL;
    int n_res = 0;

    char presets[512];
    snprintf(presets, sizeof(presets), "%s", args_get(&a, SPECS, N_SPECS, "presets") ? args_get(&a, SPECS, N_SPECS, "presets") : ALL_PRESETS);
    if (!strpbrk(presets, "abcdefghijklmnopqrstuvwxyz")) die("--presets '%s' names no preset: give a comma-separated list, e.g. mha,clla_quant", presets);
    const int max_pos = max_ctx + steps + 2 > PREFILL_TOKENS + 1 ? max_ctx + steps + 2 : PREFILL_TOKENS + 1;
    {   // every preset and the codec checked before the first is measured (a bad last one threw
        // away the minutes of measurements before it)
        char all[512];
        snprintf(all, sizeof(all), "%s", presets);
        for (char *save = NULL, *preset = strtok_r(all, ",", &save); preset; preset = strtok_r(NULL, ",", &save)) {
            Config cfg;
            preset_config(&cfg, preset, max_pos);
            CacheLayout cl;
            cache_layout(&cl, &cfg.model);
            char err[256];
            if (codec_spec && cache_layout_apply_spec(&cl, codec_spec, err, sizeof(err)) != 0) die("--cache-codec with %s: %s", preset, err);
            cache_layout_free(&cl);
        }
    }
    measure(&bw, &rd, &sg);
    for (char *save = NULL, *preset = strtok_r(presets, ",", &save); preset; preset = strtok_r(NULL, ",", &save)) {
        Config cfg;
        preset_config(&cfg, preset, max_pos);
        Model m;
        model_build(&m, &cfg.model, backend_cpu());
        model_init_weights(&m, 1);
        CacheLayout cl;
        cache_layout(&cl, &cfg.model);
        char err[256];
        if (codec_spec && cache_layout_apply_spec(&cl, codec_spec, err, sizeof(err)) != 0) die("--cache-codec: %s", err);
        bench_fit_synthetic(&cl);
        // the weights a step reads: all of them but the embedding table, of which a step gathers
        // one row per sequence; tied, the output head reads the table whole
        const double embed_bytes = (double)m.params.t[m.embed].numel * 4.0, row_bytes = (double)cfg.model.hidden_size * 4.0;
        const double wbytes_but_embedding = (double)m.params.numel * 4.0 - (m.lm_head == m.embed ? 0.0 : embed_bytes);

        // prefill of one 1024-token prompt: full forward, and chunked through the cache
        int P = PREFILL_TOKENS, V = cfg.model.vocab_size;
        int32_t *prompt = xmalloc((size_t)P * sizeof(int32_t));
        for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 7919) % V);
        float *lg = xmalloc((size_t)V * 8 * sizeof(float));
        Decoder *d = decoder_new(&m, &cl, 1, P + 1);
        int seq0 = 0;
        const int32_t *pp[1] = {prompt};
        double t0 = now_seconds();
        decoder_prefill(d, 1, &seq0, pp, &P, lg);
        double pf_full = P / (now_seconds() - t0);
        decoder_release(d, 0);
        t0 = now_seconds();
        decoder_extend(d, 0, prompt, P, lg);
        double pf_chunk = P / (now_seconds() - t0);
        decoder_free(d);
        double bpt = cache_layout_bytes_per_token(&cl);
        res = xrealloc(res, (size_t)(n_res + 1 + nc * nb) * sizeof(Result));
        res[n_res++] = (Result){.ctx = 0, .prefill_full = pf_full, .prefill_chunk = pf_chunk, .bytes_per_token = bpt};
        snprintf(res[n_res - 1].preset, sizeof(res[n_res - 1].preset), "%s", preset);

        for (int ci = 0; ci < nc; ci++)
            for (int bi = 0; bi < nb; bi++) {
                int ctx = contexts[ci], B = batches[bi];
                d = decoder_new(&m, &cl, B, ctx + steps + 2);
                int ids[MAX_BATCH];
                int32_t toks[MAX_BATCH];
                for (int i = 0; i < B; i++) { ids[i] = i; toks[i] = (int32_t)(i + 1); decoder_fill_synthetic(d, i, ctx, 7 + (uint64_t)i); }
                float *lgb = xmalloc((size_t)V * B * sizeof(float));
                decoder_step(d, B, ids, toks, lgb);   // warm-up
                double best = 1e30;
                for (int s = 0; s < steps; s++) {
                    t0 = now_seconds();
                    decoder_step(d, B, ids, toks, lgb);
                    double dt = now_seconds() - t0;
                    best = dt < best ? dt : best;
                }
                double cache_read = (double)B * (ctx + 2) * cache_layout_read_bytes_per_token(&cl);
                res[n_res++] = (Result){.ctx = ctx, .batch = B, .step_s = best, .cache_read = cache_read,
                                        .bytes = cache_read + wbytes_but_embedding + (m.lm_head == m.embed ? 0.0 : B * row_bytes),
                                        .flops = B * step_flops(&m, ctx + 2), .bytes_per_token = bpt};
                snprintf(res[n_res - 1].preset, sizeof(res[n_res - 1].preset), "%s", preset);
                free(lgb);
                decoder_free(d);
            }
        free(prompt);
        free(lg);
        cache_layout_free(&cl);
        model_free(&m);
        measure(&bw, &rd, &sg);
        fprintf(stderr, "bench_decode: %s done, %.0f s\n", preset, now_seconds() - t_start);
    }

    if (!json)
        printf("machine: copy bandwidth %.2f GB/s (memcpy over the threads, read + write), read bandwidth %.2f GB/s (a sum "
               "over the threads), sgemm %.1f GFLOP/s, %d threads (the best of the measurements before the first preset and "
               "after each)\n\n"
               "%-24s %6s %5s %9s %11s %11s %9s %11s %9s\n", bw / 1e9, rd / 1e9, sg / 1e9, omp_get_max_threads(),
               "preset", "ctx", "batch", "ms/step", "cache MB/st", "roofline ms", "x roof", "bytes/token", "x read");
    else
        printf("{\"machine\":{\"copy_GBps\":%.3f,\"read_GBps\":%.3f,\"sgemm_GFLOPs\":%.2f,\"threads\":%d}}\n", bw / 1e9,
               rd / 1e9, sg / 1e9, omp_get_max_threads());
    for (int i = 0; i < n_res; i++) {
        const Result *r = &res[i];
        if (r->ctx == 0) {
            if (json)
                printf("{\"preset\":\"%s\",\"prefill_tokens\":%d,\"prefill_full_tok_s\":%.1f,\"prefill_chunked_tok_s\":%.1f,"
                       "\"bytes_per_token\":%.10g}\n", r->preset, PREFILL_TOKENS, r->prefill_full, r->prefill_chunk, r->bytes_per_token);
            else
                printf("%-24s prefill %d tokens: %.0f tok/s (full forward), %.0f tok/s (chunked through the cache)\n", r->preset,
                       PREFILL_TOKENS, r->prefill_full, r->prefill_chunk);
            continue;
        }
        // the roofline of the issue (bytes over the copy bandwidth), and the same with the bytes
        // over the read bandwidth: a step only reads its cache and weights
        const double roof = fmax(r->bytes / bw, r->flops / sg), read_roof = fmax(r->bytes / rd, r->flops / sg);
        if (json)
            // the roofline's parts too (all bytes moved: the cache's and the weights'; the FLOPs), so
            // that it can be recomputed from the printed rates
            printf("{\"preset\":\"%s\",\"context\":%d,\"batch\":%d,\"ms_per_step\":%.3f,\"cache_bytes_read\":%.0f,"
                   "\"bytes_moved\":%.0f,\"flops\":%.0f,"
                   "\"roofline_ms\":%.3f,\"x_roofline\":%.3f,\"read_roofline_ms\":%.3f,\"x_read_roofline\":%.3f,"
                   "\"bytes_per_token\":%.10g}\n",
                   r->preset, r->ctx, r->batch, r->step_s * 1e3, r->cache_read, r->bytes, r->flops, roof * 1e3, r->step_s / roof,
                   read_roof * 1e3, r->step_s / read_roof, r->bytes_per_token);
        else
            printf("%-24s %6d %5d %9.2f %11.1f %11.2f %9.2f %11.10g %9.2f\n", r->preset, r->ctx, r->batch, r->step_s * 1e3,
                   r->cache_read / 1e6, roof * 1e3, r->step_s / roof, r->bytes_per_token, r->step_s / read_roof);
    }
    free(res);
    return 0;
}
