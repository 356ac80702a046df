#!/usr/bin/env bash
# A lost replica loses nothing: when a process that dies is a replica of a
# stage with another replica alive, the state the run trained still lives in
# full (replicas hold the same weights, moments and batch-norm statistics).
# Every live stage puts its state back to the end of the last finished step
# (stages/worker.c hold), the coordinator checkpoints it, the lowest replica
# alive writing the stage's file (replica 1 when replica 0 died), and:
#  - with train.max_restarts, the restart starts from that step, though no
#    checkpoint was due (ckpt_every 100 in a 60-step run), and the run ends on
#    the bits of one never interrupted (max_abs_diff=0), each step once in
#    metrics.jsonl;
#  - without, the run stops naming the dead replica, says what is kept, and
#    resumed from it ends on the same bits;
#  - with a background checkpoint every step, replica 0 (its stage's writer)
#    killed: no checkpoint is published without its file, all verify;
#  - a replica stopped (SIGSTOP) is named by the watchdog, SIGKILLed, and the
#    run goes on from the step its sibling holds, as if it had died;
#  - a dead stage without a sibling replica keeps nothing (it restarts from
#    the last checkpoint, as before);
#  - nothing is left behind.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 320 5
tiny_plan "name: lost, steps: 60, seed: 9" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  1 "batch: 32, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 2 }, eval_every: 0, ckpt_every: 100, max_restarts: 1" \
  "hosts: [ { name: localhost, devices: [cpu, cpu, cpu, cpu] } ]" \
  "stages: { image: { replicas: 2 } }"
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/ref" >"$W/ref.log" 2>&1 \
  || { fail "the run never interrupted"; tail -3 "$W/ref.log"; }

# lose VICTIM OUT [ARG...]: launches the plan into OUT, sends process VICTIM
# ("image.0/1") SIG (KILL unless set) once step 5 is in metrics.jsonl, waits
# for the run; rc in RC, its pid in VPID, the step the metrics had reached at
# the signal in AT.
lose() {
  local victim=$1 out=$2 cpid
  shift 2
  "$BIN" launch "$W/plan.yaml" --out "$out" "$@" >"$out.log" 2>&1 &
  cpid=$!
  wait_step "$out/metrics.jsonl" 5 || fail "$victim: no step 5"
  VPID=$(grep -o "started $victim (pid [0-9]*)" "$out.log" | grep -o '[0-9]*)$' | tr -d ')')
  AT=$(last_step "$out/metrics.jsonl")
  kill -"${SIG:-KILL}" "$VPID"
  wait $cpid
  RC=$?
}
# kept_from LOG: the step the restart started from ("relaunching every stage from step K").
kept_from() { grep -o 'relaunching every stage from step [0-9]*' "$1" | head -1 | grep -o '[0-9]*$'; }

for victim in image.0/1 image.0/0; do
  R=$W/restart_${victim%/*}_${victim#*/}
  lose "$victim" "$R"
  k=$(kept_from "$R.log")
  [ "$RC" = 0 ] && grep -q "stage $victim (pid [0-9]*) died" "$R.log" \
    && grep -q "keeping what was trained: checkpointing step $k from the replicas left" "$R.log" \
    && [ "${k:-0}" -ge "$AT" ] && [ "$k" -ge 5 ] \
    && ok "$victim killed after step $AT: step $k kept, the restart starts there (not step 0)" \
    || { fail "$victim killed after step $AT: rc $RC, restart from '${k:-}'"; grep -E "keep|relaunch|warn|error" "$R.log" | head -5; }
  steps_once "$R/metrics.jsonl" 60 && same_ckpt "$R" "$W/ref" \
    && ok "$victim: the restarted run = never interrupted (max_abs_diff=0), each step once" \
    || fail "$victim: restarted run differs or its steps repeat"
done

