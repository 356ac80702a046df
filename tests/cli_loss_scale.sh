#!/usr/bin/env bash
# fp16 dynamic loss scaling (common/loss_scale.h, GradScaler's semantics)
# end to end: a forced overflow (train.debug_overflow_step, a test hook)
# skips exactly that optimizer step on every stage (weights and AdamW
# moments after it equal those before it; only the batch-norm running
# statistics move, as the forward ran) and halves the scale in metrics.jsonl;
# train.loss_scale_window clean steps double it; the pipeline equals the
# single process bitwise; a resumed run continues the scale state; bf16
# never scales nor skips.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 400 4
tiny_plan "name: ls, steps: 8, seed: 7" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 2 }, eval_every: 0,
     final_eval: false, ckpt_every: 1, ckpt_keep: 0, clip_grad_norm: 0.5, precision: fp16,
     loss_scale_window: 3, debug_overflow_step: 3"
# The scale sequence below is the one per-micro-batch fp16 products give
# (model.fusion.itc_scope: microbatch). Under batch scope the fusion's fp16
# weight-gradient products sum all 16 samples at once and overflow 2^16 at
# step 1, as one micro-batch of 16 does in either scope (tests/cli_itc_scope.sh
# runs fp16 under batch scope).
sed -i 's/fusion: { layers: 1, heads: 2 }/fusion: { layers: 1, heads: 2, itc_scope: microbatch }/' "$W/plan.yaml"
grep -q 'itc_scope: microbatch' "$W/plan.yaml" || fail "plan: itc_scope not set"

"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single" >"$W/single.log" 2>&1 \
  || { fail "single-process fp16 run"; tail -5 "$W/single.log"; finish; }
"$BIN" launch "$W/plan.yaml" --out "$W/pipe" >"$W/pipe.log" 2>&1 \
  || { fail "pipeline fp16 run"; tail -5 "$W/pipe.log"; finish; }

# --- the scale and the skips in metrics.jsonl ------------------------------------------
# 2^16 for the clean steps 1-2, halved by the overflow at step 3, doubled
# after three clean steps (4, 5, 6), then steady
want_scale="65536 65536 32768 32768 32768 65536 65536 65536"
want_skip="0 0 1 0 0 0 0 0"
for run in single pipe; do
  got_scale=$(metric "$W/$run/metrics.jsonl" loss_scale 1 8 | tr '\n' ' ' | sed 's/ $//')
  got_skip=$(metric "$W/$run/metrics.jsonl" step_skipped 1 8 | tr '\n' ' ' | sed 's/ $//')
  [ "$got_scale" = "$want_scale" ] && ok "$run: loss_scale per step $got_scale" \
    || fail "$run: loss_scale per step '$got_scale', want '$want_scale'"
  [ "$got_skip" = "$want_skip" ] && ok "$run: step_skipped per step $got_skip" \
    || fail "$run: step_skipped per step '$got_skip', want '$want_skip'"
done
grep -q "step 3: fp16 gradient overflow: optimizer step skipped on every stage" "$W/pipe.log" \
  && ok "the coordinator logs the skip" || fail "no skip line in the coordinator's log"

# --- step 3 skipped on every stage: its checkpoint holds step 2's weights --------------
# (the image, text and fusion processes' files, AdamW moments included; the
# only entries that may differ are batch-norm running statistics -- the
# forward of a skipped step still updates them, as in PyTorch -- and meta.*)
changed() { # DIR_A DIR_B: the trained entries that differ (first few), by prefix
  "$BIN" ckpt diff "$1" "$2" 2>&1 | grep ' differ, ' | grep -v -e 'running_' -e '^meta\.' | cut -d: -f1
}
moved=$(changed "$W/pipe/ckpt/step_0000002" "$W/pipe/ckpt/step_0000003")
[ -z "$moved" ] && ok "step 3 skipped: no parameter or AdamW moment of any stage changed" \
  || fail "step 3 changed $(head -3 <<<"$moved" | tr '\n' ' ')"
moved=$(changed "$W/pipe/ckpt/step_0000003" "$W/pipe/ckpt/step_0000004")
for f in image text fusion; do
  grep -q "^$f\..*adam_m" <<<"$moved" && ok "$f: step 4 trains again" \
    || fail "$f: step 4 changed no AdamW moment"
done

# --- the pipeline is the single process, bit for bit ------------------------------------
for s in 3 8; do
  d=ckpt/step_000000$s
  out=$(same_ckpt "$W/single/$d" "$W/pipe/$d") && ok "step $s: pipeline vs single-process: $out" \
    || fail "step $s: pipeline differs from single-process: $out"
done

# image branch cut in two with two replicas of its first half (their
# gradients reduced before the sum of squares), fusion replicated: the same
"$BIN" launch "$W/plan.yaml" --out "$W/split" --set 'stages.image.split=[2]' \
  --set 'stages.image.replicas=[2, 1]' --set 'stages.fusion.replicas=2' >"$W/split.log" 2>&1 \
  && { out=$(same_ckpt "$W/single" "$W/split") && ok "split + replicas vs single-process: $out" \
         || fail "split + replicas differ from single-process: $out"; } \
  || { fail "split + replicas run"; tail -5 "$W/split.log" | sed 's/^/    /'; }

