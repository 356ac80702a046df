#!/usr/bin/env bash
# A stage's start-up is judged by its progress, not by a clock: a stage whose
# manifest takes longer to open than the start-up limit still starts while it
# keeps reporting (and the coordinator shows how far it is), and a stage that
# stops reporting (SIGSTOP while it reads its manifest) is named within the
# limit with what it was doing, leaving nothing behind. The limit is
# shortened to 6 s for the test (MMP_TEST_READY_SILENCE_S; the phases before
# the manifest, a busy CI machine's process starts among them, must fit in it), and each progress
# callback of a manifest open pauses 250 ms (MMP_TEST_SLOW_START_MS; 26
# while counting the lines of this 64k-line, 6.6 MB manifest, 16 while
# indexing them): it takes about 10 s to open, and its stage tells the
# coordinator how far it is once a second. A resume's checkpoint read reports
# its bytes the same way.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 400 4
for _ in $(seq 160); do cat "$W/data/train.jsonl"; done >"$W/data/big.jsonl"
tiny_plan "name: su, steps: 2, seed: 3" \
  "manifest: $W/data/big.jsonl, image_size: 32, max_text_len: 24" \
  1 "batch: 16, microbatches: 4, eval_every: 0, final_eval: false"
export MMP_TEST_READY_SILENCE_S=6 MMP_TEST_SLOW_START_MS=250

# slow_start LOG METRICS STEPS PROGRESS WHAT NAME SAID CMD...: runs CMD
# (output in LOG), which must succeed with METRICS holding steps 1..STEPS
# once, take more than the 6 s silence limit and show a PROGRESS line (a
# grep pattern); WHAT and SAID make the ok line, NAME the failure and
# leftover lines.
slow_start() {
  local log=$1 metrics=$2 steps=$3 progress=$4 what=$5 name=$6 said=$7 rc dt t0
  shift 7
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1; rc=$?
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  if [ $rc -eq 0 ] && steps_once "$metrics" "$steps" && awk -v d="$dt" 'BEGIN { exit !(d > 6) }' \
     && grep -q "$progress" "$log"; then
    ok "a ${what} of ${dt}s with progress (limit 6 s of silence): $said"
  else
    fail "$name: rc=$rc after ${dt}s"; grep -E "error|starting" "$log" | tail -4 | sed 's/^/    /'
  fi
  left_behind "$name" "$log"
}
N='[0-9.]*[kM]\?'

# --- a slow start-up that makes progress: the job runs ------------------------------------
slow_start "$W/slow.log" "$W/slow/metrics.jsonl" 2 \
  "starting image.0/0: manifest $W/data/big.jsonl: $N of $N \(lines\|bytes counted\)$" \
  start-up "slow start-up" "ran, progress shown" \
  "$BIN" launch "$W/plan.yaml" --out "$W/slow"

# --- a slow checkpoint read: it reports bytes, so it outlasts the limit -----------------
# Every stage reads the whole step (keeping only its own tensors) and reports
# after each tensor: at 40 ms a report, about 9 s of reading here.
slow_start "$W/resume.log" "$W/slow/metrics.jsonl" 3 \
  "starting fusion/0: checkpoint $W/slow/ckpt/step_0000002: $N of $N bytes$" \
  "checkpoint read" "slow checkpoint read" "resumed, bytes shown" \
  env MMP_TEST_SLOW_START_MS=40 "$BIN" launch "$W/plan.yaml" --resume "$W/slow" --set job.steps=3

# --- a stage stopped while it reads its manifest: named within the limit ----------------
"$BIN" launch "$W/plan.yaml" --out "$W/stop" >"$W/stop.log" 2>&1 &
cpid=$!
for _ in $(seq 400); do grep -q "starting text.0/0: manifest" "$W/stop.log" && break; sleep 0.05; done
vpid=$(grep -o "started text.0/0 (pid [0-9]*)" "$W/stop.log" | tail -1 | grep -o '[0-9]*)$' | tr -d ')')
if [ -z "$vpid" ] || ! grep -q "starting text.0/0: manifest" "$W/stop.log"; then
  fail "SIGSTOP at start-up: no progress shown for text.0/0"; kill -KILL $cpid
else
  kill -STOP "$vpid"; t0=$(date +%s.%N)
  for _ in $(seq 300); do kill -0 $cpid 2>/dev/null || break; sleep 0.1; done
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  if kill -0 $cpid 2>/dev/null; then
    fail "SIGSTOP at start-up: still running ${dt}s later"; kill -CONT "$vpid"; kill -KILL $cpid
  fi
  wait $cpid; rc=$?
  if [ $rc -ne 0 ] && grep -q "start-up: stage text.0/0 (pid $vpid) is stopped .*waiting for stages to be ready; it last reported: manifest $W/data/big.jsonl: [0-9.]*[kM]\? of [0-9.]*[kM]\? \(lines\|bytes counted\))" "$W/stop.log" \
     && awk -v d="$dt" 'BEGIN{exit !(d < 12)}'; then
    ok "SIGSTOP text.0/0 while it opens its manifest: named after ${dt}s with what it was doing, rc=$rc"
  else
    fail "SIGSTOP at start-up: rc=$rc after ${dt}s"; tail -3 "$W/stop.log" | sed 's/^/    /'
  fi
fi
sleep 0.2
left_behind "SIGSTOP at start-up" "$W/stop.log"
finish
