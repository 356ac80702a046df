# Shared helpers for the tests/cli_*.sh scripts (sourced; not a test itself).
set -uo pipefail
BIN=${MMP_BIN:-${BIN:-build/mmpipe}} # a bench sets BIN (--bin) before sourcing
TMP=${MMP_TMP:-/tmp/mmpipe-test}
# SANITIZED=1: BIN is an ASan+UBSan build (ctest of build-asan/ says so), 3 to
# 10 times slower; a test may shorten its long runs there (fewer steps, the
# same configurations) since the Release pass runs them whole.
SANITIZED=${MMP_TEST_SANITIZED:-0}
fails=0
checks=0
# workdir: W, a fresh $TMP/<script name> for this test's files.
workdir() { W=$TMP/$(basename "$0" .sh); rm -rf "$W"; mkdir -p "$W"; }
# synth SAMPLES SEED: the synthetic data set in $W/data; the test stops when it fails.
synth() {
  "$BIN" data synth --out "$W/data" --samples "$1" --seed "$2" >/dev/null 2>&1 \
    || { echo "synth failed"; exit 1; }
}
# tiny_plan JOB DATA TEXT_LAYERS TRAIN [LINE...]: writes $W/plan.yaml, the
# small model the CLI tests train (width 32, two image blocks, one fusion
# layer); JOB, DATA and TRAIN are the insides of those maps, each LINE one
# more top-level line. train: stays line 5 (tests name it in file:line errors).
tiny_plan() {
  cat > "$W/plan.yaml" <<YAML
job:   { $1 }
data:  { $2 }
model: { width: 32, image: { blocks: [1, 1], channels: [8, 16] },
         text: { layers: $3, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { $4 }
YAML
  [ $# -gt 4 ] && printf '%s\n' "${@:5}" >> "$W/plan.yaml"
  return 0
}
# balance_plan FILE STEPS EVAL_EVERY FORCE: writes FILE, the small real-compute
# plan of the balance tests (data $W/data, five cpu slots, image split [2] with
# image.0 x2), re-planned once by balance.force (FORCE: the insides of that map).
balance_plan() {
  cat >"$1" <<YAML
job:   { name: r, steps: $2, seed: 7 }
data:  { manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64 }
model: { width: 32, image: { blocks: [1, 1, 1], channels: [8, 16, 16] },
         text: { layers: 2, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: $3,
         clip_grad_norm: 0.5 }
hosts: [ { name: localhost, devices: [cpu, cpu, cpu, cpu, cpu] } ]
stages: { image: { split: [2], replicas: [2, 1] } }
balance: { force: { $4 } }
YAML
}
ok()   { checks=$((checks+1)); echo "ok   $*"; }
fail() { checks=$((checks+1)); fails=$((fails+1)); echo "FAIL $*"; }
# expect_fail NAME PATTERN CMD...: CMD must exit non-zero and print PATTERN (grep -E).
expect_fail() {
  local name=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qE -- "$pat" <<<"$out"; then ok "$name"
  else fail "$name (rc=$rc, wanted /$pat/):"; echo "$out" | tail -5 | sed 's/^/    /'; fi
}
# last_metric FILE KEY: the value of KEY in the last line of FILE that has it.
last_metric() { grep "\"$2\"" "$1" | tail -1 | sed -E "s/.*\"$2\":([-0-9.e+]+).*/\1/"; }
# median: of the numbers on stdin ("nan" when none).
median() { sort -g | awk '{ v[NR] = $1 } END { print NR ? (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) : "nan" }'; }
# metric FILE KEY FROM TO: KEY of metrics lines FROM..TO (1-based steps), one per line
metric() { sed -n "$3,$4p" "$1" | grep -o "\"$2\":[-0-9.e+]*" | sed 's/.*://'; }
# stage_tp METRICS BATCH: the image.0 stage's own throughput, median over
# steps 5..12: BATCH samples per second of its slowest replica's busy time.
stage_tp() {
  sed -n 5,12p "$1" | while read -r line; do
    grep -o '"name":"image.0","replica":[0-9]*,"microbatches":[0-9]*,"busy_ms":[0-9.e+]*' <<<"$line" \
      | sed 's/.*://' | sort -g | tail -1 | awk -v b="$2" '{ printf "%.2f\n", b * 1000 / $1 }'
  done | median
}
# same_ckpt A B: `ckpt diff A B` finds no difference at all (max_abs_diff=0);
# prints the diff's last line either way.
same_ckpt() {
  local out rc last
  out=$("$BIN" ckpt diff "$1" "$2" --quiet); rc=$?
  last=$(tail -1 <<<"$out"); echo "$last"
  [ $rc -eq 0 ] && [ "$last" = "max_abs_diff=0 max_rel_diff=0" ]
}
# What a run left behind, from its own log (other tests may run beside this
# one): its stage processes still alive, and its shared-memory segments.
procs_left() { # LOG...
  local n=0 pid
  for pid in $(cat "$@" | grep -o 'started [^ ]* (pid [0-9]*)' | grep -o '[0-9]*)$' | tr -d ')'); do
    # alive and not a zombie (an orphan's zombie waits for init, which may be slow)
    [ -r /proc/$pid/stat ] && [ "$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)" != Z ] && n=$((n+1))
  done
  echo $n
}
shm_left() { # LOG...
  local n=0 prefix
  for prefix in $(cat "$@" | grep -o 'shared memory /mmpipe-[0-9a-f]*' | sed 's#.*/##'); do
    n=$((n + $(ls /dev/shm 2>/dev/null | grep -c "^$prefix")))
  done
  echo $n
}
# left_behind NAME LOG...: one check that the run left no process and no segment.
left_behind() {
  local name=$1; shift
  local p s; p=$(procs_left "$@"); s=$(shm_left "$@")
  [ "$p" -eq 0 ] && [ "$s" -eq 0 ] && ok "$name: nothing left behind" \
    || fail "$name: left $p stage processes, $s shm segments"
}
# kill_stage LABEL PLAN OUT VICTIM [ARG...]: launches PLAN (job.steps=100000, ARGs added) into
# OUT, SIGKILLs stage VICTIM/0 at step 3 and checks that the coordinator fails naming the dead
# stage within 5 s, and that nothing is left behind (log: OUT.log).
kill_stage() {
  local label=$1 plan=$2 out=$3 victim=$4; shift 4
  local cpid vpid t0 dt rc
  "$BIN" launch "$plan" --out "$out" --set job.steps=100000 "$@" >"$out.log" 2>&1 &
  cpid=$!
  wait_step "$out/metrics.jsonl" 3 || fail "$label: no step 3"
  vpid=$(grep -o "started $victim/0 (pid [0-9]*)" "$out.log" | grep -o '[0-9]*)$' | tr -d ')')
  t0=$(date +%s.%N)
  kill -KILL "$vpid"; wait $cpid; rc=$?
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  sleep 0.2
  if [ $rc -ne 0 ] && grep -q "stage $victim/0 (pid $vpid) died" "$out.log" \
     && awk -v d="$dt" 'BEGIN{exit !(d < 5)}'; then ok "$label: noticed in ${dt}s, named, rc=$rc"
  else fail "$label: rc=$rc after ${dt}s"; tail -3 "$out.log" | sed 's/^/    /'; fi
  left_behind "$label" "$out.log"
}
# last_step FILE: the step of metrics.jsonl's last line (0 when none).
last_step() { tail -1 "$1" 2>/dev/null | grep -o '^{"step":[0-9]*' | grep -o '[0-9]*$' || echo 0; }
# wait_step FILE N [SECONDS]: waits until metrics.jsonl FILE reached step N.
wait_step() {
  local i
  for i in $(seq $((${3:-60} * 20))); do
    [ "$(last_step "$1")" -ge "$2" ] 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# steps_once FILE N: metrics.jsonl FILE holds steps 1..N, each exactly once, in order.
steps_once() {
  [ "$(grep -o '^{"step":[0-9]*' "$1" | grep -o '[0-9]*$' | tr '\n' ' ')" = "$(seq -s ' ' 1 "$2") " ]
}
# run_prefix LOG: the run's shared-memory prefix (/mmpipe-<hex>) from its
# coordinator log; empty while the log does not say it yet.
run_prefix() { grep -o 'shared memory /mmpipe-[0-9a-f]*' "$1" | head -1 | sed 's/.*memory //'; }
# stage_pid LOG STAGE: the pid of replica 0 of STAGE ("text.0") of that run
# only: fails, printing nothing, while the log names no prefix (a pattern
# without one would match the stages of any run on this machine: another
# test's under ctest -j, a user's job).
stage_pid() {
  local p; p=$(run_prefix "$1")
  [ -n "$p" ] || return 1
  pgrep -f -- "--stage $2 --replica 0 --shm-prefix $p( |\$)" | head -1
}
# trace_ok FILE: trace.json is one Chrome-trace JSON object, one event per line
# (the writer's format); python3's json parser too when there is one.
trace_ok() {
  awk 'NR==1 { if ($0 != "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[") bad=1; next }
       { if (NR > 2 && $0 != "]}" && prev !~ /^\{.*\},$/) bad=1
         if (NR > 2 && $0 == "]}" && prev !~ /^\{.*\}$/) bad=1
         prev=$0 }
       END { if (prev != "]}" || bad) exit 1 }' "$1" || return 1
  if command -v python3 >/dev/null; then python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1" || return 1; fi
}
# finish: prints the summary; a test that passed removes its work dir W (a
# seed-scale run leaves 3 GB of checkpoints; CI's disk holds two builds' worth
# of tests), one that failed keeps it to look at, and MMP_KEEP_TMP=1 keeps all.
# A test with an EXIT trap (hosts_down, slurm's cleanup) stops what it started
# from pid files in W: W then goes after that trap, not before it.
finish_rm_w() { rm -rf "$W"; }
finish() {
  echo "$(basename "$0"): $checks checks, $fails failed"
  [ $checks -gt 0 ] && [ $fails -eq 0 ] || return 1
  [ "${MMP_KEEP_TMP:-0}" = 1 ] || [ -z "${W:-}" ] && return 0
  local t
  t=$(trap -p EXIT)
  if [ -n "$t" ]; then
    eval "${t% EXIT}"\''; finish_rm_w'\'' EXIT'
  else
    finish_rm_w
  fi
}
