#!/usr/bin/env bash
# bench/bench_codec.c runs every codec (cq fitted on the spot) and reports what it measured
# consistently: one JSON line per codec, bytes per token as the codec counts them, a lossless
# fp32, bf16 within its rounding, fewer bits giving larger errors; a bad spec is one line.
set -u
: "${BUILD:?set BUILD to the build tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_bench_codec
B=$BUILD/bench/bench_codec
"$B" --width 64 --tokens 512 --json > out.json 2> err.txt || fail "bench_codec exited $?" err.txt
[ "$(grep -c '"codec"' out.json)" -eq 13 ] && ok "thirteen codecs measured (kivi, qjl and kvquant on keys and values among them)" || fail "lines" out.json
rmse() { grep "\"codec\":\"$1\"" out.json | grep -o '"rel_rmse":[0-9.e-]*' | cut -d: -f2; }
bpt() { grep "\"codec\":\"$1\"" out.json | grep -o '"bytes_per_token":[0-9]*' | cut -d: -f2; }
[ "$(rmse fp32)" = "0.00000" ] && [ "$(bpt fp32)" = 256 ] && ok "fp32: exact, 256 bytes for 64 values" || fail "fp32" out.json
awk -v e="$(rmse bf16)" 'BEGIN { exit !(e > 0 && e < 0.004) }' && [ "$(bpt bf16)" = 128 ] && ok "bf16: error $(rmse bf16), 128 bytes" || fail "bf16" out.json
[ "$(bpt 'int_group:bits=4,group=32')" = 36 ] && [ "$(bpt 'cq:bits=8,c=4')" = 16 ] && ok "int4 36 bytes (32 codes + 2 bf16 scales), cq 2 bits 16 bytes" || fail "bytes" out.json
awk -v a="$(rmse 'int_group:bits=4,group=32')" -v b="$(rmse 'int_group:bits=2,group=32')" -v c="$(rmse 'cq:bits=8,c=2')" \
    -v d="$(rmse 'cq:bits=8,c=8')" 'BEGIN { exit !(a < b && c < d) }' && ok "fewer bits, larger errors (int_group 4 < 2, cq 4 < 1 bits)" || fail "errors" out.json
if "$B" --codecs "cq:bits=99" > x.out 2> x.err; then fail "a bad spec accepted"; else [ "$(wc -l < x.err)" -eq 1 ] && ok "bad spec: $(cat x.err)" || fail "message" x.err; fi
echo "test_bench_codec: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
