#!/usr/bin/env bash
# The gradient sum over ranks overlapped with the backward (train.overlap_grad_reduce,
# docs/DISTRIBUTED.md) against the sum formed after it, on the same 2-rank runs alternated in one
# session: ms per step and the ms per step spent waiting in collectives (metrics.jsonl
# "comm_ms"), medians over the steps after the fifth (of 15), per run.
#   - shm: both ranks on this machine over shared memory (one OpenMP thread each);
#   - net: two "hosts" in network namespaces joined over TCP (launch/netns_two_hosts.sh), each
#     sending at most RATE (tc tbf), as a slower network would; needs root and iproute2.
# The model: a GQA d256 x 6 layers on bench/bench_dist.sh's data (4.7M parameters, 18.8 MB of
# gradients), the overlapped runs in buckets of 262144 elements (18 buckets).
#   bench/bench_overlap.sh [CLLA] [PAIRS] [RATE]     (defaults build/clla, 3, 1gbit)
# Environment: RANKS (default 2; the net runs then have one host a rank), ZERO (train.zero_stage,
# default 0), DUPLEX=1 (the net links cap what a host receives too, launch/netns_two_hosts.sh).
# With RANKS > 2 the runs share this machine's cores: the ms per step are comparable between the
# modes of one call only.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=bench_overlap
case ${1:-} in -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
source "$HERE/dist_runs.sh"
CLLA=$(readlink -f "${1:-$HERE/../build/clla}") || bench_fail "'${1:-}' does not exist"
PAIRS=${2:-3}
RATE=${3:-1gbit}
dist_check_clla "$CLLA"
whole_number PAIRS "$PAIRS" 1
whole_number RANKS "${RANKS:-2}" 2
case ${ZERO:-0} in 0 | 1) ;; *) bench_fail "ZERO '${ZERO}' is not 0 or 1 (train.zero_stage)" ;; esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_bench_overlap.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
dist_shards "$CLLA"
cat > bench.json <<JSON
{"attention": "gqa", "vocab_size": 528, "hidden_size": 256, "num_hidden_layers": 6,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 704, "max_position_embeddings": 128,
 "train": {"data": "shards/train", "seq_len": 128, "micro_batch": 2, "global_batch_tokens": 1024,
           "max_steps": 15, "warmup_steps": 2, "lr": 1e-3, "log_every": 1000, "threads": 0}}
JSON
RANKS=${RANKS:-2}
ZERO=${ZERO:-0}
ON=(--set train.overlap_grad_reduce=true --set train.grad_bucket_elements=262144 --set train.zero_stage="$ZERO")
OFF=(--set train.overlap_grad_reduce=false --set train.zero_stage="$ZERO")
net=1
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
    echo "net: skipped (needs root, ip and tc)"
    net=0
fi
echo "$RANKS ranks, ZeRO-$ZERO${DUPLEX:+, DUPLEX=$DUPLEX}"
printf '%-6s %-5s %-24s %10s %10s\n' "link" "pair" "gradient sum" "ms/step" "comm ms"
for p in $(seq "$PAIRS"); do
    for mode in on off; do
        if [ "$mode" = on ]; then args=("${ON[@]}"); label="during the backward"; else args=("${OFF[@]}"); label="after the backward"; fi
        run_logged "shm_${mode}_$p" mpirun --bind-to none --oversubscribe -np "$RANKS" "$CLLA" train --config bench.json --out "shm_${mode}_$p" --quiet "${args[@]}"
        # medians in assignments, which set -e ends the benchmark on (inside printf's arguments a
        # failed one printed 0.0)
        ms=$(median "shm_${mode}_$p" ms); comm=$(median "shm_${mode}_$p" comm_ms)
        printf '%-6s %-5s %-24s %10.1f %10.1f\n' shm "$p" "$label" "$ms" "$comm"
        if [ "$net" = 1 ]; then
            NETNS_HOSTS=$RANKS NETNS_RATE=$RATE NETNS_DUPLEX=${DUPLEX:-0} run_logged "net_${mode}_$p" bash "$HERE/../launch/netns_two_hosts.sh" "$CLLA" bench.json "net_${mode}_$p" --quiet "${args[@]}"
            ms=$(median "net_${mode}_$p" ms); comm=$(median "net_${mode}_$p" comm_ms)
            printf '%-6s %-5s %-24s %10.1f %10.1f\n' "$RATE" "$p" "$label" "$ms" "$comm"
        fi
    done
done
same=1
for f in shm_*/model.safetensors net_*/model.safetensors; do
    [ -e "$f" ] && { cmp -s "$f" shm_off_1/model.safetensors || same=0; }
done
[ -e shm_off_1/model.safetensors ] || bench_fail "no final model to compare (shm_off_1)"
[ "$same" = 1 ] && echo "final weights of every run: bit for bit equal" || echo "final weights differ between runs (unexpected)"
