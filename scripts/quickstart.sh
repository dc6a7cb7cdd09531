#!/usr/bin/env bash
# The project's point on a built-in default, on a fresh Debian 12 as root: install what is
# needed, build the CPU backend, learn a 4096-token BPE vocabulary on the built-in English
# corpus, tokenize the corpus into shards, train a small CLLA-quant model with a
# mixture-of-experts FFN (configs/quickstart.json) on the CPU and print its loss curve, then
# measure its perplexity through its int4 latent cache, generate continuations of a few
# prompts through that cache, and print the cache bytes per token beside MHA's at the same
# shape. About 5 minutes on 2 cores; a second run reuses the build, the vocabulary and the
# shards, and trains again over runs/quickstart (--overwrite).
#
# Environment: CLLA_BUILD_DIR (default build/), CLLA_DATA_CACHE (default data_cache/).
# Extra arguments go to `clla train`, e.g. scripts/quickstart.sh --set train.max_steps=50
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${CLLA_BUILD_DIR:-$ROOT/build}
CACHE=${CLLA_DATA_CACHE:-$ROOT/data_cache}
Q=$CACHE/quickstart

bash scripts/setup.sh
bash scripts/build.sh "$BUILD" -DCLLA_CUDA=OFF
CLLA=$BUILD/clla

# A small vocabulary of our own instead of GPT-2's 50257 ids: the output head of a model
# this size would otherwise be most of its parameters and most of its time.
if [ ! -s "$Q/tokenizer.tok" ]; then
  mkdir -p "$Q"
  "$CLLA" tokenizer train --vocab-size 4096 --pattern gpt2 --out "$Q/tokenizer.tok" "$CACHE/corpus/english.jsonl"
fi
if [ ! -d "$Q/shards/train" ] || [ ! -d "$Q/shards/val" ]; then
  "$CLLA" prep --tokenizer "$Q/tokenizer.tok" --out "$Q/shards" --overwrite "$CACHE/corpus/english.jsonl"   # an earlier, partial output
fi
"$CLLA" train --config configs/quickstart.json --overwrite --set "train.tokenizer=$Q/tokenizer.tok" \
  --set "train.data=$Q/shards/train" --set "train.val_data=$Q/shards/val" "$@"
# the run directory: an --out among the arguments, else the config's
RUN=runs/quickstart
prev=""
for a in "$@"; do
  [ "$prev" = --out ] && RUN=$a
  case $a in --out=*) RUN=${a#--out=} ;; esac
  prev=$a
done
[ -s "$RUN/model.safetensors" ] || exit 0   # e.g. --stop-at: nothing to serve yet

echo
echo "== perplexity through the cache (clla eval --through-cache): the validation tokens pass through"
echo "   the int4 latent cache, as the full forward and decoded token by token"
"$CLLA" eval --checkpoint "$RUN" --data "$Q/shards/val" --through-cache --max-batches 2
echo
echo "== generation through the cache (clla generate, greedy)"
"$CLLA" generate --model "$RUN" --prompt "The jury said" --prompt "It was a cold morning and" \
  --prompt "He looked at her" --max-new-tokens 24
echo
echo "== KV-cache bytes per token (clla info): this model, and MHA at the same shape"
"$CLLA" info --config configs/quickstart.json | sed -n '/^KV cache/,$p'
"$CLLA" info --config configs/quickstart.json --set attention=mha | grep '^KV cache' | sed 's/^KV cache /MHA      /' 
