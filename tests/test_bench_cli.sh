#!/usr/bin/env bash
# clla eval --bench and eval/convert_bench.py (docs/BENCHMARKS.md):
#  - every converter turns its fixture items (tests/fixtures/bench/, written for these tests) into
#    the generic JSONL with the right label, and clla scores the result;
#  - the decoder path (the context the choices share prefilled once and forked, the rest decoded
#    through the cache) and the full-sequence forward give the same per-choice log-likelihoods
#    (1e-4) with an fp32 cache and with a CLLA-quant + MoE model's int4 latent, within a rounding
#    flip (5e-3) with a bf16 cache and a 2-bit latent, and the same acc/acc_norm, plain items and
#    partial-scoring ones (Winogrande: the choices share only the prompt before the option);
#  - bad input: a malformed line (its line number; --skip-bad scores the rest), a label out of
#    range, an empty choice, an unknown format, more shots than the dev split holds, a bench-only
#    option without --bench: one line, exit != 0, no --items-out file left.
# The PyTorch-twin check of the log-likelihoods themselves is tests/test_twin_bench.sh.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_bench_cli
PY=/usr/bin/python3
FX="$SRC/tests/fixtures/bench"
CONV="$SRC/eval/convert_bench.py"

"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 &&
cat > gqa.json <<'JSON' &&
{"attention": "gqa", "num_key_value_heads": 2, "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
 "head_dim": 8, "intermediate_size": 48, "max_position_embeddings": 256, "initializer_range": 0.3}
JSON
cat > cq.json <<'JSON' &&
{"attention": "clla_quant", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
 "head_dim": 8, "kv_lora_rank": 16, "qk_rope_head_dim": 4, "latent_quant_group": 8, "intermediate_size": 48,
 "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "moe_capacity_factor": 0,
 "max_position_embeddings": 256, "initializer_range": 0.2}
JSON
"$CLLA" init --config gqa.json --out gqa >> setup.log 2>&1 && "$CLLA" init --config cq.json --out cq >> setup.log 2>&1 ||
    { echo "FAIL setup: $(tail -n 2 setup.log)"; echo "0 passed, 1 failed"; exit 1; }
B=("$CLLA" eval --tokenizer tok.tok)

# ---------------------------------------------------------------- converters
# format | inputs | expected (label:right answer text) of the scored items, in order
conv() {   # conv NAME FORMAT EXPECT ARGS...: converts, checks labels and right answers, scores
    local name=$1 fmt=$2 expect=$3; shift 3
    if ! "$PY" "$CONV" "$fmt" --out "$name.jsonl" "$@" > "$name.conv" 2>&1; then fail "convert $fmt: $(cat "$name.conv")"; return; fi
    # the right answer: the choice itself, or (letter choices) the option line of the context
    got=$("$PY" - "$name.jsonl" <<'PYEOF'
import json, sys
out = []
for line in open(sys.argv[1], encoding="utf-8"):
    o = json.loads(line)
    if o.get("split") == "dev":
        continue
    right = o["choices"][o["label"]]
    if right.strip() in "ABCDE" and len(right.strip()) == 1:
        right = [l for l in o["context"].split("\n") if l.startswith(right.strip() + ". ")][0][3:]
    out.append(f"{o['label']}:{right.strip()}")
print("|".join(out))
PYEOF
)
    if [ "$got" = "$expect" ]; then ok "convert $fmt: labels and right answers [$got]"; else fail "convert $fmt: got [$got], want [$expect]"; fi
    if "${B[@]}" --checkpoint gqa --bench "$name.jsonl" --shots 1 --json > "$name.out" 2> "$name.err" &&
       grep -q '"acc":' "$name.out"; then ok "clla scores the converted $fmt items 1-shot"
    else fail "score $fmt: $(tail -n 1 "$name.err")"; fi
}
conv mmlu mmlu "1:Its starch recrystallizes|2:Wood|3:Carbon dioxide|0:A thermometer" "$FX"/mmlu/kitchen_science_dev.csv "$FX"/mmlu/kitchen_science_test.csv
conv cmmlu cmmlu "0:红茶|2:三个|3:温杯" "$FX"/cmmlu/dev/tea_culture.csv "$FX"/cmmlu/test/tea_culture.csv
conv ceval ceval "0:停下等待|1:扫码|3:早上上班的时段" "$FX"/ceval/city_transport_dev.csv "$FX"/ceval/city_transport_val.csv
conv arc arc "0:It melts|2:an iron nail|4:a chicken" "$FX"/arc.jsonl
conv piqa piqa "0:brush them with lemon juice.|1:Run the lid under hot water for a minute.|0:Wipe it with a soft cloth." "$FX"/piqa.jsonl --labels "$FX"/piqa-labels.lst
conv siqa siqa "0:welcomed|2:change into dry clothes|1:to pass the exam" "$FX"/siqa.jsonl --labels "$FX"/siqa-labels.lst
conv winogrande winogrande "0:trophy|1:Bea|0:soup" "$FX"/winogrande.jsonl
conv boolq boolq "1:yes|0:no|1:yes" "$FX"/boolq.jsonl
conv hellaswag hellaswag "0:pours it over the tea leaves in a pot.|1:pedals down the quiet street." "$FX"/hellaswag.jsonl
grep -q '"continuation": " was too big."' winogrande.jsonl && grep -q '"context": "The trophy did not fit in the suitcase because the "' winogrande.jsonl &&
    ok "winogrande: the option fills the blank, the rest of the sentence is the shared continuation" || fail "winogrande layout: $(head -n 1 winogrande.jsonl)"
