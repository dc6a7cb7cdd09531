#!/usr/bin/env bash
# clla calibrate and the cq cache codec (model/codec_cq.c) in the cache layer:
#  - a latent model (cq on the latent and the rope keys) and a GQA model (cq, then qet, then kvquant, on K and V) are
#    calibrated into packages that carry the codebooks; through those caches the full forward and
#    the token-by-token decode give the same loss (1e-4), and generate runs;
#  - calibration is deterministic, and the Fisher weights change the codebooks;
#  - bad input: cq without calibration (export, eval), a calibration set smaller than the
#    codebook, another tokenizer's data, bits out of range, an unknown setting, nothing to fit,
#    codebooks of the wrong shape or missing: one line, exit != 0, nothing written.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_calibrate
refused() {   # NAME PATTERN [ABSENT_DIR] -- command...: exit != 0, one stderr line matching, ABSENT_DIR not created
    local name=$1 pat=$2 absent=$3
    shift 4
    if "$@" > x.out 2> x.err; then fail "$name: accepted"; return; fi
    if [ "$(wc -l < x.err)" -ne 1 ] || ! grep -Eq "$pat" x.err; then fail "$name: message" x.err; return; fi
    if [ -n "$absent" ] && [ -e "$absent" ]; then fail "$name: '$absent' was written"; return; fi
    ok "$name: $(cat x.err)"
}

F=$SRC/tests/fixtures/english.jsonl
{ "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$F" &&
  "$CLLA" prep --tokenizer tok.tok --out shards --val-fraction 0.2 "$F" &&
  "$CLLA" tokenizer train --vocab-size 280 --pattern gpt2 --out tok2.tok "$F" &&
  "$CLLA" prep --tokenizer tok2.tok --out shards2 --val-fraction 0.2 "$F"; } > setup.log 2>&1
for preset in clla gqa; do
    latent='"kv_lora_rank": 16, "qk_rope_head_dim": 4,'
    [ $preset = gqa ] && latent='"num_key_value_heads": 2,'
    cat > $preset.json <<JSON
{"attention": "$preset", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
 "head_dim": 8, $latent "intermediate_size": 48,
 "max_position_embeddings": 64, "initializer_range": 0.2,
 "train": {"data": "shards/train", "tokenizer": "tok.tok", "seq_len": 24, "micro_batch": 4, "max_steps": 3, "threads": 2}}
JSON
    "$CLLA" train --config $preset.json --out run_$preset --quiet >> setup.log 2>&1
done
[ -s run_clla/model.safetensors ] && [ -s run_gqa/model.safetensors ] || { echo "FAIL setup"; tail -n 5 setup.log; echo "0 passed, 1 failed"; exit 1; }

# ---- a latent model: cq on the latent and on the rope keys
C=("$CLLA" calibrate run_clla --data shards/train --tokens 512 --seq 16 --batch 4)
"${C[@]}" --cache-codec latent=cq:bits=4,c=2,iters=8 --cache-codec k_rope=cq:bits=4,c=2,iters=8 --out pk > pk.out 2> pk.err
if [ -s pk/cache_codecs.safetensors ] && grep -q "latent=cq:bits=4,c=2,iters=8" pk.out && grep -q "2.000 bits/element stored" pk.out; then
    ok "calibrate writes the package with its codebooks: $(head -n 1 pk.out)"
else fail "calibrate (latent)" pk.err; fi
"$CLLA" eval --checkpoint pk --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json > pk.json 2> pk.jerr
full=$(field pk.json loss) dec=$(field pk.json loss_decoded)
if near "$full" "$dec" 1e-4; then ok "latent cq: full forward $full = decoded $dec"; else fail "latent cq: full $full vs decoded $dec" pk.jerr; fi
"$CLLA" eval --checkpoint run_clla --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json > bf.json 2>/dev/null
bf=$(field bf.json loss)
if ! near "$full" "$bf" 1e-6; then ok "the codebooks change the loss (bf16 $bf, cq 2 bits/element $full)"; else fail "cq gives bf16's loss $bf"; fi
"$CLLA" eval --checkpoint pk --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json \
    --cache-codec latent=bf16 --cache-codec k_rope=bf16 > over.json 2> over.err
