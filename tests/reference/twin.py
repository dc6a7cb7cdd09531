#!/usr/bin/python3
"""PyTorch twin of the clla model (DESIGN section 7), in float64.

It builds the same model from the same config.json + model.safetensors as the C side and
checks the C side's outputs:

  twin.py check-step  --model DIR --tokens FILE --batch B --seq T --dump OUT.safetensors
      logits, loss and every parameter gradient of one forward+backward (clla debug-step)
  twin.py check-train --model DIR --tokens FILE --metrics OUT/metrics.jsonl [--set train.k=v ...]
      replays the optimizer (AdamW, warmup+cosine lr, clipping, micro-batch accumulation)
      and compares per-step loss, grad_norm and lr (clla train)

The same file also acts as a stand-in for the C binary, so the harness can be tested
without it (tests/reference/selftest.py): `twin.py init`, `twin.py debug-step`,
`twin.py train` take the flags of `clla init`, `clla debug-step`, `clla train`.

Run with Debian's interpreter, /usr/bin/python3 (python3-torch, python3-numpy).

Model structure (so MLA/CLA/CLLA/MoE can be added without reshaping the code):
  CausalLM
    model: Backbone(embed_tokens, layers[DecoderLayer], norm)
      DecoderLayer(input_layernorm, self_attn = make_attention(cfg, l),
                   post_attention_layernorm, mlp = make_ffn(cfg, l))
    lm_head (absent when tied)
  Attention modules get a ForwardContext: RoPE tables and the cache slots (DESIGN section 2):
  a producer layer puts its payload in slot l // share_factor, consumer layers read it, and
  autograd sums the consumers' gradients into the producer's payload.
  FFN modules may add auxiliary losses to ctx.aux_losses (MoE load balancing, z-loss).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402
import twin_moe  # noqa: E402  (the MoE FFN)

DTYPE = torch.float64


class Unsupported(NotImplementedError):
    """A config asks for a feature the twin does not implement yet."""


# ----------------------------------------------------------------------------- config

DENSE_PRESETS = ("mha", "gqa", "mqa")
ALL_PRESETS = DENSE_PRESETS + ("mla", "cla", "gqa_cla", "clla", "clla_share_krope", "clla_share_kvproj",
                               "clla_quant", "clla_quant_share_kvproj")


def _num(d, key, default=0):
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool):
        return int(v)
    return v


class ModelConfig:
    """The model keys of config.json (HF names), with the twin's defaults."""

    def __init__(self, d):
        self.raw = dict(d)
        self.attention = str(d.get("attention", "mha"))
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        self.num_key_value_heads = int(_num(d, "num_key_value_heads", self.num_attention_heads)
                                       or self.num_attention_heads)
        self.head_dim = int(_num(d, "head_dim", 0) or self.hidden_size // self.num_attention_heads)
        self.v_head_dim = int(_num(d, "v_head_dim", 0) or self.head_dim)
        self.intermediate_size = int(d["intermediate_size"])
        self.rms_norm_eps = float(_num(d, "rms_norm_eps", 1e-5))
        self.rope_theta = float(_num(d, "rope_theta", 10000.0))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        # knobs of the other attention variants and of MoE: read here, refused below
        self.q_lora_rank = int(_num(d, "q_lora_rank"))
        self.kv_lora_rank = int(_num(d, "kv_lora_rank"))
        self.qk_rope_head_dim = int(_num(d, "qk_rope_head_dim"))
        self.share_factor = int(_num(d, "share_factor", 1) or 1)
        self.share = d.get("share", "kv")
        self.latent_quant_bits = int(_num(d, "latent_quant_bits"))
        self.latent_quant_group = int(_num(d, "latent_quant_group", 32))
        self.n_routed_experts = int(_num(d, "n_routed_experts"))
        self.n_shared_experts = int(_num(d, "n_shared_experts"))
        self.num_experts_per_tok = int(_num(d, "num_experts_per_tok"))
        self.moe_intermediate_size = int(_num(d, "moe_intermediate_size"))
        self.first_k_dense_layers = int(_num(d, "first_k_dense_layers"))
        self.validate()

    def validate(self):
        if self.attention not in ALL_PRESETS:
            raise ValueError(f"attention: unknown preset '{self.attention}' (known: {', '.join(ALL_PRESETS)})")
        todo = []
        if self.attention not in DENSE_PRESETS:
            todo.append(f"attention={self.attention}")
        for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "latent_quant_bits"):
            if getattr(self, key) > 0:
                todo.append(f"{key}={getattr(self, key)}")
        if self.share_factor > 1:
            todo.append(f"share_factor={self.share_factor}")
        if todo:
            raise Unsupported("the twin implements only the dense presets (mha/gqa/mqa, dense MLP) so far; "
                              "not implemented: " + ", ".join(todo) +
                              " (add an attention class to ATTENTION_KINDS / an FFN to make_ffn)")
        nh, nkv = self.num_attention_heads, self.num_key_value_heads
        if nkv <= 0 or nh % nkv:
            raise ValueError(f"num_key_value_heads={nkv} must divide num_attention_heads={nh}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    # which kind of attention / FFN a layer gets; the only place presets are interpreted
    def attention_kind(self, layer):
        if self.kv_lora_rank > 0:
            return "latent"
        return "dense"

    def ffn_kind(self, layer):
        if self.n_routed_experts > 0 and layer >= self.first_k_dense_layers:
            return "moe"
        return "dense"

    def is_producer(self, layer):
        return layer % self.share_factor == 0

    def slot(self, layer):
        return layer // self.share_factor


class TrainConfig:
    """The "train" section of config.json, with the C side's meaning."""

    KEYS = ("seq_len", "micro_batch", "global_batch_tokens", "lr", "min_lr", "warmup_steps", "max_steps",
            "beta1", "beta2", "eps", "weight_decay", "grad_clip")

    def __init__(self, d):
        missing = [k for k in self.KEYS if k not in d]
        if missing:
            raise ValueError("train section lacks " + ", ".join(missing))
        self.seq_len = int(d["seq_len"])
        self.micro_batch = int(d["micro_batch"])
        self.global_batch_tokens = int(d["global_batch_tokens"])
        self.lr = float(d["lr"])
        self.min_lr = float(d["min_lr"])
        self.warmup_steps = int(d["warmup_steps"])
        self.max_steps = int(d["max_steps"])
        self.beta1 = float(d["beta1"])
        self.beta2 = float(d["beta2"])
        self.eps = float(d["eps"])
        self.weight_decay = float(d["weight_decay"])
        self.grad_clip = float(d["grad_clip"])
        bt = self.micro_batch * self.seq_len
        if self.global_batch_tokens % bt:
            raise ValueError(f"global_batch_tokens={self.global_batch_tokens} is not a multiple of "
                             f"micro_batch*seq_len={bt}")
        self.n_micro = self.global_batch_tokens // bt

    def lr_at(self, s):
        """lr for 0-based step s: linear warmup, then cosine from lr to min_lr."""
        if s < self.warmup_steps:
            return self.lr * (s + 1) / self.warmup_steps
        progress = (s - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))