grep -c '"split": "dev"' mmlu.jsonl | grep -qx 2 && grep -q '"fewshot": "kitchen_science"' mmlu.jsonl &&
    ok "mmlu: the _dev file is the few-shot split, the subject the pool" || fail "mmlu splits: $(cat mmlu.jsonl)"
if "$PY" "$CONV" piqa --out x.jsonl "$FX"/piqa.jsonl > x.err 2>&1; then fail "piqa without --labels accepted"
else [ "$(wc -l < x.err)" -eq 1 ] && [ ! -e x.jsonl ] && ok "piqa without --labels: $(cat x.err)" || fail "piqa without labels: $(cat x.err)"; fi
printf '{"goal": "g", "sol1": "a", "sol2": "b"}\n' > p1.jsonl
if "$PY" "$CONV" piqa --out x.jsonl p1.jsonl --labels "$FX"/piqa-labels.lst > x.err 2>&1; then fail "piqa with a labels file of another length accepted"
else [ "$(wc -l < x.err)" -eq 1 ] && [ ! -e x.jsonl ] && ok "labels of another split: $(cat x.err)" || fail "labels count: $(cat x.err)"; fi
printf '{"sentence": "no blank here", "option1": "a", "option2": "b", "answer": "1"}\n' > w1.jsonl
if "$PY" "$CONV" winogrande --out x.jsonl w1.jsonl > x.err 2>&1; then fail "a sentence without a blank accepted"
else grep -q "w1.jsonl:1:" x.err && [ ! -e x.jsonl ] && ok "winogrande without a blank: $(cat x.err)" || fail "no blank: $(cat x.err)"; fi

# ---------------------------------------------------------------- decoder path = full forward
cat > two.jsonl <<'EOF'
{"context": "The cat sat on the", "choices": [" mat.", " moon and the stars, far above the quiet town."], "label": 0}
{"context": "Water is", "choices": [" wet", " dry", " a kind of fish that swims"], "label": 1}
EOF
cat "$FX/generic.jsonl" two.jsonl winogrande.jsonl > mixed.jsonl   # winogrande: partial scoring, choices share the prompt before the option
# same TOL FILE_A FILE_B: per-choice log-likelihoods within TOL, same picks. 1e-4 where the cache
# stores fp32; a rounding codec (bf16, int_group) gets 5e-3: a value within an ulp of a rounding
# boundary rounds differently on the two paths (a step's matmul sums in another order than the
# full forward's), moving one log-likelihood by ~1e-3 at 2 bits; a wrong cache moves them by 1 and more.
same() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
def need(cond, msg):
    if not cond:
        print(msg)
        sys.exit(1)
