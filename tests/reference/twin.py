#!/usr/bin/python3
"""PyTorch twin of the clla model (docs/DESIGN.md section 7), in float64.

It builds the same model from the same config.json + model.safetensors as the C side and
checks the C side's outputs:

  twin.py check-step  --model DIR --tokens FILE --batch B --seq T --dump OUT.safetensors
      logits, loss and every parameter gradient of one forward+backward (clla debug-step)
  twin.py check-train --model DIR --tokens FILE --metrics OUT/metrics.jsonl [--set train.k=v ...]
      replays the optimizer (AdamW, warmup+cosine lr, clipping, micro-batch accumulation)
      and compares per-step loss, grad_norm and lr (clla train)
  twin.py check-int-group --probe BIN
      the C int_group quantizer (tests/reference/int_group_probe.c linked with libclla_core.a)
      against the twin's, bit for bit, on edge cases

The same file also acts as a stand-in for the C binary, so the harness can be tested
without it (tests/reference/selftest.py): `twin.py init`, `twin.py debug-step`,
`twin.py train` take the flags of `clla init`, `clla debug-step`, `clla train`.

Run with Debian's interpreter, /usr/bin/python3 (python3-torch, python3-numpy).

Model structure:
  CausalLM
    model: Backbone(embed_tokens, layers[DecoderLayer], norm)
      DecoderLayer(input_layernorm, self_attn = make_attention(cfg, l),
                   post_attention_layernorm, mlp = make_ffn(cfg, l))
    lm_head (absent when tied)
  Attention (docs/DESIGN.md section 1): DenseAttention (MHA/GQA/MQA, CLA) or LatentAttention (MLA,
  CLLA and its share modes, CLLA-quant), chosen by ModelConfig.attention_kind(l). They get a
  ForwardContext: RoPE tables and the cache slots (docs/DESIGN.md section 2): a producer layer
  (l % share_factor == 0) puts its payload in slot l // share_factor, consumer layers read it,
  and autograd sums the consumers' gradients into the producer's payload. The CLLA-quant
  quantizer (int_group_quantize) is written in float32 torch arithmetic, independently of the C
  code, and applied to the float32 rounding of the twin's float64 latent.
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
SHARE_NAMES = ("kv", "latent", "latent_krope", "latent_kvproj")
# model/config.c PRESETS: name -> (latent, kv_rule, share_factor, share, latent_quant_bits);
# kv_rule: "heads" (num_key_value_heads = num_attention_heads), "given" (must be configured), "one".
# A config names a preset and may override any knob; the preset only supplies defaults.
PRESETS = {
    "mha": (False, "heads", 1, "kv", 0),
    "gqa": (False, "given", 1, "kv", 0),
    "mqa": (False, "one", 1, "kv", 0),
    "mla": (True, "heads", 1, "latent", 0),
    "cla": (False, "heads", 2, "kv", 0),
    "gqa_cla": (False, "given", 2, "kv", 0),
    "clla": (True, "heads", 2, "latent", 0),
    "clla_share_krope": (True, "heads", 2, "latent_krope", 0),
    "clla_share_kvproj": (True, "heads", 2, "latent_kvproj", 0),
    "clla_quant": (True, "heads", 2, "latent", 4),
    "clla_quant_share_kvproj": (True, "heads", 2, "latent_kvproj", 4),
}
ALL_PRESETS = tuple(PRESETS)


def _num(d, key, default=0):
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool):
        return int(v)
    return v


def _given(d, key, alias=None):
    """The value of a key (or of its alias, as model/config.c reads it), None when absent."""
    for k in (key, alias):
        if k and d.get(k) is not None:
            return d[k]
    return None


class ModelConfig:
    """The model keys of config.json (HF names), read as model/config.c reads them: the preset
    ("attention") supplies share_factor, share, latent_quant_bits (and group 32 with it), and
    the num_key_value_heads rule; explicit keys override; head_dim defaults to
    hidden_size / num_attention_heads, v_head_dim to head_dim."""

    def __init__(self, d):
        self.raw = dict(d)
        self.attention = str(d.get("attention", "mha"))
        if self.attention not in PRESETS:
            raise ValueError(f"attention: unknown preset '{self.attention}' (known: {', '.join(ALL_PRESETS)})")
        latent, kv_rule, sf, share, qbits = PRESETS[self.attention]
        self.preset_latent, self.kv_rule = latent, kv_rule
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        nkv = _given(d, "num_key_value_heads")
        if nkv is None:
            if kv_rule == "given":
                raise ValueError(f"preset '{self.attention}' needs num_key_value_heads "
                                 f"(a divisor of num_attention_heads = {self.num_attention_heads})")
            nkv = 1 if kv_rule == "one" else self.num_attention_heads
        self.num_key_value_heads = int(nkv)
        hd = _given(d, "head_dim", "qk_nope_head_dim")
        self.head_dim = int(hd) if hd is not None else self.hidden_size // self.num_attention_heads
        vhd = _given(d, "v_head_dim")
        self.v_head_dim = int(vhd) if vhd is not None else self.head_dim
        self.intermediate_size = int(_num(d, "intermediate_size"))
        self.rms_norm_eps = float(_num(d, "rms_norm_eps", 1e-6))     # model/config.c default
        self.rope_theta = float(_num(d, "rope_theta", 10000.0))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        # the attention design space (docs/DESIGN.md section 1)
        self.q_lora_rank = int(_num(d, "q_lora_rank"))
        self.kv_lora_rank = int(_num(d, "kv_lora_rank"))
        self.qk_rope_head_dim = int(_num(d, "qk_rope_head_dim"))
        g = _given(d, "share_factor", "cla_share_factor")
        self.share_factor = int(g) if g is not None else sf
        self.share = str(d["share"]) if d.get("share") is not None else share
        g = _given(d, "latent_quant_bits")
        self.latent_quant_bits = int(g) if g is not None else qbits
        g = _given(d, "latent_quant_group")
        self.latent_quant_group = int(g) if g is not None else 32
        # MoE (twin_moe.py reads the rest from raw)
        self.n_routed_experts = int(_num(d, "n_routed_experts"))
        self.n_shared_experts = int(_num(d, "n_shared_experts"))
        self.num_experts_per_tok = int(_num(d, "num_experts_per_tok"))
        self.moe_intermediate_size = int(_num(d, "moe_intermediate_size"))
        self.first_k_dense_layers = int(_num(d, "first_k_dense_layers", _num(d, "first_k_dense_replace")))
        self.validate()

    @property
    def latent(self):
        return self.kv_lora_rank > 0

    def validate(self):
        """model/config.c config_validate's rules for the model keys (ValueError), and Unsupported
        for anything the twin does not implement (nothing of the attention space any more)."""
        nh, nkv, p = self.num_attention_heads, self.num_key_value_heads, self.attention
        if self.head_dim <= 0 or self.v_head_dim <= 0:
            raise ValueError(f"head_dim={self.head_dim} and v_head_dim={self.v_head_dim} must be > 0")
        if self.intermediate_size <= 0 and self.n_routed_experts <= 0:
            raise ValueError("intermediate_size must be set (> 0)")
        if self.share_factor < 1:
            raise ValueError(f"share_factor={self.share_factor} must be >= 1")
        if self.share not in SHARE_NAMES:
            raise ValueError(f"share='{self.share}': use one of {', '.join(SHARE_NAMES)}")
        if not self.latent:
            if nkv <= 0 or nh % nkv:
                raise ValueError(f"num_key_value_heads={nkv} must divide num_attention_heads={nh}")
            if self.head_dim % 2:
                raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
            if self.share != "kv":
                raise ValueError(f"share={self.share} needs a latent model (kv_lora_rank > 0)")
            if self.latent_quant_bits:
                raise ValueError("latent_quant_bits needs a latent model (kv_lora_rank > 0)")
            if self.kv_rule == "heads" and nkv != nh:
                raise ValueError(f"preset '{p}' has num_key_value_heads = num_attention_heads; use gqa for fewer")
            if self.kv_rule == "one" and nkv != 1:
                raise ValueError("preset mqa has num_key_value_heads = 1")
            if self.preset_latent:
                raise ValueError(f"preset '{p}' needs kv_lora_rank > 0 (the latent width)")
            # q_lora_rank and qk_rope_head_dim do nothing in a plain model (as on the C side)
        else:
            if not self.preset_latent:
                raise ValueError("kv_lora_rank > 0 makes a latent model: use preset mla or clla*")
            if self.share == "kv":
                raise ValueError("share = kv is for plain K/V; latent models share latent, latent_krope or latent_kvproj")
            if self.qk_rope_head_dim <= 0 or self.qk_rope_head_dim % 2:
                raise ValueError(f"latent models need an even qk_rope_head_dim > 0 (got {self.qk_rope_head_dim})")
            if self.q_lora_rank < 0:
                raise ValueError("q_lora_rank must be >= 0")
            if self.latent_quant_bits:
                if not 2 <= self.latent_quant_bits <= 8:
                    raise ValueError(f"latent_quant_bits={self.latent_quant_bits} must be 0 (off) or 2..8")
                if self.latent_quant_group <= 0 or self.kv_lora_rank % self.latent_quant_group:
                    raise ValueError(f"latent_quant_group={self.latent_quant_group} must divide "
                                     f"kv_lora_rank={self.kv_lora_rank}")

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

    def producer_of(self, layer):
        return layer - layer % self.share_factor

    def describe(self):
        s = f"attention={self.attention}"
        if self.latent:
            s += (f" R={self.kv_lora_rank} DR={self.qk_rope_head_dim} Rq={self.q_lora_rank} D={self.head_dim} "
                  f"DV={self.v_head_dim}")
            if self.latent_quant_bits:
                s += f" quant={self.latent_quant_bits}b/g{self.latent_quant_group}"
        else:
            s += f" NKV={self.num_key_value_heads} D={self.head_dim} DV={self.v_head_dim}"
        if self.share_factor > 1:
            s += f" F={self.share_factor} share={self.share}"
        return s + f" L={self.num_hidden_layers} tied={self.tie_word_embeddings}"


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
        if self.global_batch_tokens == 0:   # clla's default: one micro-batch per step (one rank)
            self.global_batch_tokens = bt
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


# ----------------------------------------------------------------------------- CLLA-quant: int_group

def int_group_imax(bits):
    """Largest code: symmetric codes in [-Imax, Imax], Imax = 2^(b-1) - 1. (The CLLA paper's
    [-(2^(b-1)-1), 2^b-1] upper bound is a typo for a symmetric quantizer.)"""
    return (1 << (bits - 1)) - 1


def bf16_round_up(s):
    """Smallest bf16 value >= s, for a float32 tensor s >= 0: clear the low 16 bits of the fp32
    pattern and, if any was set, add one bf16 ulp (0x10000)."""
    assert s.dtype == torch.float32
    u = s.contiguous().view(torch.int32)
    low = torch.bitwise_and(u, 0xFFFF)
    up = torch.bitwise_and(u, -65536) + 65536          # -65536 = 0xFFFF0000 as int32
    return torch.where(low != 0, up, u).view(torch.float32)


def int_group_quantize(x, bits, group):
    """x: float32 (..., W), groups of `group` contiguous values along the last dim.
    Returns (codes int32 (..., W//group, group), scales float32 (..., W//group)), all in float32
    arithmetic: scale = bf16_round_up(max|x| / Imax) (0 for an all-zero group),
    code = clamp(round_half_even(x / scale), -Imax, Imax) (0 in a zero group)."""
    assert x.dtype == torch.float32 and x.shape[-1] % group == 0
    imax = int_group_imax(bits)
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group, group).contiguous()
    absmax = g.abs().amax(dim=-1)
    # full-size operands: a plain elementwise IEEE division (no scalar fast path)
    raw = absmax / torch.full_like(absmax, float(imax))
    scale = torch.where(absmax > 0, bf16_round_up(raw), torch.zeros_like(raw))
    # near the top of the float range: the largest bf16 scale whose Imax x scale is finite
    # (backend/int_group_math.h, int_group_scale)
    top = (torch.tensor(3.4028234663852886e38 / imax, dtype=torch.float32).view(torch.int32) & -65536).view(torch.float32)
    scale = torch.where(torch.isfinite(absmax) & (scale > top), top, scale)
    den = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1).expand_as(g).contiguous()
    q = torch.round(g / den)                            # torch.round: half to even, like rintf
    q = q.clamp(-imax, imax)
    q = torch.where((scale > 0).unsqueeze(-1), q, torch.zeros_like(q))
    return q.to(torch.int32), scale


def int_group_dequantize(codes, scales):
    """float32 (..., W): code * scale (exact in float32: |code| < 2^7, scale has 8 significant bits)."""
    v = codes.to(torch.float32) * scales.unsqueeze(-1).expand_as(codes).contiguous()
    return v.reshape(*codes.shape[:-2], codes.shape[-2] * codes.shape[-1])


class StraightThrough(torch.autograd.Function):
    """Forward: the given replacement value; backward: the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x, value):
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        return g, None


def int_group_ste(c, bits, group, log=None, layer=None):
    """CLLA-quant of the normalized latent c (float64): the float32-rounded c is quantized in
    float32 (as the C side quantizes its fp32 latent), dequantized, returned as float64 with a
    straight-through gradient. `log` (a list) receives what the quantizer saw, for checks."""
    x32 = c.detach().to(torch.float32)
    codes, scales = int_group_quantize(x32, bits, group)
    deq = int_group_dequantize(codes, scales)
    if log is not None:
        log.append({"layer": layer, "x": x32, "codes": codes, "scales": scales, "deq": deq,
                    "bits": bits, "group": group})
    return StraightThrough.apply(c, deq.to(c.dtype))


def int_group_margins(rec):
    """How close the quantizer's inputs were to its discontinuities (the C side quantizes its own
    fp32 latent, which differs from the twin's by ~1e-7..1e-6 relative):
    code: min over elements of |r - (nearest .5 boundary)| / r, r = |x| / scale;
    scale: min over groups of the distance of max|x|/Imax (fp32 bits) to a bf16 boundary, in fp32 ulps."""
    x, codes, scales, bits = rec["x"], rec["codes"], rec["scales"], rec["bits"]
    imax = int_group_imax(bits)
    g = x.reshape(codes.shape).double()
    s = scales.double().unsqueeze(-1)
    live = (scales > 0).unsqueeze(-1).expand_as(g)
    r = (g.abs() / torch.where(s > 0, s, torch.ones_like(s)))[live]
    k = r.floor().clamp(0, imax - 1)
    dist = (r - (k + 0.5)).abs() / r.clamp_min(1e-300)
    code_margin = float(dist.min()) if dist.numel() else float("inf")
    absmax = x.reshape(codes.shape).abs().amax(-1)
    raw = (absmax / torch.full_like(absmax, float(imax)))[scales > 0]
    low = torch.bitwise_and(raw.contiguous().view(torch.int32), 0xFFFF)
    scale_margin = int(torch.minimum(low, 65536 - low).min()) if raw.numel() else 65536
    return code_margin, scale_margin


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
    """What every layer of one forward pass shares: RoPE tables and the cache slots.
    Slots go through put_slot / read_slot; the optional hooks (tests) see or replace a payload:
    put_hook(slot, payload) -> payload when the producer stores it, read_hook(layer, slot,
    payload) -> payload each time a layer (the producer included) reads it."""

    def __init__(self, cfg, T):
        self.cfg = cfg
        self.T = T
        self._rope = {}
        self.slots = {}        # slot index -> payload (dict of tensors) put there by the producer
        self.aux_losses = []   # scalar tensors added to the loss (MoE)
        self.quant_log = []    # what the int_group quantizer saw (CLLA-quant), one record per producer
        self.put_hook = None
        self.read_hook = None

    def rope(self, dim):
        if dim not in self._rope:
            self._rope[dim] = rope_tables(self.T, dim, self.cfg.rope_theta)
        return self._rope[dim]

    def put_slot(self, slot, payload):
        if self.put_hook is not None:
            payload = self.put_hook(slot, payload)
        self.slots[slot] = payload

    def read_slot(self, layer, slot):
        payload = self.slots[slot]
        if self.read_hook is not None:
            payload = self.read_hook(layer, slot, payload)
        return payload


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
            ctx.put_slot(self.slot, self.payload(h, ctx))
        kv = ctx.read_slot(self.layer, self.slot)
        cos, sin = ctx.rope(self.d)
        q = apply_rope(self.q_proj(h).view(B, T, self.nh, self.d), cos, sin)
        y = causal_attention(q, kv["k"], kv["v"], 1.0 / math.sqrt(self.d))
        return self.o_proj(y)


class LatentAttention(nn.Module):
    """MLA / CLLA (DeepSeek-V2 form, non-absorbed), one layer.
    Query: q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank > 0); per head
    [q_nope (D) | q_rope (DR)], RoPE on the last DR dims (frequencies with DR as the dimension).
    Producer: kv_a = h kv_a_proj_with_mqa^T = [c_raw (R) | k_rope_raw (DR)];
    c = kv_a_layernorm(c_raw), int_group round trip with a straight-through gradient when
    latent_quant_bits > 0; k_rope = RoPE(k_rope_raw), one head shared by every query head.
    Payload of a slot: {"c": (B,T,R), "k_rope": (B,T,1,DR), "kv_b": the producer's kv_b_proj weight}.
    Consumers (l % F != 0) read the slot's c; k_rope: their own k_rope_proj (share latent,
    latent_kvproj) or the slot's (latent_krope); kv_b_proj: their own, or the producer's
    (latent_kvproj, so its gradient sums into the producer's weight).
    kv = c kv_b^T viewed (NH, D + DV) per head = [k_nope | v]; K = [k_nope | k_rope];
    causal softmax attention with scale 1/sqrt(D + DR); out = o_proj(att (NH*DV))."""

    def __init__(self, cfg, layer):
        super().__init__()
        self.layer = layer
        self.nh, self.d, self.dv = cfg.num_attention_heads, cfg.head_dim, cfg.v_head_dim
        self.r, self.dr, self.rq = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.q_lora_rank
        self.producer = cfg.is_producer(layer)
        self.slot = cfg.slot(layer)
        self.share = cfg.share
        self.quant = (cfg.latent_quant_bits, cfg.latent_quant_group) if cfg.latent_quant_bits else None
        C = cfg.hidden_size
        qw = self.nh * (self.d + self.dr)
        if self.rq > 0:
            self.q_a_proj = linear(C, self.rq)
            self.q_a_layernorm = RMSNorm(self.rq, cfg.rms_norm_eps)
            self.q_b_proj = linear(self.rq, qw)
        else:
            self.q_proj = linear(C, qw)
        self.own_krope = False
        if self.producer:
            self.kv_a_proj_with_mqa = linear(C, self.r + self.dr)
            self.kv_a_layernorm = RMSNorm(self.r, cfg.rms_norm_eps)
        elif self.share in ("latent", "latent_kvproj"):
            self.k_rope_proj = linear(C, self.dr)
            self.own_krope = True
        self.own_kvb = self.producer or self.share != "latent_kvproj"
        if self.own_kvb:
            self.kv_b_proj = linear(self.r, self.nh * (self.d + self.dv))
        self.o_proj = linear(self.nh * self.dv, C)

    def query(self, h, ctx):
        B, T, _ = h.shape
        if self.rq > 0:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h)))
        else:
            q = self.q_proj(h)
        q = q.view(B, T, self.nh, self.d + self.dr)
        cos, sin = ctx.rope(self.dr)
        return torch.cat([q[..., :self.d], apply_rope(q[..., self.d:], cos, sin)], dim=-1)

    def payload(self, h, ctx):
        B, T, _ = h.shape
        kv_a = self.kv_a_proj_with_mqa(h)
        c = self.kv_a_layernorm(kv_a[..., :self.r])
        if self.quant:
            c = int_group_ste(c, *self.quant, log=ctx.quant_log, layer=self.layer)
        cos, sin = ctx.rope(self.dr)
        k_rope = apply_rope(kv_a[..., self.r:].reshape(B, T, 1, self.dr), cos, sin)
        return {"c": c, "k_rope": k_rope, "kv_b": self.kv_b_proj.weight}

    def forward(self, h, ctx):
        B, T, _ = h.shape
        if self.producer:
            ctx.put_slot(self.slot, self.payload(h, ctx))
        s = ctx.read_slot(self.layer, self.slot)
        q = self.query(h, ctx)
        if self.own_krope:
            cos, sin = ctx.rope(self.dr)
            k_rope = apply_rope(self.k_rope_proj(h).view(B, T, 1, self.dr), cos, sin)
        else:
            k_rope = s["k_rope"]
        w_kvb = self.kv_b_proj.weight if self.own_kvb else s["kv_b"]
        kv = (s["c"] @ w_kvb.t()).view(B, T, self.nh, self.d + self.dv)
        k = torch.cat([kv[..., :self.d], k_rope.expand(B, T, self.nh, self.dr)], dim=-1)
        v = kv[..., self.d:]
        y = causal_attention(q, k, v, 1.0 / math.sqrt(self.d + self.dr))
        return self.o_proj(y)


