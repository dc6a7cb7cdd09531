#!/usr/bin/env bash
# Data-parallel training over MPI (docs/DISTRIBUTED.md), through the binary and mpirun:
#  (a) 1, 2 and 4 ranks on the same global batch (4 micro-batches of B rows: 1 rank x 4
#      micro-steps, 2 x 2, 4 x 1) give the same loss curve (relative difference <= 1e-6 per
#      step; in fact bit for bit) and the same final weights, with and without ZeRO-1, dense
#      GQA and CLLA-quant + MoE (each micro-batch routes the same B rows whatever the split,
#      so the per-micro-batch aux loss and capacity are compared like with like);
#  (b) save with 2 ranks (ZeRO-1 shards), resume with 1 and with 4: the run continues with
#      the same data order and ends where the uninterrupted run does;
#  (c) one rank killed with SIGKILL mid-run: the job exits non-zero within 60 s naming the
#      rank, and the last checkpoint loads; a stopped (hung) rank: the watchdog ends the job;
#  (d) refusals: a plain token file with 2 ranks, a global batch that does not divide;
#  (e) two "hosts" as network namespaces joined over TCP with a hostfile
#      (launch/netns_two_hosts.sh), when run as root with `ip netns` available;
#  (f) the launch scripts' environment: run_multi_node.sh passes NCCL_* to other nodes,
#      slurm.sbatch finds launch/ when SLURM runs a spooled copy of it.
# Skips (77) when the binary has no MPI or mpirun is missing. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}

source "$SRC/tests/lib/dist.sh"

# ---------------------------------------------------------------- (a) same global batch
for model in dense moe; do
    run 1 "${model}_1" --config "$model.json" || { fail "$model: 1 rank failed: $(tail -n 1 "${model}_1.err")"; continue; }
    for np in 2 4; do
        for zero in 0 1; do
            run "$np" "${model}_${np}_z$zero" --config "$model.json" --zero "$zero"
            same_curve "$model: $np ranks x $((4 / np)) micro-steps, ZeRO-$zero vs 1 rank x 4" "${model}_1" "${model}_${np}_z$zero"
        done
    done
done
grep -q '"aux_loss"' moe_4_z1/metrics.jsonl 2> /dev/null && ok "moe: 4-rank run logs the global aux loss" ||
    fail "moe: no aux_loss in the 4-rank metrics"
grep -q '"comm_ms"' dense_2_z0/metrics.jsonl 2> /dev/null && ok "metrics of a 2-rank run carry comm_ms" ||
    fail "no comm_ms in the 2-rank metrics"

# ---------------------------------------------------------------- (a1) overlapped gradient sum
# train.overlap_grad_reduce: the sum over ranks starts during the last micro-step's backward, in
# buckets sent as the layers finish. Buckets of 1000 elements, so a step sends dozens of them
# (these models fit one default bucket), many cut by the ranks' pieces, against the sum formed
# after the backward (the default, as in (a)) and 1 rank: the same bits.
for model in dense moe; do
    for np in 2 4; do
        for zero in 0 1; do
            run "$np" "${model}_${np}_z${zero}_b1000" --config "$model.json" --zero "$zero" --set train.overlap_grad_reduce=true \
                --set train.grad_bucket_elements=1000
            if same_bits "${model}_${np}_z${zero}_b1000" "${model}_${np}_z${zero}" && same_bits "${model}_1" "${model}_${np}_z${zero}_b1000"; then
                ok "$model, $np ranks, ZeRO-$zero: the sum overlapped in 1000-element buckets = after the backward = 1 rank, bit for bit"
            else
                fail "$model, $np ranks, ZeRO-$zero: overlapped in buckets vs after the backward vs 1 rank differ: $(tail -n 2 "${model}_${np}_z${zero}_b1000.err" | tr '\n' ' ')"
            fi
        done
    done
done
# The largest bucket allowed (2^31 - 1 elements): under ZeRO-1 the stripe is capped at the
# contiguous piece (one round covers the model) instead of taking world x 4 GiB of receive memory.
run 2 bigbucket --config dense.json --zero 1 --set train.overlap_grad_reduce=true --set train.grad_bucket_elements=2147483647
same_bits dense_1 bigbucket && ok "2 ranks, ZeRO-1, buckets of 2^31 - 1 elements: runs, bit for bit as 1 rank" ||
    fail "ZeRO-1 with the largest bucket: $(tail -n 2 bigbucket.err | tr '\n' ' ')"

# ZeRO-1 in stripes gathers the updated weights during the next forward (train/grad_sync.c):
# validation (rank 0) and checkpoints between steps must first complete it on every rank.
"$CLLA" prep --tokenizer small.tok --out vshards --chunk-tokens 512 --val-fraction 0.1 "$SRC/tests/fixtures/english.jsonl" > vprep.log 2>&1 ||
    fail "validation shards: $(tail -n 1 vprep.log)"
