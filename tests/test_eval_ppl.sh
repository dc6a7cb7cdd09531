#!/usr/bin/env bash
# clla eval --ppl (eval/perplexity.c): sliding-window perplexity of a text or token file.
#  - stride = window: the windows are the token file's consecutive windows, so the loss is
#    plain clla eval --data's on the same file (1e-6);
#  - every token but the first is scored exactly once whatever the stride, in the expected
#    number of windows; the batch size changes nothing (1e-6);
#  - a text file scores as the token file of its ids (clla tokenizer encode), a .jsonl's texts
#    are joined by <|endoftext|>;
#  - --through-cache: fp32 gives the plain loss, both passes agree, 2-bit caches move it;
#  - bad input: a stride longer than the window, --ppl with --data, --cache-codec without --through-cache, --stride without --ppl, an id
#    outside the vocabulary, a .bin of a partial id, a 1-token file, a bad JSONL line: one line.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_eval_ppl
refused() {   # NAME PATTERN -- command...
    local name=$1 pat=$2
    shift 3
    if "$@" > x.out 2> x.err; then fail "$name: accepted"; return; fi
    [ "$(wc -l < x.err)" -eq 1 ] && grep -Eq "$pat" x.err && ok "$name: $(cat x.err)" || fail "$name: message" x.err
}
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1
cat > m.json <<JSON
{"attention": "gqa", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "max_position_embeddings": 64, "initializer_range": 0.2,
 "train": {"seq_len": 16, "micro_batch": 2, "tokenizer": "tok.tok"}}
JSON
"$CLLA" init --config m.json --out m >> setup.log 2>&1 || { echo "FAIL setup"; cat setup.log; echo "0 passed, 1 failed"; exit 1; }
E=("$CLLA" eval --checkpoint m --json)

write_tokens t65.bin 65 7 256   # 4 windows of 16 + 1
"${E[@]}" --data t65.bin --seq 16 --batch 2 > d.json 2> d.err
"${E[@]}" --ppl t65.bin --seq 16 --stride 16 --batch 2 > p.json 2> p.err
if near "$(field d.json loss)" "$(field p.json loss)" 1e-6 && [ "$(field p.json tokens)" = 64 ]; then
    ok "stride = window: the loss of eval --data ($(field d.json loss)), 64 tokens"
else fail "stride 16: $(cat p.json p.err) vs $(cat d.json d.err)"; fi

write_tokens t50.bin 50 3 256
for sw in "16 4" "5 8" "1 34" "3 12"; do   # windows: ceil((49 - 16) / S) + 1
    set -- $sw
    "${E[@]}" --ppl t50.bin --seq 16 --stride "$1" --batch 3 > s.json 2> s.err
    "${E[@]}" --ppl t50.bin --seq 16 --stride "$1" --batch 1 > s1.json 2> s1.err
    if [ "$(field s.json tokens)" = 49 ] && [ "$(field s.json windows)" = "$2" ] && near "$(field s.json loss)" "$(field s1.json loss)" 1e-6; then
        ok "stride $1: 49 tokens scored once in $2 windows; batch 3 = batch 1 ($(field s.json loss))"
    else fail "stride $1: $(cat s.json s.err) vs batch 1 $(cat s1.json)"; fi
done
# an MoE model with a training capacity (1.0, top-1 of 4): --ppl scores it as it serves, without
# the capacity, so the batch changes nothing; --data keeps training's capacity per forward (it
# reproduces val_loss), so there the batch moves the loss
sed 's/"initializer_range": 0.2,/"initializer_range": 0.2, "n_routed_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 16, "moe_capacity_factor": 1.0,/' m.json > moe.json
"$CLLA" init --config moe.json --out mm >> setup.log 2>&1
EM=("$CLLA" eval --checkpoint mm --json)
"${EM[@]}" --ppl t50.bin --seq 16 --stride 8 --batch 3 > m3.json 2> m3.err
"${EM[@]}" --ppl t50.bin --seq 16 --stride 8 --batch 1 > m1.json 2> m1.err
"${EM[@]}" --data t50.bin --seq 16 --batch 3 > md3.json 2> md3.err
"${EM[@]}" --data t50.bin --seq 16 --batch 1 > md1.json 2> md1.err
if near "$(field m3.json loss)" "$(field m1.json loss)" 1e-6 && ! near "$(field md3.json loss)" "$(field md1.json loss)" 1e-6; then
    ok "MoE with capacity: --ppl batch 3 = batch 1 ($(field m3.json loss)); --data moves with the batch as training's validation does ($(field md3.json loss) / $(field md1.json loss))"
