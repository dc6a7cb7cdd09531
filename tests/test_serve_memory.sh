#!/usr/bin/env bash
# Serving holds one copy of the logits (docs/INFERENCE.md, "Memory"): on a model whose
# activations are nearly all logits (vocabulary 32768, hidden size 64, one layer), the peak
# resident memory of `clla generate` over 4 prompts of L tokens, and of `clla eval
# --through-cache` over 4 windows of L tokens, exceeds that of the same command on a few tokens by
# at most 1.4 x the forward's logits (4 x L x V floats) plus 16 MiB. A host copy of every row's
# logits beside the forward's own (which generate's prefill and eval's full pass took) is a
# second 1.0 x and fails it; the copies the commands keep are a row per prompt, or 256 rows of a window.
# The peak is getrusage's ru_maxrss of the finished child (peak in tests/lib/check.sh).
# Needs CLLA (the binary) and SRC; ctest sets them. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_serve_memory

V=32768
L=400
write_tokens tok.bin 3000 777 256
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 ||
    { fail "tokenizer train" setup.log; echo "$PASS passed, $FAIL failed"; exit 1; }
cat > c.json <<EOF
{"attention": "mha", "vocab_size": $V, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
 "num_key_value_heads": 4, "intermediate_size": 128, "max_position_embeddings": 512,
 "train": {"data": "tok.bin", "tokenizer": "$WORK/tok.tok", "max_steps": 1, "micro_batch": 1, "seq_len": 16,
           "threads": 2, "log_every": 1000}}
EOF
"$CLLA" train --config c.json --out run --quiet >> setup.log 2>&1 || { fail "train the model" setup.log; echo "$PASS passed, $FAIL failed"; exit 1; }

# a prompt of exactly L tokens: the first L ids of a long text, decoded back to text, re-encoded
for _ in $(seq 200); do printf 'the cat sat on the mat and then it ran away. '; done > long.txt
ids=$("$CLLA" tokenizer encode --tokenizer tok.tok --file long.txt | tr ' ' '\n' | head -n "$L" | tr '\n' ' ')
# shellcheck disable=SC2086
"$CLLA" tokenizer decode --tokenizer tok.tok $ids > prompt.txt
n=$("$CLLA" tokenizer encode --tokenizer tok.tok --file prompt.txt | wc -w)
[ "$n" -eq "$L" ] || fail "the prompt is $n tokens, not $L"
prompt=$(cat prompt.txt)

logits=$((4 * L * V * 4))
limit=$((logits * 14 / 10 + 16 * 1048576))
# within NAME SHORT_ARGS -- LONG_ARGS: the long run's peak over the short one's is within the limit
within() {
    local name=$1
    shift
    if peak_growth "$limit" "$@"; then
        ok "$name: peak grew $((GREW / 1048576)) MiB for $((logits / 1048576)) MiB of logits (limit $((limit / 1048576)))"
    else
        fail "$name: exits $RCS, peak grew $((GREW / 1048576)) MiB for $((logits / 1048576)) MiB of logits, over the limit $((limit / 1048576)) MiB: $(tail -n 1 peak.err)"
    fi
}
within "generate, 4 prompts of $L tokens" \
    generate --model run --max-new-tokens 2 --prompt the --prompt the --prompt the --prompt the -- \
    generate --model run --max-new-tokens 2 --prompt "$prompt" --prompt "$prompt" --prompt "$prompt" --prompt "$prompt"
within "eval --through-cache, 4 windows of $L tokens" \
    eval --checkpoint run --data tok.bin --through-cache --batch 4 --seq 4 --max-batches 1 -- \
    eval --checkpoint run --data tok.bin --through-cache --batch 4 --seq "$L" --max-batches 1
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