tol = float(sys.argv[1])
a = [json.loads(l) for l in open(sys.argv[2])]
b = [json.loads(l) for l in open(sys.argv[3])]
need(len(a) == len(b) and a, "item counts differ")
worst = 0.0
for x, y in zip(a, b):
    need(x["pred"] == y["pred"] and x["pred_norm"] == y["pred_norm"], f"picks differ: {x} vs {y}")
    need(x["tokens"] == y["tokens"] and x["bytes"] == y["bytes"], f"tokens differ: {x} vs {y}")
    for u, v in zip(x["loglik"], y["loglik"]):
        worst = max(worst, abs(u - v))
need(worst <= tol, f"largest difference {worst:.3e} > {tol:g}")
print(f"{len(a)} items, largest difference {worst:.1e}")
PYEOF
}
for c in "gqa|fp32|1e-4" "gqa|bf16|5e-3" "cq|k_rope=fp32|1e-4" "cq|latent=int_group:bits=2,group=8|5e-3"; do
    IFS='|' read -r model codec tol <<< "$c"
    for path in dec full; do
        extra=(); [ $path = full ] && extra=(--full-forward)
        "${B[@]}" --checkpoint $model --bench mixed.jsonl --shots 1 --cache-codec "$codec" --json --items-out "$path.items" --overwrite "${extra[@]}" \
            > "$path.json" 2> "$path.err" || fail "$model $codec $path: $(tail -n 1 "$path.err")"
    done
    if msg=$(same "$tol" dec.items full.items 2>&1); then ok "$model, cache $codec: decoder = full forward ($msg, tolerance $tol)"; else fail "$model $codec: $msg"; fi
    a=$(grep -o '"acc":[^,]*,"acc_stderr":[^,]*,"acc_norm":[^,]*' dec.json) b=$(grep -o '"acc":[^,]*,"acc_stderr":[^,]*,"acc_norm":[^,]*' full.json)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "$model, cache $codec: the same $a" || fail "$model $codec: [$a] vs [$b]"
done
"${B[@]}" --checkpoint cq --bench mixed.jsonl --cache-codec latent=int_group:bits=2,group=8 --items-out q2.items > /dev/null 2>&1
"${B[@]}" --checkpoint cq --bench mixed.jsonl --items-out q4.items > /dev/null 2>&1
if ! same 1e-4 q2.items q4.items > /dev/null 2>&1; then ok "the cache codec reaches the scores (2-bit latent differs from the trained 4-bit)"
else fail "a 2-bit latent scored as the 4-bit one"; fi
"${B[@]}" --checkpoint gqa --bench mixed.jsonl --bench two.jsonl > md.out 2> md.err
[ "$(sed -n 1p md.out)" = "| checkpoint | cache | bytes/token | shots | mixed acc | mixed acc_norm | two acc | two acc_norm |" ] &&
    grep -q '^| gqa | k=bf16 v=bf16 | 128 | 0 | ' md.out && ok "markdown: one row, columns per benchmark" || fail "markdown: $(cat md.out md.err)"
"${B[@]}" --checkpoint gqa --bench two.jsonl --bench "$FX/hellaswag.jsonl" --json > js.out 2> js.err
[ "$(grep -c '"checkpoint":"gqa","benchmark":' js.out)" -eq 2 ] && grep -q '"items":2' js.out && ok "--json: one object per benchmark" ||
    fail "json: $(cat js.out js.err)"
# a file name that is not UTF-8: every --json and --items-out line must still be JSON (UTF-8)
cp two.jsonl "$(printf 'b\377.jsonl')"
"${B[@]}" --checkpoint gqa --bench "$(printf 'b\377.jsonl')" --json --items-out ff.items > ff.out 2> ff.err &&
    "$PY" -c 'import json, sys
for f in sys.argv[1:]:
    for line in open(f, encoding="utf-8"): json.loads(line)' ff.out ff.items 2>> ff.err &&
    ok "--json and --items-out of a benchmark file named with a 0xFF byte are JSON" || fail "non-UTF-8 benchmark name: $(tail -n 2 ff.err)"
