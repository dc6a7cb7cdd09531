#!/usr/bin/env bash
# A command's output never replaces what it did not write (docs/COMMANDS.md, "Outputs"):
#  (1) an output that appears while the command works (another process wrote it between the
#      check at the start and the end): tokenizer train keeps it and its own result beside it,
#      named; prep keeps it and nothing of its own (a FIFO corpus holds each command at the
#      point between the two);
#  (2) an --out that is a symbolic link (also one to nothing yet) is refused: the output is
#      renamed into place, so the link would be replaced and its target never written;
#  (3) export --overwrite onto a link to a package is refused, the package untouched (replacing
#      moves the old package aside and removes it: through the link, its files);
#  (4) prep --overwrite over train/ and val/ directories that prep did not write (a corpus laid
#      out that way) is refused, their files untouched;
#  (5) an output whose directory cannot be flushed after the rename fails the command, naming it;
#  (6) --overwrite replaces an earlier output, never the command's input: an --out that is an
#      input file (however spelled) or lies inside an input directory is refused, the input kept;
#  (7) a save removes what an earlier save left (the single file, the index, its shards), never
#      another file an old index names (an index naming notes.txt had it deleted).
# Needs CLLA (the binary) and SRC (the source tree); ctest sets both. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_output_safety

# expect_error NAME 'REGEX' -- CMD...: exit 1, one line on stderr matching REGEX (grep -E)
expect_error() {
    local name=$1 re=$2
    shift 3
    "$@" > out.txt 2> err.txt
    local rc=$?
    if [ "$rc" -ne 1 ]; then fail "$name: exit $rc (want 1): $(head -c 300 err.txt)"
    elif [ "$(grep -c . err.txt)" -ne 1 ]; then fail "$name: want one line on stderr: $(head -c 400 err.txt | tr '\n' '|')"
    elif ! grep -qE -- "$re" err.txt; then fail "$name: stderr does not match '$re': $(cat err.txt)"
    else ok "$name: $(cut -c1-160 err.txt)"; fi
}

CORPUS=$SRC/tests/fixtures/english.jsonl
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out t.tok "$CORPUS" > /dev/null 2>&1 || fail "tokenizer for the tests"

# run_with_fifo OUT_LOG INPUT_FIFO CMD...: starts CMD in the background, reading INPUT_FIFO;
# the caller then does what another process does meanwhile and calls feed_fifo
run_with_fifo() {
    local log=$1 fifo=$2
    shift 2
    rm -f "$fifo"
    mkfifo "$fifo" || { fail "mkfifo $fifo"; return 1; }
    ( "$@" > "$log.out" 2> "$log"; echo $? > "$log.rc" ) &
    BG=$!
}
# feed_fifo FIFO FILE: writes FILE into the FIFO (which the command opened or will open) and
# waits for the command (at most 60 s)
feed_fifo() {
    cat "$2" > "$1"
    for ((i = 0; i < 600; i++)); do [ -e "$LOG.rc" ] && break; sleep 0.1; done
    wait "$BG" 2> /dev/null
}

echo "# (1) an output that appears while the command works"
LOG=tok1.err
run_with_fifo "$LOG" corpus1.jsonl "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out same.tok corpus1.jsonl
sleep 0.3                        # past the start's check of --out (the command now waits on the FIFO)
echo "theirs" > same.tok         # another process's output, written meanwhile
feed_fifo corpus1.jsonl "$CORPUS"
kept=$(ls same.tok.tmp.* 2> /dev/null | head -n 1)
if [ "$(cat "$LOG.rc" 2> /dev/null)" = 1 ] && [ "$(grep -c error "$LOG")" = 1 ] &&
   grep -qE "'same.tok' was created by another process while this command ran: it was left as it is, and this command's output is in 'same.tok.tmp.[0-9]+'" "$LOG" &&
   [ "$(cat same.tok)" = theirs ] && [ -n "$kept" ] && head -n 1 "$kept" | grep -q '^#clla-tokenizer'; then
    ok "(1) tokenizer train: the file that appeared is kept, this result is beside it: $(grep error "$LOG")"
else
    fail "(1) tokenizer train: rc $(cat "$LOG.rc" 2> /dev/null), $(head -c 300 "$LOG"), same.tok: $(head -c 40 same.tok), kept: '$kept'"
fi

