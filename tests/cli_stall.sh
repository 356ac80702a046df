#!/usr/bin/env bash
# A stalled stage is named, not waited on for ever: SIGSTOP one stage process
# and the coordinator's watchdog (train.stall_timeout) names it within the
# timeout and stops the job, leaving nothing behind; with train.max_restarts
# it relaunches from the latest checkpoint and finishes instead. An evaluation
# longer than the timeout is not a stall.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 400 4
tiny_plan "name: st, steps: 100000, seed: 3" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 0, ckpt_every: 5, stall_timeout: 3"
stage_pid() { grep -o "started $2 (pid [0-9]*)" "$1" | tail -1 | grep -o '[0-9]*)$' | tr -d ')'; }

# --- stop: the stopped stage is named within the timeout ----------------------------------
for victim in text.0/0 fusion/0; do
  name=stop_${victim%%/*}
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" >"$W/$name.log" 2>&1 &
  cpid=$!
  wait_step "$W/$name/metrics.jsonl" 3 || fail "$name: no step 3"
  vpid=$(stage_pid "$W/$name.log" "$victim")
  kill -STOP "$vpid"; t0=$(date +%s.%N)
  for _ in $(seq 300); do kill -0 $cpid 2>/dev/null || break; sleep 0.1; done
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  if kill -0 $cpid 2>/dev/null; then
    fail "$name: still running ${dt}s after SIGSTOP to $victim"; kill -CONT "$vpid"; kill -KILL $cpid
  fi
  wait $cpid; rc=$?
  if [ $rc -ne 0 ] && grep -q "watchdog: stage $victim (pid $vpid) is stopped" "$W/$name.log" \
     && awk -v d="$dt" 'BEGIN{exit !(d < 10)}'; then ok "SIGSTOP $victim: named after ${dt}s (stall_timeout 3), rc=$rc"
  else fail "SIGSTOP $victim: rc=$rc after ${dt}s"; tail -3 "$W/$name.log" | sed 's/^/    /'; fi
  sleep 0.2
  left_behind "SIGSTOP $victim" "$W/$name.log"
done

# --- restart: the job goes on from the latest checkpoint ----------------------------------
# 100 steps, the stop after step 12: the stop must come before the last one
# (a step takes ~8 ms; with 40 the window was about 0.2 s on a loaded machine)
"$BIN" launch "$W/plan.yaml" --out "$W/restart" --steps 100 --set train.max_restarts=1 >"$W/restart.log" 2>&1 &
cpid=$!
wait_step "$W/restart/metrics.jsonl" 12 || fail "restart: no step 12"
vpid=$(stage_pid "$W/restart.log" image.0/0)
kill -STOP "$vpid"
wait $cpid; rc=$?
[ $rc -eq 0 ] && grep -q "restart 1 of 1 after step [0-9]*: watchdog: stage image.0/0 (pid $vpid) is stopped" "$W/restart.log" \
  && steps_once "$W/restart/metrics.jsonl" 100 \
  && ok "SIGSTOP image.0 with max_restarts 1: restarted, finished 100 steps" \
  || { fail "SIGSTOP with restarts: rc=$rc"; grep -E "restart|error" "$W/restart.log" | tail -3 | sed 's/^/    /'; }
sleep 0.2
left_behind "SIGSTOP + restart" "$W/restart.log"
# --- an evaluation is not a stall: many forwards (1000 validation pairs at 128 px, seconds)
# with train.stall_timeout 2; the stages talk as they go, and the step after it does not
# blame a stage that finished its part early -------------------------------------------------
for _ in 1 2 3; do cat "$W/data/train.jsonl"; done >"$W/data/bigval.jsonl"
"$BIN" launch "$W/plan.yaml" --out "$W/eval" --steps 3 --set train.eval_every=2 \
  --set train.final_eval=false --set train.stall_timeout=2 --set data.image_size=128 \
  --set data.val_manifest="$W/data/bigval.jsonl" --set data.val_samples=1000 >"$W/eval.log" 2>&1 \
  && grep -q "step 2: val recall" "$W/eval.log" && steps_once "$W/eval/metrics.jsonl" 3 \
  && ok "an evaluation longer than train.stall_timeout is not a stall" \
  || { fail "evaluation vs the watchdog"; grep -E "error" "$W/eval.log" | tail -2 | sed 's/^/    /'; }
finish
