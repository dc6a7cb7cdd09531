#!/usr/bin/env bash
# Runs a training command again and again with --resume auto until it finishes: preemptions,
# a dead node or a killed rank cost the steps since the last checkpoint, not the run.
#   launch/resume_until_done.sh OUT_DIR launch/run_single_node.sh 8 CONFIG --out OUT_DIR --save-every 200
# Done means OUT_DIR/model.safetensors exists (clla writes it only after the last step).
# CLLA_MAX_ATTEMPTS (default 100) bounds the restarts; CLLA_RETRY_SLEEP (10 s) spaces them;
# CLLA_MAX_STALLS (default 3) ends it after that many attempts in a row that saved no new
# checkpoint: a bad config or a missing file fails the same way every time, and a hundred
# retries of it would only hide the message.
set -u
usage() { echo "usage: launch/resume_until_done.sh OUT_DIR COMMAND [ARGS...]   (COMMAND gets --resume auto appended)" >&2; exit 2; }
[ $# -ge 2 ] || usage
OUT=$1; shift
MAX=${CLLA_MAX_ATTEMPTS:-100} SLEEP=${CLLA_RETRY_SLEEP:-10} STALLS=${CLLA_MAX_STALLS:-3}
for pair in MAX:CLLA_MAX_ATTEMPTS SLEEP:CLLA_RETRY_SLEEP STALLS:CLLA_MAX_STALLS; do
    v=${pair%%:*}
    case ${!v} in
        '' | *[!0-9]*) echo "resume_until_done: ${pair#*:} '${!v}' is not a whole number" >&2; exit 2 ;;
    esac
done
[ "$MAX" -ge 1 ] && [ "$STALLS" -ge 1 ] || { echo "resume_until_done: CLLA_MAX_ATTEMPTS and CLLA_MAX_STALLS must be at least 1" >&2; exit 2; }
newest() { ls "$OUT/checkpoints" 2> /dev/null | grep '^step_[0-9]*$' | sort | tail -n 1; }
stalled=0
for ((attempt = 1; attempt <= MAX; attempt++)); do
    if [ -f "$OUT/model.safetensors" ]; then echo "resume_until_done: $OUT is finished"; exit 0; fi
    before=$(newest)
    echo "resume_until_done: attempt $attempt: $*  --resume auto"
    "$@" --resume auto
    rc=$?
    if [ -f "$OUT/model.safetensors" ]; then echo "resume_until_done: finished after $attempt attempt(s)"; exit 0; fi
    if [ "$(newest)" = "$before" ]; then stalled=$((stalled + 1)); else stalled=0; fi
    if [ "$stalled" -ge "$STALLS" ]; then
        echo "resume_until_done: $stalled attempts in a row saved no new checkpoint (the last exit $rc): giving up; see the error above" >&2
        exit 1
    fi
    echo "resume_until_done: exit $rc before the end; restarting from the newest checkpoint in $SLEEP s"
    sleep "$SLEEP"
done
echo "resume_until_done: gave up after $MAX attempts" >&2
exit 1
