#!/usr/bin/env bash
# Where the tensor-core attention kernels spend their time, on a GPU machine (docs/GPU.md,
# "Attention"): Nsight Compute's sections and stall metrics for the forward, dQ and dK/dV kernels of
# one training step of bench_gpu's dense model cut to one layer (the same attention shapes: B = 4,
# T = 2048, 16 heads of 128), and the SASS op counts of every attention kernel instantiation.
#
#   scripts/gpu_profile_attention.sh [--bin DIR] [--out DIR]
#
# --bin DIR: a bundle of scripts/gpu_check.sh --bundle (bin/, lib/) or a CUDA build tree (default
# ./gpu_bundle, else build-cuda). --out DIR: where ncu_attention.txt and sass_stats.txt go (default
# gpu_profile_out/). Needs ncu and cuobjdump (the CUDA toolkit's; /usr/local/cuda/bin is searched);
# without them, or without a device, it says what is missing and exits 77 (skipped, as the GPU
# tests do) having run nothing.
# ncu runs with --clock-control none (the clocks as the benchmarks see them).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="" OUTDIR=$ROOT/gpu_profile_out
while [ $# -gt 0 ]; do
    case $1 in
        --bin) BIN=${2:?--bin needs a directory}; shift ;;
        --out) OUTDIR=${2:?--out needs a directory}; shift ;;
        -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_profile_attention: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -z "$BIN" ] && { [ -d "$ROOT/gpu_bundle/bin" ] && BIN=$ROOT/gpu_bundle || BIN=$ROOT/build-cuda; }
BG=""
for d in "$BIN/bin" "$BIN/bench" "$BIN"; do [ -x "$d/bench_gpu" ] && { BG=$d/bench_gpu; break; }; done
[ -n "$BG" ] || { echo "gpu_profile_attention: no bench_gpu under $BIN (build with -DCLLA_CUDA=ON or make a bundle)" >&2; exit 1; }
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH=$PATH:/usr/local/cuda/bin
for tool in ncu cuobjdump; do
    command -v $tool > /dev/null || { echo "gpu_profile_attention: skipped: $tool not found (the CUDA toolkit's profiler and disassembler)"; exit 77; }
done
nvidia-smi -L > /dev/null 2>&1 || { echo "gpu_profile_attention: skipped: no CUDA device (nvidia-smi -L failed)"; exit 77; }
mkdir -p "$OUTDIR" || exit 1
SASS=$(mktemp) || exit 1
trap 'rm -f "$SASS"' EXIT
cuobjdump --dump-sass "$BG" > "$SASS" || { echo "gpu_profile_attention: cuobjdump failed on $BG" >&2; exit 1; }
python3 "$ROOT/scripts/sass_op_counts.py" "$SASS" > "$OUTDIR/sass_stats.txt" || exit 1
STALLS=""
for r in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait not_selected selected \
         lg_throttle dispatch_stall no_instruction branch_resolving; do
    STALLS="$STALLS${STALLS:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
METRICS="$STALLS,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
METRICS="$METRICS,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum"
(cd "$ROOT" && ncu --clock-control none -k regex:attention_tc -c 3 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section InstructionStats --metrics "$METRICS" \
    "$BG" --only dense --set num_hidden_layers=1 --steps 1) > "$OUTDIR/ncu_attention.txt" 2>&1
rc=$?
[ $rc = 0 ] || { echo "gpu_profile_attention: ncu exited $rc (see $OUTDIR/ncu_attention.txt)" >&2; exit 1; }
grep -E '^  void attention_tc|hmma_cycles|Duration|Registers Per|Achieved Occ|Issued Instructions  ' "$OUTDIR/ncu_attention.txt"
echo "gpu_profile_attention: $OUTDIR/ncu_attention.txt, $OUTDIR/sass_stats.txt"
