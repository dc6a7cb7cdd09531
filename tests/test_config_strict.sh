#!/usr/bin/env bash
# Issue 12, configs and command lines, through the binary:
#  1. numbers are parsed whole or refused, on the command line and in configs (one line naming
#     the option or key and the value); non-finite floats refused; a --set value that is not
#     JSON is a string;
#  2. config JSON: duplicate keys, text after the object, too-deep nesting, syntax errors with
#     line and column;
#  3. sizes that overflow are refused naming keys (no crash, nothing written), big valid sizes
#     print non-negative totals, share_factor = INT_MAX works;
#  4. info at 100,000 layers finishes quickly (hashed tensor table);
#  5. thread counts are capped with a message;
#  6. HF config.json files (tests/fixtures/hf) load as they are or are refused naming the key
#     clla does not implement; scaled-down DeepSeek-V2-Lite and Llama models build and train;
#     null = absent; metadata keys listed once; typos get a "did you mean";
#  7. --set attention=X resets the knobs the preset owns;
#  8. paths in a config resolve against its directory, --set paths against the cwd;
#  9. a warmup longer than max_steps warns, and top-1 routing with norm_topk_prob; use_cla false
#     turns cla_share_factor off; clla --version; --help names every value;
# 10. a run whose memory plan exceeds the available memory is refused with both numbers;
# 11. what a probe of every command found (2026-11-27): a user's file is not replaced without
#     --overwrite, a tokenizer other than the model's is refused, JSON that cJSON alone would
#     read loosely is refused, an option given twice is refused, damaged weights are named,
#     checks that need no corpus come before reading it, a file-size limit is an error line
#     with nothing left behind.
# Needs CLLA (the binary) and SRC (the source tree); ctest sets both.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
HF=$SRC/tests/fixtures/hf

. "$(dirname "$0")/lib/check.sh" test_config_strict

# expect_error NAME 'REGEX' [OUTDIR] -- CMD...: non-zero exit, exactly one line on stderr matching
# REGEX (grep -E), OUTDIR (if given) not created.
expect_error() {
    local name=$1 re=$2 outdir=$3
    shift 4
    "$@" > out.txt 2> err.txt
    local rc=$? lines
    lines=$(grep -c . err.txt)
    if [ "$rc" -eq 0 ]; then fail "$name: exited 0"
    elif [ "$rc" -gt 128 ]; then fail "$name: killed by signal $((rc - 128)): $(head -c 300 err.txt)"
    elif [ "$lines" -ne 1 ]; then fail "$name: $lines lines on stderr, want 1: $(head -c 400 err.txt | tr '\n' '|')"
    elif ! grep -qE -- "$re" err.txt; then fail "$name: stderr does not match '$re': $(cat err.txt)"
    elif [ -n "$outdir" ] && [ -e "$outdir" ]; then fail "$name: left '$outdir' behind"
    else ok "$name: $(cut -c1-150 err.txt)"; fi
}

# expect_ok NAME CMD...: exit 0
expect_ok() {
    local name=$1
    shift
    if "$@" > out.txt 2> err.txt; then ok "$name"
    else fail "$name: exit $?: $(head -c 400 err.txt | tr '\n' '|')"; fi
}

# little-endian uint32 tokens, ids < 64, enough for a few batches
: > tok.bin
for i in $(seq 0 299); do printf "\\x$(printf %02x $(( (i * 37 + 11) % 64 )))\\x00\\x00\\x00" >> tok.bin; done

cat > m.json <<'EOF'
{"attention": "gqa", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
 "train": {"data": "tok.bin", "seq_len": 16, "micro_batch": 2, "max_steps": 2, "warmup_steps": 1, "threads": 1}}
EOF

echo "# 1. numbers"
expect_error "--set hidden_size=64k" "'hidden_size'.*\"64k\"" "" -- "$CLLA" info --config m.json --set hidden_size=64k
expect_error "--set hidden_size=0x40" "'hidden_size'.*\"0x40\"" "" -- "$CLLA" info --config m.json --set hidden_size=0x40
expect_error "--set train.lr=3e-3," "'train.lr'.*\"3e-3,\"" "" -- "$CLLA" info --config m.json --set train.lr=3e-3,
expect_error "--set tie_word_embeddings=trueish" "'tie_word_embeddings'.*trueish" "" -- "$CLLA" info --config m.json --set tie_word_embeddings=trueish
expect_error "--set train.overlap_grad_reduce=sometimes" "'train.overlap_grad_reduce' must be true, false or \"auto\".*sometimes" "" -- "$CLLA" info --config m.json --set train.overlap_grad_reduce=sometimes
expect_error "--set train.grad_bucket_elements=0" "train.grad_bucket_elements must be 1 to 2147483647" "" -- "$CLLA" info --config m.json --set train.grad_bucket_elements=0
expect_error "--set train.lr=1e999" "'train.lr'.*inf.*finite" "" -- "$CLLA" info --config m.json --set train.lr=1e999
expect_error "--set rms_norm_eps=1e999" "'rms_norm_eps'.*finite" "" -- "$CLLA" info --config m.json --set rms_norm_eps=1e999
# a float that vanishes in 32 bits (it became 0: an lr of 1e-50 trained with lr 0, an eps of 1e-50
# was called "must be > 0")
expect_error "--set train.lr=1e-50" "'train.lr' = 1e-50 is below the smallest normal 32-bit float" "" -- "$CLLA" info --config m.json \
    --set train.lr=1e-50 --set train.min_lr=0
expect_error "--set train.eps=1e-40 (subnormal)" "'train.eps' = 1e-40 is below" "" -- "$CLLA" info --config m.json --set train.eps=1e-40
# an integer beyond 2^53 names that reason, as the same value in a file does (it was "must be a number")
expect_error "--set train.max_steps beyond 2^53" "--set 'train.max_steps=99999999999999999999': an integer beyond 2\\^53" "" -- \
    "$CLLA" info --config m.json --set train.max_steps=99999999999999999999
