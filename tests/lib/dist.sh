# Shared by the data-parallel tests (sourced, not run; tests/test_dist.sh,
# tests/nccl_emu/test_nccl_emu.sh). Expects CLLA (a clla binary with MPI) and SRC. Skips (77)
# without mpirun or MPI; makes a work directory (WORK, removed at exit) with token shards,
# dense.json (GQA) and moe.json (CLLA-quant + MoE) on 4 micro-batches per step, and defines
# ok/fail counters, run, records, loss_rel, weights_rel and same_curve.
if ! command -v mpirun > /dev/null; then echo "skip: mpirun not found (apt-get install openmpi-bin)"; exit 77; fi
if ! ldd "$CLLA" 2> /dev/null | grep -q 'libmpi'; then
    echo "skip: $CLLA was built without MPI (configure with -DCLLA_MPI=ON and libopenmpi-dev installed)"
    exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_test_dist.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1

PASS=0
FAIL=0
ok()   { PASS=$((PASS + 1)); echo "ok   $1"; }
fail() { FAIL=$((FAIL + 1)); echo "FAIL $1"; }

# One thread per rank; ranks that wait yield the core (4 ranks share 2 cores here).
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
run_with() {   # run_with BINARY NP OUT ARGS...: clla train under mpirun (NP 1: without mpirun, as users do)
    local bin=$1 np=$2 out=$3
    shift 3
    if [ "$np" = 1 ]; then "$bin" train --out "$out" --quiet "$@" 2> "$out.err"
    else timeout 120 "${MPIRUN[@]}" -np "$np" "$bin" train --out "$out" --quiet "$@" > "$out.err" 2>&1; fi
}
run() { run_with "$CLLA" "$@"; }

# Shards (the plain token file gives every rank the same batches and is refused).
if ! "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out small.tok "$SRC/tests/fixtures/english.jsonl" > tok.log 2>&1 ||
   ! "$CLLA" prep --tokenizer small.tok --out shards --chunk-tokens 512 --val-fraction 0 \
       "$SRC/tests/fixtures/english.jsonl" > prep.log 2>&1; then
    echo "FAIL making shards: $(tail -n 1 tok.log prep.log | tr '\n' ' ')"
    echo "0 passed, 1 failed"
    exit 1
fi

# 4 micro-batches of B = 2 rows of T = 32 per optimizer step, whatever the number of ranks.
TRAIN='"data": "shards/train", "seq_len": 32, "micro_batch": 2, "global_batch_tokens": 256, "warmup_steps": 2,
       "lr": 3e-3, "min_lr": 3e-4, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 11, "log_every": 1000, "threads": 1'
cat > dense.json <<EOF
{"attention": "gqa", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
 "train": {"max_steps": 8, $TRAIN}}
EOF
cat > moe.json <<EOF
{"attention": "clla_quant", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 3,
 "num_attention_heads": 2, "head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
 "intermediate_size": 64, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
 "moe_intermediate_size": 32, "first_k_dense_layers": 1, "moe_aux_loss_coef": 0.01, "moe_z_loss_coef": 0.001,
 "moe_capacity_factor": 1.25, "max_position_embeddings": 64,
 "train": {"max_steps": 8, $TRAIN}}
EOF

# Per-step values without timing fields.
records() { sed -E 's/,"(ms|tokens_per_s|comm_ms)":[^,}]*//g' "$1/metrics.jsonl"; }
# Largest relative difference of "loss" over the steps of two runs (awk: no Python needed).
loss_rel() {
    paste -d' ' <(grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2) \
                <(grep -o '"loss":[^,]*' "$2/metrics.jsonl" | cut -d: -f2) |
        awk 'BEGIN { m = 0; n = 0 } NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1;
             r = s > 0 ? d / s : d; if (r > m) m = r } NF != 2 { m = 1e9 } END { if (n == 0) m = 1e9; printf "%.3g", m }'
}
# Relative L2 difference of two safetensors files' float data (bit-equal files short-cut).
weights_rel() {
    if cmp -s "$1" "$2"; then echo 0; return; fi
    python3 - "$1" "$2" <<'PY' 2> /dev/null || echo 1e9
import json, struct, sys, math
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: struct.unpack('<%df' % ((v['data_offsets'][1] - v['data_offsets'][0]) // 4),
            d[v['data_offsets'][0]:v['data_offsets'][1]]) for k, v in h.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
num = sum((x - y) ** 2 for k in a for x, y in zip(a[k], b[k])); den = sum(x * x for k in a for x in a[k])
print('%.3g' % (math.sqrt(num / den) if set(a) == set(b) else 1e9))
PY
}
# same_bits REF RUN: RUN finished, and its every step's record and its final weights equal REF's
same_bits() {
    [ -s "$2/model.safetensors" ] && cmp -s <(records "$1") <(records "$2") && cmp -s "$1/model.safetensors" "$2/model.safetensors"
}
# close REF RUN LIMIT: RUN finished and its loss is within LIMIT (relative, every step) of REF's;
# leaves the difference in LR
close() {
    LR=$(loss_rel "$1" "$2")
    [ -s "$2/model.safetensors" ] && awk -v l="$LR" -v m="$3" 'BEGIN { exit !(l <= m) }'
}
same_curve() {   # same_curve NAME REF RUN
    local name=$1 a=$2 b=$3 lr wr
    if [ ! -s "$a/metrics.jsonl" ] || [ ! -s "$b/metrics.jsonl" ] || [ ! -s "$b/model.safetensors" ]; then
        fail "$name: run missing: $(tail -n 3 "$b.err" 2> /dev/null | tr '\n' ' ')"
        return
    fi
    lr=$(loss_rel "$a" "$b")
    wr=$(weights_rel "$a/model.safetensors" "$b/model.safetensors")
    if awk -v l="$lr" -v w="$wr" 'BEGIN { exit !(l <= 1e-6 && w <= 1e-6) }'; then
        local exact="within 1e-6"
        cmp -s <(records "$a") <(records "$b") && cmp -s "$a/model.safetensors" "$b/model.safetensors" && exact="bit for bit"
        ok "$name: $(wc -l < "$b/metrics.jsonl") steps, loss rel diff $lr, weights rel diff $wr ($exact)"
    else
        fail "$name: loss rel diff $lr, weights rel diff $wr (limit 1e-6)"
    fi
}

