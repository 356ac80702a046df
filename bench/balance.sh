#!/usr/bin/env bash
# The load balancer's measured figures, one run, medians; judges nothing.
# tests/cli_balance.sh asserts the balancer's decisions; the speed they buy
# is measured here (speed lives in bench/, never in timed tests):
#  1. weighted vs round-robin routing, image.0 x2 with one replica slowed 2x
#     (sim.slowdown): end-to-end samples/s and the image stage's own
#     throughput (samples per second of its slowest replica's busy time);
#  2. configs/sim-uneven.yaml (4:1:1 on six slots): dynamic balancing vs the
#     static 2/2/2 placement, steady samples/s and balance efficiency; beside
#     them the schedule's own floor at the costs each run measured
#     (`mmpipe simulate --costs`: predicted step, with no send or step
#     overhead), and the ratio and efficiency that floor allows; with
#     --reps N (a shared machine) N static/dynamic pairs alternate and each
#     figure is the median over the pairs (the floors: the first pair's);
#  3. cost drift (text x3 at step 100): the step of the re-plan and the
#     measured efficiency after it;
#  4. `mmpipe simulate --costs` on a demo pipeline run: predicted vs measured
#     step time.
# Prints a Markdown table (for the README).
#   bench/balance.sh [--bin build/mmpipe] [--out runs/bench-balance] [--reps 1]
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/balance.sh --bin=BIN=build/mmpipe --out=OUT=runs/bench-balance --reps=REPS=1 \
  -- "$@"
