#!/usr/bin/env python3
"""Trains the PyTorch reference (mmpipe_ref.py) with mmpipe's recipe and writes
a metrics.jsonl-like curve: the other half of bench/learning.sh.

The recipe, each point read from mmpipe's code:
  model     the plan's (a run's resolved plan.json), weights from --init
            (an mmpipe export, e.g. of `mmpipe launch PLAN --steps 0`: the
            same initial weights mmpipe trains from)
  data      the plan's manifest in mmpipe's order: position k = step * batch + i
            is sample feistel(seed, k) (data/dataset.c, mmp_dataset_sample_at,
            ported below); images decoded with PIL, RGB, shorter side resized
            to image_size (BILINEAR) and centre-cropped (data/image.h), then
            (v / 255 - mean) / std; no augmentation (data.augment must be
            false); captions tokenized as mmpipe's WordPiece (ported below;
            checked against `mmpipe data tokenize` on the val set before
            training: any difference stops the run; it also gives
            tests/tokenizer/expected.txt's ids for all 2366 lines of
            corpus.txt under Debian's Python, unicodedata 14.0.0)
  batches   train.batch split in train.microbatches as mmp_plan_mb_size (the
            first batch % m get one more); the branches (and their batch
            norm) see one micro-batch at a time
  loss      ITC + ITM. --itc-scope batch (default): ITC and ITM's hard
            negatives over the whole batch; microbatch: per micro-batch,
            weighted k / batch (mmpipe's model.fusion.itc_scope)
  optimizer AdamW (fp32) with weight decay on conv/linear weights only (the
            parameters nn/ declares with decay: names ending in ".weight" of
            2 or more dimensions), betas/eps from the plan; gradients clipped
            to train.clip_grad_norm by the global norm (coefficient
            clip / (norm + 1e-6), as common/lr.c)
  lr        warmup then cosine to min_lr, exactly common/lr.c's mmp_lr_at
  eval      every train.eval_every steps and after the last: the first
            data.val_samples pairs of the val set, batch norm in eval mode,
            L2-normalised ITC embeddings, recall@1 both ways with ties
            counted as misses (nn/retrieval.c); fields val_i2t_r1, val_t2i_r1

Writes OUT/metrics.jsonl: one line per step {step, loss, itc_loss, itm_loss,
lr, grad_norm, step_ms} plus val_i2t_r1 / val_t2i_r1 on evaluation steps.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import unicodedata

import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mmpipe_ref as ref  # noqa: E402

M64 = (1 << 64) - 1
ORDER_DOMAIN = 0x6F72646572000000
FEISTEL_ROUNDS = 4


# ---- data order (data/dataset.c) ----------------------------------------------

def hash64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def sample_at(n, seed, k):
    """mmp_dataset_sample_at(d, seed, k, shuffle=1) for a set of n samples."""
    epoch, pos = divmod(k, n)
    if n == 1:
        return pos
    bits = 2
    while (1 << bits) < n:
        bits += 2
    base = hash64((hash64((seed ^ ORDER_DOMAIN) & M64) + epoch) & M64)
    keys = [hash64((base + r) & M64) for r in range(FEISTEL_ROUNDS)]
    half = bits // 2
    mask = (1 << half) - 1
    x = pos
    while True:
        l, r = x >> half, x & mask
        for key in keys:
            l, r = r, l ^ (hash64(r ^ key) & mask)
        x = (l << half) | r
        if x < n:
            return x


# ---- tokenizer (data/tokenizer.h: BERT uncased WordPiece) ----------------------

SPECIALS = ["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"]


def _is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class WordPiece:
    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            toks = [line.rstrip("\r\n") for line in f]
        self.ids = {t: i for i, t in enumerate(toks)}
        self.size = len(toks)
        self.specials = [s for s in SPECIALS if s in self.ids]
        self.split_re = re.compile("(" + "|".join(re.escape(s) for s in self.specials) + ")")

    def _basic(self, text):
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C")
                                           and ch not in "\t\n\r"):
                continue
            if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
                out.append(" ")
            elif _is_cjk(cp):
                out.append(" " + ch + " ")
            else:
                out.append(ch)
        words = []
        for w in "".join(out).split():
            # per character, as mmpipe (and the reference it matches): no final-sigma context
            w = unicodedata.normalize("NFD", "".join(c.lower() for c in w))
            w = "".join(c for c in w if unicodedata.category(c) != "Mn")
            cur = ""
            for c in w:
                if _is_punct(c):
                    if cur:
                        words.append(cur)
                    words.append(c)
                    cur = ""
                else:
                    cur += c
            if cur:
                words.append(cur)
        return words

    def _wordpiece(self, word):
        if len(word) > 100:
            return [self.ids["[UNK]"]]
        out, start = [], 0
        while start < len(word):
            end, cur = len(word), None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.ids:
                    cur = self.ids[sub]
                    break
                end -= 1
            if cur is None:
                return [self.ids["[UNK]"]]
            out.append(cur)
            start = end
        return out

    def encode(self, text, max_len):
        ids = []
        for part in self.split_re.split(text) if self.specials else [text]:
            if part in self.ids and part in self.specials:
                ids.append(self.ids[part])
                continue
            for w in self._basic(part):
                ids.extend(self._wordpiece(w))
        ids = [self.ids["[CLS]"]] + ids[: max_len - 2] + [self.ids["[SEP]"]]
        n = len(ids)
        return ids + [self.ids["[PAD]"]] * (max_len - n), n


# ---- the data set -----------------------------------------------------------------

def read_manifest(path):
    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows.append((os.path.join(base, r["image"]), r["text"]))
    return rows


def load_image(path, size):
    im = Image.open(path).convert("RGB")
    w, h = im.size
    if (w, h) != (size, size):
        if w <= h:
            nw, nh = size, round(h * size / w)
        else:
            nw, nh = round(w * size / h), size
        im = im.resize((nw, nh), Image.BILINEAR)
        x0, y0 = round((nw - size) / 2), round((nh - size) / 2)
        im = im.crop((x0, y0, x0 + size, y0 + size))
    return torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(size, size, 3)


class DataSet:
    """Images (uint8, decoded once, on first use) and token ids of a manifest."""

    def __init__(self, path, tok, size, max_len, mean, std):
        self.rows = read_manifest(path)
        self.size, self.max_len = size, max_len
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
        enc = [tok.encode(t, max_len) for _, t in self.rows]
        self.ids = torch.tensor([e[0] for e in enc], dtype=torch.int64)
        self.mask = (torch.arange(max_len)[None, :] < torch.tensor([e[1] for e in enc])[:, None]).float()
        self.cache = {}

    def __len__(self):
        return len(self.rows)

    def batch(self, idx):
        imgs = []
        for i in idx:
            if i not in self.cache:
                self.cache[i] = load_image(self.rows[i][0], self.size)
            imgs.append(self.cache[i])
        x = torch.stack(imgs).permute(0, 3, 1, 2).float() / 255.0
        # mmpipe: (v / 255.0f - mean) / std in float
        x = (x - self.mean) / self.std
        return x, self.ids[idx], self.mask[idx]


def check_tokens(mmpipe, vocab, val_manifest, ds, max_len):
    """mmpipe's own ids for the val captions must equal ours."""
    texts = [t for _, t in read_manifest(val_manifest)]
    if any("\n" in t or "\r" in t for t in texts):
        sys.exit("train_ref.py: a val caption holds a line break: cannot compare by line")
    r = subprocess.run([mmpipe, "data", "tokenize", "--vocab", vocab, "--max-len", str(max_len)],
                       input="\n".join(texts) + "\n", capture_output=True, text=True, check=True)
    theirs = [[int(v) for v in line.split()] for line in r.stdout.splitlines()]
    ours = ds.ids.tolist()
    if theirs != ours:
        bad = next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b) if len(theirs) == len(ours) else -1
        sys.exit(f"train_ref.py: tokenization differs from mmpipe's on {val_manifest} "
                 f"(first at line {bad + 1}): {theirs[bad] if bad >= 0 else len(theirs)} vs "
                 f"{ours[bad] if bad >= 0 else len(ours)}")
    return len(ours)


