#!/usr/bin/env bash
# Stopping by signal loses no work: the first SIGINT/SIGTERM/SIGHUP (a closed
# terminal) to the coordinator (and to --single-process) finishes the step in
# flight, writes a checkpoint of it, exits 130/143/129 and prints the command
# that resumes; that
# command continues to a result equal to an uninterrupted run's. A second
# signal stops at once. Nothing is left behind either way. A plan without
# train.ckpt_every still checkpoints (the default), so a killed run resumes.
# A coordinator paused for longer than the heartbeat timeout goes on.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 400 4
# 50 steps; under the sanitizers 20 (the same runs and checks: every stop
# lands at step 5 or 6, and a sanitized step costs ten times a Release one)
steps=50
[ "$SANITIZED" = 1 ] && steps=20
tiny_plan "name: s, steps: $steps, seed: 5" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 0, ckpt_every: 0"

# stop_by SIG NAME [launch options...]: starts a run into $W/NAME, sends SIG
# once step 5 is done, waits; sets rc.
stop_by() {
  local sig=$1 name=$2; shift 2
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" "$@" >"$W/$name.log" 2>&1 &
  local cpid=$!
  wait_step "$W/$name/metrics.jsonl" 5 || fail "$name: no step 5"
  kill -$sig $cpid; wait $cpid; rc=$?
}
# resume_cmd LOG: the command the stopped run printed, minus "mmpipe".
resume_cmd() { grep -o 'resume with: mmpipe launch .*' "$1" | tail -1 | sed 's/^resume with: mmpipe //'; }

"$BIN" launch "$W/plan.yaml" --out "$W/full" >"$W/full.log" 2>&1 || fail "uninterrupted pipeline run"
"$BIN" launch "$W/plan.yaml" --out "$W/single_full" --single-process >"$W/single_full.log" 2>&1 \
  || fail "uninterrupted single-process run"

# --- first SIGINT to the coordinator: step finished, checkpointed, resumable ------------
for sig in INT TERM HUP; do
  want=$(case $sig in INT) echo 130 ;; TERM) echo 143 ;; HUP) echo 129 ;; esac)
  name=pipe_$sig
  stop_by $sig $name
  step=$(last_step "$W/$name/metrics.jsonl")
  latest=$(readlink "$W/$name/ckpt/latest")
  [ $rc -eq $want ] && ok "SIG$sig: coordinator exits $rc" || { fail "SIG$sig: rc=$rc, want $want"; tail -3 "$W/$name.log"; }
  [ "$latest" = "$(printf 'step_%07d' "$step")" ] && [ "$step" -lt "$steps" ] \
    && ok "SIG$sig: the step in flight (step $step) was checkpointed" \
    || fail "SIG$sig: latest checkpoint '$latest', last metrics step $step"
  cmd=$(resume_cmd "$W/$name.log")
  grep -q -- "--resume $W/$name\$" <<<"$cmd" && ok "SIG$sig: says how to resume: mmpipe $cmd" \
    || fail "SIG$sig: no resume command in the log"
  left_behind "SIG$sig" "$W/$name.log"
  [ $sig != INT ] && continue # resuming is the same after any of them
  # shellcheck disable=SC2086
  "$BIN" $cmd >"$W/${name}_resumed.log" 2>&1 || { fail "SIG$sig: resume"; tail -3 "$W/${name}_resumed.log"; }
  out=$("$BIN" ckpt diff "$W/full" "$W/$name" --quiet); rc=$?
  [ $rc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] \
    && ok "SIG$sig: stopped at $step + resumed equals the uninterrupted run" \
    || fail "SIG$sig: resumed run differs: $(tail -1 <<<"$out")"
  steps_once "$W/$name/metrics.jsonl" $steps && ok "SIG$sig: metrics.jsonl holds steps 1..$steps once each" \
    || fail "SIG$sig: metrics.jsonl steps wrong"
done

# --- the same for --single-process ------------------------------------------------------
stop_by INT single_INT --single-process
step=$(last_step "$W/single_INT/metrics.jsonl")
[ $rc -eq 130 ] && [ "$(readlink "$W/single_INT/ckpt/latest")" = "$(printf 'step_%07d' "$step")" ] \
  && ok "single-process SIGINT: exits 130, step $step checkpointed" \
  || fail "single-process SIGINT: rc=$rc, latest $(readlink "$W/single_INT/ckpt/latest"), step $step"
cmd=$(resume_cmd "$W/single_INT.log")
# shellcheck disable=SC2086
if [ -n "$cmd" ] && "$BIN" $cmd >"$W/single_resumed.log" 2>&1; then
  out=$("$BIN" ckpt diff "$W/single_full" "$W/single_INT" --quiet); rc=$?
  [ $rc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] \
    && ok "single-process: stopped + resumed ($cmd) equals the uninterrupted run" \
    || fail "single-process resumed run differs: $(tail -1 <<<"$out")"
