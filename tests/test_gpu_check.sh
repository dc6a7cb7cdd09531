#!/usr/bin/env bash
# scripts/gpu_check.sh without a GPU (docs/GPU.md, "scripts/gpu_check.sh"):
#  - --dry-run: every step skipped with the reason, exit 0, summary.jsonl one JSON object a step;
#  - fake binaries (shell scripts standing for the GPU tests): a failing op test is rerun with
#    CLLA_CUDA_SYNC=1 and the op that faulted is named in the summary; a skipping test keeps its
#    reason; sanitizers run through COMPUTE_SANITIZER; any failure makes the exit status 1;
#  - the real CUDA build's binaries when this machine has them: every step skipped, with the
#    binaries' "no CUDA device" reason;
#  - --bundle: the binaries and the libraries they load, but glibc and CUDA; a non-empty bundle
#    directory is refused; an unknown argument is refused;
#  - scripts/gpu_profile_attention.sh: skips, saying why, without ncu or a device; its SASS counter
#    (scripts/sass_op_counts.py) on a small cuobjdump-style listing.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
. "$(dirname "$0")/lib/check.sh" test_gpu_check
GC="$SRC/scripts/gpu_check.sh"
PY=/usr/bin/python3
summary_ok() {   # summary_ok FILE: every line a JSON object with step, status, reason, seconds
    "$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows and all(set(r) == {"step", "status", "reason", "seconds"} for r in rows)
assert all(r["status"] in ("pass", "fail", "skipped") for r in rows)
print(len(rows))' "$1"
}

# ---- dry run
if bash "$GC" --dry-run --out dry > dry.log 2>&1 && n=$(summary_ok dry/summary.jsonl) && [ "$n" -eq 10 ] &&
   [ "$(grep -c '"status":"skipped","reason":"dry run' dry/summary.jsonl)" -eq 10 ]; then ok "--dry-run: $n steps, each skipped with the reason"
else fail "dry run: $(cat dry.log)"; fi

# ---- fake binaries
mkdir -p fake/bin
cat > fake/bin/test_gpu_ops <<'EOS'
#!/bin/sh
case "$1" in
--probe) echo "test_gpu_ops on FakeGPU"; exit 0 ;;
--production) echo "12 passed, 0 failed"; exit 0 ;;
esac
if [ "${CLLA_CUDA_SYNC:-0}" = 1 ]; then
    echo "clla: error: CUDA error in the op launched here (CLLA_CUDA_SYNC=1) (kernels/cuda_attention.cu:210, cuda_attention_forward): an illegal memory access was encountered"
    exit 1
