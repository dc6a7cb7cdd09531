#!/usr/bin/env bash
# The GPU benchmark drivers, without a GPU (docs/GPU.md):
#  - bench/bench_gpu_compare.py with fake bench_gpu / bench_torch_gpu commands (canned JSON
#    lines): the ratio clla / PyTorch, the targets, PyTorch run at the batch, length and peak
#    bench_gpu used, one line per MoE config; a skipped PyTorch leaves the targets "not measured";
#  - on this machine: the real bench_gpu prints why it skips and exits 0, and so does the driver;
#  - bench/bench_torch_gpu.py --smoke --json: one JSON result (the script itself runs);
#  - bench_train at tiny sizes: the attention share, the activated parameters of a MoE model
#    (counted by hand below); bench_torch_cpu.py runs the twin in fp32 and refuses MoE;
#  - bench_decode at a tiny context (--json): the machine's rates first, every point against them;
#  - bench/ab.sh at tiny shapes, and its refusals;
#  - bad arguments of bench_decode, bench_codec, bench_moe, bench_dist.sh and bench_overlap.sh;
#  - scripts/build.sh --help.
# Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${BUILD:-$(dirname "$CLLA")}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_test_bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PASS=0
FAIL=0
ok()   { PASS=$((PASS + 1)); echo "ok   $1"; }
fail() { FAIL=$((FAIL + 1)); echo "FAIL $1"; }
check() { if [ "$1" -eq 0 ]; then ok "$2"; else fail "$2"; fi; }   # check STATUS NAME
cd "$SRC" || exit 1

cat > "$WORK/fake_bench_gpu" <<'EOF2'
#!/bin/sh
echo '{"bench":"bench_gpu","device":"FakeGPU (sm_90, 80.0 GiB, 79.0 GiB free) | bf16 peak 1000.0 TFLOP/s (table)"}'
case "$*" in
*"--only dense"*) echo '{"bench":"bench_gpu","model":"dense","config":"bench/dense_1b.json","params":1.06e9,"layers":18,"B":2,"T":2048,"steps":10,"s_per_step":1,"tokens_per_s":1000,"flops_per_token":1e9,"model_tflops":450,"fraction_of_peak":0.45,"last_loss":10.4}' ;;
*"--only moe"*"num_hidden_layers=6"*)
                echo '{"bench":"bench_gpu","model":"moe","config":"x","params":2.5e9,"layers":6,"B":1,"T":4096,"steps":10,"s_per_step":1,"tokens_per_s":4096,"flops_per_token":1e9,"model_tflops":300,"fraction_of_peak":0.3,"last_loss":10.9}' ;;
*"--only moe"*) echo '{"bench":"bench_gpu","note":"moe: fits"}'
                echo '{"bench":"bench_gpu","model":"moe","config":"x","params":5e9,"layers":12,"B":1,"T":4096,"steps":10,"s_per_step":2,"tokens_per_s":2048,"flops_per_token":1e9,"model_tflops":300,"fraction_of_peak":0.3,"last_loss":10.9}' ;;
esac
EOF2
cat > "$WORK/fake_torch" <<EOF2
#!/bin/sh
if [ -n "\${FAKE_TORCH_SKIP:-}" ]; then echo '{"bench": "bench_torch_gpu", "skipped": "no CUDA device (fake)"}'; exit 0; fi
case "\$*" in
*--layers\ 12*) if [ -n "\${FAKE_TORCH_OOM:-}" ]; then
                echo '{"bench": "bench_torch_gpu", "skipped": "out of GPU memory at 12 layers, B=1 T=4096"}'; exit 0; fi
            echo "\$*" >> "$WORK/torch_moe_args"
            echo '{"bench": "bench_torch_gpu", "model": "moe", "torch": "2.9", "device": "FakeGPU", "layers": 12, "B": 1, "T": 4096, "tokens_per_s": 1024.0, "model_tflops": 150, "fused_attention": true, "compiled": false}' ;;
