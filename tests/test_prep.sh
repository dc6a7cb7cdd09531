#!/usr/bin/env bash
# clla prep and clla tokenizer from the command line, on the committed fixtures: training
# a small vocabulary, shards identical for 1 and 2 threads, verification, encode/decode of
# bytes that are not UTF-8, and one-line errors with a non-zero exit for bad input.
set -u
CLLA=${CLLA:?set CLLA to the clla binary}
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${BUILD:-/tmp}
FIX=$SRC/tests/fixtures
W=$(mktemp -d "$BUILD/test_prep.XXXXXX")
trap 'rm -rf "$W"' EXIT
passed=0 failed=0
check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi; }
# expect_error "what" "needle" cmd...: non-zero exit, one "clla: error:" line containing needle.
expect_error() {
  local what=$1 needle=$2; shift 2
  "$@" > "$W/out" 2> "$W/err"; local rc=$?
  if [ $rc -ne 0 ] && grep -q "clla: error:" "$W/err" && grep -qF -- "$needle" "$W/err"; then
    check 0 "$what"; echo "     $(head -c 300 "$W/err")"
  else
    check 1 "$what (exit $rc)"; cat "$W/err"
  fi
}

for c in "prep --help" "tokenizer --help"; do
  "$CLLA" $c > "$W/help" 2>&1 && grep -q usage "$W/help"; check $? "clla $c"
done

"$CLLA" tokenizer train --vocab-size 1024 --pattern cl100k --out "$W/tok.tok" "$FIX/english.jsonl" "$FIX/chinese.jsonl" > "$W/train.log" 2>&1
check $? "tokenizer train on the fixtures"
"$CLLA" tokenizer info --tokenizer "$W/tok.tok" | grep -q "vocab size: 1024"; check $? "trained tokenizer has 1024 ids"

for t in 1 2; do
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p$t" --threads $t --chunk-tokens 2048 --shard-tokens 9000 \
    --val-fraction 0.1 "$FIX/english.jsonl" "$FIX/chinese.jsonl" > "$W/prep$t.log" 2> "$W/prep$t.err"
  check $? "prep with $t thread(s)"
done
grep "MB/s" "$W/prep2.log" | sed 's/^/     /'
n_train=$(ls "$W/p1/train" | wc -l)
[ "$n_train" -ge 3 ]; check $? "prep rolls shards at --shard-tokens ($n_train train shards)"
ok=0; for f in "$W"/p1/train/*.bin "$W"/p1/val/*.bin; do cmp -s "$f" "${f/p1/p2}" || ok=1; done
check $ok "shards are identical for 1 and 2 threads (split by content, order kept)"
"$CLLA" prep --verify "$W/p1/train" --tokenizer "$W/tok.tok" > "$W/v.log" 2>&1; check $? "prep --verify accepts its shards"
"$CLLA" prep --verify "$W/p1" > "$W/v2.log" 2>&1 && grep -q "^ok: .*/p1/train: " "$W/v2.log" && grep -q "^ok: .*/p1/val: " "$W/v2.log" &&
  grep -q "made with .*/p1/tokenizer.tok" "$W/v2.log"
check $? "prep --verify of a prep output directory checks train/ and val/ against its tokenizer.tok"
cmp -s "$W/p1/tokenizer.tok" "$W/tok.tok"; check $? "prep stores the tokenizer beside the shards"
# without it (and no --tokenizer) the shards were passed with no tokenizer checked: refused
mkdir -p "$W/p1_notok" && cp -r "$W/p1/train" "$W/p1/val" "$W/p1_notok/"
"$CLLA" prep --verify "$W/p1_notok" > "$W/v3.log" 2>&1
[ $? -ne 0 ] && grep -q "holds train/ but no readable tokenizer.tok" "$W/v3.log"
check $? "prep --verify of a prep directory without its tokenizer.tok is refused: $(tail -n 1 "$W/v3.log")"

# An earlier prep's output is not replaced without --overwrite; with it, a second run with bigger
# shards and no validation split leaves no stale shard (nor val/) behind.
before=$(cd "$W/p1" && find . -type f -exec md5sum {} + | sort)
expect_error "prep over an earlier prep's output" "already holds the output of an earlier prep (train, val, tokenizer.tok): give another --out, or replace it with --overwrite" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p1" --val-fraction 0 "$FIX/english.jsonl"
[ "$(cd "$W/p1" && find . -type f -exec md5sum {} + | sort)" = "$before" ]; check $? "the refused prep left the earlier output as it was"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p1" --val-fraction 0 --overwrite "$FIX/english.jsonl" "$FIX/chinese.jsonl" > /dev/null 2>&1
[ "$(ls "$W/p1/train" | wc -l)" = 1 ] && [ ! -e "$W/p1/val" ] && [ "$(ls -A "$W/p1" | tr '\n' ' ')" = "tokenizer.tok train " ]
check $? "prep --overwrite replaces the earlier shards, val/ included ($(ls -A "$W/p1" | tr '\n' ' '))"

