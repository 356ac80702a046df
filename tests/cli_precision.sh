#!/usr/bin/env bash
# Mixed precision end to end (train.precision bf16 | fp16): the pipeline
# equals the single process bitwise for gpipe, 1f1b and zb-h1 (the branch->fusion
# edges carry bf16/fp16 data, the single process rounds at the same points),
# also with the image branch cut in two (sub-stage edges stay fp32); bf16
# learns as fp32 does.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 800 4
tiny_plan "name: mp, steps: 12, seed: 7" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 6, clip_grad_norm: 0.5"

for prec in bf16 fp16; do
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/single_$prec" --set train.precision=$prec \
    >"$W/single_$prec.log" 2>&1 || { fail "single $prec"; tail -3 "$W/single_$prec.log"; continue; }
  for run in gpipe 1f1b zb-h1 split; do
    name=${prec}_$run
    extra=(--set train.schedule=$run)
    [ $run = split ] && extra=(--set 'stages.image.split=[2]')
    "$BIN" launch "$W/plan.yaml" --out "$W/$name" --set train.precision=$prec "${extra[@]}" \
      >"$W/$name.log" 2>&1 || { fail "$name: launch"; tail -5 "$W/$name.log" | sed 's/^/    /'; continue; }
    out=$(same_ckpt "$W/single_$prec" "$W/$name") && ok "$name vs single-process: $out" \
      || fail "$name differs from single-process: $out"
  done
done
# the rounding is real: bf16 and fp32 end elsewhere
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single_fp32" >"$W/single_fp32.log" 2>&1 \
  || fail "single fp32"
same_ckpt "$W/single_fp32" "$W/single_bf16" >/dev/null && fail "bf16 equals fp32" || ok "bf16 differs from fp32"

# --- bf16 learns the task as fp32 does (final loss within 5%) ------------------------
# (a property of the numbers, not of memory: the Release pass asserts it, the
# sanitizers' pass stops here instead of spending two minutes on 240 steps)
[ "$SANITIZED" = 1 ] && { echo "skip the bf16 learning check under the sanitizers"; finish; exit; }
tiny_plan "name: mpl, steps: 120, seed: 3" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64" \
  2 "batch: 16, microbatches: 2, optimizer: { lr: 2.0e-3, warmup: 10 }, eval_every: 0"
for prec in fp32 bf16; do
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/learn_$prec" --set train.precision=$prec \
    >"$W/learn_$prec.log" 2>&1 || fail "learn $prec"
done
l0=$(metric "$W/learn_fp32/metrics.jsonl" loss 1 1)
l32=$(metric "$W/learn_fp32/metrics.jsonl" loss 101 120 | median)
l16=$(metric "$W/learn_bf16/metrics.jsonl" loss 101 120 | median)
awk -v a="$l32" -v b="$l16" -v s="$l0" 'BEGIN { exit !(b < 0.8 * s && (b - a) / a < 0.05 && (a - b) / a < 0.05) }' \
  && ok "bf16 learns: loss $l0 -> $l16 (fp32 $l32, median of steps 101-120, within 5%)" \
  || fail "bf16 loss $l16 vs fp32 $l32 (start $l0)"
finish