for ov in true false; do
    run 2 "val_$ov" --config dense.json --zero 1 --set train.data=vshards/train --set train.val_data=vshards/val \
        --set train.val_every=2 --set train.save_every=3 --set train.overlap_grad_reduce=$ov --set train.grad_bucket_elements=1000
done
vl() { grep -o '"val_loss":[^,}]*' "$1/metrics.jsonl" | tr '\n' ' '; }
[ -n "$(vl val_true)" ] && [ "$(vl val_true)" = "$(vl val_false)" ] && same_bits val_false val_true &&
    [ -d val_true/checkpoints/step_00000006 ] &&
    ok "2 ranks, ZeRO-1 in stripes, the weights gathered during the next forward: validation every 2 steps and checkpoints every 3 as after the backward, bit for bit" ||
    fail "ZeRO-1 gather during the forward with validation: val losses '$(vl val_true)' vs '$(vl val_false)' $(tail -n 2 val_true.err | tr '\n' ' ')"

# The start-up line says whether the sum is overlapped: on the fp32 CPU path when asked for, not
# by default on one host ("auto": only where the ranks span hosts; the two-host case below).
for v in "on --overlap-grad-reduce true" "off "; do
    set -- $v
    timeout 120 "${MPIRUN[@]}" -np 2 "$CLLA" train --out "banner_$1" --config dense.json --set train.max_steps=1 "${@:2}" > "banner_$1.err" 2>&1
done
grep -q 'gradients summed during the backward' banner_on.err && ! grep -q 'gradients summed during the backward' banner_off.err &&
    ok "the start-up line says the gradient sum overlaps the backward with train.overlap_grad_reduce, not without" ||
    fail "overlap banner: $(grep -h 'clla train:' banner_on.err banner_off.err | tr '\n' ' ')"
# ZeRO-1 overlapped in stripes (buckets of 1000 elements: stripes of 4096) says so, and that the
# weights arrive during the forward
timeout 120 "${MPIRUN[@]}" -np 2 "$CLLA" train --out banner_z1 --config dense.json --set train.max_steps=1 --zero 1 \
    --overlap-grad-reduce true --set train.grad_bucket_elements=1000 > banner_z1.err 2>&1
grep -q 'ZeRO-1: AdamW state sharded in stripes of every bucket) (gradients summed during the backward, weights gathered during the forward)' banner_z1.err &&
    ok "ZeRO-1 overlapped: the start-up line says the shards are stripes and the weights arrive during the forward" ||
    fail "ZeRO-1 overlap banner: $(grep -h 'clla train:' banner_z1.err)"
"$CLLA" train --config dense.json --out bad_ogr --overlap-grad-reduce sometimes > bad_ogr.out 2>&1
[ $? -ne 0 ] && [ "$(grep -c . bad_ogr.out)" = 1 ] && grep -q "overlap-grad-reduce 'sometimes': use true, false or auto" bad_ogr.out &&
    [ ! -e bad_ogr ] && ok "--overlap-grad-reduce sometimes: one line, non-zero exit, nothing written" ||
    fail "--overlap-grad-reduce sometimes: $(head -c 300 bad_ogr.out)"
# The bucketed reduce-scatter alone against the plain one (tests/dist_buckets_check.c).
BUCKETS_CHECK=${BUILD:-}/tests/dist_buckets_check
if [ -x "$BUCKETS_CHECK" ]; then
    for np in 2 3 4; do
        if out=$(timeout 120 "${MPIRUN[@]}" -np "$np" "$BUCKETS_CHECK" 2>&1); then
            ok "$(echo "$out" | tail -n 1)"
        else
            fail "dist_buckets_check, $np ranks: $(echo "$out" | grep -m 3 FAIL | tr '\n' ' ')"
        fi
    done
else
    fail "tests/dist_buckets_check was not built in BUILD=${BUILD:-(unset)}"
fi

# ---------------------------------------------------------------- (a2) sharded fp32 masters
# The bf16 emulation keeps fp32 masters apart from the storage, as the CUDA backend does, so
# ZeRO-1 shards them (each rank updates its piece, the pieces are all-gathered through the
# spent gradient buffer, the bf16 weights rounded from the whole). It also takes the device
# path of the trainer (gradients accumulated in backward, host staging around MPI), so runs
# with other rank counts differ by rounding: ZeRO-0 against ZeRO-1 on the same ranks is the
# bit-for-bit comparison; the 1-rank run is the reference within a stated tolerance.
BF16=(--config moe.json --device cpu-bf16)
run 1 bf_1 "${BF16[@]}" || fail "cpu-bf16: 1 rank failed: $(tail -n 1 bf_1.err)"
for np in 2 4; do
    run "$np" "bf_${np}_z0" "${BF16[@]}" --zero 0
    run "$np" "bf_${np}_z1" "${BF16[@]}" --zero 1
    if same_bits "bf_${np}_z0" "bf_${np}_z1"; then
        ok "cpu-bf16, $np ranks: sharded masters (ZeRO-1) = replicated (ZeRO-0), every step and the final weights bit for bit"
    else
        fail "cpu-bf16, $np ranks: ZeRO-1 differs from ZeRO-0 (loss rel $(loss_rel "bf_${np}_z0" "bf_${np}_z1")): $(tail -n 2 "bf_${np}_z1.err" | tr '\n' ' ')"
    fi
    close bf_1 "bf_${np}_z1" 1e-3 && ok "cpu-bf16, $np ranks ZeRO-1 vs 1 rank: loss rel diff $LR (bf16 rounding of another summation order; limit 1e-3)" ||
        fail "cpu-bf16, $np ranks ZeRO-1 vs 1 rank: loss rel diff $LR (limit 1e-3)"
