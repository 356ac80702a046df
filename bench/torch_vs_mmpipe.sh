#!/usr/bin/env bash
# One training step, mmpipe --single-process against the PyTorch reference
# (bench/torch/mmpipe_ref.py, eager, CPU): same model (the plan's, and
# PyTorch loads the weights mmpipe exported), same batch shapes and
# micro-batches, same optimizer, same thread count. Runs alternate
# (mmpipe, torch, mmpipe, torch, ...) so drift on a shared machine hits both;
# each run's figure is the median over its timed steps, the table shows the
# median over runs. Prints a Markdown table whose last column is mmpipe's
# speed relative to PyTorch's (PyTorch ms / mmpipe ms: above 1 is faster).
#
# mmpipe's figure is metrics.jsonl's step_ms minus data_ms (the step without
# waiting for the loader; eval and checkpoints are off), over steps after
# the first two. PyTorch's is bench/torch/time_step.py's (warm-up 2 steps).
#
# With --pipeline-steps N (N >= 20) each rep also runs mmpipe's pipeline as
# a user on this machine would: `stages: auto` on the host's cores
# (profile, then the planner's placement: coordinator/planner_cores.h),
# train.pin auto, one thread per stage process, N steps; its figure is the
# median step_ms over the second half of its steps (after the re-placement),
# set against PyTorch at the largest --threads value in a second table: what
# the same cores give each system.
#
# usage: bench/torch_vs_mmpipe.sh [PLAN.yaml] [--steps N] [--reps R]
#                                 [--threads "1 2"] [--data MANIFEST]
#                                 [--batch B] [--microbatches M]
#                                 [--pipeline-steps N]
# --batch / --microbatches override the plan's train.batch / microbatches
# for both (seed-scale on CPU: e.g. --batch 8 --microbatches 2 --steps 4).
# Needs build/mmpipe and a python3 with torch ($PYTHON, default python3;
# Debian: apt-get install python3-torch, then PYTHON=/usr/bin/python3).
# Without --data the plan's manifest is used, or a small synthetic set at
# the plan's image size is made under $MMP_TMP (default /tmp/mmpipe-bench-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PLAN=configs/demo.yaml STEPS=12 REPS=3 THREADS="1 2" DATA="" BATCH="" MICRO=""
PYTHON=${PYTHON:-python3}
BIN=${MMP_BIN:-build/mmpipe}
TMP=${MMP_TMP:-/tmp/mmpipe-bench-torch}
. bench/lib.sh
PIPE_STEPS=0
bench_args bench/torch_vs_mmpipe.sh --steps=STEPS --reps=REPS --threads=THREADS --data=DATA \
  --batch=BATCH --microbatches=MICRO --pipeline-steps=PIPE_STEPS @=PLAN -- "$@"
[ "$PIPE_STEPS" = 0 ] || [ "$PIPE_STEPS" -ge 20 ] 2>/dev/null \
  || { echo "torch_vs_mmpipe: --pipeline-steps wants 0 or at least 20" >&2; exit 2; }
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "torch_vs_mmpipe: $PYTHON has no torch (set PYTHON)" >&2; exit 2; }
mkdir -p "$TMP"
if [ -z "$DATA" ]; then
  if [ -f data/shapes/train.jsonl ] && grep -q 'data/shapes/train.jsonl' "$PLAN"; then
    DATA=data/shapes/train.jsonl
  else
    size=$(sed -n 's/^ *image_size: *\([0-9]*\).*/\1/p' "$PLAN" | head -1)
    size=${size:-32}
    DATA=$TMP/shapes$size/train.jsonl
    [ -f "$DATA" ] || "$BIN" data synth --out "$TMP/shapes$size" --seed 1 \
      --samples $((size > 64 ? 256 : 2000)) \
      --image-size "$size" >/dev/null
  fi
fi

overrides=()
[ -z "$BATCH" ] || overrides+=(--set train.batch="$BATCH")
[ -z "$MICRO" ] || overrides+=(--set train.microbatches="$MICRO")

# mmpipe_run THREADS OUT: one single-process run; prints its median step ms.
mmpipe_run() {
  "$BIN" launch "$PLAN" --single-process --force --out "$2" --steps "$STEPS" "${overrides[@]}" \
    --set data.manifest="$DATA" --set train.threads="$1" --set train.eval_every=0 \
    --set train.final_eval=false --set train.ckpt_every=0 >"$2.log" 2>&1 \
    || { echo "torch_vs_mmpipe: mmpipe failed, see $2.log" >&2; tail -5 "$2.log" >&2; exit 1; }
  "$PYTHON" - "$2/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ms = [r["step_ms"] - r.get("data_ms", 0) for r in rows if r.get("step", 0) > 2]
print(f"{statistics.median(ms):.2f}")
EOF
}

