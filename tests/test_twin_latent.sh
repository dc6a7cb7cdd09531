#!/usr/bin/env bash
# The attention design space (docs/DESIGN.md section 1) against the PyTorch twin (tests/reference/):
# mla, cla, gqa_cla, clla, clla_share_krope, clla_share_kvproj, clla_quant, clla_quant_share_kvproj
# with share_factor F = 2, 3, 4, layer counts F does not divide (L=5 with F=2, L=4 with F=3,
# L=6 with F=4: the last group is shorter, down to a lone producer), with and without query LoRA,
# tied and untied, each at initializer_range 0.02 and 0.3: clla init, clla debug-step, twin.py
# check-step (logits, loss and every gradient within 1e-4 relative in max-norm).
# Also: the C int_group quantizer (backend op and cache codec, compiled from libclla_core.a)
# equals the twin's torch quantizer bit for bit on edge cases (ties, bf16 scale boundaries, zero
# groups, bits 2..8), and 5 training steps of clla_quant checked with check-train.
# The twin's own checks (selftest.py, incl. the producer-gradient and straight-through checks)
# run in test_twin.sh.
# Environment: CLLA (the binary), SRC (source tree), BUILD (build tree, for libclla_core.a).
# Exit 0 pass, 1 fail, 77 skipped.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib/twin.sh"
BUILD=${BUILD:-$(dirname "$CLLA")}

. "$(dirname "${BASH_SOURCE[0]}")/lib/cases.sh"
cases_begin clla_twin_latent

# per-tensor "ok" lines only with VERBOSE=1
case_report() {
    if [ -n "${VERBOSE:-}" ]; then sed 's/^/    /' "$1"; else grep -v '^  ok ' "$1" | sed 's/^/    /'; fi
}

V=97 C=32 NH=4 D=8 DV=6 I=48 T=16 B=2 R=16 DR=4 RQ=12 G=8
TOKENS="$TMP/tokens.u32"
"$PY" -c "import numpy as np; np.random.default_rng(20240).integers(0, $V, 200).astype('<u4').tofile('$TOKENS')"

# write_config FILE PRESET L F RQ TIED STD [NKV]
write_config() {
    local att
    case "$2" in
        mla|clla*) att="\"kv_lora_rank\": $R, \"qk_rope_head_dim\": $DR, \"q_lora_rank\": $5, \"latent_quant_group\": $G," ;;
        *) att="\"num_key_value_heads\": ${8:-$NH}," ;;
    esac
    cat >"$1" <<EOF
{
  "attention": "$2", $att
  "share_factor": $4,
  "vocab_size": $V, "hidden_size": $C, "num_hidden_layers": $3,
  "num_attention_heads": $NH, "head_dim": $D, "v_head_dim": $DV, "intermediate_size": $I,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": $6, "initializer_range": $7,
  "train": {
    "seq_len": $T, "micro_batch": $B, "global_batch_tokens": $((2 * B * T)),
    "lr": 0.01, "min_lr": 0.001, "warmup_steps": 2, "max_steps": 5,
    "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1234, "log_every": 1
  }
}
EOF
}

step_case() {  # step_case NAME PRESET L F RQ TIED STD [NKV]
    local dir="$TMP/$1"
    shift
    mkdir -p "$dir"
    write_config "$dir/cfg.json" "$@"
    "$CLLA" init --config "$dir/cfg.json" --out "$dir/model" >/dev/null &&
        "$CLLA" debug-step --model "$dir/model" --tokens "$TOKENS" --batch $B --seq $T --out "$dir/dump.safetensors" >/dev/null &&
        "$PY" "$TWIN" check-step --model "$dir/model" --tokens "$TOKENS" --batch $B --seq $T --dump "$dir/dump.safetensors"
}

train_case() {  # train_case NAME: the model of step case NAME trained 5 steps (2 micro-batches, clipping)
    local dir="$TMP/$1"
    [ -f "$dir/model/model.safetensors" ] || { echo "no model from the step case in $dir"; return 1; }
    local clip
    clip=$("$PY" "$TWIN" suggest-clip --model "$dir/model" --tokens "$TOKENS") || return 1
    echo "grad_clip=$clip"
    local sets=(--set train.grad_clip="$clip")
    "$CLLA" train --config "$dir/model/config.json" --set train.init_from="$dir/model/model.safetensors" \
        --set train.data="$TOKENS" --set train.out_dir="$dir/run" --quiet "${sets[@]}" &&
        "$PY" "$TWIN" check-train --model "$dir/model" --tokens "$TOKENS" --metrics "$dir/run/metrics.jsonl" \
            --require-clip "${sets[@]}"
}

int_group_case() {  # the C quantizer (compiled from libclla_core.a) against the twin's, bit for bit
    local cc=${CC:-cc}
    command -v "$cc" >/dev/null || { echo "no C compiler ($cc) to build the probe"; return 1; }
    "$cc" -O2 -I"$SRC" -o "$TMP/int_group_probe" "$REF/int_group_probe.c" "$BUILD/libclla_core.a" -lcjson -lm -fopenmp &&
        "$PY" "$TWIN" check-int-group --probe "$TMP/int_group_probe"
}

if [ -f "$BUILD/libclla_core.a" ]; then
    run_case int_group_c_equals_twin int_group_case
else
    echo "SKIP int_group_c_equals_twin: no $BUILD/libclla_core.a (set BUILD to the build tree)"
fi

# name                                   preset   L F Rq   tied
CASES=(
    "mla_L2                               mla      2 1 0    false"
    "mla_L3_qlora_tied                    mla      3 1 $RQ  true"
    "cla_F2_L5                            cla      5 2 0    false"
    "cla_F3_L4_tied                       cla      4 3 0    true"
    "cla_F4_L6                            cla      6 4 0    false"
    "gqa_cla_F2_L3_nkv2_tied              gqa_cla  3 2 0    true  2"
    "gqa_cla_F3_L5_nkv2                   gqa_cla  5 3 0    false 2"
    "gqa_cla_F4_L6_nkv1_tied              gqa_cla  6 4 0    true  1"
)
for p in clla clla_share_krope clla_share_kvproj clla_quant clla_quant_share_kvproj; do
    CASES+=("${p}_F2_L5          $p 5 2 0   false"
            "${p}_F3_L4_qlora_tied $p 4 3 $RQ true"
            "${p}_F4_L6_qlora      $p 6 4 $RQ false")
done
for std in 0.02 0.3; do
    for c in "${CASES[@]}"; do
        set -- $c
        name=$1 preset=$2 L=$3 F=$4 rq=$5 tied=$6 nkv=${7:-}
        run_case "${name}_std=$std" step_case "${name}_std=$std" "$preset" "$L" "$F" "$rq" "$tied" "$std" $nkv
    done
done
run_case train_clla_quant_F2_L5_std=0.02 train_case clla_quant_F2_L5_std=0.02

echo "test_twin_latent: $pass passed, $fail failed${failed_names:+ (failed:$failed_names)}"
[ "$fail" -eq 0 ] || exit 1
exit 0
