"""The model mmpipe trains, in PyTorch: the reference for golden tests and timings.

Same architecture, same tensor names (state_dict keys equal mmpipe's parameter
names, e.g. "image.layer3.0.conv1.weight"), same layouts (conv (out,in,kh,kw),
linear (out,in)), same arithmetic choices as mmpipe's CPU kernels
(kernels/cpu/*.c), read from nn/image.c, nn/text.c, nn/transformer.c and
nn/fusion.c:

  image   ResNet of BasicBlocks without conv biases: stem conv3x3/1 + BN + ReLU
          [+ maxpool 3x3/2 pad 1]; blocks relu(bn2(conv2(relu(bn1(conv1 x)))) + sc),
          sc = BN(conv1x1/stride) when stride or width change; BN eps 1e-5,
          momentum 0.1, batch statistics in training (biased variance to
          normalise, unbiased into running_var). Then the final map (B,C,h,w) read
          as Ni = h*w tokens (B,Ni,C), linear C -> D with bias, plus a learned
          position table "image.proj.pos" (Ni,D).
  text    wte[ids] + wpe[t]; L pre-LN layers (LayerNorm eps 1e-5): masked
          multi-head self-attention (keys masked by the text mask; padded
          queries still attend), then FFN with GELU, tanh approximation
          (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))); final LayerNorm.
  fusion  ITC: e_img = normalize(W flatten(img tokens) + b), e_txt =
          normalize(W txt[:,0] + b) (eps 1e-6), logits = exp(min(logit_scale,
          ln 100)) e_img e_txt^T, symmetric cross-entropy, mean of both ways.
          ITM: for text t the hard negative image argmax_{j != t} sim[j, t]
          (ties: lowest j, no gradient through the choice); pairs (t, t, 1) then
          (neg(t), t, 0) (only the positive when B == 1); L pre-LN cross-attention
          layers on the [CLS] row alone (text query, LN_kv'd image keys/values,
          no mask) + FFN; LayerNorm "fusion.itm_ln", linear "fusion.itm_head",
          BCE with logits, mean over pairs.
  loss    per micro-batch of k samples in a batch of B: (k / B) (ITC + ITM),
          summed over the micro-batches (stages/fuse.h); batch norm sees one
          micro-batch at a time, in order.

Also: a safetensors reader/writer (no extra package needed) and the model
configuration from a resolved plan.json (what `mmpipe launch` writes).
"""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

BN_EPS = 1e-5
BN_MOMENTUM = 0.1
LN_EPS = 1e-5
L2_EPS = 1e-6
MAX_LOGIT_SCALE = math.log(100.0)


# ---- configuration -------------------------------------------------------------

def config_from_plan(plan, vocab_size):
    """The model's dimensions from a resolved plan (plan.json as a dict)."""
    d, m = plan["data"], plan["model"]
    return {
        "image_size": d["image_size"],
        "max_text_len": d["max_text_len"],
        "width": m["width"],
        "blocks": list(m["image"]["blocks"]),
        "channels": list(m["image"]["channels"]),
        "stem_pool": bool(m["image"].get("stem_pool", False)),
        "text_layers": m["text"]["layers"],
        "text_heads": m["text"]["heads"],
        "ffn_mult": m["text"].get("ffn_mult", 4),
        "fusion_layers": m["fusion"]["layers"],
        "fusion_heads": m["fusion"]["heads"],
        "init_temperature": plan["train"].get("init_temperature", 0.07),
        "itc_scope": m["fusion"].get("itc_scope", "batch"),
        "vocab_size": vocab_size,
    }


def load_plan_json(path):
    with open(path) as f:
        return json.load(f)


# ---- safetensors -----------------------------------------------------------------

_DTYPES = {"F32": torch.float32, "I32": torch.int32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64}
_NAMES = {v: k for k, v in _DTYPES.items()}


