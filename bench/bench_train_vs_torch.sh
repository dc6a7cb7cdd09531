#!/usr/bin/env bash
# CPU training throughput of clla (build/bench/bench_train) beside PyTorch eager on the same
# model (bench/bench_torch_cpu.py, the PyTorch twin in fp32), in one run, for the d512 models
# of bench/train_d512_*.json at T = 512 (4 sequences a step), 2048 and 8192 (one).
#
#   bench/bench_train_vs_torch.sh [BUILD_DIR] [--quick]
#
# Prints a markdown table: clla tokens/s, its model FLOP/s as a fraction of the machine's sgemm
# rate (measured by bench_train in the same process), the attention op's share of the step,
# PyTorch's tokens/s and clla / PyTorch. --quick: T = 512 and 2048 only, fewer steps. The MoE
# model has no PyTorch column (the twin's MoE is a per-token reference loop), and PyTorch is
# skipped where its T x T attention matrices would not fit in half the machine's memory.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
QUICK=0
for a in "$@"; do
    case $a in
        --quick) QUICK=1 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench_train_vs_torch: unknown option '$a': see --help" >&2; exit 2 ;;
        *) BUILD=$a ;;
    esac
done
BT=$BUILD/bench/bench_train
[ -x "$BT" ] || { echo "bench_train_vs_torch: $BT not found: build first (scripts/build.sh build)" >&2; exit 1; }
PY=/usr/bin/python3
# the same number of timed steps on both sides, each the median of its steps (until 2026-11-28
# PyTorch got one fewer: a median of 2 is their mean, which a slow step moves and a median of 3
# does not, a small bias toward clla)
LENS="512 2048 8192"; STEPS=3
[ $QUICK = 1 ] && { LENS="512 2048"; STEPS=2; }
TSTEPS=$STEPS
MEM_KB=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
field() { { grep -o "\"$1\":[^,}]*" <<< "$2" || true; } | head -n 1 | cut -d: -f2; }

echo "| model | T | tokens/step | clla tokens/s | ratio to sgemm | attention share | PyTorch tokens/s | clla / PyTorch |"
echo "|---|---|---|---|---|---|---|---|"
for model in mha clla_quant moe; do
    cfg=$ROOT/bench/train_d512_$model.json
    for T in $LENS; do
        B=$(( T >= 2048 ? 1 : 2048 / T ))
        sets=(--set "train.seq_len=$T" --set "train.micro_batch=$B")
        out=$("$BT" --config "$cfg" "${sets[@]}" --steps $STEPS --json 2>&1) || { echo "bench_train failed: $out" >&2; exit 1; }
        js=$(grep '^{' <<< "$out" | tail -n 1)
        tok=$(field tokens_per_s "$js") ratio=$(field ratio "$js") share=$(field attention_share "$js")
        [ -n "$tok" ] && [ -n "$ratio" ] && [ -n "$share" ] ||
            { echo "bench_train_vs_torch: bench_train printed no tokens_per_s, ratio or attention_share for $model at T = $T: ${js:0:200}" >&2; exit 1; }
        torch_tok="-" vs="-"
        # the twin's explicit attention keeps scores, probabilities and their masked copy per layer
        LNH=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["num_hidden_layers"] * c["num_attention_heads"])' "$cfg")
        need_kb=$(( LNH * B * T * T * 4 * 3 / 1024 ))
        if [ $model = moe ]; then torch_tok="(no baseline)"
        elif [ $need_kb -gt $(( MEM_KB / 2 )) ]; then torch_tok="(T x T needs $(( need_kb / 1048576 )) GiB)"
        else
            tout=$("$PY" "$ROOT/bench/bench_torch_cpu.py" --config "$cfg" "${sets[@]}" --steps $TSTEPS --json 2>&1) ||
                { echo "bench_torch_cpu failed: $tout" >&2; exit 1; }
            tjs=$(grep '^{' <<< "$tout" | tail -n 1)
            torch_tok=$(field tokens_per_s "$tjs")
            [ -n "$torch_tok" ] || { echo "bench_train_vs_torch: bench_torch_cpu.py printed no tokens_per_s for $model at T = $T: ${tjs:0:200}" >&2; exit 1; }
            torch_tok=$(printf '%.1f' "$torch_tok")
            vs=$(awk -v a="$tok" -v b="$torch_tok" 'BEGIN { printf "%.2fx", a / b }')
        fi
        printf '| %s | %d | %d | %.1f | %.3f | %.1f%% | %s | %s |\n' "$model" "$T" $((B * T)) "$tok" "$ratio" \
            "$(awk -v s="$share" 'BEGIN { print 100 * s }')" "$torch_tok" "$vs"
    done
done
