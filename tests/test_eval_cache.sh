#!/usr/bin/env bash
# clla eval --through-cache: perplexity with the scored tokens passing through the KV cache.
#  - the full forward with every codec's round trip and the token-by-token decode agree (1e-4);
#  - with fp32 everywhere but the trained int4 latent, the loss is plain clla eval's;
#  - the served layout (bf16 rope keys) and a 2-bit latent change the loss; bytes per token shown;
#  - --cache-codec without --through-cache, or for a part the model lacks: one line, exit != 0.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_eval_cache

"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 &&
"$CLLA" prep --tokenizer tok.tok --out shards --val-fraction 0.2 "$SRC/tests/fixtures/english.jsonl" >> setup.log 2>&1 &&
cat > m.json <<JSON
{"attention": "clla_quant", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
 "head_dim": 8, "kv_lora_rank": 16, "qk_rope_head_dim": 4, "latent_quant_group": 8, "intermediate_size": 48,
 "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "moe_capacity_factor": 0,
 "max_position_embeddings": 64, "initializer_range": 0.2, "train": {"seq_len": 24, "micro_batch": 4}}
JSON
"$CLLA" init --config m.json --out m >> setup.log 2>&1 || { echo "FAIL setup: $(tail -n 2 setup.log)"; echo "0 passed, 1 failed"; exit 1; }
E=("$CLLA" eval --checkpoint m --data shards/val --max-batches 2 --json)

"${E[@]}" > plain.json 2> plain.err || fail "plain eval: $(cat plain.err)"
"${E[@]}" --through-cache --cache-codec k_rope=fp32 --cache-codec own_k_rope=fp32 > f32.json 2> f32.err
plain=$(field plain.json loss) full=$(field f32.json loss) dec=$(field f32.json loss_decoded)
if near "$full" "$dec" 1e-4; then ok "fp32 rope keys: full forward $full = decoded $dec"; else fail "fp32: full $full vs decoded $dec ($(cat f32.err))"; fi
if near "$full" "$plain" 1e-5; then ok "fp32 rope keys + the trained int4 latent score as plain eval ($plain)"; else fail "through-cache $full vs plain $plain"; fi

"${E[@]}" --through-cache > served.json 2> served.err
full=$(field served.json loss) dec=$(field served.json loss_decoded) bpt=$(field served.json cache_bytes_per_token)
if near "$full" "$dec" 1e-4; then ok "served layout (bf16 rope keys): full $full = decoded $dec, $bpt bytes/token"; else fail "served: full $full vs decoded $dec"; fi
grep -q '"cache":"latent=int_group:bits=4,group=8 k_rope=bf16 own_k_rope=bf16"' served.json && ok "the codecs are named" || fail "codecs: $(cat served.json)"

"${E[@]}" --through-cache --cache-codec latent=int_group:bits=2,group=8 > q2.json 2> q2.err
q2=$(field q2.json loss) q2d=$(field q2.json loss_decoded)
if near "$q2" "$q2d" 1e-4 && ! near "$q2" "$full" 1e-4; then ok "a 2-bit latent changes the loss ($full -> $q2) and both paths agree"
else fail "2-bit latent: full $q2 decoded $q2d (4-bit $full)"; fi

