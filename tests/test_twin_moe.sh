#!/usr/bin/env bash
# The MoE FFN against the PyTorch twin (tests/reference/twin_moe.py): clla init, clla debug-step,
# twin.py check-step (logits, loss = LM + aux + z, every gradient within 1e-4 relative), for
# top-1 and top-2, with and without shared experts, with capacity dropping active and inactive,
# renormalized top-k, the z-loss, dense first layers, and the routing edge cases (a zero router:
# every probability tied, all tokens go to expert 0 (top-1) or 0 and 1 (top-2), the other
# experts receive nothing, and capacity drops the later tokens). twin_moe.py routing confirms
# for each case that the routing it claims to test happened (drops, no drops, collapse).
# Then 5 training steps with drops and clipping, checked with check-train (loss incl. aux).
# Environment: CLLA (the binary), SRC (source tree). Exit 0 pass, 1 fail, 77 skipped.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib/twin.sh"

. "$(dirname "${BASH_SOURCE[0]}")/lib/cases.sh"
cases_begin clla_twin_moe

# the log without per-tensor "ok" lines, then the largest relative error of the compared tensors
case_report() {
    grep -v '^  ok ' "$1" | sed 's/^/    /'
    awk '/rel_err/ { for (i = 1; i < NF; i++) if ($i == "rel_err") print $(i + 1), $2 }' "$1" |
        sort -g | tail -1 | awk '{ print "    worst tensor: " $2 " rel_err " $1 }'
}

V=97 C=32 L=2 NH=4 D=8 T=16 B=2 E=4
TOKENS="$TMP/tokens.u32"
"$PY" -c "import numpy as np; np.random.default_rng(7).integers(0, $V, 200).astype('<u4').tofile('$TOKENS')"

# write_config FILE PRESET K N_SHARED CAPACITY_FACTOR NORM_TOPK Z_COEF FIRST_DENSE
write_config() {
    local extra=""
    case "$2" in
        gqa) extra='"num_key_value_heads": 2,' ;;
        mla|clla|clla_quant) extra='"kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8,' ;;
    esac
    cat >"$1" <<EOF
{
  "attention": "$2", $extra
  "vocab_size": $V, "hidden_size": $C, "num_hidden_layers": $L,
  "num_attention_heads": $NH, "head_dim": $D, "v_head_dim": $D,
  "intermediate_size": 40,
  "n_routed_experts": $E, "num_experts_per_tok": $3, "moe_intermediate_size": 24,
  "n_shared_experts": $4, "shared_expert_intermediate_size": $((24 * $4 + 8)),
  "moe_capacity_factor": $5, "norm_topk_prob": $6,
  "moe_aux_loss_coef": 0.2, "moe_z_loss_coef": $7, "first_k_dense_layers": $8,
  "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "initializer_range": 0.2,
  "train": {
    "seq_len": $T, "micro_batch": $B, "global_batch_tokens": $((2 * B * T)),
    "lr": 0.01, "min_lr": 0.001, "warmup_steps": 2, "max_steps": 5,
    "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1234
  }
}
EOF
}

# zero every router weight: all probabilities tie (the routing edge cases)
zero_router() {
    "$PY" - "$1" <<'EOF'
import os, sys
sys.path.insert(0, os.environ["REF"])
import numpy as np
import safetensors_io as st
path = sys.argv[1]
t, meta = st.read(path)
for k in t:
    if k.endswith(".mlp.gate.weight"):
        t[k] = np.zeros_like(t[k])
st.write(path, t, meta, dtype="F32")
EOF
}
export REF

