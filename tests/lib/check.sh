# Shared by the shell tests (sourced, not run): counters and one-line results, and, with a name,
# a fresh work directory that is removed at exit and made the current directory.
#   . "$(dirname "$0")/lib/check.sh" NAME   # WORK=/tmp/clla_NAME.XXXXXX (TMPDIR honoured)
#   ok NAME                  one passed check
#   fail NAME [LOG]          one failed check; LOG's lines are shown indented when given
#   check STATUS NAME        ok when STATUS is 0, else fail
#   write_tokens FILE COUNT SEED [MOD]   COUNT little-endian uint32 token ids < MOD (default 64)
#                                         from a fixed LCG, in one printf (no process per token)
#   field FILE KEY           the first number of "KEY": in a JSON file (empty when absent)
#   near A B TOL             status 0 when |A - B| <= TOL (both numbers, neither empty)
#   peak ARGS...             runs $CLLA ARGS (stderr to peak.err), prints its exit status and peak
#                            resident bytes (getrusage's ru_maxrss of the child, python3's resource)
#   peak_growth LIMIT SMALL_ARGS... -- LARGE_ARGS...
#                            runs both through peak; status 0 when both exit 0 and the large run's
#                            peak exceeds the small one's by at most LIMIT bytes; sets GREW (bytes)
#                            and RCS ("rc0 rc1") for the caller's message
# The caller prints its summary from PASS and FAIL and exits non-zero when FAIL > 0.
PASS=0
FAIL=0
ok()   { PASS=$((PASS + 1)); echo "ok   $1"; }
fail() { FAIL=$((FAIL + 1)); echo "FAIL $1"; if [ $# -gt 1 ] && [ -f "$2" ]; then sed 's/^/    /' "$2"; fi; }
check() { if [ "$1" -eq 0 ]; then ok "$2"; else fail "$2"; fi; }
field() { grep -o "\"$2\":[-0-9.e]*" "$1" | head -n 1 | cut -d: -f2; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }
write_tokens() {
    local x=$3 s="" i m=${4:-64}
    for ((i = 0; i < $2; i++)); do
        x=$(( (x * 1103515245 + 12345) % 2147483648 ))
        printf -v s '%s\\x%02x\\x00\\x00\\x00' "$s" $(( (x >> 16) % m ))
    done
    printf "$s" > "$1"
}
peak() {
    python3 - "$CLLA" "$@" <<'PYEOF'
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=open("peak.err", "w"))
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
PYEOF
}
peak_growth() {
    local limit=$1 small=() large=() rc0 b0 rc1 b1
    shift
    while [ "$1" != "--" ]; do small+=("$1"); shift; done
    shift
    large=("$@")
    read -r rc0 b0 < <(peak "${small[@]}")
    read -r rc1 b1 < <(peak "${large[@]}")
    GREW=$((b1 - b0))
    RCS="$rc0 $rc1"
    [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && [ "$GREW" -le "$limit" ]
}
if [ -n "${1:-}" ]; then
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_$1.XXXXXX") || exit 1
    trap 'rm -rf "$WORK"' EXIT
    cd "$WORK" || exit 1
fi