def mb_slices(batch, m):
    """The batch's non-empty micro-batches as slices, sized as
    mmp_plan_mb_size: the first batch % m get one more sample."""
    base, extra = divmod(batch, m)
    sizes = [base + (1 if k < extra else 0) for k in range(m)]
    starts = [sum(sizes[:k]) for k in range(m)]
    return [slice(a, a + n) for a, n in zip(starts, sizes) if n]


def read_safetensors(path):
    """(dict name -> tensor, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=_DTYPES[e["dtype"]]) if end > b \
            else torch.empty(0, dtype=_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> tensor (written in the dict's order)."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ---- image branch ----------------------------------------------------------------

class BatchNorm(nn.Module):
    """Batch norm with mmpipe's names: weight, bias, running_mean, running_var."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=self.training, momentum=BN_MOMENTUM, eps=BN_EPS)


def conv(cin, cout, k, stride=1):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class Stem(nn.Module):
    def __init__(self, cout, pool):
        super().__init__()
        self.conv = conv(3, cout, 3)
        self.bn = BatchNorm(cout)
        self.pool = pool

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return F.max_pool2d(x, 3, 2, 1) if self.pool else x


class Down(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = conv(cin, cout, 1, stride)
        self.bn = BatchNorm(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv(cin, cout, 3, stride)
        self.bn1 = BatchNorm(cout)
        self.conv2 = conv(cout, cout, 3)
        self.bn2 = BatchNorm(cout)
        self.down = Down(cin, cout, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class ImageProj(nn.Module):
    def __init__(self, c, d, ni):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d, c))
        self.bias = nn.Parameter(torch.zeros(d))
        self.pos = nn.Parameter(torch.zeros(ni, d))

    def forward(self, x):
        tok = x.flatten(2).transpose(1, 2)  # (B,C,h,w) -> (B,Ni,C)
        return F.linear(tok, self.weight, self.bias) + self.pos


def image_tokens(cfg):
    s = cfg["image_size"]
    half = lambda n: (n + 2 - 3) // 2 + 1  # noqa: E731 (3x3/2 pad 1)
    if cfg["stem_pool"]:
        s = half(s)
    for _ in cfg["blocks"][1:]:
        s = half(s)
    return s * s


class ImageNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch, blocks = cfg["channels"], cfg["blocks"]
        self.stem = Stem(ch[0], cfg["stem_pool"])
        cin = ch[0]
        self.n_stages = len(blocks)
        for s, (nb, c) in enumerate(zip(blocks, ch)):
            layer = nn.ModuleList()
            for b in range(nb):
                layer.append(BasicBlock(cin, c, 2 if s > 0 and b == 0 else 1))
                cin = c
            setattr(self, f"layer{s + 1}", layer)
        self.proj = ImageProj(cin, cfg["width"], image_tokens(cfg))

    def forward(self, x):
        x = self.stem(x)
        for s in range(self.n_stages):
            for block in getattr(self, f"layer{s + 1}"):
                x = block(x)
        return self.proj(x)


# ---- transformer sublayers -------------------------------------------------------

def gelu(x):
    # kernels/cpu/elementwise.c: the tanh approximation
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def attention(q, k, v, nh, key_mask=None):
    """q (B,Tq,C), k/v (B,Tk,C), key_mask (B,Tk) 1/0: heads are C split in nh chunks."""
    B, Tq, C = q.shape
    Tk, hs = k.shape[1], C // nh
    qh = q.view(B, Tq, nh, hs).transpose(1, 2)
    kh = k.view(B, Tk, nh, hs).transpose(1, 2)
    vh = v.view(B, Tk, nh, hs).transpose(1, 2)
    att = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(hs))
    if key_mask is not None:
        att = att.masked_fill(key_mask[:, None, None, :] == 0, float("-inf"))
    att = torch.softmax(att, dim=-1)
    return (att @ vh).transpose(1, 2).reshape(B, Tq, C)


class Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))


