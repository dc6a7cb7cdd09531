#!/usr/bin/env bash
# The CPU attention op of this tree against the one of an older commit, alternated in one process
# (bench/ab/ab_attention.c says why), at bench_train's shapes: MHA 8 x 64 and the latent 8 x 96 / 64,
# T = 512 (B = 4) and T = 2048 (B = 1).
#
#   bash bench/ab_attention.sh OLD_COMMIT [REPS]     (REPS: alternated rounds, default 8)
#
# AB_TINY=1 runs one small shape of each head width instead (tests/test_bench_scripts.sh).
# Threads: OMP_NUM_THREADS as set (the documented figures use 2). Flags: the Release build's
# (CMakeLists.txt), -O2 -march=native.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "--help" ]; then
    echo "usage: bash bench/ab_attention.sh OLD_COMMIT [REPS]" >&2
    echo "Times layers/cpu_attention.c of this tree against OLD_COMMIT's, alternated in one process." >&2
    [ $# -ge 1 ] && exit 0 || exit 2
fi
old="$1"
reps="${2:-8}"
case "$reps" in ''|*[!0-9]*) echo "ab_attention.sh: REPS '$reps' is not a whole number" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
git rev-parse --verify --quiet "$old^{commit}" >/dev/null || { echo "ab_attention.sh: '$old' is not a commit of this repository" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
flags=(-O2 -march=native -fopenmp -std=c11 -D_GNU_SOURCE -I "$root")
# the old op's entry points renamed, compiled from inside the tree so that its includes resolve
git show "$old:layers/cpu_attention.c" | sed 's/^void cpu_attention_/void old_cpu_attention_/' > "$work/old_attention.c"
gcc "${flags[@]}" -iquote "$root/layers" -c "$work/old_attention.c" -o "$work/old.o"
gcc "${flags[@]}" -c layers/cpu_attention.c -o "$work/new.o"
gcc "${flags[@]}" -Wall -Wextra bench/ab/ab_attention.c "$work/old.o" "$work/new.o" common/util.c common/num.c \
    -o "$work/ab_attention" -lopenblas -lm
echo "ab_attention: $(git rev-parse --short "$old") (old) against the working tree (new), OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, best of $reps"
if [ "${AB_TINY:-0}" = 1 ]; then
    "$work/ab_attention" 1 130 64 "$reps"
    "$work/ab_attention" 1 130 96 "$reps"
    exit 0
fi
"$work/ab_attention" 4 512 64 "$reps"
"$work/ab_attention" 1 2048 64 "$reps"
"$work/ab_attention" 4 512 96 "$reps"
"$work/ab_attention" 1 2048 96 "$reps"
