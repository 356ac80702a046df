#!/usr/bin/env bash
# Whole runs with stages on cuda:0, on the CPU: build/cuda_emu/mmpipe loads
# the CUDA emulator as its CUDA module (build/cuda_emu/libmmpcuda.so:
# kernels/cuda and transport/cuda/cuda_ipc.c through tests/cuda_emu, whose
# header says what it models), so the GPU code of the stages and of the
# single process runs here: the device arena, page-locked uploads, cuda_ipc
# between GPU stages (device slots shared between the processes, both
# signalling modes), staging through the host to CPU peers, the replicas'
# host reduce, fp16 loss scaling on the device, checkpoints written from and
# read back to device memory. A small model at 16x16 images, batch 16:
#  - `devices` lists the emulated cuda:0; stages placed there say so;
#  - the GPU single process against the CPU's after one step as
#    tests/gpu_pipeline.sh bounds it on a GPU (loss within 1e-4 relative, no
#    tensor more than 2.2e-4 apart: AdamW's first update is lr_1 sign(g));
#    bf16 likewise within 1e-2;
#  - three GPU stages over cuda_ipc (stream memory operations; events with
#    MMP_CIPC_SYNC=events), 1f1b and gpipe, two image replicas, bf16, and
#    fp16 with an overflow forced at step 2: each = the GPU single process
#    bit for bit (max_abs_diff=0), fp16 with the same loss scales and skip;
#  - the image stage on cuda:0 between CPU stages (shm, staged through the
#    host): stopped after two steps and resumed to three = three straight,
#    its first loss the CPU's within 1e-4;
#  - host waits (the emulator counts them: MMP_EMU_HOST_WAITS): a GPU stage
#    synchronises with its device a fixed number of times a step, the same
#    with 2 and with 4 micro-batches (one, the gradient norm, on the branch
#    stages); no blocking copy on the data path;
#  - a bad sample met in step 3, one process and three GPU stages: step 2
#    kept, mended and resumed = a run that never met it; nothing left behind.
# Not modelled here: NCCL, MPS (MMP_GPU_SHARING=timeslice), a GPU's timing.
# Needs a CUDA build (the module beside a copy of mmpipe).
# ctest-labels: emu
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
EMU=$(dirname "$BIN")/cuda_emu/mmpipe
[ -x "$EMU" ] || { echo "no $EMU (a build without CUDA): skipped"; exit 77; }
workdir
synth 256 3
common=(--set "data.manifest=$W/data/train.jsonl" --set data.image_size=16 --set train.batch=16
        --set train.microbatches=2 --set train.eval_every=0 --set train.final_eval=false --force
        --set "model={width: 32, image: {blocks: [1, 1], channels: [8, 16]}, text: {layers: 1, heads: 2}, fusion: {layers: 1, heads: 2}}")
mixed=(--set "hosts=[{name: localhost, devices: [cuda:0, cpu, cpu]}]")
export MMP_GPU_SHARING=timeslice # no MPS daemon here
run() { # NAME BINARY PLAN ARGS...
  local name=$1 bin=$2 plan=$3; shift 3
  "$bin" launch "$plan" --out "$W/$name" "${common[@]}" "$@" >"$W/$name.log" 2>&1 \
    && ok "$name: completed" || { fail "$name failed"; tail -8 "$W/$name.log" | sed 's/^/    /'; }
}
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; printf "%.3g", (m > 0 ? d / m : d) }'; }
below() { awk -v r="$1" -v b="$2" 'BEGIN { exit !(r + 0 == r && r < b) }'; }
same() { # A B WHAT
  local out
  out=$(same_ckpt "$W/$1" "$W/$2") && ok "$3: $out" || fail "$3 differ: $out"
}
seq_of() { metric "$W/$1/metrics.jsonl" "$2" 1 3 | tr '\n' ' '; }

"$EMU" devices 2>&1 | grep -q '^cuda:0 *mmpipe CUDA emulator' && ok "devices lists the emulated cuda:0" \
  || fail "devices: $("$EMU" devices 2>&1 | tr '\n' ' ')"
# ---- the GPU single process against the CPU's --------------------------------------
run gpu_step1 "$EMU" configs/gpu-1.yaml --single-process --set job.steps=1
run cpu_step1 "$BIN" configs/demo.yaml --single-process --set job.steps=1
grep -q 'single-process training on cuda:0' "$W/gpu_step1.log" && ok "the single process ran on cuda:0" \
  || fail "gpu_step1 did not run on cuda:0"