else fail "MoE --ppl: batch 3 $(cat m3.json m3.err), batch 1 $(cat m1.json); --data $(cat md3.json) / $(cat md1.json)"; fi

python3 -c '
import json, sys
docs = [json.loads(l)["text"][:600] for l in open(sys.argv[1]) if l.strip()][:2]
open("doc.txt", "w").write(docs[0])
open("docs.jsonl", "w").write("".join(json.dumps({"text": d}) + "\n" for d in docs))' "$SRC/tests/fixtures/english.jsonl"
"$CLLA" tokenizer encode --tokenizer tok.tok --file doc.txt | python3 -c '
import struct, sys
ids = [int(x) for x in sys.stdin.read().split()]
open("doc.bin", "wb").write(struct.pack("<%dI" % len(ids), *ids))'
"${E[@]}" --ppl doc.txt --seq 16 --stride 8 > t.json 2> t.err
"${E[@]}" --ppl doc.bin --seq 16 --stride 8 > b.json 2> b.err
if near "$(field t.json loss)" "$(field b.json loss)" 1e-7 && [ "$(field t.json tokens)" = "$(field b.json tokens)" ]; then
    ok "a text scores as the token file of its ids ($(field t.json tokens) tokens)"
else fail "text $(cat t.json t.err) vs ids $(cat b.json b.err)"; fi
"${E[@]}" --ppl docs.jsonl --seq 16 > j.json 2> j.err && [ -n "$(field j.json loss)" ] && ok "a .jsonl of texts: $(cat j.json)" || fail "jsonl" j.err
# an empty document adds nothing, not even a separator, as prep reads the file (it added a second
# <|endoftext|> in a row)
{ head -n 1 docs.jsonl; echo '{"text": ""}'; tail -n 1 docs.jsonl; } > docs_empty.jsonl
"${E[@]}" --ppl docs_empty.jsonl --seq 16 > je.json 2> je.err
if near "$(field je.json loss)" "$(field j.json loss)" 1e-9 && [ "$(field je.json tokens)" = "$(field j.json tokens)" ]; then
    ok "an empty JSONL document is skipped ($(field je.json tokens) tokens either way)"
else fail "empty document: $(cat je.json je.err) vs $(cat j.json)"; fi

# through the KV cache (eval/perplexity.c eval_strided_cache): the same windows, scored tokens
# passing through the codecs; fp32 gives plain --ppl's loss, both passes agree, 2 bits move it
"${E[@]}" --ppl t50.bin --seq 16 --stride 8 --batch 3 > c0.json 2> c0.err
"${E[@]}" --ppl t50.bin --seq 16 --stride 8 --batch 3 --through-cache --cache-codec fp32 > c1.json 2> c1.err
"${E[@]}" --ppl t50.bin --seq 16 --stride 8 --batch 3 --through-cache --cache-codec int_group:bits=2,group=8 > c2.json 2> c2.err
"${E[@]}" --ppl t50.bin --seq 16 --stride 8 --batch 3 --through-cache --cache-codec kivi:bits=2,group=4,residual=4 > c3.json 2> c3.err
l0=$(field c0.json loss) l1=$(field c1.json loss) d1=$(field c1.json loss_decoded) l2=$(field c2.json loss) d2=$(field c2.json loss_decoded)
l3=$(field c3.json loss) d3=$(field c3.json loss_decoded)
if near "$l0" "$l1" 1e-5 && near "$l1" "$d1" 1e-5 && [ "$(field c1.json tokens)" = "$(field c0.json tokens)" ]; then
    ok "--ppl through an fp32 cache = plain --ppl ($l0), decoded $d1"