mkdir -p bdir && cp two.jsonl bdir/b.jsonl && cp "$FX/hellaswag.jsonl" bdir/a.jsonl && echo x > bdir/notes.txt
"${B[@]}" --checkpoint gqa --bench bdir --json > dir.out 2> dir.err
[ "$(grep -o '"benchmark":"[a-z]*"' dir.out | tr '\n' ' ')" = '"benchmark":"a" "benchmark":"b" ' ] &&
    ok "--bench DIR: its *.jsonl files in name order" || fail "--bench DIR: $(cat dir.out dir.err)"
"${B[@]}" --checkpoint gqa --bench "$FX/generic.jsonl" --limit 1 --json > lim.out 2>&1 && grep -q '"items":1,' lim.out &&
    ok "--limit 1 scores one item" || fail "limit: $(cat lim.out)"

# white space ending a context goes to the continuation, as lm-evaluation-harness moves it: "is " +
# "wet" is scored as "is" + " wet" (it was tokenized as "is " and "wet", tokens the joined text never has)
# Unicode white space too, as Python's rstrip() (an ideographic space and a no-break space)
printf '%s\n' '{"context": "Water is ", "choices": ["wet", "dry"], "label": 0}' \
    '{"context": "The cat sat on the\n", "choices": ["mat.", "moon."], "label": 0}' \
    '{"context": "Answer:\u3000\u00a0", "choices": ["A", "B"], "label": 0}' > ws_a.jsonl
printf '%s\n' '{"context": "Water is", "choices": [" wet", " dry"], "label": 0}' \
    '{"context": "The cat sat on the", "choices": ["\nmat.", "\nmoon."], "label": 0}' \
    '{"context": "Answer:", "choices": ["\u3000\u00a0A", "\u3000\u00a0B"], "label": 0}' > ws_b.jsonl
for f in ws_a ws_b; do "${B[@]}" --checkpoint gqa --bench $f.jsonl --cache-codec fp32 --items-out $f.items > /dev/null 2>&1; done
if "$PY" - ws_a.items ws_b.items <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (a, b)
for x, y, moved in zip(a, b, [1, 1, 5]):
    assert x["tokens"] == y["tokens"], (x, y)
    assert all(abs(u - v) <= 1e-4 for u, v in zip(x["loglik"], y["loglik"])), (x, y)
    assert [n + moved for n in x["bytes"]] == y["bytes"], (x, y)   # acc_norm: each choice's own bytes
PYEOF
then ok "a context's trailing white space is scored with the continuation (lm-evaluation-harness's rule)"
else fail "trailing white space: $(cat ws_a.items ws_b.items)"; fi

# a context longer than the model's: cut on the left, the same on both paths; a continuation too long: refused
sed 's/"max_position_embeddings": 256/"max_position_embeddings": 32, "train": {"seq_len": 32}/' gqa.json > short.json
"$CLLA" init --config short.json --out short > /dev/null 2>&1
echo '{"context": "The cat sat on the mat and looked at the dog, who sat on the rug and looked back at the cat, and then", "choices": [" they slept.", " it rained."], "label": 0}' > long.jsonl
for path in dec full; do
    extra=(); [ $path = full ] && extra=(--full-forward)
    "${B[@]}" --checkpoint short --bench long.jsonl --cache-codec fp32 --items-out "long_$path.items" "${extra[@]}" > /dev/null 2> long.err