def parse_value(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_sets(cfg, sets):
    """--set key=value on a config dict; dotted keys reach nested objects (train.lr=...)."""
    for s in sets or []:
        if "=" not in s:
            raise ValueError(f"--set {s}: expected key=value")
        key, val = s.split("=", 1)
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = parse_value(val)
    return cfg


def read_config(path, sets=None):
    with open(path) as f:
        cfg = json.load(f)
    return apply_sets(cfg, sets)


# ----------------------------------------------------------------------------- ops

def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(T, dim, theta, dtype=DTYPE):
    """cos, sin of shape (T, dim) in the rotate-half layout: f_i = theta^(-2i/dim) for i < dim/2,
    angle = t*f_i, repeated for the two halves."""
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=dtype) / dim)
    t = torch.arange(T, dtype=dtype)
    ang = torch.outer(t, inv_freq)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x: (B, T, H, dim); cos/sin: (T, dim). y[i] = x[i]cos - x[i+dim/2]sin, y[i+dim/2] = x[i+dim/2]cos + x[i]sin."""
    return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def causal_attention(q, k, v, scale):
    """q: (B, T, NH, Dq), k: (B, T, NKV, Dq), v: (B, T, NKV, DV) -> (B, T, NH*DV).
    Query head h attends with kv head h // (NH/NKV)."""
    B, T, NH, _ = q.shape
    NKV, DV = k.shape[2], v.shape[3]
    group = NH // NKV
    q = q.transpose(1, 2)                                   # (B, NH, T, Dq)
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)   # (B, NH, T, Dq)
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)   # (B, NH, T, DV)
    att = (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = att.softmax(dim=-1)
    y = att @ v                                             # (B, NH, T, DV)
    return y.transpose(1, 2).reshape(B, T, NH * DV)


# ----------------------------------------------------------------------------- modules

def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False, dtype=DTYPE)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=DTYPE))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class ForwardContext:
    """What every layer of one forward pass shares: RoPE tables and the cache slots."""

    def __init__(self, cfg, T):
        self.cfg = cfg
        self.T = T
        self._rope = {}
        self.slots = {}        # slot index -> payload (dict of tensors) put there by the producer
        self.aux_losses = []   # scalar tensors added to the loss (MoE)

    def rope(self, dim):
        if dim not in self._rope:
            self._rope[dim] = rope_tables(self.T, dim, self.cfg.rope_theta)
        return self._rope[dim]


