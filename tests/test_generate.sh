#!/usr/bin/env bash
# `clla generate` and `clla export` through the binary, on a tiny GQA model that learns to
# repeat "the cat sat on the mat. " (so greedy text is predictable):
#  (a) greedy generation from the run directory and from its last checkpoint (same tokens),
#      streamed text, the stderr summary (prefill/decode tok/s, cache bytes per token);
#  (b) --json lines parse and hold prompt, completion, ids and stop reason; --prompts files
#      (plain and JSONL) give what --prompt gives;
#  (c) stop strings (cut from the text, also when streaming) and stop tokens;
#  (d) sampling: a seed repeats its tokens, another seed does not; a prompt's tokens do not
#      depend on the batch it is decoded in (--batch 1, 2, all);
#  (e) export: fp32 and bf16 packages; the fp32 package generates the run directory's tokens
#      (greedy and sampled); the bf16 weights are the fp32 masters rounded to nearest even;
#      --cache-codec lands in the package's "cache" section; --overwrite replaces a package;
#      clla eval reads a package (the fp32 package's loss is the run's);
#  (f) bad input: one line "clla: error: ...", exit != 0, and export leaves nothing behind
#      (no package, no temporary), a file-size limit included.
# Needs CLLA; python3 for the JSON and bf16 checks (those are skipped with a reason without it).
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"

. "$(dirname "$0")/lib/check.sh" test_generate
check() { if [ "$1" -eq 0 ]; then ok "$2"; else fail "$2"; fi; }   # check STATUS NAME
have_python=0
command -v python3 > /dev/null && have_python=1

# Does any of the paths exist? (globs that match nothing stay literal and do not)
any_exists() { local f; for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }
# The generated ids of JSON line N (1-based) of a file, as "1,2,3".
ids_of() { sed -n "${2:-1}p" "$1" | grep -o '"tokens":\[[^]]*\]' | sed 's/.*\[//; s/\]//'; }

# ---------------------------------------------------------------- setup
for _ in $(seq 300); do printf 'the cat sat on the mat. '; done > cat.txt
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" cat.txt > setup.log 2>&1 &&
"$CLLA" prep --tokenizer tok.tok --out shards --val-fraction 0 cat.txt >> setup.log 2>&1
cat > tiny.json <<EOF
{"attention": "gqa", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
 "train": {"data": "shards/train", "tokenizer": "$WORK/tok.tok", "seq_len": 32, "micro_batch": 4, "max_steps": 60,
           "warmup_steps": 5, "lr": 1e-2, "min_lr": 1e-3, "weight_decay": 0.0, "seed": 7, "threads": 2,
           "log_every": 20, "save_every": 30}}
EOF
if ! "$CLLA" train --config tiny.json --out run --quiet >> setup.log 2>&1; then
    echo "FAIL setup (tokenizer, prep, train): $(tail -n 3 setup.log)"
    echo "0 passed, 1 failed"
    exit 1
fi
CKPT=run/checkpoints/step_00000060

# ---------------------------------------------------------------- (a) greedy
"$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 > a.out 2> a.err
check $? "generate from the run directory exits 0"
grep -q '^ sat on the mat\. the cat sat on' a.out; check $? "greedy text streamed: '$(head -c 60 a.out)'"
grep -Eq 'tok/s prefill' a.err && grep -Eq 'tok/s decode' a.err && grep -Eq '[0-9]+ bytes per token' a.err &&
    grep -Eq 'cache: [0-9]+ bytes held' a.err