expect_error "--set train.lr=nan" "'train.lr'.*nan" "" -- "$CLLA" info --config m.json --set train.lr=nan
expect_error "--set hidden_size=4294967328" "'hidden_size' = 4294967328 is too large: at most 2147483647" "" -- "$CLLA" info --config m.json --set hidden_size=4294967328
expect_error "--set hidden_size=32.5" "'hidden_size' must be a whole number, got 32.5" "" -- "$CLLA" info --config m.json --set hidden_size=32.5
expect_error "float beyond fp32 in a file" "'initializer_range'.*finite" "" -- "$CLLA" info --config m.json --set initializer_range=1e39
expect_error "eval --seq 4294967328" "--seq 4294967328" "" -- "$CLLA" eval --checkpoint nothere --data tok.bin --seq 4294967328
expect_error "eval --batch 4abc" "--batch '4abc'" "" -- "$CLLA" eval --checkpoint nothere --data tok.bin --batch 4abc
expect_error "eval --max-batches 1e3" "--max-batches '1e3'" "" -- "$CLLA" eval --checkpoint nothere --data tok.bin --max-batches 1e3
expect_error "info --ranks 0x10" "--ranks '0x10'" "" -- "$CLLA" info --config m.json --ranks 0x10
expect_error "train --save-every 5x" "--save-every '5x'" "run_se" -- "$CLLA" train --config m.json --out run_se --save-every 5x
expect_error "train --stop-at ' 3'" "--stop-at ' 3'" "run_sa" -- "$CLLA" train --config m.json --out run_sa --stop-at " 3"
expect_error "prep --val-fraction 3e-3," "--val-fraction '3e-3,'" "" -- "$CLLA" prep --val-fraction 3e-3, x.txt
expect_error "prep --chunk-tokens 64k" "--chunk-tokens '64k'" "" -- "$CLLA" prep --chunk-tokens 64k x.txt
expect_error "tokenizer train --vocab-size 4abc" "--vocab-size '4abc'" "" -- "$CLLA" tokenizer train --vocab-size 4abc --pattern gpt2 --out t.tok x.txt
"$CLLA" info --config m.json --set train.data=2024_shards > out.txt 2> err.txt &&
    ok "--set train.data=2024_shards is a string" || fail "--set train.data=2024_shards: $(cat err.txt)"
expect_error "--set train.data=2024 is the path 2024" "data path '$WORK/2024'" "run_p" -- "$CLLA" train --config m.json --out run_p --set train.data=2024

echo "# 2. JSON"
printf '{"vocab_size": 64,\n "vocab_size": 65}\n' > dup.json
expect_error "duplicate key" "line 2, column 2: duplicate key 'vocab_size'" "" -- "$CLLA" info --config dup.json
printf '{"train": {"lr": 1e-3, "lr": 2e-3}}' > dup2.json
expect_error "duplicate train key" "duplicate key 'lr'" "" -- "$CLLA" info --config dup2.json
sed 's/}}$/}} x/' m.json > trail.json
expect_error "text after the object" "line 3, column [0-9]+: text after the end" "" -- "$CLLA" info --config trail.json
printf '{"a": %s1%s}' "$(printf '[%.0s' $(seq 1100))" "$(printf ']%.0s' $(seq 1100))" > deep.json
expect_error "too deep" "nested deeper than the 1000 levels" "" -- "$CLLA" info --config deep.json
printf '{"vocab_size": 64,\n  "hidden_size": 32,,\n}' > syn.json
expect_error "syntax error with line and column" "line 2, column 21: JSON syntax error" "" -- "$CLLA" info --config syn.json

echo "# 3. sizes"
cat > crash.json <<'EOF'
{"attention":"mha","vocab_size":8,"hidden_size":134217728,"num_hidden_layers":6,"num_attention_heads":1,"head_dim":2,"v_head_dim":2,"intermediate_size":1908874350,"tie_word_embeddings":true}
EOF
expect_error "init of a 4.6e18-parameter config" "overflow.*intermediate_size x hidden_size" "crash_out" -- "$CLLA" init --config crash.json --out crash_out
expect_error "info with hidden and intermediate 2^30" "hidden_size|head_dim|intermediate_size" "" -- \
    "$CLLA" info --config m.json --set hidden_size=1073741824 --set intermediate_size=1073741824
if "$CLLA" info --config m.json --set hidden_size=16777216 --set intermediate_size=16777216 --set num_attention_heads=1024 \
        --set num_key_value_heads=512 > out.txt 2> err.txt && ! grep -q -- ' -[0-9]' out.txt &&
   grep -q 'parameters *3377701951897600 total' out.txt; then
    ok "info with hidden and intermediate 2^24: exact, non-negative totals"
else fail "info with hidden and intermediate 2^24: $(head -c 400 out.txt err.txt)"; fi
if "$CLLA" info --config m.json --set attention=mha --set hidden_size=1073741824 --set num_attention_heads=1 --set head_dim=2 \
        --set intermediate_size=8 > out.txt 2> err.txt && grep -q 'parameters *211527139328 total | 74088185856 activated' out.txt; then
    ok "info with hidden_size 2^30: exact totals (211527139328 parameters)"
else fail "info with hidden_size 2^30: $(head -c 400 out.txt err.txt)"; fi
if "$CLLA" info --config m.json --set attention=cla --set share_factor=2147483647 > out.txt 2> err.txt &&
   grep -q 'per layer' out.txt && ! grep -q -- ' -[0-9]' out.txt; then
    ok "share_factor = 2147483647: one slot, no overflow"
else fail "share_factor = 2147483647: $(head -c 400 out.txt err.txt)"; fi
# Table 4's figure of a CLLA-quant latent of 2^31 - 32 elements at 2 bits: 2^29 - 8 bytes (the
# product in int was negative)
if "$CLLA" info --config m.json --set attention=clla_quant --set kv_lora_rank=2147483616 --set qk_rope_head_dim=8 \
        --json > out.json 2> err.txt && grep -q '"paper_table4_per_layer":536870904[,}]' out.json; then
    ok "kv_lora_rank 2^31 - 32 at 2 bits: Table 4's 536870904 bytes a layer"