# --- resume continues the scale state (scale, clean-step count, AdamW's t) --------------
# rewind both runs to step 4 (after the skip, one clean step into the window)
for run in single pipe; do
  cp -r "$W/$run" "$W/${run}_resumed"
  rm -rf "$W/${run}_resumed"/ckpt/step_000000[5-8]
  ln -sfn step_0000004 "$W/${run}_resumed/ckpt/latest"
done
"$BIN" launch "$W/plan.yaml" --single-process --resume "$W/single_resumed" >"$W/single_resumed.log" 2>&1 \
  || fail "single-process resume"
"$BIN" launch "$W/plan.yaml" --resume "$W/pipe_resumed" >"$W/pipe_resumed.log" 2>&1 \
  || fail "pipeline resume"
for run in single pipe; do
  out=$(same_ckpt "$W/$run" "$W/${run}_resumed") && ok "$run resumed at step 4 ends as the whole run: $out" \
    || fail "$run resumed at step 4 differs from the whole run: $out"
  got=$(metric "$W/${run}_resumed/metrics.jsonl" loss_scale 1 8 | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want_scale" ] && ok "$run resumed: loss_scale $got" \
    || fail "$run resumed: loss_scale '$got', want '$want_scale'"
done

# --- bf16 never scales: scale 1, and the forced overflow stops the run ------------------
expect_fail "bf16: an inf gradient is an error, not a skip" "not finite" \
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/bf16" --set train.precision=bf16
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/bf16ok" --set train.precision=bf16 \
  --set train.debug_overflow_step=0 --set job.steps=2 >"$W/bf16ok.log" 2>&1 || fail "bf16 run"
got=$(metric "$W/bf16ok/metrics.jsonl" loss_scale 1 2 | tr '\n' ' ')
[ "$got" = "1 1 " ] && ok "bf16: loss_scale 1" || fail "bf16: loss_scale '$got'"

# --- a resume in another precision starts the scale afresh ---------------------------------
# fp16 (its scale 65536 at step 7) resumed in bf16: no scaling (the fp16 scale was carried);
# the bf16 run's checkpoint resumed in fp16: 2^16, as a new GradScaler (1 was carried)
cp -r "$W/single" "$W/to_bf16"
rm -rf "$W/to_bf16"/ckpt/step_0000008 && ln -sfn step_0000007 "$W/to_bf16/ckpt/latest"
"$BIN" launch "$W/plan.yaml" --single-process --resume "$W/to_bf16" --set train.precision=bf16 \
  --set train.debug_overflow_step=0 >"$W/to_bf16.log" 2>&1 || fail "fp16 run resumed in bf16"
got=$(metric "$W/to_bf16/metrics.jsonl" loss_scale 8 8)
[ "$got" = 1 ] && ok "an fp16 checkpoint resumed in bf16: loss_scale 1" || fail "fp16 resumed in bf16: loss_scale '$got'"
"$BIN" launch "$W/plan.yaml" --single-process --resume "$W/bf16ok" --set job.steps=3 \
  --set train.debug_overflow_step=0 >"$W/to_fp16.log" 2>&1 || fail "bf16 run resumed in fp16"
got=$(metric "$W/bf16ok/metrics.jsonl" loss_scale 3 3)
[ "$got" = 65536 ] && ok "a bf16 checkpoint resumed in fp16: loss_scale starts at 65536" \
  || fail "bf16 resumed in fp16: loss_scale '$got'"

# --- an overflow in the forward (a weight past fp16's range): the loss is not finite, and
# the step is skipped as GradScaler does, by the single process as by the pipeline -----------
if command -v python3 >/dev/null; then
  "$BIN" ckpt export "$W/single" -o "$W/w.safetensors" --optimizer >/dev/null
  python3 - "$W/w.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
struct.pack_into('<f', b, 8 + n + h['fusion.itm_head.weight']['data_offsets'][0], 70000.0)
open(p, 'wb').write(b)
PY
  for mode in single pipe; do
    flag=; [ $mode = single ] && flag=--single-process
    "$BIN" ckpt import "$W/w.safetensors" --plan "$W/plan.yaml" -o "$W/big_$mode" >/dev/null
    "$BIN" launch "$W/plan.yaml" $flag --resume "$W/big_$mode" --set job.steps=2 \
      --set train.debug_overflow_step=0 >"$W/big_$mode.log" 2>&1; rc=$?
    got=$(metric "$W/big_$mode/metrics.jsonl" loss_scale 1 2 | tr '\n' ' ')
    [ $rc -eq 0 ] && [ "$got" = "32768 16384 " ] \
      && ok "$mode: a forward overflow skips the step and halves the scale ($got)" \
      || { fail "$mode: forward overflow: rc $rc, loss_scale '$got'"; tail -2 "$W/big_$mode.log"; }
  done
  out=$("$BIN" ckpt diff "$W/big_single" "$W/big_pipe" --quiet); rc=$?
  [ $rc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] \
    && ok "forward overflow: pipeline = single process" || fail "forward overflow: pipeline vs single: $(tail -1 <<<"$out")"
else echo "skip: forward overflow (no python3 to forge the weight)"; fi
finish
