#!/usr/bin/env bash
# launch/sweep (docs/SWEEPS.md) on two tiny configs (GQA, and CLLA-quant with MoE) for a few steps:
#  (a) two configs x two seeds to a token budget: results.csv has one row per run with the
#      expected columns, the losses of every finished run (LM loss: without MoE aux) and clla info's parameters and cache
#      bytes; results.md has the per-point table (mean and std over seeds); PNG and SVG plots;
#  (b) a run stopped mid-way (a wrapper adds --stop-at 3 to its first training, as a preemption
#      would stop it) is resumed from its checkpoint by the second invocation: its first metrics
#      lines are kept byte for byte, the steps continue, and every record equals an
#      uninterrupted run's; the finished runs are skipped (no training, metrics unchanged);
#  (c) without matplotlib the sweep still collects and says the plots were skipped;
#  (d) a grid point the config refuses is listed and skipped, the other points run, exit != 0;
#  (e) bad input, one line and nothing written: a grid key that is not a config key, an OUT
#      holding a different sweep, an empty --seeds, grid values equal as numbers, slurm values
#      that would break an #SBATCH line; one sweep at a time in an OUT, and a training a killed
#      sweep left running is neither removed nor started again;
#  (f) --launcher slurm writes one sbatch script per run and submits nothing without --submit;
#      with --submit (stand-ins for sbatch and squeue) each once, not again while it is queued;
#  (g) --launcher mpirun --ranks 2 trains through launch/run_single_node.sh (skipped with the
#      reason without mpirun or an MPI build);
#  (h) Ctrl-C: clla saves a checkpoint of its current step, the sweep exits 130.
# Needs CLLA, SRC and Debian's python3 (/usr/bin/python3, the tool's interpreter).
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"
PY=/usr/bin/python3
SWEEP=$SRC/launch/sweep
if [ ! -x "$PY" ]; then echo "skip: $PY not found (apt-get install python3)"; exit 77; fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_test_sweep.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1

PASS=0
FAIL=0
ok()   { PASS=$((PASS + 1)); echo "ok   $1"; }
fail() { FAIL=$((FAIL + 1)); echo "FAIL $1"; }
check() { if [ "$1" -eq 0 ]; then ok "$2"; else fail "$2"; fi; }   # check STATUS NAME
indent() { sed 's/^/    /' "$@"; }

# ---------------------------------------------------------------- setup
if ! "$CLLA" tokenizer train --vocab-size 300 --pattern gpt2 --out tok.tok "$SRC/tests/fixtures/english.jsonl" > setup.log 2>&1 ||
   ! "$CLLA" prep --tokenizer tok.tok --out shards --chunk-tokens 512 --val-fraction 0.1 --threads 1 \
       "$SRC/tests/fixtures/english.jsonl" >> setup.log 2>&1; then
    echo "FAIL making shards: $(tail -n 2 setup.log | tr '\n' ' ')"
    echo "0 passed, 1 failed"
    exit 1
fi
# One thread: on 2 shared cores a 40k-parameter model steps in ms with one, in 100s of ms with two.
TRAIN='"data": "shards/train", "val_data": "shards/val", "seq_len": 32, "micro_batch": 4, "max_steps": 100,
       "warmup_steps": 2, "lr": 1e-2, "min_lr": 1e-3, "seed": 7, "threads": 1, "log_every": 4, "val_batches": 2'
cat > gqa.json <<EOF
{"attention": "gqa", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
 "train": {$TRAIN}}
EOF
cat > clla.json <<EOF
{"attention": "clla_quant", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 2, "head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
 "intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
 "moe_aux_loss_coef": 0.01, "max_position_embeddings": 64, "train": {$TRAIN}}
EOF
# clla, logging every call; the first training of the run named STOP_RUN stops after step 3
# with a checkpoint, exactly as SIGTERM from a scheduler stops it (docs/CHECKPOINTS.md).
cat > wrap.sh <<'EOF'
#!/usr/bin/env bash
echo "$*" >> "$WRAP_LOG"
if [ "$1" = train ] && [[ "$*" == *"/runs/$STOP_RUN "* ]] && [ ! -e "$WRAP_LOG.stopped" ]; then
    touch "$WRAP_LOG.stopped"
    exec "$REAL" "$@" --stop-at 3