else fail "kv_lora_rank 2^31 - 32 at 2 bits: $(grep -o '"paper_table4[^,]*' out.json) $(head -c 300 err.txt)"; fi
expect_error "micro_batch x seq_len beyond int" "train.micro_batch x train.seq_len" "" -- \
    "$CLLA" info --config m.json --set train.micro_batch=2147483647 --set train.seq_len=16
# 32 x (2^32 + 1) tokens: the micro-step count was cast to an int (one micro-step, exit 0)
expect_error "global_batch_tokens past an int of rows a step" "is 8589934594 rows of seq_len 16 a step, more than 2147483647" "gb_run" -- \
    "$CLLA" train --config m.json --out gb_run --set train.global_batch_tokens=137438953504
# the same config in clla info (which sweeps use to check their points): refused there too
expect_error "global_batch_tokens past an int of rows a step, in info" "is 8589934594 rows of seq_len 16 a step" "" -- \
    "$CLLA" info --config m.json --set train.global_batch_tokens=137438953504
expect_error "negative knob" "n_shared_experts = -1 must not be negative" "" -- "$CLLA" info --config m.json --set n_shared_experts=-1

echo "# 4. big tables (plan-only tables: no entry stored, no name formatted)"
for moe in "" "--set n_routed_experts=16 --set num_experts_per_tok=2 --set moe_intermediate_size=32 --set n_shared_experts=1"; do
    start=$(date +%s)
    # shellcheck disable=SC2086
    if timeout 60 "$CLLA" info --config m.json --set num_hidden_layers=100000 $moe > out.txt 2> err.txt; then
        secs=$(( $(date +%s) - start ))
        if [ "$secs" -le 15 ]; then ok "info at 100,000 layers ${moe:+(16 experts) }in ${secs} s"; else fail "info at 100,000 layers ${moe:+(16 experts) }took ${secs} s"; fi
    else fail "info at 100,000 layers ${moe:+(16 experts)}: exit $? (timeout 60 s = 124)"; fi
done

echo "# 5. threads"
expect_error "train.threads = 100000" "train.threads = 100000 is more than 1024" "run_th" -- "$CLLA" train --config m.json --out run_th --set train.threads=100000
expect_error "prep --threads 100000" "--threads 100000: out of range, use 0..1024" "" -- "$CLLA" prep --threads 100000 x.txt

echo "# 6. Hugging Face config.json files"
"$CLLA" info --config "$HF/llama2_7b.json" > out.txt 2> err.txt
if [ $? = 0 ] && [ "$(grep -c . err.txt)" = 1 ] && grep -q 'ignoring keys that do not change the model here: .*transformers_version' err.txt &&
   grep -q 'parameters *6738415616 total' out.txt; then
    ok "Llama-2-7B config.json loads as is (6738415616 parameters), ignored keys listed on one line"
else fail "Llama-2-7B config.json: $(head -c 400 out.txt err.txt)"; fi
expect_error "DeepSeek-V2-Lite: rope_scaling (YaRN) refused by name" "key 'rope_scaling' = \\{\"beta_fast\".* changes the model and clla does not implement it: RoPE scaling" "" -- "$CLLA" info --config "$HF/deepseek_v2_lite.json"
"$CLLA" info --config "$HF/deepseek_v2_lite.json" --set rope_scaling=null > out.txt 2> err.txt
if [ $? = 0 ] && grep -q 'attention mla' out.txt && grep -q 'parameters *15706484224 total' out.txt; then
    ok "DeepSeek-V2-Lite without rope_scaling: mla, q_lora_rank null = none, 15706484224 parameters"
else fail "DeepSeek-V2-Lite with rope_scaling=null: $(head -c 400 out.txt err.txt)"; fi
expect_error "Llama-3.2-1B: rope_scaling (llama3) refused" "key 'rope_scaling'.*llama3" "" -- "$CLLA" info --config "$HF/llama3_2_1b.json"
expect_error "Mistral-7B: active sliding window refused" "key 'sliding_window' = 4096 changes the model" "" -- "$CLLA" info --config "$HF/mistral_7b.json"
expect_ok "Mistral-7B with sliding_window null" "$CLLA" info --config "$HF/mistral_7b.json" --set sliding_window=null
expect_ok "inactive sliding window (use_sliding_window false)" "$CLLA" info --config "$HF/llama2_7b.json" --set sliding_window=4096 --set use_sliding_window=false
expect_error "attention_bias true" "key 'attention_bias' = true" "" -- "$CLLA" info --config "$HF/llama2_7b.json" --set attention_bias=true
expect_error "mlp_bias true" "key 'mlp_bias' = true" "" -- "$CLLA" info --config "$HF/llama2_7b.json" --set mlp_bias=true
expect_error "hidden_act gelu" "key 'hidden_act' = \"gelu\"" "" -- "$CLLA" info --config "$HF/llama2_7b.json" --set hidden_act=gelu
# --cache-table: no figure for a preset whose config would be refused (the int4 latent rows of a
# kv_lora_rank that latent_quant_group does not divide)
"$CLLA" info --config m.json --set attention=mla --set kv_lora_rank=48 --set qk_rope_head_dim=4 --cache-table > ct.txt 2>&1
grep -q "^clla_quant .*n/a.*latent_quant_group = 32 does not divide kv_lora_rank = 48" ct.txt && grep -q "^clla  .*[0-9]" ct.txt &&
    ok "--cache-table: n/a for the int4 rows of kv_lora_rank 48" || fail "--cache-table with kv_lora_rank 48: $(cat ct.txt)"