done
# A model smaller than one ZeRO piece (4096 elements): rank 0 holds every master, rank 1 none.
# The ranks must still enter the same collectives when saving (a checkpoint every 2 steps).
cat > tiny.json <<EOF
{"attention": "gqa", "vocab_size": 320, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "intermediate_size": 16, "tie_word_embeddings": true, "max_position_embeddings": 64,
 "train": {"max_steps": 4, "save_every": 2, $TRAIN}}
EOF
for zero in 0 1; do run 2 "tiny_z$zero" --config tiny.json --device cpu-bf16 --zero "$zero"; done
same_bits tiny_z0 tiny_z1 && [ -d tiny_z1/checkpoints/step_00000004 ] &&
    ok "cpu-bf16, a model within one ZeRO piece (rank 1 holds no masters): saves and ends bit for bit as ZeRO-0" ||
    fail "cpu-bf16, a model within one ZeRO piece: $(tail -n 2 tiny_z1.err | tr '\n' ' ')"
timeout 120 "${MPIRUN[@]}" -np 2 "$CLLA" train --out bf_banner "${BF16[@]}" --zero 1 --set train.max_steps=1 > bf_banner.err 2>&1
grep -q 'ZeRO-1: AdamW state and fp32 masters sharded' bf_banner.err && ok "cpu-bf16 ZeRO-1 run says its masters are sharded" ||
    fail "cpu-bf16 ZeRO-1 banner: $(head -n 2 bf_banner.err | tr '\n' ' ')"
# Save with 2 ranks (masters and moments sharded), resume with 2 ranks without ZeRO and with 4
# with it: the checkpoint holds the whole masters, so each continues the 2-rank run.
run 2 bfp "${BF16[@]}" --zero 1 --stop-at 4
for v in "2 0" "4 1"; do
    set -- $v
    rm -rf "bfp_$1_$2" && cp -r bfp "bfp_$1_$2"
    timeout 120 "${MPIRUN[@]}" -np "$1" "$CLLA" train --out "bfp_$1_$2" --quiet "${BF16[@]}" --zero "$2" --resume auto > "bfp_$1_$2.err" 2>&1
done
same_bits bf_2_z1 bfp_2_0 &&
    ok "cpu-bf16: saved with 2 ranks and sharded masters at step 4, resumed with 2 unsharded: steps 5-8 and final weights bit for bit" ||
    fail "cpu-bf16: resume of sharded masters with 2 ranks, ZeRO-0: loss rel $(loss_rel bf_2_z1 bfp_2_0) $(tail -n 2 bfp_2_0.err | tr '\n' ' ')"
close bf_2_z1 bfp_4_1 1e-3 &&
    ok "cpu-bf16: saved with 2 ranks (sharded masters), resumed with 4 (re-sharded): loss rel diff $LR to the 2-rank run (limit 1e-3)" ||
    fail "cpu-bf16: resume with 4 ranks: loss rel diff $LR $(tail -n 2 bfp_4_1.err | tr '\n' ' ')"

# ---------------------------------------------------------------- (b) save with 2, resume with 1 and 4
run 2 part --config moe.json --zero 1 --stop-at 4
ck=part/checkpoints/step_00000004
if [ -f "$ck/optimizer.rank0.safetensors" ] && [ -f "$ck/optimizer.rank1.safetensors" ] &&
   grep -q '"zero_stage":[[:space:]]*1' "$ck/state.json"; then
    ok "2-rank ZeRO-1 checkpoint holds one optimizer shard per rank"
else
    fail "2-rank ZeRO-1 checkpoint: $(ls "$ck" 2> /dev/null | tr '\n' ' ') $(tail -n 2 part.err | tr '\n' ' ')"
fi
for np in 1 4; do
    rm -rf "part_$np"
    cp -r part "part_$np"
    if [ "$np" = 1 ]; then "$CLLA" train --config moe.json --out "part_$np" --quiet --resume auto 2> "part_$np.err"
    else timeout 120 "${MPIRUN[@]}" -np "$np" "$CLLA" train --config moe.json --out "part_$np" --quiet --zero 1 --resume auto > "part_$np.err" 2>&1; fi
    if same_bits moe_1 "part_$np"; then
        ok "saved with 2 ranks at step 4, resumed with $np: same data order, steps 5-8 and final weights bit for bit"
    else
        same_curve "saved with 2 ranks, resumed with $np" moe_1 "part_$np"
    fi