lg=$(metric "$W/gpu_step1/metrics.jsonl" loss 1 1); lc=$(metric "$W/cpu_step1/metrics.jsonl" loss 1 1)
r=$(rel "${lg:-nan}" "${lc:-0}")
below "$r" 1e-4 && ok "step 1 loss GPU $lg vs CPU $lc (rel $r < 1e-4)" || fail "step 1 loss GPU $lg vs CPU $lc: rel $r"
d1=$("$BIN" ckpt diff "$W/gpu_step1" "$W/cpu_step1" --quiet | tail -1)
mad=$(sed -E 's/max_abs_diff=([^ ]*).*/\1/' <<<"$d1")
below "$mad" 2.2e-4 && ok "GPU vs CPU after one step: $d1 (bound 2.2e-4)" || fail "GPU vs CPU after one step: $d1"
run gpu_bf16_step1 "$EMU" configs/gpu-1.yaml --single-process --set job.steps=1 --set train.precision=bf16
run cpu_bf16_step1 "$BIN" configs/demo.yaml --single-process --set job.steps=1 --set train.precision=bf16
lg=$(metric "$W/gpu_bf16_step1/metrics.jsonl" loss 1 1); lc=$(metric "$W/cpu_bf16_step1/metrics.jsonl" loss 1 1)
r=$(rel "${lg:-nan}" "${lc:-0}")
below "$r" 1e-2 && ok "bf16 step 1 loss GPU $lg vs CPU $lc (rel $r < 1e-2)" || fail "bf16 step 1 loss GPU $lg vs CPU $lc: rel $r"

# ---- three GPU stages over cuda_ipc = the GPU single process -------------------------
run single "$EMU" configs/gpu-1.yaml --single-process --set job.steps=3
run pipe_1f1b "$EMU" configs/gpu-1.yaml --set job.steps=3
grep -q 'data channels: 4 over cuda_ipc, 0 over shm' "$W/pipe_1f1b.log" && ok "the 4 data channels are cuda_ipc" \
  || fail "transports: $(grep -o 'data channels.*' "$W/pipe_1f1b.log")"
same pipe_1f1b single "GPU 1f1b pipeline == GPU single process"
MMP_CIPC_SYNC=events run pipe_gpipe_events "$EMU" configs/gpu-1.yaml --set job.steps=3 --set train.schedule=gpipe
same pipe_gpipe_events single "GPU gpipe pipeline, cuda_ipc by events == GPU single process"
run pipe_replicas "$EMU" configs/gpu-1.yaml --set job.steps=3 --set stages.image.replicas=2 \
  --set "hosts=[{name: localhost, devices: [cuda:0, cuda:0, cuda:0, cuda:0]}]"
same pipe_replicas single "two GPU image replicas (host reduce) == GPU single process"
run single_bf16 "$EMU" configs/gpu-1.yaml --single-process --set job.steps=3 --set train.precision=bf16
run pipe_bf16 "$EMU" configs/gpu-1.yaml --set job.steps=3 --set train.precision=bf16
same pipe_bf16 single_bf16 "GPU bf16 pipeline == GPU bf16 single process"
fp16=(--set job.steps=3 --set train.precision=fp16 --set train.loss_scale_window=2 --set train.debug_overflow_step=2)
run single_fp16 "$EMU" configs/gpu-1.yaml --single-process "${fp16[@]}"
run pipe_fp16 "$EMU" configs/gpu-1.yaml "${fp16[@]}"
same pipe_fp16 single_fp16 "GPU fp16 pipeline == GPU fp16 single process"
for k in loss_scale step_skipped; do
  a=$(seq_of pipe_fp16 $k); b=$(seq_of single_fp16 $k)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "fp16 $k per step the same in both: $a" || fail "fp16 $k: pipeline '$a', single '$b'"
done
[ "$(metric "$W/pipe_fp16/metrics.jsonl" step_skipped 2 2)" = 1 ] && ok "fp16: step 2 skipped (the forced overflow)" \
  || fail "fp16: step 2 not skipped: '$(metric "$W/pipe_fp16/metrics.jsonl" step_skipped 2 2)'"

# ---- a GPU stage between CPU stages: shm, staged through the host; resume ------------
run mixed_3 "$EMU" configs/gpu-1.yaml "${mixed[@]}" --set job.steps=3
grep -q 'data channels: 0 over cuda_ipc, 4 over shm' "$W/mixed_3.log" && ok "mixed: 4 shm channels" \
  || fail "mixed transports: $(grep -o 'data channels.*' "$W/mixed_3.log")"
grep -q 'image.0/0: on cuda:0' "$W/mixed_3.log" && ok "mixed: the image stage on cuda:0" \
  || fail "mixed: the image stage did not say cuda:0"
run mixed_2 "$EMU" configs/gpu-1.yaml "${mixed[@]}" --set job.steps=2
"$EMU" launch "$W/mixed_2/plan.json" --resume "$W/mixed_2" --set job.steps=3 >"$W/mixed_resumed.log" 2>&1 \
  && ok "mixed: resumed to step 3" || { fail "mixed resume failed"; tail -5 "$W/mixed_resumed.log" | sed 's/^/    /'; }
same mixed_2 mixed_3 "mixed: 2 steps + resume to 3 == 3 straight"
lm=$(metric "$W/mixed_3/metrics.jsonl" loss 1 1); lc=$(metric "$W/cpu_step1/metrics.jsonl" loss 1 1)
r=$(rel "${lm:-nan}" "${lc:-0}")
below "$r" 1e-4 && ok "mixed step 1 loss $lm vs CPU $lc (rel $r < 1e-4)" || fail "mixed step 1 loss $lm vs CPU $lc: rel $r"

