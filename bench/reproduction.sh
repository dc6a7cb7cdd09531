#!/usr/bin/env bash
# The small-scale reproduction of the CLLA paper's tables (docs/REPRODUCTION.md): launch/sweep over
# the tiny twins of configs/tiny (scripts/gen_paper_configs.py), three seeds each, on the built-in
# English corpus with the quickstart's tokenizer and shards, validation over every window of the
# held-out shard at the end. Parts:
#
#   main   Tables 2/3, 6 and 7: mha gqa mla clla clla_quant (FFN widths matched to MHA's activated
#          parameters) and the CLLA sharing variants t6_*, t7_* (CLLA's FFN width), 1,024,000
#          tokens each (1000 steps of 1024 tokens)  -> OUT/main
#   t5     Table 5: intra- against inter-layer sharing, t5_* (16 heads; FFN widths matched to
#          t5_mha's activated parameters), 512,000 tokens each (the paper, too, trained its
#          Table 5 for a sixth of its main budget)            -> OUT/t5
#   s2     the search for a cache at or below 2% of MHA's bytes per token: the s2_* candidates and
#          mha, 1,024,000 tokens each                        -> OUT/s2
#
#   bench/reproduction.sh PART [PART ...]      (default: main t5 s2; OUT: runs/repro, or $REPRO_OUT)
#
# Each part is one launch/sweep: run the same command again to resume it (finished runs are
# skipped, interrupted ones resume from their checkpoints). Runs use one thread each
# (train.threads=1), so two parts can run side by side on a 2-core machine:
#   bench/reproduction.sh main s2 & bench/reproduction.sh t5 & wait
# Environment: CLLA_BUILD_DIR (default build/), CLLA_DATA_CACHE (default data_cache/), REPRO_SEEDS
# (default 1,2,3), REPRO_OUT (default runs/repro).
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CALLER=$PWD   # a relative REPRO_OUT is the caller's, the default is the repository's
cd "$ROOT"
BUILD=${CLLA_BUILD_DIR:-$ROOT/build}
CACHE=${CLLA_DATA_CACHE:-$ROOT/data_cache}
OUT=${REPRO_OUT:-runs/repro}
[ -z "${REPRO_OUT:-}" ] || case $OUT in /*) ;; *) OUT=$CALLER/$OUT ;; esac
SEEDS=${REPRO_SEEDS:-1,2,3}
Q=$CACHE/quickstart
export CLLA=$BUILD/clla OMP_WAIT_POLICY=PASSIVE
[ -x "$CLLA" ] || { echo "reproduction: no $CLLA: build first (scripts/build.sh)" >&2; exit 1; }
if [ ! -s "$Q/tokenizer.tok" ] || [ ! -d "$Q/shards/train" ] || [ ! -d "$Q/shards/val" ]; then
  echo "reproduction: $Q has no tokenizer or shards: run scripts/quickstart.sh once (it makes them)" >&2
  exit 1
fi
S=(--set "train.data=$Q/shards/train" --set "train.val_data=$Q/shards/val" --set "train.tokenizer=$Q/tokenizer.tok"
   --set train.threads=1 --set train.val_every=250 --set train.val_batches=0 --seeds "$SEEDS")
[ $# -gt 0 ] || set -- main t5 s2
for part in "$@"; do   # every part known before the first sweep (an hour) starts
  case $part in main | t5 | s2) ;; *) echo "reproduction: unknown part '$part': main, t5 or s2" >&2; exit 2 ;; esac
done
status=0
for part in "$@"; do
  case $part in
    main) configs=(configs/tiny/{mha,gqa,mla,clla,clla_quant,t6_clla_share_krope,t6_clla_share_kvproj,t7_clla_quant_share_kvproj}.json)
          tokens=1024000 ;;
    t5)   configs=(configs/tiny/t5_mha.json configs/tiny/t5_{gqa_group8,gqa_group4,gqa_group2,mqa,cla_share2,cla_share4,cla_share8,gqa_group4_cla_share2,gqa_group2_cla_share2,mqa_dim384_cla_share2,mqa_dim192_cla_share2}.json)
          tokens=512000 ;;
    s2)   configs=(configs/tiny/mha.json configs/tiny/s2_*.json)
          tokens=1024000 ;;
    *) echo "reproduction: unknown part '$part': main, t5 or s2" >&2; exit 2 ;;
  esac
  echo "== reproduction $part: ${#configs[@]} configs x seeds $SEEDS, $tokens tokens each -> $OUT/$part"
  if [ "$part" = s2 ] && [ -d "$OUT/main/runs" ]; then
    # the MHA baseline is the main part's (the same config, seeds and tokens): a new s2 sweep
    # takes its finished runs instead of training them again
    launch/sweep --out "$OUT/s2" "${configs[@]}" --tokens "$tokens" "${S[@]}" --collect-only --no-plots > /dev/null 2>&1 || true
    for r in "$OUT"/main/runs/mha__s*; do
      [ -s "$r/model.safetensors" ] && [ -d "$OUT/s2/runs" ] && [ ! -e "$OUT/s2/runs/${r##*/}" ] && cp -a "$r" "$OUT/s2/runs/"
    done
  fi
  launch/sweep --out "$OUT/$part" "${configs[@]}" --tokens "$tokens" "${S[@]}" || status=$?
done
exit $status
