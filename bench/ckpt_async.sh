#!/usr/bin/env bash
# What background checkpoints (train.ckpt_async) buy, one run, medians;
# judges nothing. Launches PLAN `--pairs` times with checkpoints written in
# the background (on) and at once (off, the default), alternating, every
# `--every` steps, and prints the median wall time of a run, the time a
# checkpoint cost the run ((off - on) / checkpoints, for on: the stall it
# kept) and the largest stage peak memory (the snapshot's host copy is the
# price), as a Markdown table. The default is the simulated uneven plan
# (compute is a sleep, so the stall is all checkpoint) with the model grown
# to a BERT-base-sized text branch: 1.2 GB a checkpoint.
#   bench/ckpt_async.sh [--bin build/mmpipe] [--plan configs/sim-uneven.yaml]
#                       [--out runs/bench-ckpt-async] [--steps 12] [--every 2]
#                       [--pairs 3] [--set KEY=VALUE]...
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/ckpt_async.sh --bin=BIN=build/mmpipe --plan=PLAN=configs/sim-uneven.yaml \
  --out=OUT=runs/bench-ckpt-async --steps=STEPS=12 --every=EVERY=2 --pairs=PAIRS=3 \
  --set=+sets -- "$@"
bench_need_bin
[ ${#sets[@]} -gt 0 ] || sets=(--set balance.mode=off --set model.width=768 --set model.text.layers=12
  --set model.text.heads=12 --set train.batch=48 --set train.microbatches=48)
mkdir -p "$OUT"
rm -f "$OUT"/*.wall "$OUT"/*.mem
for p in $(seq 1 "$PAIRS"); do
  for mode in true false; do
    run=$OUT/$mode-$p
    t0=$(date +%s.%N)
    "$BIN" launch "$PLAN" --out "$run" --force --set job.steps="$STEPS" --set train.ckpt_every="$EVERY" \
      --set train.ckpt_keep=1 --set train.ckpt_async=$mode --set train.eval_every=0 \
      --set train.final_eval=false "${sets[@]}" >"$OUT/$mode-$p.log" 2>&1 \
      || { echo "bench/ckpt_async.sh: launch failed (see $OUT/$mode-$p.log)" >&2; exit 1; }
    echo "$(date +%s.%N) - $t0" | bc >>"$OUT/$mode.wall"
    grep -o '"peak_mem_bytes":[0-9]*' "$run/metrics.jsonl" | sed 's/.*://' | sort -g | tail -1 >>"$OUT/$mode.mem"
    du -sb "$run/ckpt/latest/" | cut -f1 >"$OUT/ckpt.bytes"
    rm -rf "$run/ckpt"
  done
done
med() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
on=$(med "$OUT/true.wall"); off=$(med "$OUT/false.wall")
n=$(( (STEPS - 1) / EVERY )) # checkpoints before the last (which is written at once either way)
echo "| checkpoints | run wall s (median) | largest stage peak memory |"
echo "|---|--:|--:|"
echo "| background (ckpt_async: true) | $on | $(awk -v b="$(med "$OUT/true.mem")" 'BEGIN{printf "%.2f GB", b/1e9}') |"
echo "| at once (ckpt_async: false, default) | $off | $(awk -v b="$(med "$OUT/false.mem")" 'BEGIN{printf "%.2f GB", b/1e9}') |"
awk -v a="$on" -v b="$off" -v n="$n" -v s="$(cat "$OUT/ckpt.bytes")" \
  'BEGIN { printf "\nstall kept off the run per checkpoint: %.2f s (%d background checkpoints of %.2f GB a run)\n", (b - a) / n, n, s / 1e9 }'
echo "$PAIRS runs each, alternating, $STEPS steps a run, a checkpoint every $EVERY; plan $PLAN (${sets[*]})"
rm -f "$OUT"/*.wall "$OUT"/*.mem "$OUT/ckpt.bytes"
