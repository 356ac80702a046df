#!/usr/bin/env bash
# Recover, not just stop: with train.max_restarts, SIGKILL to a random stage
# at a random step, again and again over one run (seeded, so the same kills
# repeat), makes the coordinator stop the others and relaunch every stage
# from the latest checkpoint each time; the run finishes with a final
# checkpoint equal to the uninterrupted run's (max_abs_diff=0), every
# restart recorded in metrics.jsonl (which holds each step once) and in
# trace.json, and no stage process or /dev/shm segment left. A restart after
# the binary was replaced on disk relaunches the code the run started with. A
# stage killed during the final evaluation: the run restarts, evaluates, and
# records that restart on the last line.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
KILLS=${MMP_RESTART_KILLS:-12}
SEED=${MMP_RESTART_SEED:-20261124}
# 150 steps; under the sanitizers 90, the same kills (each one lands 1 to 6
# steps after the last step reached: the 12 seeded kills end by step 72 at
# the latest, before the loop's STEPS - 5) and checks, a sanitized step
# costing ten times a Release one
STEPS=150
[ "$SANITIZED" = 1 ] && STEPS=90
workdir
synth 400 4
tiny_plan "name: k, steps: $STEPS, seed: 13" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 50, ckpt_every: 3, max_restarts: $((KILLS + 5))" \
  "hosts: [ { name: localhost, devices: [cpu, cpu, cpu, cpu] } ]" \
  "stages: { image: { split: [2] } }"
t_start=$(date +%s.%N)
"$BIN" launch "$W/plan.yaml" --out "$W/ref" >"$W/ref.log" 2>&1 || { fail "uninterrupted run"; tail -3 "$W/ref.log"; }

