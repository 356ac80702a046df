#!/usr/bin/env bash
# What model.fusion.itc_scope: batch costs against microbatch, one run,
# medians; judges nothing. One `mmpipe bench` grid whose two placements
# differ only in the scope (a placement may set any plan key):
#   mmpipe bench PLAN --schedules gpipe,1f1b --microbatches 4,8 \
#     --placement batch=model.fusion.itc_scope=batch \
#     --placement microbatch=model.fusion.itc_scope=microbatch
# then, per schedule and micro-batch count, batch's samples/s over
# microbatch's, both predicted bubbles and each stage's peak memory (batch
# scope holds all m micro-batches' activations in every stage; 1F1B's lists
# become GPipe's). Prints a Markdown table (for the README).
#   bench/itc_scope.sh [--bin build/mmpipe] [--plan configs/demo.yaml]
#                      [--out runs/bench-itc-scope] [--steps 10] [--set KEY=VALUE]...
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/itc_scope.sh --bin=BIN=build/mmpipe --plan=PLAN=configs/demo.yaml \
  --out=OUT=runs/bench-itc-scope --steps=STEPS=10 --set=+sets -- "$@"
bench_need_bin
"$BIN" bench "$PLAN" --out "$OUT" --force --steps "$STEPS" --warmup 3 --schedules gpipe,1f1b \
  --microbatches 4,8 --placement batch=model.fusion.itc_scope=batch \
  --placement microbatch=model.fusion.itc_scope=microbatch ${sets[@]+"${sets[@]}"} >/dev/null \
  || { echo "bench/itc_scope.sh: mmpipe bench failed (see $OUT/results.md)" >&2; exit 1; }
csv=$OUT/results.csv
echo "| schedule | m | samples/s batch | samples/s microbatch | batch / microbatch | predicted bubble batch / microbatch | peak memory batch | peak memory microbatch |"
echo "|---|--:|--:|--:|--:|--:|---|---|"
for sched in gpipe 1f1b; do
  for m in 4 8; do
    b=$(grep "^$sched-m$m-batch-" "$csv"); u=$(grep "^$sched-m$m-microbatch-" "$csv")
    [ -n "$b" ] && [ -n "$u" ] || { echo "| $sched | $m | missing run | | | | | |"; continue; }
    awk -F, -v b="$b" -v u="$u" -v s="$sched" -v m="$m" 'BEGIN {
      nb = split(b, B, ","); nu = split(u, U, ",")
      printf "| %s | %d | %.1f | %.1f | %.2fx | %.1f%% / %.1f%% | %s | %s |\n", s, m, B[7], U[7],
        (U[7] > 0 ? B[7] / U[7] : 0), 100 * B[11], 100 * U[11], B[13], U[13] }'
  done
done
echo
echo "$STEPS measured steps per run after 3 warm-up steps; medians. Plan $PLAN${sets[*]:+ (${sets[*]})}; full results: $OUT/results.md"
