#!/usr/bin/env bash
# Fuzzes config parsing, --set and the size planner (tests/fuzz/fuzz_config.c: config_from_json
# with --set lines, then the parameter and activation tables of what it accepts) with libFuzzer
# under AddressSanitizer and UndefinedBehaviorSanitizer for a bounded time (FUZZ_SECONDS,
# default 20). Seeds: configs/tiny/*.json, the HF config.json files of tests/fixtures/hf, and
# configs with --set lines. Any crash, sanitizer report (an overflowing size is one) or
# rejection without a message fails the test. Leaks are not checked: a rejection jumps out of
# the parser (model/config.c dies) and leaves its allocations behind, as exit(1) would.
# Skipped (77) when clang or its libFuzzer runtime is missing (scripts/setup.sh installs them).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib/fuzz.sh"
SECS=${FUZZ_SECONDS:-20}
fuzz_begin test_fuzz_config
# util.c's die and warn are renamed away: the target's own die returns to the fuzzer
"$CC" "${FLAGS[@]}" -Ddie=util_die_unused -Dwarn=util_warn_unused -c "$SRC/common/util.c" -o "$W/util.o" 2> "$W/cc.err" &&
"$CC" "${FLAGS[@]}" "$SRC/tests/fuzz/fuzz_config.c" "$SRC/model/config.c" "$SRC/model/config_hf.c" \
  "$SRC/model/config_sizes.c" "$SRC/common/json_strict.c" "$SRC/common/num.c" "$SRC/model/tensor_table.c" \
  "$SRC/model/params.c" "$SRC/model/activations.c" "$SRC/model/mem_plan.c" "$SRC/model/cache.c" "$SRC/model/moe.c" "$SRC/model/swiglu_halves.c" \
  "$SRC/model/safetensors.c" "$SRC/model/hf_config.c" "$SRC/backend/backend_ops.c" \
  "$SRC/model/codec_cq.c" "$SRC/model/codec_qet.c" "$SRC/model/codec_kivi.c" "$SRC/model/codec_qjl.c" "$SRC/model/codec_kvquant.c" \
  "$SRC/quant/cq.c" "$SRC/quant/qet.c" "$SRC/quant/kmeans.c" "$SRC/quant/kivi.c" "$SRC/quant/qjl.c" "$SRC/quant/kvquant.c" "$SRC/quant/qpack.c" \
  "$SRC/common/unfinished.c" "$W/util.o" -lcjson -lm -o "$W/fuzz_config" 2>> "$W/cc.err"
check $? "build fuzz_config with -fsanitize=fuzzer,address,undefined"
[ -s "$W/cc.err" ] && head -20 "$W/cc.err"

cd "$W" || exit 1
mkdir -p seeds corpus
cp "$SRC"/configs/tiny/*.json "$SRC"/tests/fixtures/hf/*.json seeds/
small='{"attention":"gqa","vocab_size":64,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":48}'
printf '%s\n#set\nattention=mha\nhidden_size=64\ntrain.data=2024_shards\n' "$small" > seeds/sets.txt
printf '%s\n#set\nattention=cla\nshare_factor=2147483647\ntrain.micro_batch=3\n' "$small" > seeds/share.txt
printf '%s\n#set\nhidden_size=134217728\nintermediate_size=1908874350\nhead_dim=2\n' "$small" > seeds/big.txt
printf '%s\n#set\nn_routed_experts=4\nmoe_intermediate_size=16\nnum_experts_per_tok=2\nn_shared_experts=1\n' "$small" > seeds/moe.txt
echo "     seeds: $(ls seeds | wc -l)"
if [ -x ./fuzz_config ]; then
  ASAN_OPTIONS=detect_leaks=0 ./fuzz_config -max_total_time="$SECS" -max_len=4096 -timeout=20 -rss_limit_mb=2048 \
    -detect_leaks=0 -close_fd_mask=2 -print_final_stats=1 corpus seeds > fuzz.log 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' fuzz.log | grep -o '[0-9]*$')
  check $rc "fuzz_config: ${runs:-?} inputs in $SECS s without crash or sanitizer report"
  if [ $rc != 0 ]; then
    grep -E "ERROR|SUMMARY|runtime error" fuzz.log | head -20
    for c in crash-* timeout-* oom-*; do [ -e "$c" ] && { echo "     input $c:"; head -c 600 "$c"; echo; }; done
  fi
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
