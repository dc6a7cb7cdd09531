// bench_codec: encode and decode throughput of the cache codecs (model/cache.h), in GB/s of fp32
// values, against the machine's copy bandwidth measured in the same run (memcpy, read + written
// bytes per second: docs/DESIGN.md section 8, only ratios taken together mean much).
//
//   build/bench/bench_codec [--codecs SPEC;SPEC;...] [--width W] [--head D] [--tokens N] [--threads N] [--json]
//
// Each codec encodes and decodes N tokens of width W (standard normal values; cq fitted on such
// values first), one token at a time as the decoder writes them (a block at a time for block
// codecs: kivi, qjl) and in one call of N; printed: GB/s of fp32 values (N * W * 4 bytes per
// second) and that over the copy bandwidth, bytes per token (block codecs: their blocks' average),
// and the codec's round-trip error (RMS over the values' RMS). A spec may name the part it codes,
// "v=kivi:bits=2": keys (the default) and values differ for kivi and qjl; qjl's keys "decode" to
// the estimator's vectors (docs/QUANTIZERS.md), no reconstruction, so their error is large.
// kvquant (fitted on such values first, one sequence whose first token is the sink) codes one
// record per token at positions 0..N-1: both of its passes are per token, its bytes per token
// what these records took.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/num.h"
#include "common/util.h"
#include "model/cache.h"
#include "bench/bench_common.h"

