#!/usr/bin/env bash
# model.fusion.itc_scope: batch (the default) computes ITC over all of a
# step's pairs and mines ITM hard negatives from the whole batch, so
# train.microbatches is a scheduling knob again; microbatch keeps the loss
# per micro-batch (fewer negatives as m grows).
#
# 1. --single-process, m = 1, 2, 4, 8, three steps: under batch scope every
#    step's loss agrees with m = 1 within LOSS_TOL1 (step 1) and LOSS_TOL
#    (steps 2, 3); under microbatch scope m = 2 is already far off (the
#    per-micro-batch objective). Not bitwise: the image branch's batch norm
#    normalises each micro-batch with its own statistics (as PyTorch with
#    gradient accumulation does), which moves the image features, and
#    per-micro-batch parameter gradients round differently. Seen on this
#    data (batch 64, 8 to 64 samples a micro-batch): step 1 within 0.4%,
#    steps 2-3 within 1.0%; microbatch scope: 11% at m = 2, 37% at m = 8.
# 2. The final checkpoints: weights cannot be compared entry by entry (AdamW's
#    first steps move every weight by about lr whatever the size of its
#    gradient, so a small gradient difference flips whole steps: max_rel_diff
#    reaches 2 in either scope), so each is judged by what it computes: its
#    loss on step 4's batch, evaluated the same way (resumed with m = 1).
#    Seen within 0.25% (m = 2, 4) and 1.3% (m = 8: batch norm over 8
#    samples) of m = 1's; bound CKPT_TOL = 3%. This bounds how far batch
#    norm's per-micro-batch statistics move the weights; after three steps
#    it does not tell the scopes apart (microbatch scope's checkpoints land
#    within 2.1%), the losses of section 1 do.
# 3. The pipeline equals --single-process bitwise under batch scope for gpipe,
#    1f1b and zb-h1 (the fusion's batch backward split: its weight pass
#    deferred, which fusion/0's wgt_ms shows ran), with image / text / fusion
#    replicas (fusion x3 with m = 2: a replica routed no micro-batch still
#    joins the gather of the features), in fp16 too, and under microbatch
#    scope as before.
# 4. The cost: every stage holds all m micro-batches' activations (the
#    stages' own in-flight reports), and `simulate` shows the lists.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 600 5
LOSS_TOL1=0.01
LOSS_TOL=0.02
CKPT_TOL=0.03
tiny_plan "name: s, steps: 3, seed: 3" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 64, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 2 }, eval_every: 0, final_eval: false"

# rel A B: |A - B| / |B|
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; printf "%.5f\n", d / b }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# --- 1. the loss does not depend on train.microbatches ---------------------------------
for sc in batch microbatch; do
  for m in 1 2 4 8; do
    "$BIN" launch "$W/plan.yaml" --single-process --out "$W/${sc}_m$m" --set train.microbatches=$m \
      --set model.fusion.itc_scope=$sc >"$W/${sc}_m$m.log" 2>&1 \
      || { fail "single $sc m=$m"; tail -3 "$W/${sc}_m$m.log"; }
  done
done
for m in 2 4 8; do
  for step in 1 2 3; do
    a=$(metric "$W/batch_m$m/metrics.jsonl" loss $step $step)
    b=$(metric "$W/batch_m1/metrics.jsonl" loss $step $step)
    tol=$([ $step -eq 1 ] && echo $LOSS_TOL1 || echo $LOSS_TOL)
    r=$(rel "$a" "$b")
    le "$r" "$tol" && ok "batch scope m=$m step $step: loss $a vs m=1 $b (rel $r <= $tol)" \
      || fail "batch scope m=$m step $step: loss $a vs m=1 $b (rel $r > $tol)"
  done
