// Every op of the CUDA backend against the CPU reference backend, through the Backend tables.
//
// Both backends get the same inputs, every act/weight input rounded to bf16 first, so the
// comparison measures the CUDA op's own error (bf16 outputs, fp32 accumulation in another
// order), not the rounding of its inputs. The CPU computes in fp32 from those values.
//
// Tolerances: tests/gpu/tolerance.h, with the rounding-placement argument behind each (one bf16
// rounding of the output: TOL_ROUND, which refuses a second one; tests/test_gpu_tolerance.c
// shows that on the CPU). A run on a GPU prints each check's err/tol ratio.
// Exact checks: store_weights against the host's prediction (backend/bf16.h), bf16
// conversions, embedding forward, zeroing; determinism: ops with reductions run twice and
// must agree bit for bit.
//
// Shapes are odd on purpose: sizes not multiples of 32, one token, one head, MQA and GQA,
// DQK != DV, rope on a sub-range of the head. Every backward starts from non-zero gradients,
// so "+=" is checked, not "=".
//
// No usable GPU: prints "skipped: no CUDA device (<reason>)" and exits 77. Otherwise one
// line per check, then "N passed, M failed"; exit status 1 on any failure.
//   test_gpu_ops [--small | --production | --probe]
// --small leaves out the production shapes (matmul 8192 x 2048 x 5632, attention at T = 2048,
// cross-entropy at V = 32000 and 128256; what compute-sanitizer can afford), --production runs
// only them, --probe only checks for a device (scripts/gpu_check.sh).
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_cuda.h"
#include "backend/bf16.h"
#include "backend/backend.h"
#include "tests/gpu/rounding_case.h"
#include "tests/gpu/tolerance.h"

static const Backend *cpu, *gpu;
static int n_passed, n_failed;


static void result(const char *name, int ok, const char *detail) {
    if (ok) n_passed++;
    else n_failed++;
    printf("%s %-60s %s\n", ok ? "ok  " : "FAIL", name, detail);
}

// ---------------------------------------------------------------- random data

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(rng_next() >> 11) * (1.0 / 9007199254740992.0));
}

static void *xalloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) { fprintf(stderr, "test_gpu_ops: out of memory\n"); exit(1); }
    return p;
}

static float bf16r(float x) { return sr_bf16_to_f32(sr_f32_to_bf16_rne(x)); }

// n values uniform in [lo, hi), rounded to bf16.
static float *rnd(size_t n, double lo, double hi) {
    float *a = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = bf16r((float)rng_uniform(lo, hi));
    return a;
}

// ---------------------------------------------------------------- paired buffers

// The same tensor on both backends. act: backend storage type (fp32 / bf16); otherwise fp32
// (or int32) on both.
typedef struct Buf { float *c, *g; size_t n; int act; } Buf;

static Buf buf_act(const float *host, size_t n) {
    Buf b = {cpu->alloc(n * cpu->act_bytes), gpu->alloc(n * gpu->act_bytes), n, 1};
    cpu->act_from_host(b.c, host, n);
    gpu->act_from_host(b.g, host, n);
    return b;
}

static Buf buf_raw(const void *host, size_t n) {   // fp32 or int32, 4 bytes per element
    Buf b = {cpu->alloc(n * 4), gpu->alloc(n * 4), n, 0};
    cpu->upload(b.c, host, n * 4);
    gpu->upload(b.g, host, n * 4);
    return b;
}

static void buf_free(Buf *b) {
    cpu->release(b->c);
    gpu->release(b->g);
}

// Host fp32 copies of both sides (caller frees).
static void buf_get(const Buf *b, float **c, float **g) {
    *c = xalloc(b->n * sizeof(float));
    *g = xalloc(b->n * sizeof(float));
    if (b->act) {
        cpu->act_to_host(*c, b->c, b->n);
        gpu->act_to_host(*g, b->g, b->n);
    } else {
        cpu->download(*c, b->c, b->n * 4);
        gpu->download(*g, b->g, b->n * 4);
    }
}

static void compare_arrays(const char *name, const float *ref, const float *got, size_t n, Tol tol) {
    size_t wi;
    const double worst = tol_ratio(ref, got, n, tol, &wi);
    double m = 0.0, maxdiff = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
        if (fabs((double)got[i] - (double)ref[i]) > maxdiff) maxdiff = fabs((double)got[i] - (double)ref[i]);
    }
    char detail[200];
    if (isinf(worst))
        snprintf(detail, sizeof detail, "NaN/inf or unexpected difference at %zu: ref %g, gpu %g", wi, ref[wi], got[wi]);
    else
        snprintf(detail, sizeof detail, "err/tol %.3f  max|diff| %.2e  max|ref| %.2e", worst, maxdiff, m);
    result(name, worst <= 1.0, detail);
    if (!(worst <= 1.0)) printf("     worst element %zu: ref %.8g, gpu %.8g\n", wi, ref[wi], got[wi]);
}

static void compare(const char *name, const Buf *b, Tol tol) {
    float *c, *g;
    buf_get(b, &c, &g);
    compare_arrays(name, c, g, b->n, tol);
    free(c);
    free(g);
}

// GPU bytes of b now equal `snapshot` (bytes saved earlier): determinism checks.
static void *gpu_snapshot(const Buf *b) {
    const size_t bytes = b->n * (b->act ? gpu->act_bytes : 4);
    void *s = xalloc(bytes);
    gpu->download(s, b->g, bytes);
    return s;
}

static void same_bits(const char *name, const Buf *b, const void *snapshot) {
    void *now = gpu_snapshot(b);
    const size_t bytes = b->n * (b->act ? gpu->act_bytes : 4);
    result(name, memcmp(now, snapshot, bytes) == 0, "bitwise");
    free(now);
}

// Restores the GPU side of b from a snapshot (to rerun an accumulating op from the same state).
static void gpu_restore(const Buf *b, const void *snapshot) {
    gpu->upload(b->g, snapshot, b->n * (b->act ? gpu->act_bytes : 4));
}

// ---------------------------------------------------------------- table and memory

static void test_table(void) {
    // Every op slot the CPU table fills must be filled in the CUDA table too. The struct is
    // name, act_bytes, then function pointers only; walk the pointer slots as raw bytes so
    // that ops added to backend.h later are covered without editing this test.
    const size_t first = offsetof(Backend, alloc);
    int ok = 1;
    for (size_t off = first; off + sizeof(void (*)(void)) <= sizeof(Backend); off += sizeof(void (*)(void))) {
        uintptr_t pc = 0, pg = 0;
        memcpy(&pc, (const char *)cpu + off, sizeof pc);
        memcpy(&pg, (const char *)gpu + off, sizeof pg);
        if (pc && !pg) {
            ok = 0;
            printf("     the CUDA table has no op at byte offset %zu (slot %zu after alloc)\n", off,
                   (off - first) / sizeof(void (*)(void)));
        }
    }
    char d[64];
    snprintf(d, sizeof d, "act_bytes %zu", gpu->act_bytes);
    result("table: every CPU op present, act_bytes = 2", ok && gpu->act_bytes == 2, d);
}

