#!/usr/bin/env bash
# Where the zero-bubble schedule (train.schedule: zb-h1) wins and where it
# does not: one `mmpipe bench` grid of gpipe, 1f1b and zb-h1 over four
# placements, one run, medians; judges nothing. All with the loss per
# micro-batch (model.fusion.itc_scope: microbatch; under batch scope every
# stage runs all m forwards first and zb-h1 only shortens the drain).
#   sim-deep  compute: simulated (a sleep per layer and sample: the machine's
#             load does not reach it), image cut into three equal
#             sub-stages (stages.image.split [2,4], sim.cost image 3 : text
#             1 : fusion 1 ms per sample): every stage costs the same, the
#             1F1B bubble is the chain's fill and drain, which zb-h1's
#             deferred weight passes fill;
#   sim-plan  the same costs on the plan's three processes: the image stage
#             is the bottleneck (imbalance, not fill and drain): no gain;
#   deep      real compute, image cut into four (split [1,2,3]);
#   plan      real compute, the plan's three processes.
# Per placement and schedule: measured samples/s and its ratio to 1f1b's,
# the measured bubble (the stages' idle share) and the simulator's on the
# run's own measured costs (W = half of each backward), then the
# simulator's on nominal costs (`mmpipe simulate`, no machine in them).
# Prints Markdown (for the README).
#   bench/zb_h1.sh [--bin build/mmpipe] [--plan configs/demo.yaml] [--m 8]
#                  [--out runs/bench-zb-h1] [--steps 10] [--set KEY=VALUE]...
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/zb_h1.sh --bin=BIN=build/mmpipe --plan=PLAN=configs/demo.yaml \
  --out=OUT=runs/bench-zb-h1 --steps=STEPS=10 --m=M=8 --set=+sets -- "$@"
bench_need_bin
SCOPE=model.fusion.itc_scope=microbatch
SIM=compute=simulated,sim.cost.image=3,sim.cost.text=1,sim.cost.fusion=1
# KEY=VALUE,KEY=VALUE one a line (commas inside [] belong to the value)
split_keys() {
  printf '%s' "$1" | awk 'BEGIN { RS = "\001" } {
    d = 0; s = ""
    for (i = 1; i <= length($0); i++) {
      c = substr($0, i, 1); d += (c == "[") - (c == "]")
      if (c == "," && d == 0) { print s; s = "" } else { s = s c }
    }
    print s }'
}
names=(sim-deep sim-plan deep plan)
keys=("$SCOPE,$SIM,stages.image.split=[2,4]" "$SCOPE,$SIM" "$SCOPE,stages.image.split=[1,2,3]" "$SCOPE")
places=()
for i in "${!names[@]}"; do places+=(--placement "${names[$i]}=${keys[$i]}"); done
"$BIN" bench "$PLAN" --out "$OUT" --force --steps "$STEPS" --warmup 3 --schedules gpipe,1f1b,zb-h1 \
  --microbatches "$M" "${places[@]}" ${sets[@]+"${sets[@]}"} >/dev/null \
  || { echo "bench/zb_h1.sh: mmpipe bench failed (see $OUT/results.md)" >&2; exit 1; }
csv=$OUT/results.csv
echo "| placement | schedule | samples/s | / 1f1b | bubble measured | bubble simulated (measured costs) | bubble simulated (nominal costs) |"
echo "|---|---|--:|--:|--:|--:|--:|"
for i in "${!names[@]}"; do
  pl=${names[$i]}
  ref=$(grep "^1f1b-m$M-$pl-" "$csv" | cut -d, -f7)
  extra=(--set train.microbatches="$M")
  while read -r k; do extra+=(--set "$k"); done < <(split_keys "${keys[$i]}")
  for sched in gpipe 1f1b zb-h1; do
    row=$(grep "^$sched-m$M-$pl-" "$csv")
    nominal=$("$BIN" simulate "$PLAN" ${sets[@]+"${sets[@]}"} "${extra[@]}" --set train.schedule=$sched \
      | grep -o 'bubble [0-9.]*%' | cut -d' ' -f2)
    [ -n "$row" ] || { echo "| $pl | $sched | missing run | | | | $nominal |"; continue; }
    awk -v r="$row" -v ref="${ref:-0}" -v pl="$pl" -v s="$sched" -v nom="$nominal" 'BEGIN {
      split(r, R, ",")
      printf "| %s | %s | %.1f | %.2fx | %.1f%% | %.1f%% | %s |\n", pl, s, R[7],
        (ref > 0 ? R[7] / ref : 0), 100 * R[10], 100 * R[11], nom }'
  done
done
echo
echo "m=$M; $STEPS measured steps per run after 3 warm-up steps, medians; placements: $(for i in "${!names[@]}"; do printf '%s = %s; ' "${names[$i]}" "${keys[$i]}"; done)"
echo "Plan $PLAN${sets[*]:+ (${sets[*]})}; full results: $OUT/results.md"
