#!/usr/bin/env bash
# The NCCL path of data-parallel training without GPUs (README.md): NCCL emulated over MPI on
# host memory, driving the trainer's device-collective code (train/grad_sync.c with
# dist_*_dev_f32, kernels/nccl_comm.c) under --device cpu-bf16, which keeps bf16 weights and
# separate fp32 masters as the CUDA backend does.
#  (a) kernels/nccl_comm.c against its contract with 3 ranks (test_nccl_comm);
#  (b) 2 and 4 ranks through the emulated NCCL, ZeRO-0 (all-reduce) and ZeRO-1 (reduce-scatter,
#      sharded masters, all-gather), against the MPI path of the same backend: loss within a
#      relative 1e-3 per step (the NCCL path sums ranks and forms the ZeRO-1 norm in another
#      order, then bf16 rounding); every run says NCCL carried its collectives;
#  (b2) the same with the sum overlapped with the backward in 1000-element buckets, each a started
#      NCCL collective (all-reduce, or under ZeRO-1 a reduce-scatter of a round of stripes, one
#      per rank, in place; the masters then sharded and all-gathered in the same stripes);
#  (c) a rerun repeats bit for bit; saved with 2 ranks at step 4 and resumed with 2 it ends
#      bit for bit where the uninterrupted run does, and resumed with 4 within 1e-3; the same
#      for a run in stripes, resumed in stripes with 2 ranks and as contiguous pieces with 4.
# Prints "N passed, M failed"; skips (77) without mpirun or MPI.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${CLLA_NCCL_EMU:?set CLLA_NCCL_EMU to the clla_nccl_emu binary (ctest does this)}"
: "${TEST_NCCL_COMM:?set TEST_NCCL_COMM to the test_nccl_comm binary (ctest does this)}"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$SRC/tests/lib/dist.sh"

# ---------------------------------------------------------------- (a) nccl_comm.c
if timeout 60 "${MPIRUN[@]}" -np 3 "$TEST_NCCL_COMM" > comm.log 2>&1; then
    ok "nccl_comm.c with 3 ranks: $(tail -n 1 comm.log)"
else
    grep FAIL comm.log | head -n 5
    fail "nccl_comm.c with 3 ranks: $(tail -n 1 comm.log)"
fi

# ---------------------------------------------------------------- (b) the trainer over "NCCL"
BF16=(--config moe.json --device cpu-bf16)
carried() {   # carried NAME NP KIND: every rank's emulated communicator ran collectives of KIND
    local n
    n=$(grep -c "nccl-emu: rank [0-9]* of $2: .*[1-9][0-9]* $3" "$1.err")
    [ "$n" = "$2" ]
}
run 2 mpi_2 "${BF16[@]}" --zero 1 || fail "MPI path, 2 ranks: $(tail -n 1 mpi_2.err)"
for np in 2 4; do
    for zero in 0 1; do
        name=emu_${np}_z$zero
        run_with "$CLLA_NCCL_EMU" "$np" "$name" "${BF16[@]}" --zero "$zero"
        kind=all-reduce
        [ "$zero" = 1 ] && kind=reduce-scatter
        if close mpi_2 "$name" 1e-3 && carried "$name" "$np" "$kind"; then
            ok "$np ranks, ZeRO-$zero over the emulated NCCL ($kind on every rank): loss rel diff $LR to the MPI path (limit 1e-3)"
        else
            fail "$np ranks, ZeRO-$zero over the emulated NCCL: loss rel diff $LR; $(grep -m1 -E 'nccl-emu|error' "$name.err")"
        fi
    done
done
# train.overlap_grad_reduce over NCCL: every bucket of 1000 elements one started collective on
# the side stream (kernels/nccl_comm.c), an all-reduce (ZeRO-0) or a reduce-scatter of a round of
# stripes (ZeRO-1: a round of 2 x 4096 or 4 x 4096 elements, the norm's block a stripe); the same
# sums to rounding (NCCL's per bucket), so within the same limit
OVERLAP=(--set train.overlap_grad_reduce=true --set train.grad_bucket_elements=1000)
more_than() {   # more_than NAME NP KIND COUNT: every rank's communicator ran more than COUNT of KIND
    local n
    n=$(grep -o "[0-9]* $3" "$1.err" | awk -v c="$4" '{ if ($1 > c) n++ } END { print n + 0 }')
    [ "$n" = "$2" ]
}
for np in 2 4; do
    for zero in 0 1; do
        name=emu_${np}_z${zero}_overlap
        run_with "$CLLA_NCCL_EMU" "$np" "$name" "${BF16[@]}" --zero "$zero" "${OVERLAP[@]}"
        kind=all-reduce
        [ "$zero" = 1 ] && kind=reduce-scatter
        # several buckets a step: more collectives of that kind than 3 for each of the 8 steps
        # (ZeRO-1: also the masters' all-gathers, one per round)
        if close mpi_2 "$name" 1e-3 && more_than "$name" "$np" "$kind" 24 && { [ "$zero" = 0 ] || more_than "$name" "$np" all-gather 24; }; then
            ok "$np ranks, ZeRO-$zero over the emulated NCCL, summed during the backward in buckets ($kind per bucket): loss rel diff $LR to the MPI path (limit 1e-3)"
        else
            fail "$np ranks, ZeRO-$zero, overlapped over the emulated NCCL: loss rel diff $LR; $(grep -m2 -E 'nccl-emu|error' "$name.err" | tr '\n' ' ')"
        fi
    done
