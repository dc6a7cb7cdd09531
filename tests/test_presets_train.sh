#!/usr/bin/env bash
# Every attention preset (and one with the MoE FFN) trains on real text: the committed English
# fixture, tokenized with a small BPE vocabulary learned here. The loss must fall (mean of the
# last 5 steps at least 0.5 below the first step), stay finite, and validation must be finite.
# Also: a run whose train.tokenizer is not the one the shards were made with is refused, and an MoE
# run's bits do not follow the thread count.
set -u
CLLA=${CLLA:?run through ctest, or CLLA=build/clla SRC=. bash $0}
SRC=${SRC:?}
. "$SRC/tests/lib/cases.sh"
cases_begin clla_presets
case_report() { grep -E "first|error" "$1" | sed 's/^/    /'; }

FIX="$SRC/tests/fixtures/english.jsonl"
"$CLLA" tokenizer train --vocab-size 512 --pattern gpt2 --out "$TMP/tok.tok" "$FIX" >/dev/null 2>&1 ||
    { echo "FAIL: tokenizer train"; exit 1; }
"$CLLA" prep --tokenizer "$TMP/tok.tok" --out "$TMP/shards" --val-fraction 0.1 --threads 1 "$FIX" >/dev/null 2>&1 ||
    { echo "FAIL: prep"; exit 1; }

cat > "$TMP/base.json" <<JSON
{"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
 "intermediate_size": 128, "max_position_embeddings": 256,
 "train": {"data": "$TMP/shards/train", "val_data": "$TMP/shards/val", "tokenizer": "$TMP/tok.tok",
           "seq_len": 64, "micro_batch": 4, "max_steps": 40, "warmup_steps": 4, "lr": 5e-3,
           "min_lr": 5e-4, "val_batches": 2, "seed": 3}}
JSON

LATENT="--set kv_lora_rank=32 --set qk_rope_head_dim=8 --set head_dim=12 --set q_lora_rank=24"
# train_preset NAME ARGS...: trains, then checks the loss curve in metrics.jsonl
train_preset() {
    local name=$1
    shift
    local out="$TMP/run_$name"
    OMP_NUM_THREADS=1 "$CLLA" train --config "$TMP/base.json" --out "$out" --quiet "$@" || return 1
    /usr/bin/env awk -F'"loss":' '
        /"step"/ { split($2, a, ","); l[++n] = a[1] + 0; if (a[1] !~ /^[-0-9.e+]+$/) bad = 1 }
        /"val_loss":/ { split($0, b, "\"val_loss\":"); split(b[2], c, /[,}]/); if (c[1] !~ /^[-0-9.e+]+$/) bad = 1 }
        END {
            if (n < 40 || bad) { print "non-finite or missing losses"; exit 1 }
            s = 0; for (i = n - 4; i <= n; i++) s += l[i]; s /= 5
            printf "first %.4f  mean of last 5 %.4f\n", l[1], s
            exit !(s < l[1] - 0.5)
        }' "$out/metrics.jsonl"
}

run_case mha train_preset mha --set attention=mha
run_case gqa train_preset gqa --set attention=gqa --set num_key_value_heads=2
run_case mqa train_preset mqa --set attention=mqa
run_case cla train_preset cla --set attention=cla
run_case gqa_cla train_preset gqa_cla --set attention=gqa_cla --set num_key_value_heads=2
for p in mla clla clla_share_krope clla_share_kvproj clla_quant clla_quant_share_kvproj; do
    run_case "$p" train_preset "$p" --set attention=$p $LATENT
done
run_case clla_quant_moe train_preset clla_quant_moe --set attention=clla_quant $LATENT --set n_routed_experts=4 \
    --set n_shared_experts=1 --set moe_intermediate_size=64 --set moe_aux_loss_coef=0.005 --set moe_capacity_factor=1.5

# The bits of a run do not follow the thread count (a run resumed on a machine with other cores
# goes on bit for bit): an MoE model large enough that the expert products are cut into several
# tiles per expert over OpenBLAS's small-matrix bound (layers/cpu_moe.c), 1 against 5 threads, on
# this machine's OpenBLAS kernels and on the Haswell ones.
threads_same() {
    local args=(--config "$TMP/base.json" --quiet --set attention=clla_quant $LATENT --set hidden_size=256
        --set n_routed_experts=8 --set num_experts_per_tok=2 --set n_shared_experts=1 --set moe_intermediate_size=256
        --set moe_capacity_factor=1.5 --set train.micro_batch=8 --set train.seq_len=128 --set train.max_steps=2
        --set train.val_every=0)
    OMP_NUM_THREADS=1 "$CLLA" train "${args[@]}" --out "$TMP/run_t1" || return 1
    OMP_NUM_THREADS=5 "$CLLA" train "${args[@]}" --out "$TMP/run_t5" || return 1
    cmp "$TMP/run_t1/model.safetensors" "$TMP/run_t5/model.safetensors" && echo "model bitwise equal, 1 and 5 threads" || return 1
    # and on OpenBLAS's Haswell kernels (machines with AVX2 but not AVX-512; layers/cpu_parts.h)
    OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=1 "$CLLA" train "${args[@]}" --out "$TMP/run_h1" || return 1
    OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=5 "$CLLA" train "${args[@]}" --out "$TMP/run_h5" || return 1
    cmp "$TMP/run_h1/model.safetensors" "$TMP/run_h5/model.safetensors" && echo "on the Haswell kernels too"
}
run_case moe_threads_same threads_same

# another tokenizer than the shards': one line naming the mismatch, non-zero exit
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out "$TMP/other.tok" "$FIX" >/dev/null 2>&1
refuse_other_tokenizer() {
    if "$CLLA" train --config "$TMP/base.json" --out "$TMP/run_other" --set train.tokenizer="$TMP/other.tok" 2>"$TMP/err"; then
        echo "accepted shards of another tokenizer"; return 1
    fi
    cat "$TMP/err"
    [ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -qi "tokenizer" "$TMP/err"
}
run_case refuses_other_tokenizer refuse_other_tokenizer

echo "test_presets_train: $pass passed, $fail failed${failed_names:+ (failed:$failed_names)}"
[ "$fail" -eq 0 ]
