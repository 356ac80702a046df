#!/usr/bin/env bash
# Two mmpipe builds on the same --single-process run, alternating (A, B, A,
# B, ...) so drift on a shared machine hits both; per run the median
# step_ms over steps after the first three; prints a Markdown table of the
# medians over runs per thread count and B's speed over A's (A ms / B ms:
# above 1, B is faster). Judges nothing. Eval and checkpoints are off.
#   bench/ab_single.sh --a OLD/build/mmpipe [--b build/mmpipe]
#                      [--plan configs/demo.yaml] [--threads "1 2"]
#                      [--steps 25] [--reps 3] [--out runs/bench-ab]
#                      [--set KEY=VALUE]...
# e.g. main's build against this one: git worktree add /tmp/main main &&
# cmake -S /tmp/main -B /tmp/main/build -DMMP_CUDA=OFF && cmake --build
# /tmp/main/build --target mmpipe, then --a /tmp/main/build/mmpipe.
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/ab_single.sh --a=A= --b=B=build/mmpipe --plan=PLAN=configs/demo.yaml \
  --threads=THREADS="1 2" --steps=STEPS=25 --reps=REPS=3 --out=OUT=runs/bench-ab --set=+sets -- "$@"
[ -n "$A" ] || { echo "bench/ab_single.sh: --a BINARY is required (see --help)" >&2; exit 2; }
for b in "$A" "$B"; do
  [ -x "$b" ] || { echo "bench/ab_single.sh: $b is not an executable" >&2; exit 2; }
done
mkdir -p "$OUT"
med() { sort -g | awk '{ v[NR] = $1 } END { print NR ? (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) : "nan" }'; }
echo "| threads | A ms/step | B ms/step | B speed / A speed |"
echo "|--:|--:|--:|--:|"
for t in $THREADS; do
  : >"$OUT/a.$t"; : >"$OUT/b.$t"
  for r in $(seq 1 "$REPS"); do
    for side in a b; do
      bin=$A; [ $side = b ] && bin=$B
      run=$OUT/$side-$t-$r
      "$bin" launch "$PLAN" --single-process --out "$run" --force --set job.steps="$STEPS" \
        --set train.eval_every=0 --set train.final_eval=false --set train.ckpt_every=0 \
        --set train.threads="$t" "${sets[@]}" >"$run.log" 2>&1 \
        || { echo "bench/ab_single.sh: $bin failed (see $run.log)" >&2; exit 1; }
      grep -o '"step_ms":[0-9.e+-]*' "$run/metrics.jsonl" | sed 's/.*://' | tail -n +4 | med >>"$OUT/$side.$t"
      rm -rf "$run"
    done
  done
  a=$(med <"$OUT/a.$t"); b=$(med <"$OUT/b.$t")
  echo "| $t | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }') |"
done
echo
echo "$REPS runs each, alternating, $STEPS steps a run; plan $PLAN; A $A, B $B"
