# Shared by the libFuzzer tests (sourced, not run). fuzz_begin NAME: checks that $CC (clang by
# default, FUZZ_CC overrides) exists and links -fsanitize=fuzzer, else exits 77 with the reason;
# makes a work directory $W (removed on exit); defines the sanitizer FLAGS array, the counters
# and check STATUS NAME.
fuzz_begin() {
    SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
    BUILD=${BUILD:-/tmp}
    CC=${FUZZ_CC:-clang}
    command -v "$CC" >/dev/null || { echo "skip: $CC not installed (run scripts/setup.sh)"; exit 77; }
    W=$(mktemp -d "$BUILD/$1.XXXXXX")
    trap 'rm -rf "$W"' EXIT
    echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$W/probe.c"
    "$CC" -fsanitize=fuzzer "$W/probe.c" -o "$W/probe" 2> "$W/probe.err" ||
      { echo "skip: $CC has no libFuzzer runtime (install libclang-rt-14-dev): $(head -c 200 "$W/probe.err")"; exit 77; }
    passed=0 failed=0
    # -Wno-psabi: built for plain x86-64 (no AVX), common/vec.h's 32-byte vectors pass through its
    # static inline helpers by another ABI than an AVX build's, which clang notes at every call;
    # nothing crosses a library boundary by value, so the note says nothing here
    FLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
           -fno-omit-frame-pointer -Wno-psabi -I"$SRC")
}

check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi; }
