#!/usr/bin/env bash
# Hugging Face files as users have them (issue 12), through the binary:
#  (a) sharded weights: `clla init --shard-size` writes model-0000k-of-0000N.safetensors and
#      model.safetensors.index.json (HF names and layout); the sharded directory loads in eval
#      and as train.init_from (the directory or the index) and scores exactly what the single
#      file does; a save replaces the other layout without leaving stale files; damaged sets
#      (a missing shard, a tensor missing from the index, mapped to the wrong shard or in two
#      shards, a shard path outside the directory, shards of two saves, a truncated shard, both
#      layouts at once) are refused with one line naming the problem; bad --shard-size values
#      are refused;
#  (b) the config.json clla writes carries model_type and architectures (llama for the plain
#      presets, clla for latent/CLA/MoE ones) and reads back as it is;
#  (c) a directory where a file is expected, and a symlink loop, are named as such.
# Needs CLLA (the binary); ctest sets it. Prints "N passed, M failed".
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"

. "$(dirname "$0")/lib/check.sh" test_hf

# expect_error NAME PATTERN CMD...: CMD exits non-zero with one "clla...error:" line matching PATTERN
expect_error() {
    local name=$1 pat=$2
    shift 2
    if "$@" > out.log 2> err.log; then fail "$name (exit 0)" err.log; return; fi
    if [ "$(grep -c 'error:' err.log)" -eq 1 ] && grep -qE -- "$pat" err.log; then ok "$name"
    else fail "$name (wanted one error line matching '$pat')" err.log; fi
}

write_tokens tok.bin 800 12345

cat > m.json <<'EOF'
{"attention": "gqa", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
 "max_position_embeddings": 64,
 "train": {"data": "tok.bin", "seq_len": 16, "micro_batch": 2, "global_batch_tokens": 32,
           "max_steps": 2, "warmup_steps": 1, "threads": 1, "seed": 5, "log_every": 1000}}
EOF

loss_of() { "$CLLA" eval --checkpoint "$1" --data tok.bin --json 2> /dev/null; }

# ---------------------------------------------------------------- (a) sharded weights
"$CLLA" init --config m.json --out one > /dev/null 2> init.err || fail "init one file" init.err
if "$CLLA" init --config m.json --out sh --shard-size 10KB > /dev/null 2> init.err; then
    n=$(ls sh | grep -c '^model-[0-9]\{5\}-of-[0-9]\{5\}\.safetensors$')
    last=$(ls sh | grep '^model-' | tail -n 1)
    if [ "$n" -ge 3 ] && [ -f sh/model.safetensors.index.json ] && [ ! -e sh/model.safetensors ] &&
       [ "$last" = "model-$(printf %05d "$n")-of-$(printf %05d "$n").safetensors" ] &&
       [ -z "$(ls sh | grep -v -e '^model-' -e '^model.safetensors.index.json$' -e '^config.json$')" ]; then
        ok "init --shard-size 10KB writes $n HF-named shards and the index, nothing else"
    else fail "init --shard-size: unexpected files: $(ls sh | tr '\n' ' ')"; fi
    python3 - sh > py.log 2>&1 <<'EOF' && ok "the index is HF's: metadata.total_size and a weight_map naming every tensor of its shard" || fail "index layout" py.log