done
if grep -q '"truncated":true' long_dec.items && msg=$(same 1e-4 long_dec.items long_full.items 2>&1); then ok "a context beyond max_position_embeddings is cut on the left, both paths alike ($msg)"
else fail "long context: $(cat long_dec.items long.err) ${msg:-}"; fi
echo '{"context": "a", "choices": [" one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen", " b"], "label": 1}' > longcont.jsonl
if "${B[@]}" --checkpoint short --bench longcont.jsonl > x.out 2> x.err; then fail "a continuation longer than the context accepted"
else [ "$(wc -l < x.err)" -eq 1 ] && grep -q "continuation has" x.err && ok "a continuation longer than the model's context: $(cat x.err)" || fail "long continuation: $(cat x.err)"; fi
# a continuation of exactly max_position_embeddings (32) tokens fits: the model reads one context
# token and all but the last of it; 33 do not, and a later file holding such an item stops the run
# before the first file is scored or printed
c32=$(printf ' a%.0s' $(seq 32))
n32=$("$CLLA" tokenizer encode --tokenizer tok.tok --text "$c32" | wc -w)
printf '{"context": "b", "choices": ["%s", " b"], "label": 0}\n' "$c32" > c32.jsonl
printf '{"context": "b", "choices": ["%s a", " b"], "label": 0}\n' "$c32" > c33.jsonl
if [ "$n32" = 32 ] && "${B[@]}" --checkpoint short --bench c32.jsonl --json > c32.out 2> c32.err && grep -q '"items":1,' c32.out; then
    ok "a continuation of max_position_embeddings (32) tokens is scored"
else fail "a 32-token continuation ($n32 tokens): $(cat c32.out c32.err)"; fi
if "${B[@]}" --checkpoint short --bench c32.jsonl --bench c33.jsonl --json > c2.out 2> c2.err; then fail "a 33-token continuation accepted"
elif [ ! -s c2.out ] && [ "$(wc -l < c2.err)" -eq 1 ] && grep -q "c33.jsonl:1: choice 0's continuation has 33 tokens" c2.err; then
    ok "a too long continuation in the second file stops the run before the first is scored: $(cat c2.err)"
else fail "33-token continuation in a second file: $(cat c2.out c2.err)"; fi

# ---------------------------------------------------------------- the shipped benchmark's construction
MK="$SRC/eval/make_heldout_bench.py"
"$PY" "$MK" --corpus "$SRC/tests/fixtures/english.jsonl" --lang en --val-fraction 0.3 --dev 2 --out h1.jsonl --docs-out docs.jsonl > mk.log 2>&1 &&
"$PY" "$MK" --corpus "$SRC/tests/fixtures/english.jsonl" --lang en --val-fraction 0.3 --dev 2 --out h2.jsonl >> mk.log 2>&1 ||
    fail "make_heldout_bench.py: $(cat mk.log)"
cmp -s h1.jsonl h2.jsonl && [ "$(grep -c '"split": "dev"' h1.jsonl)" -eq 2 ] && [ "$(wc -l < h1.jsonl)" -gt 4 ] &&
    ok "make_heldout_bench.py: the same bytes twice, $(wc -l < h1.jsonl) items, 2 dev" || fail "held-out bench: $(cat mk.log)"
# its held-out documents are clla prep's validation split: the same documents, the same tokens
"$CLLA" prep --tokenizer tok.tok --out sp --val-fraction 0.3 "$SRC/tests/fixtures/english.jsonl" > sp.log 2>&1
"$CLLA" prep --tokenizer tok.tok --out sd --val-fraction 0 docs.jsonl > sd.log 2>&1
val=$(grep -o 'val [0-9]* tokens ([0-9]* documents' sp.log | sed 's/val //') held=$(grep -o 'train [0-9]* tokens ([0-9]* documents' sd.log | sed 's/train //')
[ -n "$val" ] && [ "$val" = "$held" ] && ok "its documents are clla prep's validation split ($val))" || fail "prep val [$val], held out [$held]"
"$PY" - h1.jsonl docs.jsonl <<'PYEOF' && ok "every passage and right answer is text of a held-out document" || fail "a passage or answer not from the held-out documents"
import json, re, sys
docs = [re.sub(r"\s+", " ", json.loads(l)["text"]) for l in open(sys.argv[2])]
for l in open(sys.argv[1]):
    o = json.loads(l)
    right = o["choices"][o["label"]].strip()
    if not any(o["context"] in d and right in d for d in docs):
        sys.exit(1)
PYEOF
"${B[@]}" --checkpoint gqa --bench h1.jsonl --shots 2 --json > h1.out 2> h1.err && grep -q '"shots":2' h1.out &&
    ok "clla scores it 2-shot" || fail "score held-out: $(cat h1.err)"