static const ArgSpec SPECS[] = {
    {"codecs", 1, "semicolon-separated codec specs (default: fp32;bf16;int_group:bits=4,group=32;int_group:bits=2,group=32;cq:bits=8,c=2;cq:bits=8,c=4;cq:bits=8,c=8;k=kivi:bits=2;v=kivi:bits=2;k=qjl;v=qjl;k=kvquant:bits=3;v=kvquant:bits=3)", "LIST"},
    {"width", 1, "values per token (default 512: the K of an 8-head, 64-wide MHA layer)", "W"},
    {"head", 1, "channels per attention head, for the codecs that work per head (qjl; default 64)", "D"},
    {"tokens", 1, "tokens per pass (default 16384)", "N"},
    {"threads", 1, "OpenMP threads of the codecs that use them (default: OMP_NUM_THREADS or all cores)", "N"},
    {"json", 0, "one JSON object per line instead of the table", NULL},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

static const char *DEFAULT_CODECS = "fp32;bf16;int_group:bits=4,group=32;int_group:bits=2,group=32;cq:bits=8,c=2;cq:bits=8,c=4;cq:bits=8,c=8;"
                                    "k=kivi:bits=2;v=kivi:bits=2;k=qjl;v=qjl;k=kvquant:bits=3;v=kvquant:bits=3";

// Seconds of the fastest of 3 runs of one pass: all N tokens in one call (per_token 0), or one
// call per token (the decoder's writes and reads; per block for block codecs).
static double time_pass(const Codec *c, int W, int N, const float *x, uint8_t *bytes, float *y, int decode, int per_token) {
    const CodecTraits *ct = codec_traits(c->kind);
    const int variable = codec_is_variable(c), bt = codec_block_tokens(c);
    const size_t ub = variable ? 0 : codec_span_bytes(c, W, bt);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_seconds();
        if (variable) {   // kvquant: one record per token at its position, sized as it goes (both passes are per token)
            uint8_t *p = bytes;
            for (int i = 0; i < N; i++) {
                size_t size = decode ? ct->record_size(c, p, W, i) : ct->token_size(c, x + (size_t)i * W, W, i);
                if (decode) ct->decode_token(c, y + (size_t)i * W, p, size, W, i);
                else ct->encode_token(c, p, size, x + (size_t)i * W, W, i);
                p += size;
            }
        } else if (per_token) {
            for (int t = 0; t < N; t += bt) {
                if (decode) codec_decode(c, y + (size_t)t * W, bytes + (size_t)(t / bt) * ub, bt, W);
                else codec_encode(c, bytes + (size_t)(t / bt) * ub, x + (size_t)t * W, bt, W);
            }
        } else if (decode) {
            codec_decode(c, y, bytes, N, W);
        } else {
            codec_encode(c, bytes, x, N, W);
        }
        double dt = now_seconds() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS,
               "usage: bench_codec [--codecs SPEC;SPEC;...] [--width W] [--head D] [--tokens N] [--threads N] [--json]\n"
               "Encode and decode throughput of the cache codecs against the machine's copy bandwidth.",
               NULL, NULL, 0);
    const char *ws = args_get(&a, SPECS, N_SPECS, "width"), *ns = args_get(&a, SPECS, N_SPECS, "tokens");
    const char *ths = args_get(&a, SPECS, N_SPECS, "threads"), *cs = args_get(&a, SPECS, N_SPECS, "codecs");
    int W = ws ? (int)opt_i64("--width", ws, 1, 1 << 16) : 512, N = ns ? (int)opt_i64("--tokens", ns, 1, 1 << 22) : 16384;
    const char *hs = args_get(&a, SPECS, N_SPECS, "head");
    int head = hs ? (int)opt_i64("--head", hs, 1, 1 << 16) : 64;
    // given, it must fit the width; the default matters only to the codecs that work per head
    // (their own checks below say so)
    if (hs && W % head) die("--head %d does not divide --width %d", head, W);
    if (ths) omp_set_num_threads((int)opt_i64("--threads", ths, 1, 1024));
    int json = args_get(&a, SPECS, N_SPECS, "json") != NULL;
    char list[1024];
    snprintf(list, sizeof(list), "%s", cs ? cs : DEFAULT_CODECS);
    if (strspn(list, "; ") == strlen(list)) die("--codecs '%s' names no codec: give semicolon-separated specs, e.g. fp32;bf16", list);

    // every spec parsed and checked before the first is measured (a bad last one came after the others' runs)
    enum { MAX_CODECS = 64 };
    Codec codecs[MAX_CODECS];
    char *specs[MAX_CODECS];
    int n_codecs = 0;
    for (char *save = NULL, *spec = strtok_r(list, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        if (n_codecs == MAX_CODECS) die("--codecs names more than %d codecs: measure them in several runs", MAX_CODECS);
        Codec *c = &codecs[n_codecs];
        char err[512];
        // "k=" / "v=": the part the codec codes (what kivi and qjl do depends on it)
        int use = CODEC_USE_KEYS;
        const char *body = spec;
        if (!strncmp(spec, "k=", 2) || !strncmp(spec, "v=", 2)) { use = spec[0] == 'v' ? CODEC_USE_VALUES : CODEC_USE_KEYS; body = spec + 2; }
        if (codec_parse(c, body, err, sizeof(err)) != 0) die("--codecs: %s", err);
        c->use = use;
        c->head = head;
        if (codec_traits(c->kind)->check(c, W, err, sizeof(err)) != 0) die("--codecs '%s': %s", spec, err);
        if (N % codec_block_tokens(c)) die("--tokens %d is not a whole number of %s's blocks of %d", N, spec, codec_block_tokens(c));
        specs[n_codecs++] = spec;
    }

    double bw = bench_copy_bandwidth(1);   // one thread, as on 2026-11-24 (docs/QUANTIZERS.md)
    float *x = bench_normal((size_t)N, W, 1), *y = xmalloc((size_t)N * W * sizeof(float));
    double gb = (double)N * W * 4.0 / 1e9, rms = 0;
    for (size_t i = 0; i < (size_t)N * W; i++) rms += (double)x[i] * x[i];
    rms = sqrt(rms / ((double)N * W));
    if (!json) {
        printf("machine: copy bandwidth %.2f GB/s (memcpy by one thread, read + write), %d threads; %d tokens of width %d\n\n", bw / 1e9,
               omp_get_max_threads(), N, W);
        printf("%-28s %8s %10s %10s %10s %10s %8s %8s %9s\n", "codec", "B/token", "enc GB/s", "dec GB/s", "enc/copy", "dec/copy",
               "enc 1tok", "dec 1tok", "rel RMSE");
    }
    for (int k = 0; k < n_codecs; k++) {
        Codec c = codecs[k];
        const char *spec = specs[k];
        char err[512];
        void *state = NULL;
        if (codec_needs_fit(&c)) {
            size_t n = ((size_t)1 << c.bits) * 8 > 4096 ? ((size_t)1 << c.bits) * 8 : 4096;
            float *cal = bench_normal(n, W, 2);
            if (codec_traits(c.kind)->fit(&c, W, cal, (int64_t)n, (int64_t)n, NULL, &state, err, sizeof(err)) != 0) die("fitting %s: %s", spec, err);
            free(cal);
            c.fit = state;
        }
        codec_bind(&c, W);
        double tb;
        size_t total = 0;
        if (codec_is_variable(&c)) {   // sized by the data: what the records of these N tokens take
            for (int i = 0; i < N; i++) total += codec_traits(c.kind)->token_size(&c, x + (size_t)i * W, W, i);
            tb = (double)total / N;
        } else {
            total = codec_span_bytes(&c, W, N);
            tb = codec_bytes_per_token_avg(&c, W);
        }
        uint8_t *bytes = xmalloc(total);
        double enc = time_pass(&c, W, N, x, bytes, y, 0, 0), dec = time_pass(&c, W, N, x, bytes, y, 1, 0);
        double enc1 = time_pass(&c, W, N, x, bytes, y, 0, 1), dec1 = time_pass(&c, W, N, x, bytes, y, 1, 1);
        double se = 0;
        for (size_t i = 0; i < (size_t)N * W; i++) se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        double rel = sqrt(se / ((double)N * W)) / rms;
        if (json)
            printf("{\"codec\":\"%s\",\"width\":%d,\"tokens\":%d,\"bytes_per_token\":%.10g,\"encode_gb_s\":%.3f,\"decode_gb_s\":%.3f,"
                   "\"encode_per_token_gb_s\":%.3f,\"decode_per_token_gb_s\":%.3f,\"copy_gb_s\":%.3f,\"rel_rmse\":%.5f}\n",
                   spec, W, N, tb, gb / enc, gb / dec, gb / enc1, gb / dec1, bw / 1e9, rel);
        else
            printf("%-28s %8.4g %10.2f %10.2f %10.3f %10.3f %8.2f %8.2f %9.5f\n", spec, tb, gb / enc, gb / dec, gb / enc / (bw / 1e9),
                   gb / dec / (bw / 1e9), gb / enc1, gb / dec1, rel);
        fflush(stdout);
        if (state) codec_traits(c.kind)->fit_free(state);
        else codec_unbind(&c);
        free(bytes);
    }
    free(x);
    free(y);
    return 0;
}
