#!/usr/bin/env bash
# Bad samples in a real run, both policies (data.on_bad_sample):
#  fail: a plan whose manifest has a malformed line or an empty caption stops
#        before training, naming manifest:line; a truncated image stops the
#        run when it is reached, naming its line;
#  skip: the same data trains to the end; skipped samples are counted in
#        metrics.jsonl; the fusion stage's alignment check stays silent; and
#        the pipeline still equals --single-process bit for bit (1f1b, and
#        zb-h1 with the fusion's batch backward split over the good rows).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 320 8
D=$W/data
# load-time problems: missing, truncated, zero-size, not an image; a caption of control characters only
rm "$D/images/000010.png"
head -c 60 "$D/images/000020.png" > "$W/t.png" && mv "$W/t.png" "$D/images/000020.png"
: > "$D/images/000030.png"
echo "not a picture" > "$D/images/000040.png"
cp "$D/train.jsonl" "$W/loadtime.jsonl"
sed -i '51s/"text": "[^"]*"/"text": "\\u0001\\u0002"/' "$W/loadtime.jsonl"
# open-time problems on top: a malformed line and an empty caption (skip drops them at open)
cp "$W/loadtime.jsonl" "$W/all.jsonl"
sed -i '61s/.*/{"image": "images\/000060.png", "text": /' "$W/all.jsonl"
sed -i '71s/"text": "[^"]*"/"text": ""/' "$W/all.jsonl"
ln -s "$D/images" "$W/images"
cp "$D/vocab.txt" "$D/val.jsonl" "$W/"
tiny_plan "name: b, steps: 24, seed: 3" \
  "manifest: $W/all.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  1 "batch: 32, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 2 }, eval_every: 0"

# --- fail (the default) ------------------------------------------------------------
sed -n '1,9p' "$D/train.jsonl" > "$W/malformed.jsonl"
sed -i '5s/.*/{"image": "images\/000004.png", "text": /' "$W/malformed.jsonl"
expect_fail "fail: malformed line stops before training" "malformed.jsonl:5: not valid JSON" \
  "$BIN" launch "$W/plan.yaml" --out "$W/f1" --set data.manifest="$W/malformed.jsonl"
[ ! -e "$W/f1/metrics.jsonl" ] || [ ! -s "$W/f1/metrics.jsonl" ] && ok "fail: no step ran" || fail "fail: steps ran"
expect_fail "fail: missing image named by line at open" "loadtime.jsonl:11" \
  "$BIN" launch "$W/plan.yaml" --out "$W/f2" --set data.manifest="$W/loadtime.jsonl"
# Only a truncated image left: found while training, named by its line.
cp "$D/train.jsonl" "$W/trunc.jsonl"
cp "$D/images/000011.png" "$D/images/000010.png"
head -c 60 "$D/images/000021.png" > "$W/t.png"; cp "$D/images/000022.png" "$D/images/000030.png"
cp "$D/images/000023.png" "$D/images/000040.png"
# now: 000020 truncated (line 21), everything else decodes
expect_fail "fail: truncated image stops the pipeline naming its line" "trunc.jsonl:21" \
  "$BIN" launch "$W/plan.yaml" --out "$W/f3" --set data.manifest="$W/trunc.jsonl"
expect_fail "fail: same in one process" "trunc.jsonl:21" \
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/f4" --set data.manifest="$W/trunc.jsonl"
# A truncated image in the validation set, met by the evaluation at step 4: the run
# stops naming it, but step 4 (due a checkpoint too) is saved first, its line in
# metrics.jsonl without recall; with the image mended the run resumes from it, evaluates
# step 4 first (its line gets the recall) and goes on.
sed '21d' "$W/trunc.jsonl" >"$W/good.jsonl"
sed '3s|"image": "[^"]*"|"image": "images/000020.png"|' "$D/val.jsonl" >"$W/badval.jsonl"
for mode in pipe single; do
  flag=; [ $mode = single ] && flag=--single-process
  R=$W/val_$mode
  expect_fail "fail ($mode): a truncated validation image stops the run naming its line" \
    "badval.jsonl:3" "$BIN" launch "$W/plan.yaml" $flag --out "$R" --set data.manifest="$W/good.jsonl" \
    --set data.val_manifest="$W/badval.jsonl" --set job.steps=8 --set train.eval_every=4 \
    --set train.ckpt_every=4
  [ "$(readlink "$R/ckpt/latest")" = step_0000004 ] && steps_once "$R/metrics.jsonl" 4 \
    && ! grep -q val_i2t "$R/metrics.jsonl" \
    && ok "fail ($mode): the evaluated step was checkpointed first (step 4, its line without recall)" \
    || fail "fail ($mode): latest '$(readlink "$R/ckpt/latest")', last line step $(last_step "$R/metrics.jsonl")"
done
cp "$D/images/000024.png" "$D/images/000020.png" # mended
for mode in pipe single; do
  flag=; [ $mode = single ] && flag=--single-process
  R=$W/val_$mode
  "$BIN" launch "$R/plan.json" $flag --resume "$R" >"$R.resumed.log" 2>&1 && steps_once "$R/metrics.jsonl" 8 \
    && [ "$(grep -c val_i2t "$R/metrics.jsonl")" = 2 ] && sed -n 4p "$R/metrics.jsonl" | grep -q val_i2t \
    && grep -q "step 4: its evaluation was cut short; evaluating it now" "$R.resumed.log" \
    && ok "fail ($mode): resumed from step 4, evaluated it first, then to 8, evaluated" \
    || { fail "fail ($mode): resume"; tail -3 "$R.resumed.log"; }