# --overwrite when moving the new output in fails and so does putting the earlier one back (strace
# fails the move-in and every rename after the three moves aside, which follow the three
# renames of the shards and tokenizer into staging): the earlier output is kept in the
# staging directory, which the message names (it was removed with it, and the message said
# "nothing was changed")
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p5" --val-fraction 0.2 "$FIX/english.jsonl" > /dev/null 2>&1
  sum5=$(cat "$W"/p5/train/*.bin "$W"/p5/val/*.bin | md5sum)
  strace -f -qq -o /dev/null -e trace=rename,renameat2 -e inject=renameat2:error=EIO:when=1 -e inject=rename:error=EIO:when=7+ \
    "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p5" --val-fraction 0.1 --overwrite "$FIX/english.jsonl" > /dev/null 2> "$W/p5.err"
  rc=$?
  kept=$(grep -o "they are in '[^']*'" "$W/p5.err" | sed "s/they are in '//; s/'$//")
  [ "$rc" -eq 1 ] && [ -n "$kept" ] && [ "$(cat "$kept"/train.earlier/*.bin "$kept"/val.earlier/*.bin 2> /dev/null | md5sum)" = "$sum5" ]
  check $? "prep --overwrite failing both ways keeps the earlier output where the message says: $(grep error "$W/p5.err")"
else
  echo "skip prep --overwrite failing both ways: strace is missing or not allowed here (apt-get install strace)"
fi

# --overwrite removes what prep wrote, never a directory of the user's under one of its names
mkdir -p "$W/p3/tokenizer.tok/notes" "$W/p4/train/shard_000099.bin/photos"
echo precious > "$W/p3/tokenizer.tok/notes/a.txt"; echo x > "$W/p4/train/shard_000099.bin/photos/a.jpg"
expect_error "prep --overwrite over a directory named tokenizer.tok" "tokenizer.tok' is not a file, so clla prep did not write it" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p3" --val-fraction 0 --overwrite "$FIX/english.jsonl"
expect_error "prep --overwrite over a directory named like a shard" "holds 'shard_000099.bin', which clla prep did not write" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p4" --val-fraction 0 --overwrite "$FIX/english.jsonl"
[ -f "$W/p3/tokenizer.tok/notes/a.txt" ] && [ -f "$W/p4/train/shard_000099.bin/photos/a.jpg" ]
check $? "the user's directories are left as they were"

# a corpus file's kind by its extension in any letter case: UP.JSONL is JSONL (read as text, its
# braces and quotes became tokens)
printf '{"text":"hello"}\n' > "$W/UP.JSONL"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p5" --val-fraction 0 "$W/UP.JSONL" 2> /dev/null | grep -q "train [0-9]* tokens (1 documents"
upper=$?
printf '{"text":"hello"}\n' > "$W/lower.jsonl"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p6" --val-fraction 0 "$W/lower.jsonl" > /dev/null 2>&1
[ $upper = 0 ] && cmp -s "$W/p5/train/shard_000000.bin" "$W/p6/train/shard_000000.bin"
check $? "a .JSONL corpus is read as JSONL (the same shard as .jsonl)"

python3 -c "import json; open('$W/m50.jsonl','w').write(''.join(json.dumps({'text':'doc %d'%i})+'\n' for i in range(50)))"
expect_error "every document in the validation split" "every one of the corpus' 50 documents fell into the validation split (--val-fraction 0.999999)" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p7" --val-fraction 0.999999 "$W/m50.jsonl"

# plain text without --doc-separator is one document held whole: counted against the memory left
# before anything is read or written (CLLA_TEST_MEM_AVAILABLE stands in for it); with a separator
# the same file passes
for i in $(seq 50); do echo "the cat sat on the mat $i"; done > "$W/plain50.txt"
expect_error "a one-document plain file past the memory left" "one document of plain text, need 3.8 KiB but only 1.0 KiB are available" \
  env CLLA_TEST_MEM_AVAILABLE=1000 "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p8" "$W/plain50.txt"
[ ! -e "$W/p8" ]; check $? "... and nothing written"
CLLA_TEST_MEM_AVAILABLE=1000 "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p9" --doc-separator "" --val-fraction 0 "$W/plain50.txt" > "$W/p9.log" 2>&1
check $? "... the same file with --doc-separator is not held whole"

echo hi > "$W/afile"
expect_error "prep --out naming a file" "--out '$W/afile' is a file, not a directory" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/afile" "$W/m50.jsonl"
expect_error "--chunk-tokens 0 names the range it is refused by" "--chunk-tokens 0: out of range, use 1..16777216" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p9" --chunk-tokens 0 "$W/m50.jsonl"

# encode/decode: any bytes come back, invalid UTF-8 included.
{ head -c 3000 "$FIX/chinese.jsonl"; printf '\xff\xfe\xc0\xaf\xed\xa0\x80 \x80abc\x00z<|endoftext|>'; } > "$W/bytes.bin"
"$CLLA" tokenizer encode --tokenizer "$W/tok.tok" --file "$W/bytes.bin" > "$W/ids" &&
  "$CLLA" tokenizer decode --tokenizer "$W/tok.tok" --file "$W/ids" > "$W/back.bin" && cmp -s "$W/bytes.bin" "$W/back.bin"
check $? "tokenizer encode | decode round-trips bytes that are not UTF-8"
[ "$("$CLLA" tokenizer encode --tokenizer "$W/tok.tok" --allow-special --text '<|endoftext|>')" = 1023 ]
check $? "encode --allow-special maps <|endoftext|> to its id"

# Bad input.
: > "$W/empty.txt"
expect_error "empty corpus" "empty.txt" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/empty.txt"
printf '{"text": "fine"}\n{"text": broken\n' > "$W/bad.jsonl"
expect_error "malformed JSONL names file, line and offset" "bad.jsonl:2 (byte offset 17)" \
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/bad.jsonl"
[ ! -e "$W/e" ]; check $? "a prep that failed left no output directory (nor a temporary)"
mkdir -p "$W/keep" && echo mine > "$W/keep/notes.txt"
expect_error "a failed prep into an existing directory" "bad.jsonl:2" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/keep" "$FIX/english.jsonl" "$W/bad.jsonl"
[ "$(ls -A "$W/keep")" = "notes.txt" ]; check $? "a failed prep leaves an existing directory as it was ($(ls -A "$W/keep" | tr '\n' ' '))"
# SIGTERM in the middle: exit 143, nothing left (the directory was new); a staging directory of a
# process that is gone (a kill -9 leaves one) is removed by the next prep into the same place
for i in $(seq 300); do cat "$FIX/english.jsonl"; done > "$W/big.jsonl"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/sig" --threads 1 "$W/big.jsonl" > /dev/null 2> "$W/sig.err" & pid=$!
sleep 0.3; kill -TERM $pid; wait $pid; rc=$?
if [ $rc -eq 0 ]; then echo "skip: prep finished before the signal (a fast machine): SIGTERM not checked"
else [ $rc -eq 143 ] && [ ! -e "$W/sig" ] && grep -q "SIGTERM received" "$W/sig.err"
     check $? "prep stopped by SIGTERM: exit $rc, no output directory left"; fi
mkdir -p "$W/stale/.prep.tmp.999999/train"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/stale" --val-fraction 0 "$FIX/english.jsonl" > /dev/null 2>&1
[ "$(ls -A "$W/stale" | tr '\n' ' ')" = "tokenizer.tok train " ]; check $? "a staging directory left by a dead prep is removed ($(ls -A "$W/stale" | tr '\n' ' '))"
# one whose pid is now another running process (pid 1, as after a reboot): unlocked and old, so
# stale; unlocked and new, it may be a prep between its mkdir and its lock: refused
mkdir -p "$W/stale1/.prep.tmp.1/train"
touch -d '2 hours ago' "$W/stale1/.prep.tmp.1"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/stale1" --val-fraction 0 "$FIX/english.jsonl" > /dev/null 2> "$W/stale1.err"
[ "$(ls -A "$W/stale1" | tr '\n' ' ')" = "tokenizer.tok train " ]; check $? "an old unlocked staging directory whose pid runs another process is removed ($(cat "$W/stale1.err"))"
mkdir -p "$W/young1/.prep.tmp.1"
expect_error "a new staging directory of a running pid" "another clla prep (pid 1) is writing into" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/young1" "$FIX/english.jsonl"
# a locked one is in use whatever its pid and age (flock(1) holds it as a running prep does)
mkdir -p "$W/locked/.prep.tmp.999999"
touch -d '2 hours ago' "$W/locked/.prep.tmp.999999"
flock "$W/locked/.prep.tmp.999999" sleep 5 & lockpid=$!
sleep 0.3
expect_error "a locked staging directory" "another clla prep (pid 999999) is writing into" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/locked" "$FIX/english.jsonl"
pkill -P $lockpid 2> /dev/null; kill $lockpid 2> /dev/null; wait $lockpid 2> /dev/null
# what cJSON alone would read and drop without a word (a fourth probe): a second object on a
# line, \u0000 in a text; and a NUL in a plain-text corpus (a shard or an archive given as text)
printf '{"text": "a"}{"text": "more text"}\n' > "$W/two.jsonl"
expect_error "two JSON objects on one JSONL line" "two.jsonl:1 (byte offset 0): column" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/two.jsonl"
printf '{"text": "a\\u0000b"}\n' > "$W/nul.jsonl"
expect_error "\\u0000 in a JSONL text" "u0000 in a string" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/nul.jsonl"
# a lone UTF-16 surrogate is named as such (it was a bare "JSON syntax error"); a pair is a character
printf '{"text": "a\\ud800b"}\n' > "$W/sur.jsonl"
expect_error "a lone high surrogate in a JSONL text" "a lone UTF-16 high surrogate" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/sur.jsonl"
printf '{"text": "a\\udc00b"}\n' > "$W/sur.jsonl"
expect_error "a lone low surrogate in a JSONL text" "a lone UTF-16 low surrogate" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/sur.jsonl"
printf '{"text": "a\\ud83d\\ude00b"}\n' > "$W/pair.jsonl"
"$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/p8" --val-fraction 0 "$W/pair.jsonl" > /dev/null 2>&1
check $? "a surrogate pair in a JSONL text is read"
f=$(ls "$W"/p2/train/*.bin | head -1)
expect_error "a token shard given as a text corpus" "holds a NUL byte" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$f"
printf '{"body": "x"}\n' > "$W/nokey.jsonl"
expect_error "JSONL without the text field" "--text-key" "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/e" "$W/nokey.jsonl"
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out "$W/other.tok" "$FIX/english.jsonl" > /dev/null 2>&1
expect_error "shards of another tokenizer (hash)" "another tokenizer (hash" \
  "$CLLA" prep --verify "$W/p1/train" --tokenizer "$W/other.tok"
f=$(ls "$W"/p2/train/*.bin | head -1)
head -c 5000 "$f" > "$W/trunc.bin"
expect_error "truncated shard names file and offset" "trunc.bin' is truncated" "$CLLA" prep --verify "$W/trunc.bin"
cp "$f" "$W/flip.bin"; printf '\x55' | dd of="$W/flip.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_error "damaged chunk names file and offset" "checksum mismatch in chunk 0 at offset 64" "$CLLA" prep --verify "$W/flip.bin"
printf 'not a shard at all' > "$W/junk.bin"
expect_error "wrong magic names file and offset" "wrong magic at offset 0" "$CLLA" prep --verify "$W/junk.bin"
expect_error "missing tokenizer file" "nope.tok" "$CLLA" tokenizer encode --tokenizer "$W/nope.tok" --text hi
expect_error "unknown pattern" "unknown pre-tokenization pattern" \
  "$CLLA" tokenizer train --vocab-size 300 --pattern gpt5 --out "$W/x.tok" "$FIX/english.jsonl"
expect_error "decode of an id beyond the vocabulary" "not in the vocabulary" \
  "$CLLA" tokenizer decode --tokenizer "$W/tok.tok" 5 99999

# many small files give the shards of the same documents in one file (the text block is carried
# across files, not cut at each file's end)
mkdir -p "$W/many"
head -n 60 "$FIX/english.jsonl" | split -l 2 -a 3 --additional-suffix=.jsonl - "$W/many/f"
cat "$W"/many/f* > "$W/one.jsonl"
for m in many one; do
  if [ $m = many ]; then in=("$W"/many/f*); else in=("$W/one.jsonl"); fi
  "$CLLA" prep --tokenizer "$W/tok.tok" --out "$W/pm_$m" --chunk-tokens 512 --val-fraction 0.2 "${in[@]}" > /dev/null 2>&1
done
cmp -s "$W/pm_many/train/shard_000000.bin" "$W/pm_one/train/shard_000000.bin" &&
  cmp -s "$W/pm_many/val/shard_000000.bin" "$W/pm_one/val/shard_000000.bin"
check $? "prep of 30 files of 2 documents: the shards of the same 60 documents in one file"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
