#!/usr/bin/env bash
# Whole-run behaviour of the single-process trainer on a small data set:
# bad plans and manifests fail before training with file:line:column / line
# numbers, two runs with one seed give bit-identical checkpoints, another seed
# does not, and `ckpt diff` reports structure and values as documented.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir

synth 600 3
tiny_plan "name: t, steps: 6, seed: 5" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 64" \
  1 "batch: 16, microbatches: 3, optimizer: { lr: 1.0e-3, warmup: 2 }, eval_every: 3"

# --- bad input fails before training, saying where ---------------------------
sed 's/microbatches: 3/microbatchs: 3/' "$W/plan.yaml" > "$W/typo.yaml"
expect_fail "misspelt key names file:line:col" "typo.yaml:5:[0-9]+: .*train.microbatchs" \
  "$BIN" launch "$W/typo.yaml" --out "$W/r_typo"
sed 's/batch: 16/batch: sixteen/' "$W/plan.yaml" > "$W/type.yaml"
expect_fail "wrong type names file:line:col" "type.yaml:5:[0-9]+: .*train.batch" \
  "$BIN" launch "$W/type.yaml" --out "$W/r_type"
expect_fail "bad --set names the override" "--set train.batch=0" \
  "$BIN" launch "$W/plan.yaml" --out "$W/r_set" --set train.batch=0
expect_fail "missing manifest names the path" "$W/nope/train.jsonl" \
  "$BIN" launch "$W/plan.yaml" --out "$W/r_nomani" --set data.manifest=$W/nope/train.jsonl
expect_fail "replicas: one number, or one per sub-stage" "stages.image.replicas: 3 values for 2 sub-stages" \
  "$BIN" launch "$W/plan.yaml" --out "$W/r_rep" --set stages.image.split=[2] --set stages.image.replicas=[1,2,1]
# A CUDA device where none can run it: refused by name (a build without
# CUDA before anything starts; a CUDA build on a machine without a device
# in the stage, naming the device). Where a device is visible this runs.
# A build without CUDA names where the plan gave the device: the override,
# or the file's line and column.
if ! "$BIN" devices | grep -q '^cuda:0'; then
  expect_fail "a CUDA device this machine cannot run is refused by name" \
    "--set hosts=\[.*\]: hosts\[0\].devices\[0\]: CUDA device 0, but this mmpipe was built without CUDA|backend cuda on device 0" \
    "$BIN" launch "$W/plan.yaml" --out "$W/r_gpu" --set 'hosts=[{name: a, devices: [cuda:0, cpu, cpu]}]'
  grep -v '^hosts:' "$W/plan.yaml" > "$W/gpu.yaml"
  printf 'hosts:\n  - name: a\n    devices: [cpu, cuda:1, cpu]\n' >> "$W/gpu.yaml"
  line=$(($(grep -n '^hosts:' "$W/gpu.yaml" | cut -d: -f1) + 1))
  expect_fail "a CUDA device in the plan file is refused at file:line:col" \
    "gpu.yaml:$line:[0-9]+: hosts\[0\].devices\[1\]: CUDA device 1, but this mmpipe was built without CUDA|backend cuda on device 1" \
    "$BIN" launch "$W/gpu.yaml" --out "$W/r_gpu2"
fi
mkdir -p "$W/badmani"
cp "$W/data/vocab.txt" "$W/data/val.jsonl" "$W/badmani/"
ln -s "$W/data/images" "$W/badmani/images"
head -4 "$W/data/train.jsonl" > "$W/badmani/train.jsonl"
echo '{"image": "images/000001.png", "text": ' >> "$W/badmani/train.jsonl"
expect_fail "malformed manifest line is reported by number" "train.jsonl:5" \
  "$BIN" launch "$W/plan.yaml" --out "$W/r_badmani" --set data.manifest=$W/badmani/train.jsonl
[ ! -e "$W/r_typo/ckpt" ] && [ ! -e "$W/r_badmani/ckpt" ] && ok "no run output after a bad plan" \
  || fail "a bad plan left run output"

# --- determinism ----------------------------------------------------------------
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/a" >"$W/a.log" 2>&1 || { fail "run a"; cat "$W/a.log"; }
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/b" >"$W/b.log" 2>&1 || { fail "run b"; cat "$W/b.log"; }
[ -d "$W/a/ckpt/latest" ] && [ -f "$W/a/ckpt/latest/image.ckpt" ] && ok "checkpoint written with latest" \
  || fail "no ckpt/latest"
[ "$(wc -l < "$W/a/metrics.jsonl")" -eq 6 ] && ok "one metrics line per step" || fail "metrics lines"
grep -q '"val_i2t_r1"' "$W/a/metrics.jsonl" && ok "metrics carry val recall" || fail "no val recall"
# the run's last line: the median samples/s of steps 2..N and the last
# evaluation, as metrics.jsonl has them (single process and pipeline)
"$BIN" launch "$W/plan.yaml" --out "$W/p" >"$W/p.log" 2>&1 || { fail "pipeline run p"; tail -3 "$W/p.log"; }
for r in a p; do
  med=$(metric "$W/$r/metrics.jsonl" samples_per_s 2 6 | median | awk '{ printf "%.0f", $1 }')
  rec=$(printf '%.3f, text->image %.3f' "$(last_metric "$W/$r/metrics.jsonl" val_i2t_r1)" \
    "$(last_metric "$W/$r/metrics.jsonl" val_t2i_r1)")
  line=$(grep 'done: 6 steps' "$W/$r.log")
  grep -qF "median $med samples/s (steps 2-6); val recall@1 image->text $rec (step 6)" <<<"$line" \
    && ok "$r: the last line tells the median samples/s and the recall metrics.jsonl holds" \
    || fail "$r: last line '$line', want median $med and recall $rec"
done
out=$("$BIN" ckpt diff "$W/a/ckpt/latest" "$W/b/ckpt/latest"); rc=$?
last=$(tail -1 <<<"$out")
[ $rc -eq 0 ] && [ "$last" = "max_abs_diff=0 max_rel_diff=0" ] && ok "same seed: ckpt diff exactly 0" \
  || fail "same seed differs: $last"
"$BIN" launch "$W/plan.yaml" --out "$W/c" --set job.seed=6 >"$W/c.log" 2>&1 || fail "run c"
out=$("$BIN" ckpt diff "$W/a" "$W/c" --quiet); rc=$?
last=$(tail -1 <<<"$out")
[ $rc -eq 0 ] && [ "$last" != "max_abs_diff=0 max_rel_diff=0" ] && ok "other seed: ckpt diff non-zero ($last)" \
  || fail "other seed gave $last rc=$rc"
"$BIN" ckpt diff "$W/a" "$W/c" --quiet --tol 1e-6 >/dev/null && fail "--tol should fail on a real difference" \
  || ok "--tol turns a difference into exit 1"

# --- ckpt diff structure --------------------------------------------------------
mkdir -p "$W/partial"; cp "$W/a/ckpt/latest/image.ckpt" "$W/partial/"
expect_fail "ckpt diff: missing tensors exit non-zero" "only in A" "$BIN" ckpt diff "$W/a" "$W/partial"
mkdir -p "$W/corrupt"; cp "$W/a/ckpt/latest/"* "$W/corrupt/" # the step, files.txt with it
printf 'garbage' | dd of="$W/corrupt/text.ckpt" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_fail "ckpt diff: corrupt file is named" "text.ckpt: checksum" "$BIN" ckpt diff "$W/a" "$W/corrupt"
expect_fail "existing run is not overwritten without --force" "already holds a run" \
  "$BIN" launch "$W/plan.yaml" --out "$W/a"
finish
