#!/usr/bin/env bash
# CUDA MPS for stages that share a GPU (coordinator/mps.c), with a stand-in
# nvidia-cuda-mps-control first on PATH that records how it is called: a
# plan with three slots on cuda:0 starts the job's private daemon (with
# CUDA_MPS_PIPE_DIRECTORY under /tmp/mmpipe-mps-*), its stages inherit the
# directory, and the daemon is told to quit and its directories are removed
# when the job ends (here it fails: no GPU, so the stages cannot start);
# MMP_GPU_SHARING=timeslice and a plan with one slot per GPU start none; one
# cuda:0 slot for three processes (dealt onto it in turn) starts one.
# Needs a CUDA build (a build without CUDA refuses cuda:N plans before any
# of this); skipped where a GPU is visible (the real daemon is exercised
# there by tests/gpu_pipeline.sh and bench/gpu.sh).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
"$BIN" devices | grep -q 'built without CUDA' && { echo "built without CUDA: skipped"; exit 77; }
"$BIN" devices | grep -q '^cuda:0' && { echo "a GPU is visible: skipped (see the header)"; exit 77; }
workdir
synth 64 3
tiny_plan "name: m, steps: 2, seed: 5" "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24" \
  1 "batch: 8, microbatches: 2, eval_every: 0, final_eval: false"
mkdir -p "$W/bin"
cat > "$W/bin/nvidia-cuda-mps-control" <<SH
#!/bin/sh
# records: the argument (or what came on stdin) and the pipe directory
if [ "\$1" = -d ]; then
  echo "start \$CUDA_MPS_PIPE_DIRECTORY" >> "$W/calls"; touch "\$CUDA_MPS_PIPE_DIRECTORY/control"
else
  read cmd; echo "\$cmd \$CUDA_MPS_PIPE_DIRECTORY" >> "$W/calls"; rm -f "\$CUDA_MPS_PIPE_DIRECTORY/control"
fi
SH
chmod +x "$W/bin/nvidia-cuda-mps-control"
one_gpu='hosts=[{name: localhost, devices: [cuda:0, cuda:0, cuda:0]}]'
PATH="$W/bin:$PATH" "$BIN" launch "$W/plan.yaml" --out "$W/run" --set "$one_gpu" >"$W/run.log" 2>&1
dir=$(sed -n 's/^start //p' "$W/calls" 2>/dev/null)
case "$dir" in /tmp/mmpipe-mps-*/pipe) ok "the job started its MPS daemon ($dir)" ;;
  *) fail "no MPS daemon started: calls '$(cat "$W/calls" 2>/dev/null)'"; tail -5 "$W/run.log" ;; esac
grep -qx "quit $dir" "$W/calls" 2>/dev/null && ok "and told it to quit at the end" || fail "no quit: $(cat "$W/calls" 2>/dev/null)"
[ -n "$dir" ] && [ ! -e "$(dirname "$dir")" ] && ok "its directories are gone" || fail "left: $(dirname "$dir")"
grep -q 'CUDA MPS daemon started' "$W/run.log" && ok "the log says so" || fail "log: no MPS line"
grep -q 'error run.c:[0-9]*: [a-z.0-9]*/0: .*cuda:0: 0 CUDA devices are visible to this process' "$W/run.log" \
  && ok "no GPU here: the stage's error says cuda:0 is not visible" || { fail "stage error"; grep error "$W/run.log" | head -2; }
rm -f "$W/calls"
MMP_GPU_SHARING=timeslice PATH="$W/bin:$PATH" "$BIN" launch "$W/plan.yaml" --out "$W/run2" --force \
  --set "$one_gpu" >"$W/run2.log" 2>&1
[ ! -e "$W/calls" ] && ok "MMP_GPU_SHARING=timeslice: no daemon" || fail "timeslice started one: $(cat "$W/calls")"
PATH="$W/bin:$PATH" "$BIN" launch "$W/plan.yaml" --out "$W/run3" --force \
  --set 'hosts=[{name: localhost, devices: [cuda:0, cuda:1, cuda:2]}]' >"$W/run3.log" 2>&1
[ ! -e "$W/calls" ] && ok "one slot per GPU: no daemon" || fail "a daemon for unshared GPUs: $(cat "$W/calls")"
# one slot for the plan's three processes: all three on cuda:0 (dealt in turn)
rm -f "$W/calls"
PATH="$W/bin:$PATH" "$BIN" launch "$W/plan.yaml" --out "$W/run4" --force \
  --set 'hosts=[{name: localhost, devices: [cuda:0]}]' >"$W/run4.log" 2>&1
grep -q '^start /tmp/mmpipe-mps-' "$W/calls" 2>/dev/null && grep -q '^quit ' "$W/calls" \
  && ok "three processes dealt onto one cuda:0 slot: the daemon starts and quits" \
  || fail "one slot, three processes: calls '$(cat "$W/calls" 2>/dev/null)'"
# the daemon's logs go with its directories: their lines that tell of
# trouble reach the job's log first (and only those)
cat > "$W/bin/nvidia-cuda-mps-control" <<SH
#!/bin/sh
if [ "\$1" = -d ]; then
  touch "\$CUDA_MPS_PIPE_DIRECTORY/control"
  printf '%s\n' '[t Control 7] Starting control daemon' '[t Control 7] Server 77 exited with status 0' \
    '[t Control 7] Server 78 exited with status 1' > "\$CUDA_MPS_LOG_DIRECTORY/control.log"
  printf '%s\n' '[t Server 78] Server has started' '[t Server 78] ERROR: mmp-test client fault' \
    > "\$CUDA_MPS_LOG_DIRECTORY/server.log"
else
  read cmd; rm -f "\$CUDA_MPS_PIPE_DIRECTORY/control"
fi
SH
PATH="$W/bin:$PATH" "$BIN" launch "$W/plan.yaml" --out "$W/run5" --force --set "$one_gpu" >"$W/run5.log" 2>&1
grep -q 'MPS control.log: \[t Control 7\] Server 78 exited with status 1' "$W/run5.log" \
  && grep -q 'MPS server.log: \[t Server 78\] ERROR: mmp-test client fault' "$W/run5.log" \
  && ok "the MPS logs' trouble reaches the job's log" || fail "MPS log lines: $(grep 'MPS ' "$W/run5.log" | tr '\n' ';')"
! grep -q 'status 0\|Server has started\|Starting control' "$W/run5.log" && ok "and only the trouble" \
  || fail "untroubled MPS lines in the job's log: $(grep 'MPS ' "$W/run5.log" | tr '\n' ';')"
left_behind "the failed GPU runs" "$W/run.log" "$W/run2.log" "$W/run3.log" "$W/run4.log" "$W/run5.log"
finish