class FFN(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(gelu(self.fc1(x)))


class SelfLayer(nn.Module):
    """Pre-LN: x + Wo Attn(LN1 x) (masked keys), then x + FFN(LN2 x)."""

    def __init__(self, d, nh, h):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(d, eps=LN_EPS)
        self.attn = Attn(d)
        self.ln2 = nn.LayerNorm(d, eps=LN_EPS)
        self.ffn = FFN(d, h)

    def forward(self, x, mask):
        h = self.ln1(x)
        a = self.attn
        x = x + a.out(attention(a.q(h), a.k(h), a.v(h), self.nh, mask))
        return x + self.ffn(self.ln2(x))


class CrossLayer(nn.Module):
    """Pre-LN cross-attention: query rows x attend to LN_kv(src[src_of])."""

    def __init__(self, d, nh, h):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(d, eps=LN_EPS)
        self.ln_kv = nn.LayerNorm(d, eps=LN_EPS)
        self.attn = Attn(d)
        self.ln2 = nn.LayerNorm(d, eps=LN_EPS)
        self.ffn = FFN(d, h)

    def forward(self, x, src, src_of):
        a = self.attn
        s = self.ln_kv(src)
        k, v = a.k(s)[src_of], a.v(s)[src_of]
        x = x + a.out(attention(a.q(self.ln1(x)), k, v, self.nh))
        return x + self.ffn(self.ln2(x))


# ---- text branch -----------------------------------------------------------------

class Embed(nn.Module):
    def __init__(self, v, t, d):
        super().__init__()
        self.wte = nn.Parameter(torch.zeros(v, d))
        self.wpe = nn.Parameter(torch.zeros(t, d))

    def forward(self, ids):
        return self.wte[ids] + self.wpe[: ids.shape[1]]


class TextNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h = cfg["width"], cfg["ffn_mult"] * cfg["width"]
        self.embed = Embed(cfg["vocab_size"], cfg["max_text_len"], d)
        self.n_layers = cfg["text_layers"]
        for i in range(1, self.n_layers + 1):  # "text.layer1." is the first
            setattr(self, f"layer{i}", SelfLayer(d, cfg["text_heads"], h))
        self.ln_f = nn.LayerNorm(d, eps=LN_EPS)

    def forward(self, ids, mask):
        x = self.embed(ids)
        for i in range(1, self.n_layers + 1):
            x = getattr(self, f"layer{i}")(x, mask)
        return self.ln_f(x)


# ---- fusion / loss ---------------------------------------------------------------

class ITC(nn.Module):
    def __init__(self, ni, d, e):
        super().__init__()
        self.img_proj = nn.Linear(ni * d, e)
        self.txt_proj = nn.Linear(d, e)


class FusionNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h = cfg["width"], cfg["ffn_mult"] * cfg["width"]
        self.itc = ITC(image_tokens(cfg), d, d)
        self.logit_scale = nn.Parameter(torch.full((1,), math.log(1.0 / cfg["init_temperature"])))
        self.n_layers = cfg["fusion_layers"]
        for i in range(self.n_layers):  # "fusion.layer0." is the first
            setattr(self, f"layer{i}", CrossLayer(d, cfg["fusion_heads"], h))
        self.itm_ln = nn.LayerNorm(d, eps=LN_EPS)
        self.itm_head = nn.Linear(d, 1)

    def forward(self, img, txt):
        """img (B,Ni,D), txt (B,T,D) -> (itc, itm), each a mean over this micro-batch."""
        B = img.shape[0]
        cls = txt[:, 0]
        e_img = F.normalize(self.itc.img_proj(img.flatten(1)), dim=1, eps=L2_EPS)
        e_txt = F.normalize(self.itc.txt_proj(cls), dim=1, eps=L2_EPS)
        # a clamped scale gets no gradient (mmpipe: only when above ln 100)
        scale = torch.exp(self.logit_scale.clamp(max=MAX_LOGIT_SCALE))
        sim = e_img @ e_txt.t()  # sim[i, t]: image i, text t
        logits = scale * sim
        dev = sim.device
        target = torch.arange(B, device=dev)
        itc = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))

        with torch.no_grad():
            s = sim.clone()
            s.fill_diagonal_(float("-inf"))
            neg = s.argmax(dim=0)  # per text t: the most similar other image
        own = torch.arange(B, device=dev)
        if B > 1:
            pair_img, pair_txt = torch.cat([own, neg]), torch.cat([own, own])
            labels = torch.cat([torch.ones(B, device=dev), torch.zeros(B, device=dev)])
        else:
            pair_img, pair_txt, labels = own, own, torch.ones(1, device=dev)
        x = cls[pair_txt].unsqueeze(1)  # (P,1,D): only [CLS] reaches the head
        for i in range(self.n_layers):
            x = getattr(self, f"layer{i}")(x, img, pair_img)
        logit = self.itm_head(self.itm_ln(x[:, 0])).squeeze(1)
        itm = F.binary_cross_entropy_with_logits(logit, labels)
        return itc, itm


