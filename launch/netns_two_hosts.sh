#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces clla-aN and clla-bN (each with its own
# hostname via a UTS namespace) joined by a bridge, 10.77.N.0/24, and one clla rank on each,
# launched by mpirun from a hostfile over TCP only (no shared memory between the ranks).
# It exercises what a real two-node job needs: the hostfile, a remote launch agent (here
# `ip netns exec` instead of ssh), the OOB and BTL interface selection, and a run directory
# on a file system both hosts see. Needs root and iproute2. docs/DISTRIBUTED.md shows its output.
#
# NETNS_HOSTS=N makes N hosts (clla-aN, clla-bN, clla-cN, ...; 2 to 8), one rank each.
# NETNS_RATE=1gbit caps what each host sends (tc tbf on its eth0); with NETNS_DUPLEX=1 also what
# it receives (tbf on the bridge's end of its link), as a full-duplex NIC of that speed would:
# the sends of several hosts to one then share its one link.
#
# usage: [NETNS_HOSTS=2] [NETNS_RATE=1gbit [NETNS_DUPLEX=1]] launch/netns_two_hosts.sh CLLA CONFIG OUT_DIR [clla train options...]
set -eu
CLLA=$(readlink -f "$1"); CONFIG=$2; OUT=$3; shift 3
[ "$(id -u)" = 0 ] || { echo "netns_two_hosts: needs root (ip netns)" >&2; exit 2; }
# names and subnet unique per run, so that two runs (two test suites) never share them
ID=$(( $$ % 250 ))
NET=10.77.$ID
BR=clla-br$ID
NH=${NETNS_HOSTS:-2}
case "$NH" in [2-8]) ;; *) echo "netns_two_hosts: NETNS_HOSTS '$NH': use 2 to 8" >&2; exit 2 ;; esac
HOSTS=()
for l in a b c d e f g h; do [ ${#HOSTS[@]} -lt "$NH" ] && HOSTS+=("clla-$l$ID"); done
TMP=$(mktemp -d "${TMPDIR:-/tmp}/clla_netns.XXXXXX")

cleanup_quiet() { for h in "${HOSTS[@]}"; do ip netns del "$h" 2> /dev/null || true; done; ip link del "$BR" 2> /dev/null || true; }
cleanup() {
    cleanup_quiet
    rm -rf "$TMP"
}
trap cleanup EXIT
cleanup_quiet

# the bridge in this namespace is mpirun's side (10.77.0.1); each host gets a veth pair
ip link add "$BR" type bridge
ip addr add "$NET.1/24" dev "$BR"
ip link set "$BR" up
i=10
for h in "${HOSTS[@]}"; do
    i=$((i + 1))
    ip netns add "$h"
    ip link add "v$h" type veth peer name eth0 netns "$h"
    ip link set "v$h" master "$BR" up
    ip -n "$h" addr add "$NET.$i/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    # NETNS_RATE (e.g. 1gbit): each host sends at most that fast, as on a slower network
    if [ -n "${NETNS_RATE:-}" ]; then
        ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$NETNS_RATE" burst 256kb latency 100ms
        cap=" (sends at most $NETNS_RATE)"
        if [ "${NETNS_DUPLEX:-0}" = 1 ]; then
            tc qdisc add dev "v$h" root tbf rate "$NETNS_RATE" burst 256kb latency 100ms
            cap=" (sends and receives at most $NETNS_RATE)"
        fi
    fi
    echo "$h: $NET.$i${cap:-}"
done

# the launch agent mpirun calls instead of ssh: "agent HOST COMMAND..."
cat > "$TMP/nsrsh" <<'AGENT'
#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
AGENT
chmod +x "$TMP/nsrsh"
printf '%s slots=1\n' "${HOSTS[@]}" > "$TMP/hostfile"
echo "hostfile:"; cat "$TMP/hostfile"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
set -x
mpirun --hostfile "$TMP/hostfile" -np "$NH" --bind-to none \
    --mca plm_rsh_agent "$TMP/nsrsh" \
    --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
    sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname), $(ip -4 -o addr show eth0 | awk "{print \$4}")" >&2; exec "$0" "$@"' \
    "$CLLA" train --config "$CONFIG" --out "$OUT" "$@"
