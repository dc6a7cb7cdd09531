#!/usr/bin/env bash
# A CPU op of this tree against the same op of an older commit, alternated in one process
# (bench/ab/ab_attention.c says why), at bench_train's shapes (bench/train_d512_*.json):
#   attention  layers/cpu_attention.c: MHA 8 x 64 and the latent 8 x 96 / 64, T = 512 (B = 4)
#              and T = 2048 (B = 1)
#   moe        layers/cpu_moe.c's grouped expert matmuls: 2048 tokens routed top-2 over 8 and
#              over 64 experts, d_model 512, expert width 352 (bench/ab/ab_moe.c)
#   matmul     layers/cpu_matmul.c, the dense linear layer: 2048 tokens through the d512 models'
#              projections (512 -> 512, 512 -> 1408, 1408 -> 512, 512 -> 8192) (bench/ab/ab_matmul.c)
#   matmul_rows  the same op at a decode step's rows (1 and 8 tokens) over the d512 projections,
#              the forward over copies of the weight past the L3, as a step streams its layers'
#   paged      layers/cpu_paged_attention.c, a decode step's attention over a bf16 cache at
#              bench_decode's 16k context: MHA, GQA and MQA (8 heads of 64) at batch 8, the
#              latent form (8 heads over latent 256 + rope 32) at batches 1 and 8, 8 layers of
#              caches (bench/ab/ab_paged.c; it also says whether the outputs have the same bits)
#
#   bash bench/ab.sh attention|moe|matmul|matmul_rows|paged OLD_COMMIT [REPS]     (REPS: alternated rounds, default 8)
#
# AB_TINY=1 runs small shapes instead (tests/test_bench_scripts.sh). Threads: OMP_NUM_THREADS as
# set (the documented figures use 2). Flags: the Release build's (CMakeLists.txt), -O2 -march=native,
# with the file's own options there (-ffp-contract=fast for the matmul). The old op is compiled
# among the headers of its commit, the new among the tree's.
set -euo pipefail
usage() { echo "usage: bash bench/ab.sh attention|moe|matmul|matmul_rows|paged OLD_COMMIT [REPS]" >&2; }
if [ $# -ge 1 ] && [ "$1" = "--help" ]; then
    usage
    echo "Times a CPU op of this tree against OLD_COMMIT's, alternated in one process." >&2
    exit 0
fi
[ $# -ge 2 ] || { usage; exit 2; }
op="$1" old="$2" reps="${3:-8}"
case "$op" in
    attention) src=layers/cpu_attention.c extra=(layers/cpu_copy.c) opflags=() ;;   # it packs rows with cpu_copy_cols
    moe) src=layers/cpu_moe.c extra=(layers/cpu_matmul.c) opflags=() ;;   # its router calls the dense matmul
    matmul|matmul_rows) src=layers/cpu_matmul.c extra=() opflags=(-ffp-contract=fast) ;;   # as CMakeLists.txt builds it
    paged) src=layers/cpu_paged_attention.c extra=(layers/cpu_memory.c) opflags=(-ffp-contract=fast) ;;   # as CMakeLists.txt builds it; caches from cpu_alloc
    *) echo "ab.sh: unknown op '$op': use attention, moe, matmul, matmul_rows or paged" >&2; exit 2 ;;