fi
exec "$REAL" "$@"
EOF
chmod +x wrap.sh
export REAL=$CLLA WRAP_LOG=$WORK/wrap.log STOP_RUN=clla__s2

# 1024 tokens at 4 x 32 tokens per step: 8 steps; checkpoints every 2.
A=(--out A --clla ./wrap.sh gqa.json clla.json --seeds 1,2 --tokens 1024 --save-every 2)
have_mpl=0
"$PY" -c 'import matplotlib' 2> /dev/null && have_mpl=1

# ---------------------------------------------------------------- (a) first invocation
"$SWEEP" "${A[@]}" > a1.out 2> a1.err
rc=$?
[ "$rc" -eq 1 ] && grep -q 'clla__s2: stopped before the end' a1.out && grep -q '1 run(s) not finished: clla__s2' a1.out
check $? "first invocation: 3 runs finish, clla__s2 is stopped at step 3 and reported, exit 1 (rc $rc)"
[ "$rc" -eq 1 ] || indent a1.out a1.err

expect_cols='run,point,config,seed,status,steps,max_steps,tokens,val_loss,train_loss,params_total,params_activated,params_embedding,cache_bytes_per_token,cache_fraction_of_mha'
[ "$(head -n 1 A/results.csv)" = "$expect_cols" ]
check $? "results.csv has the expected columns: $(head -n 1 A/results.csv)"

# Rows against clla info --json of each config, and the losses against each run's metrics.
"$CLLA" info --config gqa.json --json > gqa.info && "$CLLA" info --config clla.json --json > clla.info
"$PY" - > csv.check 2>&1 <<'PY'
import csv, json
rows = {r["run"]: r for r in csv.DictReader(open("A/results.csv"))}
want = {"gqa__s1": "finished", "gqa__s2": "finished", "clla__s1": "finished", "clla__s2": "unfinished"}
assert {k: v["status"] for k, v in rows.items()} == want, {k: v["status"] for k, v in rows.items()}
for name, r in rows.items():
    info = json.load(open(r["point"] + ".info"))
    assert r["seed"] == name[-1] and r["max_steps"] == "8", r
    assert int(r["params_total"]) == info["params_total"] and int(r["params_activated"]) == info["params_activated"], (r, info)
    assert int(r["cache_bytes_per_token"]) == info["kv_cache_bytes_per_token"]["model"], (r, info)
    recs = [json.loads(l) for l in open(f"A/runs/{name}/metrics.jsonl")]
    if r["status"] == "finished":
        assert r["steps"] == "8" and r["tokens"] == "1024", r
        # the LM loss: a MoE model's "loss" includes its aux loss, which validation leaves out
        lm = recs[-1]["lm_loss"] if r["point"] == "clla" else recs[-1]["loss"]
        assert r["point"] == "gqa" or recs[-1]["lm_loss"] != recs[-1]["loss"], recs[-1]
        assert float(r["val_loss"]) == recs[-1]["val_loss"] and float(r["train_loss"]) == lm, (r, recs[-1])
    else:
        assert r["steps"] == "3" and r["val_loss"] == "", r
print("rows ok:", ", ".join(f"{k} {v['status']} {v['val_loss'] or '-'}" for k, v in rows.items()))
PY
check $? "results.csv: one row per run, status, steps, losses from metrics.jsonl, parameters and cache bytes from clla info ($(tail -n 1 csv.check))"
grep -q '^rows ok' csv.check || indent csv.check