RANDOM=$SEED
victims=(image.0/0 image.1/0 text.0/0 fusion/0)
L=$W/killed.log
"$BIN" launch "$W/plan.yaml" --out "$W/killed" >"$L" 2>&1 &
cpid=$!
kills=0; plan_of_kills=""
while [ $kills -lt $KILLS ]; do
  base=$(last_step "$W/killed/metrics.jsonl")
  target=$((base + 1 + RANDOM % 6))
  victim=${victims[$((RANDOM % ${#victims[@]}))]}
  [ $target -ge $((STEPS - 5)) ] && break
  wait_step "$W/killed/metrics.jsonl" $target 120 || break
  vpid=$(grep -o "started $victim (pid [0-9]*)" "$L" | tail -1 | grep -o '[0-9]*)$' | tr -d ')')
  kill -KILL "$vpid" 2>/dev/null || break
  kills=$((kills + 1)); plan_of_kills="$plan_of_kills $victim@$target"
  for _ in $(seq 600); do grep -q "restart $kills of" "$L" && break; kill -0 $cpid 2>/dev/null || break; sleep 0.05; done
  grep -q "restart $kills of" "$L" || { fail "kill $kills ($victim at step $target): no restart"; break; }
done
wait $cpid; rc=$?
secs=$(echo "$(date +%s.%N) - $t_start" | bc)
echo "kills (stage@step):$plan_of_kills"
[ $kills -ge 10 ] && [ $kills -eq $KILLS ] && ok "$kills SIGKILLs to random stages at random steps (seed $SEED)" \
  || fail "only $kills of $KILLS kills happened"
restarts=$(grep -c "restart [0-9]* of $((KILLS + 5)) after step" "$L")
[ $rc -eq 0 ] && [ "$restarts" -eq $kills ] && ok "the run finished (rc 0) after $restarts restarts" \
  || { fail "rc=$rc, $restarts restarts for $kills kills"; grep -E "error|restart" "$L" | tail -4 | sed 's/^/    /'; }
out=$("$BIN" ckpt diff "$W/ref" "$W/killed"); drc=$?
[ $drc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] \
  && ok "final checkpoint equals the uninterrupted run's: $(tail -1 <<<"$out")" \
  || fail "final checkpoint differs (rc $drc): $(tail -1 <<<"$out")"
steps_once "$W/killed/metrics.jsonl" $STEPS && ok "metrics.jsonl holds steps 1..$STEPS once each" \
  || fail "metrics.jsonl steps repeat or miss"
logged=$(grep -o '"restarts":\[[^]]*\]' "$W/killed/metrics.jsonl" | grep -o '"n":[0-9]*' | sort -u | wc -l)
[ "$logged" -eq "$kills" ] && ok "metrics.jsonl records all $logged restarts (field \"restarts\")" \
  || fail "metrics.jsonl records $logged restarts of $kills"
marks=$(grep -c '"name":"restart"' "$W/killed/trace.json")
trace_ok "$W/killed/trace.json" && [ "$marks" -eq "$kills" ] && ok "trace.json valid, $marks restart marks" \
  || fail "trace.json: valid? restart marks $marks"
sleep 0.2
left_behind "after $kills kills" "$L"

# The binary replaced on disk mid-run (a rebuild, an upgrade): a restart relaunches the code
# the run started with (the old file's path reads "PATH (deleted)": spawning that failed).
# $STEPS steps: with 30, a step of ~8 ms left the kill after step 5 a window of
# about 0.2 s, which a loaded machine may miss (no restart to see).
cp "$BIN" "$W/mmpipe_copy"
"$W/mmpipe_copy" launch "$W/plan.yaml" --out "$W/rebuilt" --set job.steps=$STEPS >"$W/rebuilt.log" 2>&1 &
cpid=$!
wait_step "$W/rebuilt/metrics.jsonl" 5 || fail "rebuilt: no step 5"
rm "$W/mmpipe_copy" && cp "$BIN" "$W/mmpipe_copy"
vpid=$(grep -o "started text.0/0 (pid [0-9]*)" "$W/rebuilt.log" | head -1 | grep -o '[0-9]*)$' | tr -d ')')
kill -KILL "$vpid"; wait $cpid; rc=$?
[ $rc -eq 0 ] && grep -q "restart 1 of" "$W/rebuilt.log" && steps_once "$W/rebuilt/metrics.jsonl" $STEPS \
  && ok "binary replaced mid-run, a stage killed: restarted and finished" \
  || { fail "binary replaced mid-run: rc=$rc"; grep error "$W/rebuilt.log" | tail -2 | sed 's/^/    /'; }
sleep 0.2
left_behind "binary replaced mid-run" "$W/rebuilt.log"
# A stage killed during the final evaluation (1000 validation pairs at 128 px: seconds):
# the restart relaunches from the last step's checkpoint, evaluates it, and the restart,
# which no later step line can carry, is recorded on the last line, beside its recall.
for _ in 1 2 3; do cat "$W/data/train.jsonl"; done >"$W/data/bigval.jsonl"
F=$W/final
"$BIN" launch "$W/plan.yaml" --out "$F" --set job.steps=4 --set train.eval_every=0 \
  --set data.image_size=128 --set data.val_manifest="$W/data/bigval.jsonl" --set data.val_samples=1000 \
  >"$F.log" 2>&1 &
cpid=$!
wait_step "$F/metrics.jsonl" 4 || fail "final: no step 4"
for _ in $(seq 200); do [ "$(readlink "$F/ckpt/latest")" = step_0000004 ] && break; sleep 0.05; done
vpid=$(grep -o "started fusion/0 (pid [0-9]*)" "$F.log" | head -1 | grep -o '[0-9]*)$' | tr -d ')')
kill -KILL "$vpid"; wait $cpid; rc=$?
last=$(tail -1 "$F/metrics.jsonl")
[ $rc -eq 0 ] && grep -q "restart 1 of .* after step 4: stage fusion/0 (pid $vpid) died" "$F.log" \
  && steps_once "$F/metrics.jsonl" 4 && grep -q '"val_i2t_r1"' <<<"$last" \
  && grep -q '"restarts":\[{"n":1,"after_step":4,"from_step":4,' <<<"$last" \
  && ok "killed in the final evaluation: restarted, evaluated, the restart on the last line" \
  || { fail "killed in the final evaluation: rc=$rc, last line: ${last:0:80}...${last: -160}"; grep -E "error|restart" "$F.log" | tail -3; }
sleep 0.2
left_behind "killed in the final evaluation" "$F.log"
echo "cli_restart: $kills kills, ${secs}s"
finish