if near "$(field over.json loss)" "$bf" 1e-6; then ok "the package's cq parts overridden by --cache-codec bf16: the states dropped, bf16's loss"
else fail "override: $(cat over.json) vs bf16 $bf" over.err; fi
# the package's codec named again without its fit-only iters: the same codec, its codebooks kept
# (it was refused as a codec that needs calibrating), echoed with the iters they were fitted with
"$CLLA" eval --checkpoint pk --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json \
    --cache-codec latent=cq:bits=4,c=2 > again.json 2> again.err
if near "$(field again.json loss)" "$full" 1e-6 && grep -q '"cache":"latent=cq:bits=4,c=2,iters=8' again.json; then
    ok "the package's cq named again without iters: its codebooks kept ($full)"
else fail "cq named again without iters: $(head -c 300 again.json)" again.err; fi
"$CLLA" generate --model pk --prompt "The" --max-new-tokens 4 > gen.out 2> gen.err && [ -s gen.out ] &&
    ok "generate through the cq cache" || fail "generate" gen.err

# ---- calibration is deterministic; Fisher weights matter
"${C[@]}" --cache-codec latent=cq:bits=4,c=2,iters=8 --cache-codec k_rope=cq:bits=4,c=2,iters=8 --out pk2 > /dev/null 2>&1
cmp -s pk/cache_codecs.safetensors pk2/cache_codecs.safetensors && ok "calibrating twice gives the same codebooks" ||
    fail "two calibrations differ"
"${C[@]}" --cache-codec latent=cq:bits=4,c=2,iters=8 --cache-codec k_rope=cq:bits=4,c=2,iters=8 --no-fisher --out pu > /dev/null 2>&1
[ -s pu/cache_codecs.safetensors ] && ! cmp -s pk/cache_codecs.safetensors pu/cache_codecs.safetensors &&
    ok "Fisher-weighted codebooks differ from uniform ones" || fail "--no-fisher gave the same codebooks (or none)"

# ---- a GQA model: cq on K and V (one spec for every part)
"$CLLA" calibrate run_gqa --data shards/train --tokens 512 --seq 16 --batch 4 --cache-codec cq:bits=4,c=2,iters=8 --out pg > pg.out 2> pg.err ||
    fail "calibrate (gqa)" pg.err
"$CLLA" eval --checkpoint pg --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json > pg.json 2> pg.jerr
full=$(field pg.json loss) dec=$(field pg.json loss_decoded)
if near "$full" "$dec" 1e-4 && grep -q '"cache":"k=cq:bits=4,c=2,iters=8 v=cq:bits=4,c=2,iters=8"' pg.json; then
    ok "gqa cq on k and v: full forward $full = decoded $dec"
else fail "gqa cq: full $full vs decoded $dec" pg.jerr; fi
# re-fitting the package's own codec on other tokens: the part named is fitted anew, the other keeps its codebooks
"$CLLA" calibrate pg --data shards/val --tokens 256 --seq 16 --batch 4 --cache-codec k=cq:bits=4,c=2,iters=8 --out pgr > pgr.out 2> pgr.err
/usr/bin/python3 - pg/cache_codecs.safetensors pgr/cache_codecs.safetensors > pgr.cmp 2>&1 <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert set(a) == set(b), (sorted(a), sorted(b))
k = [n for n in a if ".k." in n]; v = [n for n in a if ".v." in n]
assert k and v and all(a[n] != b[n] for n in k) and all(a[n] == b[n] for n in v), "k changed %s, v kept %s" % (
    [a[n] != b[n] for n in k], [a[n] == b[n] for n in v])
print("%d k codebooks refitted, %d v codebooks kept" % (len(k), len(v)))
PY
[ $? -eq 0 ] && grep -q "kept" pgr.out && ok "calibrate a cq package again with k's own spec: $(cat pgr.cmp); $(head -n 1 pgr.out)" ||
    fail "re-fit of a package's codec: $(cat pgr.out pgr.err pgr.cmp)"
# a consumer's own k_rope weighs its samples alike: the run says nothing of Fisher weights (and
# runs no backward for them)
"${C[@]}" --cache-codec own_k_rope=cq:bits=2,c=2,iters=5 --out pok > pok.out 2> pok.err &&
    grep -q "^wrote pok" pok.out && ! grep -q "Fisher" pok.out
