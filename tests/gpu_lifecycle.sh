#!/usr/bin/env bash
# A GPU run's life beyond plain training, on one GPU (every stage on cuda:0,
# under the job's MPS daemon): the paths no GPU run had exercised before.
# A small model in fp16 with a forced overflow at step 3
# (train.debug_overflow_step), evaluation every 20 steps and at the end,
# checkpoints every 5 steps; against the single process on the same GPU:
#  - the pipeline: checkpoint bitwise (max_abs_diff=0), the same loss scales
#    and skips (step 3 skipped on every stage: no parameter nor AdamW moment
#    moved), the same recall at steps 20 and 40;
#  - stopped by SIGINT after step 12 and resumed (--resume): bitwise;
#  - a GPU stage SIGKILLed after step 12, restarted (train.max_restarts):
#    bitwise, the restart in metrics.jsonl;
#  - re-placed at step 10 (balance.force: two image replicas, a fourth
#    process): bitwise;
#  - nothing left behind (processes, /dev/shm, the MPS directories).
# Skips (77) where no CUDA device is visible or the build has no CUDA.
# MMP_TEST_DEVICE=cpu runs the same on the CPU: a check of this script on a
# machine without a GPU (ctest's lifecycle_cpu, label cpu).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
dev=${MMP_TEST_DEVICE:-cuda:0}
if [ "$dev" != cpu ]; then
  "$BIN" devices 2>/dev/null | grep -q '^cuda:0' || { echo "no CUDA device: skipped"; exit 77; }
fi
W=$TMP/gpu_lifecycle
[ "$dev" = cpu ] && W=$TMP/lifecycle_cpu
rm -rf "$W"; mkdir -p "$W"
"$BIN" data synth --out "$W/data" --samples 400 --seed 6 >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
STEPS=40
[ "$dev" != cpu ] && STEPS=60 # a GPU runs these steps fast: room for the signals to land mid-run
cat > "$W/plan.yaml" <<YAML
job:   { name: lifecycle, steps: $STEPS, seed: 11 }
data:  { manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 48 }
model: { width: 32, image: { blocks: [1, 1], channels: [8, 16] },
         text: { layers: 2, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 4 }, clip_grad_norm: 0.5,
         precision: fp16, loss_scale_window: 3, debug_overflow_step: 3,
         eval_every: 20, final_eval: true, ckpt_every: 5, ckpt_keep: 0 }
hosts: [ { name: localhost, devices: [$dev, $dev, $dev, $dev] } ]
balance: { mode: off }
YAML
run() { # NAME ARGS...: a run into $W/NAME, its log $W/NAME.log
  local name=$1; shift
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" --force "$@" >"$W/$name.log" 2>&1 \
    && ok "$name ($dev): completed" || { fail "$name ($dev) failed"; tail -6 "$W/$name.log" | sed 's/^/    /'; }
}
seq_of() { metric "$W/$1/metrics.jsonl" "$2" 1 "$STEPS" | tr '\n' ' '; }

# --- the pipeline against the single process: fp16 skips and scales, evaluation -------
run single --single-process
run pipe
out=$(same_ckpt "$W/pipe" "$W/single") && ok "pipeline == single process: $out" \
  || fail "the pipeline differs from the single process: $out"
for k in loss_scale step_skipped; do
  a=$(seq_of pipe $k); b=$(seq_of single $k)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "$k per step the same in both" || fail "$k: pipeline '$a', single '$b'"
done
[ "$(metric "$W/pipe/metrics.jsonl" step_skipped 3 3)" = 1 ] && ok "step 3 skipped (the forced overflow)" \
  || fail "step 3 not skipped: step_skipped '$(metric "$W/pipe/metrics.jsonl" step_skipped 3 3)'"
moved=$("$BIN" ckpt diff "$W/pipe/ckpt/step_0000002" "$W/pipe/ckpt/step_0000003" 2>&1 | grep ' differ, ' \
  | grep -v -e 'running_' -e '^meta\.' | cut -d: -f1 | head -3 | tr '\n' ' ')
[ -z "$moved" ] && ok "no parameter or AdamW moment of any stage moved at step 3" || fail "step 3 moved: $moved"
for s in 20 40; do
  a=$(metric "$W/pipe/metrics.jsonl" val_i2t_r1 $s $s)/$(metric "$W/pipe/metrics.jsonl" val_t2i_r1 $s $s)
  b=$(metric "$W/single/metrics.jsonl" val_i2t_r1 $s $s)/$(metric "$W/single/metrics.jsonl" val_t2i_r1 $s $s)
  [ "$a" != / ] && [ "$a" = "$b" ] && ok "step $s recall (i2t/t2i) $a in both" || fail "step $s recall: pipeline '$a', single '$b'"
