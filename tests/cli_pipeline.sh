#!/usr/bin/env bash
# The multi-process pipeline on one host, end to end: separate stage
# processes; the same checkpoints as --single-process for gpipe, 1f1b and
# zb-h1 (the default model.fusion.itc_scope: batch; microbatch too; zb-h1 also
# on a three-way image split with replicas under both scopes),
# micro-batch counts 1, 4, 8 (and 5, which does not divide the batch) and
# an image branch split into two sub-stages; the in-flight bound of each
# schedule in the stages' own reports; chained steps (metrics.jsonl
# "chained": all but the first and the one after an evaluation); nothing left behind after a normal
# run, SIGINT to the coordinator, SIGKILL to a stage; resume after a kill.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 800 4
# 50 steps, an evaluation after 25; under the sanitizers 12 and 6 (the same
# runs: 36 launches of 50 steps were 6 minutes of CI there)
steps=50 every=25
[ "$SANITIZED" = 1 ] && steps=12 every=6
tiny_plan "name: p, steps: $steps, seed: 7" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: $every, clip_grad_norm: 0.5"

# --- same math as one process ---------------------------------------------------
for m in 1 4 5 8; do
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/single_m$m" --set train.microbatches=$m \
    >"$W/single_m$m.log" 2>&1 || { fail "single m=$m"; tail -3 "$W/single_m$m.log"; }
done
for sched in gpipe 1f1b zb-h1; do
  for m in 1 4 5 8; do
    for split in none 2; do
      name=${sched}_m${m}_s$split
      extra=()
      [ "$split" != none ] && extra=(--set "stages.image.split=[$split]")
      "$BIN" launch "$W/plan.yaml" --out "$W/$name" --set train.schedule=$sched \
        --set train.microbatches=$m "${extra[@]}" >"$W/$name.log" 2>&1
      rc=$?
      if [ $rc -ne 0 ]; then fail "$name: launch rc=$rc"; tail -5 "$W/$name.log" | sed 's/^/    /'; continue; fi
      out=$(same_ckpt "$W/single_m$m" "$W/$name") && ok "$name vs single-process: $out" \
        || fail "$name differs from single-process: $out"
    done
  done
done

# both branches cut: image into three sub-stages, text into two (6 processes)
"$BIN" launch "$W/plan.yaml" --out "$W/cuts" --set 'stages.image.split=[1,3]' \
  --set 'stages.text.split=[2]' >"$W/cuts.log" 2>&1 || { fail "cuts: launch"; tail -5 "$W/cuts.log"; }
out=$(same_ckpt "$W/single_m4" "$W/cuts") && ok "image [1,3] + text [2] vs single-process: $out" \
  || fail "image [1,3] + text [2] differs: $out"
ls "$W/cuts/ckpt/latest/" | tr '\n' ' ' | grep -q "image.0.ckpt image.1.ckpt image.2.ckpt text.0.ckpt text.1.ckpt" \
  && ok "one checkpoint file per sub-stage" || fail "checkpoint files: $(ls "$W/cuts/ckpt/latest/")"

# --- separate processes ------------------------------------------------------------
pids=$(grep -o 'started [a-z.0-9]*/0 (pid [0-9]*)' "$W/1f1b_m4_s2.log" | grep -o 'pid [0-9]*' | sort -u | wc -l)
[ "$pids" -ge 4 ] && ok "split run used $pids stage processes" || fail "split run: $pids stage pids"
pids=$(grep -o 'started [a-z.0-9]*/0 (pid [0-9]*)' "$W/1f1b_m4_snone.log" | grep -o 'pid [0-9]*' | sort -u | wc -l)
[ "$pids" -eq 3 ] && ok "default placement: 3 stage processes" || fail "default placement: $pids stage pids"
grep -q '"traceEvents"' "$W/1f1b_m4_s2/trace.json" && grep -q '"ph":"s"' "$W/1f1b_m4_s2/trace.json" \
  && grep -q '"name":"F"' "$W/1f1b_m4_s2/trace.json" && ok "trace.json has spans and flows" \
  || fail "trace.json incomplete"
ls "$W/1f1b_m4_s2"/trace.*.part >/dev/null 2>&1 && fail "trace parts left" || ok "trace parts merged"

# --- chained steps: a step starts behind the last one's clip unless the coordinator
# needs the stages between them (coordinator/steps.c): here the first step and the
# one after the evaluation (step 25, or 6) wait (metrics.jsonl "chained")
bad=$(grep -o '"step":[0-9]*\|"chained":[0-9]*' "$W/1f1b_m4_snone/metrics.jsonl" | paste -d' ' - - \
  | awk -v e=$((every + 1)) -v n=$steps '{ s = substr($1, 8); c = substr($2, 11); want = (s == 1 || s == e) ? 0 : 1
           if (c != want) print s "=" c } END { if (NR != n) print "lines=" NR }')
[ -z "$bad" ] && ok "chained steps: all but step 1 and the one after the evaluation" \
  || fail "chained steps: unexpected $bad"

# --- memory of the schedule: in-flight activations the stages report ---------------
# With the loss per micro-batch (model.fusion.itc_scope: microbatch): under the
# default batch scope every stage holds all m (tests/cli_itc_scope.sh).
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single_m8_mb" --set train.microbatches=8 \
  --set model.fusion.itc_scope=microbatch >"$W/single_m8_mb.log" 2>&1 || fail "single m=8 microbatch scope"
for sched in gpipe 1f1b zb-h1; do
  name=${sched}_m8_s2_mb
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" --set train.schedule=$sched --set train.microbatches=8 \
    --set 'stages.image.split=[2]' --set model.fusion.itc_scope=microbatch >"$W/$name.log" 2>&1 \
    || { fail "$name: launch"; tail -5 "$W/$name.log" | sed 's/^/    /'; }
  out=$(same_ckpt "$W/single_m8_mb" "$W/$name") && ok "$name vs single-process: $out" \
    || fail "$name differs from single-process: $out"