fi
echo "FAIL attention_forward out B=1 T=1 (the error surfaced later)"; echo "90 passed, 1 failed"; exit 1
EOS
printf '#!/bin/sh\necho "40 passed, 0 failed"\n' > fake/bin/test_gpu_train
printf '#!/bin/sh\necho "skipped: no CUDA device (fake: decode needs a second stream)"\nexit 77\n' > fake/bin/test_gpu_decode
printf '#!/bin/sh\necho "{\\"bench\\":\\"bench_gpu\\",\\"tokens_per_s\\":1000}"\n' > fake/bin/bench_gpu
# the fake takes what scripts/sanitizer_run.sh passes: --tool T --print-limit 0 --error-exitcode 0 PROGRAM ARGS
printf '#!/bin/sh\necho "sanitizer $2" >> "%s/sanitizer.calls"\nshift 6\n"$@" > /dev/null\necho "========= ERROR SUMMARY: 0 errors"\n' "$PWD" > fake/sanitizer
chmod +x fake/bin/* fake/sanitizer
COMPUTE_SANITIZER=$PWD/fake/sanitizer bash "$GC" --bin fake --out run > run.log 2>&1
rc=$?
status() { "$PY" -c 'import json,sys; print(next((r["status"] + " " + r["reason"]) for r in map(json.loads, open(sys.argv[1])) if r["step"] == sys.argv[2]))' run/summary.jsonl "$1" 2>/dev/null; }
[ $rc -eq 1 ] && summary_ok run/summary.jsonl > /dev/null && ok "a failing step: exit 1, summary.jsonl well formed" || fail "fake run: rc $rc $(cat run.log)"
s=$(status test_gpu_ops); [[ $s == fail* && $s == *"FAIL attention_forward"* ]] && ok "the failing op test: $s" || fail "test_gpu_ops: $s"
s=$(status test_gpu_ops.sync); [[ $s == fail* && $s == *"cuda_attention_forward"* ]] && ok "rerun with CLLA_CUDA_SYNC=1 names the op: $s" || fail "sync rerun: $s"
s=$(status production_shapes); [[ $s == pass* ]] && ok "production shapes: $s" || fail "production: $s"
s=$(status test_gpu_decode); [[ $s == "skipped skipped: no CUDA device (fake"* ]] && ok "a skipping test keeps its reason: $s" || fail "decode: $s"
s=$(status sanitizer.initcheck); [[ $s == pass* ]] && grep -q "sanitizer memcheck" sanitizer.calls && grep -q "sanitizer initcheck" sanitizer.calls &&
    ok "memcheck and initcheck through COMPUTE_SANITIZER" || fail "sanitizer: $s $(cat sanitizer.calls 2>&1)"
s=$(status bench_gpu); [[ $s == pass*tokens_per_s* ]] && [ -s run/bench_gpu.log ] && ok "bench_gpu --json logged: $s" || fail "bench_gpu: $s"
s=$(status bench_gpu_experts); [[ $s == pass*tokens_per_s* ]] && [ -s run/bench_gpu_experts.log ] &&
    ok "bench_gpu --only experts logged: $s" || fail "bench_gpu_experts: $s"
s=$(status profile_attention); [[ $s == "skipped gpu_profile_attention: skipped: "* ]] && ok "the profile step, without ncu or a device: $s" ||
    fail "profile_attention: $s"

# ---- --only; the sanitizer's errors grouped, a known group (scripts/sanitizer_run.sh) apart
cat > fake/sanitizer_errors <<'EOS'
#!/bin/sh
shift 6
"$@" > /dev/null
for i in 1 2 3; do
    printf '========= Uninitialized __global__ memory read of size 4 bytes\n=========     at add_f32_to_bf16_kernel(__nv_bfloat16 *, const float *, unsigned long)+0x180\n'
    printf '=========     by thread (%s,0,0) in block (108,0,0)\n=========         Host Frame: cuda_add_f32_to_bf16(__nv_bfloat16*, float const*, unsigned long) [0x16f4d] in test_gpu_ops\n' $i
    printf '=========         Host Frame: cuda_matmul_backward [0x224ca] in test_gpu_ops\n=========\n'
done
echo "========= ERROR SUMMARY: 3 errors"
EOS
chmod +x fake/sanitizer_errors
COMPUTE_SANITIZER=$PWD/fake/sanitizer_errors bash "$GC" --bin fake --out only --only test_gpu_train,sanitizer.memcheck,sanitizer.initcheck > only.log 2>&1
rc=$?
so() { "$PY" -c 'import json,sys; print(next((r["status"] + " " + r["reason"]) for r in map(json.loads, open(sys.argv[1])) if r["step"] == sys.argv[2]))' only/summary.jsonl "$1" 2>/dev/null; }
s1=$(so test_gpu_ops) s2=$(so test_gpu_train) s3=$(so bench_gpu)
[[ $s1 == "skipped not in --only" && $s2 == pass* && $s3 == "skipped not in --only" ]] &&
    ok "--only test_gpu_train,...: the others skipped ($s1)" || fail "--only: '$s1' '$s2' '$s3' $(cat only.log)"
s=$(so sanitizer.initcheck)
[[ $s == "pass initcheck: 3 errors, 0 outside the known groups"* ]] && grep -q "^known  *3  Uninitialized" only/sanitizer.initcheck.log &&
    ok "initcheck: the known group counted, not failed: $s" || fail "known group: $s $(cat only/sanitizer.initcheck.log)"
s=$(so sanitizer.memcheck)
[ $rc -eq 1 ] && [[ $s == "fail exit 3: memcheck: 3 errors, 3 outside the known groups"* ]] &&
    ok "memcheck: the same errors are no known group there: $s" || fail "memcheck group: rc $rc $s"
# errors counted in the summary but not printed belong to no known group
printf '#!/bin/sh\nshift 6\nprintf "========= Uninitialized __global__ memory read of size 4 bytes\\n=========     at add_f32_to_bf16_kernel(float)+0x10\\n=========         Host Frame: cuda_matmul_backward [0x1]\\n=========\\n========= ERROR SUMMARY: 5 errors\\n"\n' > fake/sanitizer_short
chmod +x fake/sanitizer_short
out=$(bash "$SRC/scripts/sanitizer_run.sh" fake/sanitizer_short initcheck true); rc=$?
[ $rc -eq 3 ] && [[ $(echo "$out" | tail -n 1) == "initcheck: 5 errors, 4 outside the known groups"* ]] &&
    ok "errors counted and not printed are not known: $(echo "$out" | tail -n 1)" || fail "unprinted errors: rc $rc $out"
for bad in "--only nosuch" "--only" "--only test_gpu_ops,,bench_gpu"; do
    bash "$GC" --dry-run $bad > bad.log 2>&1; rc=$?
    [ $rc -eq 2 ] && grep -q "^gpu_check: --only" bad.log && ok "$bad refused: $(cat bad.log)" || fail "$bad: rc $rc $(cat bad.log)"
done

# ---- --budget: a step that outlives what is left is stopped and fails; later steps are skipped
mkdir -p slow/bin
cp fake/bin/* slow/bin/
printf '#!/bin/sh\nsleep 60\n' > slow/bin/test_gpu_train
chmod +x slow/bin/test_gpu_train
t0=$(date +%s)
COMPUTE_SANITIZER=$PWD/fake/sanitizer bash "$GC" --bin slow --out budget --budget 22 > budget.log 2>&1
rc=$? dt=$(( $(date +%s) - t0 ))
st() { "$PY" -c 'import json,sys; print(next((r["status"] + " " + r["reason"]) for r in map(json.loads, open(sys.argv[1])) if r["step"] == sys.argv[2]))' budget/summary.jsonl "$1" 2>/dev/null; }
s1=$(st test_gpu_train) s2=$(st bench_gpu)
if [ $rc -eq 1 ] && [ $dt -lt 50 ] && [[ $s1 == "fail timed out after"* ]] && [[ $s2 == "skipped the --budget of 22 s is spent" ]]; then
    ok "--budget 22: the slow step stopped ($s1), the last skipped ($s2), ${dt} s in all"
else fail "--budget: rc $rc, ${dt} s, train '$s1', bench_gpu '$s2': $(cat budget.log)"; fi
for bad in "--budget 0" "--budget 1e3" "--bench-steps -2" "--budget"; do
    bash "$GC" --dry-run $bad > bad.log 2>&1; rc=$?
    [ $rc -eq 2 ] && grep -q "needs a positive integer" bad.log && ok "$bad refused: $(cat bad.log)" || fail "$bad: rc $rc $(cat bad.log)"
done
for bad in "--moe nosuch" "--moe clla,nosuch" "--moe ," "--moe" "--moe clla,,mha" "--moe ../clla"; do
    bash "$GC" --dry-run $bad > bad.log 2>&1; rc=$?
    [ $rc -eq 2 ] && grep -q "^gpu_check: --moe" bad.log && ok "$bad refused: $(cat bad.log)" || fail "$bad: rc $rc $(cat bad.log)"
done
bash "$GC" --dry-run --moe mha,clla --out moe_ok > moe_ok.log 2>&1 && ok "--moe mha,clla taken" || fail "--moe mha,clla: $(cat moe_ok.log)"

# ---- the real CUDA build, where this machine has one (no GPU: every step skipped)
CB=${CLLA_CUDA_BUILD_DIR:-$SRC/build-cuda}
if [ -x "$CB/tests/gpu/test_gpu_ops" ]; then
    bash "$GC" --bin "$CB" --out real > real.log 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c '"status":"skipped","reason":"skipped: no CUDA device' real/summary.jsonl)" -eq 10 ]; then
        ok "the CUDA build without a GPU: 10 steps skipped ($(grep -m1 -o 'no CUDA device[^"]*' real/summary.jsonl))"
    elif "$CB/tests/gpu/test_gpu_ops" --probe > /dev/null 2>&1; then echo "     (this machine has a GPU: the real run is scripts/gpu_check.sh itself)"
    else fail "real binaries without a GPU: rc $rc $(cat real.log)"; fi
    # the GPU tests check their cases' configs before they look for a device: a config rule added
    # since (run here, in CI) fails them instead of waiting for a GPU machine
    "$CB/tests/gpu/test_gpu_ops" --probe > /dev/null 2>&1 ||
    for b in test_gpu_train test_gpu_decode; do
        "$CB/tests/gpu/$b" > "$b.log" 2>&1; rc=$?
        [ $rc -eq 77 ] && ok "$b: its configs valid, then skipped without a GPU" || fail "$b without a GPU: rc $rc $(head -n 3 "$b.log")"
    done
else
    echo "     (no CUDA build at $CB: the real-binaries check is skipped)"
fi

# ---- --bundle from a build tree (real ELF binaries standing for the GPU ones), refusals
mkdir -p tree/tests/gpu tree/bench
for b in test_gpu_ops test_gpu_train test_gpu_decode; do cp "$CLLA" tree/tests/gpu/$b; done
cp "$CLLA" tree/bench/bench_gpu
if bash "$GC" --bundle bdl --build tree > bundle.log 2>&1 && [ "$(ls bdl/bin | wc -l)" -eq 4 ] &&
   ls bdl/lib | grep -q '^libopenblas' && ! ls bdl/lib | grep -Eq '^(libc|libm|libcudart)\.so'; then
    ok "--bundle: $(tail -n 1 bundle.log)"
else fail "bundle: $(cat bundle.log; ls bdl/bin bdl/lib 2>&1)"; fi
if bash "$GC" --bundle bdl --build tree > b2.log 2>&1; then fail "a non-empty bundle directory overwritten"
else grep -q "not empty" b2.log && ok "a non-empty bundle directory refused: $(cat b2.log)" || fail "bundle refusal: $(cat b2.log)"; fi
bash "$GC" --frobnicate > x.log 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "unknown argument" x.log && ok "unknown argument: $(cat x.log)" || fail "unknown argument: rc $rc $(cat x.log)"

# ---- scripts/gpu_profile_attention.sh and scripts/sass_op_counts.py
GP="$SRC/scripts/gpu_profile_attention.sh"
mkdir -p prof/bin && cp "$CLLA" prof/bin/bench_gpu
out=$(PATH=/usr/bin:/bin bash "$GP" --bin prof --out prof/out 2>&1); rc=$?
if [ $rc -eq 77 ] && echo "$out" | grep -q "skipped:" && [ ! -e prof/out ]; then ok "profile without ncu or a device: $out"
else fail "profile skip: rc $rc $out"; fi
bash "$GP" --bin nowhere > p2.log 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "no bench_gpu" p2.log && ok "profile with no bench_gpu: $(cat p2.log)" || fail "profile without binaries: rc $rc $(cat p2.log)"
cat > listing.sass <<'EOS'
Fatbin elf code:
================
arch = sm_90

	code for sm_90
		Function : _Z27attention_tc_forward_kernelILi8ELi8EEvP13__nv_bfloat16PfPKS0_S4_S4_iiiiif
	.headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;   /* 0x0000000c0804723c */
        /*0020*/              @!P0 HMMA.16816.F32.BF16 R4, R8, R14, R4 ;   /* 0x0000000e0804723c */
        /*0030*/                   LDSM.16.M88.4 R8, [R2] ;                /* 0x000000000208783b */
		Function : _Z9other_kernelv
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
EOS
out=$("$PY" "$SRC/scripts/sass_op_counts.py" listing.sass 2>&1)
[ "$out" = "sm_90 forward<8,8> total 4 HMMA:2 LDC:1 LDSM:1" ] && ok "sass_op_counts: $out" || fail "sass_op_counts: '$out'"
"$PY" "$SRC/scripts/sass_op_counts.py" listing.sass --match nothing_here > s2.log 2>&1 && fail "sass_op_counts matched nothing and passed" ||
    { grep -q "no function matching" s2.log && ok "sass_op_counts with no matching kernel: $(cat s2.log)" || fail "sass_op_counts refusal: $(cat s2.log)"; }
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
