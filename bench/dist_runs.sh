# Shared by the data-parallel benchmarks (sourced, not run; bench/bench_dist.sh,
# bench/bench_overlap.sh): token shards of the English fixture in the current directory, and the
# median of a metrics field over a run's steps.
# dist_shards CLLA: a 512-token GPT-2-pattern tokenizer (t.tok) and its shards (shards/train)
dist_shards() {
    local src
    src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/fixtures/english.jsonl
    "$1" tokenizer train --vocab-size 512 --pattern gpt2 --out t.tok --overwrite "$src" > /dev/null 2>&1
    "$1" prep --tokenizer t.tok --out shards --chunk-tokens 4096 --val-fraction 0 --overwrite "$src" > /dev/null 2>&1
}
# median RUN FIELD: the median of FIELD over the steps after the first five (warm-up) of RUN/metrics.jsonl
median() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2 | tail -n +6 | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
