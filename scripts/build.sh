#!/usr/bin/env bash
# Configures and builds clla in a build directory, quietly: the full cmake/compiler output
# goes to DIR/build.log and only its tail is shown when something fails.
# usage: scripts/build.sh DIR [extra cmake arguments, e.g. -DCLLA_CUDA=ON]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in
  -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; echo "(a directory named -h or --help: give it as ./--help)"; exit 0 ;;
esac
DIR=${1:?usage: scripts/build.sh DIR [cmake args...]}
shift
mkdir -p -- "$DIR"
LOG=$DIR/build.log
if ! { cmake -S "$ROOT" -B "$DIR" "$@" && cmake --build "$DIR" -j"$(nproc)"; } > "$LOG" 2>&1; then
  echo "build: failed in $DIR; the end of $LOG:" >&2
  tail -n 40 -- "$LOG" >&2
  exit 1
fi
# Warnings are bugs here (-Wall -Wextra -Wshadow): show them without failing the build.
if grep -q "warning:" "$LOG"; then
  echo "build: compiler warnings in $DIR:" >&2
  grep "warning:" "$LOG" | sort -u | head -n 20 >&2
fi
# a directory configured earlier keeps its build type: a Debug one is -O0, so say so
TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$DIR/CMakeCache.txt" 2> /dev/null || true)
if [ -n "$TYPE" ] && [ "$TYPE" != Release ]; then
  echo "build: note: $DIR is configured as a $TYPE build, not Release (benchmarks and training are slower; -DCMAKE_BUILD_TYPE=Release changes it)" >&2
fi
echo "build: $DIR ok"
