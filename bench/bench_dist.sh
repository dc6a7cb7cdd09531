#!/usr/bin/env bash
# Data-parallel throughput on this machine: tokens/s of clla train with 1 rank and with 2
# ranks (one OpenMP thread per rank, so 2 ranks use twice the cores), scaling efficiency
# = tok/s(2 ranks) / (2 * tok/s(1 rank)), and the time per step spent in collectives
# (metrics.jsonl "comm_ms": the reduce-scatter/all-gather and the step statistics, including
# the wait for the slower rank). Also 1 rank x 2 threads: what the same cores give without MPI.
#   bench/bench_dist.sh [CLLA] [STEPS]      (CLLA defaults to build/clla, built with MPI; STEPS 30, at least 6)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=bench_dist
case ${1:-} in -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
source "$HERE/dist_runs.sh"
CLLA=$(readlink -f "${1:-$HERE/../build/clla}") || bench_fail "'${1:-}' does not exist"
STEPS=${2:-30}
dist_check_clla "$CLLA"
whole_number STEPS "$STEPS" 6   # the first five steps are warm-up, not measured
WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_bench_dist.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
dist_shards "$CLLA"
# ~1.6M parameters; a global batch of 4 sequences of 128 tokens (2 micro-steps per rank on 1 rank)
cat > bench.json <<JSON
{"attention": "gqa", "vocab_size": 528, "hidden_size": 128, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 384, "max_position_embeddings": 128,
 "train": {"data": "shards/train", "seq_len": 128, "micro_batch": 2, "global_batch_tokens": 1024,
           "max_steps": $STEPS, "warmup_steps": 2, "lr": 1e-3, "log_every": 1000, "threads": 0}}
JSON
OMP_NUM_THREADS=1 run_logged r1 "$CLLA" train --config bench.json --out r1 --quiet
OMP_NUM_THREADS=2 run_logged r1t2 "$CLLA" train --config bench.json --out r1t2 --quiet
OMP_NUM_THREADS=1 run_logged r2 mpirun --bind-to none -np 2 "$CLLA" train --config bench.json --out r2 --quiet
OMP_NUM_THREADS=1 run_logged r2z mpirun --bind-to none -np 2 "$CLLA" train --config bench.json --out r2z --quiet --zero 1
t1=$(median r1 tokens_per_s); t1t2=$(median r1t2 tokens_per_s); t2=$(median r2 tokens_per_s); t2z=$(median r2z tokens_per_s)
# every median taken in an assignment, which set -e ends the benchmark on: one inside printf's
# arguments failed alone and printed 0.0 as the figure
m1=$(median r1 ms); m1t2=$(median r1t2 ms); m2=$(median r2 ms); c2=$(median r2 comm_ms); m2z=$(median r2z ms); c2z=$(median r2z comm_ms)
printf '%-28s %12s %10s %10s\n' "run" "tokens/s" "ms/step" "comm ms"
printf '%-28s %12.0f %10.1f %10s\n' "1 rank x 1 thread" "$t1" "$m1" "-"
printf '%-28s %12.0f %10.1f %10s\n' "1 rank x 2 threads" "$t1t2" "$m1t2" "-"
printf '%-28s %12.0f %10.1f %10.2f\n' "2 ranks x 1 thread" "$t2" "$m2" "$c2"
printf '%-28s %12.0f %10.1f %10.2f\n' "2 ranks x 1 thread, ZeRO-1" "$t2z" "$m2z" "$c2z"
awk -v a="$t1" -v b="$t2" -v c="$t2z" -v d="$t1t2" 'BEGIN {
    printf "scaling efficiency 2 ranks / (2 x 1 rank): %.1f%% (ZeRO-1: %.1f%%); 2 ranks vs 1 rank x 2 threads: %.2fx\n",
           100 * b / (2 * a), 100 * c / (2 * a), b / d }'
cmp -s r1/model.safetensors r2/model.safetensors && cmp -s r1/model.safetensors r2z/model.safetensors &&
    echo "final weights of the 1-rank and both 2-rank runs: bit for bit equal" ||
    echo "final weights differ between the 1-rank and 2-rank runs (unexpected on the CPU backend)"
