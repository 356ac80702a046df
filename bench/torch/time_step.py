#!/usr/bin/env python3
"""Times one training step of the PyTorch reference (eager or compiled, CPU or
CUDA, fp32 or autocast bf16/fp16), as mmpipe
--single-process runs it: the plan's micro-batches forward and backward
(k/batch loss weights), global-norm gradient clipping and an AdamW step
(weight decay on conv/linear weights only, as nn/params.c marks them).

The model is built from a run's resolved plan.json and, when given, loads an
mmpipe export (`mmpipe ckpt export RUN --format safetensors -o FILE`), so it
is the very model mmpipe trained. The batch has the plan's shapes with values
from a fixed seed (images N(0,1), captions of random lengths): neither
implementation's cost depends on the values.

Prints one line: `torch_step_ms median=<ms> min=<ms> steps=<n> threads=<t>`.
Used by bench/torch_vs_mmpipe.sh.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mmpipe_ref as ref  # noqa: E402


def make_batch(cfg, batch, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    S, T = cfg["image_size"], cfg["max_text_len"]
    images = torch.randn(batch, 3, S, S, generator=g)
    lengths = torch.randint(2, T + 1, (batch,), generator=g)
    ids = torch.randint(2, vocab, (batch, T), generator=g)
    ids[:, 0] = 1
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    ids = ids * mask.long()
    return images, ids, mask


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-json", required=True, help="a run's plan.json (mmpipe launch writes it)")
    ap.add_argument("--weights", help="mmpipe export (.safetensors) to load; default: random init")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary size without --weights")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off",
                    help="torch.autocast to this precision (fp16 with a GradScaler)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the step's loss")
    ap.add_argument("--batch", type=int, default=0, help="override the plan's train.batch")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    plan = ref.load_plan_json(args.plan_json)
    tensors = ref.read_safetensors(args.weights)[0] if args.weights else None
    vocab = tensors["text.embed.wte"].shape[0] if tensors else args.vocab
    if vocab < 3:
        sys.exit("time_step.py: give --weights or --vocab")
    cfg = ref.config_from_plan(plan, vocab)
    torch.manual_seed(0)
    model = ref.MMPipeRef(cfg)
    if tensors:
        model.load_mmpipe(tensors)
    model.train()
    dev = torch.device(args.device)
    model.to(dev)

    tr = plan["train"]
    opt_cfg = tr["optimizer"]
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith(".weight") and p.dim() >= 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opt_cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]),
                            eps=opt_cfg["eps"])
    batch = args.batch or tr["batch"]
    images, ids, mask = (t.to(dev) for t in make_batch(cfg, batch, vocab, 1))
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None
    loss_fn = model.step_loss
    if args.compile:
        loss_fn = torch.compile(model.step_loss)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss, _, _ = loss_fn(images, ids, mask, tr["microbatches"],
                                 plan["model"]["fusion"].get("itc_scope", "batch"))
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if tr.get("clip_grad_norm", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip_grad_norm"])
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    print(f"torch_step_ms median={statistics.median(times):.2f} min={min(times):.2f} "
          f"steps={len(times)} threads={torch.get_num_threads()} device={args.device} "
          f"amp={args.amp} compile={int(args.compile)} batch={batch} peak_mem_bytes={peak}")


if __name__ == "__main__":
    main()