# ---------------------------------------------------------------- (b) second invocation: skip and resume
md5sum A/runs/gqa__s1/metrics.jsonl A/runs/gqa__s2/metrics.jsonl A/runs/clla__s1/metrics.jsonl > finished.md5
cp A/runs/clla__s2/metrics.jsonl stopped.jsonl
: > wrap.log
"$SWEEP" "${A[@]}" > a2.out 2> a2.err
rc=$?
check "$rc" "second invocation exits 0 (rc $rc)"
[ "$rc" -eq 0 ] || indent a2.out a2.err
[ "$(grep -c 'finished earlier: skipped' a2.out)" -eq 3 ]
check $? "second invocation prints that the 3 finished runs are skipped"
md5sum --quiet -c finished.md5 > /dev/null 2>&1
check $? "the finished runs' metrics.jsonl are unchanged"
[ "$(grep -c '^train ' wrap.log)" -eq 1 ] && grep -q '^train .*/runs/clla__s2 .*--resume auto' wrap.log
check $? "only the stopped run is trained again, with --resume auto ($(grep -c '^train ' wrap.log) training call(s))"
grep -q 'clla__s2: resuming from step_00000003' a2.out && grep -q 'resuming from .*step_00000003 at step 3' A/logs/clla__s2.log
check $? "the stopped run resumes from its step-3 checkpoint"
n=$(wc -l < stopped.jsonl)
[ "$n" -eq 3 ] && cmp -s stopped.jsonl <(head -n 3 A/runs/clla__s2/metrics.jsonl)
check $? "the first $n metrics lines are kept byte for byte (a restart would rewrite their times)"
[ "$(grep -o '"step":[0-9]*' A/runs/clla__s2/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 " ]
check $? "its steps continue: 1..8, each once"
# The same run without a stop: every record but the times is equal (CPU resume is bitwise).
"$CLLA" train --config clla.json --set train.seed=2 --set train.max_steps=8 --out ref --quiet 2> ref.err
notime() { sed -E 's/,"(ms|tokens_per_s)":[^,}]*//g' "$1"; }
cmp -s <(notime ref/metrics.jsonl) <(notime A/runs/clla__s2/metrics.jsonl)
check $? "the resumed run's records equal an uninterrupted run's"
grep -q '^clla__s2,clla,clla.json,2,finished,8,8,1024,' A/results.csv
check $? "results.csv now has clla__s2 finished"

# A trainer killed between its final weights and its config.json (written after them) has not
# finished: the next invocation resumes it, and clla writes the rest from the last checkpoint.
rm A/runs/gqa__s1/config.json
: > wrap.log
"$SWEEP" "${A[@]}" > b2.out 2> b2.err
rc=$?
[ "$rc" -eq 0 ] && grep -q '^train .*/runs/gqa__s1 .*--resume auto' wrap.log && [ -s A/runs/gqa__s1/config.json ] &&
    ! grep -q 'gqa__s1: finished earlier' b2.out
check $? "a run without its final config.json is resumed, not skipped, and gets it (rc $rc)"
# A trainer that exits non-zero is not done, whatever its files look like (a crash after the save)
printf '#!/usr/bin/env bash\n"$REAL" "$@" || exit\n[ "$1" != train ] || exit 3\n' > wrap_fail.sh
chmod +x wrap_fail.sh
"$SWEEP" --out B --clla ./wrap_fail.sh gqa.json --seeds 1 --tokens 256 > b3.out 2> b3.err
rc=$?
[ "$rc" -ne 0 ] && grep -q 'gqa__s1: FAILED (exit 3)' b3.out && ! grep -q 'gqa__s1: done' b3.out
check $? "a trainer's non-zero exit is reported as a failure, not 'done' (rc $rc)"

# results.md: the per-point table with both points over 2 seeds, and the per-run table.
grep -q '^| point | seeds | val loss | ± std |' A/results.md && grep -q '^| gqa | 2/2 | [0-9]' A/results.md &&
    grep -q '^| clla | 2/2 | [0-9]' A/results.md && [ "$(grep -c '^| [a-z]*__s[12] |' A/results.md)" -eq 4 ]
check $? "results.md has the per-point table (mean, std over 2 seeds) and 4 run rows"
"$PY" - > std.check 2>&1 <<'PY'
import csv, statistics
rows = [r for r in csv.DictReader(open("A/results.csv")) if r["point"] == "gqa"]
v = [float(r["val_loss"]) for r in rows]
line = [l for l in open("A/results.md") if l.startswith("| gqa | 2/2 |")][0].split("|")
assert abs(float(line[3]) - statistics.mean(v)) < 1e-4 and abs(float(line[4]) - statistics.stdev(v)) < 1e-4, (line, v)
print("gqa mean %.4f std %.4f" % (statistics.mean(v), statistics.stdev(v)))
PY
check $? "the gqa row's mean and std are those of its two seeds' val losses ($(tail -n 1 std.check))"

