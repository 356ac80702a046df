#!/usr/bin/env bash
# mmpipe bench, end to end on a tiny simulated plan (runs take a fraction of
# a second): a grid of 2 schedules x 2 micro-batch counts x 2 placements plus
# the single-process baseline writes results.csv (9 rows with numbers),
# results.md, a run directory with trace.json per pipeline run, and two PNG
# charts; --dry-run runs nothing; a bad --placement or --schedules value is a
# usage error, a placement the plan refuses is refused before any run; a run
# that fails is reported in the table, the others still
# run, and the exit status is 1; an existing bench needs --force, which
# replaces it.
# Needs gnuplot (scripts/setup installs gnuplot-nox).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "FAIL gnuplot not found: mmpipe bench draws its charts with it; install gnuplot-nox (scripts/setup does)"
  exit 1
fi
synth 200 2
# 4 layers in the image branch (stem, 2 blocks, projection): split [2] cuts
# it in two sub-stages, split [9] is beyond it (launch refuses the plan).
tiny_plan "name: b, steps: 50, seed: 3" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 16, val_samples: 16" \
  1 "batch: 8, microbatches: 4, eval_every: 0" \
  "compute: simulated" "sim:   { cost: { image: 1, text: 0.3, fusion: 0.3 }, bwd_factor: 2 }"
grid=(--steps 3 --warmup 1 --schedules gpipe,1f1b --microbatches 2,4
      --placement plan --placement 'split=stages.image.split=[2]')