done
max_inflight() { grep -o "\"name\":\"$2\"[^}]*\"max_inflight\":[0-9]*" "$1/metrics.jsonl" | grep -o '[0-9]*$' | sort -n | tail -1; }
check_inflight() { # run stage want
  local got; got=$(max_inflight "$W/$1" "$2")
  [ "$got" = "$3" ] && ok "$1: $2 held at most $got micro-batches" || fail "$1: $2 held $got, want $3"
}
check_inflight 1f1b_m8_s2_mb image.0 3
check_inflight 1f1b_m8_s2_mb image.1 2
check_inflight 1f1b_m8_s2_mb text.0 2
check_inflight 1f1b_m8_s2_mb fusion 1
check_inflight gpipe_m8_s2_mb image.0 8
check_inflight gpipe_m8_s2_mb fusion 1
# zb-h1 holds a micro-batch from F to its W: every stage up to 1F1B's peak (3)
for st in image.0 image.1 text.0 fusion; do check_inflight zb-h1_m8_s2_mb $st 3; done
grep -q '"name":"W"' "$W/zb-h1_m8_s2_mb/trace.json" && grep -q '"name":"Bi"' "$W/zb-h1_m8_s2_mb/trace.json" \
  && ok "zb-h1: split backward traced (Bi and W spans)" || fail "zb-h1: no Bi/W spans in trace.json"
# zb-h1 on image split three ways, its middle sub-stage and fusion replicated, both scopes
for scope in batch microbatch; do
  name=zb-h1_rep_$scope
  ref=single_m8; [ $scope = microbatch ] && ref=single_m8_mb
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" --set train.schedule=zb-h1 --set train.microbatches=8 \
    --set 'stages.image.split=[1,3]' --set 'stages.image.replicas=[1,2,1]' --set stages.fusion.replicas=2 \
    --set model.fusion.itc_scope=$scope >"$W/$name.log" 2>&1 || { fail "$name: launch"; tail -5 "$W/$name.log" | sed 's/^/    /'; }
  out=$(same_ckpt "$W/$ref" "$W/$name") && ok "$name vs single-process: $out" \
    || fail "$name differs from single-process: $out"
done
grep -q '"bubble":0\.[0-9]' "$W/1f1b_m4_snone/metrics.jsonl" && ok "bubble reported" || fail "no bubble"
[ "$(shm_left "$W"/*.log)" -eq 0 ] && ok "no /dev/shm segments left after normal runs" || fail "shm segments left: $(ls /dev/shm)"
[ "$(procs_left "$W"/*.log)" -eq 0 ] && ok "no stage processes left" || fail "stage processes left"

# --- SIGINT to the coordinator ---------------------------------------------------------
"$BIN" launch "$W/plan.yaml" --out "$W/int" --set job.steps=100000 >"$W/int.log" 2>&1 &
cpid=$!
for _ in $(seq 100); do grep -q '"step":3' "$W/int/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -INT $cpid; wait $cpid; rc=$?
sleep 0.2
[ $rc -eq 130 ] && ok "SIGINT: coordinator exits 130" || fail "SIGINT: rc=$rc"
[ "$(procs_left "$W/int.log")" -eq 0 ] && [ "$(shm_left "$W/int.log")" -eq 0 ] && ok "SIGINT: nothing left behind" \
  || fail "SIGINT: left $(procs_left "$W/int.log") processes, shm: $(ls /dev/shm | grep mmpipe)"

# --- SIGKILL to one stage --------------------------------------------------------------
for victim in text.0 fusion image.0; do
  kill_stage "SIGKILL $victim" "$W/plan.yaml" "$W/kill_$victim" "$victim"
done

# --- resume after a kill equals the uninterrupted run -----------------------------------
cat > "$W/resume.yaml" <<YAML
job:   { name: r, steps: 40, seed: 9 }
data:  { manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64 }
model: { width: 32, image: { blocks: [1, 1], channels: [8, 16] },
         text: { layers: 2, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 0,
         ckpt_every: 5 }
YAML
"$BIN" launch "$W/resume.yaml" --out "$W/full" >"$W/full.log" 2>&1 || fail "uninterrupted run"
"$BIN" launch "$W/resume.yaml" --out "$W/cut" >"$W/cut.log" 2>&1 &
cpid=$!
for _ in $(seq 200); do [ -e "$W/cut/ckpt/step_0000010" ] && break; sleep 0.05; done
kill -KILL $cpid; wait $cpid 2>/dev/null
sleep 0.3
latest=$(readlink "$W/cut/ckpt/latest")
if [ -n "$latest" ] && [ "$latest" != step_0000040 ]; then ok "killed at $latest"
else fail "the run was not cut short (latest=$latest)"; fi
[ "$(procs_left "$W/cut.log")" -eq 0 ] && [ "$(shm_left "$W/cut.log")" -eq 0 ] && ok "coordinator SIGKILL: stages gone, no shm left" \
  || fail "coordinator SIGKILL: left $(procs_left "$W/cut.log") processes, shm: $(ls /dev/shm | grep mmpipe)"
"$BIN" launch "$W/resume.yaml" --resume "$W/cut" >"$W/resumed.log" 2>&1 || { fail "resume"; tail -3 "$W/resumed.log"; }
out=$("$BIN" ckpt diff "$W/full" "$W/cut" --quiet); rc=$?
[ $rc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] && ok "resumed run equals the uninterrupted one" \
  || fail "resumed run differs: $(tail -1 <<<"$out")"
finish