if [ "$have_mpl" -eq 1 ]; then
    bad=()
    for f in loss_vs_cache loss_curves; do
        [ -s "A/$f.png" ] && [ "$(head -c 4 "A/$f.png" | od -An -c | tr -d ' ')" = '211PNG' ] || bad+=("$f.png")
        [ -s "A/$f.svg" ] && grep -q '<svg' "A/$f.svg" || bad+=("$f.svg")
    done
    [ ${#bad[@]} -eq 0 ] && grep -q '^plots: ' a2.out
    check $? "PNG and SVG plots written and non-empty ${bad[*]}"
    grep -q '>gqa</text>' A/loss_vs_cache.svg && grep -q '>clla</text>' A/loss_vs_cache.svg &&
        grep -q '>clla</text>' A/loss_curves.svg
    check $? "the plots label their points (gqa, clla in the SVG text)"
    # a plot that cannot be written (here a directory where the SVG goes): said with the file,
    # its temporary removed, the summary still printed, exit 1 (the sweep stopped at the plot)
    cp -a A A_plot && rm A_plot/loss_vs_cache.svg && mkdir -p A_plot/loss_vs_cache.svg/keep
    "$SWEEP" --out A_plot --clla ./wrap.sh gqa.json clla.json --seeds 1,2 --tokens 1024 --save-every 2 --collect-only > p.out 2> p.err
    rc=$?
    [ "$rc" -eq 1 ] && grep -q "^plots not written: .*loss_vs_cache.svg" p.out && grep -q "^results: " p.out &&
        [ -z "$(ls A_plot | grep '\.tmp\.')" ] && [ -d A_plot/loss_vs_cache.svg/keep ]
    check $? "a plot that cannot be written: named, no temporary left, summary printed, exit 1 (rc $rc): $(grep 'not written' p.out | head -n 1)"
else
    echo "skip: plot checks: $PY cannot import matplotlib (bash scripts/setup.sh installs python3-matplotlib)"
fi

# ---------------------------------------------------------------- (c) no matplotlib
# -S leaves out site-packages and dist-packages, as on a machine without python3-matplotlib.
"$PY" -S "$SWEEP" "${A[@]}" --collect-only > c.out 2> c.err
rc=$?
[ "$rc" -eq 0 ] && grep -q '^plots skipped: matplotlib is not importable' c.out && [ -s A/results.csv ]
check $? "without matplotlib: results collected, 'plots skipped' said, exit 0 (rc $rc)"

# ---------------------------------------------------------------- (d) an invalid grid point
"$SWEEP" --out D --base gqa.json --grid num_key_value_heads=1,3,2 --max-steps 4 > d.out 2> d.err
rc=$?
[ "$rc" -eq 1 ] && grep -q 'invalid config point gqa__num_key_value_heads-3: .*num_key_value_heads = 3 does not divide' d.err &&
    grep -q '^skipped invalid config point gqa__num_key_value_heads-3' d.out &&
    [ "$(grep -c 'done in' d.out)" -eq 2 ] && [ "$(tail -n +2 D/results.csv | wc -l)" -eq 2 ] &&
    grep -q 'gqa__num_key_value_heads-3: ' D/results.md
check $? "an invalid grid point is reported, skipped (the other 2 run), listed at the end and in results.md, exit 1 (rc $rc)"
[ "$rc" -eq 1 ] || indent d.out d.err

# ---------------------------------------------------------------- (e) bad input
# expect_refusal NAME WANT OUTDIR -- CMD...: exit 2, one line on stderr containing WANT, and
# OUTDIR as it was before (absent, or every file unchanged).
snapshot() { if [ -e "$1" ]; then find "$1" -type f | sort | xargs md5sum; else echo absent; fi; }
expect_refusal() {
    local name=$1 want=$2 dir=$3
    shift 4
    snapshot "$dir" > before.snap
    "$@" > e.out 2> e.err
    local rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l < e.err)" -eq 1 ] && grep -q -- "^launch/sweep: error: .*$want" e.err &&
       cmp -s before.snap <(snapshot "$dir"); then
        ok "$name: $(cat e.err)"
    else
        fail "$name (rc $rc)"
        indent e.out e.err
    fi
}
expect_refusal "a grid key that is not a config key" "--grid num_key_valu_heads: not a config key" E1 -- \
    "$SWEEP" --out E1 --base gqa.json --grid num_key_valu_heads=1,2 --max-steps 4
expect_refusal "a --set key that is not a config key" "--set train.bogus: not a config key" E2 -- \
    "$SWEEP" --out E2 gqa.json --set train.bogus=1 --max-steps 4
expect_refusal "another sweep in the same OUT (a third seed)" "A holds a different sweep (seeds \[1, 2\] there, \[1, 2, 3\] asked)" A -- \
    "$SWEEP" --out A --clla ./wrap.sh gqa.json clla.json --seeds 1,2,3 --tokens 1024 --save-every 2
expect_refusal "another sweep in the same OUT (another grid)" "D holds a different sweep (grid" D -- \
    "$SWEEP" --out D --base gqa.json --grid num_key_value_heads=1,2 --max-steps 4
expect_refusal "an OUT that is no sweep" "is not empty and holds no sweep.json" shards -- \
    "$SWEEP" --out shards gqa.json --max-steps 4
expect_refusal "a seed list that is not numbers" "--seeds '1,x'" E3 -- \
    "$SWEEP" --out E3 gqa.json --seeds 1,x
expect_refusal "a --clla that is not an executable (not passed over for another binary)" "--clla ./no_such_clla: not an executable file" E4 -- \
    "$SWEEP" --out E4 --clla ./no_such_clla gqa.json --max-steps 4
mkdir -p E5 && echo '[]' > E5/sweep.json
expect_refusal "a sweep.json that is not a manifest (a list)" "E5/sweep.json is not a" E5 -- "$SWEEP" --out E5 gqa.json --max-steps 4
expect_refusal "an empty --seeds" "--seeds is empty" E6 -- "$SWEEP" --out E6 gqa.json --seeds "" --max-steps 4
expect_refusal "grid values that are the same number" "'0.001' and '1e-3' are the same value" E7 -- \
    "$SWEEP" --out E7 --base gqa.json --grid train.lr=0.001,1e-3 --max-steps 4
expect_refusal "a slurm --time with a line break" "--time .* holds a line break" E8 -- \
    "$SWEEP" --out E8 --launcher slurm gqa.json --max-steps 4 --time $'1:00\necho injected'
expect_refusal "a slurm --out with a space" "has white space in its path" 'E 9' -- "$SWEEP" --out 'E 9' --launcher slurm gqa.json --max-steps 4
expect_refusal "a seed clla cannot read exactly" "--seeds: 9007199254740993 is larger than 9007199254740992" E10 -- \
    "$SWEEP" --out E10 gqa.json --seeds 9007199254740993 --max-steps 4
expect_refusal "--max-steps past train.max_steps' range" "--max-steps 3000000000: train.max_steps is at most 2147483647" E11 -- \
    "$SWEEP" --out E11 gqa.json --max-steps 3000000000
expect_refusal "--save-every past clla train's range" "--save-every 99999999999: a checkpoint interval is at most 2147483647" E14 -- \
    "$SWEEP" --out E14 gqa.json --max-steps 4 --save-every 99999999999
expect_refusal "--tokens making more steps than train.max_steps holds" "--tokens 300000000000: .* more than train.max_steps" E12 -- \
    "$SWEEP" --out E12 gqa.json --tokens 300000000000
expect_refusal "train.metrics in --set" "train.metrics: every run of a sweep writes OUT/runs/NAME/metrics.jsonl" E13 -- \
    "$SWEEP" --out E13 gqa.json --set train.metrics=m.jsonl --max-steps 4
# a config's own train.metrics: each run still writes its own (every run's records went into one
# file outside OUT, and the sweep never saw a run finish); a null train section reads as absent,
# a whole 2.0 as 2, as clla reads them; an unknown key of the file is the file's, not --set's
python3 - gqa.json << 'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train"]["metrics"] = "shared_metrics.jsonl"; json.dump(c, open("met.json", "w"))
c["train"]["micro_batch"] = float(c["train"]["micro_batch"]); del c["train"]["metrics"]; json.dump(c, open("mbf.json", "w"))
c["train"] = None; json.dump(c, open("tnull.json", "w"))
c["hiden_size"] = 8; json.dump(c, open("unk.json", "w"))
PY
"$SWEEP" --out M met.json --seeds 1,2 --max-steps 2 --no-plots > m.out 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ ! -e shared_metrics.jsonl ] && [ "$(grep -c '"step":2' M/runs/met__s1/metrics.jsonl M/runs/met__s2/metrics.jsonl | grep -c ':1$')" -eq 2 ]
check $? "a config's train.metrics: every run writes its own metrics.jsonl in OUT (rc $rc)"
[ "$rc" -eq 0 ] || indent m.out
"$SWEEP" --out N1 mbf.json --tokens 100 --dry-run > n1.out 2>&1 && "$SWEEP" --out N2 tnull.json --set train.seq_len=16 --max-steps 2 --dry-run > n2.out 2>&1
check $? "a whole float micro_batch (2.0) and a null train section are read as clla reads them"
"$SWEEP" --out N3 unk.json --max-steps 2 --dry-run > n3.out 2>&1
[ $? -eq 1 ] && grep -q "invalid config point unk: unk.json: unknown key 'hiden_size'" n3.out && ! grep -q -- "--set hiden_size" n3.out
check $? "an unknown key in a config file: that point is invalid, and --set is not blamed ($(head -n 1 n3.out))"
# the budget follows clla's own reading of the run settings (clla info --json's "train"): no
# train.seq_len with max_position_embeddings 64 trains 64-token rows, so --tokens 2560 at micro
# batch 4 is 10 steps (the sweep's own default of 256 made 3); --set train.micro_batch=null is
# the default, 4 (the sweep called the point invalid)
python3 - gqa.json << 'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["train"]["seq_len"]; json.dump(c, open("noseq.json", "w"))
PY
"$SWEEP" --out S1 noseq.json --tokens 2560 --dry-run > s1.out 2>&1 &&
    "$SWEEP" --out S2 gqa.json --set train.micro_batch=null --tokens 1280 --dry-run > s2.out 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q -- "train.max_steps=10 " s1.out && grep -q -- "train.max_steps=10 " s2.out