else fail "fp32 cache: plain $l0, full $l1, decoded $d1" c1.err; fi
if near "$l2" "$d2" 1e-4 && ! near "$l2" "$l0" 1e-4 && near "$l3" "$d3" 1e-5 && ! near "$l3" "$l0" 1e-5; then
    ok "--ppl through 2-bit caches: int_group $l2 = $d2, kivi $l3 = $d3 (plain $l0)"
else fail "2-bit caches: int_group $l2 / $d2, kivi $l3 / $d3, plain $l0" c2.err; fi
# a finite loss past exp's range (about 709): --json stays JSON, the perplexity null, in every mode
/usr/bin/python3 - <<'PY'
import array, json, os, shutil, struct
b = open("m/model.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); d = bytearray(b[8 + n:])
lo, hi = h["model.norm.weight"]["data_offsets"]
x = array.array("f"); x.frombytes(bytes(d[lo:hi])); d[lo:hi] = array.array("f", [v * 3000 for v in x]).tobytes()
os.makedirs("big", exist_ok=True); shutil.copy("m/config.json", "big")
open("big/model.safetensors", "wb").write(b[:8 + n] + bytes(d))
PY
bad_json=""
for mode in "--data t65.bin --batch 2" "--ppl t65.bin" "--ppl t65.bin --through-cache" "--data t65.bin --through-cache"; do
    "$CLLA" eval --checkpoint big --json --seq 16 $mode > big.json 2> big.err
    /usr/bin/python3 -c '
import json, math, sys
o = json.loads(open(sys.argv[1]).read(), parse_constant=lambda c: sys.exit("not JSON: " + c))
assert o["loss"] > 709 and math.isfinite(o["loss"]) and o["perplexity"] is None
assert o.get("perplexity_decoded", None) is None' big.json 2>> big.err || bad_json="$bad_json [$mode: $(cat big.json big.err)]"
done
[ -z "$bad_json" ] && ok "a loss of $(field big.json loss): perplexity null, valid JSON, in all four modes" || fail "overflowing perplexity:$bad_json"
refused "--cache-codec without --through-cache" "applies with --through-cache" -- "${E[@]}" --ppl t50.bin --cache-codec fp32
refused "stride longer than the window" "stride 17 is longer" -- "${E[@]}" --ppl t50.bin --seq 16 --stride 17
refused "--ppl with --data" "does not apply to --ppl" -- "${E[@]}" --ppl t50.bin --data t50.bin
refused "--stride without --ppl" "applies with --ppl" -- "${E[@]}" --data t50.bin --stride 4
python3 -c 'import struct; open("big.bin", "wb").write(struct.pack("<3I", 5, 300, 7))'
refused "an id outside the vocabulary" "outside the model's vocabulary of 300" -- "${E[@]}" --ppl big.bin
head -c 10 t50.bin > odd.bin
refused "a partial id" "not a whole number of uint32" -- "${E[@]}" --ppl odd.bin
head -c 4 t50.bin > one.bin
refused "one token" "at least 2" -- "${E[@]}" --ppl one.bin
printf '{"text": "a"}\nnot json\n' > bad.jsonl
refused "a bad JSONL line" "line 2" -- "${E[@]}" --ppl bad.jsonl
printf '{"text": "a"}\n\n\n{"text": 5}\n' > blank.jsonl
refused "a bad JSONL line after blank lines: its own number" "line 4: not a JSON object" -- "${E[@]}" --ppl blank.jsonl
refused "a missing file" "cannot read" -- "${E[@]}" --ppl nothere.txt
# a batch whose activations exceed the memory left (CLLA_TEST_MEM_AVAILABLE stands in for
# MemAvailable): refused at model_set_batch in one line, not killed by the kernel
refused "activations beyond the available memory" "a forward over 3 rows of 16 tokens needs [0-9.]+ KiB of activations .* but only 4.0 KiB are available .*smaller batch" -- \
    env CLLA_TEST_MEM_AVAILABLE=4096 "${E[@]}" --ppl t65.bin --seq 16 --stride 16 --batch 3
echo "test_eval_ppl: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