else fail "single-process: resume command '$cmd' failed"; fi
# under nohup a SIGHUP is ignored, as nohup asks: the run goes on to its end
nohup "$BIN" launch "$W/plan.yaml" --out "$W/nohup" --single-process >"$W/nohup.log" 2>&1 &
cpid=$!
wait_step "$W/nohup/metrics.jsonl" 5 || fail "nohup: no step 5"
kill -HUP $cpid; wait $cpid; rc=$?
[ $rc -eq 0 ] && steps_once "$W/nohup/metrics.jsonl" $steps && ok "nohup: SIGHUP ignored, the run finished" \
  || fail "nohup: rc=$rc, last step $(last_step "$W/nohup/metrics.jsonl")"
stop_by HUP single_HUP --single-process
step=$(last_step "$W/single_HUP/metrics.jsonl")
[ $rc -eq 129 ] && [ "$(readlink "$W/single_HUP/ckpt/latest")" = "$(printf 'step_%07d' "$step")" ] \
  && ok "single-process SIGHUP: exits 129, step $step checkpointed" \
  || fail "single-process SIGHUP: rc=$rc, latest $(readlink "$W/single_HUP/ckpt/latest"), step $step"

# --- Ctrl-C with the log piped into tee: tee ends at once (the terminal signals its whole
# process group), the coordinator's next log line meets a closed pipe and must not die of it
# before its checkpoint (SIGPIPE, SIGINT at their defaults, as in a terminal) --------------
if env --default-signal=INT,PIPE true 2>/dev/null; then
  env --default-signal=INT,PIPE setsid bash -c \
    '"$0" launch "$1" --out "$2" 2>&1 | tee "$2.log" >/dev/null; echo "${PIPESTATUS[0]}" >"$2.rc"' \
    "$BIN" "$W/plan.yaml" "$W/tee" &
  gpid=$!
  wait_step "$W/tee/metrics.jsonl" 5 || fail "tee: no step 5"
  # the group setsid made: the coordinator's (its pid is in the run lock)
  pg=$(ps -o pgid= -p "$(cat "$W/tee/.mmpipe.lock")" | tr -d ' ')
  kill -INT -- -"$pg"; wait $gpid
  for _ in $(seq 300); do [ -s "$W/tee.rc" ] && break; sleep 0.1; done
  step=$(last_step "$W/tee/metrics.jsonl"); rc=$(cat "$W/tee.rc" 2>/dev/null)
  [ "$rc" = 130 ] && [ "$(readlink "$W/tee/ckpt/latest")" = "$(printf 'step_%07d' "$step")" ] \
    && ok "Ctrl-C through | tee: exits 130, step $step checkpointed" \
    || fail "Ctrl-C through | tee: rc=$rc, latest $(readlink "$W/tee/ckpt/latest"), step $step"
  left_behind "Ctrl-C through | tee" "$W/tee.log"
else echo "skip: env --default-signal (coreutils 8.31) missing"; fi

# --- a second signal stops at once: no checkpoint, nothing left ---------------------------
# Slow simulated steps (about 2 s each) so both signals land inside one step.
"$BIN" launch "$W/plan.yaml" --out "$W/twice" --set compute=simulated --set sim.cost.image=40 \
  --set sim.cost.text=5 --set sim.cost.fusion=5 >"$W/twice.log" 2>&1 &
cpid=$!
wait_step "$W/twice/metrics.jsonl" 1 || fail "twice: no step 1"
kill -INT $cpid; sleep 0.3; t0=$(date +%s.%N); kill -INT $cpid; wait $cpid; rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
[ $rc -eq 130 ] && grep -q "stopped at once by a second signal" "$W/twice.log" \
  && ! ls "$W/twice/ckpt"/step_* >/dev/null 2>&1 \
  && ok "second SIGINT: stopped at once (${dt}s), no checkpoint, rc 130" \
  || { fail "second SIGINT: rc=$rc after ${dt}s, ckpt: $(ls "$W/twice/ckpt" 2>/dev/null)"; tail -3 "$W/twice.log"; }
left_behind "second SIGINT" "$W/twice.log"

# --- the same signal twice at once is one request: GNU timeout sends it to the command and
# then to its process group (timeout -s INT), microseconds apart; the run still finishes its
# step and checkpoints. Done here as timeout does it, at a step of our choosing.
setsid "$BIN" launch "$W/plan.yaml" --out "$W/group" --set compute=simulated --set sim.cost.image=40 \
  --set sim.cost.text=5 --set sim.cost.fusion=5 >"$W/group.log" 2>&1 &
