#!/usr/bin/env bash
# launch --init-from FILE.safetensors (issue 15): a new run (step 0, fresh
# AdamW moments) from exported weights.
#  equal:     a 0-step run from an export holds exactly the export's weights
#             with zero moments (max_abs_diff=0 against `ckpt import` of the
#             same file), also when the file carries moments (--optimizer);
#  torch:     the same from the file the PyTorch reference writes (where a
#             python with torch is found; skipped otherwise);
#  init:      a 0-step run without --init-from holds the plan's own init, and
#             training from its export equals training from scratch bitwise;
#  pipeline:  the pipeline and --single-process from the same file end equal
#             bitwise, and both start from the file (their step-0 checkpoint);
#  refused:   a missing file, a tensor of another shape, a missing tensor, a
#             stray tensor, another vocabulary size, --resume with it, and a
#             directory holding checkpoints: each named, nothing written.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 64 5
tiny_plan "name: init, steps: 3, seed: 4" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 16" \
  1 "batch: 8, microbatches: 2, optimizer: { lr: 2.0e-3, warmup: 1 }, eval_every: 0, final_eval: false"
P=$W/plan.yaml
run() { # NAME ARGS...: mmpipe launch P ARGS into $W/NAME; ok/fail named NAME
  local name=$1; shift
  "$BIN" launch "$P" --out "$W/$name" "$@" >"$W/$name.log" 2>&1 && ok "$name: launch" \
    || { fail "$name: launch"; tail -3 "$W/$name.log"; }
}

run trained --single-process
"$BIN" ckpt export "$W/trained" -o "$W/w.safetensors" >/dev/null \
  && "$BIN" ckpt export "$W/trained" -o "$W/wopt.safetensors" --optimizer >/dev/null \
  && "$BIN" ckpt import "$W/w.safetensors" --plan "$P" -o "$W/imported" >/dev/null \
  && ok "export and import the trained run" || fail "export and import the trained run"

run zero --init-from "$W/w.safetensors" --steps 0
same_ckpt "$W/zero" "$W/imported" >/dev/null && [ ! -s "$W/zero/metrics.jsonl" ] \
  && [ -f "$W/zero/plan.json" ] && ok "0 steps: the export's weights, zero moments, no step" \
  || fail "0 steps from the export: $(same_ckpt "$W/zero" "$W/imported")"
run zero_opt --init-from "$W/wopt.safetensors" --steps 0 --single-process
same_ckpt "$W/zero_opt" "$W/imported" >/dev/null \
  && grep -q "wopt.safetensors holds AdamW moments too (.* tensors: an export with --optimizer); a new run starts with fresh ones" "$W/zero_opt.log" \
  && ok "a file with moments: the moments are set aside (fresh optimizer), with a warning" \
  || fail "moments not dropped: $(same_ckpt "$W/zero_opt" "$W/imported")"

run init0 --steps 0
"$BIN" ckpt export "$W/init0" -o "$W/init0.safetensors" >/dev/null
! same_ckpt "$W/init0" "$W/imported" >/dev/null \
  && ok "0 steps without --init-from: other weights than the trained ones" \
  || fail "the plan's init equals the trained weights"
run scratch --single-process
run from_init0 --single-process --init-from "$W/init0.safetensors"
same_ckpt "$W/scratch" "$W/from_init0" >/dev/null \
  && ok "from the export of the plan's init == from scratch (3 steps, bitwise)" \
  || fail "from the plan's init: $(same_ckpt "$W/scratch" "$W/from_init0")"

run pipe --init-from "$W/w.safetensors"
run single --init-from "$W/w.safetensors" --single-process
same_ckpt "$W/pipe" "$W/single" >/dev/null && steps_once "$W/pipe/metrics.jsonl" 3 \
  && ok "pipeline == --single-process from the same file (3 steps, bitwise)" \
  || fail "pipeline vs single: $(same_ckpt "$W/pipe" "$W/single")"
same_ckpt "$W/pipe/ckpt/step_0000000" "$W/imported" >/dev/null \
  && same_ckpt "$W/single/ckpt/step_0000000" "$W/imported" >/dev/null \
  && ! same_ckpt "$W/pipe" "$W/imported" >/dev/null \
  && ok "both started from the file and trained on" || fail "the runs did not start from the file"
left_behind "pipe" "$W/pipe.log"