done
# Striped shards (the overlapped ZeRO-1 sum, model/shard.h): saved with 2 ranks in stripes of 4096
# elements, resumed with 4 in stripes of 8192, with 4 in contiguous pieces and with 1 rank.
run 2 stripe --config moe.json --zero 1 --stop-at 4 --set train.overlap_grad_reduce=true --set train.grad_bucket_elements=8192
ck=stripe/checkpoints/step_00000004
grep -aq '"stripe":"4096","period":"8192"' "$ck/optimizer.rank1.safetensors" && ok "2-rank overlapped ZeRO-1 checkpoint: its shards are stripes" ||
    fail "striped checkpoint: $(head -c 300 "$ck/optimizer.rank1.safetensors" | tr -cd '[:print:]') $(tail -n 2 stripe.err | tr '\n' ' ')"
for v in "4 true 20000" "4 false 0" "1 false 0"; do
    set -- $v
    rm -rf "stripe_$1_$2" && cp -r stripe "stripe_$1_$2"
    if [ "$1" = 1 ]; then "$CLLA" train --config moe.json --out "stripe_$1_$2" --quiet --resume auto 2> "stripe_$1_$2.err"
    else timeout 120 "${MPIRUN[@]}" -np "$1" "$CLLA" train --config moe.json --out "stripe_$1_$2" --quiet --zero 1 --resume auto \
        --set train.overlap_grad_reduce="$2" --set train.grad_bucket_elements="${3/#0/1048576}" > "stripe_$1_$2.err" 2>&1; fi
    same_bits moe_1 "stripe_$1_$2" &&
        ok "saved in 2 ranks' stripes at step 4, resumed with $1 (overlap $2): steps 5-8 and final weights bit for bit" ||
        fail "saved in stripes, resumed with $1 (overlap $2): loss rel $(loss_rel moe_1 "stripe_$1_$2") $(tail -n 2 "stripe_$1_$2.err" | tr '\n' ' ')"
done

# A shard written before gate_proj and up_proj were joined into one matrix has no "layout" key
# (train/checkpoint.c): it is this model's layout where no joined tensor moved (moe.json: every
# gate_proj ends on a 256-byte boundary), and is refused where one did (intermediate_size 33:
# 33 x 32 floats do not). The key is blanked in place (the header keeps its length) and the
# file's FNV-1a 64 in state.json follows, as an older clla would have written them.
strip_layout() {
    python3 - "$1" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
state = json.load(open(os.path.join(d, "state.json")))
for f in sorted(glob.glob(os.path.join(d, "optimizer.rank*.safetensors"))):
    b = open(f, "rb").read()
    key = b'"layout":"joined",'
    assert key in b, f
    b = b.replace(key, b" " * len(key), 1)
    open(f, "wb").write(b)
    h = 0xcbf29ce484222325
    for c in b:
        h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
    state["files"][os.path.basename(f)]["fnv1a64"] = "%016x" % h
json.dump(state, open(os.path.join(d, "state.json"), "w"), indent=1)
PY
}
rm -rf part_old && cp -r part part_old && strip_layout part_old/checkpoints/step_00000004
if grep -q '"layout"' part_old/checkpoints/step_00000004/optimizer.rank0.safetensors; then fail "strip_layout left the key"
elif "$CLLA" train --config moe.json --out part_old --quiet --resume auto 2> part_old.err && same_bits moe_1 part_old; then
    ok "a ZeRO-1 shard without the layout key, of a model whose joined tensors did not move: resumed, bit for bit"
else fail "old-layout shard of moe.json: $(tail -n 1 part_old.err)"; fi
run 2 oddlayout --config dense.json --set intermediate_size=33 --zero 1 --stop-at 2
strip_layout oddlayout/checkpoints/step_00000002
if "$CLLA" train --config dense.json --set intermediate_size=33 --out oddlayout --quiet --resume auto 2> odd_resume.err; then
    fail "a ZeRO-1 shard without the layout key, of a model whose up_proj moved, was resumed"
elif grep -q "written before gate_proj and up_proj were laid out as one matrix" odd_resume.err; then
    ok "refused: $(tail -n 1 odd_resume.err | cut -c1-150)..."
else fail "odd-layout shard: $(tail -n 1 odd_resume.err)"; fi