# Background checkpoints every step (ckpt_async): replica 0, the writer of its stage's
# files, dies with one in flight or just asked for; that one is never published
# incomplete, the step held is written by replica 1, and every checkpoint left verifies.
R=$W/async
lose image.0/0 "$R" --set train.ckpt_every=1 --set train.ckpt_async=true
k=$(kept_from "$R.log")
bad=0
for d in "$R"/ckpt/step_*; do
  "$BIN" ckpt verify "$d" >/dev/null 2>&1 || bad=$((bad + 1))
done
[ "$RC" = 0 ] && [ "${k:-0}" -ge "$AT" ] && [ $bad = 0 ] && steps_once "$R/metrics.jsonl" 60 \
  && same_ckpt "$R" "$W/ref" \
  && ok "background checkpoints: replica 0 killed after step $AT, restart from $k, every checkpoint whole, = never interrupted" \
  || { fail "background checkpoints: rc $RC, restart from '${k:-}', $bad bad checkpoints"; grep -E "keep|relaunch|warn" "$R.log" | head -5; }

# Without restarts: the run stops, names the dead replica, keeps the step.
R=$W/norestart
lose image.0/0 "$R" --set train.max_restarts=0
k=$(grep -o 'what was trained is kept: step [0-9]*' "$R.log" | grep -o '[0-9]*$')
[ "$RC" != 0 ] && grep -q "stage image.0/0 (pid [0-9]*) died" "$R.log" && [ "${k:-0}" -ge "$AT" ] \
  && [ "$(readlink "$R/ckpt/latest")" = "$(printf 'step_%07d' "$k")" ] && steps_once "$R/metrics.jsonl" "$k" \
  && ok "no restarts: stops naming the dead replica, keeps step $k (killed after $AT)" \
  || { fail "no restarts: rc $RC, kept '${k:-}', latest '$(readlink "$R/ckpt/latest")'"; tail -3 "$R.log"; }
"$BIN" launch "$R/plan.json" --resume "$R" >"$R.resumed.log" 2>&1 && steps_once "$R/metrics.jsonl" 60 \
  && same_ckpt "$R" "$W/ref" && ok "no restarts: resumed from step $k = never interrupted (max_abs_diff=0)" \
  || { fail "no restarts: resumed"; tail -3 "$R.resumed.log"; }

# A stalled replica (SIGSTOP; train.stall_timeout 3): the watchdog names it, it is
# SIGKILLed (its sibling holds the same state), and the run goes on from the step held.
R=$W/stall
SIG=STOP lose image.0/1 "$R" --set train.stall_timeout=3
k=$(kept_from "$R.log")
[ "$RC" = 0 ] && grep -q "watchdog: stage image.0/1 (pid $VPID) is stopped" "$R.log" \
  && grep -q "stopping the stalled replica image.0/1" "$R.log" && [ "${k:-0}" -ge "$AT" ] \
  && steps_once "$R/metrics.jsonl" 60 && same_ckpt "$R" "$W/ref" \
  && ok "a stalled replica (stopped after step $AT): named, stopped, step $k kept and restarted from, = never interrupted" \
  || { fail "stalled replica: rc $RC, restart from '${k:-}'"; grep -E "watchdog|keep|relaunch|warn" "$R.log" | head -5; }

# A stage with no replica left: nothing to keep; the restart starts from the start.
R=$W/text
lose text.0/0 "$R"
[ "$RC" = 0 ] && [ "$(kept_from "$R.log")" = 0 ] && ! grep -q "keeping what was trained" "$R.log" \
  && steps_once "$R/metrics.jsonl" 60 && same_ckpt "$R" "$W/ref" \
  && ok "text killed (no sibling replica): nothing kept, restarted from step 0, = never interrupted" \
  || { fail "text killed: rc $RC, restart from '$(kept_from "$R.log")'"; grep -E "keep|relaunch" "$R.log" | head -3; }
left_behind "replica lost" "$W"/restart_*.log "$W/norestart.log" "$W/text.log" "$W/stall.log" \
  "$W/async.log"
finish