static void test_memory(void) {
    // alloc returns zeroed memory
    const size_t n = 12345;
    unsigned char *h = xalloc(n);
    void *p = gpu->alloc(n);
    memset(h, 0xAB, n);
    gpu->download(h, p, n);
    int zero = 1;
    for (size_t i = 0; i < n; i++) if (h[i]) zero = 0;
    result("alloc is zero-initialized", zero, "");
    // upload / download round trip, zero of a sub-range
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 7 + 1);
    gpu->upload(p, h, n);
    gpu->zero((char *)p + 100, 1000);
    unsigned char *back = xalloc(n);
    gpu->download(back, p, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        const unsigned char want = (i >= 100 && i < 1100) ? 0 : (unsigned char)(i * 7 + 1);
        if (back[i] != want) ok = 0;
    }
    result("upload, download, zero of a sub-range", ok, "");
    // device-to-device copy of an odd byte range into the middle of another buffer
    void *q = gpu->alloc(n);
    gpu->copy((char *)q + 3, (const char *)p + 5, n - 10);
    gpu->download(back, q, n);
    ok = back[0] == 0 && back[1] == 0 && back[2] == 0 && back[n - 2] == 0 && back[n - 1] == 0;
    for (size_t i = 0; i < n - 10; i++) {
        const size_t s = i + 5;
        const unsigned char want = (s >= 100 && s < 1100) ? 0 : (unsigned char)(s * 7 + 1);
        if (back[i + 3] != want) ok = 0;
    }
    result("copy (device to device, odd offsets)", ok, "");
    gpu->release(q);
    gpu->release(p);
    free(h);
    free(back);

    // act_from_host rounds to nearest even, act_to_host is exact: compare with the host functions.
    const size_t m = 1001;
    float *x = xalloc(m * sizeof(float)), *y = xalloc(m * sizeof(float));
    for (size_t i = 0; i < m; i++) x[i] = (float)rng_uniform(-100.0, 100.0) * (float)(i % 7 == 0 ? 1e-30 : 1.0);
    x[0] = 1.0f + 0x1p-8f;   // a tie
    float *a = gpu->alloc(m * gpu->act_bytes);
    gpu->act_from_host(a, x, m);
    gpu->act_to_host(y, a, m);
    ok = 1;
    for (size_t i = 0; i < m; i++) if (y[i] != bf16r(x[i])) ok = 0;
    result("act_from_host / act_to_host = host bf16 rounding (RNE)", ok, "");
    gpu->release(a);
    free(x);
    free(y);
}

static void test_store_weights(size_t n, unsigned long long seed) {
    float *master = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) master[i] = (float)rng_uniform(-3.0, 3.0);
    if (n > 3) { master[1] = 0.0f; master[2] = -1.5f; master[3] = 1e-40f; }
    float *dm = gpu->alloc(n * 4), *dw = gpu->alloc(n * 2);
    gpu->upload(dm, master, n * 4);
    gpu->store_weights(dw, dm, n, seed);
    uint16_t *bits = xalloc(n * 2);
    gpu->download(bits, dw, n * 2);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; i++) mismatches += bits[i] != sr_round_weight(master[i], seed, i);
    char name[128], d[64];
    snprintf(name, sizeof name, "store_weights n=%zu seed=%llu = host prediction", n, seed);
    snprintf(d, sizeof d, "%zu of %zu differ", mismatches, n);
    result(name, mismatches == 0, d);
    gpu->release(dm);
    gpu->release(dw);
    free(master);
    free(bits);
}

// ---------------------------------------------------------------- elementwise

static void test_add(size_t n) {
    float *ha = rnd(n, -2, 2), *hb = rnd(n, -2, 2);
    Buf a = buf_act(ha, n), b = buf_act(hb, n), o = buf_act(ha, n);
    cpu->add_forward(o.c, a.c, b.c, n);
    gpu->add_forward(o.g, a.g, b.g, n);
    char name[128];
    snprintf(name, sizeof name, "add_forward n=%zu", n);
    compare(name, &o, TOL_ROUND);
    // in place: a = a + b, then accumulate: b += a
    cpu->add_forward(a.c, a.c, b.c, n);
    gpu->add_forward(a.g, a.g, b.g, n);
    snprintf(name, sizeof name, "add_forward in place n=%zu", n);
    compare(name, &a, TOL_ROUND);
    cpu->accumulate(b.c, a.c, n);
    gpu->accumulate(b.g, a.g, n);
    snprintf(name, sizeof name, "accumulate n=%zu", n);
    compare(name, &b, TOL_SUM);   // inputs already differ by one rounding
    buf_free(&a); buf_free(&b); buf_free(&o);
    free(ha); free(hb);
}

// gate and up as the halves of one (rows, 2 cols) product (model/forward.c): rows 2 cols apart
static void test_swiglu(int rows, int cols) {
    const size_t n = (size_t)rows * cols, ld = 2 * (size_t)cols;
    float *hgu = rnd(2 * n, -3, 3), *hd = rnd(n, -1, 1), *hdgu = rnd(2 * n, -1, 1), *ho = rnd(n, -1, 1);
    for (size_t i = 0; i < 2 * n; i++) hgu[i] *= i % ld < (size_t)cols ? 2.0f : 1.0f;   // gate in [-6, 6], up in [-3, 3]
    Buf gu = buf_act(hgu, 2 * n), o = buf_act(ho, n), d = buf_act(hd, n), dgu = buf_act(hdgu, 2 * n);
    const size_t off_c = (size_t)cols * cpu->act_bytes, off_g = (size_t)cols * gpu->act_bytes;
    float *upc = (float *)((char *)gu.c + off_c), *upg = (float *)((char *)gu.g + off_g);
    cpu->swiglu_forward(o.c, gu.c, upc, rows, cols, (int)ld);
    gpu->swiglu_forward(o.g, gu.g, upg, rows, cols, (int)ld);
    cpu->swiglu_backward(dgu.c, (float *)((char *)dgu.c + off_c), d.c, gu.c, upc, rows, cols, (int)ld);
    gpu->swiglu_backward(dgu.g, (float *)((char *)dgu.g + off_g), d.g, gu.g, upg, rows, cols, (int)ld);
    char name[128];
    snprintf(name, sizeof name, "swiglu_forward %d x %d (rows %zu apart)", rows, cols, ld);
    compare(name, &o, TOL_ROUND);
    snprintf(name, sizeof name, "swiglu_backward dgate | dup %d x %d", rows, cols);
    compare(name, &dgu, TOL_ROUND);
    buf_free(&gu); buf_free(&o); buf_free(&d); buf_free(&dgu);
    free(hgu); free(hd); free(hdgu); free(ho);
}

static void test_copy_cols(int N, int src_ld, int src_off, int dst_ld, int dst_off, int width) {
    float *hs = rnd((size_t)N * src_ld, -2, 2), *hd = rnd((size_t)N * dst_ld, -2, 2);
    Buf s = buf_act(hs, (size_t)N * src_ld), d = buf_act(hd, (size_t)N * dst_ld);
    char name[128];
    cpu->copy_cols(d.c, dst_ld, dst_off, s.c, src_ld, src_off, N, width, 0);
    gpu->copy_cols(d.g, dst_ld, dst_off, s.g, src_ld, src_off, N, width, 0);
    snprintf(name, sizeof name, "copy_cols N=%d width=%d (%d+%d <- %d+%d)", N, width, dst_ld, dst_off, src_ld, src_off);
    compare(name, &d, (Tol){0.0, 0.0});
    cpu->copy_cols(d.c, dst_ld, dst_off, s.c, src_ld, src_off, N, width, 1);
    gpu->copy_cols(d.g, dst_ld, dst_off, s.g, src_ld, src_off, N, width, 1);
    snprintf(name, sizeof name, "copy_cols accumulate N=%d width=%d", N, width);
    compare(name, &d, TOL_ROUND);
    buf_free(&s); buf_free(&d);
    free(hs); free(hd);
}