# ---- the whole model -------------------------------------------------------------

class MMPipeRef(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.image = ImageNet(cfg)
        self.text = TextNet(cfg)
        self.fusion = FusionNet(cfg)

    def forward(self, images, ids, mask):
        """One micro-batch: images (B,3,S,S), ids (B,T) long, mask (B,T) -> (itc, itm)."""
        return self.fusion(self.image(images), self.text(ids, mask))

    def step_loss(self, images, ids, mask, microbatches, scope=None):
        """The batch's loss as mmpipe computes it (model.fusion.itc_scope; None:
        the plan's, cfg["itc_scope"]). The branches run micro-batch by
        micro-batch (batch norm in training mode normalises each with its own
        statistics, as mmpipe's image branch does). scope "batch": their
        outputs are concatenated and the fusion runs once over the whole batch
        (ITC over all B pairs, hard negatives mined from the whole batch).
        "microbatch": micro-batch k of n_k samples adds (n_k / B) (ITC + ITM).
        Micro-batch sizes as mmp_plan_mb_size: the first B % m get one more.
        Returns (loss, itc, itm) tensors (loss has a graph)."""
        scope = scope or self.cfg.get("itc_scope", "batch")
        if scope not in ("batch", "microbatch"):
            raise ValueError(f"itc_scope: {scope!r} (batch or microbatch)")
        B = images.shape[0]
        if scope == "batch":
            img, txt = [], []
            for sl in mb_slices(B, microbatches):
                img.append(self.image(images[sl]))
                txt.append(self.text(ids[sl], mask[sl]))
            itc, itm = self.fusion(torch.cat(img), torch.cat(txt))
            return itc + itm, itc.detach(), itm.detach()
        loss = itc_sum = itm_sum = 0.0
        for sl in mb_slices(B, microbatches):
            itc, itm = self(images[sl], ids[sl], mask[sl])
            w = (sl.stop - sl.start) / B
            loss = loss + w * (itc + itm)
            itc_sum = itc_sum + w * itc.detach()
            itm_sum = itm_sum + w * itm.detach()
        return loss, itc_sum, itm_sum

    def load_mmpipe(self, tensors):
        """Loads every parameter and buffer by its mmpipe name; a missing or
        misshapen tensor is an error. Extra entries (gradients, batch) are ignored."""
        own = self.state_dict()
        missing = [k for k in own if k not in tensors]
        if missing:
            raise KeyError(f"tensors missing for the reference model: {missing[:5]}...")
        for k, v in own.items():
            if tuple(tensors[k].shape) != tuple(v.shape):
                raise ValueError(f"{k}: file has {tuple(tensors[k].shape)}, model wants {tuple(v.shape)}")
        self.load_state_dict({k: tensors[k] for k in own})