[[ "$REPS" =~ ^[1-9][0-9]?$ ]] || { say "--reps: $REPS is not a count from 1 to 99"; exit 2; }
bench_need_bin
. tests/lib.sh # median, metric, stage_tp
bench_fresh_out
run() { # NAME ARGS...: a run into $OUT/NAME; its log beside it
  local name=$1; shift
  say "$name ..."
  "$BIN" launch "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 \
    || { say "$name failed (see $OUT/$name.log)"; exit 1; }
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
"$BIN" data synth --out "$OUT/data" --samples 2000 --seed 4 >/dev/null 2>&1 || { say "synth failed"; exit 1; }
D="--set data.manifest=$OUT/data/train.jsonl"

# --- 1. routing ---------------------------------------------------------------------------
for r in round_robin weighted; do
  run "$r" configs/sim-slow-replica.yaml $D --set balance.routing=$r
done
rr=$(metric "$OUT/round_robin/metrics.jsonl" samples_per_s 5 12 | median)
wt=$(metric "$OUT/weighted/metrics.jsonl" samples_per_s 5 12 | median)
srr=$(stage_tp "$OUT/round_robin/metrics.jsonl" 96)
swt=$(stage_tp "$OUT/weighted/metrics.jsonl" 96)

# --- 2. sim-uneven: static vs dynamic ---------------------------------------------------------
# pair k's runs: static, dynamic (k = 1), static.k, dynamic.k (k > 1)
for k in $(seq 1 "$REPS"); do
  x=$([ "$k" -eq 1 ] || echo ".$k")
  run "static$x" configs/sim-uneven.yaml $D --set job.steps=8 --set balance.mode=off
  run "dynamic$x" configs/sim-uneven.yaml $D --set job.steps=30
done
pairs() { # WHICH KEY FIRST LAST: per pair, the median of KEY over those steps
  for k in $(seq 1 "$REPS"); do
    x=$([ "$k" -eq 1 ] || echo ".$k")
    metric "$OUT/$1$x/metrics.jsonl" "$2" "$3" "$4" | median
  done
}
per_pair_ratio() { # KEY: per pair, dynamic steps 21-30 over static steps 2-8 (step_ms: inverted)
  paste <(pairs static "$1" 2 8) <(pairs dynamic "$1" 21 30) \
    | awk -v inv="$([ "$1" = step_ms ] && echo 1 || echo 0)" '{ printf "%.4f\n", inv ? $1 / $2 : $2 / $1 }'
}
t_static=$(pairs static samples_per_s 2 8 | median)
e_static=$(pairs static efficiency 2 8 | median)
t_dyn=$(pairs dynamic samples_per_s 21 30 | median)
e_dyn=$(pairs dynamic efficiency 21 30 | median)
s_static=$(pairs static step_ms 2 8 | median)
s_dyn=$(pairs dynamic step_ms 21 30 | median)
r_tp=$(per_pair_ratio samples_per_s | median)
r_step=$(per_pair_ratio step_ms | median)
floor() { # RUN: "predicted_ms busy_ms_sum" of the run's last placement
  "$BIN" simulate configs/sim-uneven.yaml --costs "$1" $D 2>&1 | awk '
    $1 ~ /^(image|text|fusion)/ && NF >= 10 { busy += $8 }
    /^predicted step time/ { ms = $4 }
    END { if (ms > 0) printf "%s %.1f", ms, busy }'
}
read -r f_static _ <<<"$(floor "$OUT/static")"
read -r f_dyn b_dyn <<<"$(floor "$OUT/dynamic")"
slots=6
# the placements steps 21-30 ran, every pair (a re-placement back, under load, shows here)
places=$(for f in "$OUT"/dynamic/metrics.jsonl "$OUT"/dynamic.*/metrics.jsonl; do
  [ -f "$f" ] && sed -n 21,30p "$f"
done | grep -o '"placement":"[^"]*"' | sort -u | cut -d'"' -f4 | paste -sd';')

# --- 3. drift ------------------------------------------------------------------------------------
run drift configs/sim-uneven.yaml $D --set job.steps=125 --set sim.change_step=100 --set sim.change.text=3.0
re=$(grep -n '"action":"replace"' "$OUT/drift/metrics.jsonl" | cut -d: -f1 | awk '$1 >= 100' | head -1)
e_drift=$(metric "$OUT/drift/metrics.jsonl" efficiency 118 125 | median)

# --- 4. simulate vs measured on the demo model ------------------------------------------------------
run demo configs/demo.yaml $D --set job.steps=60 --set train.eval_every=0
err=$("$BIN" simulate configs/demo.yaml --costs "$OUT/demo" $D 2>&1 | grep -o 'prediction error [-+0-9.]*%' | grep -o '[-+0-9.]*%')

echo "| comparison (one run$([ "$REPS" -gt 1 ] && echo ", sim-uneven $REPS pairs"), medians) | measured | baseline | ratio |"
echo "|---|---|---|---|"
echo "| weighted vs round-robin routing, one of two image replicas 2x slow: samples/s | $wt | $rr | $(ratio "$wt" "$rr")x |"
echo "| the same, image stage throughput (slowest replica's busy time) | $swt | $srr | $(ratio "$swt" "$srr")x |"
echo "| sim-uneven: dynamic (steps 21-30: $places) vs static 2/2/2: samples/s | $t_dyn | $t_static | $(ratio "$r_tp" 1)x |"
echo "| sim-uneven: balance efficiency, dynamic vs static | $e_dyn | $e_static | |"
echo "| sim-uneven: step ms, dynamic vs static (steps 21-30, 2-8) | $s_dyn | $s_static | $(ratio "$r_step" 1)x |"
echo "| the same, the schedule's floor at the measured costs (\`simulate --costs\`) | ${f_dyn:-?} | ${f_static:-?} | $(ratio "${f_static:-0}" "${f_dyn:-1}")x |"
echo "| sim-uneven dynamic: measured step over its floor; efficiency the floor allows | $(ratio "$s_dyn" "${f_dyn:-1}")x | $(awk -v b="${b_dyn:-0}" -v f="${f_dyn:-1}" -v s=$slots 'BEGIN { printf "%.4f", b / (s * f) }') | |"
echo "| drift (text x3 at step 100): re-planned after step, efficiency steps 118-125 | ${re:-none}, $e_drift | | |"
echo "| demo pipeline, 60 steps: \`simulate --costs\` step time prediction error | ${err:-none} | | |"