done
# A bad sample met while training stops the run, but what it trained is kept: every
# stage puts its state back to the end of the last finished step (with the batch-norm
# statistics the cut step's forwards moved) and that step is checkpointed, though no
# checkpoint was due (ckpt_every 5). Mended and resumed, the run ends on the bits of a
# run that never met it. Line 21 stops step 4 at its first micro-batch (step 3's results
# still coming in: step 4 was chained), line 45 stops step 3 at its last (after three
# forwards). Both in one process, in the pipeline, and with two image replicas.
keep_flags() {
  case $1 in
    single) echo --single-process ;;
    replicas) echo --set stages.image.replicas=2 ;;
  esac
}
for case in "21 3" "45 2"; do
  set -- $case
  line=$1 kept=$2 img=$(printf '%06d' $(($1 - 1)))
  cp "$D/images/$img.png" "$W/good.png"
  head -c 60 "$D/images/000021.png" >"$D/images/$img.png"
  for mode in single pipe replicas; do
    R=$W/keep${line}_$mode
    "$BIN" launch "$W/plan.yaml" $(keep_flags $mode) --out "$R" --set data.manifest="$W/trunc.jsonl" \
      --set train.ckpt_every=5 >"$R.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && grep -q "trunc.jsonl:$line: .*truncated" "$R.log" \
      && grep -q "what was trained is kept: step $kept of 24" "$R.log" \
      && [ "$(readlink "$R/ckpt/latest")" = "step_000000$kept" ] && steps_once "$R/metrics.jsonl" "$kept" \
      && ok "fail ($mode, line $line): stops naming it, keeps step $kept (checkpoint, its line once)" \
      || { fail "fail ($mode, line $line): rc $rc, latest '$(readlink "$R/ckpt/latest")', last line step $(last_step "$R/metrics.jsonl")"; tail -3 "$R.log"; }
  done
  cp "$W/good.png" "$D/images/$img.png" # mended
  S=$W/keep${line}_straight
  "$BIN" launch "$W/plan.yaml" --single-process --out "$S" --set data.manifest="$W/trunc.jsonl" \
    --set train.ckpt_every=5 >"$S.log" 2>&1 || { fail "keep: a straight run"; tail -3 "$S.log"; }
  for mode in single pipe replicas; do
    R=$W/keep${line}_$mode
    flag=
    [ $mode = single ] && flag=--single-process
    "$BIN" launch "$R/plan.json" $flag --resume "$R" >"$R.resumed.log" 2>&1 \
      && steps_once "$R/metrics.jsonl" 24 && same_ckpt "$R" "$S" \
      && ok "fail ($mode, line $line): mended and resumed from step $kept = never met (max_abs_diff=0)" \
      || { fail "fail ($mode, line $line): resumed"; tail -3 "$R.resumed.log"; }
  done
done
left_behind "fail: keeping what was trained" "$W"/keep*.log
head -c 60 "$D/images/000021.png" >"$D/images/000020.png" # truncated again, for what follows

# --- skip ----------------------------------------------------------------------------
rm "$D/images/000010.png"; : > "$D/images/000030.png"; echo "not a picture" > "$D/images/000040.png"
"$BIN" launch "$W/plan.yaml" --out "$W/s_pipe" --set data.on_bad_sample=skip >"$W/s_pipe.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "skip: the pipeline trains to the end" || { fail "skip: pipeline rc=$rc"; tail -5 "$W/s_pipe.log"; }
total=$(grep -o '"skipped_samples":[0-9]*' "$W/s_pipe/metrics.jsonl" | cut -d: -f2 | paste -sd+ | bc)
[ -n "$total" ] && [ "$total" -ge 5 ] && ok "skip: $total skipped samples counted in metrics.jsonl" \
  || fail "skip: skipped_samples total ${total:-none}"
grep -q "refusing to pair" "$W/s_pipe.log" && fail "skip: alignment check fired" || ok "skip: alignment check silent"
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/s_single" --set data.on_bad_sample=skip \
  >"$W/s_single.log" 2>&1 || { fail "skip: single-process"; tail -5 "$W/s_single.log"; }
out=$("$BIN" ckpt diff "$W/s_single" "$W/s_pipe" --quiet); rc=$?
[ $rc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] \
  && ok "skip: pipeline equals single-process" || fail "skip: pipeline vs single: $(tail -1 <<<"$out")"
# zb-h1: the fusion's batch backward split (weight pass deferred) over the
# gathered good rows
"$BIN" launch "$W/plan.yaml" --out "$W/s_zb" --set data.on_bad_sample=skip --set train.schedule=zb-h1 \
  >"$W/s_zb.log" 2>&1 || { fail "skip: zb-h1 pipeline"; tail -5 "$W/s_zb.log"; }
out=$("$BIN" ckpt diff "$W/s_single" "$W/s_zb" --quiet); rc=$?
[ $rc -eq 0 ] && [ "$(tail -1 <<<"$out")" = "max_abs_diff=0 max_rel_diff=0" ] \
  && ok "skip: zb-h1 pipeline equals single-process" || fail "skip: zb-h1 vs single: $(tail -1 <<<"$out")"
finish
