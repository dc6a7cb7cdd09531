# Shared by the data-parallel benchmarks (sourced, not run; bench/bench_dist.sh,
# bench/bench_overlap.sh): argument checks, token shards of the English fixture in the current
# directory, a run whose failure ends the benchmark with its log's last lines, and the median of
# a metrics field over a run's steps. The caller sets BENCH (its name, for messages).
bench_fail() { echo "$BENCH: $*" >&2; exit 1; }
# whole_number NAME VALUE MIN: VALUE is a whole number >= MIN, or the benchmark stops saying so
whole_number() {
    case $2 in '' | *[!0-9]* | 0?*) bench_fail "$1 '$2' is not a whole number (digits, no leading zero)" ;; esac
    [ "${#2}" -le 9 ] || bench_fail "$1 $2 is too large: give at most 999999999"
    [ "$2" -ge "$3" ] || bench_fail "$1 $2 is below $3"
}
# dist_check_clla CLLA: an executable built with MPI
dist_check_clla() {
    [ -x "$1" ] && [ -f "$1" ] || bench_fail "'$1' is not an executable: build clla (bash scripts/build.sh build) or name it"
    ldd "$1" 2> /dev/null | grep -q libmpi || bench_fail "'$1' was built without MPI (libopenmpi-dev missing when it was configured)"
}
# dist_shards CLLA: a 512-token GPT-2-pattern tokenizer (t.tok) and its shards (shards/train)
dist_shards() {
    local src
    src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/fixtures/english.jsonl
    "$1" tokenizer train --vocab-size 512 --pattern gpt2 --out t.tok --overwrite "$src" > shards.log 2>&1 &&
        "$1" prep --tokenizer t.tok --out shards --chunk-tokens 4096 --val-fraction 0 --overwrite "$src" >> shards.log 2>&1 ||
        bench_fail "making the token shards failed: $(tail -n 2 shards.log | tr '\n' ' ')"
}
# run_logged NAME CMD...: CMD with its output in NAME.log; a failure stops the benchmark with the
# log's last lines (the work directory, and the log in it, goes at exit)
run_logged() {
    local name=$1
    shift
    "$@" > "$name.log" 2>&1 || bench_fail "$name failed (exit $?): $(grep -v '^ *$' "$name.log" | tail -n 3 | tr '\n' ' ')"
}
# median RUN FIELD: the median of FIELD over the steps after the first five (warm-up) of RUN/metrics.jsonl
median() {
    local v
    v=$(grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" 2> /dev/null | cut -d: -f2 | tail -n +6 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    [ -n "$v" ] || bench_fail "$1/metrics.jsonl has no $2 after its first five (warm-up) steps"
    echo "$v"
}