done

# --- stopped by SIGINT, resumed ----------------------------------------------------------
"$BIN" launch "$W/plan.yaml" --out "$W/resumed" --force >"$W/resumed.log" 2>&1 &
cpid=$!
wait_step "$W/resumed/metrics.jsonl" 12 120 || fail "resumed: no step 12"
kill -INT $cpid; wait $cpid; rc=$?
at=$(last_step "$W/resumed/metrics.jsonl")
[ "$rc" -eq 130 ] && [ "$at" -lt "$STEPS" ] && ok "stopped by SIGINT after step $at (rc 130)" \
  || fail "SIGINT: rc $rc after step $at of $STEPS"
"$BIN" launch "$W/plan.yaml" --resume "$W/resumed" >>"$W/resumed.log" 2>&1 || fail "resume failed"
out=$(same_ckpt "$W/resumed" "$W/pipe") && ok "resumed == uninterrupted: $out" || fail "resumed differs: $out"
steps_once "$W/resumed/metrics.jsonl" "$STEPS" && ok "resumed: metrics hold every step once" \
  || fail "resumed: metrics steps repeat or miss"

# --- a GPU stage killed, the run restarted -------------------------------------------------
L=$W/restarted.log
"$BIN" launch "$W/plan.yaml" --out "$W/restarted" --force --set train.max_restarts=2 >"$L" 2>&1 &
cpid=$!
wait_step "$W/restarted/metrics.jsonl" 12 120 || fail "restarted: no step 12"
vpid=$(grep -o "started text.0/0 (pid [0-9]*)" "$L" | tail -1 | grep -o '[0-9]*)$' | tr -d ')')
[ -n "$vpid" ] && kill -KILL "$vpid"
wait $cpid; rc=$?
[ "$rc" -eq 0 ] && grep -q "restart 1 of 2 after step" "$L" && ok "text.0/0 SIGKILLed, restarted, finished" \
  || { fail "restart: rc $rc"; grep -E 'error|restart' "$L" | tail -4 | sed 's/^/    /'; }
grep -q '"restarts":\[{"n":1' "$W/restarted/metrics.jsonl" && ok "the restart is in metrics.jsonl" \
  || fail "no restart in metrics.jsonl"
out=$(same_ckpt "$W/restarted" "$W/pipe") && ok "restarted == uninterrupted: $out" || fail "restarted differs: $out"

# --- re-placed by the balancer (scripted) --------------------------------------------------
run replaced --set balance.force.step=10 --set 'balance.force.set=stages.image.replicas=2'
grep -q 're-plac' "$W/replaced.log" && ok "re-placed at step 10" \
  || fail "no re-placement: $(grep -i 'balance\|plac' "$W/replaced.log" | head -2 | tr '\n' ';')"
out=$(same_ckpt "$W/replaced" "$W/pipe") && ok "re-placed (two image replicas) == uninterrupted: $out" \
  || fail "re-placed differs: $out"

if [ "$dev" != cpu ]; then
  grep -q "CUDA MPS daemon started" "$W/pipe.log" && ok "the stages ran under the job's MPS daemon" \
    || fail "no MPS daemon: $(grep -i mps "$W/pipe.log" | head -2)"
  mps_left=$(grep -ho '/tmp/mmpipe-mps-[0-9a-f]*' "$W"/*.log | sort -u | while read -r d; do [ -e "$d" ] && echo "$d"; done)
  [ -z "$mps_left" ] && ok "no MPS directory left" || fail "MPS directories left: $mps_left"
  # nor a daemon or server of ours (they carry our pipe directory in their
  # environment; quit is asynchronous: a few seconds' grace)
  ours=$(grep -ho '/tmp/mmpipe-mps-[0-9a-f]*' "$W"/*.log | sort -u)
  mps_procs() {
    local pid d
    for pid in $(pgrep -f '^[^ ]*nvidia-cuda-mps-(control|server)'); do # names past 15 characters: -f
      for d in $ours; do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^CUDA_MPS_PIPE_DIRECTORY=$d/" && echo "$pid"
      done
    done
  }
  for _ in $(seq 50); do [ -z "$(mps_procs)" ] && break; sleep 0.1; done
  left=$(mps_procs | tr '\n' ' ')
  [ -z "$left" ] && ok "no MPS daemon or server of these runs left" || fail "MPS processes left: $left"
fi
left_behind "lifecycle runs" "$W/pipe.log" "$W/resumed.log" "$W/restarted.log" "$W/replaced.log"
finish
