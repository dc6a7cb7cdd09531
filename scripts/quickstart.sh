#!/usr/bin/env bash
# The main job on a built-in default, on a fresh Debian 12 as root: install what is
# needed, build the CPU backend, learn a 4096-token BPE vocabulary on the built-in English
# corpus, tokenize the corpus into shards, train a small GQA model (configs/quickstart.json)
# on the CPU and print its loss curve. A few minutes on 2 cores; a second run reuses the
# build, the vocabulary and the shards and only trains again.
#
# Environment: CLLA_BUILD_DIR (default build/), CLLA_DATA_CACHE (default data_cache/).
# Extra arguments go to `clla train`, e.g. scripts/quickstart.sh --set train.max_steps=50
set -euo pipefail
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
  "$CLLA" prep --tokenizer "$Q/tokenizer.tok" --out "$Q/shards" "$CACHE/corpus/english.jsonl"
fi
"$CLLA" train --config configs/quickstart.json \
  --set "train.data=$Q/shards/train" --set "train.val_data=$Q/shards/val" "$@"