LOG=prep1.err
run_with_fifo "$LOG" corpus2.jsonl "$CLLA" prep --tokenizer t.tok --out p1 --val-fraction 0.2 --chunk-tokens 512 corpus2.jsonl
for ((i = 0; i < 100; i++)); do ls -d p1/.prep.tmp.* > /dev/null 2>&1 && break; sleep 0.05; done
mkdir -p p1/train && echo "theirs" > p1/train/notes.txt
feed_fifo corpus2.jsonl "$CORPUS"
if [ "$(cat "$LOG.rc" 2> /dev/null)" = 1 ] && grep -q "'p1/train' was created by another process while prep ran: it was left as it is, and nothing of this prep was kept" "$LOG" &&
   [ "$(ls p1/train)" = notes.txt ] && [ "$(cat p1/train/notes.txt)" = theirs ] && [ ! -e p1/val ] && [ ! -e p1/tokenizer.tok ] &&
   ! ls -d p1/.prep.tmp.* > /dev/null 2>&1; then
    ok "(1) prep: the directory that appeared is kept, nothing of this prep moved in or left behind: $(tail -n 1 "$LOG")"
else
    fail "(1) prep: rc $(cat "$LOG.rc" 2> /dev/null), $(tail -n 1 "$LOG"), p1: $(find p1 | tr '\n' ' ')"
fi

echo "# (2) --out that is a symbolic link"
echo "mine" > target.txt
ln -s target.txt link_to_file.tok
ln -s not_there_yet.tok dangling.tok
expect_error "(2) tokenizer train --out a link to a file (with --overwrite)" "--out 'link_to_file.tok' is a symbolic link: give the path it points to" -- \
    "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out link_to_file.tok --overwrite "$CORPUS"
expect_error "(2) tokenizer train --out a link to nothing yet" "--out 'dangling.tok' is a symbolic link" -- \
    "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out dangling.tok "$CORPUS"
[ "$(cat target.txt)" = mine ] && [ -L link_to_file.tok ] && [ -L dangling.tok ] && [ ! -e not_there_yet.tok ] &&
    ok "(2) the links and the file are as they were" || fail "(2) after the refusals: $(ls -l | tr '\n' '|')"

echo "# (3) export --overwrite onto a link to a package"
"$CLLA" prep --tokenizer t.tok --out s --val-fraction 0 --chunk-tokens 512 "$CORPUS" > /dev/null 2>&1 || fail "prep for (3)"
cat > m.json <<EOF
{"attention": "gqa", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
 "train": {"data": "s/train", "tokenizer": "t.tok", "max_steps": 2, "micro_batch": 2, "seq_len": 32, "threads": 1}}
EOF
"$CLLA" train --config m.json --out r --quiet > /dev/null 2>&1 || fail "train for (3)"
"$CLLA" export r --out real_pkg > /dev/null 2>&1 || fail "export for (3)"
ln -s real_pkg link_pkg
(cd real_pkg && find . -type f -exec md5sum {} + | sort) > pkg.before
expect_error "(3) export --overwrite onto a link to a package" "refusing to replace 'link_pkg' with --overwrite: it is a symbolic link" -- \
    "$CLLA" export r --out link_pkg --overwrite --dtype bf16
(cd real_pkg && find . -type f -exec md5sum {} + | sort) | cmp -s - pkg.before && [ -L link_pkg ] && ! ls -d link_pkg.* > /dev/null 2>&1 &&
    ok "(3) the package the link points to is untouched" || fail "(3) real_pkg: $(ls real_pkg | tr '\n' ' '), $(ls -d link_pkg* | tr '\n' ' ')"

# (3b) --overwrite replaces a package's own files only: a note of the user's inside stops it
echo "mine" > real_pkg/NOTES.md
(cd real_pkg && find . -type f -exec md5sum {} + | sort) > pkg.before
expect_error "(3b) export --overwrite onto a package holding a file of the user's" \
    "refusing to replace 'real_pkg' with --overwrite: it holds 'NOTES.md', which is not a package file" -- \
    "$CLLA" export r --out real_pkg --overwrite --dtype bf16
(cd real_pkg && find . -type f -exec md5sum {} + | sort) | cmp -s - pkg.before && ok "(3b) the package and the note are untouched" ||
    fail "(3b) real_pkg: $(ls real_pkg | tr '\n' ' ')"
rm real_pkg/NOTES.md
"$CLLA" export r --out real_pkg --overwrite > /dev/null 2>&1 && ok "(3b) without the note, --overwrite replaces the package" ||
    fail "(3b) export --overwrite of a plain package"
# (3c) a package --out in a directory that does not exist: refused before the work
expect_error "(3c) export --out in a missing directory" "--out 'no/such/pkg': its directory 'no/such' does not exist" -- \
    "$CLLA" export r --out no/such/pkg
