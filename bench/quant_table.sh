#!/usr/bin/env bash
# Validation perplexity against cache bits for the cache codecs, on models the project trains:
# MHA, CLLA and CLLA-quant of the quickstart shape without MoE (bench/quant/*.json), trained on
# the built-in English corpus with the quickstart's tokenizer and the same token budget (300
# steps of 16 x 128). Each model is evaluated through its cache (`clla eval --through-cache`:
# full forward with the codecs' round trips and token by token, which must agree) with every
# codec at 4, 3, 2 and 1 bits where it supports them: int_group (per-token groups of 32, 2-8
# bits), cq (calibrated by `clla calibrate`: 4 bits = c 2 b 8, 3 = c 2 b 6, 2 = c 4 b 8,
# 1 = c 8 b 8), qet (calibrated: 3 bits = 3 swap levels, width 8, K 256 + 16; 2 bits = 1
# level, K 256 + 16), kvquant (calibrated: nuq4, nuq3, nuq2 with 1% outliers and one fp16 sink
# token, keys before RoPE), kivi (b bits, groups of 32, a 32-token fp16 window: the eval windows are
# 128 tokens, which the reference's 128-token window would hold whole) and qjl (keys m = b x the
# head width sign bits, no outlier split, values b bits, a 32-token buffer), on K and V (MHA) or
# on the latent (CLLA; its rope keys stay bf16);
# CLLA-quant with the int4 latent it was trained with. Writes OUT/results.jsonl, OUT/table.md and
# OUT/perplexity_vs_bytes.{png,svg} (one line per model and codec).
#
#   bench/quant_table.sh [OUT]     (default runs/quant_table; trained models are reused)
#
# About 25 minutes on 2 cores. Environment: CLLA_BUILD_DIR (default build/), CLLA_DATA_CACHE
# (default data_cache/), QT_STEPS (training steps, default 300), QT_BATCHES (eval batches of 16
# windows, default 4), QT_CAL_TOKENS (calibration tokens, default 4096).
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CALLER=$PWD   # a relative OUT is the caller's, the default is the repository's
cd "$ROOT"
BUILD=${CLLA_BUILD_DIR:-$ROOT/build}
CACHE=${CLLA_DATA_CACHE:-$ROOT/data_cache}
CLLA=$BUILD/clla
OUT=${1:-runs/quant_table}
[ -z "${1:-}" ] || case $OUT in /*) ;; *) OUT=$CALLER/$OUT ;; esac
STEPS=${QT_STEPS:-300}
BATCHES=${QT_BATCHES:-4}
CAL=${QT_CAL_TOKENS:-4096}
Q=$CACHE/quickstart
PY=/usr/bin/python3   # Debian's, with python3-matplotlib (scripts/setup.sh)
[ -x "$PY" ] || PY=python3
[ -x "$CLLA" ] || { echo "quant_table: no $CLLA: build first (scripts/build.sh)" >&2; exit 1; }
if [ ! -s "$Q/tokenizer.tok" ] || [ ! -d "$Q/shards/train" ]; then
  echo "quant_table: $Q has no tokenizer or shards: run scripts/quickstart.sh once (it makes them)" >&2
  exit 1
fi
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: > "$RES"

# eval MODEL_DIR LABEL_MODEL LABEL_CODEC [--cache-codec ...]: one results line
evaluate() {
  local dir=$1 model=$2 codec=$3
  shift 3
  local j
  j=$("$CLLA" eval --checkpoint "$dir" --data "$Q/shards/val" --through-cache --max-batches "$BATCHES" --json "$@")
  echo "{\"model\":\"$model\",\"codec\":\"$codec\",\"eval\":$j}" >> "$RES"
  echo "  $model $codec: $(echo "$j" | grep -o '"loss":[0-9.]*') $(echo "$j" | grep -o '"cache_bytes_stored_per_token":[0-9.]*')"
}

for m in mha clla clla_quant; do
  RUN=$OUT/$m
  # a model trained for another QT_STEPS is trained again: its config.json records the steps
  if [ -s "$RUN/model.safetensors" ] && ! grep -q "\"max_steps\":[[:space:]]*$STEPS[,}[:space:]]" "$RUN/config.json" 2> /dev/null; then
    echo "== $m in $RUN was trained for other than $STEPS steps (QT_STEPS): training it again"
    rm -f "$RUN/model.safetensors"
  fi
  if [ ! -s "$RUN/model.safetensors" ]; then
    echo "== training $m ($STEPS steps)"
    "$CLLA" train --config "bench/quant/$m.json" --out "$RUN" --overwrite --quiet --set "train.max_steps=$STEPS" \
      --set "train.data=$Q/shards/train" --set "train.val_data=$Q/shards/val" --set "train.tokenizer=$Q/tokenizer.tok"
  fi
  echo "== $m through its cache"
  prefix=""
  [ "$m" != mha ] && prefix="latent="
  if [ "$m" = clla_quant ]; then evaluate "$RUN" "$m" "int4 (trained)"; continue; fi
  evaluate "$RUN" "$m" bf16 --cache-codec "${prefix}bf16"
  for b in 4 3 2; do evaluate "$RUN" "$m" "int_group $b" --cache-codec "${prefix}int_group:bits=$b,group=32"; done
  # the calibrated codecs: label (the package name without its underscore) and spec
  for lc in "cq_4 cq:bits=8,c=2" "cq_3 cq:bits=6,c=2" "cq_2 cq:bits=8,c=4" "cq_1 cq:bits=8,c=8" \
            "qet_3 qet:levels=3,width=8,k1=256,k2=16" "qet_2 qet:levels=1,width=8,k1=256,k2=16" \
            "kvquant_4 kvquant:bits=4" "kvquant_3 kvquant:bits=3" "kvquant_2 kvquant:bits=2"; do
    set -- $lc
    pkg=$OUT/${m}_${1/_/}
    "$CLLA" calibrate "$RUN" --data "$Q/shards/train" --tokens "$CAL" --cache-codec "${prefix}$2" --out "$pkg" --overwrite > "$pkg.calibrate.log"
    evaluate "$pkg" "$m" "${1/_/ }"
  done
  # kivi and qjl: nothing fitted; the head width sizes qjl's projection
  hd=64
  [ "$m" != mha ] && hd=$(grep -o '"kv_lora_rank": *[0-9]*' "bench/quant/$m.json" | grep -o '[0-9]*$')
  for b in 4 3 2 1; do
    evaluate "$RUN" "$m" "kivi $b" --cache-codec "${prefix}kivi:bits=$b,group=32,residual=32"
    evaluate "$RUN" "$m" "qjl $b" --cache-codec "${prefix}qjl:m=$((b * hd)),o=0,mo=0,group=32,buffer=32,bits=$b"
  done
done

"$PY" - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
lines = ["| model | codec | bits/element of the coded part (paper / stored) | all parts as stored | cache bytes/token stored | loss (full = decoded) | perplexity |",
         "|---|---|---|---|---|---|---|"]
for r in rows:
    e = r["eval"]; b = e["bits_per_element"]
    coded = [p for p in ("k", "v", "latent") if p in b]
    paper = b[coded[0]]["paper"]; stored = b[coded[0]]["stored"]
    same = "=" if abs(e["loss"] - e["loss_decoded"]) <= 1e-4 else "!="
    lines.append(f"| {r['model']} | {r['codec']} | {paper:g} / {stored:g} | {b['all_parts_stored']:.2f} | {e['cache_bytes_stored_per_token']:.1f} | "
                 f"{e['loss']:.4f} {same} {e['loss_decoded']:.4f} | {e['perplexity']:.2f} |")
open(os.path.join(out, "table.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("quant_table: python3-matplotlib is not installed (scripts/setup.sh installs it): no plot", file=sys.stderr)
    sys.exit(0)
fig, ax = plt.subplots(figsize=(7, 4.5))
series = {}
for r in rows:
    fam = r["codec"].split()[0]
    series.setdefault((r["model"], fam), []).append((r["eval"]["cache_bytes_stored_per_token"], r["eval"]["perplexity"], r["codec"]))
for (model, fam), pts in sorted(series.items()):
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{model} {fam}")
ax.set_xscale("log")
ax.set_xlabel("cache bytes per token (whole model, everything stored, measured)")
ax.set_ylabel("validation perplexity (through the cache)")
ax.set_title("bench/quant_table.sh")
ax.legend(fontsize=8)
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(out, f"perplexity_vs_bytes.{ext}"))
print(f"wrote {out}/table.md, {out}/perplexity_vs_bytes.png and .svg")
PY
