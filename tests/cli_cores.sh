#!/usr/bin/env bash
# The pipeline on the cores there are (issue 17), end to end; speed lives in
# bench/cores.sh, not here:
#  1. train.pin: auto pins the single process to its first core, and it
#     trains the same bits as unpinned;
#  2. `stages: auto` on a CPU plan profiles 1/1/1, then takes the CPU
#     planner's placement for this host's cores (the decision says "on N
#     cores", N the cores this test may use); with train.pin: auto every
#     process of the new placement pins itself to core k % N (k its place in
#     stage order), and the run equals --single-process bitwise (ckpt diff
#     max_abs_diff=0); nothing left behind;
#  3. a core id this machine does not give is refused before anything runs,
#     with file:line:column;
#  train.priority: the processes the decision names (with more processes
#     than cores) run at nice 10, the others at 0, none with priority: off;
#  and `mmpipe simulate --plan-cores 2` plans on paper from the run's costs;
#  train.threads 2 reaches every stage process (each pins to 2 cores).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 800 4
tiny_plan "name: c, steps: 16, seed: 7" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 0, final_eval: false, clip_grad_norm: 0.5"
# An image branch several times the text's, as in the demo: the planner's
# priorities then have light processes to favour.
sed -i 's/channels: \[8, 16\]/channels: [16, 48]/' "$W/plan.yaml"
# The cores this process may use, in order (what train.pin: auto lists).
allowed=()
for part in $(grep '^Cpus_allowed_list:' /proc/self/status | awk '{ print $2 }' | tr ',' ' '); do
  if [ "${part#*-}" != "$part" ]; then
    for ((c = ${part%-*}; c <= ${part#*-}; c++)); do allowed+=("$c"); done
  else
    allowed+=("$part")
  fi
done
n=${#allowed[@]}
[ "$n" -ge 1 ] || { echo "cannot read Cpus_allowed_list"; exit 1; }

# --- 1. the single process -------------------------------------------------------------
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single" >"$W/single.log" 2>&1 \
  || { fail "single"; tail -3 "$W/single.log"; }
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single_pin" --set train.pin=auto \
  >"$W/single_pin.log" 2>&1 || { fail "single pinned"; tail -3 "$W/single_pin.log"; }
grep -q "pinned to core ${allowed[0]} (train.pin)" "$W/single_pin.log" \
  && ok "the single process pins itself to core ${allowed[0]}" \
  || fail "single process: no 'pinned to core ${allowed[0]}' in its log"
out=$(same_ckpt "$W/single" "$W/single_pin") && ok "pinned single process = unpinned: $out" \
  || fail "pinned single process differs: $out"

# --- 2. stages: auto on cores, pinned -------------------------------------------------
sed 's/^train: { /train: { pin: auto, /' "$W/plan.yaml" >"$W/auto.yaml"
echo "stages: auto" >>"$W/auto.yaml"
"$BIN" launch "$W/auto.yaml" --out "$W/auto" >"$W/auto.log" 2>&1 \
  || { fail "stages: auto run failed"; tail -5 "$W/auto.log"; }
why=$(grep -o '"reason":"stages: auto[^"]*"' "$W/auto/metrics.jsonl" | head -1)
if [ "$n" -eq 1 ]; then # one core: nothing beats one process per stage
  [ -z "$why" ] && ok "stages: auto on 1 core keeps one process per stage" \
    || fail "stages: auto on 1 core re-placed: $why"
else
  grep -q "after profiling: on $n cores, " <<<"$why" \
    && ok "stages: auto plans on the $n cores: $why" || fail "stages: auto: '${why:-no decision}'"
fi
placement=$(tail -1 "$W/auto/metrics.jsonl" | grep -o '"placement":"[^"]*"' | sed 's/.*:"//; s/"$//')
# plan.json says `stages: auto` until a placement is taken (a resume before then plans
# again, as the launch did: it resumed on one process per stage), then holds that one
"$BIN" launch "$W/auto.yaml" --out "$W/auto0" --steps 0 >/dev/null 2>&1
grep -q '^  "stages": "auto"$' "$W/auto0/plan.json" \
  && { [ "$n" -eq 1 ] || ! grep -q '"stages": "auto"' "$W/auto/plan.json"; } \
  && ok "plan.json: stages: auto before the planner's placement, the placement after" \
  || fail "plan.json: stages: auto $(grep -c '"stages": "auto"' "$W/auto0/plan.json") before, $(grep -c '"stages": "auto"' "$W/auto/plan.json") after"
# The processes in stage order: image.0:2 -> image.0/0 image.0/1 ...
procs=()
for tok in $placement; do
  name=${tok%%[[:]*} reps=${tok##*:}
  for ((r = 0; r < reps; r++)); do procs+=("$name/$r"); done
done
bad=0
for k in "${!procs[@]}"; do
  want=${allowed[$((k % n))]}
  got=$(grep "^\[${procs[$k]}\] info .*pinned to core" "$W/auto.log" | tail -1 | sed 's/.*pinned to cores\{0,1\} \([0-9,]*\).*/\1/')
  [ "$got" = "$want" ] || { bad=$((bad + 1)); echo "    ${procs[$k]} (process $k): core '$got', want $want"; }
done
[ ${#procs[@]} -ge 3 ] && [ $bad -eq 0 ] \
  && ok "placement '$placement': process k runs on core k % $n (${#procs[@]} processes)" \
  || fail "pinning of '$placement': $bad processes on the wrong core"
out=$(same_ckpt "$W/single" "$W/auto") && ok "stages: auto on cores, pinned = --single-process: $out" \
  || fail "stages: auto on cores differs from --single-process: $out"
left_behind "stages: auto on cores" "$W/auto.log"
# train.priority (auto): with more processes than cores, the processes the
# decision names run at nice 10 (what each read back from the kernel), the
# others at 0; with train.priority: off nobody changes its priority.
niced=$(grep -c '\] info .*running at nice 10 (train.priority' "$W/auto.log")
said=$(grep -o 'the [0-9]* process[es]* with the largest shares at nice 10' <<<"$why" | awk '{ print $2 }')
if [ ${#procs[@]} -gt "$n" ]; then
  [ -n "$said" ] && [ "$niced" -eq "$said" ] && [ "$niced" -lt ${#procs[@]} ] \
    && ok "train.priority: $niced of ${#procs[@]} processes on $n cores run at nice 10, as decided" \
    || fail "train.priority: decision says '${said:-none}', $niced processes at nice 10"
else
  [ "$niced" -eq 0 ] && [ -z "$said" ] && ok "train.priority: a core each, nobody niced" \
    || fail "train.priority: $niced niced with a core per process"
fi
# Weighted routing (the default) stays off where processes share cores (the
# planner dealt micro-batches equally; wall-time speeds there measure the
# sharing): no re-routing, and the steps after the re-placement chain.
if [ ${#procs[@]} -gt "$n" ]; then
  routed=$(grep -c '"action":"route"' "$W/auto/metrics.jsonl")
  last=$(tail -1 "$W/auto/metrics.jsonl" | grep -o '"chained":[0-9]' | sed 's/.*://')
  [ "$routed" -eq 0 ] && [ "$last" = 1 ] \
    && ok "shared cores: weighted routing leaves the equal deal alone, steps chain" \
    || fail "shared cores: $routed re-routings, last step chained '${last:-?}'"
fi
"$BIN" launch "$W/auto.yaml" --out "$W/auto_off" --set train.priority=off --set job.steps=6 \
  >"$W/auto_off.log" 2>&1 || { fail "train.priority: off run failed"; tail -5 "$W/auto_off.log"; }
! grep -q 'running at nice\|at nice 10 (train.priority)' "$W/auto_off.log" "$W/auto_off/metrics.jsonl" \
  && ok "train.priority: off: no process changes its priority" \
  || fail "train.priority: off still niced a process"

# --- train.threads reaches every stage process: 2 threads, 2 cores each ----------------
if [ "$n" -ge 2 ]; then
  "$BIN" launch "$W/plan.yaml" --out "$W/t2" --set job.steps=2 --set train.threads=2 \
    --set train.pin=auto >"$W/t2.log" 2>&1 || { fail "threads 2 run"; tail -3 "$W/t2.log"; }
  got=$(grep -c "pinned to cores ${allowed[0]},${allowed[1]} (train.pin)" "$W/t2.log")
  [ "$got" -eq 3 ] && ok "train.threads 2: each of the 3 stage processes takes 2 cores" \
    || fail "train.threads 2: $got of 3 processes pinned to cores ${allowed[0]},${allowed[1]}"
  # the kernels compute every element the same way in any thread's range:
  # the same run at 1 thread ends with the same checkpoint, bit for bit
  "$BIN" launch "$W/plan.yaml" --out "$W/t1" --set job.steps=2 --set train.threads=1 \
    >"$W/t1.log" 2>&1 || { fail "threads 1 run"; tail -3 "$W/t1.log"; }
  d=$(same_ckpt "$W/t1/ckpt/latest" "$W/t2/ckpt/latest") \
    && ok "train.threads 1 and 2: the same checkpoint ($d)" || fail "train.threads 1 vs 2: $d"
fi

# --- simulate --plan-cores: the same planner on the run's measured costs, on paper -------
out=$("$BIN" simulate "$W/auto.yaml" --costs "$W/auto" --plan-cores 2 2>&1)
grep -qE '^placement image\.0[^ ]* .*fusion:[0-9]+ \(process k on core k % 2\)$' <<<"$out" \
  && grep -qE '^core loads per step \(ms\): [0-9.]+ [0-9.]+$' <<<"$out" \
  && ok "simulate --plan-cores 2: $(grep '(process k on core' <<<"$out")" \
  || { fail "simulate --plan-cores 2"; tail -5 <<<"$out" | sed 's/^/    /'; }
expect_fail "simulate --plan-cores 0 is a usage error" "--plan-cores '0': expected a core count" \
  "$BIN" simulate "$W/auto.yaml" --plan-cores 0
expect_fail "simulate --costs of a --single-process run says it measures no stage" \
  "a --single-process run's step: it measures no stage of its own" \
  "$BIN" simulate "$W/auto.yaml" --costs "$W/single"
# a metrics.jsonl that grows between simulate's two readings (a run still
# training): here a FIFO gives the first reading 1 record and the second all
# of them, handed over only once the first reading has closed it
mkfifo "$W/grows.jsonl"
"$BIN" simulate "$W/auto.yaml" --costs "$W/grows.jsonl" >"$W/grows.txt" 2>&1 &
sim=$!
(
  head -1 "$W/auto/metrics.jsonl" >"$W/grows.jsonl"
  for _ in $(seq 200); do # until the first reading has let go of it
    ls -l /proc/$sim/fd 2>/dev/null | grep -q grows.jsonl || break
    sleep 0.05
  done
  kill -0 $sim 2>/dev/null && cat "$W/auto/metrics.jsonl" >"$W/grows.jsonl"
) &
feeder=$!
wait $sim
rc=$?
kill $feeder 2>/dev/null
wait $feeder 2>/dev/null
[ "$(wc -l <"$W/auto/metrics.jsonl")" -gt 1 ] && [ $rc = 0 ] \
  && grep -q '(median of 1 step)' "$W/grows.txt" \
  && ok "simulate --costs of a metrics.jsonl that grows while read: the records first counted" \
  || { fail "simulate --costs of a growing metrics.jsonl (exit $rc)"; tail -3 "$W/grows.txt" | sed 's/^/    /'; }

# --- 3. a core id this machine does not give ------------------------------------------------
sed "s/pin: auto/pin: [${allowed[0]}, 1023]/" "$W/auto.yaml" >"$W/badpin.yaml"
expect_fail "a core outside this machine's is refused with its place" \
  "badpin.yaml:5:[0-9]+: train.pin\[1\]: core 1023 is not one this machine lets mmpipe use" \
  "$BIN" launch "$W/badpin.yaml" --out "$W/bad"
[ ! -e "$W/bad" ] && ok "nothing started for the bad plan" || fail "the bad plan made $W/bad"
finish
