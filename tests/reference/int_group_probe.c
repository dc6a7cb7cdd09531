// int_group_probe IN OUT N W BITS GROUP: the C side's CLLA-quant quantizer on given fp32 data,
// for tests/test_twin_latent.sh, which compares it bit for bit with the twin's independent
// torch implementation (twin.py int_group_quantize). IN holds N*W little-endian fp32 values;
// OUT receives two N*W fp32 arrays: the CPU backend op the training forward calls
// (cpu_int_group_roundtrip) and the cache codec's decode(encode(x)) (what inference serves).
// Linked against the build's libclla_core.a, so it runs the compiled code with the build's flags.
#include <stdio.h>
#include <stdlib.h>

#include "layers/cpu_ops.h"
#include "model/cache.h"

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: int_group_probe IN OUT N W BITS GROUP\n");
        return 2;
    }
    int N = atoi(argv[3]), W = atoi(argv[4]), bits = atoi(argv[5]), group = atoi(argv[6]);
    size_t n = (size_t)N * W;
    float *x = malloc(n * sizeof(float)), *rt = malloc(n * sizeof(float)), *dec = malloc(n * sizeof(float));
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(x, sizeof(float), n, f) != n) {
        fprintf(stderr, "int_group_probe: cannot read %zu floats from %s\n", n, argv[1]);
        return 2;
    }
    fclose(f);
    cpu_int_group_roundtrip(rt, x, N, W, bits, group);
    Codec c = {CODEC_INT_GROUP, bits, group};
    unsigned char *bytes = malloc(codec_bytes_per_token(&c, W) * (size_t)N);
    codec_encode(&c, bytes, x, N, W);
    codec_decode(&c, dec, bytes, N, W);
    f = fopen(argv[2], "wb");
    if (!f || fwrite(rt, sizeof(float), n, f) != n || fwrite(dec, sizeof(float), n, f) != n) {
        fprintf(stderr, "int_group_probe: cannot write %s\n", argv[2]);
        return 2;
    }
    fclose(f);
    free(x); free(rt); free(dec); free(bytes);
    return 0;
}