static void test_int_group(int N, int W, int bits, int group) {
    const size_t n = (size_t)N * W;
    float *hx = rnd(n, -3, 3);
    for (int k = 0; k < group && k < W; k++) hx[k] = 0.0f;   // an all-zero group
    Buf x = buf_act(hx, n), o = buf_act(hx, n);
    cpu->int_group_roundtrip(o.c, x.c, N, W, bits, group);
    gpu->int_group_roundtrip(o.g, x.g, N, W, bits, group);
    char name[128];
    snprintf(name, sizeof name, "int_group_roundtrip N=%d W=%d bits=%d group=%d", N, W, bits, group);
    compare(name, &o, TOL_ROUND);   // same codes; the GPU rounds code * scale to bf16
    cpu->int_group_roundtrip(x.c, x.c, N, W, bits, group);
    gpu->int_group_roundtrip(x.g, x.g, N, W, bits, group);
    snprintf(name, sizeof name, "int_group_roundtrip in place N=%d W=%d", N, W);
    compare(name, &x, TOL_ROUND);
    buf_free(&x); buf_free(&o);
    free(hx);
}

// ---------------------------------------------------------------- embedding, matmul, norm, rope

static void test_embedding(int N, int C, int V) {
    int *tok = xalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tok[i] = (int)(rng_next() % (uint64_t)V);
    float *hw = rnd((size_t)V * C, -1, 1), *hd = rnd((size_t)N * C, -1, 1), *hdw = rnd((size_t)V * C, -1, 1);
    for (size_t i = 0; i < (size_t)V * C; i++) hdw[i] = (float)rng_uniform(-1, 1);   // fp32 gradient
    Buf t = buf_raw(tok, (size_t)N), w = buf_act(hw, (size_t)V * C), o = buf_act(hd, (size_t)N * C);
    Buf d = buf_act(hd, (size_t)N * C), dw = buf_raw(hdw, (size_t)V * C);
    char name[128];
    cpu->embedding_forward(o.c, (const int *)t.c, w.c, N, C);
    gpu->embedding_forward(o.g, (const int *)t.g, w.g, N, C);
    snprintf(name, sizeof name, "embedding_forward N=%d C=%d V=%d (exact)", N, C, V);
    compare(name, &o, (Tol){0.0, 0.0});
    void *before = gpu_snapshot(&dw);
    cpu->embedding_backward(dw.c, d.c, (const int *)t.c, N, C);
    gpu->embedding_backward(dw.g, d.g, (const int *)t.g, N, C);
    snprintf(name, sizeof name, "embedding_backward N=%d C=%d V=%d", N, C, V);
    compare(name, &dw, TOL_F32);
    void *after = gpu_snapshot(&dw);
    gpu_restore(&dw, before);
    gpu->embedding_backward(dw.g, d.g, (const int *)t.g, N, C);
    snprintf(name, sizeof name, "embedding_backward N=%d deterministic", N);
    same_bits(name, &dw, after);
    free(before); free(after);
    buf_free(&t); buf_free(&w); buf_free(&o); buf_free(&d); buf_free(&dw);
    free(tok); free(hw); free(hd); free(hdw);
}

// Element `off` of an act buffer on each side (the orchestration's sub-buffers can start at
// any element: cuBLASLt must then be told the real alignment).
static float *cp(const Buf *b, size_t off) { return (float *)((char *)b->c + off * (b->act ? cpu->act_bytes : 4)); }
static float *gp(const Buf *b, size_t off) { return (float *)((char *)b->g + off * (b->act ? gpu->act_bytes : 4)); }

// off: every operand starts `off` elements into its buffer.
static void test_matmul(int N, int C, int OC, size_t off) {
    const size_t ni = (size_t)N * C + off, nw = (size_t)OC * C + off, no = (size_t)N * OC + off;
    float *hi = rnd(ni, -1, 1), *hw = rnd(nw, -1, 1), *hd = rnd(no, -1, 1), *hdi = rnd(ni, -1, 1);
    float *hdw = xalloc(nw * sizeof(float));
    for (size_t i = 0; i < nw; i++) hdw[i] = (float)rng_uniform(-1, 1);
    Buf in = buf_act(hi, ni), w = buf_act(hw, nw), o = buf_act(hd, no), d = buf_act(hd, no);
    Buf di = buf_act(hdi, ni), dw = buf_raw(hdw, nw);
    char name[128], shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d OC=%d%s", N, C, OC, off ? " (offset operands)" : "");
    cpu->matmul_forward(cp(&o, off), cp(&in, off), cp(&w, off), N, C, OC);
    gpu->matmul_forward(gp(&o, off), gp(&in, off), gp(&w, off), N, C, OC);
    snprintf(name, sizeof name, "matmul_forward %s", shape);
    compare(name, &o, TOL_ROUND);   // fp32 accumulation, one rounding (no bf16 split-K reduction)
    // the residual as cuBLASLt's accumulate input: residual + product in fp32, rounded once
    // (backend/backend.h; test_matmul_residual_rounding below tells one rounding from two exactly)
    Buf r = buf_act(hd, no), ro = buf_act(hd, no);
    cpu->matmul_residual_forward(cp(&ro, off), cp(&r, off), cp(&in, off), cp(&w, off), N, C, OC);
    gpu->matmul_residual_forward(gp(&ro, off), gp(&r, off), gp(&in, off), gp(&w, off), N, C, OC);
    snprintf(name, sizeof name, "matmul_residual_forward %s", shape);
    compare(name, &ro, TOL_ROUND);
    buf_free(&r); buf_free(&ro);
    cpu->matmul_backward(cp(&di, off), cp(&dw, off), cp(&d, off), cp(&in, off), cp(&w, off), N, C, OC);
    gpu->matmul_backward(gp(&di, off), gp(&dw, off), gp(&d, off), gp(&in, off), gp(&w, off), N, C, OC);
    snprintf(name, sizeof name, "matmul_backward dinp %s", shape);
    compare(name, &di, TOL_ROUND);   // old + update in fp32, rounded once
    snprintf(name, sizeof name, "matmul_backward dweight %s", shape);
    compare(name, &dw, TOL_F32);
    // NULL outputs are skipped
    cpu->matmul_backward(NULL, cp(&dw, off), cp(&d, off), cp(&in, off), cp(&w, off), N, C, OC);
    gpu->matmul_backward(NULL, gp(&dw, off), gp(&d, off), gp(&in, off), gp(&w, off), N, C, OC);
    cpu->matmul_backward(cp(&di, off), NULL, cp(&d, off), cp(&in, off), cp(&w, off), N, C, OC);
    gpu->matmul_backward(gp(&di, off), NULL, gp(&d, off), gp(&in, off), gp(&w, off), N, C, OC);
    snprintf(name, sizeof name, "matmul_backward NULL dinp / NULL dweight %s", shape);
    compare(name, &dw, TOL_F32);
    buf_free(&in); buf_free(&w); buf_free(&o); buf_free(&d); buf_free(&di); buf_free(&dw);
    free(hi); free(hw); free(hd); free(hdi); free(hdw);
}