# a knob given under both of its names, or accepted and ignored, is refused
printf '{"vocab_size":256,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":64,"head_dim":16,"qk_nope_head_dim":8}' > alias2.json
expect_error "head_dim and qk_nope_head_dim in one file" "'head_dim' and 'qk_nope_head_dim' are two names of one knob" "" -- "$CLLA" info --config alias2.json
# transformers' DeepseekV3Config writes head_dim = qk_rope_head_dim beside qk_nope_head_dim: read
# as HF means it (skipped); another head_dim beside qk_nope_head_dim is refused
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['head_dim']=c['qk_rope_head_dim']; c['rope_scaling']=None; json.dump(c, open('ds_hd.json','w')); c['head_dim']=32; json.dump(c, open('ds_hd32.json','w'))" "$HF/deepseek_v2_lite.json"
"$CLLA" info --config ds_hd.json --json 2> /dev/null > ds_hd.out && "$CLLA" info --config "$HF/deepseek_v2_lite.json" --set rope_scaling=null --json 2> /dev/null | cmp -s - ds_hd.out &&
    ok "HF's head_dim = qk_rope_head_dim beside qk_nope_head_dim: skipped (the same model)" || fail "DeepSeek head_dim: $(head -c 200 ds_hd.out)"
expect_error "head_dim 32 beside qk_nope_head_dim 128" "'head_dim' and 'qk_nope_head_dim' are two names of one knob" "" -- "$CLLA" info --config ds_hd32.json
expect_ok "--set qk_nope_head_dim over a file's head_dim replaces it" "$CLLA" info --config m.json --set head_dim=8 --set qk_nope_head_dim=8
expect_error "MoE knobs on a dense model" "n_shared_experts = 2 shapes the MoE FFN, and n_routed_experts = 0 makes the model dense" "" -- "$CLLA" info --config m.json --set n_shared_experts=2
expect_error "num_key_value_heads on a latent preset" "num_key_value_heads = 2: latent models" "" -- "$CLLA" info --config m.json \
    --set attention=mla --set kv_lora_rank=16 --set qk_rope_head_dim=4 --set num_key_value_heads=2
expect_error "train.dist_timeout_s = 1e30" "train.dist_timeout_s = 1e\+30 is out of range" "" -- "$CLLA" info --config m.json --set train.dist_timeout_s=1e30
printf '{"vocab_size":256,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":64,"train":"oops"}' > trs.json
expect_error "a string train section, with --set train.lr" "key 'train' must be an object" "" -- "$CLLA" info --config trs.json --set train.lr=1e-3
expect_error "misspelled key: did you mean" "unknown key 'hiden_size' \(did you mean 'hidden_size'\?\)" "" -- "$CLLA" info --config m.json --set hiden_size=32
expect_error "misspelled train key: did you mean" "unknown key 'train.warmup_step' \(did you mean 'train.warmup_steps'\?\)" "" -- "$CLLA" info --config m.json --set train.warmup_step=3
expect_error "unknown key far from any" "unknown key 'frobnicate': see docs" "" -- "$CLLA" info --config m.json --set frobnicate=1
DS=(--set rope_scaling=null --set vocab_size=64 --set hidden_size=32 --set num_hidden_layers=2 --set num_attention_heads=2 --set num_key_value_heads=2
    --set kv_lora_rank=16 --set qk_rope_head_dim=8 --set qk_nope_head_dim=8 --set v_head_dim=8 --set intermediate_size=48
    --set n_routed_experts=4 --set n_shared_experts=1 --set num_experts_per_tok=2 --set moe_intermediate_size=16
    --set max_position_embeddings=64 --set train.data="$WORK/tok.bin" --set train.seq_len=16 --set train.micro_batch=2
    --set train.max_steps=2 --set train.threads=1)
expect_ok "DeepSeek-V2-Lite scaled down: clla train runs" "$CLLA" train --config "$HF/deepseek_v2_lite.json" "${DS[@]}" --out ds_run --quiet
[ -s ds_run/model.safetensors ] && ok "DeepSeek-V2-Lite scaled down: model written" || fail "DeepSeek-V2-Lite scaled down: no model"
LL=(--set vocab_size=64 --set hidden_size=32 --set num_hidden_layers=2 --set num_attention_heads=4 --set num_key_value_heads=4
    --set intermediate_size=48 --set max_position_embeddings=64 --set train.data="$WORK/tok.bin" --set train.seq_len=16
    --set train.micro_batch=2 --set train.max_steps=2 --set train.threads=1)
expect_ok "Llama-2-7B scaled down: clla train runs" "$CLLA" train --config "$HF/llama2_7b.json" "${LL[@]}" --out ll_run --quiet

echo "# 7. --set attention=X"
nkv() { "$CLLA" info --config "$@" --json 2> /dev/null | grep -o '"fraction_of_mha":[0-9.]*' | cut -d: -f2; }
[ "$(nkv m.json --set attention=mha)" = 1 ] && ok "--set attention=mha on a gqa config with num_key_value_heads: MHA cache" ||
    fail "--set attention=mha: fraction of MHA $(nkv m.json --set attention=mha) $(cat err.txt)"
[ "$(nkv m.json --set attention=mha --set attention=gqa --set num_key_value_heads=1)" = 0.25 ] &&
    ok "later --set keys override the preset's" || fail "--set after attention: $(nkv m.json --set attention=mha --set attention=gqa --set num_key_value_heads=1)"
[ "$(nkv m.json --set num_key_value_heads=1 --set attention=mqa)" = 0.25 ] && ok "--set attention=mqa" || fail "--set attention=mqa"
cat > lat.json <<'EOF'
{"attention": "clla", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
 "kv_lora_rank": 16, "qk_rope_head_dim": 8, "intermediate_size": 48, "share_factor": 2}
EOF
[ "$(nkv lat.json --set attention=gqa --set num_key_value_heads=2)" = 0.5 ] && ok "latent config to gqa: latent keys reset" ||
    fail "latent config to gqa: $("$CLLA" info --config lat.json --set attention=gqa --set num_key_value_heads=2 2>&1 | head -2)"