# attention kind (ModelConfig.attention_kind) -> module class
ATTENTION_KINDS = {"dense": DenseAttention, "latent": LatentAttention}


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
        self.put_hook = self.read_hook = None   # ForwardContext hooks (tests)
        self.last_quant_log = []

    def output_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def forward(self, ids, targets=None):
        """ids, targets: (B, T) int64. Returns (logits (B,T,V), loss or None).
        loss = mean cross-entropy over all B*T targets (+ auxiliary losses, none for dense)."""
        ctx = ForwardContext(self.cfg, ids.shape[1])
        if self.put_hook is not None or self.read_hook is not None:
            ctx.put_hook, ctx.read_hook = self.put_hook, self.read_hook
        h = self.model(ids, ctx)
        self.last_quant_log = ctx.quant_log
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
    when fewer than B*T+1 tokens remain. clla train reads a step at once (B = micro_batch *
    n_micro rows, cli/cmd_train.c), so a wrap never falls between a step's micro-batches."""

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
    cursor = TokenCursor(tokens, tc.micro_batch * tc.n_micro, tc.seq_len)   # a step's rows, as clla reads them
    params = list(model.parameters())
    out = []
    for s in range(tc.max_steps if steps is None else steps):
        lr = tc.lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=False)
        step_loss = 0.0
        margins = []
        xs, ys = cursor.next()
        for m in range(tc.n_micro):
            x, y = xs[m * tc.micro_batch:(m + 1) * tc.micro_batch], ys[m * tc.micro_batch:(m + 1) * tc.micro_batch]
            _, loss = model(x, y)
            (loss / tc.n_micro).backward()
            step_loss += loss.item() / tc.n_micro
            margins += [int_group_margins(r) for r in model.last_quant_log]
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
        if margins:   # CLLA-quant: how close this step's latents came to a rounding boundary
            rec["quant_margin"] = (min(m[0] for m in margins), min(m[1] for m in margins))
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
    print(f"check-step: {a.model} B={a.batch} T={a.seq} {model.cfg.describe()}  "
          f"(tolerance: max|c-ref|/max|ref| <= {tol:g})")
    for rec in model.last_quant_log:
        # the C side quantizes its fp32 latent, the twin the fp32 rounding of its fp64 latent;
        # they differ by ~1e-7..1e-6 relative, so a code (or a scale) can differ only where an
        # input lies that close to a rounding boundary
        cm, sm = int_group_margins(rec)
        near = cm < 1e-5 or sm < 32
        print(f"  {'WARN' if near else 'note'} int_group layer {rec['layer']}: {rec['scales'].numel()} groups, "
              f"{rec['codes'].numel()} codes, code margin {cm:.2e} (relative), scale margin {sm} fp32 ulps"
              + ("  <- near a rounding boundary: a C/twin code may differ here" if near else ""))
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
        if "quant_margin" in r:
            cm, sm = r["quant_margin"]
            near = cm < 1e-5 or sm < 32
            print(f"       int_group: code margin {cm:.2e}, scale margin {sm} fp32 ulps"
                  + ("  WARN: near a rounding boundary, a C/twin code may differ" if near else ""))

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