check $? "stderr summary: prefill and decode tok/s, cache bytes held and per token"
[ "$(grep -c . a.err)" -eq 2 ]; check $? "stderr holds the two summary lines only"
# the peak tokens: two prompts one at a time (--batch 1), a long one first: the most stored at
# once is the long prompt and its completion (the last token is not fed back, so not stored),
# not what the short one held at the end
printf 'the cat sat on the mat. the cat sat on the mat. the cat\nthe\n' > peak.txt
"$CLLA" generate --model run --prompts peak.txt --batch 1 --max-new-tokens 6 --ignore-eos --json > peak.json 2> peak.err
want=$(python3 -c "import json,sys; print(max(j['prompt_tokens'] + j['completion_tokens'] - 1 for j in map(json.loads, open('peak.json'))))")
grep -q "(at most $want tokens stored at once)" peak.err
check $? "the cache line's peak tokens are the most stored at once ($want): $(grep cache: peak.err)"
# more than the memory left after loading the model (CLLA_TEST_MEM_AVAILABLE stands in for
# MemAvailable): refused before the prefill, naming both figures
CLLA_TEST_MEM_AVAILABLE=4096 "$CLLA" generate --model run --prompts peak.txt --max-new-tokens 6 > mem.out 2> mem.err
[ $? -eq 1 ] && [ "$(grep -c . mem.err)" -eq 1 ] && [ ! -s mem.out ] &&
    grep -Eq "generating needs [0-9.]+ KiB more memory \(the prefill's activations, 2 rows of up to [0-9]+ tokens, .*KV cache .*\) but only 4.0 KiB are available .*lower --batch or --max-new-tokens" mem.err
check $? "generating beyond the available memory refused in one line: $(cat mem.err)"
# one long prompt and five of a token: the prefill's positions follow the prompt tokens (2 rows
# of the longest), not the prompts times the longest (6 rows), and every completion is the one
# it gets alone (--batch 1)
{ echo 'the cat sat on the mat. the cat sat on the mat. the cat sat on the mat.'; for i in 1 2 3 4 5; do echo 'the'; done; } > mix.txt
CLLA_TEST_MEM_AVAILABLE=4096 "$CLLA" generate --model run --prompts mix.txt --max-new-tokens 4 > /dev/null 2> mix.err
grep -q "the prefill's activations, 2 rows of up to" mix.err
check $? "a long prompt among short ones: the prefill is sized by the prompt tokens: $(grep -o "the prefill's activations, [0-9]* rows of up to [0-9]* tokens" mix.err)"
"$CLLA" generate --model run --prompts mix.txt --max-new-tokens 6 --ignore-eos --json > mix6.json 2> /dev/null &&
    "$CLLA" generate --model run --prompts mix.txt --max-new-tokens 6 --ignore-eos --json --batch 1 > mix1.json 2> /dev/null &&
    [ "$(python3 -c "import json; print([json.loads(l)['completion'] for l in open('mix6.json')])")" = \
      "$(python3 -c "import json; print([json.loads(l)['completion'] for l in open('mix1.json')])")" ]
check $? "a long prompt among short ones: the completions of --batch 1"
CLLA_HUGE_PAGES=yes "$CLLA" generate --model run --prompt "the cat" --max-new-tokens 4 > hp.out 2> hp.err
[ $? -ne 0 ] && [ "$(grep -c . hp.err)" -eq 1 ] && grep -q "CLLA_HUGE_PAGES='yes': use 0" hp.err
check $? "CLLA_HUGE_PAGES=yes refused in one line: $(cat hp.err)"
"$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 --json > run.json 2> /dev/null &&
"$CLLA" generate --model "$CKPT" --prompt "the cat" --max-new-tokens 16 --json > ckpt.json 2> /dev/null
check $? "generate from a checkpoint directory exits 0"
[ -n "$(ids_of run.json)" ] && [ "$(ids_of run.json)" = "$(ids_of ckpt.json)" ]
check $? "checkpoint and run directory generate the same ids ($(ids_of run.json))"

# ---------------------------------------------------------------- (b) JSON, prompt files
printf 'the cat\n\non the\r\nsat on the mat. the\n' > prompts.txt
printf '{"prompt": "the cat"}\n\n{"prompt": "on the", "note": 1}\n{"prompt": "sat on the mat. the"}\n' > prompts.jsonl
"$CLLA" generate --model run --prompt "the cat" --prompt "on the" --prompt "sat on the mat. the" --max-new-tokens 12 --json \
    > three.json 2> /dev/null &&
"$CLLA" generate --model run --prompts prompts.txt --max-new-tokens 12 --json > three_txt.json 2> /dev/null &&
"$CLLA" generate --model run --prompts prompts.jsonl --max-new-tokens 12 --json > three_jsonl.json 2> /dev/null
check $? "three prompts of different lengths from --prompt, a text file and a JSONL file"
if [ "$have_python" -eq 1 ]; then
    python3 - three.json three_txt.json three_jsonl.json <<'EOF'
