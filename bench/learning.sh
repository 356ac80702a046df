#!/usr/bin/env bash
# Learning as well as PyTorch (issue 15): mmpipe and the PyTorch reference
# (bench/torch/train_ref.py, the model of bench/torch/mmpipe_ref.py) train
# the demo plan with the same recipe, on each seed, and their final
# validation recall@1 (both directions) are compared.
#
# Per seed S: `mmpipe launch PLAN --steps 0 --set job.seed=S` writes mmpipe's
# initial weights, exported to safetensors; then, alternating (mmpipe S,
# reference S, next seed) so that drift on a shared machine hits both:
#   mmpipe     launch PLAN --init-from INIT --set job.seed=S [--set ...]
#   reference  train_ref.py on that run's resolved plan.json (same model,
#              data, order, batch and micro-batches, AdamW, LR schedule,
#              clipping, val set and recall@1) from the same INIT
# Prints a Markdown table (final val r@1 i2t / t2i per seed and system, run
# times) and draws loss and val r@1 against step for every run into PNG
# (gnuplot; installed from apt when missing). Exit status 1 when mmpipe's
# final recall@1 (either direction, any seed) is below the reference's minus
# TOL, 2 on usage errors or a failed run.
#
# usage: bench/learning.sh [PLAN.yaml] [--seeds "1 2"] [--steps N]
#          [--set KEY=VALUE]... [--itc-scope batch|microbatch]
#          [--single-process] [--out DIR] [--png FILE] [--tol 0.02]
#   PLAN           default configs/demo.yaml (data/shapes made as scripts/demo
#                  makes it when missing)
#   --steps N      fewer steps than the plan's (job.steps) for a quick look
#   --set K=V      passed to mmpipe (repeatable); the reference reads the
#                  resolved plan.json, so it follows
#   --itc-scope    the reference's contrastive scope (default batch: ITC and
#                  ITM negatives over the whole batch, branches in micro-batches)
#   --single-process  mmpipe in one process (default: the pipeline; both train
#                  the same model bitwise)
#   --out DIR      runs and curves (default runs/learning); --png default
#                  docs/learning.png
#   --report       train nothing: the table and curves of the runs in DIR
# Needs build/mmpipe, and torch + PIL in $PYTHON (default /usr/bin/python3,
# Debian's python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PLAN=configs/demo.yaml SEEDS="1 2" STEPS="" SCOPE=batch OUT=runs/learning PNG=docs/learning.png
TOL=0.02 SINGLE=() REPORT=0
SETS=()
PYTHON=${PYTHON:-/usr/bin/python3}
BIN=${MMP_BIN:-build/mmpipe}
usage() { awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; }
while [ $# -gt 0 ]; do
  case $1 in
    --seeds) SEEDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --itc-scope) SCOPE=$2; shift 2 ;;
    --single-process) SINGLE=(--single-process); shift ;;
    --out) OUT=$2; shift 2 ;;
    --png) PNG=$2; shift 2 ;;
    --tol) TOL=$2; shift 2 ;;
    --report) REPORT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "learning.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) PLAN=$1; shift ;;
  esac
done
[ -n "$STEPS" ] && SETS+=(--steps "$STEPS")
[ -x "$BIN" ] || { echo "learning.sh: no $BIN (build first)" >&2; exit 2; }
"$PYTHON" -c 'import torch, PIL' 2>/dev/null \
  || { echo "learning.sh: $PYTHON lacks torch or PIL (apt-get install python3-torch python3-pil)" >&2; exit 2; }
if ! command -v gnuplot >/dev/null; then
  echo "learning.sh: installing gnuplot-nox" >&2
  { apt-get install -y gnuplot-nox || { apt-get update && apt-get install -y gnuplot-nox; }; } >/dev/null 2>&1 \
    || echo "learning.sh: no gnuplot: the table only" >&2
fi
if [ "$PLAN" = configs/demo.yaml ] && [ ! -f data/shapes/train.jsonl ]; then
  "$BIN" data synth --out data/shapes --samples 20000 --seed 1 >/dev/null
fi
mkdir -p "$OUT"

# last_val FILE KEY: KEY on the last line of metrics FILE that has it.
last_val() { grep "\"$2\"" "$1" | tail -1 | sed -E "s/.*\"$2\": ?([-0-9.e+]+).*/\1/"; }

t_all=$(date +%s)
for s in $SEEDS; do
  [ $REPORT -eq 1 ] && break
  init=$OUT/init-s$s
  "$BIN" launch "$PLAN" --set job.seed="$s" "${SETS[@]}" --steps 0 --out "$init" --force >"$init.log" 2>&1 \
    || { echo "learning.sh: seed $s: initial weights failed, see $init.log" >&2; exit 2; }
  "$BIN" ckpt export "$init" --format safetensors -o "$init.safetensors" >/dev/null