esac
case "$reps" in ''|*[!0-9]*|0*) echo "ab.sh: REPS '$reps' is not a whole number of 1 or more (no leading zero)" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
git rev-parse --verify --quiet "$old^{commit}" >/dev/null || { echo "ab.sh: '$old' is not a commit of this repository" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cflags=(-O2 -march=native -fopenmp -std=c11 -D_GNU_SOURCE "${opflags[@]}")
flags=("${cflags[@]}" -I "$root")
# the old op's entry points renamed old_*, compiled among the old commit's own headers (common/vec.h
# and the like change too)
mkdir "$work/old_tree"
git archive "$old" common layers backend | tar -x -C "$work/old_tree"
# the grouped expert matmuls took their row offsets from the host before backend/moe_tiles.h came
# (and no row count R): an older file would be called with the wrong arguments
if [ "$op" = moe ] && [ ! -f "$work/old_tree/backend/moe_tiles.h" ]; then
    echo "ab.sh: moe: $old predates the grouped matmuls' row-count argument (backend/moe_tiles.h): compare against a later commit" >&2
    exit 2
fi
# the bench calls the old entry points with the working tree's prototypes: an op whose arguments
# changed since (attention's T x T matrix before issue 16's out and lse) ran undefined and hung
sigs() { python3 -c '
import re, sys
t = re.sub(r"\s+", " ", open(sys.argv[1]).read())
for m in re.finditer(r"(?:^| )void (cpu_\w+)\(([^)]*)\) \{", t): print(m.group(1) + "(" + re.sub(r"\b\w+(?=,|$)", "", m.group(2)).replace(" ", "") + ")")
' "$1" | sort; }
changed=$(comm -13 <(sigs "$src") <(sigs "$work/old_tree/$src") | head -n 1)
if [ -n "$changed" ]; then
    echo "ab.sh: $op: $old's $src has another prototype than the working tree's ($changed): compare against a later commit" >&2
    exit 2
fi
sed "s/^void cpu_/void old_cpu_/" "$work/old_tree/$src" > "$work/old_tree/${src%.c}_old.c"
gcc "${cflags[@]}" -I "$work/old_tree" -c "$work/old_tree/${src%.c}_old.c" -o "$work/old.o"
gcc "${flags[@]}" -c "$src" -o "$work/new.o"
gcc "${flags[@]}" -Wall -Wextra "bench/ab/ab_${op%_rows}.c" "$work/old.o" "$work/new.o" "${extra[@]}" common/util.c common/unfinished.c common/num.c \
    -o "$work/ab" -lopenblas -lm
echo "ab $op: $(git rev-parse --short "$old") (old) against the working tree (new), OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, best of $reps"
tiny="${AB_TINY:-0}"
if [ "$op" = attention ]; then
    if [ "$tiny" = 1 ]; then shapes=("1 130 64" "1 130 96")
    else shapes=("4 512 64" "1 2048 64" "4 512 96" "1 2048 96"); fi
elif [ "$op" = moe ]; then   # tokens, experts, top-k, d_model, expert width
    if [ "$tiny" = 1 ]; then shapes=("100 4 2 48 40" "100 16 2 48 40")
    else shapes=("2048 8 2 512 352" "2048 64 2 512 352"); fi
elif [ "$op" = paged ]; then   # sequences, context, heads, kv heads, key width, rope width, value width
    if [ "$tiny" = 1 ]; then shapes=("2 100 4 2 16 0 16" "1 70 4 1 32 8 32")
    else shapes=("8 16384 8 8 64 0 64" "8 16384 8 2 64 0 64" "8 16384 8 1 64 0 64" "1 16384 8 1 256 32 256"
                 "8 16384 8 1 256 32 256"); fi
elif [ "$op" = matmul_rows ]; then   # tokens, d_in, d_out
    if [ "$tiny" = 1 ]; then shapes=("1 96 80" "8 40 30")
    else shapes=("1 512 1536" "8 512 1536" "1 512 2816" "8 512 2816" "1 1408 512" "8 1408 512" "1 512 8192" "8 512 8192"); fi
else   # tokens, d_in, d_out
    if [ "$tiny" = 1 ]; then shapes=("300 96 80" "50 40 30")
    else shapes=("2048 512 512" "2048 512 1408" "2048 1408 512" "2048 512 8192"); fi
fi
for s in "${shapes[@]}"; do
    # shellcheck disable=SC2086  # a shape is several arguments
    "$work/ab" $s "$reps"
done
