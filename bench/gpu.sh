#!/usr/bin/env bash
# GPU figures, one run, medians; judges nothing (tests/gpu_pipeline.sh
# asserts what must hold). On a machine with a CUDA device:
#  1. samples/s of the demo model (configs/gpu-1.yaml) and of the seed-scale
#     model (configs/seed-scale.yaml on cuda:0) as one process, and as the
#     three-process pipeline on one GPU with gpipe and 1f1b (under the
#     coordinator's MPS daemon; with --timeslice 1 the 1f1b pipeline once
#     more time-sliced): the median of steps 4..N of metrics.jsonl's
#     samples_per_s;
#  2. peak device memory of each stage (arena + workspace) at the last step;
#  3. where python3 has a CUDA PyTorch: the PyTorch reference of the same
#     model (bench/torch/mmpipe_ref.py, built from the mmpipe run's
#     plan.json; same batch, micro-batches, clipping and AdamW) timed by
#     bench/torch/time_step.py: eager fp32, eager with autocast bf16, and
#     with --compile 1 torch.compile fp32 (where it compiles within 150 s:
#     it did not on an H100, so it is off by default, to keep the bench
#     within a short GPU lease); samples/s =
#     batch / median step time, peak = torch.cuda.max_memory_allocated;
#  4. mmpipe with train.precision: bf16 (tensor-core GEMMs, kernels/cuda/gemm.cu)
#     single process and 1f1b, and the ratios mmpipe bf16 / PyTorch AMP bf16
#     and mmpipe bf16 / mmpipe fp32 (single process) of each model;
#  5. seed-scale bf16 single process once more with its convolutions as
#     im2col GEMMs (MMP_CUDA_CONV_LP=im2col) instead of the default, cuDNN
#     with TF32 on the rounded operands (kernels/cuda/conv_lp.cu), and the
#     ratio of the two: which of the two ways is the faster default.
# Prints a Markdown table (for the README), then the ratios.
#   bench/gpu.sh [--bin build/mmpipe] [--out runs/bench-gpu] [--steps N] [--seed-steps N]
#                [--timeslice 0|1] [--compile 0|1]
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/gpu.sh --bin=BIN=build/mmpipe --out=OUT=runs/bench-gpu --steps=STEPS=40 \
  --seed-steps=SEED_STEPS=10 --timeslice=TIMESLICE=0 --compile=COMPILE=0 -- "$@"
bench_need_bin
"$BIN" devices | grep -q '^cuda:0' || { echo "bench/gpu.sh: no CUDA device here" >&2; exit 77; }
. tests/lib.sh # median, metric
bench_fresh_out
gpu=$("$BIN" devices | grep '^cuda:0' | sed 's/^cuda:0 *//')
"$BIN" data synth --out "$OUT/data32" --samples 2048 --seed 4 >/dev/null 2>&1 || { say "synth failed"; exit 1; }
"$BIN" data synth --out "$OUT/data224" --samples 256 --image-size 224 --seed 4 >/dev/null 2>&1 \
  || { say "synth 224 failed"; exit 1; }
