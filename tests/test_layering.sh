#!/usr/bin/env bash
# The dependency direction of docs/ARCHITECTURE.md: commands on top, libraries below. Every
# #include "folder/..." of a source file must name a folder its own folder may use. A file that
# reaches up (model/ including train/, the CPU reference including kernels/) fails the test.
# usage: tests/test_layering.sh [SOURCE_ROOT]
set -u
SRC=${1:-${SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}
cd "$SRC" || exit 1

# folder -> the folders it may include (itself included). bench/, tests/ may use everything.
declare -A ALLOWED=(
  [common]="common"
  [backend]="common backend"
  [layers]="common backend layers"
  [kernels]="common backend kernels"
  [data]="common data"
  [quant]="common quant"
  [model]="common backend quant model"
  [eval]="common backend data quant model eval"
  [train]="common backend kernels data quant model eval train"
  [cli]="common backend layers kernels data quant model eval train cli"
)

bad=0 checked=0
for dir in "${!ALLOWED[@]}"; do
  [ -d "$dir" ] || continue
  while IFS= read -r -d '' f; do
    while IFS= read -r line; do
      inc=${line#*\"}; inc=${inc%%\"*}
      top=${inc%%/*}
      [ "$top" = "$inc" ] && continue          # "file.h" next to the source
      checked=$((checked + 1))
      case " ${ALLOWED[$dir]} " in
        *" $top "*) ;;
        *) echo "layering: $f includes \"$inc\": $dir/ may include only ${ALLOWED[$dir]} (docs/ARCHITECTURE.md)"; bad=$((bad + 1)) ;;
      esac
    done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
  done < <(find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
done
# A folder the table does not know would escape the rule: name it.
for d in */; do
  d=${d%/}
  case "$d" in build*|data_cache|node_modules|bench|tests|docs|configs|scripts|launch) continue ;; esac
  if [ -z "${ALLOWED[$d]+x}" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | grep -q .; then
    echo "layering: folder $d/ holds sources but has no row in tests/test_layering.sh and docs/ARCHITECTURE.md"
    bad=$((bad + 1))
  fi
done
echo "$checked includes checked, $bad reaching up"
[ "$bad" -eq 0 ]
