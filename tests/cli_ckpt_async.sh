#!/usr/bin/env bash
# Background checkpoints (train.ckpt_async: true): a stage snapshots
# its state between steps and a thread writes the file while the next steps
# run; ckpt/latest moves only once every stage's file is on disk.
#  - every checkpoint equals the one written at once (ckpt_async: false) and
#    --single-process's, bitwise, with a slow disk (each write 1.5 s late);
#    fp16 with a forced overflow at step 3 and a growth window of 3 steps, so
#    the loss-scale state each train.ckpt holds changes from one checkpoint
#    to the next (the coordinator's file is written when the step is
#    published, steps later: it must hold the state of its own step);
#  - the writes ran beside training: the trace shows each background write
#    of step s still going when step s+1's first forward started, and no
#    synchronous write (the old way) does;
#  - a background write that fails stops the job naming the stage and the
#    step; latest stays at the checkpoint before; nothing is left behind;
#  - a stop (SIGINT) while a write is in flight waits for it and publishes it.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 400 4
tiny_plan "name: a, steps: 8, seed: 3" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 2 }, eval_every: 0, ckpt_every: 2, ckpt_keep: 0,
         precision: fp16, loss_scale_window: 3, debug_overflow_step: 3"

MMP_TEST_CKPT_WRITE_DELAY_MS=1500 "$BIN" launch "$W/plan.yaml" --out "$W/bg" --set train.ckpt_async=true \
  >"$W/bg.log" 2>&1 \
  && ok "background checkpoints: run" || { fail "background run"; tail -5 "$W/bg.log"; }
"$BIN" launch "$W/plan.yaml" --out "$W/fg" >"$W/fg.log" 2>&1 \
  && ok "synchronous checkpoints: run" || { fail "synchronous run"; tail -5 "$W/fg.log"; }
"$BIN" launch "$W/plan.yaml" --out "$W/one" --single-process >"$W/one.log" 2>&1 \
  || { fail "single-process run"; tail -5 "$W/one.log"; }
for s in 2 4 6 8; do
  d=ckpt/step_$(printf %07d $s)
  [ -f "$W/bg/$d/train.ckpt" ] || fail "background: $d has no train.ckpt (the coordinator's, written when published)"
  r1=$(same_ckpt "$W/bg/$d" "$W/fg/$d") && r2=$(same_ckpt "$W/bg/$d" "$W/one/$d") \
    && ok "step $s: background == synchronous == single-process ($r1)" \
    || fail "step $s: background vs synchronous: $r1; vs single-process: ${r2:-}"
done
[ "$(readlink "$W/bg/ckpt/latest")" = step_0000008 ] && ok "background: latest is step 8" \
  || fail "background: latest is $(readlink "$W/bg/ckpt/latest")"
left_behind "background" "$W/bg.log"

# Did the writes overlap training? For each background checkpoint of step s
# (2, 4, 6: 8 is the run's last, written at once), a CKPT WRITE span that
# ends after a forward of step s+1 begins.
overlap() { # TRACE: "s:yes|no" for s = 2 4 6
  python3 - "$1" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
writes = {}
first_f = {}
for e in ev:
    a = e.get("args") or {}
    if e.get("ph") != "X" or "step" not in a:
        continue
    if e["name"] == "CKPT WRITE":
        end = e["ts"] + e["dur"]
        writes[a["step"]] = max(writes.get(a["step"], 0), end)
    elif e["name"] == "F":
        first_f[a["step"]] = min(first_f.get(a["step"], 1e300), e["ts"])
print(" ".join("%d:%s" % (s, "yes" if s in writes and s + 1 in first_f and
               writes[s] > first_f[s + 1] else "no") for s in (2, 4, 6)))
PY
}
o=$(overlap "$W/bg/trace.json")
[ "$o" = "2:yes 4:yes 6:yes" ] && ok "background writes ran beside the next step ($o)" \
  || fail "background writes beside the next step: $o"
o=$(overlap "$W/fg/trace.json")
[ "$o" = "2:no 4:no 6:no" ] && ok "synchronous writes ended before the next step ($o)" \
  || fail "synchronous writes: $o"
grep -q '"name":"CKPT WRITE"' "$W/fg/trace.json" && ok "synchronous writes are traced too" \
  || fail "no CKPT WRITE span in the synchronous run's trace"

# A background write that fails: the job stops, naming it; latest stays.
MMP_TEST_CKPT_FAIL_STEP=4 MMP_TEST_CKPT_WRITE_DELAY_MS=300 \
  "$BIN" launch "$W/plan.yaml" --out "$W/bad" --set train.ckpt_async=true >"$W/bad.log" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "could not write its checkpoint of step 4: .*test hook" "$W/bad.log"; then
  ok "a failed background write stops the job (rc=$rc): $(grep -o 'stage [^ ]* could not write its checkpoint of step 4' "$W/bad.log" | head -1)"
else fail "failed background write: rc=$rc"; tail -4 "$W/bad.log" | sed 's/^/    /'; fi
[ "$(readlink "$W/bad/ckpt/latest")" = step_0000002 ] && ok "latest stays at step 2" \
  || fail "after the failed write, latest is '$(readlink "$W/bad/ckpt/latest")'"
ls "$W/bad/ckpt/step_0000004/" 2>/dev/null | grep -q '\.tmp' && fail "a temporary file is left in step 4" \
  || ok "no temporary file left in step 4"
left_behind "failed write" "$W/bad.log"

# SIGINT while a write of step 2 is in flight (each takes 4 s): the stop
# waits for it, then checkpoints the step it stopped at; both are published.
MMP_TEST_CKPT_WRITE_DELAY_MS=4000 "$BIN" launch "$W/plan.yaml" --out "$W/int" --set job.steps=100 \
  --set train.ckpt_async=true \
  >"$W/int.log" 2>&1 &
cpid=$!
wait_step "$W/int/metrics.jsonl" 3 || fail "int: no step 3"
kill -INT $cpid; wait $cpid; rc=$?
at=$(last_step "$W/int/metrics.jsonl")
latest=$(readlink "$W/int/ckpt/latest")
if [ $rc -eq 130 ] && [ "$latest" = "step_$(printf %07d "$at")" ] && [ -f "$W/int/ckpt/step_0000002/train.ckpt" ]; then
  ok "SIGINT during a background write: step 2 and the stop's step $at published (rc=$rc)"
else fail "SIGINT during a background write: rc=$rc, last step $at, latest '$latest'"; tail -3 "$W/int.log"; fi
left_behind "stop during a write" "$W/int.log"
finish