// matmul_residual_forward on inputs where one rounding and two differ bit for bit
// (tests/gpu/rounding_case.h): the device must return bf16(r + p) exactly. The fp32 CPU op gives
// r + p exactly there, so its rounding must equal the expectation too (a check of the inputs; the
// cpu-bf16 emulation's rounding is tests/test_gpu_tolerance.c's). The test means something only if
// a double rounding would change some elements: it says how many.
static void test_matmul_residual_rounding(int N, int C, int OC) {
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *hi = xalloc(ni * sizeof(float)), *hw = xalloc(nw * sizeof(float)), *hr = xalloc(no * sizeof(float));
    float *once = xalloc(no * sizeof(float)), *twice = xalloc(no * sizeof(float));
    rounding_case_fill(hi, hw, hr, N, C, OC, 0x5EEDull + (uint64_t)N * C * OC);
    const size_t visible = rounding_case_expect(once, twice, hi, hw, hr, N, C, OC);
    Buf in = buf_act(hi, ni), w = buf_act(hw, nw), r = buf_act(hr, no), o = buf_act(hr, no);
    cpu->matmul_residual_forward(o.c, r.c, in.c, w.c, N, C, OC);
    gpu->matmul_residual_forward(o.g, r.g, in.g, w.g, N, C, OC);
    float *c, *g;
    buf_get(&o, &c, &g);
    size_t gpu_once = 0, gpu_twice = 0, cpu_once = 0;
    for (size_t i = 0; i < no; i++) {
        gpu_once += g[i] == once[i];
        gpu_twice += g[i] == twice[i];
        cpu_once += bf16r(c[i]) == once[i];
    }
    char name[128], detail[200];
    snprintf(name, sizeof name, "matmul_residual_forward rounds once N=%d C=%d OC=%d", N, C, OC);
    snprintf(detail, sizeof detail,
             "%zu of %zu elements tell one rounding from two; gpu equals one rounding on %zu, two on %zu; "
             "the fp32 CPU op's rounding on %zu", visible, no, gpu_once, gpu_twice, cpu_once);
    result(name, visible > 0 && gpu_once == no && cpu_once == no, detail);
    free(c); free(g);
    buf_free(&in); buf_free(&w); buf_free(&r); buf_free(&o);
    free(hi); free(hw); free(hr); free(once); free(twice);
}

static void test_rmsnorm(int N, int C) {
    const size_t n = (size_t)N * C;
    float *hx = rnd(n, -2, 2), *hw = rnd((size_t)C, 0.5, 1.5), *hd = rnd(n, -1, 1), *hdx = rnd(n, -1, 1);
    float *hdw = xalloc((size_t)C * sizeof(float)), *hr = xalloc((size_t)N * sizeof(float));
    for (int i = 0; i < C; i++) hdw[i] = (float)rng_uniform(-1, 1);
    Buf x = buf_act(hx, n), w = buf_act(hw, (size_t)C), o = buf_act(hx, n), r = buf_raw(hr, (size_t)N);
    Buf d = buf_act(hd, n), dx = buf_act(hdx, n), dw = buf_raw(hdw, (size_t)C);
    char name[128];
    cpu->rmsnorm_forward(o.c, r.c, x.c, w.c, N, C, 1e-5f);
    gpu->rmsnorm_forward(o.g, r.g, x.g, w.g, N, C, 1e-5f);
    snprintf(name, sizeof name, "rmsnorm_forward out N=%d C=%d", N, C);
    compare(name, &o, TOL_ROUND);
    snprintf(name, sizeof name, "rmsnorm_forward rstd N=%d C=%d", N, C);
    compare(name, &r, TOL_F32);
    void *dw0 = gpu_snapshot(&dw), *dx0 = gpu_snapshot(&dx);
    cpu->rmsnorm_backward(dx.c, dw.c, d.c, x.c, w.c, r.c, N, C);
    gpu->rmsnorm_backward(dx.g, dw.g, d.g, x.g, w.g, r.g, N, C);
    snprintf(name, sizeof name, "rmsnorm_backward dinp N=%d C=%d", N, C);
    compare(name, &dx, TOL_SUM);
    snprintf(name, sizeof name, "rmsnorm_backward dweight N=%d C=%d", N, C);
    compare(name, &dw, TOL_F32);
    void *dw1 = gpu_snapshot(&dw);
    gpu_restore(&dw, dw0);
    gpu_restore(&dx, dx0);
    gpu->rmsnorm_backward(dx.g, dw.g, d.g, x.g, w.g, r.g, N, C);
    snprintf(name, sizeof name, "rmsnorm_backward dweight N=%d deterministic", N);
    same_bits(name, &dw, dw1);
    free(dw0); free(dx0); free(dw1);
    buf_free(&x); buf_free(&w); buf_free(&o); buf_free(&r); buf_free(&d); buf_free(&dx); buf_free(&dw);
    free(hx); free(hw); free(hd); free(hdx); free(hdw); free(hr);
}

static void test_rope(int B, int T, int H, int S, int off, int D, int pos0) {
    const size_t n = (size_t)B * T * H * S;
    float *hx = rnd(n, -2, 2);
    Buf x = buf_act(hx, n);
    char name[160];
    cpu->rope_forward(x.c, B, T, H, S, off, D, pos0, 10000.0f);
    gpu->rope_forward(x.g, B, T, H, S, off, D, pos0, 10000.0f);
    snprintf(name, sizeof name, "rope_forward B=%d T=%d H=%d S=%d off=%d D=%d pos0=%d", B, T, H, S, off, D, pos0);
    compare(name, &x, TOL_ROUND);
    Buf dx = buf_act(hx, n);
    cpu->rope_backward(dx.c, B, T, H, S, off, D, pos0, 10000.0f);
    gpu->rope_backward(dx.g, B, T, H, S, off, D, pos0, 10000.0f);
    snprintf(name, sizeof name, "rope_backward B=%d T=%d H=%d S=%d off=%d D=%d", B, T, H, S, off, D);
    compare(name, &dx, TOL_ROUND);
    buf_free(&x); buf_free(&dx);
    free(hx);
}

// ---------------------------------------------------------------- attention

// One run of the attention checks with the kernels `kernel` names in the test's output.
static void test_attention_kernel(int B, int T, int NH, int NKV, int DQK, int DV, const char *kernel) {
    const size_t nq = (size_t)B * T * NH * DQK, nk = (size_t)B * T * NKV * DQK, nv = (size_t)B * T * NKV * DV;
    const size_t no = (size_t)B * T * NH * DV, na = (size_t)B * NH * T;
    const float scale = 1.0f / sqrtf((float)DQK);
    float *hq = rnd(nq, -1.5, 1.5), *hk = rnd(nk, -1.5, 1.5), *hv = rnd(nv, -1, 1), *hd = rnd(no, -1, 1);
    float *hdq = rnd(nq, -0.1, 0.1), *hdk = rnd(nk, -0.1, 0.1), *hdv = rnd(nv, -0.1, 0.1);
    float *hz = xalloc(na * sizeof(float));
    Buf q = buf_act(hq, nq), k = buf_act(hk, nk), v = buf_act(hv, nv), o = buf_act(hd, no), d = buf_act(hd, no);
    Buf lse = buf_raw(hz, na), scr = buf_raw(hz, na);
    Buf dq = buf_act(hdq, nq), dk = buf_act(hdk, nk), dv = buf_act(hdv, nv);
    char name[160], shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d DQK=%d DV=%d %s", B, T, NH, NKV, DQK, DV, kernel);
    cpu->attention_forward(o.c, lse.c, q.c, k.c, v.c, B, T, NH, NKV, DQK, DV, scale);
    gpu->attention_forward(o.g, lse.g, q.g, k.g, v.g, B, T, NH, NKV, DQK, DV, scale);
    snprintf(name, sizeof name, "attention_forward out %s", shape);
    compare(name, &o, TOL_SUM);
    snprintf(name, sizeof name, "attention_forward lse %s", shape);
    compare(name, &lse, TOL_F32);
    void *q0 = gpu_snapshot(&dq), *k0 = gpu_snapshot(&dk), *v0 = gpu_snapshot(&dv);
    cpu->attention_backward(dq.c, dk.c, dv.c, scr.c, d.c, o.c, lse.c, q.c, k.c, v.c, B, T, NH, NKV, DQK, DV, scale);
    gpu->attention_backward(dq.g, dk.g, dv.g, scr.g, d.g, o.g, lse.g, q.g, k.g, v.g, B, T, NH, NKV, DQK, DV, scale);
    snprintf(name, sizeof name, "attention_backward dq %s", shape);
    compare(name, &dq, TOL_ATTBWD);
    snprintf(name, sizeof name, "attention_backward dk %s", shape);
    compare(name, &dk, TOL_ATTBWD);
    snprintf(name, sizeof name, "attention_backward dv %s", shape);
    compare(name, &dv, TOL_SUM);
    void *q1 = gpu_snapshot(&dq), *k1 = gpu_snapshot(&dk), *v1 = gpu_snapshot(&dv);
    gpu_restore(&dq, q0); gpu_restore(&dk, k0); gpu_restore(&dv, v0);
    gpu->attention_backward(dq.g, dk.g, dv.g, scr.g, d.g, o.g, lse.g, q.g, k.g, v.g, B, T, NH, NKV, DQK, DV, scale);
    void *q2 = gpu_snapshot(&dq), *k2 = gpu_snapshot(&dk), *v2 = gpu_snapshot(&dv);
    snprintf(name, sizeof name, "attention_backward deterministic %s", shape);
    result(name, !memcmp(q1, q2, nq * 2) && !memcmp(k1, k2, nk * 2) && !memcmp(v1, v2, nv * 2), "bitwise");
    free(q2); free(k2); free(v2);
    free(q0); free(k0); free(v0); free(q1); free(k1); free(v1);
    buf_free(&q); buf_free(&k); buf_free(&v); buf_free(&o); buf_free(&d); buf_free(&lse); buf_free(&scr);
    buf_free(&dq); buf_free(&dk); buf_free(&dv);
    free(hq); free(hk); free(hv); free(hd); free(hdq); free(hdk); free(hdv); free(hz);
}

