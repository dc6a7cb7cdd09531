#!/usr/bin/env bash
# The 2% search's post-training route (docs/REPRODUCTION.md): the CLLA runs of the main
# reproduction sweep (bench/reproduction.sh main), each seed's cache coded with cq after
# training (clla calibrate: latent at 1 bit per element, both rope keys at 2, on 4,096 training
# tokens), scored on the whole validation shard through the cache (clla eval --through-cache),
# beside the same seed's MHA and plain CLLA scored by the same command without codecs.
#
#   bench/reproduction_codecs.sh [OUT]      (default runs/repro; needs OUT/main/runs/{mha,clla}__s<seed>)
#
# Writes OUT/codecs/clla_cq__s<seed> (the packages; kept when present) and
# OUT/codecs/results.jsonl (one eval object per model and seed, with "model" and "seed" added),
# and prints one markdown table. Environment: CLLA_BUILD_DIR (default build/), CLLA_DATA_CACHE
# (default data_cache/), REPRO_SEEDS (default 1,2,3).
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CALLER=$PWD   # a relative OUT is the caller's, the default is the repository's
cd "$ROOT"
BUILD=${CLLA_BUILD_DIR:-$ROOT/build}
CACHE=${CLLA_DATA_CACHE:-$ROOT/data_cache}
OUT=${1:-runs/repro}
[ -z "${1:-}" ] || case $OUT in /*) ;; *) OUT=$CALLER/$OUT ;; esac
SEEDS=${REPRO_SEEDS:-1,2,3}
Q=$CACHE/quickstart
CLLA=$BUILD/clla
[ -x "$CLLA" ] || { echo "reproduction_codecs: no $CLLA: build first (scripts/build.sh)" >&2; exit 1; }
[ -d "$Q/shards/val" ] || { echo "reproduction_codecs: no $Q/shards: run scripts/quickstart.sh once" >&2; exit 1; }
CODECS=(--cache-codec latent=cq:bits=8,c=8 --cache-codec k_rope=cq:bits=8,c=4 --cache-codec own_k_rope=cq:bits=8,c=4)
mkdir -p "$OUT/codecs"
RES=$OUT/codecs/results.jsonl
: > "$RES.tmp"
trap 'rm -f "$RES.tmp"' EXIT   # a failed eval or calibrate leaves no half-filled results behind
record() {   # record MODEL SEED EVAL_JSON [INFO_JSON]: one line of results.jsonl (a plain model's
             # cache bytes per token from clla info, a coded one's as eval measured them)
    /usr/bin/python3 -c '
import json, sys
o = json.loads(sys.argv[3]); o["model"] = sys.argv[1]; o["seed"] = int(sys.argv[2])
if len(sys.argv) > 4: o["cache_bytes_stored_per_token"] = json.loads(sys.argv[4])["kv_cache_bytes_per_token"]["model"]
print(json.dumps(o))' "$@" >> "$RES.tmp"
}
for s in ${SEEDS//,/ }; do
    for m in mha clla; do
        run=$OUT/main/runs/${m}__s$s
        [ -s "$run/model.safetensors" ] || { echo "reproduction_codecs: $run has no trained model: run bench/reproduction.sh main first" >&2; exit 1; }
        record "$m" "$s" "$("$CLLA" eval --checkpoint "$run" --data "$Q/shards/val" --json)" \
            "$("$CLLA" info --config "$run/config.json" --json)"
    done
    pkg=$OUT/codecs/clla_cq__s$s
    [ -s "$pkg/config.json" ] || "$CLLA" calibrate "$OUT/main/runs/clla__s$s" --data "$Q/shards/train" --tokens 4096 "${CODECS[@]}" --out "$pkg" >&2
    record clla_cq "$s" "$("$CLLA" eval --checkpoint "$pkg" --data "$Q/shards/val" --through-cache --json)"
done
mv "$RES.tmp" "$RES"
/usr/bin/python3 - "$RES" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["model"], {})[r["seed"]] = r
seeds = sorted(by["mha"])
print("| model | cache B/token (codes) | val loss per seed | mean | Δ vs MHA, paired (mean ± sd) | Δ % |")
print("|---|---|---|---|---|---|")
mha = statistics.mean(by["mha"][s]["loss"] for s in seeds)
for m in ("mha", "clla", "clla_cq"):
    losses = [by[m][s].get("loss_decoded", by[m][s]["loss"]) for s in seeds]
    ds = [l - by["mha"][s]["loss"] for l, s in zip(losses, seeds)]
    mean = statistics.mean(losses)
    cb = by[m][seeds[0]]["cache_bytes_stored_per_token"]
    d = "(baseline)" if m == "mha" else f"{statistics.mean(ds):+.4f} ± {statistics.stdev(ds) if len(ds) > 1 else float('nan'):.4f}"
    print(f"| {m} | {cb:g} | {' '.join(f'{l:.4f}' for l in losses)} | {mean:.4f} | {d} | {100 * (mean / mha - 1):+.2f} |")
EOF
