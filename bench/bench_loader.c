// bench_loader: tokens/s the shard loader delivers to loader_next() (decompression,
// shuffled window gathering and the prefetch thread included), for comparison with the
// tokens/s of a training step (bench_train; the data issue asks for at least 50x).
//
//   build/bench/bench_loader [--data PATH] [--B 4] [--T 512] [--world 1] [--seconds 3]
//
// Without --data it writes 16M tokens of a Zipf-distributed stream over a vocabulary of
// 8192 (bench_train's vocabulary: uint16 shards; Zipf text compresses about like real
// token streams do) into a temporary directory, in 4 shards of default-size chunks.
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "common/args.h"
#include "common/num.h"
#include "common/unfinished.h"
#include "common/util.h"
#include "data/loader.h"
#include "data/shard.h"

static const ArgSpec SPECS[] = {
    {"data", 1, "shard file, directory or glob (default: a generated 16M-token set)", "PATH"},
    {"B", 1, "sequences per micro-batch (default 4, as bench_train)", "B"},
    {"T", 1, "tokens per sequence (default 512, as bench_train)", "T"},
    {"world", 1, "ranks sharing the global batch; this process is rank 0 (default 1)", "N"},
    {"seconds", 1, "how long to measure (default 3)", "S"},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

static const char *get(const Args *a, const char *name, const char *dflt) {
    const char *v = args_get(a, SPECS, N_SPECS, name);
    return v ? v : dflt;
}

static void make_data(const char *dir) {
    const uint32_t V = 8192;
    double *cdf = xmalloc(V * sizeof(double)), sum = 0;
    for (uint32_t i = 0; i < V; i++) cdf[i] = (sum += 1.0 / (i + 1.0));
    uint64_t rng = 42;
    uint32_t *buf = xmalloc(65536 * sizeof(uint32_t));
    for (int s = 0; s < 4; s++) {
        char name[64];
        snprintf(name, sizeof(name), "shard_%06d.bin", s);
        char *p = path_join(dir, name);
        ShardWriter *w = shard_writer_open(p, V, 0, SHARD_DEFAULT_CHUNK_TOKENS, 3);
        for (int k = 0; k < 64; k++) {
            for (int i = 0; i < 65536; i++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                double u = (double)(rng >> 11) / 9007199254740992.0 * sum;
                uint32_t lo = 0, hi = V - 1;
                while (lo < hi) {
                    uint32_t mid = (lo + hi) / 2;
                    if (cdf[mid] < u) lo = mid + 1;
                    else hi = mid;
                }
                buf[i] = lo;
            }
            shard_writer_add(w, buf, 65536);
        }
        shard_writer_close(w);
        free(p);
    }
    free(buf);
    free(cdf);
}

int main(int argc, char **argv) {
    Args a;
    args_parse(&a, argc, argv, SPECS, N_SPECS, "usage: bench_loader [options]", NULL, NULL, 0);
    int B = (int)opt_i64("--B", get(&a, "B", "4"), 1, 1 << 20), T = (int)opt_i64("--T", get(&a, "T", "512"), 1, 1 << 24);
    int world = (int)opt_i64("--world", get(&a, "world", "1"), 1, 1 << 20);
    double seconds = opt_f64("--seconds", get(&a, "seconds", "3"), 0.001, 1e6);
    const char *data = args_get(&a, SPECS, N_SPECS, "data");
    char tmp[] = "/tmp/bench_loader_XXXXXX";
    int tmp_slot = -1;
    if (!data) {
        if (!mkdtemp(tmp)) die("cannot create a temporary directory");
        // removed also when a die() or a signal ends the run (23 MB of shards were left in /tmp)
        unfinished_install();
        tmp_slot = unfinished_add(tmp, UNFINISHED_DIR);
        double t0 = now_seconds();
        make_data(tmp);
        printf("bench_loader: wrote 16.8M tokens (vocab 8192, 4 shards) in %.2f s\n", now_seconds() - t0);
        data = tmp;
    }
    LoaderOptions o = {.B = B, .T = T, .seed = 1, .rank = 0, .world = world, .vocab_size = 1 << 22};
    double t_open = now_seconds();
    DataLoader *dl = loader_open(data, &o);
    t_open = now_seconds() - t_open;
    int32_t *in = xmalloc((size_t)B * T * sizeof(int32_t)), *tg = xmalloc((size_t)B * T * sizeof(int32_t));
    long long batches = 0;
    double t0 = now_seconds(), worst = 0;
    while (now_seconds() - t0 < seconds) {
        double t1 = now_seconds();
        loader_next(dl, in, tg);
        double dt = now_seconds() - t1;
        if (dt > worst) worst = dt;
        batches++;
    }
    double dt = now_seconds() - t0;
    double tps = (double)batches * B * T / dt;
    printf("bench_loader: B=%d T=%d world=%d: %lld batches in %.2f s, open %.3f s\n", B, T, world, batches, dt, t_open);
    printf("bench_loader: %.2f M tokens/s delivered to loader_next (this rank), worst wait %.3f ms per batch\n", tps / 1e6,
           worst * 1e3);
    printf("bench_loader: a training step must stay below %.0f tokens/s for the loader to be 50x faster\n", tps / 50);
    loader_close(dl);
    free(in);
    free(tg);
    if (data == tmp) {
        unfinished_done(tmp_slot);
        if (remove_tree(tmp) != 0) warn("could not remove %s: %s", tmp, strerror(errno));
    }
    return 0;
}