# A file PyTorch wrote: the reference model loads the export and writes its
# own state_dict (its order, its writer); skipped where no python has torch.
PY_TORCH=${PYTHON:-/usr/bin/python3}
if "$PY_TORCH" -c 'import torch' 2>/dev/null; then
  "$PY_TORCH" - "$W" <<'PY'
import sys
sys.path.insert(0, "bench/torch")
import mmpipe_ref as ref
w = sys.argv[1]
t, _ = ref.read_safetensors(w + "/w.safetensors")
m = ref.MMPipeRef(ref.config_from_plan(ref.load_plan_json(w + "/trained/plan.json"), t["text.embed.wte"].shape[0]))
m.load_mmpipe(t)
ref.write_safetensors(w + "/torch.safetensors", dict(reversed(list(m.state_dict().items()))), {"by": "torch"})
PY
  run from_torch --init-from "$W/torch.safetensors" --steps 0
  same_ckpt "$W/from_torch" "$W/imported" >/dev/null \
    && ok "a file written by the PyTorch reference: the same weights" \
    || fail "from PyTorch's file: $(same_ckpt "$W/from_torch" "$W/imported")"
else
  echo "skip a file written by PyTorch (no torch in $PY_TORCH)"
fi

expect_fail "a missing file is named" "init-from: .*nope.safetensors" \
  "$BIN" launch "$P" --init-from "$W/nope.safetensors" --out "$W/x1"
expect_fail "another shape: the tensor, what it has and what the model wants" \
  "tensor 'image.proj.weight' is f32 \(32,16\), the model wants f32 \(16,16\)" \
  "$BIN" launch "$P" --init-from "$W/w.safetensors" --set model.width=16 --out "$W/x2"
cp "$W/data/vocab.txt" "$W/vocab_more.txt"; echo "zzzextra" >>"$W/vocab_more.txt"
expect_fail "another vocabulary size is named" "text.embed.wte has [0-9]+ rows .* the model wants [0-9]+ \(data.vocab" \
  "$BIN" launch "$P" --init-from "$W/w.safetensors" --set data.vocab="$W/vocab_more.txt" --out "$W/x3"
expect_fail "--init-from with --resume refused" "give one of them" \
  "$BIN" launch "$P" --init-from "$W/w.safetensors" --resume "$W/trained"
expect_fail "a directory holding checkpoints is refused" "already holds checkpoints" \
  "$BIN" launch "$P" --init-from "$W/w.safetensors" --out "$W/imported"
expect_fail "a directory holding a run is refused without --force" "already holds a run" \
  "$BIN" launch "$P" --init-from "$W/w.safetensors" --out "$W/trained"
if command -v python3 >/dev/null; then # (python3 only to forge headers; skipped without one)
  python3 - "$W/w.safetensors" "$W" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
def write(path, h, data):
    hb = json.dumps(h).encode()
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + data)
# a missing tensor: drop fusion.itm_head.bias and its bytes, shifting the later ones
b0, e0 = h["fusion.itm_head.bias"]["data_offsets"]
g = {k: dict(v) for k, v in h.items() if k != "fusion.itm_head.bias"}
for k, v in g.items():
    if k != "__metadata__" and v["data_offsets"][0] >= e0:
        v["data_offsets"] = [v["data_offsets"][0] - (e0 - b0), v["data_offsets"][1] - (e0 - b0)]
write(sys.argv[2] + "/missing.safetensors", g, data[:b0] + data[e0:])
# a stray tensor
end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
h["image.extra"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
write(sys.argv[2] + "/stray.safetensors", h, data + b"\0" * 4)
PY
  expect_fail "a missing tensor is named" "no tensor 'fusion.itm_head.bias'" \
    "$BIN" launch "$P" --init-from "$W/missing.safetensors" --single-process --out "$W/x4"
  expect_fail "a stray tensor is named" "image.extra is not a parameter" \
    "$BIN" launch "$P" --init-from "$W/stray.safetensors" --out "$W/x5"
else
  echo "skip forged files (no python3)"
fi
[ ! -e "$W/x1" ] && [ ! -e "$W/x2" ] && [ ! -e "$W/x3" ] && [ ! -e "$W/x4" ] && [ ! -e "$W/x5" ] \
  && [ "$(ls "$W/imported/ckpt")" = "$(printf 'latest\nstep_0000000')" ] \
  && steps_once "$W/trained/metrics.jsonl" 3 \
  && ok "refused launches wrote nothing" || fail "a refused launch left files"
finish