// Both CUDA attention paths against the CPU: the tensor-core kernels (kernels/cuda_attention_tc.cu)
// where the widths are multiples of 16 within their instantiations (the test's buffers are
// aligned), and the one-warp-per-row kernels, which also serve every other width. `both` 0: the
// default path only.
static void test_attention_both(int B, int T, int NH, int NKV, int DQK, int DV, int both) {
    const int tc = DQK % 16 == 0 && DV % 16 == 0 && DQK <= CUDA_ATTENTION_TC_MAX_DQK && DV <= CUDA_ATTENTION_TC_MAX_DV;
    cuda_attention_use_tensor_cores(1);
    test_attention_kernel(B, T, NH, NKV, DQK, DV, tc ? "[tc]" : "[warp]");
    if (tc && both) {
        cuda_attention_use_tensor_cores(0);
        test_attention_kernel(B, T, NH, NKV, DQK, DV, "[warp]");
        cuda_attention_use_tensor_cores(1);
    }
}
static void test_attention(int B, int T, int NH, int NKV, int DQK, int DV) { test_attention_both(B, T, NH, NKV, DQK, DV, 1); }

// ---------------------------------------------------------------- cross-entropy, optimizer

static void test_xent(int N, int V) {
    const size_t n = (size_t)N * V;
    const int ignore = -100;
    int *tgt = xalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tgt[i] = (int)(rng_next() % (uint64_t)V);
    if (N > 2) tgt[N / 2] = ignore;
    float *hl = rnd(n, -4, 4), *hdl = rnd(n, -0.01, 0.01), *hz = xalloc((size_t)N * sizeof(float));
    Buf l = buf_act(hl, n), t = buf_raw(tgt, (size_t)N), loss = buf_raw(hz, (size_t)N), dl = buf_act(hdl, n);
    char name[128];
    cpu->xent_forward(loss.c, l.c, (const int *)t.c, N, V, ignore);
    gpu->xent_forward(loss.g, l.g, (const int *)t.g, N, V, ignore);
    snprintf(name, sizeof name, "xent_forward N=%d V=%d", N, V);
    compare(name, &loss, TOL_F32);
    const float dloss = 1.0f / (float)N;
    cpu->xent_backward(dl.c, l.c, (const int *)t.c, N, V, ignore, dloss);
    gpu->xent_backward(dl.g, l.g, (const int *)t.g, N, V, ignore, dloss);
    snprintf(name, sizeof name, "xent_backward N=%d V=%d", N, V);
    compare(name, &dl, TOL_SUM);
    buf_free(&l); buf_free(&t); buf_free(&loss); buf_free(&dl);
    free(tgt); free(hl); free(hdl); free(hz);
}

static void test_sumsq(size_t n) {
    float *h = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)rng_uniform(-1, 1) * (i % 1000 == 0 ? 1000.0f : 1.0f);
    Buf g = buf_raw(h, n);
    const double c = cpu->sumsq(g.c, n), r1 = gpu->sumsq(g.g, n), r2 = gpu->sumsq(g.g, n);
    char name[128], d[96];
    snprintf(name, sizeof name, "sumsq n=%zu", n);
    snprintf(d, sizeof d, "cpu %.17g gpu %.17g rel %.1e", c, r1, fabs(r1 - c) / (c > 0 ? c : 1));
    result(name, fabs(r1 - c) <= 1e-10 * c, d);   // both double, summed in different blocks
    snprintf(name, sizeof name, "sumsq n=%zu deterministic", n);
    result(name, r1 == r2, "bitwise");
    buf_free(&g);
    free(h);
}

// Over the stripes of a ZeRO-1 shard (model/shard.h), against the CPU backend's.
static void test_sumsq_stripes(size_t lo, size_t stripe, size_t period, size_t end) {
    float *h = xalloc(end * sizeof(float));
    for (size_t i = 0; i < end; i++) h[i] = (float)rng_uniform(-1, 1);
    Buf g = buf_raw(h, end);
    const double c = cpu->sumsq_stripes(g.c, lo, stripe, period, end), r = gpu->sumsq_stripes(g.g, lo, stripe, period, end);
    char name[128], d[96];
    snprintf(name, sizeof name, "sumsq_stripes lo=%zu stripe=%zu period=%zu end=%zu", lo, stripe, period, end);
    snprintf(d, sizeof d, "cpu %.17g gpu %.17g rel %.1e", c, r, fabs(r - c) / (c > 0 ? c : 1));
    result(name, fabs(r - c) <= 1e-10 * c, d);   // both double, summed in different blocks
    buf_free(&g);
    free(h);
}

