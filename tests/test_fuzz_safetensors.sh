#!/usr/bin/env bash
# Fuzzes the safetensors reader (model/safetensors.c: st_parse_header on arbitrary header
# text, st_open + st_read_f32 on arbitrary file images) with libFuzzer under AddressSanitizer
# and UndefinedBehaviorSanitizer for a bounded time (FUZZ_SECONDS, default 20). Seeds are a
# real checkpoint's model.safetensors and optimizer file. Any crash, leak, sanitizer report
# or rejection without a message fails the test. Skipped (77) when clang or its libFuzzer
# runtime is missing (scripts/setup.sh installs clang and libclang-rt-14-dev).
set -u
CLLA=${CLLA:?set CLLA to the clla binary}
. "$(dirname "${BASH_SOURCE[0]}")/lib/fuzz.sh"
SECS=${FUZZ_SECONDS:-20}
fuzz_begin test_fuzz_st
"$CC" "${FLAGS[@]}" "$SRC/tests/fuzz/fuzz_safetensors.c" "$SRC/model/safetensors.c" "$SRC/common/util.c" "$SRC/common/unfinished.c" "$SRC/common/json_strict.c" \
  -lcjson -lm -o "$W/fuzz_safetensors" 2> "$W/cc.err"
check $? "build fuzz_safetensors with -fsanitize=fuzzer,address,undefined"
[ -s "$W/cc.err" ] && head -20 "$W/cc.err"

# Seeds: the files of a real checkpoint of a tiny model, in each mode.
cd "$W" || exit 1
: > tok.bin
for i in $(seq 0 199); do printf "\\x$(printf %02x $((i * 7 % 16)))\\x00\\x00\\x00" >> tok.bin; done
cat > tiny.json <<'CFG'
{"attention": "gqa", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "intermediate_size": 8, "max_position_embeddings": 16,
 "train": {"data": "tok.bin", "seq_len": 8, "micro_batch": 1, "max_steps": 2, "seed": 1, "threads": 1}}
CFG
mkdir -p seeds corpus
if "$CLLA" train --config tiny.json --out run --quiet --save-every 2 > /dev/null 2>&1; then
  for f in run/checkpoints/step_00000002/*.safetensors; do
    b=$(basename "$f" .safetensors)
    { printf '\x01'; cat "$f"; } > "seeds/$b.file"
    # mode 3: two-byte header length, then header and data without the 8-byte length
    len=$(od -An -tu8 -N8 "$f" | tr -d ' ')
    { printf '\x03'; printf "\\x$(printf %02x $((len & 255)))\\x$(printf %02x $((len >> 8 & 255)))"; tail -c +9 "$f"; } > "seeds/$b.len"
    { printf '\x10'; tail -c +9 "$f" | head -c "$len"; } > "seeds/$b.hdr"
  done
fi
echo "     seeds: $(ls seeds | wc -l)"
if [ -x ./fuzz_safetensors ]; then
  ./fuzz_safetensors -max_total_time="$SECS" -max_len=16384 -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 corpus seeds > fuzz.log 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' fuzz.log | grep -o '[0-9]*$')
  check $rc "fuzz_safetensors: ${runs:-?} inputs in $SECS s without crash or sanitizer report"
  if [ $rc != 0 ]; then
    grep -E "ERROR|SUMMARY|runtime error" fuzz.log | head -20
    for c in crash-* leak-* timeout-*; do [ -e "$c" ] && { echo "     input $c:"; od -c "$c" | head -5; }; done
  fi
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