sed 's/"gqa"/"mha"/' m.json > mha_nkv.json
expect_error "in a file, an explicit key still overrides the preset (and is checked)" "preset 'mha' has num_key_value_heads" "" -- "$CLLA" info --config mha_nkv.json

echo "# 8. paths relative to the config file"
mkdir -p sub
cp tok.bin sub/tok_sub.bin
sed 's/"tok.bin"/"tok_sub.bin"/; s/"threads": 1}/"threads": 1, "out_dir": "run_rel"}/' m.json > sub/rel.json
expect_ok "train.data and train.out_dir relative to the config's directory" "$CLLA" train --config sub/rel.json --quiet
[ -s sub/run_rel/model.safetensors ] && grep -q "\"data\":[[:space:]]*\"/.*sub/tok_sub.bin\"" sub/run_rel/config.json &&
    ok "run written next to the config; config.json holds the absolute data path" ||
    fail "relative out_dir/data: $(ls sub; grep '"data"' sub/run_rel/config.json 2>&1)"
expect_error "--set paths are relative to the cwd" "data path '$WORK/tok_sub.bin'" "" -- "$CLLA" train --config sub/rel.json --out run_cwd --set train.data=tok_sub.bin
(cd sub && "$CLLA" train --config ../m.json --out run_out --quiet --save-every 1 > /dev/null 2>&1)
grep -q "\"out_dir\":[[:space:]]*\"$WORK/sub/run_out\"" sub/run_out/config.json &&
    "$CLLA" train --config sub/run_out/config.json --resume auto --quiet --set train.max_steps=3 > out.txt 2> err.txt &&
    grep -q "resuming from $WORK/sub/run_out/checkpoints/step_0*2 " err.txt && [ ! -e sub/run_out/run_out ] &&
    ok "--out is stored absolute: its config.json resumes the run from another directory" ||
    fail "--out relative: $(grep out_dir sub/run_out/config.json); $(tail -n 2 err.txt)"

echo "# 9. warmup, --version, --help"
"$CLLA" train --config m.json --out run_w1 --quiet --set train.warmup_steps=50 > out.txt 2> err.txt
grep -q "warning: .*train.warmup_steps = 50 is longer than train.max_steps = 2" err.txt && ok "train: a warmup longer than max_steps warns" ||
    fail "warmup > max_steps: $(cat err.txt)"
"$CLLA" train --config m.json --out run_w2 --quiet > out.txt 2> err.txt
! grep -q warmup err.txt && ok "train: no warning for a warmup within max_steps" || fail "unexpected warning: $(cat err.txt)"
"$CLLA" info --config m.json --set train.warmup_steps=50 > out.txt 2> err.txt
[ ! -s err.txt ] && ok "info: no schedule warning (it does not train)" || fail "info warned: $(cat err.txt)"
# top-1 routing renormalized: every combine weight is 1, the router never learns from the loss
MOE1='--set n_routed_experts=4 --set num_experts_per_tok=1 --set moe_intermediate_size=16'
# shellcheck disable=SC2086
"$CLLA" train --config m.json --out run_k1 --quiet $MOE1 --set norm_topk_prob=true > out.txt 2> err.txt
grep -q "warning: .*num_experts_per_tok = 1 with norm_topk_prob = true: every combine weight is 1" err.txt &&
    ok "train: top-1 routing with norm_topk_prob warns" || fail "K=1 norm_topk_prob: $(cat err.txt)"
# shellcheck disable=SC2086
"$CLLA" train --config m.json --out run_k1b --quiet $MOE1 > out.txt 2> err.txt
! grep -q "norm_topk_prob" err.txt && ok "train: no such warning without norm_topk_prob" || fail "unexpected: $(cat err.txt)"
# Hunyuan's use_cla switches cla_share_factor (vLLM: cla_factor = cla_share_factor if use_cla else 1)
for use in true false; do
    sed "s/\"attention\": \"gqa\", //; s/\"intermediate_size\": 48,/\"intermediate_size\": 48, \"use_cla\": $use, \"cla_share_factor\": 2,/" m.json > hy_$use.json
    "$CLLA" info --config hy_$use.json --json > info_$use.json 2> err_$use.txt || fail "info use_cla=$use: $(cat err_$use.txt)"