for lang in en zh; do
    corpus="$SRC/data_cache/corpus/$([ $lang = en ] && echo english || echo chinese).jsonl"
    if [ ! -s "$corpus" ]; then echo "skip the shipped heldout_$lang.jsonl: $corpus is missing (scripts/setup.sh builds it)"; continue; fi
    "$PY" "$MK" --corpus "$corpus" --lang $lang --out ship_$lang.jsonl > /dev/null 2>&1
    cmp -s ship_$lang.jsonl "$SRC/eval/benchmarks/heldout_$lang.jsonl" && ok "eval/benchmarks/heldout_$lang.jsonl is what the script makes from $corpus" ||
        fail "eval/benchmarks/heldout_$lang.jsonl differs from the script's output: rerun it (docs/BENCHMARKS.md)"
done

# ---------------------------------------------------------------- bad input
bad() {   # bad NAME GREP ARGS...: exit != 0, one line on stderr matching GREP, nothing on stdout, no --items-out file
    local name=$1 pat=$2; shift 2
    rm -f bad.items*
    if "${B[@]}" --checkpoint gqa --items-out bad.items "$@" > bad.out 2> bad.err; then fail "$name: accepted"; return; fi
    if [ "$(wc -l < bad.err)" -eq 1 ] && grep -q -- "$pat" bad.err && ! ls bad.items* > /dev/null 2>&1 && [ ! -s bad.out ]; then ok "$name: $(cat bad.err)"
    else fail "$name: $(cat bad.err)"; fi
}
{ head -n 3 "$FX/generic.jsonl"; echo '{"context": "broken", "choices": [" a", " b"], "label": 0'; tail -n 1 "$FX/generic.jsonl"; } > malformed.jsonl
bad "a malformed line" "malformed.jsonl:4:.*--skip-bad" --bench malformed.jsonl
"${B[@]}" --checkpoint gqa --bench malformed.jsonl --skip-bad --json > skip.out 2> skip.err
[ $? -eq 0 ] && grep -q '"items":2,"skipped_lines":1' skip.out && grep -q "malformed.jsonl:4:" skip.err &&
    ok "--skip-bad: line 4 warned about, the other 2 items scored" || fail "skip-bad: $(cat skip.out skip.err)"
echo '{"context": "c", "choices": [" a", " b"], "label": 2}' > range.jsonl
bad "a label out of range" "range.jsonl:1: label 2 is out of range" --bench range.jsonl
echo '{"context": "c", "choices": [" a", ""], "label": 0}' > empty.jsonl
bad "a bad second file stops the run before the first is scored" "range.jsonl:1: label 2" --bench two.jsonl --bench range.jsonl --json
bad "an empty choice" "empty.jsonl:1: choices\[1\] is empty" --bench empty.jsonl
echo '{"ctx": "x", "endings": ["a", "b", "c"], "label": "2"}' > hs3.jsonl
bad "a HellaSwag item with 3 endings" "hs3.jsonl:1: \"endings\" has 3 entries: a HellaSwag item has 4" --bench hs3.jsonl
echo '{"question": "q", "answers": ["a", "b"], "label": 0}' > unknown.jsonl
bad "an unknown format" "unknown benchmark format" --bench unknown.jsonl
cp two.jsonl self.jsonl
if "${B[@]}" --checkpoint gqa --bench self.jsonl --items-out self.jsonl --overwrite > self.out 2> self.err; then
    fail "--items-out naming the --bench file accepted"
elif [ "$(wc -l < self.err)" -eq 1 ] && grep -q "items-out 'self.jsonl' is the --bench file 'self.jsonl'" self.err && cmp -s two.jsonl self.jsonl; then
    ok "--items-out naming the --bench file, even with --overwrite, and the file as it was: $(cat self.err)"
