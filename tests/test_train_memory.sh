#!/usr/bin/env bash
# The training memory plan holds (docs/CHECKPOINTS.md, "Memory"): the peak resident memory of a
# training on the CPU, of a resume from a checkpoint, of its checkpoint saves and of its final
# model's save stays within `clla info`'s training memory plus half a weight table and 32 MiB
# for the process itself, with gradient accumulation too. A whole fp32 table more (a host copy of the masters or of a moment,
# which the loads and saves used to take) fails it: with the test's model a table is a quarter
# of the plan. The peak is getrusage's ru_maxrss of the finished child (python3's resource).
# Needs CLLA (the binary); ctest sets it. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_train_memory

write_tokens tok.bin 4000 12345 256   # ids < 256 of the 8192: the memory does not depend on them
cat > c.json <<'EOF'
{"attention": "gqa", "vocab_size": 8192, "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
 "num_key_value_heads": 8, "intermediate_size": 1408, "max_position_embeddings": 64,
 "train": {"data": "tok.bin", "max_steps": 3, "micro_batch": 1, "seq_len": 16, "threads": 2, "log_every": 1000}}
EOF
"$CLLA" info --config c.json --json > info.json || { fail "clla info"; echo "$PASS passed, $FAIL failed"; exit 1; }
read -r plan table < <(python3 -c "import json; m = json.load(open('info.json'))['train_memory_bytes']; print(m['total'], m['params'])")

limit=$((plan + table / 2 + 32 * 1024 * 1024))
for what in "a training to its checkpoint at step 2|train --config c.json --out r --quiet --stop-at 2" \
            "a resume from it to the end and the final model|train --config c.json --out r --quiet --resume auto" \
            "a resume at max_steps (the checkpoint loaded, nothing to do)|train --config c.json --out r --quiet --resume auto"; do
    name=${what%%|*}
    # shellcheck disable=SC2086
    read -r rc bytes < <(peak ${what#*|})
    if [ "$rc" -eq 0 ] && [ "$bytes" -le "$limit" ]; then
        ok "$name: peak $((bytes / 1048576)) MiB, plan $((plan / 1048576)) MiB (limit $((limit / 1048576)))"
    else
        fail "$name: exit $rc, peak $((bytes / 1048576)) MiB over the limit $((limit / 1048576)) MiB (plan $((plan / 1048576)), a table $((table / 1048576))): $(tail -n 1 peak.err)"
    fi
done
# gradient accumulation: 8 micro-steps a step (train.global_batch_tokens), which the CPU trainer
# sums in a tree holding 3 more fp32 gradient tables; the plan counts them (it left them out:
# a peak 3 tables over it, accepted by the pre-run check)
acc=(--set train.global_batch_tokens=128)
"$CLLA" info --config c.json "${acc[@]}" --json > info8.json || fail "clla info, 8 micro-steps"
read -r plan8 tree8 grads8 < <(python3 -c "import json; m = json.load(open('info8.json'))['train_memory_bytes']; print(m['total'], m['grad_accumulation'], m['grads'])")
limit8=$((plan8 + table / 2 + 32 * 1024 * 1024))
read -r rc bytes < <(peak train --config c.json --out r8 --quiet "${acc[@]}")
if [ "$rc" -eq 0 ] && [ "$bytes" -le "$limit8" ] && [ "$tree8" = "$((3 * grads8))" ]; then
    ok "8 micro-steps: peak $((bytes / 1048576)) MiB within the plan $((plan8 / 1048576)) MiB, its gradient tree 3 tables, $((tree8 / 1048576)) MiB (limit $((limit8 / 1048576)))"
else
    fail "8 micro-steps: exit $rc, peak $((bytes / 1048576)) MiB, limit $((limit8 / 1048576)) MiB (plan $((plan8 / 1048576)), its tree $tree8 bytes, want 3 x $grads8): $(tail -n 1 peak.err)"
fi
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