done
for s in $SEEDS; do
  [ $REPORT -eq 1 ] && break
  m=$OUT/mmpipe-s$s r=$OUT/torch-s$s
  t0=$(date +%s.%N)
  "$BIN" launch "$PLAN" --init-from "$OUT/init-s$s.safetensors" --set job.seed="$s" "${SETS[@]}" \
    "${SINGLE[@]}" --out "$m" --force >"$m.log" 2>&1 \
    || { echo "learning.sh: mmpipe seed $s failed, see $m.log" >&2; tail -3 "$m.log" >&2; exit 2; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc >"$m.secs"
  echo "seed $s: mmpipe $(cut -d. -f1 "$m.secs") s" >&2
  "$PYTHON" bench/torch/train_ref.py --plan-json "$m/plan.json" --init "$OUT/init-s$s.safetensors" \
    --out "$r" --mmpipe "$BIN" --itc-scope "$SCOPE" >"$r.log" 2>&1 \
    || { echo "learning.sh: reference seed $s failed, see $r.log" >&2; tail -3 "$r.log" >&2; exit 2; }
  t2=$(date +%s.%N)
  echo "$t2 - $t1" | bc >"$r.secs"
  echo "seed $s: reference $(cut -d. -f1 "$r.secs") s ($(grep -o 'tokenization equals.*' "$r.log"))" >&2
done
t_total=$(( $(date +%s) - t_all ))

# The curves: step loss per run; step i2t t2i on evaluation steps.
for s in $SEEDS; do for sys in mmpipe torch; do
  d=$OUT/$sys-s$s f=$OUT/$sys-s$s/metrics.jsonl
  [ -f "$f" ] || { echo "learning.sh: no $f" >&2; exit 2; }
  "$PYTHON" - "$f" "$d.loss.dat" "$d.val.dat" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    for r in rows:
        f.write(f"{r['step']} {r['loss']}\n")
with open(sys.argv[3], "w") as f:
    for r in rows:
        if "val_i2t_r1" in r:
            f.write(f"{r['step']} {r['val_i2t_r1']} {r['val_t2i_r1']}\n")
EOF
done; done

bad=0 why=""
steps=$(grep -o '"steps": *[0-9]*' "$OUT/mmpipe-s${SEEDS%% *}/plan.json" | head -1 | grep -o '[0-9]*$')
mb=$(grep -o '"microbatches": *[0-9]*' "$OUT/mmpipe-s${SEEDS%% *}/plan.json" | head -1 | grep -o '[0-9]*$')
echo
echo "Final validation recall@1, $PLAN, $steps steps, micro-batches $mb${SETS:+ (${SETS[*]})}; reference ITC scope: $SCOPE"
[ $REPORT -eq 1 ] || echo "($(date -u +%Y-%m-%d), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); torch $("$PYTHON" -c 'import torch; print(torch.__version__)'); total ${t_total} s)"
echo
echo "| seed | system | final val i2t r@1 | final val t2i r@1 | last 3 evals' mean, i2t / t2i | loss, mean of the last 50 steps | run time (s) |"
echo "|--:|:--|--:|--:|--:|--:|--:|"
for s in $SEEDS; do
  for sys in mmpipe torch; do
    f=$OUT/$sys-s$s/metrics.jsonl
    name=$([ $sys = torch ] && echo "PyTorch reference" || echo mmpipe)
    tail3=$(tail -3 "$OUT/$sys-s$s.val.dat" | awk '{ a += $2; b += $3 } END { printf "%.4f / %.4f", a / NR, b / NR }')
    loss=$(tail -50 "$OUT/$sys-s$s.loss.dat" | awk '{ a += $2 } END { printf "%.4f", a / NR }')
    printf "| %s | %s | %.4f | %.4f | %s | %s | %s |\n" "$s" "$name" "$(last_val "$f" val_i2t_r1)" \
      "$(last_val "$f" val_t2i_r1)" "$tail3" "$loss" "$(cut -d. -f1 "$OUT/$sys-s$s.secs" 2>/dev/null || echo -)"
  done
  for k in val_i2t_r1 val_t2i_r1; do
    a=$(last_val "$OUT/mmpipe-s$s/metrics.jsonl" $k) b=$(last_val "$OUT/torch-s$s/metrics.jsonl" $k)
    if [ -z "$a" ] || [ -z "$b" ] || [ "$(echo "$a < $b - $TOL" | bc -l)" -eq 1 ]; then
      why+="seed $s: mmpipe's $k ${a:-none} is below the reference's ${b:-none} - $TOL"$'\n'
      bad=1
    fi
  done
done

if command -v gnuplot >/dev/null; then
  mkdir -p "$(dirname "$PNG")"
  {
    echo "set terminal pngcairo noenhanced size 1500,450 font ',10'"
    echo "set output '$PNG'"
    echo "set multiplot layout 1,3 title 'mmpipe vs PyTorch reference: $(basename "$PLAN"), $steps steps, micro-batches $mb (same init, data order and recipe)'"
    echo "set grid; set xlabel 'step'; set key top right"
    # curves KIND COLUMN WITH [POINTS_MMPIPE POINTS_TORCH]: one plot's list, mmpipe solid and
    # PyTorch dashed, one colour per seed
    curves() {
      local plot="" c=1 s
      for s in $SEEDS; do
        plot+="'$OUT/mmpipe-s$s.$1.dat' u 1:$2 w $3 lc $c ${4:+$4 }lw 1.5 t 'mmpipe seed $s', "
        plot+="'$OUT/torch-s$s.$1.dat' u 1:$2 w $3 lc $c ${5:+$5 }dt 2 lw 1.5 t 'PyTorch seed $s', "
        c=$((c + 1))
      done
      echo "${plot%, }"
    }
    echo "set title 'training loss (ITC + ITM)'; set ylabel 'loss'; plot $(curves loss 2 l)"
    for col in 2:i2t 3:t2i; do
      echo "set title 'val recall@1, ${col#*:}'; set ylabel 'recall@1'; set key bottom right;" \
        "plot $(curves val "${col%%:*}" lp 'pt 7' 'pt 6')"
    done
    echo "unset multiplot"
  } >"$OUT/curves.gp"
  gnuplot "$OUT/curves.gp" && echo && echo "curves: $PNG ($OUT/curves.gp)"
fi
[ $bad -eq 0 ] && echo "mmpipe >= reference - $TOL on every seed and direction" \
  || printf "mmpipe BELOW reference - %s:\n%s" "$TOL" "$why"
exit $bad
