#!/usr/bin/env bash
# configs/seed-scale.yaml (224x224 images, ResNet-34-like image branch,
# BERT-base-like text branch, 6 cross-attention fusion layers) loads as
# written and trains on CPU: two single-process steps of batch 2 complete
# with a finite loss and a checkpoint holding every branch's tensors. The
# plan is for GPUs; this only proves the shapes users train are runnable
# (about a minute and 7 GB here: labelled slow).
# ctest-labels: slow
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
W=$TMP/cli_seed_scale
rm -rf "$W"; mkdir -p "$W"
"$BIN" data synth --out "$W/data" --samples 16 --image-size 224 --seed 5 >/dev/null 2>&1 \
  || { echo "synth failed"; exit 1; }
"$BIN" simulate configs/seed-scale.yaml --set "data.manifest=$W/data/train.jsonl" >"$W/sim.txt" 2>&1 \
  && ok "configs/seed-scale.yaml loads and its schedule compiles" \
  || { fail "seed-scale does not load"; tail -3 "$W/sim.txt"; }
"$BIN" launch configs/seed-scale.yaml --single-process --out "$W/run" \
  --set "data.manifest=$W/data/train.jsonl" --set job.steps=2 --set train.batch=2 \
  --set train.microbatches=1 --set train.eval_every=0 --set train.final_eval=false \
  >"$W/run.log" 2>&1 && ok "two single-process steps at seed scale complete" \
  || { fail "seed-scale run failed"; tail -5 "$W/run.log" | sed 's/^/    /'; }
loss=$(last_metric "$W/run/metrics.jsonl" loss)
[ "$(wc -l < "$W/run/metrics.jsonl" 2>/dev/null)" = 2 ] && awk -v l="${loss:-nan}" 'BEGIN { exit !(l + 0 == l && l > 0 && l < 100) }' \
  && ok "two metrics lines, final loss $loss finite" || fail "metrics: loss '${loss:-none}'"
ls "$W/run/ckpt/latest/" 2>/dev/null | tr '\n' ' ' | grep -q 'fusion.ckpt image.ckpt text.ckpt' \
  && ok "checkpoint has image, text and fusion files" || fail "checkpoint files: $(ls "$W/run/ckpt/latest/" 2>&1)"
finish
