#!/bin/bash
# Counts the OpenMP parallel regions a command opens (GOMP_parallel calls), and how many of them
# ran on one thread (an `if` clause that said no), by preloading a small wrapper of libgomp's
# entry point built here with gcc. Used for docs/INFERENCE.md's count of a decode step's thread
# wake-ups: run it with two step counts and take the difference per step, e.g.
#   OMP_NUM_THREADS=2 bash scripts/count_omp_regions.sh build/bench/bench_decode --presets mla --contexts 1024 --batches 1 --steps 1
#   OMP_NUM_THREADS=2 bash scripts/count_omp_regions.sh build/bench/bench_decode --presets mla --contexts 1024 --batches 1 --steps 101
# The counts go to stderr as the command exits: "omp regions: N opened, M on one thread".
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ $# -ge 1 ] || { echo "usage: bash scripts/count_omp_regions.sh COMMAND [ARGS...]" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/count.c" <<'EOC'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static long opened, single;
static void report(void) {   // after the command's own output, which stdio flushes only after this
    fflush(stdout);
    fprintf(stderr, "omp regions: %ld opened, %ld on one thread\n", opened, single);
}
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real) {
        real = (void (*)(void (*)(void *), void *, unsigned, unsigned))dlsym(RTLD_NEXT, "GOMP_parallel");
        if (!real) { fprintf(stderr, "count_omp_regions: libgomp's GOMP_parallel not found\n"); abort(); }
        atexit(report);
    }
    opened++;
    single += num_threads == 1;
    real(fn, data, num_threads, flags);
}
EOC
gcc -O2 -shared -fPIC -o "$work/count.so" "$work/count.c" -ldl
LD_PRELOAD="$work/count.so" "$@"
