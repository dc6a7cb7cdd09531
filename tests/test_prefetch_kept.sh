#!/usr/bin/env bash
# The decode-time kernels' software prefetches are in the built objects. GCC 12 at -O2 deletes
# the calls to a function that holds only __builtin_prefetch (it finds it free of side effects);
# the first version of the few-row matmul's weight prefetch compiled to no prefetch instruction
# at all and measured level (docs/INFERENCE.md). The helpers are always inlined since; this
# counts the prefetch instructions of each kernel's object in the core library, so that a
# helper that loses its always_inline, or a compiler that drops them some other way, fails here.
# usage: tests/test_prefetch_kept.sh   (BUILD: the build tree, as ctest sets it)
set -u
BUILD=${BUILD:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build}
lib="$BUILD/libclla_core.a"
[ "$(uname -m)" = x86_64 ] || { echo "skip: the prefetch instructions counted are x86-64's (this is $(uname -m))"; exit 77; }
command -v objdump > /dev/null || { echo "skip: objdump not found (apt-get install binutils)"; exit 77; }
[ -f "$lib" ] || { echo "FAIL: $lib not found: build the project first"; exit 1; }

# object -> the fewest prefetch instructions it must hold (its functions that prefetch)
declare -A WANT=(
  [cpu_matmul.c.o]=3              # tile_2x8, tile_2x4, tile_4x1 (prefetch_weight)
  [cpu_paged_attention.c.o]=4     # chunk_matrix, prefetch_rows, prefetch_tokens (inlined at several calls)
)
counts=$(objdump -d --no-show-raw-insn "$lib" | awk '
  /file format/ { obj = $1; sub(/:$/, "", obj) }
  /\tprefetch/ { n[obj]++ }
  END { for (o in n) print o, n[o] }')
fail=0
for obj in "${!WANT[@]}"; do
  got=$(awk -v o="$obj" '$1 == o { print $2 }' <<< "$counts")
  got=${got:-0}
  if [ "$got" -ge "${WANT[$obj]}" ]; then
    echo "ok   $obj: $got prefetch instructions (at least ${WANT[$obj]})"
  else
    echo "FAIL $obj: $got prefetch instructions, at least ${WANT[$obj]} expected: a prefetch helper was compiled away (always_inline?)"
    fail=1
  fi
done
exit $fail