static void test_adamw(size_t n, int t) {
    float *hp = xalloc(n * 4), *hm = xalloc(n * 4), *hv = xalloc(n * 4), *hg = xalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        hp[i] = (float)rng_uniform(-1, 1);
        hm[i] = t > 1 ? (float)rng_uniform(-0.01, 0.01) : 0.0f;
        hv[i] = t > 1 ? (float)rng_uniform(0, 1e-4) : 0.0f;
        hg[i] = (float)rng_uniform(-0.05, 0.05);
    }
    Buf p = buf_raw(hp, n), m = buf_raw(hm, n), v = buf_raw(hv, n), g = buf_raw(hg, n);
    cpu->adamw_update(p.c, m.c, v.c, g.c, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    gpu->adamw_update(p.g, m.g, v.g, g.g, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    char name[128];
    snprintf(name, sizeof name, "adamw_update param n=%zu t=%d", n, t);
    compare(name, &p, TOL_OPT);
    snprintf(name, sizeof name, "adamw_update m n=%zu t=%d", n, t);
    compare(name, &m, TOL_OPT);
    snprintf(name, sizeof name, "adamw_update v n=%zu t=%d", n, t);
    compare(name, &v, TOL_OPT);
    // the fused form from the same state: the same masters and moments as adamw_update, and the
    // bf16 storage store_weights makes of them, bit for bit (kernels/cuda_adamw.cu)
    const unsigned long long seed = 77;
    float *p2 = gpu->alloc(n * 4), *m2 = gpu->alloc(n * 4), *v2 = gpu->alloc(n * 4);
    float *w_fused = gpu->alloc(n * 4), *w_ref = gpu->alloc(n * 4);   // bf16 storage: n * 2 bytes used
    gpu->upload(p2, hp, n * 4);
    gpu->upload(m2, hm, n * 4);
    gpu->upload(v2, hv, n * 4);
    gpu->adamw_update_store(p2, m2, v2, g.g, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t, w_fused, seed);
    gpu->store_weights(w_ref, p.g, n, seed);
    size_t bad = 0;
    float *a1 = xalloc(n * 4), *a2 = xalloc(n * 4);
    const float *fused_bufs[3] = {p2, m2, v2}, *ref_bufs[3] = {p.g, m.g, v.g};
    for (int k = 0; k < 3; k++) {
        gpu->download(a1, fused_bufs[k], n * 4);
        gpu->download(a2, ref_bufs[k], n * 4);
        bad += memcmp(a1, a2, n * 4) != 0;
    }
    gpu->download(a1, w_fused, n * 2);
    gpu->download(a2, w_ref, n * 2);
    bad += memcmp(a1, a2, n * 2) != 0;
    snprintf(name, sizeof name, "adamw_update_store n=%zu t=%d = adamw_update + store_weights", n, t);
    result(name, bad == 0, bad ? "differs" : "bitwise");
    gpu->release(p2); gpu->release(m2); gpu->release(v2); gpu->release(w_fused); gpu->release(w_ref);
    free(a1); free(a2);
    buf_free(&p); buf_free(&m); buf_free(&v); buf_free(&g);
    free(hp); free(hm); free(hv); free(hg);
}

// ---------------------------------------------------------------- mixture of experts

static void compare_int(const char *name, const Buf *b) {
    int *c = xalloc(b->n * sizeof(int)), *g = xalloc(b->n * sizeof(int));
    cpu->download(c, b->c, b->n * 4);
    gpu->download(g, b->g, b->n * 4);
    size_t bad = 0;
    for (size_t i = 0; i < b->n; i++) bad += c[i] != g[i];
    char d[64];
    snprintf(d, sizeof d, "%zu of %zu differ (exact)", bad, b->n);
    result(name, bad == 0, d);
    free(c);
    free(g);
}

// Routing ops get identical fp32 inputs on both sides (the CPU's logits uploaded to both),
// so decisions are compared exactly; the bf16 row ops get bf16 rows.
static void test_moe(int N, int C, int E, int K, int capacity, int norm_topk) {
    const size_t nc = (size_t)N * C, ne = (size_t)N * E, nk = (size_t)N * K;
    char name[160], shape[80];
    snprintf(shape, sizeof shape, "N=%d C=%d E=%d K=%d cap=%d norm=%d", N, C, E, K, capacity, norm_topk);
    float *hx = rnd(nc, -1, 1), *hw = rnd((size_t)E * C, -1, 1), *hz = xalloc((ne + nk + 8) * sizeof(float));
    Buf x = buf_act(hx, nc), w = buf_act(hw, (size_t)E * C), logits = buf_raw(hz, ne);
    cpu->moe_router_forward(logits.c, x.c, w.c, N, C, E);
    gpu->moe_router_forward(logits.g, x.g, w.g, N, C, E);
    snprintf(name, sizeof name, "moe_router_forward %s", shape);
    compare(name, &logits, TOL_F32);
    float *hl = xalloc(ne * sizeof(float));
    cpu->download(hl, logits.c, ne * 4);
    if (N > 1) for (int e = 0; e < E; e++) hl[E + e] = hl[e];   // a tie pattern: two equal rows
    if (E > 2) hl[1] = hl[2];                                     // tied experts within a row
    gpu->upload(logits.g, hl, ne * 4);
    cpu->upload(logits.c, hl, ne * 4);

    Buf probs = buf_raw(hz, ne), lse = buf_raw(hz, (size_t)N), idx = buf_raw(hz, nk), tw = buf_raw(hz, nk);
    cpu->moe_topk_forward(probs.c, lse.c, (int *)idx.c, tw.c, logits.c, N, E, K, norm_topk);
    gpu->moe_topk_forward(probs.g, lse.g, (int *)idx.g, tw.g, logits.g, N, E, K, norm_topk);
    snprintf(name, sizeof name, "moe_topk_forward probs %s", shape);
    compare(name, &probs, TOL_F32);
    snprintf(name, sizeof name, "moe_topk_forward lse %s", shape);
    compare(name, &lse, TOL_F32);
    snprintf(name, sizeof name, "moe_topk_forward topk_idx %s", shape);
    compare_int(name, &idx);
    snprintf(name, sizeof name, "moe_topk_forward topk_w %s", shape);
    compare(name, &tw, TOL_F32);

    // dispatch on the same inputs: the CPU's probabilities and top-k (the GPU's expf may differ
    // by an ulp, which could move a capacity drop; the decisions themselves must not differ)
    float *hp = xalloc((ne + nk) * sizeof(float));
    cpu->download(hp, probs.c, ne * 4);
    cpu->download(hp + ne, idx.c, nk * 4);
    gpu->upload(probs.g, hp, ne * 4);
    gpu->upload(idx.g, hp + ne, nk * 4);
    free(hp);
    Buf counts = buf_raw(hz, (size_t)E), off = buf_raw(hz, (size_t)E + 1), rt = buf_raw(hz, nk), ar = buf_raw(hz, nk);
    cpu->moe_dispatch((int *)counts.c, (int *)off.c, (int *)rt.c, (int *)ar.c, probs.c, (const int *)idx.c, N, E, K, capacity);
    gpu->moe_dispatch((int *)counts.g, (int *)off.g, (int *)rt.g, (int *)ar.g, probs.g, (const int *)idx.g, N, E, K, capacity);
    snprintf(name, sizeof name, "moe_dispatch counts/offsets/rows %s", shape);
    compare_int(name, &counts);
    compare_int("moe_dispatch expert_off", &off);
    compare_int("moe_dispatch row_token", &rt);
    compare_int("moe_dispatch assign_row", &ar);
    int R = 0;
    cpu->download(&R, (const char *)off.c + (size_t)E * 4, 4);

    Buf aux = buf_raw(hz, 2);
    cpu->moe_aux_forward(aux.c, probs.c, lse.c, (const int *)counts.c, N, E, K, 0.01f, 0.001f);
    gpu->moe_aux_forward(aux.g, probs.g, lse.g, (const int *)counts.g, N, E, K, 0.01f, 0.001f);
    snprintf(name, sizeof name, "moe_aux_forward %s", shape);
    compare(name, &aux, TOL_F32);

    // rows: gather, combine, and their backwards
    float *hrows = rnd(nk * C, -1, 1), *hdx = rnd(nc, -0.5, 0.5), *hdo = rnd(nc, -1, 1);
    Buf rows = buf_act(hrows, nk * C), xout = buf_act(hx, nc), dx = buf_act(hdx, nc), dout = buf_act(hdo, nc);
    Buf eout = buf_act(hrows, nk * C), deout = buf_act(hrows, nk * C);
    float *hdtw = xalloc(nk * sizeof(float));
    for (size_t i = 0; i < nk; i++) hdtw[i] = (float)rng_uniform(-0.1, 0.1);
    Buf dtw = buf_raw(hdtw, nk);
    cpu->moe_gather_forward(rows.c, x.c, (const int *)rt.c, R, C);
    gpu->moe_gather_forward(rows.g, x.g, (const int *)rt.g, R, C);
    snprintf(name, sizeof name, "moe_gather_forward R=%d %s", R, shape);
    compare(name, &rows, (Tol){0.0, 0.0});
    cpu->moe_gather_backward(dx.c, eout.c, (const int *)ar.c, N, K, C);
    gpu->moe_gather_backward(dx.g, eout.g, (const int *)ar.g, N, K, C);
    snprintf(name, sizeof name, "moe_gather_backward %s", shape);
    compare(name, &dx, TOL_SUM);
    cpu->moe_combine_forward(xout.c, eout.c, tw.c, (const int *)ar.c, N, K, C);
    gpu->moe_combine_forward(xout.g, eout.g, tw.g, (const int *)ar.g, N, K, C);
    snprintf(name, sizeof name, "moe_combine_forward %s", shape);
    compare(name, &xout, TOL_SUM);
    cpu->moe_combine_backward(deout.c, dtw.c, dout.c, eout.c, tw.c, (const int *)ar.c, N, K, C);
    gpu->moe_combine_backward(deout.g, dtw.g, dout.g, eout.g, tw.g, (const int *)ar.g, N, K, C);
    snprintf(name, sizeof name, "moe_combine_backward dexpert_out %s", shape);
    compare(name, &deout, TOL_ROUND);
    snprintf(name, sizeof name, "moe_combine_backward dtopk_w %s", shape);
    compare(name, &dtw, TOL_F32);

    // router backward: softmax part (fp32), then the matmul part
    float *hdl = xalloc(ne * sizeof(float));
    for (size_t i = 0; i < ne; i++) hdl[i] = (float)rng_uniform(-0.01, 0.01);
    Buf dl = buf_raw(hdl, ne);
    cpu->upload(dtw.c, hdtw, nk * 4);   // same dtopk_w on both sides
    gpu->upload(dtw.g, hdtw, nk * 4);
    cpu->moe_router_softmax_backward(dl.c, dtw.c, probs.c, lse.c, (const int *)idx.c, tw.c, (const int *)counts.c,
                                     N, E, K, norm_topk, 0.01f, 0.001f);
    gpu->moe_router_softmax_backward(dl.g, dtw.g, probs.g, lse.g, (const int *)idx.g, tw.g, (const int *)counts.g,
                                     N, E, K, norm_topk, 0.01f, 0.001f);
    snprintf(name, sizeof name, "moe_router_softmax_backward %s", shape);
    compare(name, &dl, TOL_F32);
    float *hdwr = xalloc((size_t)E * C * sizeof(float));
    for (size_t i = 0; i < (size_t)E * C; i++) hdwr[i] = (float)rng_uniform(-0.1, 0.1);
    Buf dwr = buf_raw(hdwr, (size_t)E * C), dx2 = buf_act(hdx, nc);
    cpu->upload(dl.c, hdl, ne * 4);
    gpu->upload(dl.g, hdl, ne * 4);
    cpu->moe_router_backward(dx2.c, dwr.c, dl.c, x.c, w.c, N, C, E);
    gpu->moe_router_backward(dx2.g, dwr.g, dl.g, x.g, w.g, N, C, E);
    snprintf(name, sizeof name, "moe_router_backward dinp %s", shape);
    compare(name, &dx2, TOL_SUM);
    snprintf(name, sizeof name, "moe_router_backward dweight %s", shape);
    compare(name, &dwr, TOL_F32);

    Buf *all[] = {&x, &w, &logits, &probs, &lse, &idx, &tw, &counts, &off, &rt, &ar, &aux, &rows, &xout,
                  &dx, &dout, &eout, &deout, &dtw, &dl, &dwr, &dx2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) buf_free(all[i]);
    free(hx); free(hw); free(hz); free(hl); free(hrows); free(hdx); free(hdo); free(hdtw); free(hdl); free(hdwr);
}

// Grouped expert matmuls: expert e owns rows [off[e], off[e+1]) (some experts empty), the row
// buffers `tail` rows longer (dropped assignments: the forward zeroes them, dinp keeps them).
// The offsets live in backend memory (moe_dispatch writes them there). grouped: the CUDA side's
// tensor-core grouped kernels (kernels/cuda_moe_grouped.cu) or one cuBLASLt product per expert.
static void test_expert_matmul(int E, int C, int OC, const int *rows_per_expert, int tail, int grouped) {
    int *off = xalloc(((size_t)E + 1) * sizeof(int));
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows_per_expert[e];
    const int R = off[E] + tail;
    const size_t ni = (size_t)R * C, no = (size_t)R * OC, nw = (size_t)OC * C;
    float *hi = rnd(ni, -1, 1), *ho = rnd(no, -1, 1), *hdi = rnd(ni, -0.5, 0.5);
    Buf in = buf_act(hi, ni), out = buf_act(ho, no), dout = buf_act(ho, no), din = buf_act(hdi, ni);
    Buf doff = buf_raw(off, (size_t)E + 1);
    Buf *w = xalloc((size_t)E * sizeof(Buf)), *dw = xalloc((size_t)E * sizeof(Buf));
    const float **wc = xalloc((size_t)E * sizeof(float *)), **wg = xalloc((size_t)E * sizeof(float *));
    float **dwc = xalloc((size_t)E * sizeof(float *)), **dwg = xalloc((size_t)E * sizeof(float *));
    float *hdw = xalloc(nw * sizeof(float));
    for (int e = 0; e < E; e++) {
        float *hw = rnd(nw, -1, 1);
        for (size_t i = 0; i < nw; i++) hdw[i] = (float)rng_uniform(-1, 1);
        w[e] = buf_act(hw, nw);
        dw[e] = buf_raw(hdw, nw);
        wc[e] = w[e].c; wg[e] = w[e].g; dwc[e] = dw[e].c; dwg[e] = dw[e].g;
        free(hw);
    }
    cuda_moe_use_grouped(grouped);
    char name[200], shape[96];
    snprintf(shape, sizeof shape, "E=%d C=%d OC=%d R=%d tail=%d (%s)", E, C, OC, off[E], tail,
             grouped ? "grouped kernels" : "per expert");
    cpu->moe_expert_matmul_forward(out.c, in.c, wc, (const int *)doff.c, E, R, C, OC);
    gpu->moe_expert_matmul_forward(out.g, in.g, wg, (const int *)doff.g, E, R, C, OC);
    snprintf(name, sizeof name, "moe_expert_matmul_forward %s", shape);
    compare(name, &out, TOL_SUM);
    cpu->moe_expert_matmul_backward(din.c, dwc, dout.c, in.c, wc, (const int *)doff.c, E, R, C, OC);
    gpu->moe_expert_matmul_backward(din.g, dwg, dout.g, in.g, wg, (const int *)doff.g, E, R, C, OC);
    snprintf(name, sizeof name, "moe_expert_matmul_backward dinp %s", shape);
    compare(name, &din, TOL_SUM);
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, "moe_expert_matmul_backward dweight[%d] (%d rows, %s)", e, rows_per_expert[e],
                 grouped ? "grouped kernels" : "per expert");
        compare(name, &dw[e], TOL_F32);
        buf_free(&w[e]);
        buf_free(&dw[e]);
    }
    cuda_moe_use_grouped(-1);
    buf_free(&in); buf_free(&out); buf_free(&dout); buf_free(&din); buf_free(&doff);
    free(off); free(hi); free(ho); free(hdi); free(hdw); free(w); free(dw); free(wc); free(wg); free(dwc); free(dwg);
}

