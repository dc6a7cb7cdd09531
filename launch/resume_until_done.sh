#!/usr/bin/env bash
# Runs a training command again and again with --resume auto until it finishes: preemptions,
# a dead node or a killed rank cost the steps since the last checkpoint, not the run.
#   launch/resume_until_done.sh OUT_DIR launch/run_single_node.sh 8 CONFIG --out OUT_DIR --save-every 200
# Done means the command exited 0 and OUT_DIR holds the final model of its newest checkpoint:
# model.safetensors (or its index) and a config.json whose train.max_steps is that checkpoint's
# step (clla writes them after the last step; a run continued past an earlier end keeps the
# earlier end's until it reaches its own, so the files alone do not say it). Every attempt runs
# the command: one that is finished says so and exits 0 at once.
# Ctrl-C or SIGTERM: the command (in a session of its own, so that the terminal's Ctrl-C does not
# reach it a second time) gets one SIGTERM, saves a checkpoint and stops, and this script stops
# with it instead of restarting. Under mpirun the ranks get the signal, not mpirun.
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
        '' | *[!0-9]* | 0?*) echo "resume_until_done: ${pair#*:} '${!v}' is not a whole number (digits, no leading zero)" >&2; exit 2 ;;
    esac
    # within bash's arithmetic (a longer number is an error of [ -ge ], not a count)
    val=${!v}
    [ "${#val}" -le 9 ] || { echo "resume_until_done: ${pair#*:} $val is too large: give at most 999999999" >&2; exit 2; }
done
[ "$MAX" -ge 1 ] && [ "$STALLS" -ge 1 ] || { echo "resume_until_done: CLLA_MAX_ATTEMPTS and CLLA_MAX_STALLS must be at least 1" >&2; exit 2; }
newest() { ls -- "$OUT/checkpoints" 2> /dev/null | grep '^step_[0-9]*$' | sort | tail -n 1; }
# 0 when OUT holds the final model of the newest checkpoint (see the header)
finished() {
    local ck step max
    ck=$(newest)
    [ -n "$ck" ] && { [ -f "$OUT/model.safetensors" ] || [ -f "$OUT/model.safetensors.index.json" ]; } || return 1
    step=$((10#${ck#step_}))
    max=$(grep -o '"max_steps":[[:space:]]*[0-9]*' "$OUT/config.json" 2> /dev/null | grep -o '[0-9]*$')
    [ -n "$max" ] && [ "$max" -eq "$step" ]
}
stop="" child=""
# SIGTERM to the command's processes (its session, made by setsid below), but not to an MPI
# launcher among them: mpirun passes a SIGTERM on only after about two seconds and kills the
# ranks right after, which cuts a longer save off (docs/DISTRIBUTED.md, "Signal the ranks, not
# mpirun"); a signal to one rank is enough. A plain command gets the signal itself.
signal_command() {
    local p comm sent=0
    for p in $(pgrep -s "$child" 2> /dev/null); do
        comm=$(cat "/proc/$p/comm" 2> /dev/null) || continue
        case $comm in mpirun | mpiexec | orterun | prterun | prte | orted | prted | srun | bash | sh | dash) continue ;; esac
        kill -TERM "$p" 2> /dev/null && sent=1
    done
    [ "$sent" = 1 ] || kill -TERM "$child" 2> /dev/null
}
forward() {
    [ -n "$stop" ] && return   # one signal for the command: a second one would end it before its save
    stop=$1
    [ -n "$child" ] && signal_command
}
trap 'forward INT' INT
trap 'forward TERM' TERM
stalled=0
for ((attempt = 1; attempt <= MAX; attempt++)); do
    before=$(newest)
    echo "resume_until_done: attempt $attempt: $*  --resume auto"
    setsid "$@" --resume auto &
    child=$!
    # wait returns early when a trapped signal comes: wait again until the command has ended
    while :; do
        wait "$child"
        rc=$?
        kill -0 "$child" 2> /dev/null || break
    done
    child=""
    if [ "$rc" -eq 0 ] && finished; then echo "resume_until_done: finished after $attempt attempt(s)"; exit 0; fi
    if [ -n "$stop" ]; then
        echo "resume_until_done: SIG$stop: stopped after attempt $attempt (exit $rc); run it again to continue from the newest checkpoint" >&2
        [ "$stop" = INT ] && exit 130
        exit 143
    fi
    if [ "$(newest)" = "$before" ]; then stalled=$((stalled + 1)); else stalled=0; fi
    if [ "$stalled" -ge "$STALLS" ]; then
        echo "resume_until_done: $stalled attempts in a row saved no new checkpoint (the last exit $rc): giving up; see the error above" >&2
        exit 1
    fi
    echo "resume_until_done: exit $rc before the end; restarting from the newest checkpoint in $SLEEP s"
    sleep "$SLEEP" &
    wait $! 2> /dev/null
    if [ -n "$stop" ]; then echo "resume_until_done: SIG$stop: stopped before attempt $((attempt + 1))" >&2; exit 1; fi
done
echo "resume_until_done: gave up after $MAX attempts" >&2
exit 1