else fail "--items-out onto its --bench input: $(cat self.err)"; fi
bad "more shots than the dev split holds" "needs 3 examples but the dev split holds 2" --bench "$FX/generic.jsonl" --shots 3
bad "a missing benchmark file" "cannot read benchmark" --bench nothere.jsonl
bad "--shots without --bench" "applies with --bench" --shots 1 --data x.bin
bad "--data with --bench" "not to --bench" --bench two.jsonl --data x.bin
bad "a shot count that is not a number" "shots" --bench two.jsonl --shots 2x
bad "--ppl with --bench (it scored the benchmark alone)" "--ppl applies to token data (--data, --ppl), not to --bench" --bench two.jsonl --ppl x.bin
bad "--stride with --bench" "--stride applies to token data (--data, --ppl), not to --bench" --bench two.jsonl --stride 3
# a model whose activations overflow (finite weights, one norm scaled by 3e38): its scores are not
# finite, so no accuracy (every pick among NaN was choice 0: an accuracy of the labels that are 0)
/usr/bin/python3 - gqa/model.safetensors <<'PY'
import array, json, os, shutil, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); d = bytearray(b[8 + n:])
lo, hi = h["model.norm.weight"]["data_offsets"]
x = array.array("f"); x.frombytes(bytes(d[lo:hi]))
d[lo:hi] = array.array("f", [max(-3.3e38, min(3.3e38, v * 3e38)) for v in x]).tobytes()
os.makedirs("huge", exist_ok=True); shutil.copy("gqa/config.json", "huge")
open("huge/model.safetensors", "wb").write(b[:8 + n] + bytes(d))
PY
rm -f nf.items
"${B[@]}" --checkpoint huge --bench two.jsonl --json --items-out nf.items > nf.out 2> nf.err
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l < nf.err | tr -d ' ')" -ge 1 ] && grep -q "are not finite: its weights have diverged" nf.err &&
    grep -q '"acc":null' nf.out && grep -q '"pred":null' nf.items
check $? "non-finite scores: acc null, pred null, exit 1 ($(tail -n 1 nf.err))"

# ---------------------------------------------------------------- ranks
# mpirun deals the items over the ranks and gathers the scores: the same numbers for 1 and 2 ranks
if command -v mpirun > /dev/null && ldd "$CLLA" 2> /dev/null | grep -q libmpi; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    R=(--checkpoint cq --bench "$SRC/eval/benchmarks/heldout_en.jsonl" --limit 7 --bench "$FX/hellaswag.jsonl" --json)
    OMP_NUM_THREADS=1 "${B[@]}" "${R[@]}" --items-out r1.items > r1.json 2> r1.err
    OMP_NUM_THREADS=1 timeout 120 mpirun --oversubscribe --bind-to none -np 2 "${B[@]}" "${R[@]}" --items-out r2.items > r2.json 2> r2.err
    strip() { sed 's/"seconds":[0-9.e+-]*,"forward_seconds":[0-9.e+-]*//' "$1"; }
    if [ -s r1.json ] && [ "$(wc -l < r2.json)" -eq 2 ] && [ "$(strip r1.json)" = "$(strip r2.json)" ] && cmp -s r1.items r2.items; then
        ok "1 and 2 ranks: the same results and per-item log-likelihoods ($(wc -l < r1.items) items)"
    else fail "1 vs 2 ranks: $(cat r1.json r1.err r2.json r2.err | head -c 600)"; fi
    # rank 1 started with another cache or scoring path (node-local scripts or files that differ):
    # refused once by rank 0 before any forward (it printed numbers of neither run, or rank 1
    # crashed writing past the gather's buffer and the job hung)
    printf '#!/usr/bin/env bash\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exec "$@" $R1ARGS\nexec "$@"\n' > r1args.sh
    chmod +x r1args.sh
    for extra in "--cache-codec fp32" "--full-forward"; do
        R1ARGS=$extra OMP_NUM_THREADS=1 timeout 120 mpirun --oversubscribe --bind-to none -x R1ARGS -np 2 ./r1args.sh "${B[@]}" "${R[@]}" \
            > dis.json 2> dis.err
        rc=$?
        [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c "rank 1 would score other items" dis.err)" = 1 ] && [ ! -s dis.json ]
        check $? "rank 1 with $extra: refused once before scoring (rc $rc: $(grep -m1 -o 'rank 1 would score[^:]*' dis.err))"
    done
else
    echo "skip (printed reason): 1 vs 2 ranks needs mpirun and a clla built with MPI"
fi
echo "test_bench_cli: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
