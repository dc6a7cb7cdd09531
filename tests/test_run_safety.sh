#!/usr/bin/env bash
# What a run wrote is never lost or mixed with another run's files, and a wrong result is never
# reported as a right one (issue 12; docs/CHECKPOINTS.md "Run directories", docs/COMMANDS.md):
#  (1) train into a directory that holds another run, and init over one: refused without
#      --overwrite (files untouched), cleared with it; a user's config.json in --out and a
#      train.metrics file no run wrote are refused even with --overwrite; train.metrics holding
#      another run's records is refused without it (also with --resume auto);
#      an earlier run that --overwrite could not clear (read-only checkpoints) is refused first;
#  (2) a finished run continues with --resume auto --set train.max_steps=N from its final
#      checkpoint; without any checkpoint it is refused with the reason; at max_steps: nothing to do,
#      unless the end's final model was not written (written then from the last checkpoint);
#  (3) a second training on the same --out is refused while the first runs; a lock left by a
#      killed process is taken over with a message; a lock that links to another file is refused;
#  (4) resuming from an older checkpoint moves the later ones aside (one timeline), and a later
#      --resume auto does not go back to them; metrics.jsonl stays in step order;
#  (5) --resume auto with every checkpoint damaged: refused naming the damage, nothing changed;
#  (6) a failing metrics write (file-size limit): exit 1 naming the file and the last good
#      checkpoint, metrics.jsonl holds whole lines only;
#  (7) a damaged data chunk mid-run: the good state is saved as a checkpoint first and named;
#  (8) a non-finite loss stops the run at once naming the step and the newest safe checkpoint
#      (or none); no final model; clla eval --json prints null and exits 1 on a NaN loss;
#  (9) the run records its data's tokenizer hash; eval and init_from refuse other tokenizers' data;
# (10) validation during training and clla eval score the same windows (same loss), and data
#      smaller than one batch is scored (a partial batch) by both;
# (11) launch/resume_until_done.sh continues a finished run to a new max_steps, and stops with
#      the run on SIGINT or SIGTERM instead of restarting it.
# Needs CLLA (the binary) and SRC (for tests/fixtures). Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}