class DenseAttention(nn.Module):
    """MHA / GQA / MQA: per-head K and V, num_key_value_heads of them.
    Payload of a cache slot: {"k": (B,T,NKV,D) after RoPE, "v": (B,T,NKV,DV)}."""

    def __init__(self, cfg, layer):
        super().__init__()
        self.layer = layer
        self.nh, self.nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d, self.dv = cfg.head_dim, cfg.v_head_dim
        self.producer = cfg.is_producer(layer)
        self.slot = cfg.slot(layer)
        C = cfg.hidden_size
        self.q_proj = linear(C, self.nh * self.d)
        if self.producer:
            self.k_proj = linear(C, self.nkv * self.d)
            self.v_proj = linear(C, self.nkv * self.dv)
        self.o_proj = linear(self.nh * self.dv, C)

    def payload(self, h, ctx):
        B, T, _ = h.shape
        cos, sin = ctx.rope(self.d)
        k = apply_rope(self.k_proj(h).view(B, T, self.nkv, self.d), cos, sin)
        v = self.v_proj(h).view(B, T, self.nkv, self.dv)
        return {"k": k, "v": v}

    def forward(self, h, ctx):
        B, T, _ = h.shape
        if self.producer:
            ctx.slots[self.slot] = self.payload(h, ctx)
        kv = ctx.slots[self.slot]
        cos, sin = ctx.rope(self.d)
        q = apply_rope(self.q_proj(h).view(B, T, self.nh, self.d), cos, sin)
        y = causal_attention(q, kv["k"], kv["v"], 1.0 / math.sqrt(self.d))
        return self.o_proj(y)


# attention kind (ModelConfig.attention_kind) -> module class; MLA/CLLA add "latent" here
ATTENTION_KINDS = {"dense": DenseAttention}


def make_attention(cfg, layer):
    kind = cfg.attention_kind(layer)
    if kind not in ATTENTION_KINDS:
        raise Unsupported(f"attention kind '{kind}' (layer {layer}) is not implemented in the twin")
    return ATTENTION_KINDS[kind](cfg, layer)


