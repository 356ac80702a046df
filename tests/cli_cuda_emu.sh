#!/usr/bin/env bash
# Whole runs with a stage on cuda:0, on the CPU: build/cuda_emu/mmpipe loads
# the CUDA emulator as its CUDA module (build/cuda_emu/libmmpcuda.so:
# kernels/cuda through tests/cuda_emu, whose header says what it models), so
# the GPU code of the stages and of the single process runs here: the device
# arena, page-locked uploads, staging through the host to CPU peers,
# checkpoints written from and read back to device memory, bf16 products.
# On the demo model at 16x16 images, batch 16:
#  - `devices` lists the emulated cuda:0; a stage placed there says so;
#  - the GPU single process against the CPU's after one step as
#    tests/gpu_pipeline.sh bounds it on a GPU (loss within 1e-4 relative, no
#    tensor more than 2.2e-4 apart: AdamW's first update is lr_1 sign(g));
#    bf16 likewise within 1e-2;
#  - three GPU steps run twice give the same bits (no atomics, deterministic
#    cuDNN algorithms, one order);
#  - the image stage on cuda:0 between CPU stages (shm channels, staged
#    through the host): 1f1b = gpipe bit for bit, a run stopped after two
#    steps and resumed to three = three straight, its first loss the CPU's
#    within 1e-4; nothing left behind.
# Not run here: stages exchanging device memory (cuda_ipc, NCCL: the emulator
# has no IPC), MPS. Needs a CUDA build (the module beside a copy of mmpipe).
# ctest-labels: emu
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
EMU=$(dirname "$BIN")/cuda_emu/mmpipe
[ -x "$EMU" ] || { echo "no $EMU (a build without CUDA): skipped"; exit 77; }
workdir
synth 256 3
common=(--set "data.manifest=$W/data/train.jsonl" --set data.image_size=16 --set train.batch=16
        --set train.microbatches=2 --set train.eval_every=0 --set train.final_eval=false --force)
mixed=(--set "hosts=[{name: localhost, devices: [cuda:0, cpu, cpu]}]")
run() { # NAME BINARY PLAN ARGS...
  local name=$1 bin=$2 plan=$3; shift 3
  "$bin" launch "$plan" --out "$W/$name" "${common[@]}" "$@" >"$W/$name.log" 2>&1 \
    && ok "$name: completed" || { fail "$name failed"; tail -8 "$W/$name.log" | sed 's/^/    /'; }
}
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; printf "%.3g", (m > 0 ? d / m : d) }'; }
below() { awk -v r="$1" -v b="$2" 'BEGIN { exit !(r + 0 == r && r < b) }'; }

"$EMU" devices 2>&1 | grep -q '^cuda:0 *mmpipe CUDA emulator' && ok "devices lists the emulated cuda:0" \
  || fail "devices: $("$EMU" devices 2>&1 | tr '\n' ' ')"
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

run gpu_a "$EMU" configs/gpu-1.yaml --single-process --set job.steps=3
run gpu_b "$EMU" configs/gpu-1.yaml --single-process --set job.steps=3
out=$(same_ckpt "$W/gpu_a" "$W/gpu_b") && ok "three GPU steps twice: the same bits ($out)" \
  || fail "three GPU steps twice differ: $out"

run mixed_1f1b "$EMU" configs/gpu-1.yaml "${mixed[@]}" --set job.steps=3
run mixed_gpipe "$EMU" configs/gpu-1.yaml "${mixed[@]}" --set job.steps=3 --set train.schedule=gpipe
grep -q 'data channels: 0 over cuda_ipc, 4 over shm' "$W/mixed_1f1b.log" && ok "mixed: 4 shm channels" \
  || fail "mixed transports: $(grep -o 'data channels.*' "$W/mixed_1f1b.log")"
grep -q 'image.0/0: on cuda:0' "$W/mixed_1f1b.log" && ok "mixed: the image stage on cuda:0" \
  || fail "mixed: the image stage did not say cuda:0"
out=$(same_ckpt "$W/mixed_1f1b" "$W/mixed_gpipe") && ok "mixed 1f1b == mixed gpipe: $out" \
  || fail "mixed 1f1b differs from gpipe: $out"
run mixed_2 "$EMU" configs/gpu-1.yaml "${mixed[@]}" --set job.steps=2
"$EMU" launch "$W/mixed_2/plan.json" --resume "$W/mixed_2" --set job.steps=3 >"$W/mixed_resumed.log" 2>&1 \
  && ok "mixed: resumed to step 3" || { fail "mixed resume failed"; tail -5 "$W/mixed_resumed.log" | sed 's/^/    /'; }
out=$(same_ckpt "$W/mixed_2" "$W/mixed_1f1b") && ok "mixed: 2 steps + resume to 3 == 3 straight: $out" \
  || fail "mixed resumed differs: $out"
lm=$(metric "$W/mixed_1f1b/metrics.jsonl" loss 1 1); lc=$(metric "$W/cpu_step1/metrics.jsonl" loss 1 1)
r=$(rel "${lm:-nan}" "${lc:-0}")
below "$r" 1e-4 && ok "mixed step 1 loss $lm vs CPU $lc (rel $r < 1e-4)" || fail "mixed step 1 loss $lm vs CPU $lc: rel $r"
left_behind "mixed runs" "$W/mixed_1f1b.log" "$W/mixed_gpipe.log" "$W/mixed_2.log" "$W/mixed_resumed.log"
finish
