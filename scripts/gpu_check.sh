#!/usr/bin/env bash
# One command that proves or disproves the CUDA backend on a GPU machine, and measures it
# (docs/GPU.md, "scripts/gpu_check.sh"). Every result goes to OUT: one log per step and
# summary.jsonl, one JSON line per step {"step", "status": pass|fail|skipped, "reason", "seconds"}.
#
#   scripts/gpu_check.sh [--out DIR] [--bin DIR] [--dry-run] [--quick] [--budget S] [--bench-steps N]
#                        [--moe LIST] [--only LIST]                         on the GPU machine
#   scripts/gpu_check.sh --bundle DIR [--build DIR]                          here: a portable bundle
#
# Binaries: --bin DIR (a bundle made with --bundle: bin/ and lib/), else ./gpu_bundle when it
# exists, else build-cuda/ built now with nvcc (-DCLLA_CUDA=ON -DCLLA_NATIVE=OFF). --bundle builds
# a portable CUDA tree (no -march=native) and copies its GPU test and benchmark binaries with the
# shared libraries they need that a bare machine may lack (OpenBLAS, zstd, cJSON, PCRE2, OpenMP,
# gfortran...); not glibc, libstdc++ and libgcc_s (a newer one is everywhere; an older one first
# on LD_LIBRARY_PATH would break the machine's PyTorch) and not the CUDA libraries (cuBLASLt alone is hundreds of MiB: the GPU
# machine needs the CUDA 13 runtime, cuBLAS and NCCL libraries, or an nvcc to build with).
#
# Steps, most telling first (a lease may end before the last): the GPU op tests (a failure is
# rerun with CLLA_CUDA_SYNC=1, which names the op that faulted); whole training steps of every
# preset and a MoE model against cpu-bf16 (test_gpu_train); decoding (test_gpu_decode); the
# production-shape checks (test_gpu_ops --production: matmul 8192 x 2048 x 5632, attention at
# T = 2048 with head widths 128 and 160 / 96, cross-entropy at V = 32000 and 128256, on a subset
# of rows); the PyTorch comparison where a CUDA torch exists (bench/bench_gpu_compare.py: the
# dense model and the paper MoE configs of --moe LIST, names under configs/paper/, default clla);
# compute-sanitizer memcheck and initcheck on the op tests;
# bench_gpu --only experts (the MoE expert products both ways, before the long benchmarks);
# bench_gpu --json (dense and MoE, per-op GPU times); scripts/gpu_profile_attention.sh (ncu on
# the attention kernels, into OUT/profile_attention/). --budget S: the whole run's seconds
# (default 3600); each step runs under timeout(1) with what is left (and at most its own cap),
# and a step that finds less than 20 s left is skipped, saying so. --bench-steps N: timed steps
# per benchmark (10).
# Missing shared libraries (the CUDA ones a bundle does not carry) are looked for in the CUDA
# toolkit and in the nvidia-* Python wheels of the machine and added to LD_LIBRARY_PATH.
# Without a GPU (or with --dry-run) every step says it skipped and why, and the exit status is 0;
# any failed step makes it 1. --quick: no sanitizers, benchmarks or profile. --only LIST: only the
# steps named (comma-separated, the names of summary.jsonl: test_gpu_ops, test_gpu_train,
# test_gpu_decode, production_shapes, bench_gpu_experts, bench_torch, sanitizer.memcheck,
# sanitizer.initcheck, bench_gpu, profile_attention), the others skipped. COMPUTE_SANITIZER
# names the sanitizer when it is not on PATH or in /usr/local/cuda/bin.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_check_out}
BIN="" DRY=0 QUICK=0 BUNDLE="" BUILD=$ROOT/build-gpu-portable BUDGET=3600 BENCH_STEPS=10 MOE=clla ONLY=""
STEPS="test_gpu_ops test_gpu_train test_gpu_decode production_shapes bench_gpu_experts bench_torch sanitizer.memcheck sanitizer.initcheck bench_gpu profile_attention"
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "${BASH_SOURCE[0]}"; }   # the header above
positive_int() {   # positive_int OPTION VALUE: the value, or exit 2 naming the option
    [[ $2 =~ ^[1-9][0-9]{0,6}$ ]] || { echo "gpu_check: $1 needs a positive integer, got '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
    case $1 in
        --out) OUT=${2:?--out needs a directory}; shift ;;
        --bin) BIN=${2:?--bin needs a directory}; shift ;;
        --bundle) BUNDLE=${2:?--bundle needs a directory}; shift ;;
        --build) BUILD=${2:?--build needs a directory}; shift ;;
        --budget) positive_int --budget "${2:-}"; BUDGET=$2; shift ;;
        --bench-steps) positive_int --bench-steps "${2:-}"; BENCH_STEPS=$2; shift ;;
        --moe) MOE=${2:-}; shift
            # names of paper configs, comma-separated, each checked before any step runs
            [[ $MOE =~ ^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$ ]] ||
                { echo "gpu_check: --moe needs one or more names of configs/paper/*.json, comma-separated, got '$MOE'" >&2; exit 2; }
            for name in ${MOE//,/ }; do
                [ -f "$ROOT/configs/paper/$name.json" ] || { echo "gpu_check: --moe: no configs/paper/$name.json (names: $(ls "$ROOT/configs/paper" | sed -n 's/\.json$//p' | paste -sd, -))" >&2; exit 2; }
            done ;;
        --only) ONLY=${2:-}; shift
            [[ $ONLY =~ ^[a-z_.]+(,[a-z_.]+)*$ ]] || { echo "gpu_check: --only needs step names, comma-separated, got '$ONLY' (names: ${STEPS// /,})" >&2; exit 2; }
            for name in ${ONLY//,/ }; do
                [[ " $STEPS " == *" $name "* ]] || { echo "gpu_check: --only: no step '$name' (names: ${STEPS// /,})" >&2; exit 2; }
            done ;;
        --dry-run) DRY=1 ;;
        --quick) QUICK=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