*--layers*) echo "\$*" >> "$WORK/torch_moe_args"
            echo '{"bench": "bench_torch_gpu", "model": "moe", "torch": "2.9", "device": "FakeGPU", "layers": 12, "B": 1, "T": 4096, "tokens_per_s": 1024.0, "model_tflops": 150, "fused_attention": true, "compiled": false}' ;;
*) echo "\$*" > "$WORK/torch_args"
   echo '{"bench": "bench_torch_gpu", "model": "dense", "torch": "2.9", "device": "FakeGPU", "B": 2, "T": 2048, "tokens_per_s": 800.0, "model_tflops": 360, "fused_attention": true, "compiled": false}' ;;
esac
EOF2
chmod +x "$WORK/fake_bench_gpu" "$WORK/fake_torch"

out=$(BENCH_GPU="$WORK/fake_bench_gpu" TORCH_BENCH="$WORK/fake_torch" python3 bench/bench_gpu_compare.py --moe mha,clla 2>&1)
rc=$?
echo "$out" | sed 's/^/     | /'
[ $rc -eq 0 ] && echo "$out" | grep -q 'clla / PyTorch = 1.250' && ok "ratio clla / PyTorch from one run (1000 / 800 = 1.250)" ||
    fail "ratio: exit $rc"
echo "$out" | grep -q 'targets: clla >= PyTorch: met | dense >= 45% of bf16 peak: met' && ok "both targets judged (45% of peak, 1.25x)" ||
    fail "targets line missing or wrong"
args=$(cat "$WORK/torch_args" 2> /dev/null)
case "$args" in
*"--batch 2"*"--seq 2048"*"--peak-tflops 1000"*) ok "PyTorch ran at bench_gpu's batch, length and peak: $args" ;;
*) fail "PyTorch arguments: '$args'" ;;
esac
[ "$(echo "$out" | grep -c '^moe ')" = 2 ] &&
    echo "$out" | grep -q 'configs/paper/clla.json (12 layers, T=4096): 2048 tok/s (30.0% of bf16 peak) | PyTorch 1024 tok/s | clla / PyTorch = 2.000' &&
    ok "one line per paper MoE config, beside PyTorch on the same config" || fail "MoE lines"
margs=$(tail -n 1 "$WORK/torch_moe_args" 2> /dev/null)
case "$margs" in
*"--config configs/paper/clla.json"*"--batch 1 --seq 4096"*"--layers 12"*) ok "PyTorch MoE at bench_gpu's layers, batch and length: $margs" ;;
*) fail "PyTorch MoE arguments: '$margs'" ;;
esac
out=$(FAKE_TORCH_OOM=1 BENCH_GPU="$WORK/fake_bench_gpu" TORCH_BENCH="$WORK/fake_torch" python3 bench/bench_gpu_compare.py --moe clla 2>&1)
echo "$out" | grep -q 'configs/paper/clla.json (6 layers, T=4096): 4096 tok/s (30.0% of bf16 peak) | PyTorch 1024 tok/s | clla / PyTorch = 4.000' &&
    ok "PyTorch out of memory at bench_gpu's 12 layers: both again at 6" || fail "MoE out-of-memory fallback: $out"
out=$(FAKE_TORCH_SKIP=1 BENCH_GPU="$WORK/fake_bench_gpu" TORCH_BENCH="$WORK/fake_torch" python3 bench/bench_gpu_compare.py --moe '' --json 2>&1)
echo "$out" | python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]' 2> /dev/null &&
    echo "$out" | grep -q '"torch_skipped": "no CUDA device (fake)"' && echo "$out" | grep -q '"clla_at_least_torch": null' &&
    ok "--json, PyTorch skipped: every line JSON, the comparison target not measured" || fail "skipped PyTorch: $out"
