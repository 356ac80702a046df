#!/usr/bin/env bash
# What zero-copy posting buys the pipeline, one run, medians; judges
# nothing. Launches PLAN `--pairs` times with zero-copy posting on (the
# default: a stage computes its output straight into the channel's slot) and
# off (MMP_ZERO_COPY=0: into its own buffer, then copied into the slot),
# alternating, and prints the median samples/s of each (every step after 3
# warm-up steps of every run) and their ratio as a Markdown table.
#   bench/zero_copy.sh [--bin build/mmpipe] [--plan configs/demo.yaml]
#                      [--out runs/bench-zero-copy] [--steps 20] [--pairs 3]
#                      [--set KEY=VALUE]...
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/zero_copy.sh --bin=BIN=build/mmpipe --plan=PLAN=configs/demo.yaml \
  --out=OUT=runs/bench-zero-copy --steps=STEPS=20 --pairs=PAIRS=3 --set=+sets -- "$@"
bench_need_bin
mkdir -p "$OUT"
rm -f "$OUT/zc1.sps" "$OUT/zc0.sps"
for p in $(seq 1 "$PAIRS"); do
  for zc in 1 0; do
    run=$OUT/zc$zc-$p
    MMP_ZERO_COPY=$zc "$BIN" launch "$PLAN" --out "$run" --force --set job.steps="$STEPS" \
      --set train.eval_every=100000 ${sets[@]+"${sets[@]}"} >"$OUT/zc$zc-$p.log" 2>&1 \
      || { echo "bench/zero_copy.sh: launch failed (see $OUT/zc$zc-$p.log)" >&2; exit 1; }
    # samples/s of every step after 3 warm-up steps
    sed -n 's/.*"step":\([0-9]*\),.*"samples_per_s":\([0-9.e+-]*\),.*/\1 \2/p' "$run/metrics.jsonl" |
      awk '$1 > 3 { print $2 }' >>"$OUT/zc$zc.sps"
  done
done
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
on=$(median "$OUT/zc1.sps"); off=$(median "$OUT/zc0.sps")
echo "| zero-copy posting | samples/s (median) | steps |"
echo "|---|--:|--:|"
echo "| on (default) | $on | $(wc -l <"$OUT/zc1.sps") |"
echo "| off (MMP_ZERO_COPY=0) | $off | $(wc -l <"$OUT/zc0.sps") |"
awk -v a="$on" -v b="$off" 'BEGIN { printf "\non / off = %.3f\n", (b > 0 ? a / b : 0) }'
echo "$PAIRS runs each, alternating, $STEPS steps a run, 3 warm-up steps left out; plan $PLAN${sets[*]:+ (${sets[*]})}"
rm -f "$OUT/zc1.sps" "$OUT/zc0.sps"
