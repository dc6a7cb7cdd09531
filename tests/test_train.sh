#!/usr/bin/env bash
# End-to-end checks of `clla train` through the binary, as a user runs it:
#  (a) a tiny model overfits one batch (final loss < 0.1);
#  (b) two CPU runs with the same seed and thread count are bitwise identical
#      (every loss in metrics.jsonl as printed, and the model.safetensors bytes);
#  (c) bad input fails with a non-zero status, one line on stderr naming the problem,
#      and no output directory left behind;
#  (d) `clla <cmd> --help` exits 0 for every command `clla --help` lists.
# Needs CLLA (the binary); ctest sets it. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"

. "$(dirname "$0")/lib/check.sh" test_train

# Little-endian uint32 token file from a list of ids (< 256), without python: the
# suite must not depend on anything but bash and the binary.
write_tokens() {   # write_tokens FILE id...
    local f=$1; shift
    : > "$f"
    local id
    for id in "$@"; do printf "\\x$(printf %02x "$id")\\x00\\x00\\x00" >> "$f"; done
}

# One batch worth of tokens (B*T+1 = 2*32+1): the plain loader wraps to the start every
# step, so training sees the same batch over and over. Ids from a fixed LCG, all < 64.
ids=()
x=12345
for _ in $(seq 65); do x=$(( (x * 1103515245 + 12345) % 2147483648 )); ids+=( $(( (x >> 16) % 64 )) ); done
write_tokens tok.bin "${ids[@]}"

# A tiny GQA model; weight decay off and a high lr so 150 steps memorize the batch.
write_config() {   # write_config FILE [extra model keys as JSON fragment ending with a comma]
    cat > "$1" <<EOF
{
  "attention": "gqa",
  ${2:-}
  "vocab_size": 64,
  "hidden_size": 32,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "intermediate_size": 64,
  "max_position_embeddings": 64,
  "train": {"data": "tok.bin", "seq_len": 32, "micro_batch": 2, "max_steps": 150,
            "warmup_steps": 5, "lr": 1e-2, "min_lr": 1e-3, "weight_decay": 0.0,
            "seed": 7, "threads": 2, "log_every": 50}
}
EOF
}
write_config tiny.json

last_loss() { tail -n 1 "$1" | grep -o '"loss":[^,}]*' | cut -d: -f2; }

# ---------------------------------------------------------------- (a) overfit one batch
if "$CLLA" train --config tiny.json --out run_a --quiet 2> a.err; then
    loss=$(last_loss run_a/metrics.jsonl)
    steps=$(wc -l < run_a/metrics.jsonl)
    if [ "$steps" -eq 150 ] && awk -v l="$loss" 'BEGIN { exit !(l < 0.1) }'; then
        ok "overfit: final loss $loss < 0.1 after $steps steps"
    else
        fail "overfit: final loss '$loss' after $steps steps (want < 0.1 after 150)"
    fi
    for f in config.json model.safetensors metrics.jsonl; do
        [ -s "run_a/$f" ] || fail "overfit: run_a/$f missing or empty"
    done
    grep -q '^loss curve:' a.err && ok "train prints its loss curve summary" || fail "no 'loss curve:' line on stderr"
else
    fail "overfit: clla train exited $?: $(tail -n 3 a.err)"
fi

# ---------------------------------------------------------------- (b) determinism
# Fewer steps than (a) but enough that any reduction-order difference would show.
for r in 1 2; do
    "$CLLA" train --config tiny.json --out "run_b$r" --quiet --set train.max_steps=40 2> "b$r.err" \
        || fail "determinism: run $r exited non-zero: $(tail -n 1 "b$r.err")"
done
grep -o '"loss":[^,}]*' run_b1/metrics.jsonl > b1.loss
grep -o '"loss":[^,}]*' run_b2/metrics.jsonl > b2.loss
if [ "$(wc -l < b1.loss)" -eq 40 ] && cmp -s b1.loss b2.loss; then
    ok "determinism: 40 losses identical as printed"
else
    fail "determinism: losses differ or are missing: $(diff b1.loss b2.loss | head -n 4 | tr '\n' ' ')"
fi
if cmp -s run_b1/model.safetensors run_b2/model.safetensors; then
    ok "determinism: model.safetensors bytes identical"
else
    fail "determinism: model.safetensors differs between the two runs"
fi
# and a different seed must change something, or the check above proves nothing
"$CLLA" train --config tiny.json --out run_b3 --quiet --set train.max_steps=40 --set train.seed=8 2> /dev/null
if cmp -s run_b1/model.safetensors run_b3/model.safetensors; then
    fail "determinism: another seed gave the same weights (is the seed used?)"