# ---- the recipe ---------------------------------------------------------------------

def lr_at(opt_cfg, steps, step):
    """common/lr.c mmp_lr_at."""
    lr, min_lr, warm = opt_cfg["lr"], opt_cfg.get("min_lr", 1e-4), opt_cfg["warmup"]
    if step < warm:
        return lr * (step + 1) / warm
    if steps <= warm:
        return lr
    progress = min(1.0, (step - warm) / (steps - warm))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def mb_sizes(batch, m):
    base, extra = divmod(batch, m)
    return [base + (1 if k < extra else 0) for k in range(m)]


@torch.no_grad()
def evaluate(model, val, n, chunk):
    model.eval()
    ie, te = [], []
    for s in range(0, n, chunk):
        idx = list(range(s, min(n, s + chunk)))
        x, ids, mask = val.batch(idx)
        img, txt = model.image(x), model.text(ids, mask)
        itc = model.fusion.itc
        ie.append(F.normalize(itc.img_proj(img.flatten(1)), dim=1, eps=ref.L2_EPS))
        te.append(F.normalize(itc.txt_proj(txt[:, 0]), dim=1, eps=ref.L2_EPS))
    model.train()
    sim = torch.cat(ie) @ torch.cat(te).t()  # sim[a, b]: image a, text b
    own = sim.diag()
    eye = torch.eye(n, dtype=torch.bool)
    # a hit: every other candidate strictly below the own pair (ties are misses)
    i2t = ((sim >= own[:, None]) & ~eye).sum(1).eq(0).float().mean().item()
    t2i = ((sim >= own[None, :]) & ~eye).sum(0).eq(0).float().mean().item()
    return i2t, t2i


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-json", required=True, help="the mmpipe run's resolved plan.json")
    ap.add_argument("--init", required=True, help="initial weights (.safetensors, mmpipe names)")
    ap.add_argument("--out", required=True, help="directory for metrics.jsonl")
    ap.add_argument("--mmpipe", default="build/mmpipe", help="for the tokenizer check")
    ap.add_argument("--itc-scope", choices=["batch", "microbatch"], default="batch")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    plan = ref.load_plan_json(args.plan_json)
    d, tr, job = plan["data"], plan["train"], plan["job"]
    if d.get("augment"):
        sys.exit("train_ref.py: data.augment is not ported (mmpipe's RandomResizedCrop draws)")
    if tr.get("precision", "fp32") != "fp32":
        sys.exit("train_ref.py: fp32 only")
    init, _ = ref.read_safetensors(args.init)
    tok = WordPiece(d["vocab"])
    if init["text.embed.wte"].shape[0] != tok.size:
        sys.exit("train_ref.py: the weights' vocabulary is not data.vocab's")
    cfg = ref.config_from_plan(plan, tok.size)
    model = ref.MMPipeRef(cfg)
    model.load_mmpipe(init)
    model.train()

    S, T = d["image_size"], d["max_text_len"]
    train = DataSet(d["manifest"], tok, S, T, d["mean"], d["std"])
    val_path = d.get("val_manifest") or ""
    val = DataSet(val_path, tok, S, T, d["mean"], d["std"]) if val_path else None
    if val:
        n_checked = check_tokens(args.mmpipe, d["vocab"], val_path, val, T)
        print(f"train_ref: tokenization equals mmpipe's on {n_checked} val captions", flush=True)

    o = tr["optimizer"]
    named = list(model.named_parameters())
    decay = [p for n, p in named if n.endswith(".weight") and p.dim() >= 2]
    rest = [p for n, p in named if not (n.endswith(".weight") and p.dim() >= 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    params = [p for _, p in named]
    steps, B, m, seed = job["steps"], tr["batch"], tr["microbatches"], job["seed"]
    eval_every, clip = tr.get("eval_every", 0), tr.get("clip_grad_norm", 0.0)
    n_val = min(len(val), d.get("val_samples", 256)) if val else 0
    chunk = max(mb_sizes(B, m))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "metrics.jsonl"), "w") as mf:
        t_run = time.perf_counter()
        for step in range(steps):
            t0 = time.perf_counter()
            idx = [sample_at(len(train), seed, step * B + i) for i in range(B)]
            x, ids, mask = train.batch(idx)
            lr = lr_at(o, steps, step)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=False)
            loss, itc, itm = model.step_loss(x, ids, mask, m, args.itc_scope)
            loss.backward()
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
            if clip > 0 and norm > clip:
                coef = clip / (norm + 1e-6)
                for p in params:
                    p.grad.mul_(coef)
            opt.step()
            done = step + 1
            rec = {"step": done, "loss": round(loss.item(), 6), "itc_loss": round(float(itc), 6),
                   "itm_loss": round(float(itm), 6), "lr": lr, "grad_norm": round(norm, 6),
                   "step_ms": round((time.perf_counter() - t0) * 1e3, 2)}
            if val and ((eval_every > 0 and done % eval_every == 0) or
                        (tr.get("final_eval", True) and done == steps)):
                rec["val_i2t_r1"], rec["val_t2i_r1"] = evaluate(model, val, n_val, chunk)
            mf.write(json.dumps(rec) + "\n")
            mf.flush()
            if done % 10 == 0 or done == steps or "val_i2t_r1" in rec:
                extra = (f"  val r@1 i2t {rec['val_i2t_r1']:.3f} t2i {rec['val_t2i_r1']:.3f}"
                         if "val_i2t_r1" in rec else "")
                print(f"step {done}/{steps}  loss {rec['loss']:.4f}{extra}", flush=True)
    print(f"train_ref: {steps} steps in {time.perf_counter() - t_run:.1f} s -> "
          f"{os.path.join(args.out, 'metrics.jsonl')}")


if __name__ == "__main__":
    main()
