#!/usr/bin/env bash
# GPU figures, one run, medians; judges nothing (tests/gpu_pipeline.sh
# asserts what must hold). On a machine with a CUDA device:
#  1. samples/s of the demo model (configs/gpu-1.yaml) and of the seed-scale
#     model (configs/seed-scale.yaml on cuda:0) as one process, and as the
#     three-process pipeline on one GPU with gpipe and 1f1b: the median of
#     steps 4..N of metrics.jsonl's samples_per_s;
#  2. peak device memory of each stage (arena + workspace) at the last step.
# Prints a Markdown table (for the README).
#   bench/gpu.sh [--bin build/mmpipe] [--out runs/bench-gpu] [--steps N] [--seed-steps N]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BIN=build/mmpipe
OUT=runs/bench-gpu
STEPS=40
SEED_STEPS=10
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --seed-steps) SEED_STEPS=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/gpu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "bench/gpu.sh: no mmpipe binary at $BIN" >&2; exit 2; }
"$BIN" devices | grep -q '^cuda:0' || { echo "bench/gpu.sh: no CUDA device here" >&2; exit 77; }
. tests/lib.sh # median, metric
rm -rf "$OUT"; mkdir -p "$OUT"
say() { echo "bench/gpu.sh: $*" >&2; }
gpu=$("$BIN" devices | grep '^cuda:0' | sed 's/^cuda:0 *//')
"$BIN" data synth --out "$OUT/data32" --samples 2048 --seed 4 >/dev/null 2>&1 || { say "synth failed"; exit 1; }
"$BIN" data synth --out "$OUT/data224" --samples 256 --image-size 224 --seed 4 >/dev/null 2>&1 \
  || { say "synth 224 failed"; exit 1; }
one_gpu="hosts=[{name: localhost, devices: [cuda:0, cuda:0, cuda:0]}]"
echo "GPU: $gpu. Median samples/s of steps 4..N; peak device memory per stage at the last step."
echo
echo "| model | run | samples/s | peak device memory per stage (MiB) |"
echo "|---|---|---:|---|"
row() { # MODEL NAME PLAN DATA STEPS ARGS...
  local model=$1 name=$2 plan=$3 data=$4 steps=$5; shift 5
  say "$model $name ..."
  if ! "$BIN" launch "$plan" --out "$OUT/$model-$name" --force --set "data.manifest=$data" \
       --set "job.steps=$steps" --set train.eval_every=0 --set train.final_eval=false \
       --set "$one_gpu" "$@" >"$OUT/$model-$name.log" 2>&1; then
    echo "| $model | $name | failed: $(grep -m1 error "$OUT/$model-$name.log" | cut -c1-120) | |"
    return
  fi
  local sps mem
  sps=$(metric "$OUT/$model-$name/metrics.jsonl" samples_per_s 4 "$steps" | median)
  mem=$(tail -1 "$OUT/$model-$name/metrics.jsonl" | grep -o '"name":"[a-z.0-9]*","replica":0[^}]*"peak_mem_bytes":[0-9.e+]*' \
    | sed -E 's/"name":"([^"]*)".*"peak_mem_bytes":(.*)/\1 \2/' | awk '{ printf "%s%s %.0f", (NR > 1 ? ", " : ""), $1, $2 / 1048576 }')
  echo "| $model | $name | $sps | $mem |"
}
for r in "single --single-process" "gpipe --set train.schedule=gpipe" "1f1b --set train.schedule=1f1b"; do
  set -- $r
  row demo "$1" configs/gpu-1.yaml "$OUT/data32/train.jsonl" "$STEPS" "${@:2}"
done
for r in "single --single-process" "gpipe --set train.schedule=gpipe" "1f1b --set train.schedule=1f1b"; do
  set -- $r
  row seed-scale "$1" configs/seed-scale.yaml "$OUT/data224/train.jsonl" "$SEED_STEPS" "${@:2}"
done