# kivi (a block codec: the block being filled is read in fp16, so the "full" pass is the window
# extended through the cache a block per forward); both passes agree, the stored bits count the
# fp16 window of the 24-token window (16 encoded + 8 in fp16), the paper's do not
"${E[@]}" --through-cache --cache-codec latent=kivi:bits=2,group=8,residual=16 > kv.json 2> kv.err
kf=$(field kv.json loss) kd=$(field kv.json loss_decoded)
if near "$kf" "$kd" 1e-4 && ! near "$kf" "$full" 1e-4; then ok "kivi 2-bit latent: chunked $kf = decoded $kd, not the int4 loss $full"
else fail "kivi: chunked $kf decoded $kd ($(cat kv.err))"; fi
python3 - kv.json <<'PY' && ok "kivi bits: latent stored counts 16 encoded + 8 fp16 tokens of 16 channels, paper 2" || fail "kivi bits: $(cat kv.json)"
import json, sys
j = json.load(open(sys.argv[1]))
lat = j["bits_per_element"]["latent"]
# one closed block of 16 tokens: 16 channels x (fp16 scale + min) x 2 token groups + 16 x 16 x 2 bits; 8 tokens x 16 x fp16
want = 8 * (16 * 4 * 2 + 16 * 16 * 2 // 8 + 8 * 16 * 2) / (24 * 16)
assert abs(lat["stored"] - want) < 1e-3, (lat, want)
assert lat["paper"] == 2.0, lat
PY
# a residual below 16 is its own window (the cache block was at least 16 tokens: residual=8 scored
# as residual=16, and its bits counted a 16-token window)
"${E[@]}" --through-cache --cache-codec latent=kivi:bits=2,group=8,residual=8 > kv8.json 2> kv8.err
k8=$(field kv8.json loss) k8d=$(field kv8.json loss_decoded)
if near "$k8" "$k8d" 1e-4 && ! near "$k8" "$kf" 1e-6; then ok "kivi residual=8: its own window ($k8, residual=16 $kf), both passes agree"
else fail "kivi residual=8: chunked $k8 decoded $k8d, residual=16 $kf ($(cat kv8.err))"; fi
# parts of other residuals: the smaller keeps the larger's window, and a warning says so
"$CLLA" eval --checkpoint m --data shards/val --max-batches 1 --json --through-cache --cache-codec 'latent=kivi:bits=2,group=8,residual=16' \
    --cache-codec 'k_rope=kivi:bits=4,group=4,residual=8' > kvm.json 2> kvm.err
grep -q "part k_rope encodes blocks of 8 tokens, but the cache's blocks are 16 tokens .*its full-precision window is 16 tokens" kvm.err &&
    ok "a part with a smaller residual than the layout's block: warned" || fail "mixed residuals: $(cat kvm.err)"
# qjl on the latent: the keys' signs scored by the estimator, the values' records summed
"${E[@]}" --through-cache --cache-codec latent=qjl:m=64,group=8,buffer=16,bits=2 > qj.json 2> qj.err
jf=$(field qj.json loss) jd=$(field qj.json loss_decoded)
if near "$jf" "$jd" 1e-4 && ! near "$jf" "$full" 1e-4; then ok "qjl latent: chunked $jf = decoded $jd"
else fail "qjl: chunked $jf decoded $jd ($(cat qj.err))"; fi
grep -q '"latent":{"stored":[0-9.]*,"paper":6.0000' qj.json && ok "qjl latent paper bits: 64/16 sign bits + 2 value bits" || fail "qjl bits: $(cat qj.json)"
"$CLLA" eval --checkpoint m --data shards/val --max-batches 1 --through-cache --cache-codec latent=kivi:residual=12,group=8 > x.out 2> x.err &&
    fail "kivi residual 12 with group 8 accepted" || { grep -q "not a multiple" x.err && ok "kivi residual not a multiple of the group: $(cat x.err)" || fail "message: $(cat x.err)"; }

if "$CLLA" eval --checkpoint m --data shards/val --cache-codec fp32 > x.out 2> x.err; then fail "--cache-codec without --through-cache accepted"
else grep -q "through-cache" x.err && ok "--cache-codec without --through-cache: $(cat x.err)" || fail "message: $(cat x.err)"; fi
if "${E[@]}" --through-cache --cache-codec k=fp32 > x.out 2> x.err; then fail "a part the model lacks accepted"
else [ "$(wc -l < x.err)" -eq 1 ] && ok "a part the model lacks: $(cat x.err)" || fail "message: $(cat x.err)"; fi
echo "test_eval_cache: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