# ---- host waits: per step, not per micro-batch ----------------------------------------
# What would make a GPU stage's host thread wait for its device (stream, event and
# device synchronisation, blocking copies, copies to or from pageable memory), counted
# by the emulator (MMP_EMU_HOST_WAITS): the difference between a 5-step and a 3-step
# run is two steps' worth. With 2 and with 4 micro-batches a step, each stage reads a
# device value on the host (a copy that waits) the same number of times a step (the
# gradient norm once; fusion also its loss values and the similarities it mines
# negatives from, per step under batch-wide ITC) and synchronises no more than those
# reads do; only the input uploads' buffer hand-backs (events) come once a micro-batch.
waits_per_step() { # MB STAGE KIND...: that stage's waits of KINDs a step with MB micro-batches
  local mb=$1 stage=$2 a b; shift 2
  a=$(sum_waits "$W/hostwaits_${mb}_3" "$stage" "$@"); b=$(sum_waits "$W/hostwaits_${mb}_5" "$stage" "$@")
  echo $(((b - a) / 2))
}
sum_waits() { # FILE STAGE KIND...
  local f=$1 stage=$2 k total=0 v; shift 2
  for k in "$@"; do
    v=$(grep "^stage=$stage " "$f" 2>/dev/null | grep -o " $k=[0-9]*" | cut -d= -f2)
    total=$((total + ${v:-1000000}))
  done
  echo $total
}
for mb in 2 4; do
  for n in 3 5; do
    rm -f "$W/hostwaits_${mb}_$n"
    MMP_EMU_HOST_WAITS=$W/hostwaits_${mb}_$n run "waits_${mb}_$n" "$EMU" configs/gpu-1.yaml --set job.steps=$n \
      --set train.microbatches=$mb
  done
done
for stage in image.0/0 text.0/0 fusion/0; do
  # blocking copies (a device value read on the host, through pageable memory)
  c2=$(waits_per_step 2 $stage memcpy pageable)
  c4=$(waits_per_step 4 $stage memcpy pageable)
  # synchronisations besides those copies' own (which the run's teardown adds
  # to by one now and then: the bound leaves it that)
  y4=$(waits_per_step 4 $stage stream device)
  bound=1
  [ $stage = fusion/0 ] && bound=8
  [ "$c2" = "$c4" ] && [ "$c2" -le $bound ] && [ "$y4" -le $((c4 + 1)) ] \
    && ok "$stage: $c2 blocking device reads a step with 2 and with 4 micro-batches; $y4 synchronisations" \
    || fail "$stage: blocking reads a step $c2 (2 micro-batches) and $c4 (4), bound $bound, the same for both; synchronisations $y4 (at most one more)"
done
for stage in image.0/0 text.0/0; do
  e2=$(waits_per_step 2 $stage event)
  e4=$(waits_per_step 4 $stage event)
  [ "$e2" -le 2 ] && [ "$e4" -le 4 ] && ok "$stage: $e2 and $e4 upload hand-back waits a step (one a micro-batch at most)" \
    || fail "$stage: upload waits a step $e2 (2 micro-batches), $e4 (4)"
done

# ---- a bad sample met on cuda:0: what was trained is kept -----------------------------
# Line 24 stops step 3 at its second micro-batch (one forward ran, its batch-norm
# statistics moved on the device): every GPU stage puts its state back, closes its
# cuda_ipc channels, and step 2 is checkpointed; mended and resumed = never met.
cp "$W/data/images/000023.png" "$W/good.png"
head -c 60 "$W/data/images/000100.png" >"$W/data/images/000023.png"
for mode in single pipe; do
  flag=
  [ $mode = single ] && flag=--single-process
  "$EMU" launch configs/gpu-1.yaml $flag --out "$W/keep_$mode" "${common[@]}" --set job.steps=4 \
    --set train.ckpt_every=4 >"$W/keep_$mode.log" 2>&1
  grep -q "train.jsonl:24: .*truncated" "$W/keep_$mode.log" \
    && grep -q "what was trained is kept: step 2 of 4" "$W/keep_$mode.log" \
    && [ "$(readlink "$W/keep_$mode/ckpt/latest")" = step_0000002 ] \
    && ok "keep ($mode): a bad sample in step 3 stops the run, step 2 kept" \
    || { fail "keep ($mode): latest '$(readlink "$W/keep_$mode/ckpt/latest")'"; tail -4 "$W/keep_$mode.log"; }
done
cp "$W/good.png" "$W/data/images/000023.png"
run keep_straight "$EMU" configs/gpu-1.yaml --single-process --set job.steps=4
for mode in single pipe; do
  flag=
  [ $mode = single ] && flag=--single-process
  "$EMU" launch "$W/keep_$mode/plan.json" $flag --resume "$W/keep_$mode" >"$W/keep_$mode.resumed.log" 2>&1 \
    || { fail "keep ($mode): resume"; tail -4 "$W/keep_$mode.resumed.log"; }
  same "keep_$mode" keep_straight "keep ($mode): mended and resumed == never met"
done
left_behind "pipelines" "$W"/pipe_*.log "$W"/mixed_*.log "$W"/keep_*.log "$W"/waits_*.log
finish
