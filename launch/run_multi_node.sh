#!/usr/bin/env bash
# Several nodes from a hostfile ("node1 slots=8" per line; passwordless ssh between nodes,
# the same clla path and a shared file system for the run directory on every node):
#   CLLA_IFACE=ib0 launch/run_multi_node.sh hosts.txt 16 CONFIG --out /shared/runs/x [options...]
set -eu
if [ $# -lt 3 ]; then echo "usage: launch/run_multi_node.sh HOSTFILE N CONFIG [clla train options...]" >&2; exit 2; fi
HOSTFILE=$1; N=$2; CONFIG=$3; shift 3
[ -f "$HOSTFILE" ] || { echo "run_multi_node.sh: hostfile '$HOSTFILE' is not a file" >&2; exit 2; }
case $N in '' | *[!0-9]* | 0) echo "run_multi_node.sh: N '$N' must be a whole number of ranks, 1 or more" >&2; exit 2 ;; esac
[ -f "$CONFIG" ] || { echo "run_multi_node.sh: config '$CONFIG' is not a file" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
CLLA=${CLLA:-$HERE/../build/clla}
[ -x "$CLLA" ] || { echo "run_multi_node.sh: '$CLLA' is not an executable (the same path on every node): build clla or set CLLA" >&2; exit 2; }
. "$HERE/env.sh"
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
# -x passes the environment to the remote ranks (mpirun only forwards what it is told to)
exec mpirun "${ROOT[@]}" --hostfile "$HOSTFILE" -np "$N" --map-by "${CLLA_MAP:-ppr:${CLLA_PER_NODE:-1}:node}" --bind-to none \
    -x OMP_NUM_THREADS -x NCCL_SOCKET_IFNAME -x NCCL_IB_DISABLE -x NCCL_DEBUG -x PATH -x LD_LIBRARY_PATH \
    "$CLLA" train --config "$CONFIG" "$@"
