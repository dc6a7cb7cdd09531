#!/usr/bin/env bash
# Runs a training command again and again with --resume auto until it finishes: preemptions,
# a dead node or a killed rank cost the steps since the last checkpoint, not the run.
#   launch/resume_until_done.sh OUT_DIR launch/run_single_node.sh 8 CONFIG --out OUT_DIR --save-every 200
# Done means OUT_DIR/model.safetensors exists (clla writes it only after the last step).
# CLLA_MAX_ATTEMPTS (default 100) bounds the restarts; CLLA_RETRY_SLEEP (10 s) spaces them.
set -u
OUT=$1; shift
MAX=${CLLA_MAX_ATTEMPTS:-100}
for ((attempt = 1; attempt <= MAX; attempt++)); do
    if [ -f "$OUT/model.safetensors" ]; then echo "resume_until_done: $OUT is finished"; exit 0; fi
    echo "resume_until_done: attempt $attempt: $*  --resume auto"
    "$@" --resume auto
    rc=$?
    if [ -f "$OUT/model.safetensors" ]; then echo "resume_until_done: finished after $attempt attempt(s)"; exit 0; fi
    echo "resume_until_done: exit $rc before the end; restarting from the newest checkpoint in ${CLLA_RETRY_SLEEP:-10} s"
    sleep "${CLLA_RETRY_SLEEP:-10}"
done
echo "resume_until_done: gave up after $MAX attempts" >&2
exit 1