check $? "own_k_rope alone: not Fisher-weighted, and not said to be: $(head -n 1 pok.out | cut -c1-140)"
# ... with the settings named: another iters is used and recorded for k (it kept the fit's 8),
# v keeps its fit and its iters
"$CLLA" calibrate pg --data shards/val --tokens 256 --seq 16 --batch 4 --cache-codec k=cq:bits=4,c=2,iters=3 --out pgi > pgi.out 2> pgi.err
grep -q '"k":[[:space:]]*"cq:bits=4,c=2,iters=3"' pgi/config.json && grep -q '"v":[[:space:]]*"cq:bits=4,c=2,iters=8"' pgi/config.json &&
    ! cmp -s pgr/cache_codecs.safetensors pgi/cache_codecs.safetensors
check $? "a re-fit with iters=3 fits k with 3 iterations and records it, v keeps iters=8: $(head -n 1 pgi.out | cut -c1-120)"
# --dtype bf16 fits on the weights the package serves: the same tables as calibrating the bf16
# export, and its weights (it fitted on the fp32 masters)
D16=(--data shards/train --tokens 256 --seq 16 --batch 4 --cache-codec kvquant:bits=3)
"$CLLA" calibrate run_gqa "${D16[@]}" --dtype bf16 --out pb16 > /dev/null 2>&1 &&
    "$CLLA" export run_gqa --dtype bf16 --out pe16 > /dev/null 2>&1 &&
    "$CLLA" calibrate pe16 "${D16[@]}" --out pe16c > /dev/null 2>&1 &&
    cmp -s pb16/cache_codecs.safetensors pe16c/cache_codecs.safetensors && cmp -s pb16/model.safetensors pe16/model.safetensors
check $? "calibrate --dtype bf16 fits on the bf16 weights it writes: the tables of calibrating the bf16 export"

# ---- qet (QET's swap tree, product quantization and residual stage) on K and V
"$CLLA" calibrate run_gqa --data shards/train --tokens 512 --seq 16 --batch 4 --cache-codec qet:levels=1,width=4,k1=16,k2=4,iters=5 \
    --out pq > pq.out 2> pq.err || fail "calibrate qet" pq.err
"$CLLA" eval --checkpoint pq --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json > pq.json 2> pq.jerr
full=$(field pq.json loss) dec=$(field pq.json loss_decoded)
if near "$full" "$dec" 1e-4 && grep -q '"k":{"stored":2.0000,"paper":2.0000' pq.json && ! grep -q Fisher pq.out; then
    ok "gqa qet on k and v: full forward $full = decoded $dec, 2 bits/element, no Fisher pass"
else fail "gqa qet: full $full vs decoded $dec: $(cat pq.json pq.out)" pq.jerr; fi
# settings edited in config.json that keep the tables' shape (k1 and k2 swapped): refused, since
# cache_codecs.safetensors records what each table was fitted for (they were served as they were)
rm -rf pq_edit && cp -r pq pq_edit && sed -i 's/k1=16,k2=4/k1=4,k2=16/g' pq_edit/config.json
"$CLLA" eval --checkpoint pq_edit --data shards/val --max-batches 1 --batch 4 --seq 24 --through-cache --json > /dev/null 2> pqe.err
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l < pqe.err)" -eq 1 ] && grep -q "was fitted for qet:levels=1,width=4,k1=16,k2=4" pqe.err
check $? "a package whose qet settings were edited (same shapes) is refused: $(cat pqe.err)"

# ---- kvquant (pre-RoPE keys, Fisher-weighted datatypes, sparse outliers, an fp16 sink) on K and V
"$CLLA" calibrate run_gqa --data shards/train --tokens 512 --seq 16 --batch 4 --cache-codec kvquant:bits=3,outliers_permille=20 \
    --out pkv > pkv.out 2> pkv.err || fail "calibrate kvquant" pkv.err
"$CLLA" eval --checkpoint pkv --data shards/val --max-batches 2 --batch 4 --seq 24 --through-cache --json > pkv.json 2> pkv.jerr
full=$(field pkv.json loss) dec=$(field pkv.json loss_decoded)
if near "$full" "$dec" 1e-4 && grep -q '"k":{"stored":[0-9.]*,"paper":3.6400,"fitted_values":[1-9]' pkv.json && grep -q Fisher pkv.out; then
    ok "gqa kvquant on k and v: chunked $full = decoded $dec, paper bits 3 + 32 x 2%, Fisher-weighted"