import json, sys
runs = []
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path, encoding="utf-8")]
    assert len(rows) == 3, (path, len(rows))
    by = {r["index"]: r for r in rows}
    assert sorted(by) == [0, 1, 2], path
    for r in rows:
        assert set(r) >= {"index", "prompt", "completion", "tokens", "prompt_tokens", "completion_tokens", "stop_reason", "seconds"}, r
        assert r["completion_tokens"] == len(r["tokens"]) <= 12, r
        assert r["stop_reason"] in ("length", "stop_token", "stop_string"), r
    assert [by[i]["prompt"] for i in range(3)] == ["the cat", "on the", "sat on the mat. the"], path
    assert by[0]["completion"].startswith(" sat on the mat"), by[0]
    runs.append([by[i]["tokens"] for i in range(3)])
assert runs[0] == runs[1] == runs[2], runs
EOF
    check $? "--json lines parse, hold every field, and the prompt files match --prompt"
else
    echo "skip JSON parsing checks: python3 not found"
fi

# ---------------------------------------------------------------- (c) stops
"$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 --stop " mat" > stop.out 2> /dev/null
[ "$(cat stop.out)" = " sat on the" ]; check $? "--stop cuts the text before the stop string, streamed: '$(cat stop.out)'"
# a stop string across two tokens (" the", " mat"): the streamed text must hold back " t"
"$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 --stop "he ma" > stop2.out 2> /dev/null
[ "$(cat stop2.out)" = " sat on t" ]; check $? "--stop across tokens: nothing of it is streamed: '$(cat stop2.out)'"
"$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 --stop " mat" --json > stop.json 2> /dev/null
grep -q '"completion":" sat on the"' stop.json && grep -q '"stop_reason":"stop_string"' stop.json
check $? "--stop in JSON: completion and stop_reason stop_string"
# two stops completed by the same token: the earlier match cuts, in either order of the options
for order in '--stop _mat --stop on_the_mat' '--stop on_the_mat --stop _mat'; do
    set -- $order
    "$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 "$1" "${2//_/ }" "$3" "${4//_/ }" > stop3.out 2> /dev/null
    [ "$(cat stop3.out)" = " sat " ]; check $? "two stops, the earliest match wins ($order): '$(cat stop3.out)'"
done
# streaming holds back only a tail that could still start a stop string: with one the text never
# holds, every token's bytes go out as they come (the last stop length - 1 bytes were held
# whatever they were: a long stop string streamed nothing until the end)
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    zs=$(printf 'Z%.0s' $(seq 60))
    strace -o writes0.txt -e trace=write -e signal=none "$CLLA" generate --model run --prompt "the cat" \
        --max-new-tokens 12 > /dev/null 2>&1
    strace -o writes1.txt -e trace=write -e signal=none "$CLLA" generate --model run --prompt "the cat" \
        --max-new-tokens 12 --stop "$zs" > /dev/null 2>&1
    n0=$(grep -c '^write(1' writes0.txt) n1=$(grep -c '^write(1' writes1.txt)
    [ "$n0" -ge 12 ] && [ "$n1" = "$n0" ]
    check $? "a stop string the text never starts holds nothing back: $n1 writes to stdout with it, $n0 without"
else
    echo "skip streaming writes: strace cannot trace here (it is in scripts/setup.sh)"
fi
dot=$("$CLLA" tokenizer encode --tokenizer tok.tok --text ".")
"$CLLA" generate --model run --prompt "the cat" --max-new-tokens 16 --stop-token "$dot" --json > stoptok.json 2> /dev/null
ids=$(ids_of stoptok.json)
grep -q '"stop_reason":"stop_token"' stoptok.json && [ "${ids##*,}" = "$dot" ] && grep -q '"completion":" sat on the mat"' stoptok.json
check $? "--stop-token $dot ends after that token, which is not in the text (ids $ids)"

# ---------------------------------------------------------------- (d) sampling
sample() { "$CLLA" generate --model "$1" --prompt "the cat" --prompt "on" --prompt "sat on the mat. the cat" \
    --max-new-tokens 20 --temperature 3 --top-k 50 --top-p 0.95 --seed "$2" --json "${@:3}" 2> /dev/null; }
sample run 5 > s5a.json && sample run 5 > s5b.json && sample run 6 > s6.json
same=1; differ=0
for i in 0 1 2; do
    a=$(grep "\"index\":$i," s5a.json | grep -o '"tokens":\[[^]]*\]'); b=$(grep "\"index\":$i," s5b.json | grep -o '"tokens":\[[^]]*\]')
    c=$(grep "\"index\":$i," s6.json | grep -o '"tokens":\[[^]]*\]')
    [ -n "$a" ] && [ "$a" = "$b" ] || same=0
    [ "$a" != "$c" ] && differ=1
done
[ "$same" -eq 1 ]; check $? "sampling: the same seed repeats every prompt's tokens"
[ "$differ" -eq 1 ]; check $? "sampling: another seed draws other tokens"
sample run 5 --batch 1 > s5b1.json && sample run 5 --batch 2 > s5b2.json
batch_same=1
for i in 0 1 2; do
    a=$(grep "\"index\":$i," s5a.json | grep -o '"tokens":\[[^]]*\]')
    for f in s5b1.json s5b2.json; do
        [ "$a" = "$(grep "\"index\":$i," $f | grep -o '"tokens":\[[^]]*\]')" ] || batch_same=0
    done
done
[ "$batch_same" -eq 1 ]; check $? "a prompt draws from its own RNG stream: the same sampled tokens at --batch 1, 2, 3 (on this model, whose logits the batch leaves alone: docs/INFERENCE.md)"

# ---------------------------------------------------------------- (e) export
"$CLLA" export "$CKPT" --out pkg32 > e32.out 2> e32.err
check $? "export fp32 from a checkpoint: $(cat e32.out e32.err | head -n 2)"
"$CLLA" export "$CKPT" --out pkg16 --dtype bf16 > e16.out 2> e16.err
check $? "export bf16: $(cat e16.out e16.err | head -n 2)"
for f in config.json model.safetensors tokenizer.tok; do
    [ -s "pkg32/$f" ] && [ -s "pkg16/$f" ] || fail "package file $f missing"
done
any_exists pkg32.* pkg16.* && fail "export left a temporary beside the package" || ok "no temporary left beside the packages"
grep -q '"format":[[:space:]]*"clla-package"' pkg32/config.json && grep -q '"cache":' pkg32/config.json
check $? "package config.json has the package and cache sections"
"$CLLA" generate --model pkg32 --prompt "the cat" --max-new-tokens 16 --json > gen_pkg32.json 2> /dev/null
[ -n "$(ids_of gen_pkg32.json)" ] && [ "$(ids_of gen_pkg32.json)" = "$(ids_of run.json)" ]
check $? "fp32 package generates the run directory's greedy ids"
sample pkg32 5 > gen_pkg32s.json
[ "$(grep -o '"tokens":\[[^]]*\]' gen_pkg32s.json | sort)" = "$(grep -o '"tokens":\[[^]]*\]' s5a.json | sort)" ]
check $? "fp32 package samples the run directory's tokens for a seed"
"$CLLA" generate --model pkg16 --prompt "the cat" --max-new-tokens 16 > gen_pkg16.out 2> /dev/null
grep -q '^ sat on the mat' gen_pkg16.out; check $? "bf16 package loads and generates: '$(head -c 40 gen_pkg16.out)'"
# a weight past bf16's largest value (3.39e38) would be stored as an infinity, which every loader
# refuses: export --dtype bf16 refuses it first, naming it (it wrote the package), fp32 takes it
if [ "$have_python" -eq 1 ]; then
    mkdir -p huge && cp "$CKPT/../../config.json" huge/ && cp pkg32/model.safetensors pkg32/tokenizer.tok huge/ 2> /dev/null
    /usr/bin/python3 - huge/model.safetensors <<'PY'
import json, struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
name = sorted(k for k in h if k != "__metadata__")[0]
f.seek(8 + n + h[name]["data_offsets"][0])
f.write(struct.pack("<f", 3.4e38))
PY
    "$CLLA" export huge --out pkg_huge16 --dtype bf16 > /dev/null 2> huge.err
    rc=$?
    [ $rc -ne 0 ] && grep -q "beyond bf16's largest value.*export with --dtype fp32" huge.err && [ ! -e pkg_huge16 ] &&
        "$CLLA" export huge --out pkg_huge32 > /dev/null 2>&1
    check $? "export --dtype bf16 refuses a weight past bf16's range, fp32 exports it: $(cat huge.err)"
fi
if [ "$have_python" -eq 1 ]; then
    python3 - pkg32/model.safetensors pkg16/model.safetensors <<'EOF'
import json, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return h, b[8 + n:]
h32, d32 = load(sys.argv[1]); h16, d16 = load(sys.argv[2])
assert set(h32) == set(h16) and len(h32) > 10
for name, e in h32.items():
    f = h16[name]
    assert e["dtype"] == "F32" and f["dtype"] == "BF16" and e["shape"] == f["shape"], name
    a0, a1 = e["data_offsets"]; b0, b1 = f["data_offsets"]
    xs = struct.unpack("<%dI" % ((a1 - a0) // 4), d32[a0:a1]); ys = struct.unpack("<%dH" % ((b1 - b0) // 2), d16[b0:b1])
    for u, y in zip(xs, ys):
        rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
        assert y == rne, (name, hex(u), hex(y))
EOF
    check $? "bf16 package: every weight is its fp32 master rounded to nearest even"
else
    echo "skip the bf16 rounding check: python3 not found"
fi
# a package whose config says fp32 over bf16 weights (files of two exports mixed): refused
rm -rf pkgmix && cp -r pkg32 pkgmix && cp pkg16/model.safetensors pkgmix/
if "$CLLA" generate --model pkgmix --prompt "the cat" --max-new-tokens 2 > mix.out 2> mix.err; then fail "a package whose dtype its weights contradict: accepted"
else [ "$(grep -c . mix.err)" -eq 1 ] && grep -q 'package.dtype is "fp32" but tensor .* is stored as BF16' mix.err &&
    ok "a package whose dtype its weights contradict: $(cat mix.err)" || fail "mixed package: $(cat mix.err)"; fi
"$CLLA" eval --checkpoint run --data shards/train --max-batches 2 --json > eval_run.json 2> /dev/null &&
"$CLLA" eval --checkpoint pkg32 --data shards/train --max-batches 2 --json > eval_pkg.json 2> /dev/null &&
[ -s eval_run.json ] && cmp -s eval_run.json eval_pkg.json
check $? "clla eval reads a package: the fp32 package's loss is the run's ($(cat eval_pkg.json))"
"$CLLA" export run --out pkgq --cache-codec int_group:bits=4,group=8 --cache-codec v=bf16 > /dev/null 2>&1 &&
grep -q '"k":[[:space:]]*"int_group:bits=4,group=8"' pkgq/config.json && grep -q '"v":[[:space:]]*"bf16"' pkgq/config.json
check $? "--cache-codec CODEC then PART=CODEC land in the package's cache section"
"$CLLA" generate --model pkgq --prompt "the cat" --max-new-tokens 8 > /dev/null 2> q.err && grep -q 'int_group:bits=4,group=8' q.err
check $? "generate serves the package's codecs: $(tail -n 1 q.err)"
"$CLLA" export "$CKPT" --out pkg16 --overwrite > /dev/null 2>&1 && grep -q '"dtype":[[:space:]]*"fp32"' pkg16/config.json &&
    ! any_exists pkg16.*
check $? "--overwrite replaces a package, nothing left beside it"

# a latent preset with a quantized cache (CLLA-quant, F = 2, MoE): generate from the init
# directory and from its package give the same ids; its latent part takes a codec
"$CLLA" init --config tiny.json --out quant --set attention=clla_quant --set kv_lora_rank=32 --set qk_rope_head_dim=8 \
    --set head_dim=12 --set latent_quant_group=8 --set n_routed_experts=4 --set num_experts_per_tok=2 \
    --set moe_intermediate_size=16 > /dev/null 2> quant.err &&
"$CLLA" export quant --out pkgquant > /dev/null 2>> quant.err &&
grep -q '"latent":[[:space:]]*"int_group:bits=4,group=8"' pkgquant/config.json &&
"$CLLA" generate --model quant --prompt "the cat" --max-new-tokens 12 --json > quant_dir.json 2>> quant.err &&
"$CLLA" generate --model pkgquant --prompt "the cat" --max-new-tokens 12 --json > quant_pkg.json 2>> quant.err &&
[ -n "$(ids_of quant_dir.json)" ] && [ "$(ids_of quant_dir.json)" = "$(ids_of quant_pkg.json)" ]
check $? "clla_quant + MoE: the package keeps the int4 latent codec and generates the directory's ids $(tail -n 1 quant.err)"
"$CLLA" export quant --out pkgquant8 --cache-codec latent=int_group:bits=8,group=16 > /dev/null 2>&1 &&
grep -q '"latent":[[:space:]]*"int_group:bits=8,group=16"' pkgquant8/config.json &&
"$CLLA" generate --model pkgquant8 --prompt "the cat" --max-new-tokens 4 > /dev/null 2> q8.err && grep -q 'latent=int_group:bits=8,group=16' q8.err
check $? "clla_quant: --cache-codec latent=int_group:bits=8,group=16 exported and served"
# A tokenizer whose ids have gaps (valid, docs/FORMAT.md): ids from 256 on spread out 3 apart
# from 1000, the special token at 2000. Sampling from a fresh model (logits near uniform) over its
# 2001 ids must never pick one the tokenizer lacks (17 of 20 were, each "generated" and printing
# nothing); clla tokenizer decode refuses such an id.
awk '/^#special/ { $3 = 2000 } !/^#/ && NF == 2 && $2 >= 256 { $2 = 1000 + 3 * ($2 - 256) } { print }' tok.tok > gaps.tok
"$CLLA" init --config tiny.json --out gapmodel --set vocab_size=2001 --set train.tokenizer="$WORK/gaps.tok" > /dev/null 2> gap.err &&
"$CLLA" generate --model gapmodel --prompt "the cat" --max-new-tokens 40 --temperature 1 --ignore-eos --json > gap.json 2>> gap.err &&
[ "$(ids_of gap.json | tr ',' '\n' | grep -c .)" -eq 40 ] &&
"$CLLA" tokenizer decode --tokenizer gaps.tok $(ids_of gap.json | tr ',' ' ') > /dev/null 2>> gap.err
check $? "a tokenizer with id gaps: 40 sampled ids, every one the tokenizer's $(tail -n 1 gap.err)"
expect_error_q() { "$@" > /dev/null 2> bad.err; [ $? -ne 0 ] && [ "$(grep -c . bad.err)" -eq 1 ]; }
expect_error_q "$CLLA" generate --model quant --prompt a --cache-codec latent=int_group:bits=4,group=7
check $? "clla_quant: a group that does not divide the latent width is refused: $(cat bad.err)"

# ---------------------------------------------------------------- (f) bad input
# expect_error NAME PATTERN CMD...: exit != 0, one stderr line "clla: error: ..." matching PATTERN
expect_error() {
    local name=$1 pat=$2; shift 2
    "$@" > bad.out 2> bad.err
    local rc=$?
    if [ "$rc" -ne 0 ] && [ "$(grep -c . bad.err)" -eq 1 ] && grep -q '^clla: error: ' bad.err && grep -qi -- "$pat" bad.err; then
        ok "$name: $(cat bad.err)"
    else
        fail "$name: exit $rc, stderr: $(head -c 400 bad.err)"
    fi
}
G=("$CLLA" generate --model run)
long=$(head -c 400 cat.txt)
expect_error "prompt longer than the context" "context" "${G[@]}" --prompt "$long"
expect_error "prompt + --max-new-tokens beyond the context" "lower --max-new-tokens" "${G[@]}" --prompt "the cat" --max-new-tokens 62
expect_error "empty prompt" "empty" "${G[@]}" --prompt ""
many=(); for i in $(seq 1 257); do many+=(--stop "s$i"); done
expect_error "257 values of repeatable options" "256 at most.*--prompts FILE" "${G[@]}" --prompt a "${many[@]}"
# 256 values is every command's cap (docs/COMMANDS.md): export and calibrate stopped at 64
codecs=(); for i in $(seq 1 65); do codecs+=(--cache-codec bf16); done
"$CLLA" export run --out pkg65 "${codecs[@]}" > /dev/null 2> e65.err
check $? "export takes 65 --cache-codec values: $(head -c 200 e65.err)"
printf '{"prompt":"a"}\n{"prompt":""}\n' > empty.jsonl
expect_error "empty prompt in a JSONL file" "empty.jsonl line 2" "${G[@]}" --prompts empty.jsonl
printf '{"prompt": "the cat"}\n{"prompt": "on\n' > bad.jsonl
expect_error "malformed JSONL line" "bad.jsonl line 2" "${G[@]}" --prompts bad.jsonl
printf '{"text": "the cat"}\n' > nokey.jsonl
expect_error "JSONL line without \"prompt\"" "nokey.jsonl line 1" "${G[@]}" --prompts nokey.jsonl
expect_error "--prompts file missing" "missing.txt" "${G[@]}" --prompts missing.txt
expect_error "no prompt" "no prompt" "${G[@]}"
expect_error "temperature < 0" "temperature" "${G[@]}" --prompt a --temperature -0.5
echo "a prompt" > one.txt
expect_error "--prompt and --prompts together (the usage's either/or)" "--prompt and --prompts both given" "${G[@]}" --prompt a --prompts one.txt
expect_error "temperature not a number" "temperature" "${G[@]}" --prompt a --temperature warm
expect_error "top-p 0" "top-p" "${G[@]}" --prompt a --temperature 1 --top-p 0
expect_error "top-p > 1" "top-p" "${G[@]}" --prompt a --temperature 1 --top-p 1.5
expect_error "top-k < 0" "top-k" "${G[@]}" --prompt a --temperature 1 --top-k -1
# values the sampler's float would change: refused, naming what was typed
expect_error "temperature 1e-50 (a float's 0: greedy)" "temperature 1e-50 is out of range" "${G[@]}" --prompt a --temperature 1e-50
expect_error "temperature 1e39 (a float's inf)" "temperature 1e39 is out of range" "${G[@]}" --prompt a --temperature 1e39
expect_error "temperature 1e-45 (a float's subnormal)" "temperature 1e-45 is out of range" "${G[@]}" --prompt a --temperature 1e-45
expect_error "top-p 1.0000001" "top-p 1.0000001 is out of range" "${G[@]}" --prompt a --temperature 1 --top-p 1.0000001
expect_error "max-new-tokens < 0" "max-new-tokens" "${G[@]}" --prompt a --max-new-tokens -1
expect_error "max-new-tokens not whole" "max-new-tokens" "${G[@]}" --prompt a --max-new-tokens 5x
expect_error "stop token beyond the vocabulary" "stop-token" "${G[@]}" --prompt a --stop-token 320
expect_error "unknown codec name" "codec" "${G[@]}" --prompt a --cache-codec zip
expect_error "unknown codec setting" "codec" "${G[@]}" --prompt a --cache-codec int_group:bits=9,group=8
expect_error "codec for a part this model lacks" "latent" "${G[@]}" --prompt a --cache-codec latent=bf16
expect_error "model directory missing" "nowhere" "$CLLA" generate --model nowhere --prompt a
mkdir -p unfinished/checkpoints && cp run/config.json unfinished/
expect_error "run directory without a final model" "checkpoints/step_N" "$CLLA" generate --model unfinished --prompt a
"$CLLA" init --config tiny.json --out notok --set 'train.tokenizer=""' > /dev/null 2>&1
expect_error "no tokenizer anywhere" "--tokenizer" "$CLLA" generate --model notok --prompt a
cp -r pkg32 pkgbad
sed -i -E 's/("intermediate_size":[[:space:]]*)64/\148/' pkgbad/config.json
expect_error "package whose config and weights disagree" "shape" "$CLLA" generate --model pkgbad --prompt a
cp -r pkg32 pkgcodec
sed -i -E 's/("k":[[:space:]]*)"bf16"/\1"bf17"/' pkgcodec/config.json
expect_error "package with an unknown codec in its cache section" "bf17" "$CLLA" generate --model pkgcodec --prompt a
cp -r pkg32 pkgver
sed -i -E 's/("version":[[:space:]]*)1/\12/' pkgver/config.json
expect_error "package of another format version" "version" "$CLLA" generate --model pkgver --prompt a
# a package's config.json is read as strictly as every config (docs/CONFIG.md): an out-of-range
# number was printed back as null, the key's default (a context of 64 became 4096); text after
# the object and a key twice were taken
cp -r pkg32 pkginf
sed -i -E 's/("max_position_embeddings":[[:space:]]*)64/\11e999/' pkginf/config.json
expect_error "package with max_position_embeddings 1e999" "max_position_embeddings" "$CLLA" generate --model pkginf --prompt a --max-new-tokens 4
cp -r pkg32 pkgtail && echo 'GARBAGE {' >> pkgtail/config.json
expect_error "package config.json with text after the object" "after" "$CLLA" generate --model pkgtail --prompt a --max-new-tokens 4
cp -r pkg32 pkgdup
sed -i -E 's/("v":[[:space:]]*"bf16")/"k": "fp32", \1/' pkgdup/config.json
expect_error "package with a cache part twice" "duplicate" "$CLLA" generate --model pkgdup --prompt a --max-new-tokens 4
# a "cache" key is a part name: one holding a codec spec is refused, not applied to every part
cp -r pkg32 pkgcolon
sed -i -E 's/("v":[[:space:]]*"bf16")/\1, "int_group:bits": "2,group=16"/' pkgcolon/config.json
expect_error "package with a codec spec as a cache key" "int_group:bits" "$CLLA" generate --model pkgcolon --prompt a --max-new-tokens 4
"${G[@]}" --prompt the --prompt $'the \xff\xfe cat' --max-new-tokens 4 > utf.out 2> utf.err
# the message numbers the prompt as the output does ([1], the second), and names its option
[ $? -eq 0 ] && grep -q 'warning: prompt \[1\] (--prompt 2) is not valid UTF-8' utf.err && grep -q '^\[1\] ' utf.out
check $? "a prompt that is not valid UTF-8: its bytes are encoded, with a warning: $(head -n 1 utf.err)"

# export: nothing may appear at --out, nor a temporary beside it
expect_export_error() {
    local name=$1 pat=$2 out=$3; shift 3
    expect_error "export: $name" "$pat" "$@"
    if any_exists "$out" "$out".tmp.* "$out".old.*; then fail "export: $name: something was written at $out"
    else ok "export: $name: nothing written"; fi
}
expect_export_error "unknown dtype" "dtype" p1 "$CLLA" export "$CKPT" --out p1 --dtype fp16
expect_export_error "unknown codec" "codec" p2 "$CLLA" export "$CKPT" --out p2 --cache-codec int_group:bits=9,group=8
expect_export_error "config and weights disagree" "shape" p3 "$CLLA" export pkgbad --out p3
expect_export_error "tokenizer file missing" "tokenizer" p4 "$CLLA" export "$CKPT" --out p4 --tokenizer none.tok
expect_export_error "source missing" "nowhere" p5 "$CLLA" export nowhere --out p5
expect_export_error "no --out" "--out" p6 "$CLLA" export "$CKPT"
mkdir -p notpkg && echo keep > notpkg/file
expect_error "export: --overwrite of a directory that is not a package" "not a clla package" "$CLLA" export "$CKPT" --out notpkg --overwrite
[ "$(cat notpkg/file)" = keep ]; check $? "export: the non-package directory is untouched"
expect_error "export: existing package without --overwrite" "--overwrite" "$CLLA" export "$CKPT" --out pkg32
cp pkg32/model.safetensors before.st
# a file-size limit of 20 KiB: the weights (over 100 KB) cannot be written
(ulimit -f 20; exec "$CLLA" export "$CKPT" --out p7) > /dev/null 2> p7.err
rc=$?
if [ "$rc" -ne 0 ] && [ "$(grep -c . p7.err)" -eq 1 ] && ! any_exists p7 p7.tmp.*; then
    ok "export: a failed write (file-size limit) leaves nothing: $(cat p7.err)"
else
    fail "export under a file-size limit: exit $rc, $(echo p7*), $(head -c 300 p7.err)"
fi
(ulimit -f 20; exec "$CLLA" export "$CKPT" --out pkg32 --overwrite) > /dev/null 2>&1
cmp -s before.st pkg32/model.safetensors && ! any_exists pkg32.*
check $? "export: a failed --overwrite keeps the old package whole"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
