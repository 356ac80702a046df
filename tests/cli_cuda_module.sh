#!/usr/bin/env bash
# The CUDA module (common/cuda_module.h): in a build with CUDA, everything
# that links the CUDA runtime, cuBLAS, cuDNN and NCCL is build/libmmpcuda.so,
# which a process loads only when it needs a GPU. Checked, on any machine:
#  - the mmpipe binary itself needs none of those libraries (ldd);
#  - `mmpipe devices` loads the module (every symbol it needs from the
#    binary resolved at once, RTLD_NOW) and lists the devices, or says none
#    is visible; from a copy of the binary elsewhere too (it falls back to
#    the build folder);
#  - a CPU pipeline run: neither the coordinator nor any stage process maps
#    the module or a CUDA library, and the run equals --single-process;
#  - `mmpipe --help` stays small: its peak RSS under 100 MB (the libraries
#    alone took 226 MB when they were linked in).
# Skips (77) in a build without CUDA.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
"$BIN" devices 2>&1 | grep -q 'built without CUDA' && { echo "a build without CUDA: skipped"; exit 77; }
workdir
cuda_libs='libmmpcuda|libcublas|libcudnn|libnccl|libcudart'
if ldd "$BIN" | grep -Eq "$cuda_libs"; then
  fail "the binary links CUDA libraries: $(ldd "$BIN" | grep -Eo "$cuda_libs" | sort -u | tr '\n' ' ')"
else ok "the binary links no CUDA library (ldd)"; fi
out=$("$BIN" devices 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -Eq '^cuda:0|built with CUDA; no CUDA device is visible' <<<"$out"; then
  ok "mmpipe devices loads the module: $(tail -1 <<<"$out")"
else fail "mmpipe devices: rc $rc: $out"; fi
cp "$BIN" "$W/mmpipe-copy"
out=$("$W/mmpipe-copy" devices 2>&1); rc=$?
[ $rc -eq 0 ] && grep -Eq '^cuda:0|no CUDA device is visible' <<<"$out" \
  && ok "a copy of the binary elsewhere finds the module in its build folder" \
  || fail "copy: rc $rc: $out"

synth 200 4
tiny_plan "name: m, steps: 40, seed: 2" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24" \
  2 "batch: 16, microbatches: 4, eval_every: 0, ckpt_every: 0"
"$BIN" launch "$W/plan.yaml" --out "$W/pipe" >"$W/pipe.log" 2>&1 &
cpid=$!
wait_step "$W/pipe/metrics.jsonl" 3 || fail "no step 3"
mapped=0 seen=0
for pid in $cpid $(grep -o 'started [^ ]* (pid [0-9]*)' "$W/pipe.log" | grep -o '[0-9]*)$' | tr -d ')'); do
  [ -r /proc/$pid/maps ] || continue
  seen=$((seen + 1))
  grep -Eq "$cuda_libs" /proc/$pid/maps && mapped=$((mapped + 1))
done
wait $cpid || fail "pipeline run failed: $(tail -3 "$W/pipe.log")"
[ $seen -eq 4 ] && [ $mapped -eq 0 ] \
  && ok "CPU run: the coordinator and 3 stage processes map no CUDA library" \
  || fail "CPU run: $mapped of $seen processes (want 0 of 4) map a CUDA library"
"$BIN" launch "$W/plan.yaml" --out "$W/one" --single-process >"$W/one.log" 2>&1 || fail "single-process run"
out=$(same_ckpt "$W/pipe" "$W/one") && ok "CPU run == --single-process: $out" || fail "CPU run vs single-process: $out"
left_behind "CPU run" "$W/pipe.log"
if [ -x /usr/bin/time ]; then
  kb=$(/usr/bin/time -f %M "$BIN" --help 2>&1 >/dev/null | tail -1)
  [ "${kb:-999999}" -lt 100000 ] && ok "mmpipe --help: peak RSS $((kb / 1024)) MB (< 100)" \
    || fail "mmpipe --help: peak RSS ${kb:-?} KB"
fi
finish
