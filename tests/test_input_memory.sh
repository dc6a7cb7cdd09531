#!/usr/bin/env bash
# Commands stream their inputs (docs/FORMAT.md, "Plain token file"; docs/INFERENCE.md, "Memory"):
# the peak resident memory of a run does not grow with the size of what it reads. Each case runs
# the same command on a small and on a large input and allows the large one a fixed margin:
#   - train and eval --data on a plain token file of 64 MiB: 8 MiB more (the loader reads each
#     batch at its cursor; a loader holding the file takes 64 MiB more);
#   - eval --ppl on a .bin of 16 MiB: 18 MiB more (one copy of the ids; the file and a converted
#     copy of it take 32 MiB more);
#   - generate --prompts over 6000 prompts with --max-new-tokens 4000 that stop at their first
#     tokens (a model trained on nothing but <|endoftext|>): 8 MiB more than over 64 prompts, one
#     --batch of them (what a finished prompt held is freed; a generation buffer per prompt
#     allocated at the start and kept to the end took 28 MiB more, at 0150969).
# The peak is getrusage's ru_maxrss of the finished child (peak in tests/lib/check.sh).
# Needs CLLA (the binary) and SRC; ctest sets them. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_input_memory

MiB=1048576
# grows NAME MARGIN_MIB SMALL_ARGS -- LARGE_ARGS: both exit 0 and the large run's peak is within
# MARGIN_MIB of the small run's
grows() {
    local name=$1 margin=$2
    shift 2
    if peak_growth $((margin * MiB)) "$@"; then ok "$name: peak grew $((GREW / MiB)) MiB (limit $margin)"
    else fail "$name: exits $RCS, peak grew $((GREW / MiB)) MiB, over the limit $margin MiB: $(tail -n 1 peak.err)"; fi
}

head -c 40000 /dev/zero > small.bin
head -c $((64 * MiB)) /dev/zero > big.bin
head -c $((16 * MiB)) /dev/zero > mid.bin
cat > c.json <<EOF
{"attention": "mha", "vocab_size": 256, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 2, "intermediate_size": 32, "max_position_embeddings": 64,
 "train": {"data": "small.bin", "max_steps": 2, "micro_batch": 2, "seq_len": 16, "threads": 1, "log_every": 1000}}
EOF
grows "train on a plain token file of 64 MiB" 8 \
    train --config c.json --out run_small --quiet -- \
    train --config c.json --out run_big --quiet --set train.data=big.bin
grows "eval --data on a plain token file of 64 MiB" 8 \
    eval --checkpoint run_small --data small.bin --batch 1 --seq 16 --max-batches 2 -- \
    eval --checkpoint run_small --data big.bin --batch 1 --seq 16 --max-batches 2
grows "eval --ppl on a token file of 16 MiB" 18 \
    eval --checkpoint run_small --ppl small.bin --seq 64 --batch 16 -- \
    eval --checkpoint run_small --ppl mid.bin --seq 64 --batch 16

"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 ||
    fail "tokenizer train" setup.log
eos=$("$CLLA" tokenizer encode --tokenizer tok.tok --allow-special --text '<|endoftext|>')
python3 - "$eos" <<'PYEOF'
import random, struct, sys
open("eos.bin", "wb").write(struct.pack("<I", int(sys.argv[1])) * 20000)
random.seed(1)
w = ["the", "cat", "sat", "on", "mat", "dog", "ran", "away"]
lines = [" ".join(random.choice(w) for _ in range(8)) + "\n" for _ in range(6000)]
open("many.txt", "w").write("".join(lines))
open("few.txt", "w").write("".join(lines[:64]))
PYEOF
"$CLLA" train --config c.json --out run_eos --quiet --set vocab_size=300 --set max_position_embeddings=4096 \
    --set train.data=eos.bin --set train.tokenizer="$WORK/tok.tok" --set train.max_steps=30 --set train.lr=0.01 >> setup.log 2>&1 ||
    fail "train the <|endoftext|> model" setup.log
grows "generate --prompts, 6000 prompts" 8 \
    generate --model run_eos --prompts few.txt --max-new-tokens 4000 --json -- \
    generate --model run_eos --prompts many.txt --max-new-tokens 4000 --json
"$CLLA" generate --model run_eos --prompts many.txt --max-new-tokens 4000 --json > many.jsonl 2> /dev/null
n=$(grep -c '"stop_reason":"stop_token"' many.jsonl)
[ "$n" -eq 6000 ] && ok "the 6000 prompts stopped at <|endoftext|> (the case measures what it means to)" ||
    fail "$n of 6000 prompts stopped at <|endoftext|>: the model did not learn to stop"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