// Both ways of the grouped expert matmuls on one set of shapes.
static void test_expert_matmul_both(int E, int C, int OC, const int *rows_per_expert, int tail) {
    test_expert_matmul(E, C, OC, rows_per_expert, tail, 0);
    test_expert_matmul(E, C, OC, rows_per_expert, tail, 1);
}

// The production shapes of scripts/gpu_check.sh: the sizes the models train at, against the
// CPU op (the CPU side takes seconds on a GPU machine's cores).
static void test_production(void) {
    test_matmul(8192, 2048, 5632, 0);          // dense ~1B: tokens x d_model x d_ff
    test_matmul(8193, 2048, 512, 0);           // dinp past the 64 MiB fp32 scratch: two chunks
    test_matmul_residual_rounding(8192, 5632, 2048);   // its down projection into the residual stream
    test_attention_both(1, 2048, 4, 4, 64, 64, 0);
    test_attention_both(1, 2048, 4, 2, 128, 128, 0);
    test_attention_both(1, 2048, 2, 2, 160, 96, 0);    // MLA / CLLA: head 128 + rope 32, value 96
    test_xent(64, 32000);                      // Llama-2's vocabulary, 64 rows
    test_xent(32, 128256);                     // Llama-3's
    // MoE experts at a paper-like width (gate | up of 1408 each from d_model 1024), uneven rows
    test_expert_matmul_both(8, 1024, 2816, (const int[]){600, 0, 1500, 37, 900, 128, 255, 700}, 40);
}