check $? "--tokens with clla's seq_len and micro_batch defaults: 10 steps each (rc $rc: $(grep -o 'train.max_steps=[0-9]*' s1.out s2.out | tr '\n' ' '))"
# bad input refused before anything is written: JSON that clla refuses (NaN, a key twice), a
# device clla has not, run names longer than a file name holds
printf '{"attention": "gqa", "hidden_size": NaN}\n' > nan.json
expect_refusal "a config with NaN" "config 'nan.json' is not JSON: NaN" E14 -- "$SWEEP" --out E14 nan.json --max-steps 2
printf '{"attention": "gqa", "attention": "mha"}\n' > dup.json
expect_refusal "a config with a key twice" "key 'attention' appears twice" E15 -- "$SWEEP" --out E15 dup.json --max-steps 2
expect_refusal "an unknown --device" "invalid choice: 'tpu'" E16 -- "$SWEEP" --out E16 gqa.json --device tpu --max-steps 2
long=(); for k in lr min_lr weight_decay warmup_steps grad_clip beta1 beta2 eps seed log_every val_every val_batches \
                  save_every keep_checkpoints max_consecutive_skips dist_timeout_s; do long+=(--grid "train.$k=1"); done
expect_refusal "run names past a file name's length" "bytes, more than the 215 its files' names can hold" E17 -- \
    "$SWEEP" --out E17 gqa.json "${long[@]}" --max-steps 2