out=$(BENCH_GPU="$WORK/fake_bench_gpu" TORCH_BENCH="$WORK/fake_torch" python3 bench/bench_gpu_compare.py --moe nosuch 2>&1)
[ $? -ne 0 ] && echo "$out" | tail -n 1 | grep -q 'configs/paper/nosuch.json does not exist' && ok "unknown MoE config: one line, non-zero exit" ||
    fail "unknown MoE config: $out"

# scripts/count_omp_regions.sh: the command's own output and exit status, then its count
out=$(OMP_NUM_THREADS=2 bash scripts/count_omp_regions.sh "$BUILD/tests/test_moe" 2>&1)
[ $? -eq 0 ] && echo "$out" | grep -q 'passed, 0 failed' && echo "$out" | tail -n 1 | grep -Eq '^omp regions: [1-9][0-9]* opened, [0-9]+ on one thread$' &&
    ok "count_omp_regions over test_moe: $(echo "$out" | tail -n 1)" || fail "count_omp_regions: $out"
bash scripts/count_omp_regions.sh > /dev/null 2>&1; [ $? -eq 2 ] && ok "count_omp_regions without a command: usage, exit 2" || fail "count_omp_regions without a command"

# the real commands on this machine (no GPU): skip lines, exit 0
out=$("$BUILD/bench/bench_gpu" --json 2>&1)
[ $? -eq 0 ] && echo "$out" | grep -q '"skipped":"no CUDA device' && ok "bench_gpu without a GPU: $out" || fail "bench_gpu: $out"
out=$("$BUILD/bench/bench_gpu" --only experts --json 2>&1)
[ $? -eq 0 ] && echo "$out" | grep -q '"skipped":"no CUDA device' && ok "bench_gpu --only experts without a GPU: $out" || fail "bench_gpu --only experts: $out"
out=$("$BUILD/bench/bench_gpu" --only expert 2>&1)
[ $? -ne 0 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q 'use dense, moe or experts' && ok "bench_gpu --only expert refused: $out" ||
    fail "bench_gpu --only expert: $out"
out=$(BENCH_GPU="$(printf '%q' "$BUILD/bench/bench_gpu")" python3 bench/bench_gpu_compare.py 2>&1)
[ $? -eq 0 ] && echo "$out" | grep -q '^skipped: no CUDA device' && ok "bench_gpu_compare without a GPU: $out" || fail "driver: $out"
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
    out=$(/usr/bin/python3 bench/bench_torch_gpu.py --smoke --json 2>&1)
    echo "$out" | head -n 1 | /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); assert r["tokens_per_s"] > 0 and r["B"] == 2' 2> /dev/null &&
        ok "bench_torch_gpu.py --smoke --json: $(echo "$out" | head -c 120)..." || fail "bench_torch_gpu.py --smoke: $out"
    out=$(/usr/bin/python3 bench/bench_torch_gpu.py --smoke --json --config configs/paper/clla_quant.json 2>&1)
    echo "$out" | head -n 1 | grep -q '"model": "moe"' && ok "bench_torch_gpu.py --smoke on a paper MoE config" ||
        fail "bench_torch_gpu.py --smoke --config configs/paper/clla_quant.json: $out"
    # the PyTorch model is the same model: clla info's parameter counts for every paper config's
    # structure (at the smoke sizes), total and activated (+ the head: bench_gpu's FLOP convention)
    out=$(CLLA_BIN="$BUILD/clla" /usr/bin/python3 - <<'EOP' 2>&1
import glob, importlib.util, json, os, subprocess, sys, tempfile
import torch
spec = importlib.util.spec_from_file_location("btg", "bench/bench_torch_gpu.py")
btg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(btg)
bad, n = [], 0
for path in ["bench/dense_1b.json"] + sorted(glob.glob("configs/paper/*.json")):
    cfg = btg.smoke_config(json.load(open(path)))
    cfg.pop("train", None)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    info = json.loads(subprocess.run([os.environ["CLLA_BIN"], "info", "--config", f.name, "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    os.unlink(f.name)
    model, _, activated, _ = btg.build(torch, cfg)
    total = sum(p.numel() for p in model.parameters())
    head = cfg["vocab_size"] * cfg["hidden_size"]
    if total != info["params_total"] or activated != info["params_activated"] + head:
        bad.append(f"{path}: torch {total}/{activated}, clla {info['params_total']}/{info['params_activated'] + head}")
    n += 1
print("; ".join(bad) if bad else f"{n} configs")
sys.exit(1 if bad else 0)
EOP
)
    [ $? -eq 0 ] && ok "bench_torch_gpu.py builds clla's parameter counts: $out" || fail "PyTorch model against clla info: $out"
    for bad in "--layers -3" "--steps 0" "--peak-tflops nan" "--config /nonexistent/x.json"; do
        out=$(/usr/bin/python3 bench/bench_torch_gpu.py --smoke $bad 2>&1); rc=$?
        [ $rc -ne 0 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q '^bench_torch_gpu: ' &&
            ok "bench_torch_gpu.py $bad refused: $out" || fail "bench_torch_gpu.py $bad: rc $rc $out"
    done
else
    echo "     (bench_torch_gpu.py smoke run skipped: /usr/bin/python3 has no torch)"
fi

# the CPU training benchmark and its PyTorch baseline (bench/bench_train_vs_torch.sh), at tiny sizes
SMALL=(--set hidden_size=64 --set num_hidden_layers=2 --set num_attention_heads=2 --set intermediate_size=128
       --set moe_intermediate_size=32 --set vocab_size=512 --set train.seq_len=64 --set train.micro_batch=2)
out=$("$BUILD/bench/bench_train" --config bench/train_d512_moe.json "${SMALL[@]}" --steps 1 --json 2>&1)
js=$(echo "$out" | grep '^{' | tail -n 1)
echo "$js" | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
assert 0 < r["attention_share"] < 1 and r["tokens_per_s"] > 0
assert 0 < r["matmul_share"] < 1 and r["attention_share"] + r["matmul_share"] < 1 and r["matmul_flops_per_s"] > 0
# per layer: attention 4 x 64 x 64, two norms of 64, router 8 x 64, the shared experts 3 x 64 x 64,
# 2 of the 8 routed experts of 3 x 64 x 32; then the final norm
layer = 4 * 64 * 64 + 2 * 64 + 8 * 64 + 3 * 64 * 64 + 2 * 3 * 64 * 32
assert r["activated_params"] == 2 * layer + 64, r["activated_params"]
print(r["activated_params"])' > "$WORK/act.out" 2>&1 && ok "bench_train on a MoE config: attention and matmul shares, activated parameters $(cat "$WORK/act.out")" ||
    fail "bench_train MoE: $out $(cat "$WORK/act.out")"
grep -q "activated per token" <<< "$out" && ! grep -q "uses every expert" <<< "$out" && ok "bench_train counts activated parameters" ||
    fail "bench_train parameter line: $(grep params <<< "$out")"
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
    out=$(/usr/bin/python3 bench/bench_torch_cpu.py --config bench/train_d512_clla_quant.json "${SMALL[@]}" --steps 1 --json 2>&1)
    echo "$out" | grep '^{' | /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); assert r["tokens_per_s"] > 0 and r["T"] == 64' 2> /dev/null &&
        ok "bench_torch_cpu.py runs the twin (CLLA-quant) in fp32" || fail "bench_torch_cpu.py: $out"
    if /usr/bin/python3 bench/bench_torch_cpu.py --config bench/train_d512_moe.json "${SMALL[@]}" > "$WORK/moe.out" 2>&1; then fail "bench_torch_cpu.py accepted a MoE config"
    else grep -q "MoE" "$WORK/moe.out" && ok "bench_torch_cpu.py refuses MoE: $(cat "$WORK/moe.out")" || fail "moe refusal: $(cat "$WORK/moe.out")"; fi
else
    echo "     (bench_torch_cpu.py runs skipped: /usr/bin/python3 has no torch)"
fi

# bench_decode at a tiny context: the machine object comes first, with the best rates of the
# run; every point's roofline is max(bytes / copy, FLOPs / sgemm) of those rates, so x_roofline
# is ms_per_step over it; a context under the 1024-token prefill runs (it once exceeded the
# model's positions)
if OMP_NUM_THREADS=2 "$BUILD/bench/bench_decode" --presets gqa,clla --contexts 32 --batches 1,2 --steps 1 --json \
        > "$WORK/dec.json" 2> "$WORK/dec.err"; then
    if /usr/bin/python3 - "$WORK/dec.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert "machine" in rows[0] and rows[0]["machine"]["copy_GBps"] > 0 and rows[0]["machine"]["sgemm_GFLOPs"] > 0, rows[0]
pre = [r for r in rows[1:] if "prefill_tokens" in r]
pts = [r for r in rows[1:] if "context" in r]
assert [r["preset"] for r in pre] == ["gqa", "clla"], pre
assert len(pts) == 4 and all(r["context"] == 32 for r in pts), pts
for r in pts:
    assert abs(r["x_roofline"] - r["ms_per_step"] / r["roofline_ms"]) <= 2e-3 * r["x_roofline"], r
    assert r["roofline_ms"] >= r["cache_bytes_read"] / (rows[0]["machine"]["copy_GBps"] * 1e9) * 1e3 * 0.999, r
    # the roofline from its printed parts: max(bytes moved / copy bandwidth, FLOPs / sgemm rate)
    m = rows[0]["machine"]
    want = max(r["bytes_moved"] / (m["copy_GBps"] * 1e9), r["flops"] / (m["sgemm_GFLOPs"] * 1e9)) * 1e3
    assert abs(r["roofline_ms"] - want) <= 2e-3 * want + 1e-3, (r, want)
    assert r["bytes_moved"] > r["cache_bytes_read"], r   # the weights too
# a step gathers one embedding row per sequence (d512: 2048 bytes), not the whole table: the
# weights' bytes of batch 2 are batch 1's plus one row (the table of 16.8 MB was counted whole)
for p in ("gqa", "clla"):
    w = {r["batch"]: r["bytes_moved"] - r["cache_bytes_read"] for r in pts if r["preset"] == p}
    assert abs(w[2] - w[1] - 2048) < 1, (p, w)
PY
    then ok "bench_decode --json at context 32: the machine first, 2 prefills, 4 points against its rates"
    else fail "bench_decode --json: $(head -c 600 "$WORK/dec.json")"; fi
else fail "bench_decode at context 32: $(tail -n 2 "$WORK/dec.err")"; fi

# bench/ab.sh: builds an op of a commit beside this tree's and alternates them (at tiny shapes);
# refuses what is not a commit and an op it does not know
if git -C "$SRC" rev-parse --verify --quiet HEAD > /dev/null 2>&1; then
    out=$(AB_TINY=1 OMP_NUM_THREADS=1 bash "$SRC/bench/ab.sh" attention HEAD 1 2>&1)
    [ "$(grep -c 'forward old .* backward old' <<< "$out")" = 2 ] && ok "ab.sh attention HEAD (tiny): two shapes timed" ||
        fail "ab.sh attention: $out"
    out=$(AB_TINY=1 OMP_NUM_THREADS=1 bash "$SRC/bench/ab.sh" moe HEAD 1 2>&1)
    [ "$(grep -c 'forward old .* input gradients old .* weight gradients old' <<< "$out")" = 2 ] &&
        ok "ab.sh moe HEAD (tiny): two shapes timed" || fail "ab.sh moe: $out"
    out=$(AB_TINY=1 OMP_NUM_THREADS=2 bash "$SRC/bench/ab.sh" matmul HEAD 1 2>&1)
    [ "$(grep -c 'forward old .* input gradient old .* weight gradient old' <<< "$out")" = 2 ] &&
        ok "ab.sh matmul HEAD (tiny): two shapes timed" || fail "ab.sh matmul: $out"
    out=$(AB_TINY=1 OMP_NUM_THREADS=2 bash "$SRC/bench/ab.sh" matmul_rows HEAD 1 2>&1)
    [ "$(grep -c 'copies of the weight.*forward old .* input gradient old' <<< "$out")" = 2 ] &&
        ok "ab.sh matmul_rows HEAD (tiny): two shapes timed over weight copies" || fail "ab.sh matmul_rows: $out"
    out=$(AB_TINY=1 OMP_NUM_THREADS=2 bash "$SRC/bench/ab.sh" paged HEAD 1 2>&1)
    [ "$(grep -c "step's attention old .* new .*" <<< "$out")" = 2 ] && [ "$(grep -c 'the same bits' <<< "$out")" = 2 ] &&
        ok "ab.sh paged HEAD (tiny): two shapes timed, the same bits" || fail "ab.sh paged: $out"
    if bash "$SRC/bench/ab.sh" attention no-such-commit > "$WORK/ab.out" 2>&1; then fail "ab.sh accepted no-such-commit"
    else grep -q "is not a commit" "$WORK/ab.out" && ok "ab.sh refuses: $(cat "$WORK/ab.out")" || fail "ab refusal: $(cat "$WORK/ab.out")"; fi
    # a commit whose op has other arguments (attention before issue 16 took the T x T matrix):
    # refused, where the old object was called with this tree's prototypes and hung
    if git -C "$SRC" cat-file -e c419a40 2> /dev/null; then
        if AB_TINY=1 timeout 60 bash "$SRC/bench/ab.sh" attention c419a40 1 > "$WORK/ab.out" 2>&1; then fail "ab.sh ran attention of c419a40"
        else grep -q "has another prototype than the working tree's" "$WORK/ab.out" && ok "ab.sh refuses an op of other arguments: $(head -c 120 "$WORK/ab.out")" ||
            fail "ab.sh against c419a40: $(head -c 300 "$WORK/ab.out")"; fi
    else
        echo "     (ab.sh prototype check skipped: commit c419a40 is not in this checkout)"
    fi
    if bash "$SRC/bench/ab.sh" gemv HEAD > "$WORK/ab.out" 2>&1; then fail "ab.sh accepted the op gemv"
    else grep -q "unknown op 'gemv'" "$WORK/ab.out" && ok "ab.sh refuses: $(cat "$WORK/ab.out")" || fail "ab refusal: $(cat "$WORK/ab.out")"; fi
else
    echo "     (ab.sh runs skipped: $SRC is not a git checkout)"
fi
# bad arguments of the benchmark tools: one line and a non-zero exit, before any run (bench_decode
# overran its 64-row arrays at --batches 65; bench_moe ran on unknown options and on --help;
# bench_dist.sh printed a table of zeros and NaN at STEPS <= 5 and exited 1 with no word on a
# failed run; bench_overlap.sh claimed equal weights for zero pairs)
bench_refuses() {   # NAME NEEDLE CMD...
    local name=$1 needle=$2
    shift 2
    "$@" > "$WORK/br.out" 2> "$WORK/br.err"
    local rc=$?
    [ "$rc" -ne 0 ] && [ "$(wc -l < "$WORK/br.err")" -eq 1 ] && grep -qF -- "$needle" "$WORK/br.err" && ok "$name: $(cat "$WORK/br.err")" ||
        fail "$name: exit $rc: $(head -c 300 "$WORK/br.err") $(head -c 200 "$WORK/br.out")"
}
bench_refuses "bench_decode --batches 65" "from 1 to 64" "$BUILD/bench/bench_decode" --presets mqa --contexts 16 --batches 65 --steps 1
bench_refuses "bench_decode --presets ,," "names no preset" "$BUILD/bench/bench_decode" --presets ,, --contexts 16
# a bench_loader run that fails removes its generated shards (23 MB were left in /tmp)
before=$(ls -d /tmp/bench_loader_* 2> /dev/null | sort)
"$BUILD/bench/bench_loader" --T 16777216 > /dev/null 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$(ls -d /tmp/bench_loader_* 2> /dev/null | sort)" = "$before" ]
check $? "bench_loader that fails (a window past its data) leaves no shards in /tmp (rc $rc)"
# every preset checked before the first is measured (a bad last one came after minutes of runs)
bench_refuses "bench_decode --presets mha,mah (refused before mha runs)" "unknown attention preset 'mah'" \
    "$BUILD/bench/bench_decode" --presets mha,mah --contexts 16 --batches 1 --steps 1
bench_refuses "bench_codec --codecs ';;'" "names no codec" "$BUILD/bench/bench_codec" --codecs ';;'
bench_refuses "bench_codec, a bad last codec (refused before the first is measured)" "int_group bits=9: use 2 to 8" \
    "$BUILD/bench/bench_codec" --codecs 'fp32;int_group:bits=9' --tokens 64
grep -q "^fp32 " "$WORK/br.out" && fail "bench_codec measured fp32 before refusing the bad codec" || ok "bench_codec: nothing measured"
"$BUILD/bench/bench_codec" --codecs 'fp32;bf16' --width 100 --tokens 64 > "$WORK/bc.out" 2>&1 && grep -q "^bf16 " "$WORK/bc.out" &&
    ok "bench_codec --width 100 with codecs that have no heads (the default --head 64 is not asked to divide it)" ||
    fail "bench_codec --width 100: $(tail -n 1 "$WORK/bc.out")"
bench_refuses "bench_moe --bogus" "unknown option '--bogus'" "$BUILD/bench/bench_moe" --bogus 3
"$BUILD/bench/bench_moe" --help > "$WORK/moe_help.out" 2>&1 && grep -q "^usage: bench_moe" "$WORK/moe_help.out" && ! grep -q "^ratio " "$WORK/moe_help.out" &&
    ok "bench_moe --help prints its usage, runs nothing" || fail "bench_moe --help: $(head -c 200 "$WORK/moe_help.out")"
bench_refuses "bench_gpu --dense naming no file (before the device is asked for)" "cannot read config" "$BUILD/bench/bench_gpu" --dense "$WORK/none.json"
bench_refuses "bench_torch_cpu.py --config naming no file (one line, no traceback)" "No such file or directory" \
    /usr/bin/python3 bench/bench_torch_cpu.py --config "$WORK/none.json"
bench_refuses "bench_gpu --peak-tflops abc (checked without a GPU too)" "--peak-tflops 'abc': expected a decimal number" "$BUILD/bench/bench_gpu" --peak-tflops abc
bench_refuses "bench_dist.sh with 3 steps" "STEPS 3 is below 6" bash bench/bench_dist.sh "$CLLA" 3
bench_refuses "bench_dist.sh with a missing binary" "is not an executable" bash bench/bench_dist.sh "$WORK/no_clla" 10
bench_refuses "bench_overlap.sh with 0 pairs" "PAIRS 0 is below 1" bash bench/bench_overlap.sh "$CLLA" 0

# scripts/build.sh --help: its usage, exit 0, no directory named --help (it configured one)
(cd "$WORK" && bash "$SRC/scripts/build.sh" --help > bh.out 2>&1) && grep -q "^usage: scripts/build.sh DIR" "$WORK/bh.out" &&
    [ ! -e "$WORK/--help" ] && ok "scripts/build.sh --help prints its usage and builds nothing" ||
    fail "scripts/build.sh --help: $(head -c 300 "$WORK/bh.out")"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