else fail "gqa kvquant: chunked $full vs decoded $dec: $(cat pkv.json pkv.out)" pkv.jerr; fi
"$CLLA" calibrate run_gqa --data shards/train --tokens 512 --seq 16 --batch 4 --cache-codec kvquant:bits=3,outliers_permille=20 \
    --no-fisher --out pkvu > /dev/null 2>&1
[ -s pkvu/cache_codecs.safetensors ] && ! cmp -s pkv/cache_codecs.safetensors pkvu/cache_codecs.safetensors &&
    ok "kvquant: Fisher-weighted datatypes differ from uniform ones" || fail "kvquant --no-fisher gave the same datatypes (or none)"
"$CLLA" calibrate run_gqa --data shards/train --tokens 512 --seq 16 --batch 4 --cache-codec kvquant:bits=2 --out pkv2 > /dev/null 2>&1
cp pkv2/cache_codecs.safetensors pkvu/cache_codecs.safetensors
refused "kvquant datatypes of the wrong shape" "has shape \[36\].*needs \[40\]" "" -- "$CLLA" eval --checkpoint pkvu --data shards/val --through-cache
refused "kvquant bits the paper has no datatype for" "nuq2, nuq3 and nuq4" pt -- \
    "$CLLA" calibrate run_gqa --data shards/train --cache-codec kvquant:bits=5 --out pt
refused "kvquant outliers beyond half" "outliers_permille=600" pt -- \
    "$CLLA" calibrate run_gqa --data shards/train --cache-codec kvquant:outliers_permille=600 --out pt

# ---- bad input
refused "export with cq (no codebooks)" "calibrate" px -- "$CLLA" export run_clla --cache-codec latent=cq --out px
refused "eval through an uncalibrated cq cache" "calibrate" "" -- "$CLLA" eval --checkpoint run_clla --data shards/val --through-cache --cache-codec latent=cq
refused "fewer calibration tokens than centroids" "smaller than the codebook|fewer" pt -- \
    "$CLLA" calibrate run_clla --data shards/train --tokens 8 --seq 8 --batch 1 --cache-codec latent=cq:bits=4,c=2 --out pt
# the samples are counted before any is taken (CLLA_TEST_MEM_AVAILABLE stands in for the memory left)
refused "samples past the memory left" "the calibration samples \\(5000 tokens of .* need .* but only 97.7 KiB are available.*lower --tokens" pt -- \
    env CLLA_TEST_MEM_AVAILABLE=100000 "$CLLA" calibrate run_gqa --data shards/train --tokens 5000 --seq 16 --batch 4 --cache-codec cq:bits=4,c=2 --out pt
refused "another tokenizer's data" "tokenizer" pt -- "$CLLA" calibrate run_clla --data shards2/train --cache-codec latent=cq --out pt
refused "bits out of range" "bits=13" pt -- "$CLLA" calibrate run_clla --data shards/train --cache-codec latent=cq:bits=13 --out pt
refused "unknown setting" "no setting 'd'" pt -- "$CLLA" calibrate run_clla --data shards/train --cache-codec latent=cq:d=3 --out pt
refused "c not dividing the width" "c=3 does not divide" pt -- "$CLLA" calibrate run_clla --data shards/train --cache-codec latent=cq:c=3 --out pt
refused "c spanning two heads (head 8, K width 16)" "c=16 does not divide the head width 8" pt -- \
    "$CLLA" calibrate run_gqa --data shards/train --cache-codec k=cq:c=16 --out pt
refused "nothing to fit" "no cache codec to fit" pt -- "$CLLA" calibrate run_clla --data shards/train --cache-codec bf16 --out pt
"${C[@]}" --cache-codec latent=cq:bits=4,c=4,iters=8 --cache-codec k_rope=cq:bits=4,c=2,iters=8 --out pc4 > /dev/null 2>&1
cp pc4/cache_codecs.safetensors pk2/cache_codecs.safetensors
refused "codebooks of the wrong shape" "has shape \[4, 16, 4\].*needs \[8, 16, 2\]" "" -- "$CLLA" eval --checkpoint pk2 --data shards/val --through-cache
rm pk2/cache_codecs.safetensors
refused "codebooks missing" "holds no cache_codecs.safetensors" "" -- "$CLLA" eval --checkpoint pk2 --data shards/val --through-cache
echo "test_calibrate: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
