// CPU backend memory: backend memory is host memory, so every transfer is a memcpy and
// the "storage copy" of the weights is the fp32 master itself.
#include "layers/cpu_ops.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/util.h"

// Every allocation carries a header of HEADER bytes just before the pointer handed out: how to
// give it back. One of HUGE_BYTES or more is its own anonymous
// mapping, aligned to HUGE_BYTES (2 MiB, the x86-64 huge page) and advised MADV_HUGEPAGE, so
// that the kernel backs it with huge pages where it can ("madvise" or "always" in
// /sys/kernel/mm/transparent_hugepage/enabled): a decode step reads gigabytes of cache, far more
// 4 KiB pages than the TLB holds, and in huge pages MHA's 16k batch-8 step took 68-79 ms instead
// of 88-96 (docs/INFERENCE.md). Its pages are only taken as they are written, as calloc's large
// blocks were. The others come from calloc, as every one does with CLLA_HUGE_PAGES=0 in the
// environment (docs/COMMANDS.md). Either way the memory is zero: fresh mappings are, and calloc
// zeroes.
#define HEADER 64
#define HUGE_BYTES ((size_t)2 << 20)

typedef struct AllocHeader {
    void *base;     // what calloc or mmap returned
    size_t mapped;  // the mapping's length; 0: base came from calloc
} AllocHeader;

static void *alloc_mapped(size_t bytes) {
    if (bytes > SIZE_MAX - HUGE_BYTES - HEADER) return NULL;
    const size_t len = bytes + HUGE_BYTES + HEADER;   // room to align past the header
    uint8_t *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)base + HEADER + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);   // advice: where it is refused, 4 KiB pages serve
#endif
    *(AllocHeader *)(p - HEADER) = (AllocHeader){base, len};
    return p;
}

// huge pages unless the environment says CLLA_HUGE_PAGES=0
static int huge_pages_wanted(void) {
    return env_switch("CLLA_HUGE_PAGES", 1, "the CPU backend's buffers from calloc", "huge pages");
}

void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes >= HUGE_BYTES && huge_pages_wanted()) p = alloc_mapped(bytes);
    else if (bytes <= SIZE_MAX - HEADER) {
        uint8_t *base = calloc(bytes + HEADER, 1);
        if (base) {
            p = base + HEADER;
            *(AllocHeader *)base = (AllocHeader){base, 0};
        }
    }
    if (!p) die("out of memory allocating %zu bytes of CPU backend memory: use a smaller model, batch or sequence", bytes);
    return p;
}

void cpu_release(void *p) {
    if (!p) return;
    const AllocHeader h = *(const AllocHeader *)((uint8_t *)p - HEADER);
    if (h.mapped) munmap(h.base, h.mapped);
    else free(h.base);
}

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