import json, struct, sys, os
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
wm, total = idx["weight_map"], 0
for f in sorted(set(wm.values())):
    raw = open(os.path.join(d, f), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    names = [k for k in hdr if k != "__metadata__"]
    assert sorted(names) == sorted(k for k, v in wm.items() if v == f), f
    total += sum(hdr[k]["data_offsets"][1] - hdr[k]["data_offsets"][0] for k in names)
assert idx["metadata"]["total_size"] == total, (idx["metadata"]["total_size"], total)
EOF
else
    fail "init --shard-size 10KB" init.err
fi

a=$(loss_of one); b=$(loss_of sh)
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "eval: sharded directory scores exactly as the single file ($b)"
else fail "eval: single '$a' vs sharded '$b'"; "$CLLA" eval --checkpoint sh --data tok.bin > ev.log 2>&1; sed 's/^/    /' ev.log; fi

for src in sh sh/model.safetensors.index.json; do
    if "$CLLA" train --config m.json --quiet --set train.init_from="$WORK/$src" --out "run_${src//\//_}" > tr.log 2>&1 &&
       "$CLLA" train --config m.json --quiet --set train.init_from="$WORK/one/model.safetensors" --out "ref_${src//\//_}" > tr2.log 2>&1 &&
       cmp -s "run_${src//\//_}/model.safetensors" "ref_${src//\//_}/model.safetensors"; then
        ok "train.init_from=$src trains exactly as from the single file"
    else fail "train.init_from=$src" tr.log; fi
done

# an inference package as train.init_from (its config.json has the package's own sections, which
# the config reader refused: "key 'cache' makes this an inference package's config")
if "$CLLA" export one --out pkg_one > tr.log 2>&1 &&
   "$CLLA" train --config m.json --quiet --set train.init_from="$WORK/pkg_one" --out run_pkg >> tr.log 2>&1 &&
   cmp -s run_pkg/model.safetensors ref_sh/model.safetensors; then
    ok "train.init_from=<a package> trains exactly as from the single file"
else fail "train.init_from=<a package>" tr.log; fi

if "$CLLA" train --config m.json --quiet --shard-size 10KB --out trsh > tr.log 2>&1 && [ -f trsh/model.safetensors.index.json ] &&
   [ ! -e trsh/model.safetensors ] && "$CLLA" train --config m.json --quiet --out tr1 > tr2.log 2>&1 &&
   [ "$(loss_of trsh)" = "$(loss_of tr1)" ] && [ -n "$(loss_of tr1)" ]; then
    ok "train --shard-size writes the final model as shards that score as the single file"
else fail "train --shard-size" tr.log; fi
expect_error "train --shard-size 2.5GB is refused before training" "shard-size '2.5GB' is not a size" \
    "$CLLA" train --config m.json --quiet --shard-size 2.5GB --out trbad
[ -e trbad ] && fail "a refused train --shard-size left trbad/ behind"

# a save replaces the other layout: single over shards, shards over single, fewer shards
cp -r sh re
if "$CLLA" init --config m.json --out re > /dev/null 2>&1; then fail "init over a sharded model without --overwrite was not refused"
else ok "init over a sharded model is refused without --overwrite"; fi
"$CLLA" init --config m.json --out re --overwrite > /dev/null 2>&1
if [ "$(ls re)" = "$(printf 'config.json\nmodel.safetensors')" ]; then ok "a single-file save (--overwrite) removes the old index and shards"
else fail "single over shards left: $(ls re | tr '\n' ' ')"; fi
"$CLLA" init --config m.json --out re --shard-size 10KB --overwrite > /dev/null 2>&1
"$CLLA" init --config m.json --out re --shard-size 40KB --overwrite > /dev/null 2>&1
n=$(ls re | grep -c '^model-')
if [ ! -e re/model.safetensors ] && [ "$n" -ge 2 ] && [ "$(ls re | grep '^model-' | grep -vc -- "-of-$(printf %05d "$n")")" -eq 0 ] &&
   [ "$(loss_of re)" = "$a" ]; then ok "a sharded save removes model.safetensors and the shards of an earlier save"
else fail "sharded over sharded left: $(ls re | tr '\n' ' ')"; fi

# damaged sets
first=$(ls sh | grep '^model-' | head -n 1)
second=$(ls sh | grep '^model-' | sed -n 2p)
damage() {   # damage NAME PATTERN SCRIPT: a copy of sh changed by SCRIPT (run in it), then eval
    rm -rf bad && cp -r sh bad
    (cd bad && eval "$3")
    expect_error "$1" "$2" "$CLLA" eval --checkpoint bad --data tok.bin
}
damage "a missing shard is named" "shard .*$second.*(No such file|cannot open)" "rm $second"
damage "a tensor missing from the index is named" "model.norm.weight.* is not in index" \
    "python3 -c 'import json; p=\"model.safetensors.index.json\"; j=json.load(open(p)); del j[\"weight_map\"][\"model.norm.weight\"]; json.dump(j, open(p, \"w\"))'"
damage "a tensor mapped to the wrong shard is named" "model.embed_tokens.weight.*but it is in" \
    "python3 -c 'import json; p=\"model.safetensors.index.json\"; j=json.load(open(p)); j[\"weight_map\"][\"model.embed_tokens.weight\"]=\"$second\"; json.dump(j, open(p, \"w\"))'"
damage "a tensor in two shards is named" "is in two shards" \
    "cp $first model-99999-of-99999.safetensors && python3 -c 'import json; p=\"model.safetensors.index.json\"; j=json.load(open(p)); j[\"weight_map\"][\"extra\"]=\"model-99999-of-99999.safetensors\"; json.dump(j, open(p, \"w\"))'"
damage "a shard path outside the directory is refused, the tensor named" "tensor .model.norm.weight. must map to a file name beside the index" \
    "python3 -c 'import json; p=\"model.safetensors.index.json\"; j=json.load(open(p)); j[\"weight_map\"][\"model.norm.weight\"]=\"../one/model.safetensors\"; json.dump(j, open(p, \"w\"))'"
damage "a truncated shard is named" "$second" "head -c 200 $second > t && mv t $second"
damage "shards of two saves are refused" "another save" \
    "rm -rf ../other && '$CLLA' init --config ../m.json --out ../other --shard-size 10KB --set train.seed=9 > /dev/null && cp ../other/$second $second"
damage "both layouts in one directory are refused" "both model.safetensors and model.safetensors.index.json" \
    "cp ../one/model.safetensors ."
damage "an index that is not JSON is named" "model.safetensors.index.json.*JSON syntax error" \
    "echo '{\"weight_map\": ' > model.safetensors.index.json"
# read strictly, as a config is: a second weight_map (cJSON kept the first, Python's json the last)
# or text after the object
damage "an index with weight_map twice is refused" "model.safetensors.index.json.*duplicate key 'weight_map'" \
    "python3 -c 'import json; p=\"model.safetensors.index.json\"; t=open(p).read().rstrip(); open(p, \"w\").write(t[:-1] + \", \\\"weight_map\\\": {}}\")'"
damage "an index with text after it is refused" "model.safetensors.index.json.*text after the end of the JSON value" \
    "echo 'x' >> model.safetensors.index.json"
expect_error "a directory without weights is named" "without model.safetensors or model.safetensors.index.json" \
    "$CLLA" train --config m.json --quiet --set train.init_from="$WORK" --out r3
for bad in 1.5GB 0 5XB GB -1 99999999999999999999; do
    expect_error "--shard-size $bad is refused" "shard-size '$bad' is not a size" \
        "$CLLA" init --config m.json --out bss --shard-size "$bad"
done
[ -e bss ] && fail "a refused --shard-size left bss/ behind"

# ---------------------------------------------------------------- (b) config.json identity
cat > identity.py <<'EOF'
import json, sys
path, mtype, arch, dskey, gone = sys.argv[1:]
j = json.load(open(path))
keys = list(j)
assert keys[:2] == ["model_type", "architectures"], keys[:3]
assert j["model_type"] == mtype and j["architectures"] == [arch], (j["model_type"], j["architectures"])
assert isinstance(j.get("train"), dict) and "seq_len" in j["train"], "run settings under train"
if dskey: assert dskey in j and gone not in j, (dskey, gone, keys)
EOF
# same_config_but_out_dir A B: the two config.json texts are equal but for train.out_dir, which is
# each one's own directory (absolute): init --out names where the config it writes lives
same_config_but_out_dir() {
    python3 - "$1" "$2" <<'PYEOF'
import json, os, sys
texts = [open(p).read() for p in sys.argv[1:]]
outs = [json.loads(t)["train"]["out_dir"] for t in texts]
want = [os.path.abspath(os.path.dirname(p)) for p in sys.argv[1:]]
assert outs == want, (outs, want)
assert texts[0].replace(json.dumps(outs[0]), '""') == texts[1].replace(json.dumps(outs[1]), '""'), "configs differ"
PYEOF
}
# name | preset and knobs | model_type | a DeepSeek-V2 key written | the clla key it replaces
while IFS='|' read -r name knobs mtype dskey gone; do
    printf '{"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,\n "intermediate_size": 48, %s}\n' "$knobs" > "id_$name.json"
    if ! "$CLLA" init --config "id_$name.json" --out "id_$name" > /dev/null 2> id.err; then fail "init $name" id.err; continue; fi
    arch=LlamaForCausalLM; [ "$mtype" = clla ] && arch=CllaForCausalLM
    if python3 identity.py "id_$name/config.json" "$mtype" "$arch" "$dskey" "$gone" > py.log 2>&1 &&
       "$CLLA" init --config "id_$name/config.json" --out "rt_$name" > /dev/null 2> py.log &&
       same_config_but_out_dir "id_$name/config.json" "rt_$name/config.json" && cmp -s "id_$name/model.safetensors" "rt_$name/model.safetensors"; then
        ok "$name: config.json says $mtype, $arch${dskey:+, $dskey}; it reads back to the same config and weights"
    else fail "$name: config.json identity or round trip" py.log; fi
done <<'EOF'
mha|"attention": "mha"|llama||
gqa|"attention": "gqa", "num_key_value_heads": 2|llama||
gqa_vdim|"attention": "gqa", "num_key_value_heads": 2, "v_head_dim": 4|clla||
cla|"attention": "cla", "share_factor": 2|clla||
mla|"attention": "mla", "kv_lora_rank": 16, "qk_rope_head_dim": 4|clla|qk_nope_head_dim|head_dim
clla_quant|"attention": "clla_quant", "kv_lora_rank": 32, "qk_rope_head_dim": 4|clla|qk_nope_head_dim|head_dim
gqa_moe|"attention": "gqa", "num_key_value_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "first_k_dense_layers": 1|clla|first_k_dense_replace|first_k_dense_layers
EOF
# a checkpoint's config.json is written by the same function
if "$CLLA" train --config m.json --quiet --save-every 1 --out ck > ck.log 2>&1 &&
   python3 identity.py ck/checkpoints/step_00000002/config.json llama LlamaForCausalLM "" "" > py.log 2>&1; then
    ok "a checkpoint's config.json carries model_type and architectures too"
else cat ck.log >> py.log; fail "checkpoint config.json" py.log; fi

# an exported package also carries what HF's loaders read besides the shape: torch_dtype, and the
# tokenizer's <|endoftext|> as bos_token_id and eos_token_id (HF's defaults, 1 and 2, are other
# tokens); clla reads them back without a word
"$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out t300.tok "$SRC/tests/fixtures/english.jsonl" > pk.log 2>&1
eot=$("$CLLA" tokenizer encode --tokenizer t300.tok --allow-special --text '<|endoftext|>' 2>> pk.log)
printf '{"vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,\n "train": {"tokenizer": "%s"}}\n' "$WORK/t300.tok" > m300.json
if "$CLLA" init --config m300.json --out m300 >> pk.log 2>&1 && "$CLLA" export m300 --out pk300 --dtype bf16 >> pk.log 2>&1 &&
   python3 -c 'import json,sys; j=json.load(open("pk300/config.json")); e=int(sys.argv[1]); assert (j["torch_dtype"], j["bos_token_id"], j["eos_token_id"]) == ("bfloat16", e, e), j' "$eot" >> pk.log 2>&1 &&
   "$CLLA" generate --model pk300 --prompt the --max-new-tokens 1 > /dev/null 2> pkg.err && ! grep -q "ignoring keys" pkg.err; then
    ok "an exported package's config.json: torch_dtype bfloat16, bos/eos_token_id $eot (<|endoftext|>), read back silently"
else cat pkg.err >> pk.log 2> /dev/null; fail "package HF metadata" pk.log; fi

# ---------------------------------------------------------------- (c) directories and symlink loops
# Every command that reads a file, given a directory or a symlink loop: one line that says so
# (strerror's "Is a directory" / "Too many levels of symbolic links"), never a crash or an
# "out of memory" from the size a directory seeks to.
mkdir -p adir
ln -s loop_b loop_a
ln -s loop_a loop_b
printf 'some text for a tokenizer\n' > c.txt
"$CLLA" tokenizer train --vocab-size 270 --pattern gpt2 --out t.tok c.txt > /dev/null 2>&1 || fail "tokenizer train on c.txt"
for p in adir loop_a; do
    want="Is a directory"; [ "$p" = loop_a ] && want="Too many levels of symbolic links"
    expect_error "config $p" "$p.*$want" "$CLLA" info --config "$p"
    expect_error "tokenizer file $p" "$p.*$want" "$CLLA" tokenizer encode --tokenizer "$p" --text hi
    expect_error "encode --file $p" "$p.*$want" "$CLLA" tokenizer encode --tokenizer t.tok --file "$p"
    expect_error "corpus file $p" "$p.*$want" "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out x.tok "$p"
    expect_error "import-gpt2 --encoder $p" "$p.*$want" "$CLLA" tokenizer import-gpt2 --encoder "$p" --bpe "$p" --out x.tok
    iwant=$want; [ "$p" = adir ] && iwant="is a directory without model.safetensors"
    expect_error "train.init_from $p" "$p.*$iwant" "$CLLA" train --config m.json --quiet --set train.init_from="$WORK/$p" --out r_$p
done
expect_error "train.data symlink loop" "loop_a.*Too many levels of symbolic links" \
    "$CLLA" train --config m.json --quiet --set train.data="$WORK/loop_a" --out r_loop
expect_error "eval --data symlink loop" "loop_a.*Too many levels of symbolic links" \
    "$CLLA" eval --checkpoint one --data loop_a
expect_error "prep --verify symlink loop" "loop_a.*Too many levels of symbolic links" "$CLLA" prep --verify loop_a
mkdir -p shards_dir/x.bin
expect_error "a directory named like a shard" "x.bin" "$CLLA" prep --verify shards_dir
mkdir -p sh_dirshard && cp sh/config.json sh/model.safetensors.index.json sh/model-*.safetensors sh_dirshard/ && rm sh_dirshard/"$second" && mkdir sh_dirshard/"$second"
expect_error "a directory where a shard is expected" "$second.*Is a directory" "$CLLA" eval --checkpoint sh_dirshard --data tok.bin
[ -n "$(ls -d r_* 2> /dev/null)" ] && fail "a refused train left a run directory: $(ls -d r_*)"

# ---------------------------------------------------------------- (d) train.init_from's own config.json
# a model directory's config is the one inside it (without a trailing slash the parent's, or the
# current directory's, was read: here a config.json of the current directory that names another
# tokenizer would refuse the data, one of an unrelated shape would fail to parse)
mkdir -p idir && cp one/model.safetensors idir/ && sed 's/"rope_theta":[^,]*/"rope_theta": 500/' one/config.json > idir/config.json
echo '{"hello": 1}' > config.json
"$CLLA" train --config m.json --quiet --set train.init_from=idir --out r_idir > /dev/null 2> idir.err
rc=$?
rm -f config.json
[ "$rc" -eq 0 ] && grep -q "train.init_from: the config.json of its model (.*/idir/config.json) differs from this config in rope_theta (500 there, 10000 here)" idir.err &&
    ok "init_from a directory: its own config.json is read, and a differing rope_theta is said" || fail "init_from a directory: rc $rc" idir.err
rm -rf r_idir
# an HF config.json without a train section and a context below 256: train.seq_len defaults to it
sed 's/"max_position_embeddings":[^,]*/"max_position_embeddings": 32/' one/config.json | python3 -c 'import json,sys; c=json.load(sys.stdin); c.pop("train"); print(json.dumps(c))' > hf32.json
mkdir -p hf32 && cp hf32.json hf32/config.json && cp one/model.safetensors hf32/
"$CLLA" eval --checkpoint hf32 --data tok.bin --seq 16 --batch 2 --json > hf32.out 2> hf32.err && grep -q '"loss"' hf32.out &&
    ok "an HF config.json with max_position_embeddings 32 and no train section loads (seq_len defaults to 32)" || fail "max_position_embeddings 32" hf32.err
# HF's recomputed RoPE buffers in a weights file are not weights; a tied config beside an lm_head says what to do
python3 - one/model.safetensors inv.safetensors <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
end = max(v["data_offsets"][1] for k, v in hdr.items() if k != "__metadata__")
hdr["model.layers.0.self_attn.rotary_emb.inv_freq"] = {"dtype": "F32", "shape": [4], "data_offsets": [end, end + 16]}
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + data[:end] + b"\0" * 16)
PY
mkdir -p inv && cp one/config.json inv/ && mv inv.safetensors inv/model.safetensors
a=$(loss_of one | grep -o '"loss":[0-9.]*') b=$(loss_of inv | grep -o '"loss":[0-9.]*')
[ -n "$a" ] && [ "$a" = "$b" ] && ok "rotary_emb.inv_freq in a weights file is skipped ($b)" || fail "inv_freq: '$a' vs '$b'"
mkdir -p tied && cp one/model.safetensors tied/ && sed 's/"tie_word_embeddings":[^,]*/"tie_word_embeddings": true/' one/config.json > tied/config.json
expect_error "lm_head.weight with a tied config" "hold lm_head.weight, and the config ties the output head.*set tie_word_embeddings false" \
    "$CLLA" eval --checkpoint tied --data tok.bin

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
