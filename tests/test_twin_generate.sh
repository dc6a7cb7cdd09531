#!/usr/bin/env bash
# Greedy generation against the PyTorch twin, for a small model of every attention preset (and a
# MoE model): `clla generate --temperature 0` decodes through the KV cache (prefill, then one
# token a step; MLA/CLLA in the absorbed form); the twin recomputes the whole float64 forward for
# every new token (tests/reference/twin.py greedy). The continuations must be the same tokens.
# The cache holds fp32 values except CLLA-quant's int4 latent (its trained codec), so the
# comparison is of the decoding, not of a bf16 rounding. Models are random (clla init) with a
# wide init, so the top logits of a step are well apart (the twin prints the smallest margin).
set -u
. "$(dirname "$0")/lib/twin.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_twin_generate.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
PASS=0
FAIL=0

"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 || {
    echo "FAIL setup: $(tail -n 2 setup.log)"; echo "0 passed, 1 failed"; exit 1; }
PROMPT="The cat sat on the mat and looked at the"
IDS=$("$CLLA" tokenizer encode --tokenizer tok.tok --text "$PROMPT" | tr ' ' ',')
N=20

BASE='"vocab_size": 300, "hidden_size": 32, "num_attention_heads": 4, "head_dim": 8, "intermediate_size": 48,
      "max_position_embeddings": 64, "initializer_range": 0.3, "train": {"seq_len": 64}'
LAT='"kv_lora_rank": 16, "qk_rope_head_dim": 4'
# name | config keys | cache codecs
CASES=(
  "mha|\"attention\": \"mha\", \"num_hidden_layers\": 2|fp32"
  "gqa|\"attention\": \"gqa\", \"num_key_value_heads\": 2, \"num_hidden_layers\": 2|fp32"
  "mqa|\"attention\": \"mqa\", \"num_hidden_layers\": 2|fp32"
  "cla_F2_L3|\"attention\": \"cla\", \"num_hidden_layers\": 3|fp32"
  "gqa_cla_F3_L4|\"attention\": \"gqa_cla\", \"num_key_value_heads\": 2, \"share_factor\": 3, \"num_hidden_layers\": 4|fp32"
  "mla_qlora|\"attention\": \"mla\", $LAT, \"q_lora_rank\": 8, \"num_hidden_layers\": 2|fp32"
  "clla_F2_L3|\"attention\": \"clla\", $LAT, \"num_hidden_layers\": 3|fp32"
  "clla_share_krope|\"attention\": \"clla_share_krope\", $LAT, \"num_hidden_layers\": 3|fp32"
  "clla_share_kvproj_F3|\"attention\": \"clla_share_kvproj\", $LAT, \"share_factor\": 3, \"num_hidden_layers\": 4|fp32"
  "clla_quant|\"attention\": \"clla_quant\", $LAT, \"latent_quant_group\": 8, \"num_hidden_layers\": 3|k_rope=fp32 own_k_rope=fp32"
  "clla_quant_share_kvproj|\"attention\": \"clla_quant_share_kvproj\", $LAT, \"latent_quant_group\": 16, \"num_hidden_layers\": 3|k_rope=fp32 own_k_rope=fp32"
  "gqa_moe|\"attention\": \"gqa\", \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, \"n_shared_experts\": 1, \"moe_capacity_factor\": 0|fp32"
)
for c in "${CASES[@]}"; do
  IFS='|' read -r name keys codecs <<< "$c"
  printf '{%s, %s}\n' "$keys" "$BASE" > "$name.json"
  codec_args=()
  for spec in $codecs; do codec_args+=(--cache-codec "$spec"); done
  if ! "$CLLA" init --config "$name.json" --out "m_$name" > "$name.log" 2>&1; then
    echo "FAIL $name: clla init: $(tail -n 1 "$name.log")"; FAIL=$((FAIL + 1)); continue
  fi
  got=$("$CLLA" generate --model "m_$name" --tokenizer tok.tok --prompt "$PROMPT" --max-new-tokens $N --ignore-eos \
        --json "${codec_args[@]}" 2>> "$name.log" | grep -o '"tokens":\[[^]]*\]' | sed 's/.*\[//; s/\]//')
  want=$("$PY" "$TWIN" greedy --model "m_$name" --ids "$IDS" --n $N 2> "$name.twin")
  if [ -n "$got" ] && [ "$got" = "$want" ]; then
    echo "ok   $name: $N greedy tokens equal the twin's ($(cat "$name.twin"))"; PASS=$((PASS + 1))
  else
    echo "FAIL $name: clla [$got] twin [$want] ($(cat "$name.twin"); $(tail -n 1 "$name.log"))"; FAIL=$((FAIL + 1))
  fi
done
echo "test_twin_generate: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
