#!/usr/bin/env bash
# mmpipe ckpt export / import (issue 15):
#  round trip: a run's checkpoint exported with --optimizer and imported back
#              holds the same tensors bit for bit (only meta.step differs:
#              an import is step 0), and `launch --resume` trains on from it;
#  plain:      an export without moments imports with fresh (zero) moments;
#  untrusted:  a truncated file, a file for another model and a file with a
#              stray tensor are refused naming the file, offset or tensor,
#              and leave no checkpoint behind; an import never lands in a
#              directory that already holds checkpoints;
#  verify:     whole checkpoints pass, a changed byte fails naming its file;
#              files.txt: a lost, cut-short or stray file is named (verify,
#              export, resume), a step without the list is read as before;
#              a tensor in two files, or no train.ckpt, in a step without
#              files.txt, is not whole; a step directory left by an earlier
#              attempt is emptied before the step is written again;
#  resume:     a damaged fingerprint.txt is refused; diff --tol nan too.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
W=$TMP/cli_ckpt_safetensors
rm -rf "$W"; mkdir -p "$W"
"$BIN" data synth --out "$W/data" --samples 64 --seed 3 --image-size 16 >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
P=tests/golden/plan.yaml
SET=(--set data.manifest="$W/data/train.jsonl" --set train.eval_every=0 --set train.final_eval=false)
"$BIN" launch $P --single-process --out "$W/run" "${SET[@]}" >"$W/run.log" 2>&1 \
  && ok "a one-step run" || { fail "a one-step run"; tail -3 "$W/run.log"; }

"$BIN" ckpt export "$W/run" --format safetensors -o "$W/all.safetensors" --optimizer >/dev/null \
  && "$BIN" ckpt import "$W/all.safetensors" --plan $P "${SET[@]}" -o "$W/back" >"$W/imp.log" 2>&1 \
  && ok "export --optimizer, import" || { fail "export --optimizer, import"; cat "$W/imp.log"; }
out=$("$BIN" ckpt diff "$W/run" "$W/back")
[ "$(grep -c 'differ' <<<"$out")" -eq 1 ] && grep -q '^meta.step: 1 of 1 differ' <<<"$out" \
  && ok "round trip: every tensor bit for bit, but meta.step" || { fail "round trip"; echo "$out" | head; }
# the command the import prints (its --set overrides included: the
# checkpoint's fingerprint holds them), as a shell reads it
hint=$(sed -n 's/.*; train on with: mmpipe launch //p' "$W/imp.log")
eval "set -- $hint"
[ "$*" = "$P ${SET[*]} --resume $W/back" ] && ok "import prints the resume command with its --set overrides" \
  || fail "import's resume hint: $hint"
"$BIN" launch "$@" --single-process --steps 2 >"$W/res.log" 2>&1 \
  && [ "$(grep -c '"step"' "$W/back/metrics.jsonl")" -eq 2 ] \
  && ok "launch --resume trains on from an import" || { fail "resume from an import"; tail -3 "$W/res.log"; }

"$BIN" ckpt export "$W/run" -o "$W/w.safetensors" >/dev/null \
  && "$BIN" ckpt import "$W/w.safetensors" --plan $P -o "$W/fresh" | grep -q "fresh optimizer moments" \
  && ok "weights only: fresh moments" || fail "weights only: fresh moments"

head -c 20000 "$W/w.safetensors" >"$W/cut.safetensors"
expect_fail "truncated file refused with file:offset and tensor" "cut.safetensors:[0-9]+: tensor .*outside" \
  "$BIN" ckpt import "$W/cut.safetensors" --plan $P -o "$W/x1"
expect_fail "another model's file refused naming the tensor" "image.proj.weight" \
  "$BIN" ckpt import "$W/w.safetensors" --plan $P --set model.width=32 -o "$W/x2"
# (python3 only to forge the header; the case is skipped without one)
if command -v python3 >/dev/null; then
  python3 - "$W/w.safetensors" "$W/stray.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); end = max(e["data_offsets"][1] for k, e in h.items() if k != "__metadata__")
h["image.extra"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
hb = json.dumps(h).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:] + b"\0" * 4)
PY
  expect_fail "a tensor the model lacks refused naming it" "image.extra is not a parameter" \
    "$BIN" ckpt import "$W/stray.safetensors" --plan $P -o "$W/x3"
else
  echo "skip a tensor the model lacks (no python3)"
fi
[ ! -e "$W/x1" ] && [ ! -e "$W/x2" ] && [ ! -e "$W/x3" ] \
  && ok "refused imports leave nothing behind" || fail "refused imports left files"
expect_fail "import into a run that has checkpoints refused" "already holds checkpoints" \
  "$BIN" ckpt import "$W/w.safetensors" --plan $P -o "$W/run"
expect_fail "unknown format refused" "only safetensors" "$BIN" ckpt export "$W/run" --format onnx -o "$W/x.onnx"