class DenseMLP(nn.Module):
    """SwiGLU: down(silu(gate(h)) * up(h))."""

    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = linear(hidden, inter)
        self.up_proj = linear(hidden, inter)
        self.down_proj = linear(inter, hidden)

    def forward(self, h, ctx):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def make_ffn(cfg, layer):
    kind = cfg.ffn_kind(layer)
    if kind == "dense":
        return DenseMLP(cfg.hidden_size, cfg.intermediate_size)
    if kind == "moe":
        return twin_moe.MoEFFN(cfg, layer)
    raise Unsupported(f"FFN kind '{kind}' (layer {layer}) is not implemented in the twin")


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = make_attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_ffn(cfg, layer)

    def forward(self, x, ctx):
        x = x + self.self_attn(self.input_layernorm(x), ctx)
        x = x + self.mlp(self.post_attention_layernorm(x), ctx)
        return x


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=DTYPE)
        self.layers = nn.ModuleList([DecoderLayer(cfg, l) for l in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, ids, ctx):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, ctx)
        return self.norm(x)


class CausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = linear(cfg.hidden_size, cfg.vocab_size)

    def output_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def forward(self, ids, targets=None):
        """ids, targets: (B, T) int64. Returns (logits (B,T,V), loss or None).
        loss = mean cross-entropy over all B*T targets (+ auxiliary losses, none for dense)."""
        ctx = ForwardContext(self.cfg, ids.shape[1])
        h = self.model(ids, ctx)
        logits = h @ self.output_weight().t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        for aux in ctx.aux_losses:
            loss = loss + aux
        return logits, loss


def build_model(model_cfg):
    return CausalLM(model_cfg)


def init_random(model, seed, std=0.02):
    """The twin's own init (self-tests and the C-binary stand-in): normal(0, std) matrices,
    norm weights near 1 (perturbed, so their gradients are exercised)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=DTYPE) * std)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=DTYPE))


def load_weights(model, tensors, origin="weights"):
    """Copies a name -> array dict into the model (as float64). Every parameter must be
    present with the right shape, and nothing else may be."""
    params = dict(model.named_parameters())
    problems = []
    for name, p in params.items():
        if name not in tensors:
            problems.append(f"missing tensor '{name}' {list(p.shape)}")
        elif tuple(tensors[name].shape) != tuple(p.shape):
            problems.append(f"tensor '{name}' has shape {list(tensors[name].shape)}, expected {list(p.shape)}")
    for name in tensors:
        if name not in params:
            problems.append(f"unexpected tensor '{name}' {list(tensors[name].shape)}")
    if problems:
        raise ValueError(f"{origin}: " + "; ".join(problems))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(np.asarray(tensors[name], dtype=np.float64)))


def load_model_dir(model_dir, sets=None):
    """(CausalLM, full config dict) from DIR/config.json and DIR/model.safetensors."""
    cfg = read_config(os.path.join(model_dir, "config.json"), sets)
    model = build_model(ModelConfig(cfg))
    path = os.path.join(model_dir, "model.safetensors")
    tensors, _ = st.read(path)
    load_weights(model, tensors, path)
    return model, cfg


# ----------------------------------------------------------------------------- data

def read_tokens(path, vocab_size=None):
    raw = np.fromfile(path, dtype="<u4")
    if vocab_size is not None and raw.size and int(raw.max()) >= vocab_size:
        raise ValueError(f"{path}: token {int(raw.max())} >= vocab_size {vocab_size}")
    return raw.astype(np.int64)


def batch_at(tokens, pos, B, T):
    n = B * T
    if pos + n + 1 > tokens.size:
        raise ValueError(f"need {pos + n + 1} tokens, the file holds {tokens.size}")
    chunk = torch.from_numpy(tokens[pos:pos + n + 1])
    return chunk[:n].view(B, T), chunk[1:].view(B, T)


class TokenCursor:
    """The plain uint32 loader's order: read B*T+1 at pos, advance by B*T, wrap to 0 first
    when fewer than B*T+1 tokens remain."""

    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T, self.pos = tokens, B, T, 0

    def next(self):
        if self.pos + self.B * self.T + 1 > self.tokens.size:
            self.pos = 0
        batch = batch_at(self.tokens, self.pos, self.B, self.T)
        self.pos += self.B * self.T
        return batch


# ----------------------------------------------------------------------------- training replay

def make_optimizer(model, tc):
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps, foreach=False)


def train_replay(model, tc, tokens, steps=None, on_step=None):
    """Runs the C trainer's algorithm; returns a list of {"step","loss","grad_norm","lr","clipped"}."""
    opt = make_optimizer(model, tc)
    cursor = TokenCursor(tokens, tc.micro_batch, tc.seq_len)
    params = list(model.parameters())
    out = []
    for s in range(tc.max_steps if steps is None else steps):
        lr = tc.lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=False)
        step_loss = 0.0
        for _ in range(tc.n_micro):
            x, y = cursor.next()
            _, loss = model(x, y)
            (loss / tc.n_micro).backward()
            step_loss += loss.item() / tc.n_micro
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
        clipped = False
        if tc.grad_clip > 0:
            coef = tc.grad_clip / (norm + 1e-6)
            if coef < 1.0:
                clipped = True
                for p in params:
                    p.grad.mul_(coef)
        opt.step()
        rec = {"step": s + 1, "loss": step_loss, "grad_norm": norm, "lr": lr, "clipped": clipped}
        out.append(rec)
        if on_step:
            on_step(rec)
    return out