is_num() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v x="$1" 'BEGIN { exit !(x > 0) }'; }
png() { [ "$(head -c 8 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }

# --- --dry-run: the runs, nothing run -----------------------------------------------------
out=$("$BIN" bench "$W/plan.yaml" --out "$W/dry" "${grid[@]}" --dry-run 2>&1); rc=$?
n=$(grep -c '^\[[0-9]*/9\]' <<<"$out")
if [ $rc -eq 0 ] && [ "$n" -eq 9 ] && grep -q -- "--single-process" <<<"$out" \
   && grep -q "stages.image.split=\[2\]" <<<"$out" && [ ! -e "$W/dry" ]; then
  ok "--dry-run lists 9 runs and runs none"
else
  fail "--dry-run (rc=$rc, $n runs listed, dir made: $([ -e "$W/dry" ] && echo yes || echo no))"
  echo "$out" | tail -5 | sed 's/^/    /'
fi

# --- usage errors ---------------------------------------------------------------------------
usage_error() { # NAME PATTERN ARGS...: exit status 2 and PATTERN on stderr
  local name=$1 pat=$2; shift 2
  local out rc
  out=$("$BIN" bench "$W/plan.yaml" --out "$W/usage" "$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -qE -- "$pat" <<<"$out" && [ ! -e "$W/usage" ]; then ok "$name"
  else fail "$name (rc=$rc, wanted 2 and /$pat/):"; echo "$out" | head -3 | sed 's/^/    /'; fi
}
usage_error "unknown --schedules value" "--schedules: unknown value 'zb' \(one of: gpipe, 1f1b, zb-h1\)" \
  --schedules gpipe,zb
out=$("$BIN" bench "$W/plan.yaml" --out "$W/dry" --schedules zb-h1 --microbatches 4 \
  --placement 'split=stages.image.split=[2]' --dry-run 2>&1)
grep -q "train.schedule=zb-h1" <<<"$out" && ok "--schedules zb-h1: its runs set train.schedule=zb-h1" \
  || { fail "--schedules zb-h1 dry run:"; echo "$out" | tail -3 | sed 's/^/    /'; }
usage_error "--placement without KEY=VALUE" "--placement 'split=stages.image.split': .* is not KEY=VALUE" \
  --placement 'split=stages.image.split'
usage_error "--placement without a name" "--placement '=stages.image.split=\[2\]': no NAME" \
  --placement '=stages.image.split=[2]'
usage_error "--microbatches not numbers" "--microbatches: '2,four'" --microbatches 2,four
usage_error "--set of a key the grid sets" "--set 'train.microbatches=8': the grid sets this key" \
  --set train.microbatches=8
usage_error "unknown --precisions value" "--precisions: unknown value 'fp8' \(one of: fp32, bf16, fp16\)" \
  --precisions bf16,fp8
usage_error "--set train.precision: the precision axis owns it" \
  "--set 'train.precision=bf16': the grid sets this key; use --precisions" --set train.precision=bf16
usage_error "--placement without a value does not take the next option" \
  "--placement needs a value, not the option '--dry-run'" --placement --dry-run
# every run's plan is loaded before any runs (and by --dry-run): a typo in a
# placement, or a value the plan refuses, is found in a second, not after
# the baseline ran
for pl in 'typo=train.batchsize=4' 'beyond=stages.image.split=[9]'; do
  out=$("$BIN" bench "$W/plan.yaml" --out "$W/usage" --placement "$pl" --dry-run 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -qE "run [a-z0-9-]*-${pl%%=*}-[a-z]* \(.*\): .*(batchsize|split)" <<<"$out" && [ ! -e "$W/usage" ] \
    && ok "--placement '$pl' refused before any run, naming the run" \
    || { fail "--placement '$pl' (rc=$rc)"; echo "$out" | head -3 | sed 's/^/    /'; }
done

# --- the grid ------------------------------------------------------------------------------------
t0=$(date +%s.%N)
"$BIN" bench "$W/plan.yaml" --out "$W/grid" "${grid[@]}" >"$W/grid.out" 2>"$W/grid.err"; rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
[ $rc -eq 0 ] && ok "grid of 9 runs: exit 0 in ${took} s" \
  || { fail "grid rc=$rc"; tail -5 "$W/grid.err" | sed 's/^/    /'; }
csv=$W/grid/results.csv
header=run_id,schedule,microbatches,placement,balance,precision,samples_per_s,ratio_to_single,step_ms,bubble_measured,bubble_predicted,balance_efficiency,peak_mem,status
[ "$(head -1 "$csv" 2>/dev/null)" = "$header" ] && ok "results.csv header" \
  || fail "results.csv header: $(head -1 "$csv" 2>/dev/null)"
rows=$(tail -n +2 "$csv" 2>/dev/null | grep -c .)
[ "$rows" -eq 9 ] && ok "results.csv has 9 rows" || fail "results.csv has $rows rows, want 9"
bad=0
while IFS=, read -r id sched m place bal prec sps ratio step bm bp eff peak status; do
  if ! is_num "$sps" || ! is_num "$ratio" || ! is_num "$step" || [ "$status" != ok ] \
     || [ "$prec" != fp32 ]; then
    bad=$((bad+1)); echo "    bad row: $id sps=$sps ratio=$ratio step=$step status=$status"
  fi
  if [ "$id" != single ] && ! is_num "$bp"; then
    bad=$((bad+1)); echo "    no predicted bubble: $id '$bp'"
  fi
done < <(tail -n +2 "$csv" 2>/dev/null)
[ $bad -eq 0 ] && ok "every row: numeric samples/s, ratio, step time; status ok; predicted bubble" \
  || fail "$bad bad rows"
ratio=$(grep '^single,' "$csv" | cut -d, -f8)
[ "$ratio" = 1.0000 ] && ok "baseline ratio 1" || fail "baseline ratio '$ratio'"
grep -q '^1f1b-m4-split-off,1f1b,4,[^,]*,off,.*image\.1:[0-9.]*MB' "$csv" \
  && ok "split run: its stages' peak memory, image.1 included" || fail "split run row: $(grep split-off "$csv" | head -1)"
[ -s "$W/grid/results.md" ] && grep -q '^| run |' "$W/grid/results.md" && grep -q '^| run |' "$W/grid.out" \
  && ok "results.md written and printed" || fail "results.md"
traces=0
for d in "$W"/grid/runs/*-m*-*; do [ -s "$d/trace.json" ] && traces=$((traces+1)); done
[ "$traces" -eq 8 ] && ok "8 pipeline runs, each with trace.json" || fail "$traces run dirs with trace.json, want 8"
# what bench --help promises in DIR: each run's log.txt, simulate.txt (the
# prediction) for the pipeline runs, and charts.gp beside the charts
logs=0; sims=0
for d in "$W"/grid/runs/*; do [ -s "$d/log.txt" ] && logs=$((logs+1)); done
for d in "$W"/grid/runs/*-m*-*; do [ -s "$d/simulate.txt" ] && sims=$((sims+1)); done
[ "$logs" -eq 9 ] && [ "$sims" -eq 8 ] && [ -s "$W/grid/charts.gp" ] \
  && ok "each run's log.txt, the pipeline runs' simulate.txt, charts.gp (as --help says)" \
  || fail "$logs log.txt (want 9), $sims simulate.txt (want 8), charts.gp: $(ls "$W/grid" | paste -sd' ')"
[ "$(grep -c '^\[[0-9]/9\] .*samples/s (step [0-9]* ms)' "$W/grid.err")" -eq 9 ] \
  && [ "$(grep -c "^\[[0-9]/9\] .*: running (its progress: $W/grid/runs/.*/log.txt)$" "$W/grid.err")" -eq 9 ] \
  && [ "$(sed -n 2p "$W/grid.err" | grep -c '^\[1/9\] .*: running')" -eq 1 ] \
  && ok "a line as each run starts (naming its log.txt), one with its result" \
  || { fail "progress lines:"; head -12 "$W/grid.err" | sed 's/^/    /'; }
for c in throughput stages; do
  png "$W/grid/$c.png" && ok "$c.png is a PNG" || fail "$c.png missing or not a PNG ($(tail -2 "$W/grid/gnuplot.log" 2>/dev/null))"
done

# --- the precision axis: a baseline per precision, each run compared with its own ------------
pgrid=(--steps 2 --warmup 1 --schedules 1f1b --microbatches 2 --precisions fp32,bf16)
out=$("$BIN" bench "$W/plan.yaml" --out "$W/pdry" "${pgrid[@]}" --dry-run 2>&1)
want="single-process m=4 fp32|1f1b m=2 plan balance=off fp32|single-process m=4 bf16|1f1b m=2 plan balance=off bf16"
got=$(grep -o '^\[[0-9]*/4\] .*' <<<"$out" | sed 's/^\[[0-9]*\/4\] //' | paste -sd'|')
sets=$(grep -c 'train.precision=fp32' <<<"$out")/$(grep -c 'train.precision=bf16' <<<"$out")
[ "$got" = "$want" ] && [ "$sets" = 2/2 ] \
  && ok "--precisions fp32,bf16 --dry-run: a baseline and the grid per precision, each run sets it" \
  || { fail "--precisions dry run: runs '$got', train.precision sets fp32/bf16 $sets"; }
"$BIN" bench "$W/plan.yaml" --out "$W/prec" "${pgrid[@]}" >"$W/prec.out" 2>"$W/prec.err"; rc=$?
pcsv=$W/prec/results.csv
ids=$(tail -n +2 "$pcsv" 2>/dev/null | cut -d, -f1,6 | paste -sd' ')
[ $rc -eq 0 ] && [ "$ids" = "single-fp32,fp32 1f1b-m2-plan-off-fp32,fp32 single-bf16,bf16 1f1b-m2-plan-off-bf16,bf16" ] \
  && ok "precision grid: 4 runs, ids and precision column" \
  || { fail "precision grid rc=$rc rows '$ids'"; tail -3 "$W/prec.err" | sed 's/^/    /'; }
ran=""
for id in single-fp32 1f1b-m2-plan-off-fp32 single-bf16 1f1b-m2-plan-off-bf16; do
  ran+="$(grep -o '"precision": *"[a-z0-9]*"' "$W/prec/runs/$id/plan.json" 2>/dev/null | grep -o '[a-z0-9]*"$' | tr -d '"') "
done
[ "$ran" = "fp32 fp32 bf16 bf16 " ] && ok "each run trained in its precision (its plan.json)" \
  || fail "the runs' plan.json precisions: '$ran'"
# ratio_to_single of each pipeline row = its samples/s over the baseline of ITS precision
bad=$(awk -F, 'NR > 1 { sps[$1] = $7; ratio[$1] = $8 } END {
  n = 0
  split("fp32 bf16", P, " ")
  for (i = 1; i <= 2; i++) {
    p = P[i]; r = "1f1b-m2-plan-off-" p; b = "single-" p
    if (!(sps[b] > 0) || !(sps[r] > 0)) { n++; continue }
    want = sps[r] / sps[b]; d = ratio[r] - want
    if (d < -0.0002 * want - 0.0001 || d > 0.0002 * want + 0.0001) n++
    if (ratio[b] != "1.0000") n++
  }
  print n }' "$pcsv")
[ "$bad" = 0 ] && ok "ratio_to_single: each run over its own precision's baseline" \
  || { fail "ratio_to_single per precision ($bad wrong):"; sed 's/^/    /' "$pcsv"; }
grep -q '^| 1f1b-m2-plan-off-bf16 | 1f1b | 2 | [^|]* | off | bf16 |' "$W/prec/results.md" \
  && ok "results.md: precision column" || fail "results.md has no precision column"

# --- an existing bench needs --force --------------------------------------------------------------
expect_fail "a second bench into the same DIR is refused" "pass --force" \
  "$BIN" bench "$W/plan.yaml" --out "$W/grid" --steps 1 --warmup 0

# --- a failing run (a plan that loads; its launch fails: no manifest) ---------------------------------
"$BIN" bench "$W/plan.yaml" --out "$W/fail" --steps 2 --warmup 1 --schedules 1f1b --microbatches 2 \
  --placement plan --placement "beyond=data.manifest=$W/none.jsonl" >"$W/fail.out" 2>"$W/fail.err"; rc=$?
[ $rc -eq 1 ] && ok "a failed run makes the exit status 1" || fail "failing grid rc=$rc, want 1"
grep -q '^| 1f1b-m2-beyond-off |.*| failed: .*none.jsonl' "$W/fail/results.md" 2>/dev/null \
  && ok "the failed run is in the table with its error" \
  || { fail "no failed row in results.md:"; cat "$W/fail/results.md" 2>/dev/null | sed 's/^/    /'; }
grep -qE '^1f1b-m2-beyond-off,.*,"?failed: .*none.jsonl' "$W/fail/results.csv" 2>/dev/null \
  && ok "results.csv: failed status" || fail "results.csv: no failed status"
okrows=$(grep -c ',ok$' "$W/fail/results.csv" 2>/dev/null)
[ "$okrows" -eq 2 ] && ok "the other runs completed (baseline + plan)" || fail "$okrows ok rows, want 2"

# --- --force replaces the earlier bench ---------------------------------------------------------------
"$BIN" bench "$W/plan.yaml" --out "$W/fail" --force --no-single --steps 1 --warmup 0 --schedules gpipe \
  --microbatches 2 >"$W/force.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ ! -e "$W/fail/runs/single" ] && [ "$(tail -n +2 "$W/fail/results.csv" | wc -l)" -eq 1 ]; then
  ok "--force replaces the earlier bench (its runs gone, one new row)"
else
  fail "--force (rc=$rc): $(ls "$W/fail/runs" | tr '\n' ' ')"
fi
finish