# ---------------------------------------------------------------- (c) a rank dies / hangs
# Each rank records its pid; rank 1 is killed once a checkpoint exists.
cat > pidwrap.sh <<'EOF'
#!/bin/sh
echo $$ > "pid.$OMPI_COMM_WORLD_RANK"
exec "$@"
EOF
chmod +x pidwrap.sh
dies() {   # dies NAME SIGNAL EXTRA-ARGS...
    local name=$1 sig=$2
    shift 2
    rm -f pid.* && rm -rf "$name"
    "${MPIRUN[@]}" -np 2 ./pidwrap.sh "$CLLA" train --config dense.json --set train.max_steps=1000000 \
        --out "$name" --save-every 20 --quiet "$@" > "$name.err" 2>&1 &
    local mp=$! i
    for ((i = 0; i < 300; i++)); do [ -d "$name/checkpoints/step_00000040" ] && [ -f pid.1 ] && break; sleep 0.1; done
    local t0=$SECONDS
    kill "-$sig" "$(cat pid.1 2> /dev/null)" 2> /dev/null
    # the bound: the job must be gone within 60 s (timeout's own kill would also count as failure)
    local rc=0 waited=0
    while kill -0 "$mp" 2> /dev/null && [ $waited -lt 70 ]; do sleep 0.5; waited=$((SECONDS - t0)); done
    if kill -0 "$mp" 2> /dev/null; then
        kill -9 "$mp"; wait "$mp" 2> /dev/null
        [ -f pid.0 ] && kill -9 "$(cat pid.0)" 2> /dev/null
        [ -f pid.1 ] && kill -CONT "$(cat pid.1)" 2> /dev/null && kill -9 "$(cat pid.1)" 2> /dev/null
        fail "$name: the job was still running $((SECONDS - t0)) s after SIG$sig of rank 1"
        return
    fi
    wait "$mp"
    rc=$?
    echo "$rc $((SECONDS - t0))" > "$name.rc"
}
dies kill KILL
if [ -f kill.rc ]; then
    read -r rc secs < kill.rc
    if [ "$rc" -ne 0 ] && grep -q 'rank 1' kill.err; then
        ok "SIGKILL of rank 1: job exit $rc after ${secs} s, message: $(grep -m1 'rank 1' kill.err | sed 's/^ *//')"
    else
        fail "SIGKILL of rank 1: exit $rc, output: $(tail -n 4 kill.err | tr '\n' ' ')"
    fi
    if "$CLLA" train --config dense.json --set train.max_steps=1000000 --stop-at "$(($(ls kill/checkpoints | sort | tail -n 1 | sed 's/step_0*//') + 1))" \
        --out kill --quiet --resume auto 2> kill_resume.err; then
        ok "after the kill the last checkpoint resumes ($(grep -o 'resuming from [^ ]*' kill_resume.err))"
    else
        fail "after the kill: $(tail -n 1 kill_resume.err)"
    fi
fi
# A hung rank (SIGSTOP) never exits: the watchdog of the waiting rank ends the job.
dies hang STOP --set train.dist_timeout_s=5
if [ -f hang.rc ]; then
    read -r rc secs < hang.rc
    [ -f pid.1 ] && kill -9 "$(cat pid.1)" 2> /dev/null
    if [ "$rc" -ne 0 ] && grep -q 'rank 0 of 2.*waited' hang.err; then
        ok "a stopped rank 1: the watchdog ended the job (exit $rc) after ${secs} s: $(grep -m1 -o 'rank 0 of 2: [^(]*' hang.err)"
    else
        fail "a stopped rank 1: exit $rc, output: $(tail -n 4 hang.err | tr '\n' ' ')"
    fi
fi

# ---------------------------------------------------------------- (c1) a stop under resume_until_done
# SIGTERM to launch/resume_until_done.sh running launch/run_single_node.sh: the ranks get it, not
# mpirun (which kills them about 2 s after it passes a SIGTERM on), so a save that takes 3 s
# completes: the newest checkpoint is the step the stop was asked after, and no .tmp is left.
( CLLA="$CLLA" CLLA_BIND=none CLLA_MAP=slot CLLA_RETRY_SLEEP=0 CLLA_TEST_CKPT_PAUSE_MS=3000 \
    bash "$SRC/launch/resume_until_done.sh" rud bash "$SRC/launch/run_single_node.sh" 2 dense.json --out rud --quiet \
    --set train.max_steps=100000000 --save-every 100000 > rud.log 2>&1 ) &
rud_pid=$!
for ((i = 0; i < 300; i++)); do grep -q '"step":20' rud/metrics.jsonl 2> /dev/null && break; sleep 0.1; done
pkill -TERM -f "resume_until_done.sh rud" 2> /dev/null
for ((i = 0; i < 300; i++)); do kill -0 "$rud_pid" 2> /dev/null || break; sleep 0.1; done
kill -KILL "$rud_pid" 2> /dev/null
newest=$(ls rud/checkpoints 2> /dev/null | grep '^step_' | tail -n 1)
stopped=$(grep -o 'stopped after step [0-9]*' rud.log | grep -o '[0-9]*$')
if [ -n "$stopped" ] && [ "$newest" = "$(printf 'step_%08d' "$stopped")" ] && ! ls -a rud/checkpoints | grep -q '^\.tmp' &&
   grep -q "resume_until_done: SIGTERM: stopped after attempt 1" rud.log; then
    ok "(c1) SIGTERM to resume_until_done over mpirun: a 3 s save completes ($newest), no restart"