done
[ "$(metric "$W/microbatch_m1/metrics.jsonl" loss 1 1)" = "$(metric "$W/batch_m1/metrics.jsonl" loss 1 1)" ] \
  && out=$("$BIN" ckpt diff "$W/batch_m1" "$W/microbatch_m1" --quiet | tail -1) && [ "$out" = "max_abs_diff=0 max_rel_diff=0" ] \
  && ok "m=1: both scopes are the same step (same loss, same checkpoint)" || fail "m=1 differs between scopes"
for m in 2 8; do
  a=$(metric "$W/microbatch_m$m/metrics.jsonl" loss 1 1); b=$(metric "$W/batch_m1/metrics.jsonl" loss 1 1)
  r=$(rel "$a" "$b")
  le 0.05 "$r" && ok "microbatch scope m=$m: step-1 loss $a, rel $r from the batch's (the per-micro-batch objective)" \
    || fail "microbatch scope m=$m: step-1 loss $a close to the batch's $b (rel $r): the test cannot tell the scopes apart"
done

# --- 2. the final checkpoints compute the same loss --------------------------------------
for m in 1 2 4 8; do
  cp -r "$W/batch_m$m" "$W/next_m$m"
  "$BIN" launch "$W/plan.yaml" --single-process --resume "$W/next_m$m" --set job.steps=4 \
    --set train.microbatches=1 >"$W/next_m$m.log" 2>&1 || { fail "resume m=$m"; tail -3 "$W/next_m$m.log"; }
done
for m in 2 4 8; do
  a=$(metric "$W/next_m$m/metrics.jsonl" loss 4 4); b=$(metric "$W/next_m1/metrics.jsonl" loss 4 4)
  r=$(rel "$a" "$b")
  le "$r" "$CKPT_TOL" && ok "checkpoint of m=$m after 3 steps: loss on step 4's batch $a vs m=1's $b (rel $r <= $CKPT_TOL)" \
    || fail "checkpoint of m=$m: loss on step 4's batch $a vs m=1's $b (rel $r > $CKPT_TOL)"
done

# --- 3. the pipeline still equals one process bitwise ----------------------------------
sed -i 's/steps: 3,/steps: 6,/' "$W/plan.yaml"
for m in 2 4; do
  for sc in batch microbatch; do
    "$BIN" launch "$W/plan.yaml" --single-process --out "$W/s_${sc}_m$m" --set train.microbatches=$m \
      --set model.fusion.itc_scope=$sc >"$W/s_${sc}_m$m.log" 2>&1 || fail "single $sc m=$m (6 steps)"
  done
done
run_pipe() { # name m scope extra...
  local name=$1 m=$2 sc=$3; shift 3
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" --set train.microbatches=$m --set model.fusion.itc_scope=$sc \
    "$@" >"$W/$name.log" 2>&1 || { fail "$name: launch"; tail -5 "$W/$name.log" | sed 's/^/    /'; return; }
  out=$(same_ckpt "$W/s_${sc}_m$m" "$W/$name") && ok "$name vs single-process: $out" \
    || fail "$name differs from single-process: $out"
  [ "$(metric "$W/$name/metrics.jsonl" loss 1 6)" = "$(metric "$W/s_${sc}_m$m/metrics.jsonl" loss 1 6)" ] \
    && ok "$name: the same six losses" || fail "$name: losses differ"
}
for sched in gpipe 1f1b zb-h1; do
  run_pipe "${sched}_batch" 4 batch --set train.schedule=$sched
  run_pipe "${sched}_batch_rep" 4 batch --set train.schedule=$sched --set stages.image.replicas=2 \
    --set stages.text.replicas=2 --set stages.fusion.replicas=2
done
# zb-h1 splits the fusion's batch backward too: its weight pass ran apart
# (wgt_ms) on the replica whose gradients count, and the sums stayed exact
wgt() { grep -o "\"name\":\"fusion\",\"replica\":$2,[^}]*\"wgt_ms\":[0-9.e+-]*" "$W/$1/metrics.jsonl" \
  | grep -o '[0-9.e+-]*$' | awk '$1 > 0 { n++ } END { print n + 0 }'; }
