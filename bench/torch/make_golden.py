#!/usr/bin/env python3
"""Writes tests/golden/golden.safetensors, the reference tests/test_golden.c checks.

  1. build/tests/test_golden --emit WORK   mmpipe's initial checkpoint of
     tests/golden/plan.yaml (WORK/ckpt/latest), the fixed batch
     (WORK/batch.safetensors: images, ids, mask from a fixed seed) and the
     resolved plan (WORK/plan.json)
  2. build/mmpipe ckpt export WORK --format safetensors -o WORK/init.safetensors
  3. PyTorch (bench/torch/mmpipe_ref.py) loads those weights, runs one
     training step's forward and backward over the batch in the plan's
     micro-batches, and writes the weights it started from, the batch, the
     loss parts (loss.total, loss.itc, loss.itm), every gradient
     (grad.<name>) and the batch-norm running statistics after the step
     (after.<name>), with metadata format=mmpipe-golden, version=1. The
     plan's model.fusion.itc_scope is microbatch; the same step under
     itc_scope batch (a fresh model from the same weights) goes in under
     "itc_batch." (itc_batch.loss.total, itc_batch.grad.<name>, ...).

Run from the repository root after building:  python3 bench/torch/make_golden.py
Needs torch (Debian: apt-get install python3-torch); CI does not: the
committed file is all the C test reads.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mmpipe_ref as ref  # noqa: E402

FORMAT, VERSION = "mmpipe-golden", "1"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="mmpipe build directory (default build)")
    ap.add_argument("--out", default="tests/golden/golden.safetensors")
    ap.add_argument("--work", help="keep the intermediate files here (default: a temporary directory)")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="mmpipe-golden-")
    subprocess.run([os.path.join(args.build, "tests", "test_golden"), "--emit", work], check=True)
    init_path = os.path.join(work, "init.safetensors")
    subprocess.run([os.path.join(args.build, "mmpipe"), "ckpt", "export", work, "--format",
                    "safetensors", "-o", init_path], check=True)

    init, _ = ref.read_safetensors(init_path)
    batch, _ = ref.read_safetensors(os.path.join(work, "batch.safetensors"))
    plan = ref.load_plan_json(os.path.join(work, "plan.json"))
    cfg = ref.config_from_plan(plan, init["text.embed.wte"].shape[0])

    images, ids, mask = batch["batch.images"], batch["batch.ids"].long(), batch["batch.mask"]
    scope = plan["model"]["fusion"]["itc_scope"]
    if scope != "microbatch":
        sys.exit(f"make_golden.py: the golden plan's model.fusion.itc_scope is {scope}; "
                 "the test expects microbatch (batch goes under itc_batch.)")
    out = {}
    out.update(batch)
    for prefix, sc in (("", "microbatch"), ("itc_batch.", "batch")):
        torch.manual_seed(0)
        model = ref.MMPipeRef(cfg)
        model.load_mmpipe(init)
        model.train()
        loss, itc, itm = model.step_loss(images, ids, mask, plan["train"]["microbatches"], sc)
        loss.backward()
        if not prefix:
            for name in model.state_dict():
                out[name] = init[name]
        out[prefix + "loss.total"] = loss.detach().reshape(1)
        out[prefix + "loss.itc"] = torch.as_tensor(itc).reshape(1).float()
        out[prefix + "loss.itm"] = torch.as_tensor(itm).reshape(1).float()
        for name, p in model.named_parameters():
            out[prefix + "grad." + name] = p.grad
        for name, b in model.named_buffers():
            out[prefix + "after." + name] = b
        print(f"itc_scope {sc}: loss {loss.item():.6f} (itc {float(itc):.6f}, itm {float(itm):.6f})")
    ref.write_safetensors(args.out, out, {"format": FORMAT, "version": VERSION,
                                          "plan": "tests/golden/plan.yaml",
                                          "torch": torch.__version__})
    print(f"{sum(1 for _ in model.parameters())} gradients per scope -> {args.out} "
          f"({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