done
"$CLLA" info --config m.json --json > info_plain.json 2> /dev/null
ratio() { /usr/bin/python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["kv_cache_bytes_per_token"]["model"]; b=json.load(open(sys.argv[2]))["kv_cache_bytes_per_token"]["model"]; print(a / b)' "$1" "$2"; }
[ "$(ratio info_false.json info_plain.json)" = 1.0 ] && grep -q "use_cla is false: share_factor (cla_share_factor) = 2 is not applied" err_false.txt &&
    [ "$(ratio info_true.json info_plain.json)" = 0.5 ] && ! grep -q use_cla err_true.txt &&
    ok "use_cla false: every layer its own KV (said); true: the factor applies" ||
    fail "use_cla: false $(ratio info_false.json info_plain.json) ($(cat err_false.txt)), true $(ratio info_true.json info_plain.json) ($(cat err_true.txt))"
if "$CLLA" --version > out.txt && grep -qE '^clla [0-9a-z.-]+' out.txt && grep -qE '^build: CUDA (yes|no), MPI (yes|no), NCCL (yes|no), PCRE2 (yes|no)' out.txt; then
    ok "clla --version: $(head -1 out.txt), $(sed -n 2p out.txt)"
else fail "clla --version: $(cat out.txt)"; fi
bad=""
for c in train eval info init debug-step; do
    "$CLLA" "$c" --help | grep -qE -- '--[a-z-]+ VALUE( |$)' && bad="$bad $c"
done
[ -z "$bad" ] && ok "--help names every option's value (no VALUE)" || fail "--help still prints VALUE for:$bad"

echo "# 10. memory plan"
expect_error "plan larger than the available memory" "needs .* \(clla info's training memory .*\) but only .* available" "run_mem" -- \
    env CLLA_TEST_MEM_AVAILABLE=1000 "$CLLA" train --config m.json --out run_mem
expect_error "plan larger than this machine (8 TiB of logits)" "needs [0-9.]+ GiB .* but only .* available to this process \(MemAvailable" "run_big" -- \
    "$CLLA" train --config m.json --out run_big --set vocab_size=1048576 --set train.micro_batch=1024 --set train.seq_len=1024 --set max_position_embeddings=1024

echo "# 11. outputs, tokenizers, strict JSON, repeated options, damaged weights"
printf 'the cat sat on the mat. %.0s' $(seq 200) > cat.txt
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out t11.tok cat.txt > /dev/null 2>&1 || fail "tokenizer train for section 11"
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out t11_other.tok "$SRC/tests/fixtures/english.jsonl" > /dev/null 2>&1 ||
    fail "a second tokenizer"
"$CLLA" prep --tokenizer t11.tok --out s11 --val-fraction 0 cat.txt > /dev/null 2>&1 || fail "prep for section 11"
# prep and tokenizer walk their arguments themselves; they refuse what args_parse refuses: an
# option given twice (the last one won), a value given to a flag, and what --verify does not take
expect_error "tokenizer train --vocab-size twice" "option --vocab-size given twice" "t_twice.tok" -- \
    "$CLLA" tokenizer train --vocab-size 300 --vocab-size 400 --pattern gpt2 --out t_twice.tok cat.txt
expect_error "prep --out twice" "option --out given twice" "po" -- "$CLLA" prep --tokenizer t11.tok --out po2 --out po cat.txt
expect_error "prep --overwrite=1" "option --overwrite takes no value" "po" -- "$CLLA" prep --tokenizer t11.tok --out po --overwrite=1 cat.txt
expect_error "prep --verify with a corpus file" "--verify checks shards and reads no corpus: drop 'cat.txt'" "" -- \
    "$CLLA" prep --verify s11 cat.txt
expect_error "prep --verify with --level" "--level does not apply with --verify" "" -- "$CLLA" prep --verify s11 --level 5
# --help as an option's value is that value: "--text --help" encodes the text "--help"
"$CLLA" tokenizer encode --tokenizer t11.tok --text --help > help_ids.txt 2> err.txt &&
    [ "$("$CLLA" tokenizer decode --tokenizer t11.tok --file help_ids.txt)" = "--help" ] &&
    ok "tokenizer encode --text --help encodes '--help'" || fail "tokenizer encode --text --help: $(head -c 200 help_ids.txt) $(cat err.txt)"
"$CLLA" tokenizer decode --help > help.txt 2>&1 && grep -q "^usage: clla tokenizer" help.txt &&
    ok "tokenizer decode --help prints the usage" || fail "tokenizer decode --help: $(head -c 200 help.txt)"
sed 's/"vocab_size": 64/"vocab_size": 320/; s/"tok.bin"/"s11\/train"/' m.json > m11.json
"$CLLA" train --config m11.json --out r11 --quiet --set max_position_embeddings=16 > /dev/null 2>&1 || fail "train for section 11"
echo "mine" > mine.txt
expect_error "tokenizer train over an existing file" "--out 'mine.txt' already exists: .*--overwrite" "" -- \
    "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out mine.txt cat.txt
expect_error "debug-step over an existing file" "--out 'mine.txt' already exists: .*--overwrite" "" -- \
    "$CLLA" debug-step --model r11 --tokens tok.bin --out mine.txt
expect_error "eval --items-out over an existing file" "--items-out 'mine.txt' already exists: .*--overwrite" "" -- \
    "$CLLA" eval --checkpoint r11 --bench "$SRC/tests/fixtures/bench/arc.jsonl" --limit 2 --items-out mine.txt --tokenizer t11.tok
[ "$(cat mine.txt)" = mine ] && ok "the user's file is unchanged after the three refusals" || fail "mine.txt now: $(head -c 80 mine.txt)"
expect_ok "tokenizer train --overwrite replaces it" "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out mine.txt --overwrite cat.txt
expect_error "an output file in a directory that does not exist (before the corpus is read)" "its directory 'nodir' does not exist" "" -- \
    "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out nodir/t.tok cat.txt
expect_error "a duplicate special token (before the corpus is read)" "--special 'X' is given twice" "" -- \
    "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out t2.tok --special X --special X cat.txt
expect_error "a vocabulary smaller than the bytes and specials" "--vocab-size 256 is too small: .* at least 257 ids" "" -- \
    "$CLLA" tokenizer train --vocab-size 256 --pattern gpt2 --out t2.tok cat.txt
expect_error "debug-step past max_position_embeddings" "--seq 100 exceeds the model's max_position_embeddings 16" "" -- \
    "$CLLA" debug-step --model r11 --tokens tok.bin --out d.st --seq 100
for cmd in "generate --model r11 --prompt the --max-new-tokens 2" "eval --checkpoint r11 --ppl cat.txt" "export r11 --out pkg11"; do
    # shellcheck disable=SC2086
    expect_error "${cmd%% *} with a tokenizer the model was not trained with" "tokenizer 't11_other.tok' \(hash [0-9a-f]{16}\) is not the one the model was trained with" "pkg11" -- \
        "$CLLA" $cmd --tokenizer t11_other.tok
done
expect_ok "generate with the model's own tokenizer" "$CLLA" generate --model r11 --prompt the --max-new-tokens 2 --tokenizer t11.tok
sed 's/"hidden_size": 32/"hidden_size": 032/' m.json > lead0.json
expect_error "a number with a leading zero in a config" "line 1, column [0-9]+: a number with a leading zero" "" -- "$CLLA" info --config lead0.json
sed 's/"hidden_size": 32/"hidden_size": 32./' m.json > dot.json
expect_error "a number ending in '.' in a config" "a '.' in a number must be followed by digits" "" -- "$CLLA" info --config dot.json
printf '{"attention": "gqa",\x0c "vocab_size": 64}' > ctl.json
expect_error "a control character between JSON tokens" "a control character outside a string" "" -- "$CLLA" info --config ctl.json
expect_error "--set hidden_size=032" "key 'hidden_size' must be a number, got \"032\"" "" -- "$CLLA" info --config m.json --set hidden_size=032
expect_error "--set an integer beyond 2^53" "--set 'train.seed=9007199254740993': an integer beyond 2\\^53" "" -- \
    "$CLLA" info --config m.json --set train.seed=9007199254740993
expect_ok "--set 2^53 itself" "$CLLA" info --config m.json --set train.seed=9007199254740992
printf '{"prompt": "the\\u0000cat"}\n' > p0.jsonl
expect_error "a JSONL prompt with \\u0000" "p0.jsonl line 1: column [0-9]+: .u0000 in a string" "" -- "$CLLA" generate --model r11 --prompts p0.jsonl
expect_error "a single-valued option given twice" "option --out given twice \('ra' and 'rb'\)" "ra" -- "$CLLA" train --config m.json --out ra --out rb
expect_error "a codec setting given twice" "codec setting 'bits' appears twice" "" -- \
    "$CLLA" generate --model r11 --prompt the --cache-codec 'k=int_group:bits=4,group=8,bits=2'
expect_error "--temperature beyond a double" "--temperature 1e999: out of range, beyond what a double holds" "" -- \
    "$CLLA" generate --model r11 --prompt the --temperature 1e999
mkdir -p nan11 && cp r11/config.json nan11/ && python3 - << 'PY'
import json, struct
b = bytearray(open('r11/model.safetensors', 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
off = 8 + n + h['model.norm.weight']['data_offsets'][0] + 4 * 3
b[off:off + 4] = struct.pack('<f', float('nan'))
open('nan11/model.safetensors', 'wb').write(b)
PY
expect_error "weights holding a NaN" "tensor 'model.norm.weight' holds NaN at element 3" "run_nan" -- \
    "$CLLA" train --config m11.json --out run_nan --set train.init_from=nan11 --set max_position_embeddings=16
# a second probe (the same day): checkpoints, packages, launch scripts
ck11=$(ls -d r11/checkpoints/step_* | tail -n 1)
rm -rf dmg && cp -r r11 dmg && dck=dmg/checkpoints/$(basename "$ck11")
printf '\x00\x01' | dd of="$dck/model.safetensors" bs=1 seek=300 conv=notrunc 2> /dev/null
expect_error "eval on a damaged checkpoint" "checkpoint '$dck' is damaged: .*checksum" "" -- "$CLLA" eval --checkpoint "$dck" --data s11/train
expect_error "debug-step on a damaged checkpoint" "checkpoint '$dck' is damaged" "d2.st" -- "$CLLA" debug-step --model "$dck" --tokens tok.bin --out d2.st
printf 'hello\0world\n' > nul.txt
"$CLLA" generate --model r11 --prompts nul.txt --max-new-tokens 1 --json --tokenizer t11.tok > nul.json 2> /dev/null
python3 -c "import json,sys; d=json.loads(open('nul.json').read()); sys.exit(d['prompt'] != 'hello\x00world')" &&
    ok "generate --json keeps a NUL byte of the text as \\u0000" || fail "generate --json with a NUL: $(cat nul.json)"
expect_error "a codec spec with an empty setting" "has an empty setting" "" -- \
    "$CLLA" generate --model r11 --prompt the --cache-codec 'k=int_group:bits=4,group=8,'
expect_error "a negative MoE loss coefficient" "moe_aux_loss_coef must be >= 0" "" -- "$CLLA" info --config m.json \
    --set n_routed_experts=4 --set num_experts_per_tok=2 --set moe_intermediate_size=32 --set moe_aux_loss_coef=-1
expect_error "first_k_dense_layers leaving no MoE layer" "first_k_dense_layers = 2 leaves no MoE layer of the 2" "" -- "$CLLA" info --config m.json \
    --set n_routed_experts=4 --set num_experts_per_tok=2 --set moe_intermediate_size=32 --set first_k_dense_layers=2
expect_error "--stop-at 0" "--stop-at 0: give the step to stop after" "run_s0" -- "$CLLA" train --config m.json --out run_s0 --stop-at 0
# the range a message names is the one the option takes (-1 said "use 0..", and 0 was then refused)
expect_error "--stop-at -1" "--stop-at -1: out of range, use 1\.\.2147483647" "run_s0" -- "$CLLA" train --config m.json --out run_s0 --stop-at -1
expect_error "--zero 2" "--zero 2: out of range, use 0\.\.1" "run_s0" -- "$CLLA" train --config m.json --out run_s0 --zero 2
# a malformed tokenizer hash is refused when the config is read, before init writes a model
# that every later command refuses
expect_error "train.tokenizer_hash xyz" "train.tokenizer_hash 'xyz' is not 16 hex digits" "m_hash" -- "$CLLA" init --config m.json \
    --out m_hash --set train.tokenizer_hash=xyz
# the ETA counts to the step the process stops at, not to train.max_steps
"$CLLA" train --config m.json --out run_eta --set train.max_steps=2000000 --set train.log_every=1 --stop-at 2 2> eta.txt
grep -q "step     2/2000000 .*| ETA 0s$" eta.txt && ok "--stop-at 2 of 2000000 steps: ETA 0s at step 2" ||
    fail "--stop-at's ETA: $(grep '^step' eta.txt | tr '\n' '|')"
expect_error "export --out ''" "--out is empty" "" -- "$CLLA" export r11 --out '' --tokenizer t11.tok
# an empty path names no directory: train and init wrote into the current one, prep read past
# the string's end (make_dirs); every option's empty value is refused before anything is read
expect_error "train --out ''" "option --out is empty" "" -- "$CLLA" train --config m.json --out ''
expect_error "init --out=" "option --out is empty" "" -- "$CLLA" init --config m.json --out=
expect_error "prep --out ''" "option --out is empty" "" -- "$CLLA" prep --tokenizer t11.tok --out '' tok.bin
expect_error "tokenizer encode --file ''" "option --file is empty" "" -- "$CLLA" tokenizer encode --tokenizer t11.tok --file ''
# printed output that never reached its file (a full device) is a failure, not exit 0, said in
# one line (a write the command checks itself, then the check at exit, had said it twice)
for i in $(seq 20000); do printf '1 '; done > many_ids.txt
for cmd in "tokenizer encode --tokenizer t11.tok --text hello" "tokenizer decode --tokenizer t11.tok 1 2" \
    "tokenizer decode --tokenizer t11.tok --file many_ids.txt" "generate --model r11 --tokenizer t11.tok --prompt the --max-new-tokens 3" \
    "info --config m.json"; do
    # shellcheck disable=SC2086
    "$CLLA" $cmd > /dev/full 2> err.txt
    rc=$?
    [ "$rc" -eq 1 ] && grep -q "writing the output to stdout failed" err.txt && [ "$(wc -l < err.txt)" -eq 1 ] &&
        ok "$cmd > /dev/full: exit 1, said so in one line" || fail "$cmd > /dev/full: exit $rc: $(cat err.txt)"
done
[ ! -e checkpoints ] && [ ! -e metrics.jsonl ] && [ ! -e model.safetensors ] && ok "nothing written into the current directory" ||
    fail "an empty --out wrote into the current directory: $(ls)"
"$CLLA" export r11 --out pkg_ok --tokenizer t11.tok > /dev/null 2>&1 || fail "export r11"
sed -i 's/"version":[[:space:]]*1/"version": "1"/' pkg_ok/config.json
expect_error "a package's config given to info" "key 'cache' makes this an inference package's config" "" -- "$CLLA" info --config pkg_ok/config.json
expect_error "a package whose version is a string" "package.version must be a number" "" -- "$CLLA" generate --model pkg_ok --prompt the
out=$(CLLA_RETRY_SLEEP=0 bash "$SRC/launch/resume_until_done.sh" ru "$CLLA" train --config nope.json --out ru 2>&1)
rc=$?
[ "$rc" -eq 1 ] && [ "$(echo "$out" | grep -c 'attempt [0-9]*:')" -eq 3 ] && echo "$out" | grep -q "3 attempts in a row saved no new checkpoint" &&
    ok "resume_until_done.sh gives up after 3 attempts that save nothing" || fail "resume_until_done.sh: rc $rc: $(echo "$out" | tail -n 2 | tr '\n' '|')"
CLLA_MAX_ATTEMPTS=abc bash "$SRC/launch/resume_until_done.sh" ru x > /dev/null 2> err.txt
[ $? -eq 2 ] && grep -q "CLLA_MAX_ATTEMPTS 'abc' is not a whole number" err.txt && ok "resume_until_done.sh refuses CLLA_MAX_ATTEMPTS=abc" ||
    fail "resume_until_done.sh CLLA_MAX_ATTEMPTS=abc: $(cat err.txt)"
CLLA_MAX_STALLS=99999999999999999999 bash "$SRC/launch/resume_until_done.sh" ru x > /dev/null 2> err.txt
[ $? -eq 2 ] && [ "$(wc -l < err.txt)" -eq 1 ] && grep -q "CLLA_MAX_STALLS 99999999999999999999 is too large" err.txt &&
    ok "resume_until_done.sh refuses a count past bash's arithmetic in one line" || fail "resume_until_done.sh CLLA_MAX_STALLS=10^20: $(cat err.txt)"
expect_error "prep --val-fraction 1.5 (the range said as it is: 1 is out too)" "--val-fraction 1.5 is out of range: use 0 <= F < 1" s_vf -- \
    "$CLLA" prep --tokenizer t11.tok --out s_vf --val-fraction 1.5 cat.txt
touch a_file
expect_error "train --out a file" "run directory '.*/a_file' is a file, not a directory" "" -- "$CLLA" train --config m.json --out a_file
expect_error "init --out a file" "run directory 'a_file' is a file, not a directory" "" -- "$CLLA" init --config m.json --out a_file
bash "$SRC/launch/run_single_node.sh" 0 m.json > /dev/null 2> err.txt
[ $? -eq 2 ] && grep -q "N '0' must be a whole number of ranks, 1 or more" err.txt && ok "run_single_node.sh refuses 0 ranks" ||
    fail "run_single_node.sh 0: $(cat err.txt)"
# finite weights so large that the activations overflow: no logit is finite (a third probe)
mkdir -p huge11 && cp r11/config.json huge11/ && python3 - << 'PY'
import json, struct
b = bytearray(open('r11/model.safetensors', 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k == '__metadata__' or 'norm' in k:
        continue
    for i in range(8 + n + v['data_offsets'][0], 8 + n + v['data_offsets'][1], 4):
        struct.pack_into('<f', b, i, 3e38 if (i // 4) % 2 else -3e38)
open('huge11/model.safetensors', 'wb').write(b)
PY
expect_error "generate when no logit is finite" "no logit of the model is finite" "" -- \
    "$CLLA" generate --model huge11 --prompt the --max-new-tokens 3 --tokenizer t11.tok
expect_error "info --json with --cache-table" "--cache-table prints a text table and --json one JSON object" "" -- \
    "$CLLA" info --config m.json --json --cache-table
expect_error "a codec setting beyond 32 bits" "residual=99999999999 in 'kivi:bits=2,residual=99999999999' is out of range" "" -- \
    "$CLLA" generate --model r11 --prompt the --cache-codec 'k=kivi:bits=2,residual=99999999999'
expect_error "a file-size limit (ulimit -f)" "writing '.*init_fs/model.safetensors' failed: File too large" "" -- \
    bash -c "ulimit -f 4; exec '$CLLA' init --config m.json --out init_fs"
[ -z "$(ls -A init_fs 2> /dev/null)" ] && ok "the file-size limit left no temporary file" || fail "init_fs holds: $(ls -A init_fs)"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