GPU_BINARIES="test_gpu_ops test_gpu_train test_gpu_decode bench_gpu"

# ---------------------------------------------------------------- --bundle (here)
# find_binary DIR NAME: a binary of a CUDA build tree (tests/gpu/ or bench/) or of a bundle (bin/)
find_binary() {
    local d
    for d in "$1/bin" "$1/tests/gpu" "$1/bench" "$1"; do [ -x "$d/$2" ] && { echo "$d/$2"; return 0; }; done
    return 1
}
if [ -n "$BUNDLE" ]; then
    if [ -e "$BUNDLE" ] && [ -n "$(ls -A "$BUNDLE" 2>/dev/null)" ]; then
        echo "gpu_check: $BUNDLE exists and is not empty: remove it or name another directory" >&2; exit 1
    fi
    # a CMake tree is brought up to date every time (only what changed is rebuilt): one left from
    # an earlier bundle would otherwise give binaries older than the sources. A directory of
    # binaries that is no CMake tree is taken as it is.
    if [ ! -d "$BUILD" ] || [ -f "$BUILD/CMakeCache.txt" ]; then
        NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
        [ -x "$NVCC" ] || { echo "gpu_check: no nvcc to build the CUDA binaries with" >&2; exit 1; }
        bash "$ROOT/scripts/build.sh" "$BUILD" -DCLLA_CUDA=ON -DCLLA_NATIVE=OFF -DCMAKE_CUDA_COMPILER="$NVCC" || exit 1
    fi
    mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" || exit 1
    for b in $GPU_BINARIES; do
        src=$(find_binary "$BUILD" "$b") || { echo "gpu_check: $b not found under $BUILD" >&2; exit 1; }
        cp "$src" "$BUNDLE/bin/" || exit 1
    done
    # the libraries the binaries load, but glibc's and the CUDA/driver ones
    for b in "$BUNDLE"/bin/*; do ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[^/]*|libnvidia[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$BUNDLE/lib/" || exit 1; done || exit 1
    # the commit, and whether tracked files differed from it (the binaries hold those changes)
    { git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown; } | tr -d '\n' > "$BUNDLE/COMMIT"
    if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        echo " with uncommitted changes" >> "$BUNDLE/COMMIT"
    else echo >> "$BUNDLE/COMMIT"; fi
    echo "gpu_check: bundle in $BUNDLE: $(ls "$BUNDLE/bin" | wc -l) binaries, $(ls "$BUNDLE/lib" | wc -l) libraries, $(du -sh "$BUNDLE" | cut -f1)"
    exit 0
fi

# ---------------------------------------------------------------- the checks (GPU machine)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || { echo "gpu_check: cannot create $OUT" >&2; exit 1; }
# the logs of an earlier run into the same OUT go: beside this run's summary they would pass for
# its own (a step this run skips would keep the earlier run's log)
if [ -s "$OUT/summary.jsonl" ]; then
    for f in build probe $STEPS; do rm -f "$OUT/$f.log"; done
    rm -f "$OUT/machine.txt"
    echo "gpu_check: removed the earlier run's step logs from $OUT"
fi
: > "$OUT/summary.jsonl" || exit 1
FAILED=0
MACHINE_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
json_str() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t' '  '; }
record() {   # record STEP STATUS REASON SECONDS
    printf '{"step":"%s","status":"%s","reason":"%s","seconds":%s}\n' "$1" "$2" "$(json_str "$3")" "$4" >> "$OUT/summary.jsonl"
    printf '%-28s %-8s %s\n' "$1" "$2" "$3"
    [ "$2" = fail ] && FAILED=1
    return 0
}
SKIP_ALL=""
[ $DRY = 1 ] && SKIP_ALL="dry run (--dry-run): nothing executed"

# the binaries
if [ -z "$SKIP_ALL" ]; then
    if [ -z "$BIN" ] && [ -d "$ROOT/gpu_bundle/bin" ]; then BIN=$ROOT/gpu_bundle; fi
    if [ -z "$BIN" ]; then
        NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
        if [ -x "$NVCC" ]; then
            t0=$(date +%s)
            if bash "$ROOT/scripts/build.sh" "$ROOT/build-cuda" -DCLLA_CUDA=ON -DCLLA_NATIVE=OFF -DCMAKE_CUDA_COMPILER="$NVCC" > "$OUT/build.log" 2>&1; then
                BIN=$ROOT/build-cuda; record build pass "build-cuda with $NVCC" $(( $(date +%s) - t0 ))
            else record build fail "see build.log" $(( $(date +%s) - t0 )); SKIP_ALL="the build failed"; fi
        else SKIP_ALL="no binaries: no --bin, no gpu_bundle/ and no nvcc to build with"; fi
    else
        [ -d "$BIN" ] || { echo "gpu_check: --bin $BIN is not a directory" >&2; exit 2; }
        BIN=$(cd "$BIN" && pwd)
        [ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        record binaries pass "$BIN$( [ -f "$BIN/COMMIT" ] && echo " (commit $(cat "$BIN/COMMIT"))")" 0
    fi
fi
# missing_libs: the libraries the GPU binaries load that the loader does not find now
missing_libs() {
    local b
    for b in $GPU_BINARIES; do
        b=$(find_binary "$BIN" "$b") && ldd "$b" 2>/dev/null | awk '$3 == "not" {print $1}'
    done | sort -u
}
if [ -z "$SKIP_ALL" ] && [ -n "$(missing_libs)" ]; then
    # the CUDA libraries a bundle leaves out: the toolkit's, or those of the nvidia-* wheels
    for lib in $(missing_libs); do
        d=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu \
                 /opt /usr/local/lib /usr/lib/python3* -name "$lib" -print -quit 2>/dev/null)
        [ -n "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$d")"
    done
    if [ -n "$(missing_libs)" ]; then
        record libraries fail "not found on this machine: $(missing_libs | tr '\n' ' ')" 0
        SKIP_ALL="shared libraries missing (see the libraries step)"
    else record libraries pass "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" 0; fi
fi
# the machine
if [ -z "$SKIP_ALL" ]; then
    { nvidia-smi 2>&1 || true; echo; uname -a; lscpu 2>/dev/null | head -n 20; } > "$OUT/machine.txt"
    OPS=$(find_binary "$BIN" test_gpu_ops) || SKIP_ALL="test_gpu_ops is not in $BIN"
fi
if [ -z "$SKIP_ALL" ]; then
    "$OPS" --probe > "$OUT/probe.log" 2>&1
    rc=$?
    if [ $rc = 77 ]; then SKIP_ALL=$(grep -m1 'skipped' "$OUT/probe.log" || echo "no CUDA device")
    elif [ $rc != 0 ]; then record probe fail "test_gpu_ops --probe exited $rc: $(tail -n 1 "$OUT/probe.log")" 0; SKIP_ALL="the probe failed"; fi
fi

DEADLINE=$(( $(date +%s) + BUDGET ))
# run_step NAME CAP CMD...: runs CMD with its output in OUT/NAME.log, for at most CAP seconds and
# what is left of --budget; exit 77 = skipped (the binary's reason)
wanted() {   # wanted STEP: not left out by --only (a .sync rerun goes with its step)
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",${1%.sync},"* ]]
}
run_step() {
    local name=$1 cap=$2; shift 2
    if [ -n "$SKIP_ALL" ]; then record "$name" skipped "$SKIP_ALL" 0; return 0; fi
    if ! wanted "$name"; then record "$name" skipped "not in --only" 0; return 0; fi
    local t0 rc left
    t0=$(date +%s)
    left=$(( DEADLINE - t0 ))
    if [ $left -lt 20 ]; then record "$name" skipped "the --budget of $BUDGET s is spent" 0; return 0; fi
    [ $left -lt "$cap" ] && cap=$left
    timeout --kill-after=10 "$cap" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    case $rc in
        0) record "$name" pass "$(tail -n 1 "$OUT/$name.log")" $dt ;;
        77) record "$name" skipped "$(grep -m1 'skipped' "$OUT/$name.log" || echo 'exit 77')" $dt ;;
        124|137) record "$name" fail "timed out after $cap s: $(tail -n 1 "$OUT/$name.log")" $dt; return 1 ;;
        *) record "$name" fail "exit $rc: $(grep -m1 -E 'FAIL|error' "$OUT/$name.log" || tail -n 1 "$OUT/$name.log")" $dt
           return 1 ;;
    esac
}
# gpu_test STEP CAP BINARY ARGS...: a GPU test, and on failure the same run synchronized after
# every op (CLLA_CUDA_SYNC=1), whose log names the op that faulted
gpu_test() {
    local name=$1 cap=$2 prog=$3 bin
    shift 3
    if [ -z "$SKIP_ALL" ] && wanted "$name" && ! bin=$(find_binary "$BIN" "$prog"); then
        record "$name" fail "$prog is not in $BIN" 0; return
    fi
    if ! run_step "$name" "$cap" "${bin:-$prog}" "$@"; then
        run_step "$name.sync" "$cap" env CLLA_CUDA_SYNC=1 "$bin" "$@"
    fi
}
sanitizer() {   # sanitizer TOOL
    local cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
    if [ -z "$SKIP_ALL" ] && wanted "sanitizer.$1" && { [ $QUICK = 1 ] || [ ! -x "$cs" ]; }; then
        record "sanitizer.$1" skipped "$( [ $QUICK = 1 ] && echo '--quick' || echo 'compute-sanitizer not found')" 0; return
    fi
    # every error printed and grouped, the known groups apart (scripts/sanitizer_run.sh)
    run_step "sanitizer.$1" 300 bash "$ROOT/scripts/sanitizer_run.sh" "$cs" "$1" "${OPS:-test_gpu_ops}" --small
}

gpu_test test_gpu_ops 300 test_gpu_ops --small
gpu_test test_gpu_train 600 test_gpu_train
gpu_test test_gpu_decode 300 test_gpu_decode
gpu_test production_shapes 300 test_gpu_ops --production
BG=$(find_binary "${BIN:-/nonexistent}" bench_gpu || echo bench_gpu)
# the paper MoE config's expert matmuls alone, per expert and on the tensor-core grouped kernels
# (the default: docs/GPU.md, "MoE"), in one process, for their ratio:
# seconds, so before the long benchmarks, where a short lease still reaches it
if [ $QUICK = 1 ] && [ -z "$SKIP_ALL" ]; then record bench_gpu_experts skipped "--quick" 0
else (cd "$ROOT" && run_step bench_gpu_experts 300 "$BG" --json --steps "$BENCH_STEPS" --only experts) || FAILED=1; fi
if [ $QUICK = 1 ] && [ -z "$SKIP_ALL" ]; then
    record bench_torch skipped "--quick" 0; record bench_gpu skipped "--quick" 0
else
    if [ -n "$SKIP_ALL" ]; then record bench_torch skipped "$SKIP_ALL" 0
    elif python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
        # PyTorch with the machine's own libraries; bench_gpu with the bundle's
        (cd "$ROOT" && run_step bench_torch 600 env LD_LIBRARY_PATH="$MACHINE_LD_LIBRARY_PATH" \
            BENCH_GPU="env LD_LIBRARY_PATH=$(printf '%q' "${LD_LIBRARY_PATH:-}") $(printf '%q' "$BG")" python3 bench/bench_gpu_compare.py --json \
            --steps "$BENCH_STEPS" --moe "$MOE") || FAILED=1
    else record bench_torch skipped "python3 has no torch with CUDA here" 0; fi
fi
sanitizer memcheck
sanitizer initcheck
# last: the MoE half of bench_gpu builds a paper config as large as the GPU holds (minutes)
[ $QUICK = 1 ] && [ -z "$SKIP_ALL" ] || (cd "$ROOT" && run_step bench_gpu 600 "$BG" --json --steps "$BENCH_STEPS") || FAILED=1
# the attention kernels under ncu, and their SASS op counts (scripts/gpu_profile_attention.sh)
if [ $QUICK = 1 ] && [ -z "$SKIP_ALL" ]; then record profile_attention skipped "--quick" 0
else run_step profile_attention 300 bash "$ROOT/scripts/gpu_profile_attention.sh" --bin "${BIN:-.}" --out "$OUT/profile_attention" || FAILED=1; fi
echo "gpu_check: results in $OUT (summary.jsonl and one log per step)"
exit $FAILED