# step_case NAME EXPECT(drop|nodrop|collapse) ZERO_ROUTER(0|1) config args...
step_case() {
    local name=$1 expect=$2 zero=$3
    shift 3
    local dir="$TMP/$name"
    mkdir -p "$dir"
    write_config "$dir/cfg.json" "$@"
    if [ "$1" != mha ] && [ "$1" != gqa ] && ! "$PY" -c "
import sys, json; sys.path.insert(0, '$REF'); import twin
twin.ModelConfig(json.load(open('$dir/cfg.json')))" 2>/dev/null; then
        echo "the twin does not implement attention '$1' yet: checking only that clla runs it"
        "$CLLA" init --config "$dir/cfg.json" --out "$dir/model" >/dev/null &&
            "$CLLA" debug-step --model "$dir/model" --tokens "$TOKENS" --batch $B --seq $T --out "$dir/dump.safetensors"
        return
    fi
    "$CLLA" init --config "$dir/cfg.json" --out "$dir/model" >/dev/null || return 1
    if [ "$zero" = 1 ]; then zero_router "$dir/model/model.safetensors" || return 1; fi
    "$PY" "$REF/twin_moe.py" routing --model "$dir/model" --tokens "$TOKENS" --batch $B --seq $T --expect "$expect" &&
        "$CLLA" debug-step --model "$dir/model" --tokens "$TOKENS" --batch $B --seq $T --out "$dir/dump.safetensors" &&
        "$PY" "$TWIN" check-step --model "$dir/model" --tokens "$TOKENS" --batch $B --seq $T --dump "$dir/dump.safetensors"
}

train_case() {  # the model of a step case, trained 5 steps (2 micro-batches per step, clipping)
    local dir="$TMP/$1"
    local clip
    clip=$("$PY" "$TWIN" suggest-clip --model "$dir/model" --tokens "$TOKENS") || return 1
    echo "grad_clip=$clip"
    local sets=(--set train.grad_clip="$clip")
    "$CLLA" train --config "$dir/model/config.json" --set train.init_from="$dir/model/model.safetensors" \
        --set train.data="$TOKENS" --set train.out_dir="$dir/run" --quiet "${sets[@]}" &&
        head -1 "$dir/run/metrics.jsonl" &&
        "$PY" "$TWIN" check-train --model "$dir/model" --tokens "$TOKENS" --metrics "$dir/run/metrics.jsonl" \
            --require-clip "${sets[@]}"
}

run_case twin_moe_selftest "$PY" "$REF/twin_moe.py"
#                                             preset K shared cf  norm  z     dense
run_case top1_shared_nodrop     step_case top1_shared_nodrop nodrop 0 mha 1 1 0 false 0 0
run_case top1_shared_drop       step_case top1_shared_drop drop 0 mha 1 1 1.0 false 0 0
run_case top1_noshared_nodrop   step_case top1_noshared_nodrop nodrop 0 mha 1 0 0 false 0 0
run_case top1_noshared_drop     step_case top1_noshared_drop drop 0 gqa 1 0 1.0 false 0.01 0
run_case top2_shared_nodrop     step_case top2_shared_nodrop nodrop 0 gqa 2 1 0 false 0.01 0
run_case top2_shared_drop_norm  step_case top2_shared_drop_norm drop 0 mha 2 1 1.0 true 0 0
run_case top2_noshared_drop     step_case top2_noshared_drop drop 0 mha 2 0 1.25 false 0.01 0
run_case top1_dense_first_layer step_case top1_dense_first_layer drop 0 mha 1 1 1.0 false 0 1
run_case edge_top1_all_to_expert0_nodrop step_case edge_top1_nodrop collapse 1 mha 1 1 0 false 0.01 0
run_case edge_top1_all_to_expert0_drop   step_case edge_top1_drop collapse 1 mha 1 0 1.5 false 0 0
run_case edge_top2_ties_drop             step_case edge_top2_drop collapse 1 mha 2 1 1.0 true 0 0
run_case mla_top1_shared_drop   step_case mla_top1 drop 0 mla 1 1 1.0 false 0 0
run_case clla_top2_shared_drop  step_case clla_top2 drop 0 clla 2 1 1.0 false 0 0
run_case train_top1_shared_drop train_case top1_shared_drop

echo "test_twin_moe: $pass passed, $fail failed${failed_names:+ (failed:$failed_names)}"
[ "$fail" -eq 0 ] || exit 1
exit 0