else
    fail "(c1) SIGTERM to resume_until_done over mpirun: newest '$newest', stopped '$stopped': $(tail -n 4 rud.log | tr '\n' '|')"
fi

# ---------------------------------------------------------------- (d) refusals
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%c%c%c%c", 65 + i % 50, 0, 0, 0 }' > plain.bin
run 2 plain --config dense.json --set train.data=plain.bin
grep -q 'plain uint32 token file.*clla prep' plain.err && ok "2 ranks on a plain token file: refused" ||
    fail "2 ranks on a plain token file: $(tail -n 3 plain.err | tr '\n' ' ')"
run 4 odd --config dense.json --set train.global_batch_tokens=128
grep -q 'not a multiple of micro_batch \* seq_len \* ranks' odd.err && ok "global batch of 2 micro-batches on 4 ranks: refused" ||
    fail "global batch not divisible: $(tail -n 3 odd.err | tr '\n' ' ')"
# train.global_batch_tokens 0 (one micro-batch a rank): the global batch follows the rank count,
# so a resume on another count reads other windows: refused with the numbers and the setting that
# keeps the global batch, with which it resumes
run 2 gb0 --config dense.json --set train.global_batch_tokens=0 --stop-at 2
run 1 gb0 --config dense.json --set train.global_batch_tokens=0 --resume auto
grep -q "global batch of 4 sequences a step (train.global_batch_tokens 0: micro_batch 2 on 2 ranks) and this run's is 2 (1 rank): give the same global batch, train.global_batch_tokens = 128" gb0.err &&
    run 1 gb0 --config dense.json --set train.global_batch_tokens=128 --resume auto &&
    ok "a resume on another rank count with global_batch_tokens 0: refused naming both batches; resumes with the setting given" ||
    fail "global_batch_tokens 0 across rank counts: $(tail -n 2 gb0.err | tr '\n' ' ')"
# one-process commands under mpirun: refused by every rank, nothing written (export raced on its
# package, eval --data printed its JSON once per rank)
timeout 60 "${MPIRUN[@]}" -np 2 "$CLLA" export dense_1 --out pkg_mpi > exp_mpi.err 2>&1
timeout 60 "${MPIRUN[@]}" -np 2 "$CLLA" eval --checkpoint dense_1 --data shards/train --json > ev_mpi.out 2> ev_mpi.err
[ "$(grep -c 'clla export runs as one process, and this one is one of 2 ranks' exp_mpi.err)" = 2 ] && ! ls -d pkg_mpi* > /dev/null 2>&1 &&
    grep -q 'clla eval --data or --ppl .* runs as one process' ev_mpi.err && ! grep -q '"loss"' ev_mpi.out &&
    ok "export and eval --data under mpirun -np 2: refused by each rank, nothing written" ||
    fail "one-process commands under mpirun: $(tr '\n' '|' < exp_mpi.err | head -c 300) $(head -c 200 ev_mpi.out)"
# one of several ranks without an MPI world of them (srun without --mpi=pmix; mpirun of a build
# without MPI): train and eval --bench refuse, where each trained or scored alone
SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 "$CLLA" train --config dense.json --out noworld --quiet > noworld.out 2> noworld.err
rc=$?
if [ "$rc" -eq 1 ] && grep -q "one of 2 ranks (SLURM_STEP_NUM_TASKS) but no MPI world joins them" noworld.err && [ ! -e noworld/model.safetensors ]; then
    ok "a process of a 2-task step without an MPI world: train refused ($(head -c 120 noworld.err))"
else fail "a 2-task step without an MPI world: rc $rc, $(head -c 300 noworld.err)"; fi
# ranks that do not agree (rank 1 started with other settings or other data: a config edited
# while the job started, node-local files): one line from rank 0, not drifting replicas, a
# crash in a collective of another size or a hang
printf '#!/usr/bin/env bash\n# rank 1 gets $R1ARGS after the others'"'"' arguments\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exec "$@" $R1ARGS\nexec "$@"\n' > r1args.sh
chmod +x r1args.sh
for c in "lr|--set train.lr=1e-3|rank 1 was started with other settings than rank 0" \
         "zero|--zero 1|rank 1 was started with other settings than rank 0" \
         "stop|--stop-at 2|rank 1 was started with other settings than rank 0" \
         "data|--set train.data=$WORK/shards_c/train|rank 1 was started with other settings than rank 0"; do
    IFS='|' read -r name extra want <<< "$c"
    R1ARGS=$extra timeout 120 "${MPIRUN[@]}" -x R1ARGS -np 2 ./r1args.sh "$CLLA" train --out "disagree_$name" --quiet --config dense.json > "disagree_$name.err" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c "$want" "disagree_$name.err")" = 1 ] && [ ! -e "disagree_$name/model.safetensors" ]; then
        ok "rank 1 with $extra: refused once ($(grep -o "rank 1 [a-z ]*than rank 0" "disagree_$name.err"))"
    else
        fail "rank 1 with $extra: exit $rc: $(grep -m2 -E 'error|MPI' "disagree_$name.err" | tr '\n' ' ')"
    fi