# ----------------------------------------------------------------------------- int_group against the C code

def int_group_cases(seed=0):
    """(name, float32 array (N, W), bits, group) cases aimed at the quantizer's edges: random
    data over many magnitudes, exact .5 ties (half-to-even), max|x|/Imax exactly on a bf16 value
    and one fp32 ulp above it (the scale's round-up), zero and signed-zero groups, tiny
    (subnormal-scale) groups, every bit width 2..8."""
    rng = np.random.default_rng(seed)
    out = []
    for bits in range(2, 9):
        imax = int_group_imax(bits)
        for group in (8, 32):
            W, N = 64, 24
            x = (rng.standard_normal((N, W)) * 10.0 ** rng.uniform(-3, 3, (N, W // group, 1)).repeat(group, -1)
                 .reshape(N, W)).astype(np.float32)
            out.append((f"random b={bits} g={group}", x, bits, group))
            # ties: scale s a bf16 value, max|x| = Imax*s, the rest (k + 1/2) s (exact in fp32)
            y = np.zeros((N, W), np.float32)
            for n in range(N):
                for g in range(W // group):
                    s = np.float32(2.0 ** rng.integers(-20, 10) * (1 + rng.integers(0, 128) / 128.0))
                    k = rng.integers(0, imax, group).astype(np.float32) + np.float32(0.5)
                    v = (k * s * np.where(rng.random(group) < 0.5, -1, 1)).astype(np.float32)
                    v[0] = np.float32(imax) * s * (1 if rng.random() < 0.5 else -1)
                    y[n, g * group:(g + 1) * group] = v
            out.append((f"ties b={bits} g={group}", y, bits, group))
            # scale boundary: max|x|/Imax on a bf16 value, and max|x| one ulp above
            z = (rng.standard_normal((N, W)) * 0.1).astype(np.float32)
            for n in range(N):
                for g in range(W // group):
                    s = np.float32(2.0 ** rng.integers(-10, 5) * (1 + rng.integers(0, 128) / 128.0))
                    a = np.float32(np.float32(imax) * s)
                    if (n + g) % 2:
                        a = np.nextafter(a, np.float32(np.inf))
                    blk = z[n, g * group:(g + 1) * group]
                    blk[:] = np.clip(blk * a, -a, a)
                    blk[rng.integers(0, group)] = a if rng.random() < 0.5 else -a
            out.append((f"scale-boundary b={bits} g={group}", z, bits, group))
    # zero, signed zero and tiny groups
    e = (rng.standard_normal((4, 32))).astype(np.float32)
    e[0, :8] = 0.0
    e[0, 8:16] = -0.0
    e[1, :8] = 0.0
    e[1, 3] = np.float32(1e-38)          # scale 1e-38/7: a subnormal fp32
    e[1, 8:16] = np.float32(-1e-30)
    e[2, 8:16] = np.float32(3e30) * np.float32(rng.standard_normal(8))
    out.append(("zero/tiny/huge groups b=4 g=8", e, 4, 8))
    return out


def cmd_check_int_group(a):
    """Runs the C quantizer (tests/reference/int_group_probe.c, linked with libclla_core.a) on
    int_group_cases() and requires its output bit for bit equal to int_group_quantize/dequantize,
    both the backend round trip (training) and the cache codec's decode(encode()) (inference)."""
    import subprocess
    import tempfile
    failed = 0
    total = 0
    with tempfile.TemporaryDirectory() as d:
        for name, x, bits, group in int_group_cases(a.seed):
            N, W = x.shape
            xin, xout = os.path.join(d, "in.f32"), os.path.join(d, "out.f32")
            x.astype("<f4").tofile(xin)
            r = subprocess.run([a.probe, xin, xout, str(N), str(W), str(bits), str(group)], capture_output=True, text=True)
            if r.returncode:
                print(f"  FAIL {name}: probe failed: {r.stderr.strip()}")
                failed += 1
                continue
            c = np.fromfile(xout, dtype="<f4").reshape(2, N, W)
            codes, scales = int_group_quantize(torch.from_numpy(x.copy()), bits, group)
            ref = int_group_dequantize(codes, scales).numpy()
            imax = int_group_imax(bits)
            sc = scales.numpy()
            r = np.abs(x.reshape(codes.shape).astype(np.float64)) / np.where(sc > 0, sc, 1)[..., None]
            nties = int(np.sum(r % 1 == 0.5))
            absmax = np.abs(x.reshape(codes.shape)).max(-1)
            raw = (absmax / np.float32(imax)).astype(np.float32)
            on_bf16 = int(np.sum((raw.view(np.uint32) & 0xFFFF == 0) & (absmax > 0)))
            bad = [int(np.sum(arr.view(np.uint32) != ref.view(np.uint32))) for arr in (c[0], c[1])]
            total += 2 * x.size
            ok = bad == [0, 0] and int(codes.abs().max()) <= imax
            failed += not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {name:<30} {x.size:5d} values ({nties:4d} exact ties, {on_bf16:3d} groups with "
                  f"max|x|/Imax on a bf16 value): differ {bad[0]} (backend round trip), {bad[1]} (codec decode(encode))")
    print(f"check-int-group: {total} values compared bit for bit, {failed} failed")
    return 1 if failed else 0


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

def cmd_greedy(a):
    """Greedy continuation of a prompt, recomputing the full forward each step (no cache): what
    clla generate's incremental decoding must reproduce. Ties go to the lower id (argmax)."""
    model, _ = load_model_dir(a.model, a.set)
    ids = [int(x) for x in a.ids.split(",") if x != ""]
    if not ids:
        raise ValueError("--ids is empty")
    margins = []
    with torch.no_grad():
        for _ in range(a.n):
            logits, _ = model(torch.tensor([ids], dtype=torch.int64))
            last = logits[0, -1]
            top2 = torch.topk(last, 2).values
            margins.append(float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(last)))
    print(",".join(str(i) for i in ids[len(ids) - a.n:]))
    print(f"smallest top-2 logit margin {min(margins):.3e}", file=sys.stderr)
    return 0


def cmd_loglik(a):
    """Log-likelihood of continuations given a context, by the full float64 forward (checks clla
    eval --bench): for each --cont, the sum over its tokens of log softmax(logits)[token] after
    context + the tokens before it. Prints one line per continuation: the sum, then the per-token
    log-probabilities, space-separated."""
    model, _ = load_model_dir(a.model, a.set)
    ctx = [int(x) for x in a.ctx.split(",") if x != ""]
    if not ctx:
        raise ValueError("--ctx is empty")
    with torch.no_grad():
        for cont_text in a.cont:
            cont = [int(x) for x in cont_text.split(",") if x != ""]
            if not cont:
                raise ValueError("a --cont is empty")
            ids = ctx + cont
            logits, _ = model(torch.tensor([ids[:-1]], dtype=torch.int64))
            lp = torch.log_softmax(logits[0], dim=-1)
            per = [float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)]
            print(f"{sum(per):.10f} " + " ".join(f"{x:.10f}" for x in per))
    return 0


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

    c = sub.add_parser("check-int-group", help="the C int_group quantizer (int_group_probe) against the twin's, bit for bit")
    c.add_argument("--probe", required=True, help="the compiled tests/reference/int_group_probe.c")
    c.add_argument("--seed", type=int, default=0)

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
    c.add_argument("--quiet", action="store_true", help="accepted (the stand-in prints no step lines)")
    c.add_argument("--set", action="append", default=[])

    c = sub.add_parser("greedy", help="greedy continuation by full recomputation (checks clla generate)")
    c.add_argument("--model", required=True)
    c.add_argument("--ids", required=True, help="prompt token ids, comma-separated")
    c.add_argument("--n", type=int, required=True, help="tokens to generate")
    c.add_argument("--set", action="append", default=[])

    c = sub.add_parser("loglik", help="continuation log-likelihoods by the full forward (checks clla eval --bench)")
    c.add_argument("--model", required=True)
    c.add_argument("--ctx", required=True, help="context token ids, comma-separated")
    c.add_argument("--cont", action="append", required=True, help="continuation token ids, comma-separated; repeatable")
    c.add_argument("--set", action="append", default=[])

    a = p.parse_args(argv)
    fn = {"greedy": cmd_greedy, "loglik": cmd_loglik, "check-step": cmd_check_step, "check-train": cmd_check_train, "suggest-clip": cmd_suggest_clip,
          "init": cmd_init, "debug-step": cmd_debug_step, "train": cmd_train,
          "check-int-group": cmd_check_int_group}[a.cmd]
    try:
        return fn(a)
    except (ValueError, OSError, KeyError, Unsupported) as e:
        print(f"twin.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