# one sweep at a time in an OUT: a second one, while the first runs, is refused (even one of the
# same definition: it would remove the first one's runs that have no checkpoint yet); a training
# a killed sweep left running is never removed nor started beside
"$SWEEP" --out L gqa.json --tokens 1000000 --no-plots > l1.out 2>&1 &
l1=$!
for ((i = 0; i < 200; i++)); do [ -s L/logs/gqa.log ] && break; sleep 0.05; done
"$SWEEP" --out L gqa.json --tokens 1000000 --no-plots > l2.out 2> l2.err
rc=$?
[ "$rc" -eq 2 ] && grep -q "another launch/sweep (process $l1) is running in L" l2.err
check $? "a second sweep in the same OUT while the first runs: refused (rc $rc: $(cat l2.err))"
kill -KILL "$l1"; wait "$l1" 2> /dev/null   # the sweep dies; its training (a session of its own) goes on
for ((i = 0; i < 200; i++)); do [ -e L/runs/gqa/train.lock ] && break; sleep 0.05; done
"$SWEEP" --out L gqa.json --tokens 1000000 --no-plots > l3.out 2>&1
grep -q "a training (process [0-9]*) is still running in L/runs/gqa: not started again" l3.out && [ -e L/runs/gqa/train.lock ]
check $? "a training a killed sweep left running: not removed, not started again ($(grep -m1 'still running' l3.out))"
pkill -TERM -f "train --config gqa.json --out $WORK/L/runs/gqa" 2> /dev/null
for ((i = 0; i < 200; i++)); do [ -e L/runs/gqa/train.lock ] || break; sleep 0.05; done