. "$(dirname "$0")/lib/check.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_test_run_safety.XXXXXX")
BGPID=""
cleanup() {
    [ -n "$BGPID" ] && kill -KILL "$BGPID" 2> /dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK" || exit 1


# Little-endian uint32 tokens < MOD from a fixed LCG, in one printf.
write_tokens tok.bin 3000 12345

TRAIN='"seq_len": 32, "warmup_steps": 2, "lr": 3e-3, "min_lr": 3e-4, "seed": 11, "threads": 1, "log_every": 1000'
MODEL='"attention": "gqa", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64'
cat > c.json <<EOF
{$MODEL, "train": {"data": "tok.bin", "max_steps": 6, "micro_batch": 2, $TRAIN}}
EOF

# expect_error NAME KEYWORD -- cmd...: exit 1, exactly one error line on stderr, containing KEYWORD.
expect_error() {
    local name=$1 keyword=$2
    shift 3
    "$@" > out.txt 2> err.txt
    local rc=$?
    if [ "$rc" -ne 1 ]; then
        fail "$name: exit $rc (want 1): $(head -c 400 err.txt)"
    elif [ "$(grep -c 'error' err.txt)" -ne 1 ]; then
        fail "$name: want one error line: $(head -c 400 err.txt | tr '\n' '|')"
    elif ! grep -qi -- "$keyword" err.txt; then
        fail "$name: stderr does not mention '$keyword': $(cat err.txt)"
    else
        ok "$name: $(grep error err.txt)"
    fi
}
snapshot() { (cd "$1" && find . -type f ! -name train.lock -exec md5sum {} + | sort); }
steps_of() { grep -o '"step":[0-9]*' "$1" | cut -d: -f2 | tr '\n' ' '; }

# ---------------------------------------------------------------- (1) another run's directory
"$CLLA" train --config c.json --out r1 --quiet --save-every 2 2> r1.err || fail "(1) first run failed: $(tail -n 1 r1.err)"
snapshot r1 > r1.before
expect_error "(1) train into a finished run's directory" "already holds a run.*--overwrite" -- \
    "$CLLA" train --config c.json --out r1 --quiet --set train.lr=1e-3
expect_error "(1) init over a run directory" "already holds.*--overwrite" -- "$CLLA" init --config c.json --out r1
"$CLLA" train --config c.json --out r1 --quiet --overwrite --set train.data=nothere.bin 2> /dev/null &&
    fail "(1) --overwrite with missing data exited 0"
snapshot r1 | cmp -s - r1.before && ok "(1) the refused commands (and an --overwrite whose data is missing) left r1 untouched" ||
    fail "(1) r1 changed"
# train.metrics outside the run directory naming a file no run wrote: never taken as a run's
# output, not even with --overwrite (the file keeps its bytes, nothing is created)
echo "my notes" > notes.txt
expect_error "(1) train.metrics naming the user's own file, with --overwrite" "'$WORK/notes.txt' holds a file that no run wrote" -- \
    "$CLLA" train --config c.json --out r_notes --quiet --overwrite --set train.metrics=notes.txt
[ "$(cat notes.txt)" = "my notes" ] && [ ! -e r_notes ] && ok "(1) the user's file is left as it was, no run directory made" ||
    fail "(1) notes.txt now: $(head -c 80 notes.txt); $(ls r_notes 2>&1)"
# an output that is a FIFO (or a device: /dev/null) is not a file to replace, even with
# --overwrite (a rename swapped it for a regular file); nor a train.metrics that is a link
mkfifo a_fifo
expect_error "(1) debug-step --out a FIFO with --overwrite" "a_fifo' is not a regular file" -- \
    "$CLLA" debug-step --model r1 --tokens tok.bin --out a_fifo --overwrite
echo "real" > real_metrics.jsonl && ln -s real_metrics.jsonl link_metrics.jsonl
expect_error "(1) train.metrics that is a symbolic link" "is a symbolic link or not a regular file" -- \
    "$CLLA" train --config c.json --out r_link --quiet --set train.metrics=link_metrics.jsonl
[ -p a_fifo ] && [ -L link_metrics.jsonl ] && [ "$(cat real_metrics.jsonl)" = real ] && [ ! -e r_link ] &&
    ok "(1) the FIFO and the link are left as they were" || fail "(1) FIFO or link changed: $(ls -l a_fifo link_metrics.jsonl)"
# a config.json in --out without a model beside it is the user's (the config being trained
# from, say): a run writes its own with the final model; refused in every mode, never replaced
mkdir r_cfg && cp c.json r_cfg/config.json
for mode in "" "--resume auto" "--overwrite"; do
    # shellcheck disable=SC2086
    expect_error "(1) --out holding the user's config.json ${mode:-(new run)}" "r_cfg/config.json is not a run's" -- \
        "$CLLA" train --config r_cfg/config.json --out r_cfg --quiet $mode
done
expect_error "(1) init --overwrite over the user's config.json" "r_cfg/config.json is not a run's" -- \
    "$CLLA" init --config r_cfg/config.json --out r_cfg --overwrite
cmp -s c.json r_cfg/config.json && [ "$(ls r_cfg)" = "config.json" ] && ok "(1) the user's config.json is left as it was" ||
    fail "(1) r_cfg now: $(ls r_cfg | tr '\n' ' ')"
# train.metrics outside --out holding another run's step records, into an empty --out: refused
# (a fresh start and --resume auto would have emptied r1's metrics), taken with --overwrite only
cp r1/metrics.jsonl r1_metrics.before
expect_error "(1) train.metrics = another run's metrics, a new --out" "train.metrics '$WORK/r1/metrics.jsonl' already holds a run's step records" -- \
    "$CLLA" train --config c.json --out r_other --quiet --set train.metrics=r1/metrics.jsonl
expect_error "(1) the same with --resume auto" "no checkpoint in .*train.metrics '$WORK/r1/metrics.jsonl' already holds step records" -- \
    "$CLLA" train --config c.json --out r_other --quiet --set train.metrics=r1/metrics.jsonl --resume auto
cmp -s r1/metrics.jsonl r1_metrics.before && [ ! -e r_other ] && ok "(1) the other run's metrics are left as they were" ||
    fail "(1) r1/metrics.jsonl changed or r_other made: $(steps_of r1/metrics.jsonl)"
if "$CLLA" train --config c.json --out r1 --quiet --overwrite --set train.max_steps=3 2> r1o.err &&
   [ "$(steps_of r1/metrics.jsonl)" = "1 2 3 " ] && [ "$(ls r1/checkpoints)" = "step_00000003" ]; then
    ok "(1) --overwrite clears the earlier run: $(ls r1/checkpoints | tr '\n' ' ')"
else
    fail "(1) --overwrite: $(tail -n 1 r1o.err) | $(ls r1/checkpoints | tr '\n' ' ') | $(steps_of r1/metrics.jsonl)"
fi
"$CLLA" init --config c.json --out r1 --overwrite > /dev/null 2> init.err && [ ! -e r1/metrics.jsonl ] && [ ! -e r1/checkpoints ] &&
    ok "(1) init --overwrite replaces the run" || fail "(1) init --overwrite: $(cat init.err)"
# an earlier run whose checkpoints cannot be removed (here a read-only mount of checkpoints/, in a
# mount namespace of its own): init --overwrite and train --overwrite refuse before they change
# anything (init wrote the new model first and then failed, leaving it beside the old checkpoints)
"$CLLA" train --config c.json --out r_ro --quiet --set train.max_steps=2 2> /dev/null || fail "(1) r_ro run failed"
cp r_ro/model.safetensors r_ro.model
if unshare -m true 2> /dev/null; then
    for cmd in init train; do
        unshare -m bash -c 'mount --bind "$1/checkpoints" "$1/checkpoints" && mount -o remount,bind,ro "$1/checkpoints" &&
            exec "$2" "$3" --config c.json --out "$1" --overwrite' _ "$WORK/r_ro" "$CLLA" "$cmd" > /dev/null 2> ro.err
        rc=$?
        [ $rc -ne 0 ] && grep -q "cannot be cleared: nothing may be removed from '$WORK/r_ro/checkpoints/step_00000002'.*nothing was changed" ro.err &&
            cmp -s r_ro.model r_ro/model.safetensors && [ -e r_ro/metrics.jsonl ] && [ ! -e r_ro/train.lock ] &&
            ok "(1) $cmd --overwrite over checkpoints it cannot remove: refused, nothing changed" ||
            fail "(1) $cmd --overwrite, read-only checkpoints: rc $rc, $(cat ro.err), $(ls r_ro | tr '\n' ' ')"
    done
else
    echo "skip (1) --overwrite over read-only checkpoints: this machine does not allow a mount namespace (unshare -m)"
fi

# A full disk during init --overwrite over a finished run (a reader holds the old weights open,
# so replacing them frees nothing): refused, and the trained model and its config are both as
# they were. config.json was written after the new weights had replaced the trained ones, and
# its failure left them beside the old config and checkpoints; sharded, the index was written
# after the shards had replaced the old ones, and its failure left shards the old index refused.
if unshare -m true 2> /dev/null; then
    for shard in "" 32KiB; do
        mkdir -p "fs$shard"
        unshare -m bash -c '
            mount -t tmpfs -o size=4m tmpfs "$1/fs$3" && cd "$1/fs$3" || exit 9
            set -- "$@" ${3:+--shard-size "$3"}
            "$2" train --config "$1/c.json" --out run --quiet --save-every 3 "${@:4}" 2> /dev/null || exit 8
            md5sum run/model*.safetensors* run/config.json > before.md5
            need=0
            for f in run/model*.safetensors; do exec {fd}< "$f"; need=$(( need + ($(stat -c %s "$f") + 4095) / 4096 * 4096 )); done
            avail=$(df -B1 --output=avail . | tail -n 1)
            dd if=/dev/zero of=fill bs=4096 count=$(( (avail - need) / 4096 - 1 )) 2> /dev/null
            "$2" init --config "$1/c.json" --out run --overwrite "${@:4}" > /dev/null 2> "$1/full$3.err"
            echo "rc $?" >> "$1/full$3.err"
            md5sum -c --quiet before.md5 && [ -z "$(ls -A run | grep -v "^\(model.*safetensors.*\|config.json\|metrics.jsonl\|checkpoints\)$")" ]
        ' _ "$WORK" "$CLLA" "$shard"
        rc=$?
        what="(1) a full disk during init --overwrite${shard:+ --shard-size $shard}"
        grep -q "^rc 1$" "full$shard.err" && [ "$(grep -c error "full$shard.err")" -eq 1 ] && [ "$rc" -eq 0 ] &&
            ok "$what: refused, the trained model and config as they were: $(grep error "full$shard.err")" ||
            fail "$what: check rc $rc, $(tr '\n' ' ' < "full$shard.err")"
    done
else
    echo "skip (1) a full disk during init --overwrite: this machine does not allow a mount namespace (unshare -m)"
fi

# ---------------------------------------------------------------- (2) continue a finished run
"$CLLA" train --config c.json --out r2 --quiet 2> r2.err || fail "(2) run failed: $(tail -n 1 r2.err)"
cp r2/model.safetensors r2.model6
cp r2/config.json r2.config6
if "$CLLA" train --config c.json --out r2 --quiet --resume auto --set train.max_steps=9 2> r2b.err &&
   grep -q "resuming from $WORK/r2/checkpoints/step_00000006 at step 6" r2b.err && [ "$(steps_of r2/metrics.jsonl)" = "1 2 3 4 5 6 7 8 9 " ] &&
   ! cmp -s r2.model6 r2/model.safetensors && ! ls -d r2/checkpoints/abandoned-* > /dev/null 2>&1; then
    ok "(2) a finished run continues from its final checkpoint to step 9"
else
    fail "(2) continuing a finished run: $(grep -v warning r2b.err | head -n 2 | tr '\n' ' ') | $(steps_of r2/metrics.jsonl)"
fi
snapshot r2 > r2.before
"$CLLA" train --config c.json --out r2 --quiet --resume auto --set train.max_steps=9 2> r2c.err && grep -q "nothing to do" r2c.err &&
    snapshot r2 | cmp -s - r2.before && ok "(2) at train.max_steps: $(grep -v changed r2c.err)" || fail "(2) resume at max_steps: $(cat r2c.err)"
# the end's write of the final model failed (full disk) or was killed: the run holds the
# previous end's model and config, or none; at train.max_steps the resume writes them again from
# the last checkpoint, the same bytes as a final model written at the end
cp r2/model.safetensors r2.model9
for damage in "the previous end's model and config" "no final model"; do
    if [ "$damage" = "no final model" ]; then rm -f r2/model.safetensors r2/config.json
    else cp r2.model6 r2/model.safetensors; cp r2.config6 r2/config.json; fi
    if "$CLLA" train --config c.json --out r2 --quiet --resume auto --set train.max_steps=9 2> r2d.err &&
       grep -q "final model of that step was not written: writing it from the checkpoint" r2d.err &&
       cmp -s r2/model.safetensors r2.model9 && grep -Eq '"max_steps":[[:space:]]*9,' r2/config.json; then
        ok "(2) $damage at max_steps: written again from the checkpoint"
    else
        fail "(2) $damage at max_steps: $(tr '\n' '|' < r2d.err) $(cmp r2/model.safetensors r2.model9 2>&1)"
    fi
done
"$CLLA" train --config c.json --out r2 --quiet --resume auto --set train.max_steps=9 2> r2e.err && grep -q "nothing to do" r2e.err &&
    ok "(2) and then nothing to do" || fail "(2) after writing the final model again: $(cat r2e.err)"
rm -rf r2/checkpoints
snapshot r2 > r2.before
expect_error "(2) a finished run without checkpoints" "no checkpoint to continue from.*init_from" -- \
    "$CLLA" train --config c.json --out r2 --quiet --resume auto --set train.max_steps=12
snapshot r2 | cmp -s - r2.before && ok "(2) the refused resume left r2 untouched" || fail "(2) r2 changed"

# a path setting written another way that names the same file is not a change (the quickstart's
# absolute --set train.data against its config's configs/../ path was reported as one)
mkdir -p sub
"$CLLA" train --config c.json --out r_path --quiet --save-every 2 --set train.max_steps=2 2> /dev/null
"$CLLA" train --config c.json --out r_path --quiet --resume auto --set train.max_steps=4 --set train.data="$WORK/sub/../tok.bin" 2> rp.err
rc=$?
[ "$rc" -eq 0 ] && grep -q "train.max_steps changed" rp.err && ! grep -q "train.data changed" rp.err &&
    ok "(2) a resume with train.data spelled another way reports only the real change" || fail "(2) path spelled another way: rc $rc: $(cat rp.err)"

# ---------------------------------------------------------------- (3) two trainings at once
cat > long.json <<EOF
{$MODEL, "train": {"data": "tok.bin", "max_steps": 100000, "micro_batch": 2, $TRAIN}}
EOF
"$CLLA" train --config long.json --out r3 --quiet 2> r3a.err &
BGPID=$!
for ((i = 0; i < 400; i++)); do [ -s r3/metrics.jsonl ] && break; sleep 0.05; done
expect_error "(3) a second training on the same --out" "in use by another training (process $BGPID" -- \
    "$CLLA" train --config long.json --out r3 --quiet --resume auto
expect_error "(3) init --overwrite into a running training's directory" "in use by another training (process $BGPID" -- \
    "$CLLA" init --config long.json --out r3 --overwrite
# a training that holds its lock before it has written anything (its directory still empty):
# init must not write its model beside it
mkdir r3_empty
flock r3_empty/train.lock sleep 30 &
FLPID=$!
for ((i = 0; i < 100; i++)); do [ -e r3_empty/train.lock ] && break; sleep 0.05; done
sleep 0.2
expect_error "(3) init into the empty directory of a training that holds its lock" "is in use by another training" -- \
    "$CLLA" init --config long.json --out r3_empty
[ ! -e r3_empty/model.safetensors ] && ok "(3) nothing written beside the lock holder" || fail "(3) init wrote into r3_empty: $(ls r3_empty)"
kill "$FLPID" 2> /dev/null; wait "$FLPID" 2> /dev/null
# train.metrics naming the running training's metrics file from another run directory (the
# lock of r3 does not cover it): refused, even with --overwrite, which would have removed it
expect_error "(3) another run's train.metrics = the running training's file, with --overwrite" "metrics file '$WORK/r3/metrics.jsonl' is being written by another training" -- \
    "$CLLA" train --config long.json --out r3_other --quiet --overwrite --set train.max_steps=2 --set train.metrics="$WORK/r3/metrics.jsonl"
[ -s r3/metrics.jsonl ] && ok "(3) the running training's metrics are still there" ||
    fail "(3) init --overwrite removed the running training's files: $(ls r3 | tr '\n' ' ')"
kill -TERM "$BGPID"; wait "$BGPID"
rc=$?
BGPID=""
[ "$rc" -eq 0 ] && [ ! -e r3/train.lock ] && ok "(3) SIGTERM: the first training stops with exit 0 and releases its lock" ||
    fail "(3) SIGTERM: exit $rc, $(ls r3 | tr '\n' ' ')"
"$CLLA" train --config long.json --out r3 --quiet --resume auto 2> r3b.err &
BGPID=$!
for ((i = 0; i < 400; i++)); do grep -q resuming r3b.err && [ -e r3/train.lock ] && break; sleep 0.05; done
sleep 0.2
kill -KILL "$BGPID"; wait "$BGPID" 2> /dev/null; BGPID=""
if "$CLLA" train --config long.json --out r3 --quiet --overwrite --set train.max_steps=2 2> r3c.err &&
   grep -q "taking over the lock.*left by process" r3c.err && [ ! -e r3/train.lock ]; then
    ok "(3) the lock of a killed run is taken over: $(grep lock r3c.err)"
else
    fail "(3) stale lock: $(cat r3c.err | tr '\n' '|') $(ls r3)"
fi

# temporaries a killed run left (kill -9 during its final save, or a sharded save): removed by
# the next training in the directory, which holds the lock; a user's file of a similar name stays
touch r3/model.safetensors.tmp.999999 r3/config.json.tmp.999998 r3/model-00001-of-00002.safetensors.partial.999997 \
      r3/model-00002-of-00002.safetensors.partial.999997.tmp.999997 r3/notes.tmp.5 r3/model.safetensors.tmp.x
"$CLLA" train --config long.json --out r3 --quiet --resume auto --set train.max_steps=3 2> r3t.err
if grep -q "removed 4 temporaries a killed run left in $WORK/r3" r3t.err && [ -e r3/notes.tmp.5 ] && [ -e r3/model.safetensors.tmp.x ] &&
   ! ls r3/*.tmp.9* r3/*.partial.* > /dev/null 2>&1; then
    ok "(3) a killed run's temporaries are removed by the next training: $(grep removed r3t.err)"
else
    fail "(3) stale temporaries: $(tr '\n' '|' < r3t.err) $(ls r3 | tr '\n' ' ')"
fi

# the lock is truncated and rewritten: a train.lock that is a link (symbolic or hard) to a
# user's file is refused, the file untouched
echo "IMPORTANT" > important.txt
mkdir -p rl_sym rl_hard
ln -s ../important.txt rl_sym/train.lock
ln important.txt rl_hard/train.lock
expect_error "(3) a train.lock that is a symbolic link" "is a symbolic link.*remove the link" -- \
    "$CLLA" train --config c.json --out rl_sym --quiet --set train.max_steps=2
expect_error "(3) a train.lock that is a hard link" "not a plain file of its own" -- \
    "$CLLA" train --config c.json --out rl_hard --quiet --set train.max_steps=2
[ "$(cat important.txt)" = IMPORTANT ] && [ -L rl_sym/train.lock ] && ok "(3) the linked file is left as it was" ||
    fail "(3) important.txt now: $(head -c 40 important.txt)"

# the lock file cannot be written (a file-size limit, a full disk): one line, and the directory
# this run created goes with its lock (both were left behind)
# (the message through a pipe: under the limit, a file for stderr could not be written either)
(ulimit -f 0; "$CLLA" train --config c.json --out r_nolock --quiet 2>&1) | cat > nolock.err
rc=${PIPESTATUS[0]}
[ "$rc" -eq 1 ] && grep -q "cannot write the lock file" nolock.err && [ ! -e r_nolock ] &&
    ok "(3) an unwritable lock file: one line, no run directory left" || fail "(3) unwritable lock: rc $rc, $(ls -a r_nolock 2>&1 | tr '\n' ' ')"
# a SIGHUP (or a second Ctrl-C) during a checkpoint save ends the process at once: the save's
# temporary directory and the lock go with it (both were left behind)
CLLA_TEST_CKPT_PAUSE_MS=1000 "$CLLA" train --config c.json --out r_hup --quiet --save-every 2 --set train.max_steps=100000 2> hup.err &
hup=$!
for ((i = 0; i < 100; i++)); do ls -a r_hup/checkpoints 2> /dev/null | grep -q '^\.tmp\.step' && break; sleep 0.05; done
kill -HUP "$hup"; wait "$hup" 2> /dev/null
left=$(ls -a r_hup/checkpoints 2> /dev/null | grep '^\.tmp' || true)
[ -z "$left" ] && grep -q "stopped by a signal: removed the unfinished output .*\.tmp\.step_" hup.err &&
    ok "(3) SIGHUP during a checkpoint save: its temporary directory removed" || fail "(3) SIGHUP mid-save left '$left': $(tail -n 1 hup.err)"
[ ! -e r_hup/train.lock ] && ok "(3) SIGHUP: the lock goes with the run" || fail "(3) SIGHUP left r_hup/train.lock: $(cat hup.err)"

# one SIGTERM while the final model is written (after the last step's checkpoint): the run ends
# normally, its model and config.json written (the handler was gone by then: exit 143, no model).
# strace delays the rename of the final model, found by its place among the renames of the same
# run traced once before (-P does not match a rename's new name)
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    strace -f -o cnt.trace -e trace=rename "$CLLA" train --config c.json --out r_cnt --quiet 2> /dev/null
    k=$(grep -o 'rename("[^"]*", "[^"]*")' cnt.trace | grep -n 'r_cnt/model.safetensors")' | cut -d: -f1)
    strace -f -o /dev/null -e trace=rename -e inject=rename:delay_enter=1500000:when="${k:-1}" \
        "$CLLA" train --config c.json --out r_fin --quiet 2> fin.err &
    fin=$!
    for ((i = 0; i < 200; i++)); do ls r_fin/model.safetensors.tmp.* > /dev/null 2>&1 && break; sleep 0.02; done
    pkill -TERM -P "$fin" -x clla
    wait "$fin"
    rc=$?
    [ -n "$k" ] && [ "$rc" -eq 0 ] && [ -s r_fin/model.safetensors ] && [ -s r_fin/config.json ] && grep -q "^saved .*r_fin/model.safetensors" fin.err
    check $? "(3) SIGTERM during the final model's save (rename $k held): the run ends normally with its model (rc $rc: $(tail -n 1 fin.err))"
else
    echo "skip (3) SIGTERM during the final save: strace cannot trace here (it is in scripts/setup.sh)"
fi

# ---------------------------------------------------------------- (4) one timeline
cat > c20.json <<EOF
{$MODEL, "train": {"data": "tok.bin", "max_steps": 20, "micro_batch": 2, $TRAIN}}
EOF
"$CLLA" train --config c20.json --out r4 --quiet --save-every 5 2> r4.err || fail "(4) run failed: $(tail -n 1 r4.err)"
"$CLLA" train --config c20.json --out r4 --quiet --save-every 5 --resume r4/checkpoints/step_00000010 --stop-at 13 2> r4b.err
if [ "$(ls r4/checkpoints | grep -c '^step_')" -eq 3 ] && ls -d r4/checkpoints/abandoned-*/step_00000015 > /dev/null 2>&1 &&
   [ ! -e r4/model.safetensors ] && [ "$(steps_of r4/metrics.jsonl)" = "$(seq -s ' ' 1 13) " ]; then
    ok "(4) resuming at step 10 moved steps 15 and 20 and the final model aside: $(ls r4/checkpoints | tr '\n' ' ')"
else
    fail "(4) after resuming at 10: $(ls r4/checkpoints | tr '\n' ' ') | $(steps_of r4/metrics.jsonl) | $(tail -n 1 r4b.err)"
fi
"$CLLA" train --config c20.json --out r4 --quiet --save-every 5 --resume auto 2> r4c.err
if grep -q "resuming from $WORK/r4/checkpoints/step_00000013 at step 13" r4c.err && [ "$(steps_of r4/metrics.jsonl)" = "$(seq -s ' ' 1 20) " ]; then
    ok "(4) --resume auto continues the new timeline at step 13; metrics 1..20 in order"
else
    fail "(4) --resume auto after the older resume: $(head -n 2 r4c.err | tr '\n' ' ') | $(steps_of r4/metrics.jsonl)"
fi

# a refused --stop-at (not after the checkpoint) changes nothing: the later steps and the final
# model were moved aside before the refusal
"$CLLA" train --config c20.json --out r4e --quiet --save-every 5 2> r4e.err || fail "(4) run r4e failed: $(tail -n 1 r4e.err)"
snap4e=$(cd r4e && find . -type f ! -name train.lock | sort | xargs md5sum)
"$CLLA" train --config c20.json --out r4e --quiet --resume r4e/checkpoints/step_00000010 --stop-at 10 2> r4eb.err
rc=$?
[ "$rc" -eq 1 ] && grep -q -- "--stop-at 10 is not after" r4eb.err && [ "$snap4e" = "$(cd r4e && find . -type f ! -name train.lock | sort | xargs md5sum)" ]
check $? "(4) a refused --stop-at moves nothing (rc $rc: $(tail -n 1 r4eb.err))"
# resuming an earlier checkpoint to end there (train.max_steps = its step): the later timeline,
# its final model among it, is moved aside before that step's final model is written (the step-20
# model was overwritten, its steps left beside the new model)
cp r4e/model.safetensors r4e.model20
"$CLLA" train --config c20.json --out r4e --quiet --resume r4e/checkpoints/step_00000010 --set train.max_steps=10 2> r4ec.err
rc=$?
if [ "$rc" -eq 0 ] && cmp -s r4e/model.safetensors r4e/checkpoints/step_00000010/model.safetensors &&
   cmp -s r4e.model20 r4e/checkpoints/abandoned-*/model.safetensors && ls -d r4e/checkpoints/abandoned-*/step_00000020 > /dev/null 2>&1 &&
   [ "$(steps_of r4e/metrics.jsonl)" = "$(seq -s ' ' 1 10) " ]; then
    ok "(4) ending at an earlier step: the step-20 model and steps kept in abandoned-*, step 10's model written, metrics 1..10"
else
    fail "(4) ending at an earlier step: rc $rc, $(ls r4e r4e/checkpoints | tr '\n' ' ') | $(steps_of r4e/metrics.jsonl) | $(tail -n 1 r4ec.err)"
fi
# --overwrite with a checkpoint of an abandoned timeline: refused, as for one of the run's own
# steps (the clear removed the checkpoint being resumed, and the run went on from memory)
ab=$(ls -d r4e/checkpoints/abandoned-*/step_00000020 | head -n 1)
expect_error "(4) --overwrite with --resume of an abandoned checkpoint" "would remove the checkpoint" -- \
    "$CLLA" train --config c20.json --out r4e --quiet --resume "$ab" --overwrite
[ -s "$ab/state.json" ] && check 0 "(4) the abandoned checkpoint is still there" || check 1 "(4) the abandoned checkpoint was removed"
# a sharded final model goes aside whole (its index and shards stayed, beside no config.json)
"$CLLA" train --config c20.json --out r4f --quiet --save-every 5 --shard-size 20KB 2> r4f.err || fail "(4) sharded run failed: $(tail -n 1 r4f.err)"
n_shards=$(ls r4f | grep -c '^model-.*-of-.*\.safetensors$')
"$CLLA" train --config c20.json --out r4f --quiet --save-every 5 --resume r4f/checkpoints/step_00000010 --stop-at 13 2> r4fb.err
if [ "$n_shards" -gt 1 ] && [ -z "$(ls r4f | grep '^model')" ] && [ -e r4f/checkpoints/abandoned-*/model.safetensors.index.json ] &&
   [ "$(ls r4f/checkpoints/abandoned-* | grep -c '^model-.*-of-')" -eq "$n_shards" ]; then
    ok "(4) a sharded final model ($n_shards shards and the index) moved aside with its timeline"
else
    fail "(4) sharded final model on resume: $n_shards shards; $(ls r4f r4f/checkpoints/abandoned-* | tr '\n' ' ') | $(tail -n 1 r4fb.err)"
fi

# A second abandon within the same second gets a directory of its own: the names of the next
# minute are taken here (as an abandon just before would have taken them), each holding a step
# the resume below also abandons; they must be left as they are.
for s in $(seq 0 59); do   # a minute: the resume below starts within it even on a loaded machine
    d=r4/checkpoints/abandoned-$(date -u -d "+$s seconds" +%Y%m%dT%H%M%SZ)
    mkdir -p "$d/step_00000015" && echo earlier > "$d/step_00000015/mark"
done
"$CLLA" train --config c20.json --out r4 --quiet --save-every 5 --resume r4/checkpoints/step_00000010 --stop-at 11 2> r4d.err
taken=$(ls -d r4/checkpoints/abandoned-*-2 2> /dev/null | head -n 1)
if [ -n "$taken" ] && [ -d "$taken/step_00000015" ] && [ ! -e "$taken/step_00000015/mark" ] &&
   [ "$(cat r4/checkpoints/abandoned-*/step_00000015/mark 2> /dev/null | grep -c earlier)" -eq 60 ]; then
    ok "(4) an abandon in a second whose directory exists takes ${taken##*/}; the earlier ones untouched"
else
    fail "(4) abandon into a taken name: $(ls r4/checkpoints | grep -v '^abandoned-[0-9TZ]*$' | tr '\n' ' ') | $(tr '\n' ' ' < r4d.err)"
fi

# A checkpoint directory replaced while a resume reads it (another process resumed the run from
# an earlier step: the old one moved aside, a new one saved under its name) is refused, not read
# half from each. strace holds the resume at its third open of the optimizer file, after the
# first reads; the directory is swapped for a copy meanwhile.
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    "$CLLA" train --config c20.json --out r4s --quiet --save-every 5 --stop-at 10 2> r4s.err
    opt=r4s/checkpoints/step_00000010/optimizer.rank0.safetensors
    strace -o /dev/null -P "$opt" -e trace=openat -e inject=openat:delay_enter=3000000:when=3 \
        "$CLLA" train --config c20.json --out r4s_fork --quiet --resume r4s/checkpoints/step_00000010 > /dev/null 2> r4sf.err &
    fpid=$!
    sleep 1.5
    mv r4s/checkpoints/step_00000010 r4s/step10_old && cp -r r4s/step10_old r4s/checkpoints/step_00000010
    wait "$fpid"
    rc=$?
    [ "$rc" -eq 1 ] && grep -q "was replaced while it was read" r4sf.err &&
        ok "(4) a checkpoint replaced during the resume's reads is refused: $(grep error r4sf.err)" ||
        fail "(4) checkpoint replaced while read: rc $rc: $(grep -v '^strace' r4sf.err | tail -n 2 | tr '\n' ' ')"
else
    echo "skip (4) a checkpoint replaced during a resume: strace is missing or not allowed here (apt-get install strace)"
fi

# ---------------------------------------------------------------- (5) every checkpoint damaged
"$CLLA" train --config c.json --out r5 --quiet --save-every 2 --stop-at 4 2> r5.err
for d in r5/checkpoints/step_*; do printf 'x' >> "$d/model.safetensors"; done
snapshot r5 > r5.before
"$CLLA" train --config c.json --out r5 --quiet --resume auto > /dev/null 2> r5b.err
rc=$?
if [ "$rc" -eq 1 ] && tail -n 1 r5b.err | grep -q "every checkpoint in $WORK/r5/checkpoints is damaged.*step_00000004" && snapshot r5 | cmp -s - r5.before; then
    ok "(5) all checkpoints damaged: refused, nothing changed: $(tail -n 1 r5b.err)"
else
    fail "(5) all checkpoints damaged: exit $rc: $(tail -n 1 r5b.err)"
fi

# ---------------------------------------------------------------- (6) a failing metrics write
# A model small enough that its checkpoint files fit under ulimit -f 8 (KiB) while metrics.jsonl
# (about 200 bytes a step) outgrows it near step 40.
write_tokens tok16.bin 3000 4242 16
cat > small.json <<EOF
{"attention": "gqa", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "intermediate_size": 16, "max_position_embeddings": 64, "tie_word_embeddings": true,
 "train": {"data": "tok16.bin", "max_steps": 200, "micro_batch": 2, $TRAIN}}
EOF
(ulimit -f 8; exec "$CLLA" train --config small.json --out r6 --quiet --save-every 10) 2> r6.err
rc=$?
last=$(tail -n 1 r6.err)
n=$(wc -l < r6/metrics.jsonl)
good=$(( n / 10 * 10 ))
if [ "$rc" -eq 1 ] && echo "$last" | grep -q "writing metrics file '$WORK/r6/metrics.jsonl' failed: File too large; the last good checkpoint is $WORK/r6/checkpoints/$(printf 'step_%08d' $good)" &&
   [ "$(tail -c 1 r6/metrics.jsonl | od -An -c | tr -d ' ')" = '\n' ] && [ ! -e r6/model.safetensors ]; then
    ok "(6) metrics write failed at step $((n + 1)): $last; $n whole lines kept"
else
    fail "(6) metrics write failure: exit $rc: $last ($n lines, last byte $(tail -c 1 r6/metrics.jsonl | od -An -c))"
fi

# The final model cannot be written (its name is taken by a directory): the error names the
# final checkpoint, which holds the same state.
"$CLLA" train --config c.json --out r6b --quiet --stop-at 3 2> /dev/null
mkdir r6b/model.safetensors
"$CLLA" train --config c.json --out r6b --quiet --resume auto 2> r6b.err
rc=$?
last=$(tail -n 1 r6b.err)
if [ "$rc" -eq 1 ] && echo "$last" | grep -q "$WORK/r6b/model.safetensors.*the last good checkpoint is $WORK/r6b/checkpoints/step_00000006"; then
    ok "(6) the final model cannot be written: $last"
else
    fail "(6) final model write failure: exit $rc: $last"
fi

# ---------------------------------------------------------------- shards of two tokenizers
if "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out a.tok "$SRC/tests/fixtures/english.jsonl" > tok.log 2>&1 &&
   "$CLLA" prep --tokenizer a.tok --out sa --chunk-tokens 512 --val-fraction 0.2 "$SRC/tests/fixtures/english.jsonl" > prep.log 2>&1 &&
   "$CLLA" tokenizer train --vocab-size 280 --pattern gpt2 --out b.tok "$SRC/tests/fixtures/english.jsonl" > tok.log 2>&1 &&
   "$CLLA" prep --tokenizer b.tok --out sb --chunk-tokens 512 --val-fraction 0.2 "$SRC/tests/fixtures/english.jsonl" > prep.log 2>&1; then
    SHARDS=1
else
    SHARDS=0
    fail "(7, 9, 10) cannot make shards: $(tail -n 2 tok.log prep.log | tr '\n' ' ')"
fi
SMODEL='"attention": "gqa", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64'

# one train.metrics for two runs, the second started while the first resumes: the resume checks
# the file free, then (held here by strace at its checkpoint's weights) cut it back by writing a
# copy and renaming it over the file, without its lock, so the run that had locked and was
# writing it meanwhile lost its records. Now the resume locks the file before it cuts it, and is
# refused; the other run's records stay whole.
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    M=$WORK/shared_metrics.jsonl
    "$CLLA" train --config c20.json --out rmb --quiet --save-every 5 --stop-at 5 --set train.metrics="$M" 2> /dev/null
    strace -f -qq -o /dev/null -P "$WORK/rmb/checkpoints/step_00000005/model.safetensors" -e trace=openat \
        -e inject=openat:delay_enter=3000000:when=3 "$CLLA" train --config c20.json --out rmb --resume auto --quiet \
        --set train.metrics="$M" > rmb.err 2>&1 &
    bpid=$!
    sleep 1   # A starts after B's check, and runs until B has ended (then a SIGTERM stops it)
    "$CLLA" train --config c20.json --out rma --overwrite --quiet --set train.metrics="$M" --set train.max_steps=1000000 > rma.err 2>&1 &
    apid=$!
    wait "$bpid"
    brc=$?
    kill -TERM "$apid" 2> /dev/null
    wait "$apid"
    arc=$?
    n=$(grep -c '"step"' "$M")
    steps=$(grep -o '"step":[0-9]*' "$M" | cut -d: -f2 | tr '\n' ' ')
    if [ "$arc" -eq 0 ] && [ "$brc" -ne 0 ] && grep -q "is being written by another training" rmb.err && [ "$n" -gt 5 ] &&
       [ "$steps" = "$(seq -s ' ' 1 "$n") " ]; then
        ok "(6) a resume cutting back a train.metrics that another run has locked meanwhile is refused; the other's $n records whole"
    else
        fail "(6) one train.metrics, two runs: rc $arc / $brc, steps ${steps:0:80}..., $(tail -n 1 rmb.err) | $(tail -n 1 rma.err)"
    fi
else
    echo "skip (6) one train.metrics for two runs: strace is missing or not allowed here (apt-get install strace)"
fi

# the metrics file's last records fail to reach the disk at its end (an NFS server's delayed write
# error; here strace fails its fsync): the run fails saying so, where it warned and exited 0
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    mkdir -p r6e
    strace -o /dev/null -P "$WORK/r6e/metrics.jsonl" -e trace=fsync -e inject=fsync:error=EIO \
        "$CLLA" train --config c.json --out r6e --quiet 2> r6e.err
    rc=$?
    [ "$rc" -eq 1 ] && [ "$(grep -c error r6e.err)" -eq 1 ] && grep -q "metrics file '.*r6e/metrics.jsonl' failed at its end" r6e.err &&
        ok "(6) the metrics file failing at its end fails the run: $(grep error r6e.err)" ||
        fail "(6) metrics fsync failure at the end: rc $rc: $(tail -n 2 r6e.err | tr '\n' ' ')"
else
    echo "skip (6) the metrics file failing at its end: strace is missing or not allowed here (apt-get install strace)"
fi

# ---------------------------------------------------------------- (7) a damaged data chunk mid-run
if [ "$SHARDS" -eq 1 ]; then
    mkdir -p bad && cp sa/train/shard_000000.bin bad/
    size=$(stat -c %s bad/shard_000000.bin)
    printf '\xff\xff\xff\xff' | dd of=bad/shard_000000.bin bs=1 seek=$((size / 2)) conv=notrunc 2> /dev/null
    cat > bad.json <<EOF
{$SMODEL, "train": {"data": "bad", "max_steps": 5000, "micro_batch": 2, $TRAIN}}
EOF
    "$CLLA" train --config bad.json --out r7 --quiet --save-every 1000 2> r7.err
    rc=$?
    last=$(tail -n 1 r7.err)
    ck=$(echo "$last" | grep -o 'saved as [^:]*' | sed 's/^saved as //')   # (a path may hold spaces)
    st=$(echo "$last" | grep -o '^clla: error: step [0-9]*' | grep -o '[0-9]*$')
    if [ "$rc" -eq 1 ] && [ -n "$ck" ] && [ -d "$ck" ] && [ "$ck" = "$WORK/r7/checkpoints/$(printf 'step_%08d' $((st - 1)))" ] && [ "$st" -gt 1 ]; then
        ok "(7) damaged chunk at step $st: $last"
    else
        fail "(7) damaged chunk: exit $rc: $last | $(ls r7/checkpoints 2>&1 | tr '\n' ' ')"
    fi
    # damaged validation data: validation at step 2 fails, and the state after step 2 is kept
    "$CLLA" train --config bad.json --out r7b --quiet --set train.data=sa/train --set train.val_data=bad \
        --set train.val_every=2 --set train.val_batches=1000 2> r7b.err
    rc=$?
    last=$(tail -n 1 r7b.err)
    if [ "$rc" -eq 1 ] && echo "$last" | grep -q "step 2: validation: .*saved as $WORK/r7b/checkpoints/step_00000002" && [ -d r7b/checkpoints/step_00000002 ]; then
        ok "(7) damaged validation data: $last"
    else
        fail "(7) damaged validation data: exit $rc: $last"
    fi
fi

# ---------------------------------------------------------------- (8) non-finite loss
"$CLLA" train --config c.json --out r8 --quiet --save-every 1 --set train.lr=1e30 --set train.min_lr=0 --set train.warmup_steps=0 2> r8.err
rc=$?
last=$(tail -n 1 r8.err)
if [ "$rc" -eq 1 ] && echo "$last" | grep -q "step 2: the loss or gradient norm is not finite.*no checkpoint is safe" &&
   [ ! -e r8/model.safetensors ] && [ "$(wc -l < r8/metrics.jsonl)" -eq 2 ] && ! grep -qi nan r8/metrics.jsonl; then
    ok "(8) NaN at step 2 stops at once: $last"
else
    fail "(8) NaN at step 2: exit $rc: $last ($(wc -l < r8/metrics.jsonl) metrics lines)"
fi
# no checkpoint yet when it diverged: --save-every is advised only when it is off
"$CLLA" train --config c.json --out r8s --quiet --save-every 5 --set train.lr=1e30 --set train.min_lr=0 --set train.warmup_steps=0 2> r8s.err
"$CLLA" train --config c.json --out r8n --quiet --set train.lr=1e30 --set train.min_lr=0 --set train.warmup_steps=0 2> r8n.err
grep -q "no checkpoint was saved before it: start over with a lower train.lr (--overwrite)$" r8s.err &&
    grep -q "no checkpoint was saved before it: .*, and set --save-every to keep checkpoints" r8n.err &&
    ok "(8) --save-every advised only when it is off: $(tail -n 1 r8s.err | cut -c1-60)..." || fail "(8) --save-every advice: $(tail -n 1 r8s.err) | $(tail -n 1 r8n.err)"
"$CLLA" train --config c.json --out r8b --quiet --save-every 2 --stop-at 4 2> /dev/null
"$CLLA" train --config c.json --out r8b --quiet --save-every 1 --resume auto --set train.lr=1e30 --set train.min_lr=0 2> r8b.err
last=$(tail -n 1 r8b.err)
echo "$last" | grep -q "step 6: .*not finite.*the newest checkpoint saved before the loss went non-finite is $WORK/r8b/checkpoints/step_00000004" &&
    ok "(8) the advice names the checkpoint before the divergence: $last" || fail "(8) advice: $last"
# a resume whose very next step diverges: the run knows nothing of the checkpoints before the one
# it resumed, so the advice points to them, never to --overwrite (which would delete them)
"$CLLA" train --config c.json --out r8c --quiet --save-every 1 --stop-at 3 2> /dev/null
"$CLLA" train --config c.json --out r8c --quiet --save-every 1 --stop-at 4 --resume auto --set train.lr=1e30 --set train.min_lr=0 2> /dev/null
"$CLLA" train --config c.json --out r8c --quiet --save-every 1 --resume auto --set train.lr=1e30 --set train.min_lr=0 2> r8c.err
last=$(tail -n 1 r8c.err)
echo "$last" | grep -q "step 5: .*not finite.*no checkpoint saved since the resume from $WORK/r8c/checkpoints/step_00000004 .*one saved before" &&
    ! echo "$last" | grep -q -- "--overwrite" && [ -d r8c/checkpoints/step_00000003 ] &&
    ok "(8) diverging right after a resume: the advice points before it, not to --overwrite: $last" || fail "(8) after a resume: $last"
# a checkpoint past train.max_steps: refused (a run does not go back), not "nothing to do" with no final model
"$CLLA" train --config c.json --out r8d --quiet --save-every 2 --stop-at 4 2> /dev/null
if "$CLLA" train --config c.json --out r8d --quiet --resume auto --set train.max_steps=3 2> r8d.err; then fail "(8) resume past max_steps: exit 0"
else grep -q "step_00000004 is at step 4, past train.max_steps 3" r8d.err && ok "(8) resume past train.max_steps: $(tail -n 1 r8d.err)" ||
    fail "(8) resume past max_steps: $(cat r8d.err)"; fi
"$CLLA" eval --checkpoint r8b/checkpoints/step_00000005 --data tok.bin --json --max-batches 2 > ev8.json 2> ev8.err
rc=$?
if [ "$rc" -eq 1 ] && grep -q '"loss":null' ev8.json && ! grep -qi nan ev8.json; then
    ok "(8) eval --json of diverged weights: $(cat ev8.json), exit 1"
else
    fail "(8) eval of diverged weights: exit $rc: $(cat ev8.json) $(cat ev8.err)"
fi

# ---------------------------------------------------------------- (9) tokenizer hash
if [ "$SHARDS" -eq 1 ]; then
    cat > sa.json <<EOF
{$SMODEL, "train": {"data": "sa/train", "max_steps": 3, "micro_batch": 2, $TRAIN}}
EOF
    "$CLLA" train --config sa.json --out r9 --quiet 2> r9.err || fail "(9) run on shards failed: $(tail -n 1 r9.err)"
    grep -q '"tokenizer_hash":[[:space:]]*"[0-9a-f]\{16\}"' r9/config.json && ok "(9) the run records its data's tokenizer hash" ||
        fail "(9) no tokenizer_hash in r9/config.json"
    expect_error "(9) eval on another tokenizer's shards" "tokenizer" -- "$CLLA" eval --checkpoint r9 --data sb/val
    expect_error "(9) init_from on another tokenizer's shards" "tokenizer" -- \
        "$CLLA" train --config sa.json --out r9b --quiet --set train.init_from=r9/model.safetensors --set train.data=sb/train
    "$CLLA" eval --checkpoint r9 --data sa/val --json > /dev/null 2> ev9.err && ok "(9) eval on the run's own tokenizer's shards works" ||
        fail "(9) eval on sa/val: $(cat ev9.err)"
fi

# ---------------------------------------------------------------- (10) one evaluation
if [ "$SHARDS" -eq 1 ]; then
    cat > val.json <<EOF
{$SMODEL, "train": {"data": "sa/train", "val_data": "sa/val", "val_batches": 3, "max_steps": 4, "micro_batch": 2, $TRAIN}}
EOF
    "$CLLA" train --config val.json --out r10 --quiet 2> r10.err || fail "(10) run failed: $(tail -n 1 r10.err)"
    vl=$(tail -n 1 r10/metrics.jsonl | grep -o '"val_loss":[^,}]*' | cut -d: -f2)
    el=$("$CLLA" eval --checkpoint r10 --data sa/val --max-batches 3 --json 2> ev10.err | grep -o '"loss":[^,}]*' | cut -d: -f2)
    if [ -n "$vl" ] && [ -n "$el" ] && awk -v a="$vl" -v b="$el" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'; then
        ok "(10) validation $vl == eval $el (same windows)"
    else
        fail "(10) validation '$vl' vs eval '$el': $(cat ev10.err)"
    fi
fi
# smaller than one batch: 2 windows of T+1 = 33 tokens, batch 4
write_tokens tiny_val.bin 70 99
cat > pv.json <<EOF
{$MODEL, "train": {"data": "tok.bin", "val_data": "tiny_val.bin", "max_steps": 2, "micro_batch": 4, $TRAIN}}
EOF
if "$CLLA" train --config pv.json --out r10b --quiet 2> r10b.err; then
    vl=$(tail -n 1 r10b/metrics.jsonl | grep -o '"val_loss":[^,}]*' | cut -d: -f2)
    ev=$("$CLLA" eval --checkpoint r10b --data tiny_val.bin --json 2> ev10b.err)
    el=$(echo "$ev" | grep -o '"loss":[^,}]*' | cut -d: -f2)
    if echo "$ev" | grep -q '"windows":2' && [ -n "$vl" ] && awk -v a="$vl" -v b="$el" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'; then
        ok "(10) data smaller than a batch: validation $vl, eval $ev"
    else
        fail "(10) partial batch: validation '$vl', eval '$ev' $(cat ev10b.err)"
    fi
else
    fail "(10) training with validation data smaller than a batch: $(tail -n 1 r10b.err)"
fi

# ---------------------------------------------------------------- (11) launch/resume_until_done.sh
RUD="$SRC/launch/resume_until_done.sh"
# a finished run continued to more steps is not "finished" because its earlier end's model is
# there: the script runs it to the new end
"$CLLA" train --config c.json --out r11 --quiet 2> /dev/null
out=$(CLLA_RETRY_SLEEP=0 bash "$RUD" r11 "$CLLA" train --config c.json --out r11 --quiet --set train.max_steps=9 2>&1)
[ $? -eq 0 ] && [ "$(steps_of r11/metrics.jsonl)" = "1 2 3 4 5 6 7 8 9 " ] && echo "$out" | grep -q "finished after 1 attempt" &&
    ok "(11) resume_until_done continues a finished run to its new max_steps" || fail "(11) continue a finished run: $(echo "$out" | tail -n 2 | tr '\n' '|')"
out=$(CLLA_RETRY_SLEEP=0 bash "$RUD" r11 "$CLLA" train --config c.json --out r11 --quiet --set train.max_steps=9 2>&1)
[ $? -eq 0 ] && echo "$out" | grep -q "finished after 1 attempt" && ok "(11) and says a finished run is finished" ||
    fail "(11) rerun on a finished run: $(echo "$out" | tail -n 2 | tr '\n' '|')"
# SIGINT and SIGTERM to the script (a Ctrl-C, a scheduler): the training saves and stops, and the
# script stops too instead of restarting it (the signals are restored to their defaults first: a
# background job of a script starts with SIGINT ignored)
for sig in INT TERM; do
    python3 - "$sig" "$RUD" "$CLLA" "$WORK" > rud_$sig.out 2>&1 <<'PYEOF'
import os, signal, subprocess, sys, time
sig, rud, clla, work = sys.argv[1:]
env = dict(os.environ, CLLA_RETRY_SLEEP="0")
p = subprocess.Popen(["bash", rud, work + "/r11s" + sig, clla, "train", "--config", work + "/long.json", "--out", work + "/r11s" + sig,
                      "--quiet", "--save-every", "1000"], env=env, preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL),
                                                                                       signal.signal(signal.SIGTERM, signal.SIG_DFL)))
metrics = work + "/r11s" + sig + "/metrics.jsonl"
for _ in range(400):
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0: break
    time.sleep(0.05)
p.send_signal(getattr(signal, "SIG" + sig))
try:
    rc = p.wait(timeout=60)
except subprocess.TimeoutExpired:
    p.kill(); rc = "hung"
print("rc", rc)
PYEOF
    want=130; [ "$sig" = TERM ] && want=143
    if grep -q "^rc $want$" rud_$sig.out && grep -q "SIG$sig: stopped after attempt 1" rud_$sig.out && ! grep -q "attempt 2" rud_$sig.out &&
       ls r11s$sig/checkpoints/step_* > /dev/null 2>&1; then
        ok "(11) SIG$sig to resume_until_done: the run saves a checkpoint, the script exits $want without restarting"
    else
        fail "(11) SIG$sig to resume_until_done: $(tr '\n' '|' < rud_$sig.out | tail -c 400)"
    fi
done

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