[ ! -e no ] && ok "(3c) nothing created" || fail "(3c) left: $(find no)"

echo "# (4) prep --overwrite over a corpus laid out as train/ and val/"
mkdir -p data/train data/val
cp "$CORPUS" data/train/corpus.jsonl
echo '{"text": "held out"}' > data/val/heldout.jsonl
expect_error "(4) prep --overwrite over train/ it did not write" "'data/train' holds 'corpus.jsonl', which clla prep did not write" -- \
    "$CLLA" prep --tokenizer t.tok --out data --overwrite --chunk-tokens 512 data/train/corpus.jsonl
cmp -s data/train/corpus.jsonl "$CORPUS" && [ -s data/val/heldout.jsonl ] && [ "$(ls data/train)" = corpus.jsonl ] &&
    ok "(4) the corpus is untouched" || fail "(4) data: $(find data | tr '\n' ' ')"
if "$CLLA" prep --tokenizer t.tok --out s --overwrite --val-fraction 0 --chunk-tokens 512 "$CORPUS" > /dev/null 2> p4.err; then
    ok "(4) prep --overwrite over an earlier prep's output still replaces it"
else
    fail "(4) prep --overwrite over its own output: $(cat p4.err)"
fi

echo "# (5) the directory that receives an output cannot be flushed (a failing disk; strace injects EIO)"
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    mkdir -p d5
    # -P on the directory: only the fsync of the directory itself fails, the files' own succeed
    # (its progress lines go to stderr too: the error is its last line and its only error)
    strace -o /dev/null -P "$PWD/d5" -e trace=fsync -e inject=fsync:error=EIO \
        "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out d5/t.tok "$CORPUS" > /dev/null 2> t5.err
    rc=$?
    [ "$rc" -eq 1 ] && [ "$(grep -c error t5.err)" -eq 1 ] && tail -n 1 t5.err | grep -q "writing 'd5/t.tok' failed: Input/output error" &&
        ok "(5) tokenizer train, its directory's fsync failing: $(tail -n 1 t5.err)" ||
        fail "(5) tokenizer train, its directory's fsync failing: rc $rc: $(tr '\n' '|' < t5.err)"
    expect_error "(5) export, its directory's fsync failing" "'d5/pkg' is in place, but flushing the directory that holds it failed: Input/output error" -- \
        strace -o /dev/null -P "$PWD/d5" -e trace=fsync -e inject=fsync:error=EIO "$CLLA" export r --out d5/pkg
else
    echo "skip (5) a directory that cannot be flushed: strace is missing or not allowed here (apt-get install strace)"
fi

echo "# (6) an --out with --overwrite that is the command's own input"
cp "$CORPUS" corpus6.jsonl && cp -r r r6 && head -c 4000 /dev/zero > tok6.bin
expect_error "(6) tokenizer train --out its corpus file" "--out './corpus6.jsonl' is the corpus file 'corpus6.jsonl'" -- \
    "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out ./corpus6.jsonl --overwrite corpus6.jsonl
expect_error "(6) debug-step --out the model's weights" "--out 'r6/model.safetensors' is inside the --model directory 'r6'" -- \
    "$CLLA" debug-step --model r6 --tokens tok6.bin --out r6/model.safetensors --overwrite
expect_error "(6) debug-step --out its --tokens file" "--out 'tok6.bin' is the --tokens 'tok6.bin'" -- \
    "$CLLA" debug-step --model r6 --tokens tok6.bin --out tok6.bin --overwrite
cmp -s "$CORPUS" corpus6.jsonl && cmp -s r/model.safetensors r6/model.safetensors && [ "$(wc -c < tok6.bin)" -eq 4000 ] &&
    ok "(6) the inputs are as they were" || fail "(6) an input was replaced"

echo "# (7) an old index naming a file of the user's"
mkdir -p d7 && echo precious > d7/notes.txt && echo '{"weight_map": {"x": "notes.txt"}}' > d7/model.safetensors.index.json
"$CLLA" init --config m.json --out d7 --overwrite > d7.log 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ "$(cat d7/notes.txt 2> /dev/null)" = precious ] && [ ! -e d7/model.safetensors.index.json ] && [ -s d7/model.safetensors ] &&
    ok "(7) init --overwrite over an index naming notes.txt: notes.txt kept, the index replaced" ||
    fail "(7) rc $rc: $(ls d7 | tr '\n' ' ') $(tail -n 1 d7.log)"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