cpid=$!
wait_step "$W/group/metrics.jsonl" 1 || fail "group: no step 1"
kill -INT $cpid; kill -INT -- -$cpid; wait $cpid; rc=$?
step=$(last_step "$W/group/metrics.jsonl")
[ $rc -eq 130 ] && [ "$(readlink "$W/group/ckpt/latest")" = "$(printf 'step_%07d' "$step")" ] \
  && ! grep -q "stopped at once" "$W/group.log" \
  && ok "SIGINT to the process and at once to its group (as timeout -s INT): step $step checkpointed, rc 130" \
  || { fail "SIGINT to the process and its group: rc=$rc, latest $(readlink "$W/group/ckpt/latest"), step $step"; tail -3 "$W/group.log"; }
left_behind "SIGINT to the process and its group" "$W/group.log"

# --- the default train.ckpt_every: a killed run has something to resume from ---------------
grep -v ckpt_every "$W/plan.yaml" | sed 's/eval_every: 0,/eval_every: 0 }/' > "$W/default.yaml"
"$BIN" launch "$W/default.yaml" --out "$W/killed" --steps 100000 >"$W/killed.log" 2>&1 &
cpid=$!
wait_step "$W/killed/metrics.jsonl" 52 || fail "default ckpt_every: no step 52"
kill -KILL $cpid; wait $cpid 2>/dev/null
sleep 0.3
[ "$(readlink "$W/killed/ckpt/latest")" = step_0000050 ] && ok "default train.ckpt_every: step 50 checkpointed before the kill" \
  || fail "default train.ckpt_every: latest is '$(readlink "$W/killed/ckpt/latest")'"
left_behind "coordinator SIGKILL" "$W/killed.log"

# --- the coordinator SIGKILLed: every stage's death signal removes the job's
# shared memory on its way out, so a segment that still has its name (as
# during start-up, before the peers attach) goes too: one is planted here
"$BIN" launch "$W/plan.yaml" --out "$W/killed2" --steps 100000 >"$W/killed2.log" 2>&1 &
cpid=$!
wait_step "$W/killed2/metrics.jsonl" 2 || fail "killed2: no step 2"
prefix=$(grep -o 'shared memory /mmpipe-[0-9a-f]*' "$W/killed2.log" | head -1 | sed 's#.*/##')
[ -n "$prefix" ] && : >"/dev/shm/$prefix-planted"
kill -KILL $cpid; wait $cpid 2>/dev/null
for _ in $(seq 50); do [ -e "/dev/shm/$prefix-planted" ] || break; sleep 0.1; done
[ -n "$prefix" ] && [ ! -e "/dev/shm/$prefix-planted" ] \
  && ok "coordinator SIGKILL: the stages' death signal removes the job's named segments" \
  || { fail "coordinator SIGKILL: /dev/shm/$prefix-planted left"; rm -f "/dev/shm/$prefix-planted"; }
left_behind "coordinator SIGKILL (planted segment)" "$W/killed2.log"
# a stage whose coordinator is gone before it could ask to die with it (a
# subreaper, not init, took it): it exits at once, saying so
out=$(timeout 10 env MMP_JOB_TOKEN=00 MMP_PARENT_PID=1 "$BIN" stage --connect ipc://@mmpipe-none \
  --stage image.0 --replica 0 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "the coordinator that started this stage (pid 1) is gone" <<<"$out" \
  && ok "an orphaned stage (parent not its coordinator) exits at once" || { fail "orphaned stage: rc $rc"; echo "$out" | tail -2; }

# --- a paused coordinator (Ctrl-Z, a debugger) longer than the ZMTP heartbeat
# timeout (5 s): over ipc its stages keep their connections, so the run goes
# on when it continues (it lost messages and hung, blaming a stage)
"$BIN" launch "$W/plan.yaml" --out "$W/paused" --steps 100000 >"$W/paused.log" 2>&1 &
cpid=$!
wait_step "$W/paused/metrics.jsonl" 3 || fail "paused: no step 3"
kill -STOP $cpid; sleep 8; kill -CONT $cpid
s0=$(last_step "$W/paused/metrics.jsonl")
wait_step "$W/paused/metrics.jsonl" $((s0 + 5)) 30; grew=$?
kill -INT $cpid; wait $cpid; rc=$?
[ $grew -eq 0 ] && [ $rc -eq 130 ] && ! grep -q "unknown process\|no peer" "$W/paused.log" \
  && ok "a coordinator paused for 8 s goes on when continued (steps $s0 -> $(last_step "$W/paused/metrics.jsonl")), stops on SIGINT" \
  || { fail "paused coordinator: grew=$grew rc=$rc"; tail -3 "$W/paused.log"; }
left_behind "paused coordinator" "$W/paused.log"
finish