for run in zb-h1_batch zb-h1_batch_rep; do
  n=$(wgt $run 0)
  [ "$n" -eq 6 ] && ok "$run: fusion/0 ran its deferred weight pass in all 6 steps" \
    || fail "$run: fusion/0 reported a weight pass in $n of 6 steps"
done
run_pipe fusion3_m2 2 batch --set stages.fusion.replicas=3
grep -q '"name":"GATHER"' "$W/gpipe_batch_rep/trace.json" \
  && ok "replicated fusion: the gather of the step's features is traced" || fail "no GATHER span in trace.json"
run_pipe 1f1b_microbatch 4 microbatch --set train.schedule=1f1b
# fp16 (loss scaling: the loss gradient times the scale where the batch's
# backward starts, the scale decided by the coordinator as before)
for run in single pipe zb; do
  extra=(); [ $run = single ] && extra=(--single-process)
  [ $run = zb ] && extra=(--set train.schedule=zb-h1)
  "$BIN" launch "$W/plan.yaml" "${extra[@]}" --out "$W/fp16_$run" --set train.precision=fp16 \
    --set train.microbatches=4 >"$W/fp16_$run.log" 2>&1 || fail "fp16 $run"
done
out=$(same_ckpt "$W/fp16_single" "$W/fp16_pipe") && ok "fp16, batch scope: pipeline vs single-process: $out" \
  || fail "fp16, batch scope: pipeline differs: $out"
out=$(same_ckpt "$W/fp16_single" "$W/fp16_zb") && ok "fp16, batch scope, zb-h1: pipeline vs single-process: $out" \
  || fail "fp16, batch scope, zb-h1: pipeline differs: $out"
a=$(metric "$W/fp16_single/metrics.jsonl" loss_scale 1 6 | tr '\n' ' '); b=$(metric "$W/fp16_pipe/metrics.jsonl" loss_scale 1 6 | tr '\n' ' ')
[ "$a" = "$b" ] && [ -n "$a" ] && ok "fp16, batch scope: the same loss scales ($a)" || fail "fp16 loss scales: '$a' vs '$b'"
run_pipe 1f1b_microbatch_rep 4 microbatch --set stages.fusion.replicas=2

# --- 4. the cost: activations of every micro-batch held -------------------------------
max_inflight() { grep -o "\"name\":\"$2\"[^}]*\"max_inflight\":[0-9]*" "$1/metrics.jsonl" | grep -o '[0-9]*$' | sort -n | tail -1; }
for st in image.0 text.0 fusion; do
  got=$(max_inflight "$W/1f1b_batch" $st)
  [ "$got" = 4 ] && ok "1f1b, batch scope: $st held all 4 micro-batches" || fail "1f1b, batch scope: $st held $got, want 4"
done
got=$(max_inflight "$W/1f1b_microbatch" fusion)
[ "$got" = 1 ] && ok "1f1b, microbatch scope: fusion held 1" || fail "1f1b, microbatch scope: fusion held $got, want 1"
out=$("$BIN" simulate "$W/plan.yaml" --set train.microbatches=4 --dump 2>&1)
grep -q '^image.0: L0 F0 Sa0 L1 F1 Sa1 L2 F2 Sa2 L3 F3 Sa3 Rg0 B0' <<<"$out" \
  && grep -q '^fusion: .*F3 B0 ' <<<"$out" && ok "simulate: every forward before the first backward" \
  || fail "simulate lists: $(grep -E '^(image.0|fusion):' <<<"$out")"
expect_fail "itc_scope: unknown value" "model.fusion.itc_scope" \
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/bad" --set model.fusion.itc_scope=step
[ "$(shm_left "$W"/*.log)" -eq 0 ] && ok "no /dev/shm segments left" || fail "shm segments left"
[ "$(procs_left "$W"/*.log)" -eq 0 ] && ok "no stage processes left" || fail "stage processes left"
finish