# ----------------------------------------------------------------------------- comparisons

def rel_err(c, ref):
    c = np.asarray(c, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    diff = float(np.max(np.abs(c - ref))) if c.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if not np.all(np.isfinite(c)):
        return float("inf")
    return diff / scale if scale > 0 else diff


def one_step(model, tokens, B, T):
    x, y = batch_at(tokens, 0, B, T)
    model.zero_grad(set_to_none=False)
    logits, loss = model(x, y)
    loss.backward()
    ref = {"logits": logits.detach().numpy(), "loss": np.array([loss.item()])}
    for name, p in model.named_parameters():
        ref["grad." + name] = p.grad.detach().numpy().copy()
    return ref


def cmd_check_step(a):
    model, _ = load_model_dir(a.model, a.set)
    tokens = read_tokens(a.tokens, model.cfg.vocab_size)
    ref = one_step(model, tokens, a.batch, a.seq)
    dump, _ = st.read(a.dump)
    failed = 0
    tol = a.tol
    print(f"check-step: {a.model} B={a.batch} T={a.seq} attention={model.cfg.attention} "
          f"tied={model.cfg.tie_word_embeddings}  (tolerance: max|c-ref|/max|ref| <= {tol:g})")
    for name, r in ref.items():
        if name not in dump:
            print(f"  FAIL {name:<55} missing from {a.dump}")
            failed += 1
            continue
        c = dump[name]
        if c.size != r.size or (name != "loss" and tuple(c.shape) != tuple(r.shape)):
            print(f"  FAIL {name:<55} shape {list(c.shape)}, expected {list(r.shape)}")
            failed += 1
            continue
        e = rel_err(c.reshape(r.shape), r)
        ok = e <= tol
        failed += not ok
        extra = f"  (c={float(c.reshape(-1)[0]):.9g} ref={float(r[0]):.9g})" if name == "loss" else ""
        print(f"  {'ok  ' if ok else 'FAIL'} {name:<55} {str(list(r.shape)):<14} rel_err {e:.3e}{extra}")
    for name in dump:
        if name not in ref:
            if name.startswith("grad."):
                print(f"  FAIL {name:<55} in the dump but not a parameter of the twin")
                failed += 1
            else:
                print(f"  note {name:<55} extra tensor in the dump, not compared")
    print(f"check-step: {len(ref)} tensors compared, {failed} failed")
    return 1 if failed else 0


def read_metrics(path):
    recs = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON: {e}")
            if not isinstance(r, dict) or "step" not in r or "grad_norm" not in r:
                continue   # other records (validation, summaries)
            step = int(r["step"])
            if step in recs:
                raise ValueError(f"{path}:{i}: step {step} logged twice")
            recs[step] = r
    return recs


def cmd_check_train(a):
    cfg_path = a.config or os.path.join(a.model, "config.json")
    cfg = read_config(cfg_path, a.set)
    model = build_model(ModelConfig(cfg))
    wpath = os.path.join(a.model, "model.safetensors")
    tensors, _ = st.read(wpath)
    load_weights(model, tensors, wpath)
    tc = TrainConfig(cfg.get("train", {}))
    tokens = read_tokens(a.tokens, model.cfg.vocab_size)
    metrics = read_metrics(a.metrics)
    print(f"check-train: {cfg_path} steps={tc.max_steps} n_micro={tc.n_micro} B={tc.micro_batch} "
          f"T={tc.seq_len} lr={tc.lr:g} min_lr={tc.min_lr:g} warmup={tc.warmup_steps} clip={tc.grad_clip:g} "
          f"wd={tc.weight_decay:g}")
    print(f"  {'step':>4} {'loss(c)':>12} {'loss(ref)':>12} {'rel':>9} {'gnorm(c)':>12} {'gnorm(ref)':>12} "
          f"{'rel':>9} {'lr(c)':>11} {'rel':>9} clip")
    failed = 0
    n_clipped = 0

    def on_step(r):
        nonlocal failed, n_clipped
        n_clipped += r["clipped"]
        c = metrics.get(r["step"])
        if c is None:
            print(f"  {r['step']:>4} FAIL: no record for this step in {a.metrics}")
            failed += 1
            return
        el = rel_err(float(c["loss"]), r["loss"])
        eg = rel_err(float(c["grad_norm"]), r["grad_norm"])
        er = rel_err(float(c["lr"]), r["lr"])
        bad = el > a.tol or eg > a.tol or er > a.lr_tol
        failed += bad
        print(f"  {r['step']:>4} {float(c['loss']):12.7f} {r['loss']:12.7f} {el:9.2e} {float(c['grad_norm']):12.7f} "
              f"{r['grad_norm']:12.7f} {eg:9.2e} {float(c['lr']):11.4e} {er:9.2e} {'yes' if r['clipped'] else 'no ':<4}"
              f"{'  FAIL' if bad else ''}")

    train_replay(model, tc, tokens, on_step=on_step)
    extra = sorted(s for s in metrics if s < 1 or s > tc.max_steps)
    if extra:
        print(f"  FAIL: metrics has steps outside 1..{tc.max_steps}: {extra}")
        failed += 1
    if a.require_clip and tc.grad_clip > 0 and n_clipped == 0:
        print(f"  FAIL: grad_clip={tc.grad_clip:g} never triggered; the run does not test clipping")
        failed += 1
    print(f"check-train: {tc.max_steps} steps, {n_clipped} clipped, {failed} failed")
    return 1 if failed else 0


def cmd_suggest_clip(a):
    """A grad_clip that should trigger on some steps but not all: replays the run without
    clipping and prints 0.99 x the median of its gradient norms (the norms go to stderr)."""
    cfg_path = a.config or os.path.join(a.model, "config.json")
    cfg = read_config(cfg_path, a.set)
    model = build_model(ModelConfig(cfg))
    tensors, _ = st.read(os.path.join(a.model, "model.safetensors"))
    load_weights(model, tensors)
    tc = TrainConfig(cfg["train"])
    tc.grad_clip = 0.0
    recs = train_replay(model, tc, read_tokens(a.tokens, model.cfg.vocab_size))
    norms = [r["grad_norm"] for r in recs]
    print("unclipped grad norms: " + " ".join(f"{n:.6g}" for n in norms), file=sys.stderr)
    print(f"{0.99 * float(np.median(norms)):.6g}")
    return 0


# ----------------------------------------------------------------------------- C-binary stand-in

def cmd_init(a):
    """Like `clla init`: config.json (model keys + "train") and model.safetensors (fp32)."""
    cfg = read_config(a.config, a.set)
    mc = ModelConfig(cfg)
    cfg.setdefault("head_dim", mc.head_dim)
    cfg.setdefault("v_head_dim", mc.v_head_dim)
    cfg.setdefault("num_key_value_heads", mc.num_key_value_heads)
    model = build_model(mc)
    init_random(model, int(cfg.get("train", {}).get("seed", 1234)))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    st.write(os.path.join(a.out, "model.safetensors"),
             {n: p.detach() for n, p in model.named_parameters()}, dtype="F32")
    return 0


def cmd_debug_step(a):
    """Like `clla debug-step`, computed by the twin (results rounded to F32 like the C dump)."""
    model, _ = load_model_dir(a.model)
    ref = one_step(model, read_tokens(a.tokens, model.cfg.vocab_size), a.batch, a.seq)
    st.write(a.out, ref, dtype="F32")
    return 0


def cmd_train(a):
    """Like `clla train`: replays training and writes train.out_dir/metrics.jsonl."""
    cfg = read_config(a.config, a.set)
    model = build_model(ModelConfig(cfg))
    t = cfg["train"]
    tensors, _ = st.read(t["init_from"])
    load_weights(model, tensors, t["init_from"])
    tc = TrainConfig(t)
    os.makedirs(t["out_dir"], exist_ok=True)
    with open(os.path.join(t["out_dir"], "metrics.jsonl"), "w") as f:
        def log(r):
            f.write(json.dumps({k: r[k] for k in ("step", "loss", "grad_norm", "lr")}) + "\n")
        train_replay(model, tc, read_tokens(t["data"], model.cfg.vocab_size), on_step=log)
    return 0


# ----------------------------------------------------------------------------- main

def main(argv=None):
    torch.set_default_dtype(DTYPE)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("check-step", help="compare a clla debug-step dump")
    c.add_argument("--model", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--batch", type=int, required=True)
    c.add_argument("--seq", type=int, required=True)
    c.add_argument("--dump", required=True)
    c.add_argument("--tol", type=float, default=1e-4)
    c.add_argument("--set", action="append", default=[], help="override a config key (key=value)")

    c = sub.add_parser("check-train", help="replay training and compare a clla metrics.jsonl")
    c.add_argument("--model", required=True, help="dir with config.json and the initial model.safetensors")
    c.add_argument("--tokens", required=True)
    c.add_argument("--metrics", required=True)
    c.add_argument("--config", help="config to read instead of MODEL/config.json")
    c.add_argument("--set", action="append", default=[], help="override a config key (train.lr=...)")
    c.add_argument("--tol", type=float, default=1e-4)
    c.add_argument("--lr-tol", type=float, default=1e-6)
    c.add_argument("--require-clip", action="store_true", help="fail unless clipping triggers on some step")

    c = sub.add_parser("suggest-clip", help="median gradient norm of the run without clipping")
    c.add_argument("--model", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--config")
    c.add_argument("--set", action="append", default=[])

    c = sub.add_parser("init", help="stand-in for clla init")
    c.add_argument("--config", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--set", action="append", default=[])

    c = sub.add_parser("debug-step", help="stand-in for clla debug-step")
    c.add_argument("--model", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--batch", type=int, required=True)
    c.add_argument("--seq", type=int, required=True)
    c.add_argument("--out", required=True)

    c = sub.add_parser("train", help="stand-in for clla train")
    c.add_argument("--config", required=True)
    c.add_argument("--set", action="append", default=[])

    a = p.parse_args(argv)
    fn = {"check-step": cmd_check_step, "check-train": cmd_check_train, "suggest-clip": cmd_suggest_clip,
          "init": cmd_init, "debug-step": cmd_debug_step, "train": cmd_train}[a.cmd]
    try:
        return fn(a)
    except (ValueError, OSError, KeyError, Unsupported) as e:
        print(f"twin.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