# ---------------------------------------------------------------- (f) slurm scripts
"$SWEEP" --out F --launcher slurm --ranks 2 --sbatch=--gpus-per-task=1 gqa.json --seeds 1,2 --max-steps 4 > f.out 2> f.err
rc=$?
s=F/slurm/gqa__s1.sbatch
[ "$rc" -eq 0 ] && [ "$(grep -c '^sbatch .*/F/slurm/gqa__s[12].sbatch$' f.out)" -eq 2 ] && bash -n "$s" &&
    grep -q '^#SBATCH --ntasks=2$' "$s" && grep -q '^#SBATCH --gpus-per-task=1$' "$s" &&
    grep -q '^srun .* train --config gqa.json --out [^ ]*/F/runs/gqa__s1 .*--set train.seed=1 --set train.max_steps=4 --set train.metrics= --resume auto' "$s" &&
    [ ! -e F/runs/gqa__s1 ]
check $? "--launcher slurm writes one sbatch script per run (ranks, extra #SBATCH lines, --resume auto), prints the sbatch commands, trains nothing (rc $rc)"
# the checkout's paths are written as shell words: read back as they are (a path holding $ or a
# backtick was expanded, or run, by the job's shell)
defaults=$(bash -c 'eval "$(grep -E "^(LAUNCH_DEFAULT|CLLA_DEFAULT)=" "$1")"; printf "%s|%s" "$LAUNCH_DEFAULT" "$CLLA_DEFAULT"' _ "$s")
[ "$defaults" = "$(cd "$SRC/launch" && pwd)|$CLLA" ] && grep -q '"${CLLA:-$CLLA_DEFAULT}" train' "$s" &&
    ok "the sbatch script names launch/ and clla as quoted shell words" || fail "sbatch defaults: '$defaults'"
[ "$rc" -eq 0 ] || indent f.out f.err
# --submit with stand-ins for sbatch and squeue: each script is submitted once; while squeue
# lists its job, the next --submit does not submit it again.
mkdir -p fakebin
cat > fakebin/sbatch <<'EOF'
#!/usr/bin/env bash
echo "$*" >> "$WORK/sbatch.log"; echo "$((1000 + $(wc -l < "$WORK/sbatch.log")));cluster"
EOF
cat > fakebin/squeue <<'EOF'
#!/usr/bin/env bash
echo PENDING
EOF
chmod +x fakebin/sbatch fakebin/squeue
F=(--out F --launcher slurm --ranks 2 --sbatch=--gpus-per-task=1 gqa.json --seeds 1,2 --max-steps 4 --submit)
WORK=$WORK PATH="$WORK/fakebin:$PATH" "$SWEEP" "${F[@]}" > f2.out 2> f2.err
rc2=$?
WORK=$WORK PATH="$WORK/fakebin:$PATH" "$SWEEP" "${F[@]}" > f3.out 2> f3.err
rc3=$?
[ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ] && [ "$(wc -l < sbatch.log)" -eq 2 ] && grep -q -- '--parsable .*/F/slurm/gqa__s1.sbatch' sbatch.log &&
    grep -q 'gqa__s2: submitted as job 1002;cluster' f2.out && [ "$(cat F/slurm/gqa__s2.jobid)" = 1002 ] &&
    grep -q 'gqa__s1: job 1001 is PENDING: not submitted again' f3.out
check $? "--submit submits each script once and not again while squeue lists its job (rc $rc2, $rc3)"
[ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ] || indent f2.out f2.err f3.out f3.err

# ---------------------------------------------------------------- (h) Ctrl-C
# SIGINT to the sweep reaches clla train once (it saves a checkpoint of its current step and
# exits 0); the sweep then collects, says so and exits 130. Two signals would kill clla at once.
"$SWEEP" --out H gqa.json --max-steps 100000 --save-every 100 --no-plots > h.out 2> h.err &
pid=$!
for _ in $(seq 200); do [ -d H/runs/gqa/checkpoints/step_00000100 ] && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 130 ] && grep -q '^interrupted: run the same command again to resume' h.out &&
    grep -q 'SIGINT received: saving a checkpoint' H/logs/gqa.log && grep -q '^gqa,gqa,gqa.json,7,unfinished,' H/results.csv &&
    [ "$(ls -d H/runs/gqa/checkpoints/step_* | tail -n 1)" = "H/runs/gqa/checkpoints/step_$(printf %08d "$(grep -c . H/runs/gqa/metrics.jsonl)")" ]
