#!/usr/bin/env bash
# Several nodes from a hostfile ("node1 slots=8" per line; passwordless ssh between nodes,
# the same clla path and a shared file system for the run directory on every node):
#   CLLA_IFACE=ib0 launch/run_multi_node.sh hosts.txt 16 CONFIG --out /shared/runs/x [options...]
# Ranks fill each host's slots in turn (--map-by slot); CLLA_PER_NODE=G places G per node
# instead (ppr:G:node), CLLA_MAP any other --map-by.
set -eu
if [ $# -lt 3 ]; then echo "usage: launch/run_multi_node.sh HOSTFILE N CONFIG [clla train options...]" >&2; exit 2; fi
HOSTFILE=$1; N=$2; CONFIG=$3; shift 3
[ -f "$HOSTFILE" ] || { echo "run_multi_node.sh: hostfile '$HOSTFILE' is not a file" >&2; exit 2; }
case $N in '' | *[!0-9]* | 0*) echo "run_multi_node.sh: N '$N' must be a whole number of ranks, 1 or more (no leading zero)" >&2; exit 2 ;; esac
[ -f "$CONFIG" ] || { echo "run_multi_node.sh: config '$CONFIG' is not a file" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
CLLA=${CLLA:-$HERE/../build/clla}
[ -x "$CLLA" ] || { echo "run_multi_node.sh: '$CLLA' is not an executable (the same path on every node): build clla or set CLLA" >&2; exit 2; }
. "$HERE/env.sh"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
MAP=${CLLA_MAP:-slot}
if [ -z "${CLLA_MAP:-}" ] && [ -n "${CLLA_PER_NODE:-}" ]; then MAP=ppr:$CLLA_PER_NODE:node; fi
# -x passes only what is set (mpirun warns about a variable it cannot find): every NCCL_* of this
# environment (env.sh's NCCL_NET_GDR_LEVEL among them), so that every node runs NCCL alike
PASS=()
for v in OMP_NUM_THREADS PATH LD_LIBRARY_PATH $(compgen -e | grep '^NCCL_'); do
    [ -n "${!v+x}" ] && PASS+=(-x "$v")
done
exec mpirun "${ROOT[@]}" --hostfile "$HOSTFILE" -np "$N" --map-by "$MAP" --bind-to none "${PASS[@]}" \
    "$CLLA" train --config "$CONFIG" "$@"