# pipeline_run OUT: the pipeline on this host's cores; prints its median
# step ms over the second half of its steps.
pipeline_run() {
  "$BIN" launch "$PLAN" --force --out "$1" --steps "$PIPE_STEPS" "${overrides[@]}" \
    --set data.manifest="$DATA" --set stages=auto --set train.pin=auto --set train.threads=1 \
    --set train.eval_every=0 --set train.final_eval=false --set train.ckpt_every=0 >"$1.log" 2>&1 \
    || { echo "torch_vs_mmpipe: the pipeline failed, see $1.log" >&2; tail -5 "$1.log" >&2; exit 1; }
  "$PYTHON" - "$1/metrics.jsonl" "$PIPE_STEPS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ms = [r["step_ms"] for r in rows if r.get("step", 0) > int(sys.argv[2]) // 2 and "step_ms" in r]
print(f"{statistics.median(ms):.2f}")
EOF
}

declare -A runs
weights=""
for rep in $(seq "$REPS"); do
  for t in $THREADS; do
    out=$TMP/mmpipe-t$t
    m=$(OMP_NUM_THREADS=$t mmpipe_run "$t" "$out")
    if [ -z "$weights" ]; then
      weights=$TMP/weights.safetensors
      "$BIN" ckpt export "$out" --format safetensors -o "$weights" >/dev/null
      cp "$out/plan.json" "$TMP/plan.json"
    fi
    p=$(OMP_NUM_THREADS=$t "$PYTHON" bench/torch/time_step.py --plan-json "$TMP/plan.json" \
          --weights "$weights" --threads "$t" --steps $((STEPS - 2)) \
        | sed -E 's/.*median=([0-9.]+).*/\1/')
    runs[mmpipe,$t]+="$m "
    runs[torch,$t]+="$p "
    echo "rep $rep threads $t: mmpipe $m ms, torch $p ms" >&2
  done
  if [ "$PIPE_STEPS" != 0 ]; then
    q=$(pipeline_run "$TMP/mmpipe-pipeline")
    runs[pipeline]+="$q "
    echo "rep $rep pipeline (stages: auto on $(nproc) cores): $q ms" >&2
  fi
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')
echo
echo "One training step of $PLAN${BATCH:+ at batch $BATCH}${MICRO:+, $MICRO micro-batches} ($(nproc) CPUs; median of $REPS alternating runs, each the median of $((STEPS - 2)) steps; torch $torch_version eager)"
echo
echo "| threads | mmpipe --single-process (ms/step) | PyTorch eager (ms/step) | mmpipe speed / PyTorch speed |"
echo "|--:|--:|--:|--:|"
for t in $THREADS; do
  m=$(echo "${runs[mmpipe,$t]}" | median)
  p=$(echo "${runs[torch,$t]}" | median)
  printf "| %s | %.1f | %.1f | %.2fx |\n" "$t" "$m" "$p" "$(echo "$p / $m" | bc -l)"
done
if [ "$PIPE_STEPS" != 0 ]; then
  tmax=$(tr ' ' '\n' <<<"$THREADS" | grep . | sort -n | tail -1)
  q=$(echo "${runs[pipeline]}" | median)
  p=$(echo "${runs[torch,$tmax]}" | median)
  # PyTorch's fastest thread count too: more threads are not always faster
  best="" tbest=""
  for t in $THREADS; do
    v=$(echo "${runs[torch,$t]}" | median)
    if [ -z "$best" ] || awk -v a="$v" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$v tbest=$t; fi
  done
  placed=$("$PYTHON" - "$TMP/mmpipe-pipeline/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(next((r["balance"]["placement"] for r in reversed(rows) if r.get("balance")), "?"))
EOF
)
  echo
  echo "The same cores, each system as a user runs it: mmpipe's pipeline (stages: auto on $(nproc) cores, placed $placed; median step of steps $((PIPE_STEPS / 2 + 1))..$PIPE_STEPS) against PyTorch eager at $tmax threads and at its fastest thread count ($tbest), from the runs above"
  echo
  echo "| cores | mmpipe pipeline (ms/step) | PyTorch eager, $tmax threads (ms/step) | mmpipe speed / PyTorch speed | PyTorch eager, $tbest thread(s), its fastest (ms/step) | mmpipe speed / that |"
  echo "|--:|--:|--:|--:|--:|--:|"
  printf "| %s | %.1f | %.1f | %.2fx | %.1f | %.2fx |\n" "$(nproc)" "$q" "$p" "$(echo "$p / $q" | bc -l)" \
    "$best" "$(echo "$best / $q" | bc -l)"
fi