done
# ... but a thread count of its own is not another setting (docs/DISTRIBUTED.md): rank 1 with
# train.threads 2 trains the bits of the 2-rank run (it was refused as started with other settings)
R1ARGS="--set train.threads=2" timeout 120 "${MPIRUN[@]}" -x R1ARGS -np 2 ./r1args.sh "$CLLA" train --out threads_r1 --quiet \
    --config dense.json --set train.threads=1 > threads_r1.err 2>&1
rc=$?
[ "$rc" -eq 0 ] && same_bits dense_2_z0 threads_r1 && ok "rank 1 with train.threads=2: accepted, the bits of the 2-rank run" ||
    fail "rank 1 with train.threads=2: exit $rc: $(grep -m2 -E 'error|MPI' threads_r1.err | tr '\n' ' ')"
# the same directory spelled another way on rank 1 (a trailing slash, "./"): the ranks agree (they
# were refused as started with other settings)
printf '#!/usr/bin/env bash\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exec "$@" --out ./same_out//\nexec "$@" --out same_out\n' > r1out.sh
chmod +x r1out.sh
timeout 120 "${MPIRUN[@]}" -np 2 ./r1out.sh "$CLLA" train --quiet --config dense.json --set train.max_steps=2 > same_out.err 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ -s same_out/model.safetensors ] && ok "--out same_out and ./same_out// on two ranks: one run directory" ||
    fail "--out spelled two ways: exit $rc: $(grep -m2 -E 'error|MPI' same_out.err | tr '\n' ' ')"
# the same path, other files on rank 1 (a node-local directory): rank 1 sees other shards
# through a bind mount in a mount namespace of its own
"$CLLA" prep --tokenizer small.tok --out shards_c --chunk-tokens 256 --val-fraction 0 "$SRC/tests/fixtures/english.jsonl" \
    "$SRC/tests/fixtures/english.jsonl" > /dev/null 2>&1
if unshare -m true 2> /dev/null; then
    printf '#!/usr/bin/env bash\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exec unshare -m bash -c '"'"'mount --bind shards_c/train shards/train && exec "$@"'"'"' rank1 "$@"\nexec "$@"\n' > r1data.sh
    chmod +x r1data.sh
    timeout 120 "${MPIRUN[@]}" -np 2 ./r1data.sh "$CLLA" train --out disagree_files --quiet --config dense.json > disagree_files.err 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'rank 1 reads other data than rank 0' disagree_files.err)" = 1 ]; then
        ok "rank 1 with other files at the same train.data: refused once"
    else
        fail "rank 1 with other files at the same train.data: exit $rc: $(grep -m2 -E 'error|MPI' disagree_files.err | tr '\n' ' ')"
    fi
else
    echo "     (other files at the same path on one rank: skipped: no mount namespaces here (unshare -m))"
fi

# ---------------------------------------------------------------- (e) two hosts over TCP
if [ "$(id -u)" = 0 ] && ip netns list > /dev/null 2>&1; then
    if timeout 120 bash "$SRC/launch/netns_two_hosts.sh" "$CLLA" dense.json netns_run > netns.log 2>&1; then
        same_curve "2 hosts (network namespaces, TCP, hostfile) vs 1 rank" dense_1 netns_run
        # train.overlap_grad_reduce "auto" (the default) overlaps where the ranks span hosts
        grep -q 'gradients summed during the backward' netns.log &&
            ok "2 hosts: the gradient sum overlaps the backward by default (train.overlap_grad_reduce auto)" ||
            fail "2 hosts: no overlap by default: $(grep -m1 'clla train:' netns.log)"
    else
        fail "two network-namespace hosts: $(tail -n 5 netns.log | tr '\n' ' ')"
    fi
    # four hosts under ZeRO-1 (NETNS_HOSTS of the launcher): "auto" overlaps there too, the
    # optimizer's shards in stripes (model/shard.h), over TCP
    if NETNS_HOSTS=4 timeout 180 bash "$SRC/launch/netns_two_hosts.sh" "$CLLA" dense.json netns4_z1 --zero 1 > netns4.log 2>&1; then
        same_curve "4 hosts, ZeRO-1 (network namespaces, TCP) vs 1 rank" dense_1 netns4_z1
        [ "$(grep -c '^rank [0-3] on clla-[abcd]' netns4.log)" = 4 ] && grep -q 'gradients summed during the backward' netns4.log &&
            ok "4 hosts, ZeRO-1: one rank a host, the gradient sum overlapping the backward by default (auto)" ||
            fail "4 hosts, ZeRO-1: $(grep -m1 'clla train:' netns4.log) $(grep -c '^rank' netns4.log) ranks"
    else
        fail "four network-namespace hosts: $(tail -n 5 netns4.log | tr '\n' ' ')"
    fi
