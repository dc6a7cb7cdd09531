#!/usr/bin/env bash
# Fuzzes the tokenizer (encode/decode round-trip, tokenizer file parser, BPE training) and
# the shard reader with libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer,
# for a bounded time each (FUZZ_SECONDS, default 25). Any crash, leak, sanitizer report
# or round-trip mismatch fails the test. Skipped (77) when clang or its libFuzzer runtime
# is missing (scripts/setup.sh installs clang and libclang-rt-14-dev).
set -u
CLLA=${CLLA:?set CLLA to the clla binary}
. "$(dirname "${BASH_SOURCE[0]}")/lib/fuzz.sh"
SECONDS_EACH=${FUZZ_SECONDS:-25}
fuzz_begin test_fuzz
DATA=("$SRC/common/util.c" "$SRC/common/unfinished.c" "$SRC/data/tokenizer.c" "$SRC/data/tokenizer_file.c" "$SRC/data/pretok.c" "$SRC/data/bpe_train.c")
"$CC" "${FLAGS[@]}" "$SRC/tests/fuzz/fuzz_tokenizer.c" "${DATA[@]}" -lpcre2-8 -o "$W/fuzz_tokenizer" 2> "$W/cc1.err"
check $? "build fuzz_tokenizer with -fsanitize=fuzzer,address,undefined" || true
[ -s "$W/cc1.err" ] && head -20 "$W/cc1.err"
"$CC" "${FLAGS[@]}" "$SRC/tests/fuzz/fuzz_shard.c" "$SRC/common/util.c" "$SRC/common/unfinished.c" "$SRC/data/shard_read.c" -lzstd -o "$W/fuzz_shard" 2> "$W/cc2.err"
check $? "build fuzz_shard with -fsanitize=fuzzer,address,undefined" || true
[ -s "$W/cc2.err" ] && head -20 "$W/cc2.err"

# Seeds: real text for each mode, a small tokenizer file, and real shards (both widths).
mkdir -p "$W/seed_tok" "$W/seed_shard"
for m in 0 1 2 3 4 5 7; do
  { printf "\\x0$m"; head -c 1500 "$SRC/tests/fixtures/english.jsonl"; } > "$W/seed_tok/en$m"
  { printf "\\x0$m"; head -c 1500 "$SRC/tests/fixtures/chinese.jsonl"; } > "$W/seed_tok/zh$m"
done
"$CLLA" tokenizer train --vocab-size 300 --pattern llama3 --out "$W/small.tok" "$SRC/tests/fixtures/english.jsonl" > /dev/null 2>&1
{ printf '\x06'; cat "$W/small.tok"; } > "$W/seed_tok/tokfile"
# A special token with id 70000 makes the vocabulary too large for uint16: 32-bit shards.
{ cat "$W/small.tok"; echo "#special <|wide|> 70000"; } > "$W/wide.tok"
for t in small wide; do
  "$CLLA" prep --tokenizer "$W/$t.tok" --out "$W/p_$t" --chunk-tokens 300 --val-fraction 0 \
    <(head -c 3000 "$SRC/tests/fixtures/english.jsonl") "$SRC/tests/fixtures/chinese.jsonl" > /dev/null 2>&1
  f=$(ls "$W"/p_$t/train/*.bin 2>/dev/null | head -1)
  [ -n "$f" ] && { printf '\x00'; cat "$f"; } > "$W/seed_shard/$t.0" && { printf '\x01'; cat "$f"; } > "$W/seed_shard/$t.1"
done
echo "     seeds: $(ls "$W/seed_tok" | wc -l) tokenizer inputs, $(ls "$W/seed_shard" | wc -l) shard images"

for target in fuzz_tokenizer fuzz_shard; do
  [ -x "$W/$target" ] || continue
  seeds=$W/seed_tok; [ $target = fuzz_shard ] && seeds=$W/seed_shard
  mkdir -p "$W/corpus_$target"
  (cd "$W" && ./$target -max_total_time="$SECONDS_EACH" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
     -print_final_stats=1 "$W/corpus_$target" "$seeds" > "$W/$target.log" 2>&1)
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$W/$target.log" | grep -o '[0-9]*$')
  check $rc "$target: ${runs:-?} inputs in ${SECONDS_EACH} s without crash or sanitizer report"
  [ $rc = 0 ] || grep -E "ERROR|SUMMARY|mismatch|without the file|runtime error" "$W/$target.log" | head -20
  ls "$W"/crash-* "$W"/leak-* "$W"/timeout-* 2>/dev/null | head -3
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