one_gpu="hosts=[{name: localhost, devices: [cuda:0, cuda:0, cuda:0]}]"
echo "GPU: $gpu. Median samples/s of steps 4..N; peak device memory per stage at the last step."
echo
echo "| model | run | samples/s | peak device memory per stage (MiB) |"
echo "|---|---|---:|---|"
declare -A SPS # "model|run" -> samples/s, for the ratios at the end
row() { # MODEL NAME PLAN DATA STEPS ARGS...
  local model=$1 name=$2 plan=$3 data=$4 steps=$5; shift 5
  local run=$OUT/$model-$(tr -c 'a-zA-Z0-9\n' '_' <<<"$name")
  say "$model $name ..."
  if ! "$BIN" launch "$plan" --out "$run" --force --set "data.manifest=$data" \
       --set "job.steps=$steps" --set train.eval_every=0 --set train.final_eval=false \
       --set "$one_gpu" "$@" >"$run.log" 2>&1; then
    echo "| $model | $name | failed: $(grep -m1 error "$run.log" | cut -c1-120) | |"
    return
  fi
  local sps mem
  sps=$(metric "$run/metrics.jsonl" samples_per_s 4 "$steps" | median)
  mem=$(tail -1 "$run/metrics.jsonl" | grep -o '"name":"[a-z.0-9]*","replica":0[^}]*"peak_mem_bytes":[0-9.e+]*' \
    | sed -E 's/"name":"([^"]*)".*"peak_mem_bytes":(.*)/\1 \2/' | awk '{ printf "%s%s %.0f", (NR > 1 ? ", " : ""), $1, $2 / 1048576 }')
  SPS["$model|$name"]=$sps
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
# bf16: fp32 master weights, products on the tensor cores (train.precision)
for model in demo seed-scale; do
  if [ $model = demo ]; then set -- configs/gpu-1.yaml "$OUT/data32/train.jsonl" "$STEPS"
  else set -- configs/seed-scale.yaml "$OUT/data224/train.jsonl" "$SEED_STEPS"; fi
  row $model "single bf16" "$@" --single-process --set train.precision=bf16
  row $model "1f1b bf16" "$@" --set train.schedule=1f1b --set train.precision=bf16
done
MMP_CUDA_CONV_LP=im2col row seed-scale "single bf16, im2col convs" configs/seed-scale.yaml \
  "$OUT/data224/train.jsonl" "$SEED_STEPS" --single-process --set train.precision=bf16
ratio() { # LABEL A B: A / B of the rows named, or why not
  local a=${SPS[$2]:-} b=${SPS[$3]:-}
  if [ -n "$a" ] && [ -n "$b" ] && awk -v b="$b" 'BEGIN { exit !(b > 0) }'; then
    echo "- $1: $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2fx", a / b }') ($a / $b samples/s)"
  else
    echo "- $1: n/a (a row is missing or failed)"
  fi
}
print_ratios() {
  echo
  echo "Ratios (this run, same GPU):"
  for model in demo seed-scale; do
    ratio "$model: mmpipe bf16 single / PyTorch AMP bf16" "$model|single bf16" "$model|PyTorch eager AMP bf16"
    ratio "$model: mmpipe bf16 1f1b / mmpipe bf16 single" "$model|1f1b bf16" "$model|single bf16"
    ratio "$model: mmpipe bf16 / mmpipe fp32 (single)" "$model|single bf16" "$model|single"
  done
  ratio "seed-scale: bf16 convs by cuDNN TF32 (default) / by im2col GEMMs" "seed-scale|single bf16" \
    "seed-scale|single bf16, im2col convs"
  echo
  echo "| model | run | samples/s | peak device memory per stage (MiB) |"
  echo "|---|---|---:|---|"
}
PYTHON=${PYTHON:-python3}
if "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  torch_row() { # MODEL RUN STEPS ARGS...: the reference beside mmpipe's run RUN
    local model=$1 run=$2 steps=$3; shift 3
    local vocab out batch ms
    vocab=$(grep -c . "$(sed -nE 's/.*"vocab": *"([^"]*)".*/\1/p' "$OUT/$model-single/plan.json")" 2>/dev/null || echo 0)
    say "$model torch $* ..."
    out=$(timeout 150 "$PYTHON" bench/torch/time_step.py --plan-json "$OUT/$model-single/plan.json" \
      --vocab "$vocab" --device cuda --steps "$steps" --warmup 3 "$@" 2>"$OUT/$model-torch-$run.err" | tail -1)
    ms=$(sed -nE 's/.*median=([0-9.]+).*/\1/p' <<<"$out"); batch=$(sed -nE 's/.* batch=([0-9]+).*/\1/p' <<<"$out")
    if [ -z "$ms" ]; then
      echo "| $model | PyTorch $run | failed: $(grep -v '^ ' "$OUT/$model-torch-$run.err" | tail -1 | cut -c1-100) | |"
      return
    fi
    local peak; peak=$(sed -nE 's/.*peak_mem_bytes=([0-9]+).*/\1/p' <<<"$out")
    SPS["$model|PyTorch $run"]=$(awk -v b="$batch" -v m="$ms" 'BEGIN { printf "%.1f", b * 1000 / m }')
    echo "| $model | PyTorch $run | ${SPS["$model|PyTorch $run"]} | $(awk -v p="$peak" 'BEGIN { printf "%.0f", p / 1048576 }') (one process) |"
  }
  for model in demo seed-scale; do # AMP bf16 first: the comparison that matters most
    steps=$([ $model = demo ] && echo 20 || echo 8)
    torch_row $model "eager AMP bf16" $steps --amp bf16
    torch_row $model "eager fp32" $steps
  done
fi
print_ratios # before the rows below, so that a timeout there still leaves them
# The pipelines time-sliced (no MPS: MMP_GPU_SHARING=timeslice), against the
# rows above where the coordinator ran its private MPS daemon.
if [ "$TIMESLICE" = 1 ]; then
  export MMP_GPU_SHARING=timeslice
  row demo "1f1b, time-sliced" configs/gpu-1.yaml "$OUT/data32/train.jsonl" "$STEPS" --set train.schedule=1f1b
  row seed-scale "1f1b, time-sliced" configs/seed-scale.yaml "$OUT/data224/train.jsonl" "$SEED_STEPS" --set train.schedule=1f1b
  unset MMP_GPU_SHARING
fi
if [ "$COMPILE" != 1 ]; then
  say "torch.compile rows left out (--compile 1 adds them)"
elif "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  for model in demo seed-scale; do # compiling takes longest: last
    torch_row $model "compile fp32" $([ $model = demo ] && echo 20 || echo 8) --compile
  done
else
  say "no CUDA PyTorch in $PYTHON: PyTorch rows left out"
fi