check $? "Ctrl-C: clla saves its current step, the sweep collects and exits 130 (rc $rc)"
[ "$rc" -eq 130 ] || indent h.out h.err H/logs/gqa.log

# ---------------------------------------------------------------- (g) mpirun
# Two ranks through launch/run_single_node.sh: the global batch doubles, so --tokens 1536 is
# 6 steps of 2 x 128 tokens.
if ! command -v mpirun > /dev/null; then
    echo "skip: --launcher mpirun: mpirun not found (apt-get install openmpi-bin)"
elif ! ldd "$CLLA" 2> /dev/null | grep -q libmpi; then
    echo "skip: --launcher mpirun: $CLLA was built without MPI"
else
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
        "$SWEEP" --out G --launcher mpirun --ranks 2 gqa.json --tokens 1536 --no-plots > g.out 2> g.err
    rc=$?
    [ "$rc" -eq 0 ] && grep -Eq "run_single_node.sh'? 2 gqa.json" G/logs/gqa.log && grep -q '^gqa,gqa,gqa.json,7,finished,6,6,1536,' G/results.csv
    check $? "--launcher mpirun --ranks 2 trains through launch/run_single_node.sh, 6 steps of 256 tokens (rc $rc)"
    [ "$rc" -eq 0 ] || indent g.out g.err G/logs/gqa.log
    # Ctrl-C reaches the ranks, not mpirun (which passed it on and killed the ranks 2 s later, in
    # the middle of a save slowed here to 3 x 1.5 s: only a .tmp.step_* was left)
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
        CLLA_TEST_CKPT_PAUSE_MS=1500 "$SWEEP" --out GI --launcher mpirun --ranks 2 gqa.json --max-steps 100000 --save-every 100000 \
        --no-plots > gi.out 2> gi.err &
    pid=$!
    for _ in $(seq 300); do [ "$(grep -c . GI/runs/gqa/metrics.jsonl 2> /dev/null)" -ge 3 ] 2> /dev/null && break; sleep 0.1; done
    kill -INT "$pid"
    wait "$pid"
    rc=$?
    n=$(grep -c . GI/runs/gqa/metrics.jsonl 2> /dev/null)
    [ "$rc" -eq 130 ] && [ -d "GI/runs/gqa/checkpoints/step_$(printf %08d "$n")" ] && ! ls -d GI/runs/gqa/checkpoints/.tmp.* > /dev/null 2>&1
    check $? "--launcher mpirun, Ctrl-C: the ranks save the step they were on (step $n) and the sweep exits 130 (rc $rc)"
    [ "$rc" -eq 130 ] || indent gi.out gi.err GI/logs/gqa.log
    # a failed run is reported with clla's error, not the banner mpirun prints after it (data
    # that is not there: clla info, which checks the points, does not open it)
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
        "$SWEEP" --out GF --launcher mpirun --ranks 2 gqa.json --max-steps 2 --set train.data="$WORK/no_such_shards" --no-plots > gf.out 2> gf.err
    rc=$?
    [ "$rc" -ne 0 ] && grep -q 'FAILED (exit [0-9]*): clla: error: .*no_such_shards' gf.out
    check $? "--launcher mpirun, a run that fails: reported with clla's error line (rc $rc: $(grep -m1 FAILED gf.out))"
    # a global batch the ranks do not divide is a point refused before anything runs (every run
    # failed at its start: clla info, which checks the points, reads one rank)
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
        "$SWEEP" --out GB --launcher mpirun --ranks 2 gqa.json --max-steps 2 --set train.global_batch_tokens=384 --no-plots > gb.out 2> gb.err
    rc=$?
    [ "$rc" -ne 0 ] && grep -q 'invalid config point gqa: train.global_batch_tokens = 384 is not a multiple of micro_batch \* seq_len \* ranks = 4 \* 32 \* 2 = 256' gb.err &&
        ! ls GB/runs/gqa/metrics.jsonl > /dev/null 2>&1
    check $? "--launcher mpirun --ranks 2, a global batch 2 ranks do not divide: the point refused before it runs (rc $rc: $(head -n 1 gb.err))"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