else
    echo "     (two-host case skipped: needs root and ip netns)"
fi

# ---------------------------------------------------------------- (f) the launch scripts' environment
# run_multi_node.sh: every NCCL_* of this environment reaches the ranks of other nodes. The remote
# side is started by a stand-in for ssh with a clean environment, as ssh does; each "rank" prints
# what it got. slurm.sbatch as SLURM runs it: a copy in a spool directory, found launch/ through
# SLURM_SUBMIT_DIR (it looked beside the copy), srun a stand-in that prints its command.
printf 'localhost slots=1\nnodeb slots=1\n' > hosts2.txt
printf '#!/bin/sh\nhost=$1; shift\nexec env -i PATH=/usr/bin:/bin HOME=/root sh -c "$*"\n' > fakessh.sh
printf '#!/bin/sh\necho "rank $OMPI_COMM_WORLD_RANK: GDR=${NCCL_NET_GDR_LEVEL-unset} IB=${NCCL_IB_DISABLE-unset}"\n' > showenv.sh
chmod +x fakessh.sh showenv.sh
CLLA_IB=1 CLLA="$PWD/showenv.sh" OMPI_MCA_plm_rsh_agent="$PWD/fakessh.sh" timeout 60 bash "$SRC/launch/run_multi_node.sh" hosts2.txt 2 dense.json > mn.out 2>&1
[ "$(grep -c 'GDR=PHB IB=0' mn.out)" = 2 ] && ok "run_multi_node.sh: NCCL_NET_GDR_LEVEL and NCCL_IB_DISABLE reach the other node's rank" ||
    fail "run_multi_node.sh environment: $(tr '\n' '|' < mn.out | head -c 300)"
# run_single_node.sh: env.sh's default interface name (eth0) does not reach NCCL on one host (it
# failed at NCCL's start on a host whose card is ens5); one the user names does; a user's
# NCCL_IB_DISABLE is kept (env.sh overwrote it)
printf '#!/bin/sh\necho "rank $OMPI_COMM_WORLD_RANK: IF=${NCCL_SOCKET_IFNAME-unset} IB=${NCCL_IB_DISABLE-unset}"\n' > showif.sh
chmod +x showif.sh
CLLA="$PWD/showif.sh" CLLA_BIND=none CLLA_MAP=slot timeout 60 bash "$SRC/launch/run_single_node.sh" 2 dense.json > sn1.out 2>&1
NCCL_SOCKET_IFNAME=ens5 NCCL_IB_DISABLE=1 CLLA="$PWD/showif.sh" CLLA_BIND=none CLLA_MAP=slot timeout 60 \
    bash "$SRC/launch/run_single_node.sh" 2 dense.json > sn2.out 2>&1
[ "$(grep -c 'IF=unset IB=0' sn1.out)" = 2 ] && [ "$(grep -c 'IF=ens5 IB=1' sn2.out)" = 2 ] &&
    ok "run_single_node.sh: no default interface name for NCCL; the user's interface and NCCL_IB_DISABLE kept" ||
    fail "run_single_node.sh environment: $(tr '\n' '|' < sn1.out | head -c 200) / $(tr '\n' '|' < sn2.out | head -c 200)"
mkdir -p spool/job42 fakebin
cp "$SRC/launch/slurm.sbatch" spool/job42/slurm_script
printf '#!/bin/sh\necho "srun $*"\n' > fakebin/srun
chmod +x spool/job42/slurm_script fakebin/srun
(cd "$SRC" && PATH="$WORK/fakebin:$PATH" SLURM_SUBMIT_DIR="$SRC" SLURM_CPUS_PER_TASK=1 "$WORK/spool/job42/slurm_script" c.json runs/x) > sb.out 2>&1
# (the binary is $CLLA, which the script takes from the environment: any build directory)
grep -q "^srun --mpi=pmix --kill-on-bad-exit=1 " sb.out && grep -qF -- "$CLLA train --config c.json --out runs/x --resume auto" sb.out &&
    ok "slurm.sbatch run from a spool directory finds launch/ through SLURM_SUBMIT_DIR" || fail "slurm.sbatch from a spool copy: $(cat sb.out)"
PATH="$WORK/fakebin:$PATH" "$WORK/spool/job42/slurm_script" > sb2.out 2>&1
[ $? -eq 2 ] && grep -q "usage: sbatch launch/slurm.sbatch CONFIG OUT" sb2.out && ok "slurm.sbatch without arguments prints its usage" ||
    fail "slurm.sbatch without arguments: $(cat sb2.out)"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
