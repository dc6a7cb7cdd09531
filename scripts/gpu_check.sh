#!/usr/bin/env bash
# One command that proves or disproves the CUDA backend on a GPU machine, and measures it
# (docs/GPU.md, "scripts/gpu_check.sh"). Every result goes to OUT: one log per step and
# summary.jsonl, one JSON line per step {"step", "status": pass|fail|skipped, "reason", "seconds"}.
#
#   scripts/gpu_check.sh [--out DIR] [--bin DIR] [--dry-run] [--quick]     on the GPU machine
#   scripts/gpu_check.sh --bundle DIR [--build DIR]                          here: a portable bundle
#
# Binaries: --bin DIR (a bundle made with --bundle: bin/ and lib/), else ./gpu_bundle when it
# exists, else build-cuda/ built now with nvcc (-DCLLA_CUDA=ON -DCLLA_NATIVE=OFF). --bundle builds
# a portable CUDA tree (no -march=native) and copies its GPU test and benchmark binaries with the
# shared libraries they need that a bare machine may lack (OpenBLAS, zstd, cJSON, PCRE2, OpenMP,
# gfortran...); not glibc and not the CUDA libraries (cuBLASLt alone is hundreds of MiB: the GPU
# machine needs the CUDA 13 runtime, cuBLAS and NCCL libraries, or an nvcc to build with).
#
# Steps: the GPU op tests (a failure is rerun with CLLA_CUDA_SYNC=1, which names the op that
# faulted); compute-sanitizer memcheck and initcheck on them; the production-shape checks
# (test_gpu_ops --production: matmul 8192 x 2048 x 5632, attention at T = 2048 with head widths
# 128 and 160 / 96, cross-entropy at V = 32000 and 128256, on a subset of rows); whole training
# steps of every preset and a MoE model against cpu-bf16 (test_gpu_train); decoding
# (test_gpu_decode); bench_gpu --json; the PyTorch comparison where a CUDA torch exists.
# Without a GPU (or with --dry-run) every step says it skipped and why, and the exit status is 0;
# any failed step makes it 1. --quick: no sanitizers, no benchmarks. COMPUTE_SANITIZER names the
# sanitizer when it is not on PATH or in /usr/local/cuda/bin.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_check_out}
BIN="" DRY=0 QUICK=0 BUNDLE="" BUILD=$ROOT/build-gpu-portable
usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --out) OUT=${2:?--out needs a directory}; shift ;;
        --bin) BIN=${2:?--bin needs a directory}; shift ;;
        --bundle) BUNDLE=${2:?--bundle needs a directory}; shift ;;
        --build) BUILD=${2:?--build needs a directory}; shift ;;
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
    if [ ! -d "$BUILD/tests/gpu" ]; then
        NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
        [ -x "$NVCC" ] || { echo "gpu_check: no nvcc to build the CUDA binaries with (and no $BUILD)" >&2; exit 1; }
        bash "$ROOT/scripts/build.sh" "$BUILD" -DCLLA_CUDA=ON -DCLLA_NATIVE=OFF -DCMAKE_CUDA_COMPILER="$NVCC" || exit 1
    fi
    mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" || exit 1
    for b in $GPU_BINARIES; do
        src=$(find_binary "$BUILD" "$b") || { echo "gpu_check: $b not found under $BUILD" >&2; exit 1; }
        cp "$src" "$BUNDLE/bin/" || exit 1
    done
    # the libraries the binaries load, but glibc's and the CUDA/driver ones
    for b in "$BUNDLE"/bin/*; do ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'; done | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[^/]*|libnvidia[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$BUNDLE/lib/" || exit 1; done || exit 1
    git -C "$ROOT" rev-parse HEAD > "$BUNDLE/COMMIT" 2>/dev/null || echo unknown > "$BUNDLE/COMMIT"
    echo "gpu_check: bundle in $BUNDLE: $(ls "$BUNDLE/bin" | wc -l) binaries, $(ls "$BUNDLE/lib" | wc -l) libraries, $(du -sh "$BUNDLE" | cut -f1)"
    exit 0
fi

# ---------------------------------------------------------------- the checks (GPU machine)
mkdir -p "$OUT" || { echo "gpu_check: cannot create $OUT" >&2; exit 1; }
: > "$OUT/summary.jsonl" || exit 1
FAILED=0
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
        [ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        record binaries pass "$BIN$( [ -f "$BIN/COMMIT" ] && echo " (commit $(cat "$BIN/COMMIT"))")" 0
    fi
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

# run_step NAME CMD...: runs CMD with its output in OUT/NAME.log; exit 77 = skipped (the binary's reason)
run_step() {
    local name=$1; shift
    if [ -n "$SKIP_ALL" ]; then record "$name" skipped "$SKIP_ALL" 0; return 0; fi
    local t0 rc
    t0=$(date +%s)
    "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    case $rc in
        0) record "$name" pass "$(tail -n 1 "$OUT/$name.log")" $dt ;;
        77) record "$name" skipped "$(grep -m1 'skipped' "$OUT/$name.log" || echo 'exit 77')" $dt ;;
        *) record "$name" fail "exit $rc: $(grep -m1 -E 'FAIL|error' "$OUT/$name.log" || tail -n 1 "$OUT/$name.log")" $dt
           return 1 ;;
    esac
}
# gpu_test STEP BINARY ARGS...: a GPU test, and on failure the same run synchronized after every
# op (CLLA_CUDA_SYNC=1), whose log names the op that faulted
gpu_test() {
    local name=$1 prog=$2 bin
    shift 2
    if [ -z "$SKIP_ALL" ] && ! bin=$(find_binary "$BIN" "$prog"); then record "$name" fail "$prog is not in $BIN" 0; return; fi
    if ! run_step "$name" "${bin:-$prog}" "$@"; then
        run_step "$name.sync" env CLLA_CUDA_SYNC=1 "$bin" "$@"
    fi
}
sanitizer() {   # sanitizer TOOL
    local cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
    if [ -z "$SKIP_ALL" ] && { [ $QUICK = 1 ] || [ ! -x "$cs" ]; }; then
        record "sanitizer.$1" skipped "$( [ $QUICK = 1 ] && echo '--quick' || echo 'compute-sanitizer not found')" 0; return
    fi
    run_step "sanitizer.$1" "$cs" --tool "$1" --error-exitcode 3 "${OPS:-test_gpu_ops}" --small
}

gpu_test test_gpu_ops test_gpu_ops --small
sanitizer memcheck
sanitizer initcheck
gpu_test production_shapes test_gpu_ops --production
gpu_test test_gpu_train test_gpu_train
gpu_test test_gpu_decode test_gpu_decode
if [ $QUICK = 1 ] && [ -z "$SKIP_ALL" ]; then
    record bench_gpu skipped "--quick" 0; record bench_torch skipped "--quick" 0
else
    BG=$(find_binary "${BIN:-/nonexistent}" bench_gpu || echo bench_gpu)
    run_step bench_gpu "$BG" --json
    if [ -n "$SKIP_ALL" ]; then record bench_torch skipped "$SKIP_ALL" 0
    elif python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
        run_step bench_torch env BENCH_GPU="$BG" python3 "$ROOT/bench/bench_gpu_compare.py" --json
    else record bench_torch skipped "python3 has no torch with CUDA here" 0; fi
fi
echo "gpu_check: results in $OUT (summary.jsonl and one log per step)"
exit $FAILED
