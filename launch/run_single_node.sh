#!/usr/bin/env bash
# One node, N ranks: launch/run_single_node.sh N CONFIG [clla train options...]
# e.g. launch/run_single_node.sh 8 configs/paper/x.json --out runs/x --save-every 500 --zero 1
set -eu
if [ $# -lt 2 ]; then echo "usage: launch/run_single_node.sh N CONFIG [clla train options...]" >&2; exit 2; fi
N=$1; CONFIG=$2; shift 2
case $N in '' | *[!0-9]* | 0*) echo "run_single_node.sh: N '$N' must be a whole number of ranks, 1 or more (no leading zero)" >&2; exit 2 ;; esac
[ -f "$CONFIG" ] || { echo "run_single_node.sh: config '$CONFIG' is not a file" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
CLLA=${CLLA:-$HERE/../build/clla}
[ -x "$CLLA" ] || { echo "run_single_node.sh: '$CLLA' is not an executable: build clla (bash scripts/build.sh build) or set CLLA" >&2; exit 2; }
# an interface named by the user stays NCCL's (its bootstrap opens a socket even on one host)
user_iface=${NCCL_SOCKET_IFNAME-}${CLLA_IFACE-}
. "$HERE/env.sh"
# ranks run on one host: shared memory between them, so no interface is needed; env.sh's default
# name (eth0) would make NCCL fail on a host whose card is called otherwise (ens5, enp0s3)
unset OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include
[ -n "$user_iface" ] || unset NCCL_SOCKET_IFNAME
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
exec mpirun "${ROOT[@]}" -np "$N" --bind-to "${CLLA_BIND:-socket}" --map-by "${CLLA_MAP:-socket}" \
    "$CLLA" train --config "$CONFIG" "$@"
