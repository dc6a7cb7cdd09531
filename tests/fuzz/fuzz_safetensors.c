// libFuzzer target for the safetensors reader (built and run by tests/test_fuzz_safetensors.sh).
// The first input byte picks the mode:
//   even: the rest is a header's JSON text for st_parse_header, in a file of
//         8 + header + (byte >> 1) * 97 bytes (so data areas of many sizes are tried);
//   odd, bit 1 clear: the rest is a whole file image, written to a temporary file and opened
//         with st_open, then every float tensor read with st_read_f32;
//   odd, bit 1 set: the next 2 bytes are a header length L; the image is the 8-byte length L
//         (clipped to what is there), then the rest, so mutations reach the JSON and the data
//         area of files whose length field is right.
// Every rejection must come with a message; nothing may crash, leak or read out of bounds.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"

static char tmp_path[64];

static void remove_tmp(void) { unlink(tmp_path); }

static void write_image(const uint8_t *b, size_t n) {
    if (!tmp_path[0]) {
        // memory-backed when there is one: rewriting a file on disk thousands of times a
        // second is slow where truncation forces a flush (ext4's auto_da_alloc)
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(tmp_path, sizeof(tmp_path), "%s/fuzz_st.%ld.safetensors", dir, (long)getpid());
        atexit(remove_tmp);
    }
    unlink(tmp_path);   // a new file, not a truncated one (same reason)
    FILE *f = fopen(tmp_path, "wb");
    if (!f) abort();
    if (n && fwrite(b, 1, n, f) != n) abort();
    fclose(f);
}

static void open_and_read(void) {
    StFile sf;
    char err[512] = "";
    if (st_open(&sf, tmp_path, err, sizeof(err)) != 0) {
        if (!err[0]) abort();   // a rejection without a reason
        return;
    }
    for (int i = 0; i < sf.n; i++) {
        const StEntry *e = &sf.e[i];
        size_t es = st_dtype_size(e->dtype);
        if (!es || (e->end - e->begin) % es) abort();   // the reader promised a consistent entry
        size_t numel = (size_t)(e->end - e->begin) / es;
        float *out = malloc((numel ? numel : 1) * sizeof(float));
        err[0] = 0;
        if (st_read_f32(&sf, i, out, err, sizeof(err)) != 0 && !err[0]) abort();
        free(out);
    }
    st_close(&sf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (!(mode & 1)) {
        StFile sf;
        memset(&sf, 0, sizeof(sf));   // st_parse_header fills the entries, not the FILE
        char err[512] = "";
        char *hdr = malloc(n + 1);
        memcpy(hdr, p, n);
        hdr[n] = 0;
        uint64_t file_size = 8 + (uint64_t)n + (uint64_t)(mode >> 1) * 97;
        if (st_parse_header(&sf, hdr, n, file_size, err, sizeof(err)) == 0) {
            for (int i = 0; i < sf.n; i++)
                if (sf.e[i].end > sf.data_size || sf.e[i].begin > sf.e[i].end) abort();
            st_close(&sf);
        } else if (!err[0]) {
            abort();
        }
        free(hdr);
        return 0;
    }
    if (!(mode & 2)) {
        write_image(p, n);
    } else {
        if (n < 2) return 0;
        size_t len = (size_t)p[0] | ((size_t)p[1] << 8);
        p += 2;
        n -= 2;
        if (len > n) len = n;
        uint8_t *img = malloc(n + 8);
        for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)len >> (8 * i));
        memcpy(img + 8, p, n);
        write_image(img, n + 8);
        free(img);
    }
    open_and_read();
    return 0;
}