else
    ok "determinism: another seed gives other weights"
fi

# ---------------------------------------------------------------- (c) bad input
# expect_error NAME KEYWORD OUTDIR -- clla args...: non-zero exit, exactly one stderr line,
# containing KEYWORD (case-insensitive), and OUTDIR not created (nothing half-written).
expect_error() {
    local name=$1 keyword=$2 outdir=$3
    shift 4
    "$@" > out.txt 2> err.txt
    local rc=$?
    local lines
    lines=$(grep -c . err.txt)
    if [ "$rc" -eq 0 ]; then
        fail "$name: exited 0"
    elif [ "$lines" -ne 1 ]; then
        fail "$name: $lines lines on stderr, want 1: $(head -c 300 err.txt | tr '\n' '|')"
    elif ! grep -qi -- "$keyword" err.txt; then
        fail "$name: stderr does not mention '$keyword': $(cat err.txt)"
    elif [ -n "$outdir" ] && [ -e "$outdir" ]; then
        fail "$name: left '$outdir' behind"
    elif ls ./*.tmp.* > /dev/null 2>&1; then
        fail "$name: left a temporary file behind: $(ls ./*.tmp.*)"
    else
        ok "$name (exit $rc): $(cat err.txt)"
    fi
}

# A config file without vocab_size: drop the line from the good one.
grep -v '"vocab_size"' tiny.json > novocab.json
expect_error "missing config key" vocab_size bad1 -- "$CLLA" train --config novocab.json --out bad1
write_config unknown.json '"hidden_sise": 32,'
expect_error "unknown config key" hidden_sise bad2 -- "$CLLA" train --config unknown.json --out bad2
expect_error "unknown train key" train.bogus bad3 -- "$CLLA" train --config tiny.json --out bad3 --set train.bogus=1
expect_error "heads do not divide" num_key_value_heads bad4 -- "$CLLA" train --config tiny.json --out bad4 --set num_key_value_heads=3
expect_error "vocab smaller than the data" vocab_size bad5 -- "$CLLA" train --config tiny.json --out bad5 --set vocab_size=10
expect_error "missing data file" nothere.bin bad6 -- "$CLLA" train --config tiny.json --out bad6 --set train.data=nothere.bin
expect_error "missing config file" nothere.json bad7 -- "$CLLA" train --config nothere.json --out bad7
expect_error "--set without '='" "key=value" bad8 -- "$CLLA" train --config tiny.json --out bad8 --set hidden_size
expect_error "--set with a wrong type" hidden_size bad9 -- "$CLLA" train --config tiny.json --out bad9 --set hidden_size=abc
expect_error "unknown option" "--bogus" bad10 -- "$CLLA" train --config tiny.json --out bad10 --bogus
expect_error "train without --config" "--config" "" -- "$CLLA" train
expect_error "unknown command" frobnicate "" -- "$CLLA" frobnicate
expect_error "eval: missing checkpoint" nothere_ckpt "" -- "$CLLA" eval --checkpoint nothere_ckpt --data tok.bin
expect_error "eval: missing data file" nothere.bin "" -- "$CLLA" eval --checkpoint run_a --data nothere.bin
expect_error "info: heads do not divide" num_key_value_heads "" -- "$CLLA" info --config tiny.json --set num_key_value_heads=3

# ---------------------------------------------------------------- (d) --help everywhere
# The command list is read from `clla --help` so a new subcommand is covered automatically.
if "$CLLA" --help > help.txt; then
    cmds=$(awk '/^commands:/ { on = 1; next } on && NF { print $1 }' help.txt)
    [ -n "$cmds" ] || fail "clla --help lists no commands"
    for c in $cmds; do
        if "$CLLA" "$c" --help > h.txt 2> h.err && grep -q . h.txt; then
            ok "clla $c --help"
        else
            fail "clla $c --help: exit non-zero or no output: $(head -c 200 h.err)"
        fi
    done
else
    fail "clla --help exited non-zero"
fi

# ---------------------------------------------------------------- eval on the overfit model
# The batch the model memorized: eval must agree with training's final loss in magnitude.
if [ -d run_a ] && "$CLLA" eval --checkpoint run_a --data tok.bin --json > ev.json 2> ev.err; then
    ev=$(grep -o '"loss":[^,}]*' ev.json | cut -d: -f2)
    if awk -v l="$ev" 'BEGIN { exit !(l < 0.1) }'; then ok "eval of the overfit model: loss $ev"
    else fail "eval of the overfit model: loss '$ev' (want < 0.1)"; fi
else
    fail "eval on run_a failed: $(cat ev.err 2>/dev/null | tail -n 1)"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
