#!/usr/bin/env bash
# clla eval --bench against the PyTorch twin (tests/reference/twin.py loglik): a 2-item benchmark
# on tiny random models; the twin computes every choice's continuation log-likelihood with the
# float64 full forward from the token ids `clla tokenizer encode` gives for the context and the
# choice (encoded apart, as eval/bench.c does). clla's per-choice log-likelihoods, through an fp32
# cache (decoder) and through the full forward, match within 1e-4; acc, acc_norm (sum / bytes)
# and their standard errors equal the ones computed here from the twin's numbers.
set -u
. "$(dirname "$0")/lib/twin.sh"
. "$(dirname "$0")/lib/check.sh" test_twin_bench

"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 || {
    echo "FAIL setup: $(tail -n 2 setup.log)"; echo "0 passed, 1 failed"; exit 1; }
cat > two.jsonl <<'EOF'
{"context": "The cat sat on the", "choices": [" mat.", " moon and the stars, far above the town.", " rug"], "label": 0}
{"context": "She opened the door and", "choices": [" walked in.", " the"], "label": 1}
EOF
BASE='"vocab_size": 300, "hidden_size": 32, "num_attention_heads": 4, "head_dim": 8, "intermediate_size": 48,
      "max_position_embeddings": 64, "initializer_range": 0.3, "train": {"seq_len": 64}'
CASES=(
  "gqa|\"attention\": \"gqa\", \"num_key_value_heads\": 2, \"num_hidden_layers\": 2|fp32"
  "clla|\"attention\": \"clla\", \"kv_lora_rank\": 16, \"qk_rope_head_dim\": 4, \"num_hidden_layers\": 3|fp32"
)
enc() { "$CLLA" tokenizer encode --tokenizer tok.tok --text "$1" | tr ' ' ','; }
for c in "${CASES[@]}"; do
    IFS='|' read -r name keys codec <<< "$c"
    printf '{%s, %s}\n' "$keys" "$BASE" > "$name.json"
    "$CLLA" init --config "$name.json" --out "m_$name" > "$name.log" 2>&1 || { fail "$name: clla init: $(tail -n 1 "$name.log")"; continue; }
    # the twin's log-likelihoods, one line per choice: item, choice, sum, bytes
    : > "$name.twin"
    i=0
    while IFS= read -r line; do
        ctx=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["context"])' "$line")
        conts=()
        n=$("$PY" -c 'import json,sys; print(len(json.loads(sys.argv[1])["choices"]))' "$line")
        for ((k = 0; k < n; k++)); do
            ch=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][int(sys.argv[2])])' "$line" $k)
            conts+=(--cont "$(enc "$ch")")
        done
        "$PY" "$TWIN" loglik --model "m_$name" --ctx "$(enc "$ctx")" "${conts[@]}" 2>> "$name.log" | awk -v i=$i '{print i, NR - 1, $1}' >> "$name.twin"
        i=$((i + 1))
    done < two.jsonl
    for path in decoder full; do
        extra=(); [ $path = full ] && extra=(--full-forward)
        "$CLLA" eval --checkpoint "m_$name" --tokenizer tok.tok --bench two.jsonl --cache-codec "$codec" --json \
            --items-out "$name.$path.items" "${extra[@]}" > "$name.$path.json" 2>> "$name.log" ||
            { fail "$name $path: $(tail -n 1 "$name.log")"; continue; }
        if msg=$("$PY" - "$name.twin" "$name.$path.items" "$name.$path.json" two.jsonl <<'PYEOF'
import json, math, sys
twin = {}
for line in open(sys.argv[1]):
    i, c, s = line.split()
    twin[(int(i), int(c))] = float(s)
items = [json.loads(l) for l in open(sys.argv[2])]
res = json.loads(open(sys.argv[3]).read())
bench = [json.loads(l) for l in open(sys.argv[4])]
if len(items) != 2 or len(twin) != sum(len(b["choices"]) for b in bench):
    print(f"{len(items)} items scored, {len(twin)} twin values"); sys.exit(1)
worst, acc, accn = 0.0, 0, 0
for i, (it, b) in enumerate(zip(items, bench)):
    ll = [twin[(i, c)] for c in range(len(b["choices"]))]
    nb = [len(ch.encode("utf-8")) for ch in b["choices"]]
    worst = max([worst] + [abs(x - y) for x, y in zip(ll, it["loglik"])])
    if it["bytes"] != nb:
        print(f"item {i}: bytes {it['bytes']}, want {nb}"); sys.exit(1)
    pick = max(range(len(ll)), key=lambda c: (ll[c], -c))
    pickn = max(range(len(ll)), key=lambda c: (ll[c] / nb[c], -c))
    acc += pick == b["label"]
    accn += pickn == b["label"]
n = len(items)
want = {"acc": acc / n, "acc_norm": accn / n,
        "acc_stderr": math.sqrt(acc / n * (1 - acc / n) / (n - 1)), "acc_norm_stderr": math.sqrt(accn / n * (1 - accn / n) / (n - 1))}
bad = [f"{k} {res[k]} want {v}" for k, v in want.items() if abs(res[k] - v) > 1e-12]
if worst > 1e-4 or bad:
    print(f"largest log-likelihood difference {worst:.3e}; {'; '.join(bad)}"); sys.exit(1)
print(f"per-choice log-likelihoods within {worst:.1e} of the twin's; acc {want['acc']} acc_norm {want['acc_norm']} as computed from them")
PYEOF
        ); then ok "$name, $path (cache $codec): $msg"; else fail "$name, $path: $msg"; fi
    done
done
echo "test_twin_bench: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