# ckpt verify: whole checkpoints pass; a byte changed in one file of a copy
# fails it, naming that file; every argument gets its line
n_tensors=$("$BIN" ckpt diff "$W/run" "$W/run" | sed -n 's/^tensors: \([0-9]*\) in A.*/\1/p')
out=$("$BIN" ckpt verify "$W/run" "$W/back"); rc=$?
[ $rc -eq 0 ] && [ "$(grep -c ': ok: ' <<<"$out")" -eq 2 ] && grep -q "^$W/run: ok: ${n_tensors:-x} tensors, [0-9]* bytes" <<<"$out" \
  && ok "verify: two whole checkpoints ($n_tensors tensors in the run's)" || { fail "verify: rc $rc"; echo "$out"; }
cp -rL "$W/run/ckpt/latest" "$W/hurt"
f=$(ls "$W/hurt"/*.ckpt | head -1)
printf '\x5a' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
out=$("$BIN" ckpt verify "$W/run" "$W/hurt"); rc=$?
[ $rc -eq 1 ] && grep -q "^$W/run: ok: " <<<"$out" && grep -q "^$W/hurt: bad: $f: checksum mismatch" <<<"$out" \
  && ok "verify: a changed byte is named with its file (rc 1)" || { fail "verify damaged: rc $rc"; echo "$out"; }
"$BIN" ckpt verify >/dev/null 2>&1; [ $? -eq 2 ] && ok "verify without a checkpoint: usage error" || fail "verify without arguments"

# files.txt: a step lists its files, sizes and checksums; a lost, cut-short,
# stray or swapped file is named by verify, refused by export and by a resume
# before any stage starts
grep -q "^train.ckpt [0-9]* [0-9a-f]\{16\}$" "$W/run/ckpt/latest/files.txt" && grep -q "^image.ckpt [0-9]* [0-9a-f]\{16\}$" "$W/run/ckpt/latest/files.txt" \
  && grep -q ": ok: .*every file, checksum and record checked" <<<"$out" \
  && ok "verify: the step's files.txt lists its files; verify checks them" || { fail "files.txt"; cat "$W/run/ckpt/latest/files.txt"; }
for f in train.ckpt text.ckpt; do
  rm -rf "$W/lost"; cp -r "$W/run" "$W/lost"; rm "$W/lost/ckpt/latest/$f"
  expect_fail "verify: a lost $f is named" "lost/ckpt/latest/$f is missing \\(files.txt:[0-9]+ lists it\\)" "$BIN" ckpt verify "$W/lost"
done
expect_fail "export refuses a checkpoint with a lost file" "text.ckpt is missing" "$BIN" ckpt export "$W/lost" -o "$W/lost.safetensors"
[ ! -e "$W/lost.safetensors" ] && ok "refused export writes nothing" || fail "refused export wrote a file"
rm -rf "$W/lost"; cp -r "$W/run" "$W/lost"; rm "$W/lost/ckpt/latest/text.ckpt"
expect_fail "resume refuses a checkpoint with a lost file, before starting stages" "^mmpipe launch: --resume .*text.ckpt is missing" \
  "$BIN" launch $P --single-process --resume "$W/lost" --steps 3 "${SET[@]}"
rm -rf "$W/cut"; cp -r "$W/run" "$W/cut"; f=$W/cut/ckpt/latest/fusion.ckpt
truncate -s -8 "$f"
expect_fail "verify: a file cut short is named with both sizes" "fusion.ckpt: [0-9]+ bytes, files.txt:[0-9]+ recorded [0-9]+ \\(cut short" "$BIN" ckpt verify "$W/cut"
rm -rf "$W/stray"; cp -r "$W/run" "$W/stray"; cp "$W/stray/ckpt/latest/image.ckpt" "$W/stray/ckpt/latest/image.0.ckpt"
expect_fail "verify: a stray *.ckpt file is named" "image.0.ckpt: not in files.txt" "$BIN" ckpt verify "$W/stray"
# a file of another checkpoint (same shapes, so the same size) copied in: its checksum tells
"$BIN" launch $P --single-process --out "$W/seed8" "${SET[@]}" --set job.seed=8 >"$W/seed8.log" 2>&1 \
  || fail "a run with another seed"
rm -rf "$W/swap"; cp -r "$W/run" "$W/swap"; cp "$W/seed8/ckpt/latest/image.ckpt" "$W/swap/ckpt/latest/image.ckpt"
[ "$(stat -c %s "$W/seed8/ckpt/latest/image.ckpt")" = "$(stat -c %s "$W/run/ckpt/latest/image.ckpt")" ] \
  && expect_fail "verify: a file of another checkpoint, of the same size, is named by its checksum" \
    "image.ckpt: its checksum [0-9a-f]{16} is not the [0-9a-f]{16} files.txt:[0-9]+ recorded" "$BIN" ckpt verify "$W/swap" \
  || fail "the other seed's image.ckpt is not of the same size"
# a files.txt of before (no checksums) is still read
rm -rf "$W/nosum"; cp -r "$W/run" "$W/nosum"; sed -i -E 's/^([a-z0-9.]+ [0-9]+) [0-9a-f]{16}$/\1/' "$W/nosum/ckpt/latest/files.txt"
"$BIN" ckpt verify "$W/nosum" >/dev/null && ok "verify: a files.txt without checksums (written before them) is read" \
  || fail "verify of a files.txt without checksums"
rm -rf "$W/junk"; cp -r "$W/run" "$W/junk"; echo "image.ckpt twelve" >>"$W/junk/ckpt/latest/files.txt"
expect_fail "verify: a damaged files.txt is named with its line" "files.txt:[0-9]+: not \"NAME.ckpt BYTES CHECKSUM\"" "$BIN" ckpt verify "$W/junk"
rm -rf "$W/old"; cp -r "$W/run" "$W/old"; rm "$W/old/ckpt/latest/files.txt"
expect_fail "verify: a step whose files.txt is lost (its train.ckpt says it had one) is refused" \
  "files.txt is missing, and train.ckpt says this step was written with one" "$BIN" ckpt verify "$W/old"
expect_fail "... and so is a resume from it, before any stage starts" \
  "files.txt is missing, and train.ckpt says this step was written with one" \
  "$BIN" launch $P --single-process --resume "$W/old" --steps 3 "${SET[@]}"
# (a step written before files.txt, whose train.ckpt says nothing of one, is read as
# before: tests/test_ckpt.c test_file_list_legacy)
rm -rf "$W/gone"; cp -r "$W/run" "$W/gone"; ln -sfn step_0000099 "$W/gone/ckpt/latest"
expect_fail "verify: a latest naming a step that is gone says so" "latest -> step_0000099: No such file or directory \\(the step it names is gone\\)" "$BIN" ckpt verify "$W/gone"

# a fingerprint.txt holding no plan key is damaged: a resume refuses it
# rather than train on unchecked
rm -rf "$W/fp"; cp -r "$W/run" "$W/fp"; echo garbage >"$W/fp/ckpt/latest/fingerprint.txt"
expect_fail "resume refuses a damaged fingerprint.txt" "fingerprint.txt: holds none of the fingerprinted plan keys" \
  "$BIN" launch $P --single-process --resume "$W/fp" --steps 3 "${SET[@]}"
for t in nan inf -1 x; do
  "$BIN" ckpt diff "$W/run" "$W/back" --tol $t >/dev/null 2>&1; rc=$?
  [ $rc -eq 2 ] && ok "diff --tol $t: usage error" || fail "diff --tol $t: rc $rc"
done
# a step without files.txt nor a train.ckpt (as an old mmpipe's, with its train.ckpt
# lost): a tensor in two files, or no train.ckpt, is not a whole checkpoint either
rm -rf "$W/nometa"; cp -r "$W/old" "$W/nometa"; rm "$W/nometa/ckpt/latest/train.ckpt"
rm -rf "$W/dup"; cp -r "$W/nometa" "$W/dup"; cp "$W/dup/ckpt/latest/image.ckpt" "$W/dup/ckpt/latest/image.0.ckpt"
expect_fail "verify: a tensor in two files is named with both" "tensor image\.[a-z0-9_.]* is in both image\.0\.ckpt and image\.ckpt" \
  "$BIN" ckpt verify "$W/dup"
expect_fail "verify: no files.txt and no train.ckpt is not whole" "no meta.step \(train.ckpt\), and no files.txt" \
  "$BIN" ckpt verify "$W/nometa"

# a step directory left by an earlier attempt at the step (a crash mid-
# checkpoint, then a resume with another placement) is emptied before the
# step is written again: none of its files pass for the new checkpoint's
for mode in --single-process ""; do
  R=$W/again${mode:+-single}; rm -rf "$R"; cp -r "$W/run" "$R"; mkdir "$R/ckpt/step_0000002"
  cp "$R/ckpt/latest/image.ckpt" "$R/ckpt/step_0000002/image.0.ckpt"
  "$BIN" launch $P $mode --resume "$R" --steps 2 "${SET[@]}" >"$R.log" 2>&1 \
    && [ "$(readlink "$R/ckpt/latest")" = step_0000002 ] && [ ! -e "$R/ckpt/step_0000002/image.0.ckpt" ] \
    && "$BIN" ckpt verify "$R" | grep -q ": ok: .*every file" \
    && ok "a step left by an earlier attempt is emptied before it is written (${mode:-pipeline})" \
    || { fail "stale step directory (${mode:-pipeline})"; tail -3 "$R.log"; ls "$R/ckpt/step_0000002"; }
done
rm -rf "$W/lost" "$W/cut" "$W/stray" "$W/junk" "$W/old" "$W/gone" "$W/fp" "$W/dup" "$W/nometa" "$W"/again*
finish
