// CPU backend memory: backend memory is host memory, so every transfer is a memcpy and
// the "storage copy" of the weights is the fp32 master itself.
#include "layers/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void *cpu_alloc(size_t bytes) {
    // calloc: the contract promises zeroed memory (gradient buffers rely on it), and large
    // requests come straight from mmap, already zero, so this costs nothing extra.
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) die("out of memory allocating %zu bytes of CPU backend memory: use a smaller model, batch or sequence", bytes);
    return p;
}

void cpu_release(void *p) { free(p); }

void cpu_zero(void *p, size_t bytes) { if (bytes) memset(p, 0, bytes); }

void cpu_upload(void *dst, const void *src, size_t bytes) { if (bytes) memcpy(dst, src, bytes); }

void cpu_download(void *dst, const void *src, size_t bytes) { if (bytes) memcpy(dst, src, bytes); }

void cpu_copy(void *dst, const void *src, size_t bytes) { if (bytes) memcpy(dst, src, bytes); }

// The seed drives stochastic rounding on bf16 backends; fp32 storage needs no rounding.
void cpu_store_weights(float *dst, const float *master, size_t n, unsigned long long seed) {
    (void)seed;
    if (n && dst != master) memcpy(dst, master, n * sizeof(float));
}

void cpu_act_to_host(float *dst_host, const float *src, size_t n) {
    if (n && dst_host != src) memcpy(dst_host, src, n * sizeof(float));
}

void cpu_act_from_host(float *dst, const float *src_host, size_t n) {
    if (n && dst != src_host) memcpy(dst, src_host, n * sizeof(float));
}
