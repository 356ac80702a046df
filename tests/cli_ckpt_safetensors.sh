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
#  verify:     whole checkpoints pass, a changed byte fails naming its file.
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
finish