done
grep -q 'ZeRO-1: AdamW state and fp32 masters sharded in stripes of every bucket' emu_2_z1_overlap.err &&
    ok "the overlapped ZeRO-1 runs shard the fp32 masters in stripes" ||
    fail "overlapped ZeRO-1 over NCCL: no stripes in the banner: $(head -n 1 emu_2_z1_overlap.err)"
grep -q 'ZeRO-1: AdamW state and fp32 masters sharded' emu_2_z1.err && ok "the ZeRO-1 runs shard the fp32 masters" ||
    fail "ZeRO-1 over NCCL: no sharded masters in the banner: $(head -n 1 emu_2_z1.err)"

# ---------------------------------------------------------------- (c) repeat, save and resume
run_with "$CLLA_NCCL_EMU" 2 emu_again "${BF16[@]}" --zero 1
same_bits emu_2_z1 emu_again && ok "2 ranks ZeRO-1 over NCCL, run twice: bit for bit" || fail "2 ranks ZeRO-1 over NCCL is not repeatable"
run_with "$CLLA_NCCL_EMU" 2 part "${BF16[@]}" --zero 1 --stop-at 4
for np in 2 4; do
    rm -rf "part_$np" && cp -r part "part_$np"
    timeout 120 "${MPIRUN[@]}" -np "$np" "$CLLA_NCCL_EMU" train --out "part_$np" --quiet "${BF16[@]}" --zero 1 \
        --resume auto > "part_$np.err" 2>&1
done
same_bits emu_2_z1 part_2 && ok "saved with 2 ranks over NCCL at step 4, resumed with 2: steps 5-8 and final weights bit for bit" ||
    fail "resume with 2 ranks over NCCL: loss rel diff $(loss_rel emu_2_z1 part_2); $(tail -n 1 part_2.err)"
close emu_2_z1 part_4 1e-3 && ok "saved with 2 ranks over NCCL, resumed with 4 (re-sharded): loss rel diff $LR (limit 1e-3)" ||
    fail "resume with 4 ranks over NCCL: loss rel diff $LR; $(tail -n 1 part_4.err)"
# rank 0's optimizer shard copied over rank 1's, with state.json's sizes and checksums made to
# match (so only the shards' own metadata and coverage can tell): refused, not resumed with
# rank 1's moments missing
ck=$(ls -d part/checkpoints/step_* | tail -n 1)
rm -rf forged && cp -r part forged && fck=forged/checkpoints/$(basename "$ck")
cp "$fck/optimizer.rank0.safetensors" "$fck/optimizer.rank1.safetensors"
python3 - "$fck" << 'PY'
import json, sys
d = sys.argv[1]
def fnv(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h
s = json.load(open(d + "/state.json"))
for f in s["files"]:
    b = open(d + "/" + f, "rb").read()
    s["files"][f] = {"bytes": len(b), "fnv1a64": fnv(b)}
open(d + "/state.json", "w").write(json.dumps(s))
PY
timeout 120 "${MPIRUN[@]}" -np 2 "$CLLA_NCCL_EMU" train --out forged --quiet "${BF16[@]}" --zero 1 --resume auto > forged.err 2>&1
rc=$?
[ "$rc" -ne 0 ] && grep -q "damaged or mixed-up optimizer files" forged.err &&
    ok "a ZeRO-1 checkpoint whose rank 1 shard is rank 0's (checksums made to match) is refused: $(grep -m1 'error' forged.err | cut -c1-120)" ||
    fail "forged ZeRO-1 shards: exit $rc; $(grep -m1 -E 'error|fnv' forged.err)"
# in stripes: resumed in the same stripes with 2 ranks, and with 4 ranks as contiguous pieces
run_with "$CLLA_NCCL_EMU" 2 spart "${BF16[@]}" --zero 1 "${OVERLAP[@]}" --stop-at 4
for np in 2 4; do
    rm -rf "spart_$np" && cp -r spart "spart_$np"
    extra=("${OVERLAP[@]}")
    [ "$np" = 4 ] && extra=()
    timeout 120 "${MPIRUN[@]}" -np "$np" "$CLLA_NCCL_EMU" train --out "spart_$np" --quiet "${BF16[@]}" --zero 1 \
        "${extra[@]}" --resume auto > "spart_$np.err" 2>&1
done
same_bits emu_2_z1_overlap spart_2 && ok "saved in stripes with 2 ranks over NCCL at step 4, resumed in stripes: steps 5-8 and final weights bit for bit" ||
    fail "resume in stripes with 2 ranks over NCCL: loss rel diff $(loss_rel emu_2_z1_overlap spart_2); $(tail -n 1 spart_2.err)"
close emu_2_z1_overlap spart_4 1e-3 && ok "saved in stripes with 2 ranks over NCCL, resumed with 4 in contiguous pieces: loss rel diff $LR (limit 1e-3)" ||
    fail "resume of stripes with 4 ranks over NCCL: loss rel diff $LR; $(tail -n 1 spart_4.err)"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
