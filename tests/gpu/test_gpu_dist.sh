#!/usr/bin/env bash
# Data-parallel training on 2 GPUs (docs/DISTRIBUTED.md, section NCCL): `mpirun -np 2` of
# `clla train --device cuda` against 1 rank on the same global batch (4 micro-batches of B rows:
# 1 rank x 4 micro-steps vs 2 ranks x 2), without and with ZeRO-1. In a build with NCCL the
# gradients are reduced by NCCL on the device buffers; without NCCL they are staged through
# host memory for the MPI collectives (the test runs either way and says which).
#
# Checks:
#  (a) loss curves: per step |loss_2 - loss_1| <= TOL_LOSS * loss_1, TOL_LOSS = 2e-3 (20 steps);
#  (b) the 2-rank run repeated gives the same metrics and weights bit for bit (NCCL's reduction
#      order is fixed for a given topology and rank count);
#  (c) with NCCL: NCCL_DEBUG=VERSION shows that NCCL, not MPI, carried the gradients;
#  (d) with NCCL: the sum overlapped with the backward in buckets, within the same tolerance.
# Why 2e-3 and not the CPU's 1e-6: on the GPU micro-steps accumulate inside backward and NCCL
# sums over ranks in its own order, so the fp32 gradients differ by rounding (~1e-7 relative)
# from the 1-rank run's; the bf16 weights use the same stochastic-rounding hash, so they differ
# only where a master moved across a rounding threshold, and those flips grow over the steps.
# 2e-3 is a first estimate, NOT measured on a GPU yet (the values printed show the margin).
#
# Skips (77) with the reason: mpirun missing, a binary without MPI, no nvidia-smi or fewer than
# 2 visible GPUs. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
TOL_LOSS=2e-3

if ! command -v mpirun > /dev/null; then echo "skipped: mpirun not found (apt-get install openmpi-bin)"; exit 77; fi
if ! ldd "$CLLA" 2> /dev/null | grep -q 'libmpi'; then echo "skipped: $CLLA was built without MPI"; exit 77; fi
if ! command -v nvidia-smi > /dev/null; then echo "skipped: no CUDA device (nvidia-smi not found)"; exit 77; fi
NGPU=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    NGPU=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
fi
if [ "$NGPU" -lt 2 ]; then echo "skipped: $NGPU visible CUDA device(s), this test needs 2"; exit 77; fi
NCCL=0
ldd "$CLLA" 2> /dev/null | grep -q 'libnccl' && NCCL=1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_test_gpu_dist.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
PASS=0
FAIL=0
ok()   { PASS=$((PASS + 1)); echo "ok   $1"; }
fail() { FAIL=$((FAIL + 1)); echo "FAIL $1"; }

export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {   # run NP OUT ARGS...: NP 1 without mpirun, as users do
    local np=$1 out=$2
    shift 2
    if [ "$np" = 1 ]; then "$CLLA" train --device cuda --out "$out" --quiet "$@" > "$out.err" 2>&1
    else NCCL_DEBUG=VERSION timeout 300 mpirun -np "$np" --bind-to none -x NCCL_DEBUG \
        "$CLLA" train --device cuda --out "$out" --quiet "$@" > "$out.err" 2>&1; fi
}

if ! "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out small.tok "$SRC/tests/fixtures/english.jsonl" > tok.log 2>&1 ||
   ! "$CLLA" prep --tokenizer small.tok --out shards --chunk-tokens 512 --val-fraction 0 \
       "$SRC/tests/fixtures/english.jsonl" > prep.log 2>&1; then
    echo "FAIL making shards: $(tail -n 1 tok.log prep.log | tr '\n' ' ')"
    echo "0 passed, 1 failed"
    exit 1
fi
cat > dense.json <<'JSON'
{"attention": "gqa", "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64,
 "train": {"max_steps": 20, "data": "shards/train", "seq_len": 32, "micro_batch": 2, "global_batch_tokens": 256,
           "warmup_steps": 2, "lr": 3e-3, "min_lr": 3e-4, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 11,
           "log_every": 1000, "threads": 1}}
JSON

losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
# largest per-step relative loss difference (1e9 when the step counts differ)
loss_rel() {
    paste -d' ' <(losses "$1") <(losses "$2") |
        awk 'BEGIN { m = 0; n = 0 } NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > m) m = r }
             NF != 2 { m = 1e9 } END { if (n == 0) m = 1e9; printf "%.3g", m }'
}
records() { sed -E 's/,"(ms|tokens_per_s|comm_ms)":[^,}]*//g' "$1/metrics.jsonl"; }

if ! run 1 r1 --config dense.json; then
    echo "FAIL 1 rank: $(tail -n 2 r1.err | tr '\n' ' ')"
    echo "0 passed, 1 failed"
    exit 1
fi
for zero in 0 1; do
    if ! run 2 "r2_z$zero" --config dense.json --zero "$zero"; then
        fail "2 ranks, ZeRO-$zero: $(tail -n 3 "r2_z$zero.err" | tr '\n' ' ')"
        continue
    fi
    rel=$(loss_rel r1 "r2_z$zero")
    if awk -v r="$rel" -v t="$TOL_LOSS" 'BEGIN { exit !(r <= t) }'; then
        ok "2 ranks x 2 micro-steps, ZeRO-$zero vs 1 rank x 4: loss rel diff $rel (tolerance $TOL_LOSS, $(wc -l < "r2_z$zero/metrics.jsonl") steps)"
    else
        fail "2 ranks, ZeRO-$zero vs 1 rank: loss rel diff $rel > $TOL_LOSS"
        paste -d' ' <(losses r1) <(losses "r2_z$zero") | head -n 20
    fi
    if [ "$NCCL" = 1 ]; then
        grep -q 'NCCL version' "r2_z$zero.err" && ok "ZeRO-$zero: NCCL carried the collectives" ||
            fail "ZeRO-$zero: a build with NCCL, but NCCL_DEBUG=VERSION printed nothing (staged through MPI?)"
    fi
done
# (d) with NCCL: the sum overlapped with the backward (train.overlap_grad_reduce), each bucket of
# 4096 elements a collective started on a side stream after the layer's kernels (ZeRO-1: a
# reduce-scatter of a round of stripes, the AdamW state and the fp32 masters sharded in the same
# stripes, model/shard.h): the same tolerance against 1 rank (NCCL sums per bucket, to rounding
# the whole buffer's sums)
if [ "$NCCL" = 1 ]; then
    for zero in 0 1; do
        if run 2 "r2_z${zero}_overlap" --config dense.json --zero "$zero" --set train.overlap_grad_reduce=true \
            --set train.grad_bucket_elements=4096; then
            rel=$(loss_rel r1 "r2_z${zero}_overlap")
            awk -v r="$rel" -v t="$TOL_LOSS" 'BEGIN { exit !(r <= t) }' &&
                { [ "$zero" = 0 ] || grep -q 'fp32 masters sharded in stripes of every bucket' "r2_z${zero}_overlap.err"; } &&
                ok "2 ranks, ZeRO-$zero, summed during the backward in 4096-element buckets vs 1 rank: loss rel diff $rel (tolerance $TOL_LOSS)" ||
                fail "2 ranks, ZeRO-$zero, summed during the backward vs 1 rank: loss rel diff $rel (tolerance $TOL_LOSS), or ZeRO-1 without stripes: $(head -n 1 "r2_z${zero}_overlap.err")"
        else
            fail "2 ranks, ZeRO-$zero, summed during the backward: $(tail -n 3 "r2_z${zero}_overlap.err" | tr '\n' ' ')"
        fi
    done
fi
if run 2 r2_again --config dense.json --zero 0 &&
   cmp -s <(records r2_z0) <(records r2_again) && cmp -s r2_z0/model.safetensors r2_again/model.safetensors; then
    ok "2 ranks run twice: metrics and weights bit for bit equal"
else
    fail "2 ranks run twice differ (or the rerun failed: $(tail -n 1 r2_again.err))"
fi
echo "path: $([ "$NCCL" = 1 ] && echo NCCL on device buffers || echo MPI through host memory)"
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