int main(int argc, char **argv) {
    // no argument: every test; --small: all but the production shapes (for compute-sanitizer);
    // --production: only those; --probe: is there a device (exit 0) or not (77)
    int small = 1, production = 1, probe = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) production = 0;
        else if (!strcmp(argv[i], "--production")) small = 0;
        else if (!strcmp(argv[i], "--probe")) probe = 1;
        else {
            fprintf(stderr, "test_gpu_ops: unknown argument '%s' (--small, --production or --probe)\n", argv[i]);
            return 2;
        }
    }
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason)) {
        printf("skipped: no CUDA device (%s)\n", reason);
        return 77;
    }
    printf("test_gpu_ops on %s\n", reason);
    if (probe) return 0;
    cpu = backend_cpu();
    gpu = backend_cuda();
    if (!small) {
        test_production();
        printf("%d passed, %d failed\n", n_passed, n_failed);
        return n_failed ? 1 : 0;
    }

    test_table();
    test_memory();
    test_store_weights(1, 1);
    test_store_weights(100003, 0xDEADBEEFull);

    test_add(1);
    test_add(1001);
    test_swiglu(1, 1);
    test_swiglu(7, 4099);
    test_copy_cols(1, 5, 1, 7, 2, 3);
    test_copy_cols(37, 96, 64, 160, 0, 32);
    test_int_group(1, 32, 4, 32);
    test_int_group(7, 96, 4, 32);
    test_int_group(5, 72, 8, 24);
    test_int_group(3, 40, 2, 40);

    test_embedding(1, 1, 3);
    test_embedding(50, 33, 7);        // many repeats per token
    test_embedding(301, 130, 1000);

    test_matmul(1, 1, 1, 0);
    test_matmul(7, 33, 65, 0);
    test_matmul(129, 200, 77, 0);
    test_matmul(64, 256, 384, 0);
    test_matmul(64, 256, 384, 1);     // 2-byte aligned bf16 operands
    test_matmul(33, 64, 96, 8);       // 16-byte aligned
    test_matmul_residual_rounding(111, 72, 40);     // test_gpu_train's B x T, its down projection
    test_matmul_residual_rounding(129, 200, 77);
    test_matmul_residual_rounding(512, 256, 384);

    test_rmsnorm(1, 1);
    test_rmsnorm(5, 33);
    test_rmsnorm(67, 1000);
    test_rmsnorm(3, 4097);
    test_rmsnorm(300, 64);            // several dweight row chunks

    test_rope(1, 1, 1, 8, 0, 8, 0);
    test_rope(2, 7, 3, 20, 4, 12, 5);
    test_rope(1, 33, 2, 70, 6, 64, 1000);
    test_rope(2, 5, 1, 64, 0, 64, 100000);

    test_attention(1, 1, 1, 1, 8, 8);
    test_attention(2, 7, 4, 2, 20, 12);     // GQA, DQK != DV
    test_attention(1, 65, 6, 1, 33, 17);    // MQA, odd dims
    test_attention(1, 33, 4, 1, 16, 24);
    test_attention(2, 40, 8, 8, 64, 64);    // MHA
    test_attention(1, 300, 2, 1, 160, 96);  // several 64-row tiles, the latent form's widths
    test_attention(3, 1, 2, 2, 16, 32);     // tensor cores: one token, one partial tile
    test_attention(2, 100, 4, 2, 32, 16);   // GQA, T not a multiple of the 64-row tile, DV < DQK
    test_attention(1, 128, 6, 3, 48, 80);   // two whole tiles, DV > DQK
    test_attention(1, 200, 4, 1, 192, 128); // wide heads: the widest tensor-core instantiation
    test_attention(1, 70, 4, 2, 96, 64);    // tensor cores: the 128 / 64 instantiation (kernels/cuda_attention_tc.cu)
    test_attention(1, 90, 2, 2, 176, 48);   // the 192 / 64 one
    test_attention(1, 80, 2, 1, 64, 144);   // values wider than 128: the warp kernels take it
    test_attention_both(1, 2, 65552, 1, 16, 16, 0);   // B NH past the tensor-core grid's 65535: the warp kernels take it

    test_xent(1, 5);
    test_xent(7, 1001);
    test_xent(33, 32003);

    test_sumsq(1);
    test_sumsq(1000);
    test_sumsq(((size_t)1 << 20) + 3);
    test_sumsq_stripes(4096, 4096, 3 * 4096, 43000);          // rank 1 of 3, its last stripe clipped
    test_sumsq_stripes((size_t)7 << 17, (size_t)1 << 17, (size_t)1 << 20, ((size_t)3 << 20) + 5);   // rank 7 of 8
    test_adamw(1, 1);
    test_adamw(1001, 1);
    test_adamw(1001, 10);

    test_moe(1, 8, 4, 1, 0, 0);
    test_moe(37, 40, 8, 2, 0, 1);
    test_moe(64, 33, 6, 2, 12, 1);    // capacity drops
    test_moe(50, 96, 16, 4, 9, 0);
    test_moe(300, 40, 8, 2, 40, 1);   // N K = 600 > 256: the block scans' later chunks, drops across them
    test_expert_matmul_both(4, 40, 56, (const int[]){7, 0, 33, 1}, 0);
    test_expert_matmul_both(3, 64, 96, (const int[]){0, 65, 0}, 5);
    // several 128-row tiles per expert, the last one short; C and OC past one 128 tile and
    // not multiples of it; K (the expert's rows, for dW) not a multiple of the 32-row slab
    test_expert_matmul_both(5, 200, 264, (const int[]){300, 0, 129, 1, 77}, 9);
    // the per-expert way only: C not a multiple of 8 (the grouped kernels decline it)
    test_expert_matmul_both(2, 36, 20, (const int[]){10, 3}, 2);

    if (production) test_production();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
