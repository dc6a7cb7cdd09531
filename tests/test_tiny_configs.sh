#!/usr/bin/env bash
# configs/tiny/* run as docs/QUICKSTART.md says (issue 12): every tiny config has the vocab size
# of the quickstart's tokenizer (scripts/quickstart.sh) and passes `clla info`; the quickstart's
# tokenizer and shards are made with the commands of scripts/quickstart.sh (on the test
# fixtures' corpus, for time), and the documented tiny command line, taken from
# docs/QUICKSTART.md, trains a few steps on them and the model evaluates.
# Needs CLLA (the binary) and SRC (the source tree); ctest sets both.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
SRC=$(cd "$SRC" && pwd)
. "$(dirname "$0")/lib/check.sh" test_tiny

qvocab=$(grep -o 'tokenizer train --vocab-size [0-9]*' "$SRC/scripts/quickstart.sh" | grep -o '[0-9]*$')
[ -n "$qvocab" ] || { fail "cannot read the quickstart's --vocab-size from scripts/quickstart.sh"; echo "$PASS passed, $FAIL failed"; exit 1; }
bad=()
for c in "$SRC"/configs/tiny/*.json; do
    v=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$c")
    [ "$v" = "$qvocab" ] || bad+=("$(basename "$c"):$v")
    "$CLLA" info --config "$c" > /dev/null 2> info.err || bad+=("$(basename "$c"):info failed: $(head -c 200 info.err)")
done
[ ${#bad[@]} -eq 0 ] && ok "every configs/tiny/*.json has vocab_size $qvocab (the quickstart tokenizer's) and passes clla info" ||
    fail "configs/tiny vocab_size != $qvocab or info fails: ${bad[*]}"

# the quickstart's data, by the commands of scripts/quickstart.sh, on the fixture corpus
Q=$WORK/data_cache/quickstart
mkdir -p "$Q"
if "$CLLA" tokenizer train --vocab-size "$qvocab" --pattern gpt2 --out "$Q/tokenizer.tok" "$SRC/tests/fixtures/english.jsonl" > tok.log 2>&1 &&
   "$CLLA" prep --tokenizer "$Q/tokenizer.tok" --out "$Q/shards" "$SRC/tests/fixtures/english.jsonl" > prep.log 2>&1; then
    ok "the quickstart's tokenizer and shards (scripts/quickstart.sh's commands)"
else cat tok.log prep.log > data.log; fail "making the quickstart's data" data.log; fi

line=$(grep -m1 '^build/clla train --config configs/tiny/gqa.json' "$SRC/docs/QUICKSTART.md")
if [ -z "$line" ]; then
    fail "docs/QUICKSTART.md has no 'build/clla train --config configs/tiny/gqa.json' line"
else
    # run from a copy of the layout the docs assume (configs/ beside data_cache/), a few steps
    mkdir -p configs && cp -r "$SRC/configs/tiny" configs/
    cmd=${line/#build\/clla/\"\$CLLA\"}
    if eval "$cmd --quiet --set train.max_steps=3 --set train.warmup_steps=1 --set train.val_every=3 --set train.val_batches=1" > run.log 2>&1 &&
       [ -s runs/tiny_gqa/model.safetensors ] && [ "$(wc -l < runs/tiny_gqa/metrics.jsonl)" -ge 3 ] &&
       "$CLLA" eval --checkpoint runs/tiny_gqa --data data_cache/quickstart/shards/val --max-batches 1 --json > eval.log 2>&1; then
        ok "the documented tiny command trains 3 steps on the quickstart's shards and the model evaluates: $(cat eval.log)"
    else cat eval.log >> run.log 2> /dev/null; fail "the documented tiny command: $line" run.log; fi
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
