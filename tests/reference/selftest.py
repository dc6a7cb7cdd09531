#!/usr/bin/python3
"""Self-tests of the PyTorch twin, independent of the C side.

  /usr/bin/python3 tests/reference/selftest.py [-v]

- safetensors_io: round trips (F32, F64, BF16, I32, metadata), BF16 rounding, header layout
- RoPE against the complex-number formulation, attention against a per-query numpy loop
- the whole model against a loop-based numpy implementation written from the spec text, for
  every preset (dense, MLA, CLA, GQA+CLA, CLLA and its share modes, CLLA-quant), F = 1..4 and
  layer counts F does not divide; parameter names/shapes against model/params.c's rules
- gradients against finite differences (torch.autograd.gradcheck) for mha/gqa/mqa, tied and
  untied; directional finite differences for the latent and shared presets
- GQA equals MHA with duplicated K/V heads; latent_kvproj equals latent with copied kv_b_proj
- a producer's payload gradient = sum of its readers' contributions = hand-built finite differences
- CLLA-quant: torch quantizer = numpy loop bit for bit, codes in range, error <= scale/2,
  straight-through gradient = unquantized gradient at the dequantized latent
- config validation as model/config.c, preset defaults
- training replay: lr schedule, data cursor, AdamW against a numpy AdamW, micro-batch accumulation
- the CLI end to end (the twin standing in for the C binary): matching dumps pass, perturbed,
  incomplete or extra ones fail
Exit 0 when every check passes.
"""
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io as st  # noqa: E402
import twin  # noqa: E402

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)   # tiny tensors: threads only add overhead
VERBOSE = "-v" in sys.argv
RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok)))
    print(f"  {'ok  ' if ok else 'FAIL'} {name}{'  ' + detail if detail else ''}")


def tiny_cfg(attention="gqa", nh=4, nkv=2, tied=False, **kw):
    d = {"attention": attention, "vocab_size": 13, "hidden_size": 8, "num_hidden_layers": 2,
         "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": 4, "v_head_dim": 4,
         "intermediate_size": 12, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": tied}
    d.update(kw)
    return d


def make_model(cfgd, seed=0, std=0.3):
    m = twin.build_model(twin.ModelConfig(cfgd))
    twin.init_random(m, seed, std=std)
    return m


# ----------------------------------------------------------------------------- safetensors

def test_safetensors():
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "a.safetensors")
        ts = {"w32": rng.standard_normal((3, 5)).astype(np.float32), "w64": rng.standard_normal(7),
              "i": np.arange(6, dtype=np.int32).reshape(2, 3), "scalar": np.array(2.5, dtype=np.float32),
              "empty": np.zeros((0, 4), dtype=np.float32)}
        st.write(p, ts, metadata={"format": "pt"})
        back, meta = st.read(p)
        ok = all(np.array_equal(back[k], ts[k]) and back[k].dtype == ts[k].dtype and back[k].shape == ts[k].shape
                 for k in ts)
        check("safetensors: F32/F64/I32/scalar/empty round trip", ok and meta == {"format": "pt"})
        raw = open(p, "rb").read()
        n = int.from_bytes(raw[:8], "little")
        check("safetensors: data section 8-byte aligned, header is JSON",
              n % 8 == 0 and isinstance(json.loads(raw[8:8 + n]), dict))
        # BF16: exactly representable values survive, others round to nearest even
        x = np.array([1.0, -2.5, 0.15625, 3.0e38, 1.00390625, 1.01171875, np.inf], dtype=np.float32)
        st.write(p, {"b": x}, dtype="BF16")
        b, _ = st.read(p)
        expect = np.array([1.0, -2.5, 0.15625, 226 * 2.0 ** 120, 1.0, 1.015625, np.inf], dtype=np.float32)
        check("safetensors: BF16 write/read with round-to-nearest-even", np.array_equal(b["b"], expect),
              "" if np.array_equal(b["b"], expect) else f"{b['b'].tolist()} vs {expect.tolist()}")
        check("safetensors: stored dtypes", st.read_dtypes(p) == {"b": "BF16"})
        # a corrupt header is an error
        with open(p, "wb") as f:
            f.write((100).to_bytes(8, "little") + b"{}")
        try:
            st.read(p)
            check("safetensors: truncated header rejected", False)
        except st.SafetensorsError:
            check("safetensors: truncated header rejected", True)


# ----------------------------------------------------------------------------- ops

def test_rope():
    rng = np.random.default_rng(1)
    B, T, H, D, theta = 2, 9, 3, 8, 500.0
    x = rng.standard_normal((B, T, H, D))
    cos, sin = twin.rope_tables(T, D, theta)
    y = twin.apply_rope(torch.from_numpy(x), cos, sin).numpy()
    # complex form: z_i = x[i] + j x[i+D/2] rotated by exp(j t theta^(-2i/D))
    h = D // 2
    z = x[..., :h] + 1j * x[..., h:]
    ang = np.arange(T)[:, None] * theta ** (-2.0 * np.arange(h) / D)
    zr = z * np.exp(1j * ang)[None, :, None, :]
    ref = np.concatenate([zr.real, zr.imag], axis=-1)
    check("rope: rotate-half form equals complex rotation", np.max(np.abs(y - ref)) < 1e-13,
          f"max diff {np.max(np.abs(y - ref)):.1e}")
    # relative-position property: <rope(q,t), rope(k,s)> depends only on t-s
    q = rng.standard_normal(D)
    k = rng.standard_normal(D)
    cos, sin = twin.rope_tables(12, D, theta)
    rq = twin.apply_rope(torch.from_numpy(np.tile(q, (1, 12, 1, 1))), cos, sin)[0, :, 0]
    rk = twin.apply_rope(torch.from_numpy(np.tile(k, (1, 12, 1, 1))), cos, sin)[0, :, 0]
    d1 = float(rq[7] @ rk[4])
    d2 = float(rq[5] @ rk[2])
    check("rope: scores depend on relative position only", abs(d1 - d2) < 1e-12)


def np_attention(q, k, v, scale):
    B, T, NH, _ = q.shape
    NKV, DV = k.shape[2], v.shape[3]
    out = np.zeros((B, T, NH, DV))
    for b in range(B):
        for h in range(NH):
            kh = h // (NH // NKV)
            for t in range(T):
                s = np.array([q[b, t, h] @ k[b, u, kh] for u in range(t + 1)]) * scale
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, t, h] = sum(p[u] * v[b, u, kh] for u in range(t + 1))
    return out.reshape(B, T, NH * DV)


def test_attention():
    rng = np.random.default_rng(2)
    for nh, nkv in ((4, 4), (4, 2), (4, 1), (6, 3)):
        B, T, D, DV = 2, 7, 5, 3
        q, k, v = rng.standard_normal((B, T, nh, D)), rng.standard_normal((B, T, nkv, D)), rng.standard_normal((B, T, nkv, DV))
        y = twin.causal_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), 0.37).numpy()
        ref = np_attention(q, k, v, 0.37)
        check(f"attention NH={nh} NKV={nkv}: equals per-query loop", np.max(np.abs(y - ref)) < 1e-13,
              f"max diff {np.max(np.abs(y - ref)):.1e}")


# ----------------------------------------------------------------------------- whole model

def np_rope(x, dim, theta):
    """x (B, T, H, dim): pair (i, i + dim/2) turned by t * theta^(-2i/dim), loops over t and i."""
    T = x.shape[1]
    y = np.empty_like(x)
    for t in range(T):
        for i in range(dim // 2):
            f = theta ** (-2.0 * i / dim)
            cs, sn = math.cos(t * f), math.sin(t * f)
            y[:, t, :, i] = x[:, t, :, i] * cs - x[:, t, :, i + dim // 2] * sn
            y[:, t, :, i + dim // 2] = x[:, t, :, i + dim // 2] * cs + x[:, t, :, i] * sn
    return y


def np_bf16_round_up(s):
    """Smallest bf16 >= s (np.float32 scalar >= 0), via the bit pattern."""
    u = int(np.array([s], dtype=np.float32).view(np.uint32)[0])
    if u & 0xFFFF:
        u = (u & 0xFFFF0000) + 0x10000
    return np.array([u], dtype=np.uint32).view(np.float32)[0]


def np_int_group(x32, bits, group):
    """The CLLA-quant round trip written as loops over tokens, groups and elements with numpy
    float32 scalars (independent of twin.int_group_quantize). Returns (values, codes, scales)."""
    imax = 2 ** (bits - 1) - 1
    flat = np.asarray(x32, dtype=np.float32).reshape(-1, x32.shape[-1])
    out = np.zeros_like(flat)
    G = flat.shape[1] // group
    codes = np.zeros((flat.shape[0], G, group), dtype=np.int64)
    scales = np.zeros((flat.shape[0], G), dtype=np.float32)
    for n in range(flat.shape[0]):
        for g in range(G):
            xs = flat[n, g * group:(g + 1) * group]
            absmax = np.float32(0)
            for v in xs:
                absmax = max(absmax, np.float32(abs(v)))
            scale = np_bf16_round_up(np.float32(absmax / np.float32(imax))) if absmax > 0 else np.float32(0)
            scales[n, g] = scale
            for j, v in enumerate(xs):
                q = 0 if scale == 0 else int(min(max(np.rint(np.float32(v / scale)), -imax), imax))
                codes[n, g, j] = q
                out[n, g * group + j] = np.float32(np.float32(q) * scale)
    shape = tuple(x32.shape)
    return out.reshape(shape), codes.reshape(shape[:-1] + (G, group)), scales.reshape(shape[:-1] + (G,))


def np_model(W, c, ids, targets):
    """The spec, written out with loops and numpy, from the raw weight dict: plain attention
    (MHA/GQA/MQA, CLA sharing of post-RoPE K and V) and latent attention (MLA/CLLA: query
    LoRA, latent + decoupled rope key, the four share modes, the int_group quantizer). Every
    knob must be given explicitly in c (no preset defaults here)."""
    L = c["num_hidden_layers"]
    NH, D, DV = c["num_attention_heads"], c["head_dim"], c["v_head_dim"]
    NKV = c.get("num_key_value_heads", NH)
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    R, DR, Rq = c.get("kv_lora_rank", 0), c.get("qk_rope_head_dim", 0), c.get("q_lora_rank", 0)
    F, share = c.get("share_factor", 1), c.get("share", "kv")
    bits, group = c.get("latent_quant_bits", 0), c.get("latent_quant_group", 32)
    B, T = ids.shape

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    slots = {}
    x = W["model.embed_tokens.weight"][ids]
    for l in range(L):
        pre = f"model.layers.{l}."
        a = pre + "self_attn."
        h = rms(x, W[pre + "input_layernorm.weight"])
        producer, slot = l % F == 0, l // F
        if R > 0:
            if Rq > 0:
                q = rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"]) @ W[a + "q_b_proj.weight"].T
            else:
                q = h @ W[a + "q_proj.weight"].T
            q = q.reshape(B, T, NH, D + DR)
            q = np.concatenate([q[..., :D], np_rope(q[..., D:], DR, theta)], axis=-1)
            if producer:
                kv_a = h @ W[a + "kv_a_proj_with_mqa.weight"].T
                lat = rms(kv_a[..., :R], W[a + "kv_a_layernorm.weight"])
                if bits:
                    lat = np_int_group(lat.astype(np.float32), bits, group)[0].astype(np.float64)
                slots[slot] = (lat, np_rope(kv_a[..., R:].reshape(B, T, 1, DR), DR, theta))
            lat, kr = slots[slot]
            if not producer and share in ("latent", "latent_kvproj"):
                kr = np_rope((h @ W[a + "k_rope_proj.weight"].T).reshape(B, T, 1, DR), DR, theta)
            owner = l - l % F if (not producer and share == "latent_kvproj") else l
            kv = (lat @ W[f"model.layers.{owner}.self_attn.kv_b_proj.weight"].T).reshape(B, T, NH, D + DV)
            k = np.concatenate([kv[..., :D], np.broadcast_to(kr, (B, T, NH, DR))], axis=-1)
            v = kv[..., D:]
            att = np_attention(q, k, v, 1 / math.sqrt(D + DR))
        else:
            q = np_rope((h @ W[a + "q_proj.weight"].T).reshape(B, T, NH, D), D, theta)
            if producer:
                slots[slot] = (np_rope((h @ W[a + "k_proj.weight"].T).reshape(B, T, NKV, D), D, theta),
                               (h @ W[a + "v_proj.weight"].T).reshape(B, T, NKV, DV))
            k, v = slots[slot]
            att = np_attention(q, k, v, 1 / math.sqrt(D))
        x = x + att @ W[a + "o_proj.weight"].T
        h2 = rms(x, W[pre + "post_attention_layernorm.weight"])
        g = h2 @ W[pre + "mlp.gate_proj.weight"].T
        u = h2 @ W[pre + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[pre + "mlp.down_proj.weight"].T
    h = rms(x, W["model.norm.weight"])
    out_w = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    logits = h @ out_w.T
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    loss = np.mean(lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0])
    return logits, loss


def expected_params(c):
    """name -> shape, from the presence rules of model/params.c (producers own what they share,
    consumers only what they keep). Every knob explicit in c."""
    C, NH, D, DV, I = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["v_head_dim"], c["intermediate_size"]
    NKV = c.get("num_key_value_heads", NH)
    R, DR, Rq = c.get("kv_lora_rank", 0), c.get("qk_rope_head_dim", 0), c.get("q_lora_rank", 0)
    F, share = c.get("share_factor", 1), c.get("share", "kv")
    P = {"model.embed_tokens.weight": (c["vocab_size"], C), "model.norm.weight": (C,)}
    for l in range(c["num_hidden_layers"]):
        pre, a = f"model.layers.{l}.", f"model.layers.{l}.self_attn."
        prod = l % F == 0
        P[pre + "input_layernorm.weight"] = (C,)
        P[pre + "post_attention_layernorm.weight"] = (C,)
        P[pre + "mlp.gate_proj.weight"] = (I, C)
        P[pre + "mlp.up_proj.weight"] = (I, C)
        P[pre + "mlp.down_proj.weight"] = (C, I)
        P[a + "o_proj.weight"] = (C, NH * DV)
        if R > 0:
            if Rq > 0:
                P[a + "q_a_proj.weight"] = (Rq, C)
                P[a + "q_a_layernorm.weight"] = (Rq,)
                P[a + "q_b_proj.weight"] = (NH * (D + DR), Rq)
            else:
                P[a + "q_proj.weight"] = (NH * (D + DR), C)
            if prod:
                P[a + "kv_a_proj_with_mqa.weight"] = (R + DR, C)
                P[a + "kv_a_layernorm.weight"] = (R,)
            elif share in ("latent", "latent_kvproj"):
                P[a + "k_rope_proj.weight"] = (DR, C)
            if prod or share != "latent_kvproj":
                P[a + "kv_b_proj.weight"] = (NH * (D + DV), R)
        else:
            P[a + "q_proj.weight"] = (NH * D, C)
            if prod:
                P[a + "k_proj.weight"] = (NKV * D, C)
                P[a + "v_proj.weight"] = (NKV * DV, C)
    if not c["tie_word_embeddings"]:
        P["lm_head.weight"] = (c["vocab_size"], C)
    return P


def expected_names(c):
    return sorted(expected_params(c))


def test_model():
    rng = np.random.default_rng(3)
    for att, nh, nkv in (("mha", 4, 4), ("gqa", 4, 2), ("mqa", 4, 1)):
        for tied in (False, True):
            c = tiny_cfg(att, nh, nkv, tied, rope_theta=100.0)
            m = make_model(c, seed=5)
            names = sorted(n for n, _ in m.named_parameters())
            shapes_ok = names == expected_names(c)
            ids = rng.integers(0, c["vocab_size"], (2, 6))
            tg = rng.integers(0, c["vocab_size"], (2, 6))
            logits, loss = m(torch.from_numpy(ids), torch.from_numpy(tg))
            W = {n: p.detach().numpy() for n, p in m.named_parameters()}
            rl, rloss = np_model(W, c, ids, tg)
            e = np.max(np.abs(logits.detach().numpy() - rl)) / np.max(np.abs(rl))
            check(f"model {att} tied={tied}: names, logits and loss equal the numpy loop model",
                  shapes_ok and e < 1e-12 and abs(loss.item() - rloss) < 1e-12 * abs(rloss),
                  f"logits rel {e:.1e}, loss {loss.item():.12f} vs {rloss:.12f}")


def test_gradcheck():
    from torch.nn.utils.stateless import functional_call
    rng = np.random.default_rng(4)
    for att, nh, nkv, tied in (("mha", 2, 2, True), ("gqa", 4, 2, False), ("mqa", 4, 1, True), ("mqa", 2, 1, False)):
        c = tiny_cfg(att, nh, nkv, tied, vocab_size=7, hidden_size=6, head_dim=4, v_head_dim=4, intermediate_size=5)
        m = make_model(c, seed=7, std=0.5)
        names = [n for n, _ in m.named_parameters()]
        params = tuple(p.detach().clone().requires_grad_(True) for _, p in m.named_parameters())
        ids = torch.from_numpy(rng.integers(0, 7, (2, 5)))
        tg = torch.from_numpy(rng.integers(0, 7, (2, 5)))

        def f(*ps):
            return functional_call(m, dict(zip(names, ps)), (ids, tg))[1]

        ok = torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=False)
        n_in = sum(p.numel() for p in params)
        check(f"gradcheck {att} NH={nh} NKV={nkv} tied={tied}: loss gradient of all {n_in} weights", ok)
        # and through the logits (random projection), gradient of every weight
        proj = torch.from_numpy(rng.standard_normal((2, 5, 7)))

        def g(*ps):
            return (functional_call(m, dict(zip(names, ps)), (ids,))[0] * proj).sum()

        ok = torch.autograd.gradcheck(g, params, eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=False)
        check(f"gradcheck {att} NH={nh} NKV={nkv} tied={tied}: logits projection", ok)


# ----------------------------------------------------------------------------- latent and shared attention

def full_cfg(attention, L=3, F=1, share="kv", nh=2, nkv=None, R=0, DR=0, Rq=0, bits=0, group=4, tied=False, **kw):
    """A config with every attention knob explicit (the numpy model reads no preset defaults)."""
    d = tiny_cfg(attention, nh, nkv if nkv is not None else nh, tied, num_hidden_layers=L, head_dim=4, v_head_dim=3,
                 rope_theta=100.0, kv_lora_rank=R, qk_rope_head_dim=DR, q_lora_rank=Rq, share_factor=F, share=share,
                 latent_quant_bits=bits, latent_quant_group=group)
    d.update(kw)
    return d


def lat_cfg(attention, L, F, share, Rq=0, bits=0, tied=False, **kw):
    return full_cfg(attention, L, F, share, R=8, DR=4, Rq=Rq, bits=bits, tied=tied, **kw)


# every preset of the design space, with F = 1..4, layer counts F does not divide, query LoRA on/off
SPACE_CASES = [
    ("mla L=2", lat_cfg("mla", 2, 1, "latent")),
    ("mla Rq=6 tied", lat_cfg("mla", 2, 1, "latent", Rq=6, tied=True)),
    ("cla F=2 L=3", full_cfg("cla", 3, 2)),
    ("cla F=3 L=5 tied", full_cfg("cla", 5, 3, tied=True)),
    ("gqa_cla F=2 L=4 NKV=2 NH=4", full_cfg("gqa_cla", 4, 2, nh=4, nkv=2)),
    ("gqa_cla F=4 L=5 NKV=1 NH=4", full_cfg("gqa_cla", 5, 4, nh=4, nkv=1)),
    ("clla F=2 L=3", lat_cfg("clla", 3, 2, "latent")),
    ("clla F=3 L=4 Rq=6 tied", lat_cfg("clla", 4, 3, "latent", Rq=6, tied=True)),
    ("clla_share_krope F=2 L=3 Rq=6", lat_cfg("clla_share_krope", 3, 2, "latent_krope", Rq=6)),
    ("clla_share_krope F=4 L=6", lat_cfg("clla_share_krope", 6, 4, "latent_krope")),
    ("clla_share_kvproj F=2 L=3", lat_cfg("clla_share_kvproj", 3, 2, "latent_kvproj")),
    ("clla_share_kvproj F=3 L=5 Rq=6", lat_cfg("clla_share_kvproj", 5, 3, "latent_kvproj", Rq=6)),
    ("clla_quant F=2 L=3 b=4", lat_cfg("clla_quant", 3, 2, "latent", bits=4)),
    ("clla_quant F=4 L=5 b=3 g=8 Rq=6", lat_cfg("clla_quant", 5, 4, "latent", Rq=6, bits=3, latent_quant_group=8)),
    ("clla_quant_share_kvproj F=2 L=3 b=4", lat_cfg("clla_quant_share_kvproj", 3, 2, "latent_kvproj", bits=4, tied=True)),
    ("clla_quant_share_kvproj F=3 L=4 b=8 Rq=6", lat_cfg("clla_quant_share_kvproj", 4, 3, "latent_kvproj", Rq=6, bits=8)),
]


def test_space_model():
    """Every preset: parameter names and shapes follow model/params.c's presence rules; logits
    and loss equal the loop-based numpy model."""
    rng = np.random.default_rng(13)
    for name, c in SPACE_CASES:
        m = make_model(c, seed=21)
        got = {n: tuple(p.shape) for n, p in m.named_parameters()}
        exp = expected_params(c)
        ids = rng.integers(0, c["vocab_size"], (2, 6))
        tg = rng.integers(0, c["vocab_size"], (2, 6))
        logits, loss = m(torch.from_numpy(ids), torch.from_numpy(tg))
        W = {n: p.detach().numpy() for n, p in m.named_parameters()}
        rl, rloss = np_model(W, c, ids, tg)
        e = np.max(np.abs(logits.detach().numpy() - rl)) / np.max(np.abs(rl))
        diff = sorted(set(got.items()) ^ set(exp.items()))
        check(f"model {name}: names/shapes as params.c, logits and loss equal the numpy loop model",
              not diff and e < 1e-12 and abs(loss.item() - rloss) < 1e-12 * abs(rloss),
              f"logits rel {e:.1e}" + (f", name/shape mismatch {diff[:4]}" if diff else ""))


def test_space_gradcheck():
    """Autograd against central finite differences, per weight tensor along random directions
    (cheaper than a per-element gradcheck, which test_gradcheck runs for the dense presets), for
    latent and shared presets; not the quantized ones (their forward is piecewise constant in the
    latent: test_ste checks their straight-through gradient)."""
    rng = np.random.default_rng(14)
    small = dict(vocab_size=7, hidden_size=6, intermediate_size=5)
    for name, c in (("mla Rq=3", full_cfg("mla", 2, 1, "latent", R=4, DR=2, Rq=3, **small)),
                    ("cla F=2 L=3", full_cfg("cla", 3, 2, **small)),
                    ("gqa_cla F=3 L=4", full_cfg("gqa_cla", 4, 3, nh=4, nkv=2, **small)),
                    ("clla F=2 L=3 tied", full_cfg("clla", 3, 2, "latent", R=4, DR=2, tied=True, **small)),
                    ("clla_share_krope F=3 L=4 Rq=3", full_cfg("clla_share_krope", 4, 3, "latent_krope", R=4, DR=2, Rq=3, **small)),
                    ("clla_share_kvproj F=2 L=3", full_cfg("clla_share_kvproj", 3, 2, "latent_kvproj", R=4, DR=2, **small))):
        m = make_model(c, seed=8, std=0.5)
        ids = torch.from_numpy(rng.integers(0, 7, (2, 5)))
        tg = torch.from_numpy(rng.integers(0, 7, (2, 5)))
        proj = torch.from_numpy(rng.standard_normal((2, 5, 7)))
        worst, worst_name, n = 0.0, "", 0
        for what, fn in (("loss", lambda: m(ids, tg)[1]), ("logits", lambda: (m(ids)[0] * proj).sum())):
            m.zero_grad()
            fn().backward()
            g = torch.Generator().manual_seed(3)
            for pname, p in m.named_parameters():
                for _ in range(2):
                    u = torch.randn(p.shape, generator=g)
                    eps = 1e-6
                    with torch.no_grad():
                        p.add_(eps * u)
                        fp = fn().item()
                        p.sub_(2 * eps * u)
                        fm = fn().item()
                        p.add_(eps * u)
                    fd, ad = (fp - fm) / (2 * eps), float((p.grad * u).sum())
                    e = abs(fd - ad) / max(abs(ad), 1e-2 * float(p.grad.norm() * u.norm()), 1e-12)
                    n += 1
                    if e > worst:
                        worst, worst_name = e, f"{what} {pname}"
        check(f"finite differences {name}: {n} directional derivatives (loss and logits, every weight tensor)",
              worst < 1e-6, f"worst rel {worst:.1e} ({worst_name})")


def test_kvproj_equals_clla():
    """share = latent_kvproj is share = latent with every consumer's kv_b_proj equal to its
    producer's: same logits; and the producer's kv_b_proj gradient under kvproj is the sum of the
    kv_b_proj gradients of its group under latent."""
    c_k = lat_cfg("clla_share_kvproj", 5, 3, "latent_kvproj", Rq=6)
    c_l = lat_cfg("clla", 5, 3, "latent", Rq=6)
    mk = make_model(c_k, seed=31)
    ml = make_model(c_l, seed=1)
    W = {n: p.detach().clone().numpy() for n, p in mk.named_parameters()}
    for l in (1, 2, 4):
        W[f"model.layers.{l}.self_attn.kv_b_proj.weight"] = W[f"model.layers.{l - l % 3}.self_attn.kv_b_proj.weight"]
    twin.load_weights(ml, W)
    ids = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(2))
    tg = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(3))
    lk, lossk = mk(ids, tg)
    ll, lossl = ml(ids, tg)
    lossk.backward()
    lossl.backward()
    gk = dict(mk.named_parameters())
    gl = dict(ml.named_parameters())
    name = "model.layers.{}.self_attn.kv_b_proj.weight"
    e = max((gk[name.format(0)].grad - sum(gl[name.format(l)].grad for l in (0, 1, 2))).abs().max().item(),
            (gk[name.format(3)].grad - sum(gl[name.format(l)].grad for l in (3, 4))).abs().max().item())
    check("latent_kvproj equals latent with copied kv_b_proj; producer's kv_b gradient = sum over its group",
          torch.max(torch.abs(lk - ll)).item() < 1e-13 and e < 1e-13, f"grad diff {e:.1e}")


def test_slot_gradient_sum():
    """A producer's cached payload receives the sum of the gradients of every layer reading it
    (docs/DESIGN.md section 1), checked by hand-built finite differences: the slot's latent c (and, for
    CLA, K and V) is replaced by a free tensor; d loss / d c by central differences, along random
    directions and for single elements, must equal autograd's total, and the total must equal the
    sum of the per-reader contributions (each reader gets c + z_l with z_l = 0, z_l.grad is its
    share; also measured by differences perturbing only that reader's copy)."""
    cases = (("clla F=2 L=3 slot 0", lat_cfg("clla", 3, 2, "latent", Rq=6), 0, ("c",)),
             # quantized: no producer after the slot (a later producer's quantizer would make the true
             # derivative differ from the straight-through one); perturbing the stored (quantized) c
             ("clla_quant_share_kvproj F=3 L=3 slot 0", lat_cfg("clla_quant_share_kvproj", 3, 3, "latent_kvproj", bits=4), 0, ("c",)),
             ("clla_share_krope F=2 L=4 slot 1", lat_cfg("clla_share_krope", 4, 2, "latent_krope"), 1, ("c", "k_rope")),
             ("cla F=3 L=3 slot 0", full_cfg("cla", 3, 3), 0, ("k", "v")))
    for name, c, slot, parts in cases:
        m = make_model(c, seed=41, std=0.4)
        F = c["share_factor"]
        readers = [l for l in range(c["num_hidden_layers"]) if l // F == slot]
        ids = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(5))
        tg = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(6))
        base = {}

        def grab(sl, payload):
            if sl == slot:
                base.update({k: payload[k].detach().clone() for k in parts})
            return payload
        m.put_hook = grab
        m(ids, tg)
        for part in parts:
            x0 = base[part]

            def loss_at(x, per_reader=None):
                """loss with the slot's `part` replaced by x; per_reader: layer -> added tensor."""
                m.put_hook = lambda sl, p: dict(p, **{part: x}) if sl == slot else p
                m.read_hook = ((lambda l, sl, p: dict(p, **{part: p[part] + per_reader[l]}) if sl == slot else p)
                               if per_reader else None)
                try:
                    return m(ids, tg)[1]
                finally:
                    m.put_hook = m.read_hook = None

            x = x0.clone().requires_grad_(True)
            zs = {l: torch.zeros_like(x0, requires_grad=True) for l in readers}
            loss_at(x, zs).backward()
            total = x.grad
            contrib = {l: zs[l].grad for l in readers}
            split_err = (total - sum(contrib.values())).abs().max().item() / total.abs().max().item()
            # finite differences: random directions and single elements, total and per reader
            g = torch.Generator().manual_seed(7)
            eps = 1e-5
            fd_err = 0.0
            dirs = [torch.randn(x0.shape, generator=g) for _ in range(3)]
            for idx in ((0, 0), (1, 5), (0, 3)):
                u = torch.zeros_like(x0)
                u[idx + (0,) * (x0.dim() - 2)] = 1.0
                dirs.append(u)
            with torch.no_grad():
                for u in dirs:
                    fd = (loss_at(x0 + eps * u) - loss_at(x0 - eps * u)).item() / (2 * eps)
                    ad = float((total * u).sum())
                    fd_err = max(fd_err, abs(fd - ad) / max(abs(ad), 1e-3 * total.abs().max().item()))
                    for l in readers:
                        zp = {k: (eps * u if k == l else torch.zeros_like(x0)) for k in readers}
                        zm = {k: (-eps * u if k == l else torch.zeros_like(x0)) for k in readers}
                        fdl = (loss_at(x0, zp) - loss_at(x0, zm)).item() / (2 * eps)
                        adl = float((contrib[l] * u).sum())
                        fd_err = max(fd_err, abs(fdl - adl) / max(abs(adl), 1e-3 * total.abs().max().item()))
            shares = {l: contrib[l].abs().max().item() / total.abs().max().item() for l in readers}
            check(f"slot gradient {name} '{part}': total = sum over readers {readers} (rel {split_err:.1e}), "
                  f"= finite differences (rel {fd_err:.1e})",
                  split_err < 1e-12 and fd_err < 1e-6 and min(shares.values()) > 1e-3,
                  "reader shares (max-norm rel to total): " + " ".join(f"{l}:{v:.2f}" for l, v in shares.items()))


def test_quantizer():
    """The torch int_group (float32) against the numpy loop quantizer, bit for bit, on the edge
    cases (ties, bf16 scale boundaries, zero/tiny groups, bits 2..8); codes in [-Imax, Imax];
    |dequant - x| <= scale/2; round half to even; a zero group gives zeros."""
    check("torch.round is half-to-even (rintf)",
          torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5], dtype=torch.float32)).tolist() == [0, 2, 2, 0, -2])
    x = torch.tensor([1.0, 1.00390625, 1.0000001, 0.0, 3.0e-39], dtype=torch.float32)
    want = [1.0, 1.0078125, 1.0078125, 0.0, float(np_bf16_round_up(np.float32(3.0e-39)))]
    check("bf16_round_up: exact bf16 values stay, others go to the next bf16 up", twin.bf16_round_up(x).tolist() == want,
          f"{twin.bf16_round_up(x).tolist()}")
    n_vals = n_bad = 0
    range_ok = err_ok = True
    worst = 0.0
    for name, xa, bits, group in twin.int_group_cases(1):
        codes, scales = twin.int_group_quantize(torch.from_numpy(xa.copy()), bits, group)
        deq = twin.int_group_dequantize(codes, scales).numpy()
        ref, rcodes, rscales = np_int_group(xa, bits, group)
        n_vals += xa.size
        n_bad += int(np.sum(deq.view(np.uint32) != ref.view(np.uint32))) + int(np.sum(codes.numpy() != rcodes)) + \
            int(np.sum(scales.numpy().view(np.uint32) != rscales.view(np.uint32)))
        imax = twin.int_group_imax(bits)
        range_ok &= int(codes.abs().max()) <= imax
        err = np.abs(deq.astype(np.float64) - xa.astype(np.float64)).reshape(codes.shape)
        half = scales.numpy().astype(np.float64)[..., None] / 2
        err_ok &= bool(np.all(err <= half))
        live = half > 0
        worst = max(worst, float(np.max(np.where(live, err / np.where(live, half, 1), 0))))
        zero = scales.numpy() == 0
        err_ok &= bool(np.all(deq.reshape(codes.shape)[zero] == 0))
    check(f"int_group torch == numpy loop, bit for bit ({n_vals} values, codes, scales)", n_bad == 0, f"{n_bad} differ")
    check("int_group codes in [-Imax, Imax] for bits 2..8", range_ok)
    check("int_group |dequant - x| <= scale/2 everywhere, zero groups decode to 0", err_ok,
          f"max error {worst:.4f} x scale/2 (1 at exact ties)")


def test_ste():
    """CLLA-quant in a whole model: every code in [-Imax, Imax], |c_q - c| <= scale/2; the
    straight-through gradient (every weight and the latent) equals the gradient of the
    unquantized model evaluated at the dequantized latent (unquantized model + the constant
    offset dequant(c) - c at the latent); and it differs from the plain unquantized gradient."""
    for name, cq, cu in (("clla_quant F=2 L=3 b=4 g=4", lat_cfg("clla_quant", 3, 2, "latent", Rq=6, bits=4),
                          lat_cfg("clla", 3, 2, "latent", Rq=6)),
                         ("clla_quant_share_kvproj F=3 L=4 b=3 g=8", lat_cfg("clla_quant_share_kvproj", 4, 3, "latent_kvproj", bits=3,
                                                                               latent_quant_group=8),
                          lat_cfg("clla_share_kvproj", 4, 3, "latent_kvproj"))):
        mq = make_model(cq, seed=51)
        mu = make_model(cu, seed=0)
        twin.load_weights(mu, {n: p.detach().numpy() for n, p in mq.named_parameters()})
        ids = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(8))
        tg = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(9))
        lat_q = {}

        def keep_q(sl, p):
            p["c"].retain_grad()
            lat_q[sl] = p["c"]
            return p
        mq.put_hook = keep_q
        logits_q, loss_q = mq(ids, tg)
        loss_q.backward()
        mq.put_hook = None
        log = mq.last_quant_log
        imax = twin.int_group_imax(cq["latent_quant_bits"])
        in_range = all(int(r["codes"].abs().max()) <= imax for r in log)
        within = all(bool(((r["deq"].double() - r["x"].double()).abs().reshape(r["codes"].shape)
                           <= r["scales"].double().unsqueeze(-1) / 2).all()) for r in log)
        deq = {r["layer"] // cq["share_factor"]: r["deq"].double() for r in log}   # per slot
        lat_u = {}

        def shift(sl, p):
            c = p["c"] + (deq[sl] - p["c"]).detach()     # the unquantized graph, its value moved to dequant(c)
            c.retain_grad()
            lat_u[sl] = c
            return dict(p, c=c)
        mu.put_hook = shift
        logits_u, loss_u = mu(ids, tg)
        loss_u.backward()
        mu.put_hook = None
        gq = dict(mq.named_parameters())
        ge = max((gq[n].grad - p.grad).abs().max().item() / max(p.grad.abs().max().item(), 1e-30)
                 for n, p in mu.named_parameters())
        le = max((lat_q[s].grad - lat_u[s].grad).abs().max().item() for s in lat_q)
        fe = (logits_q - logits_u).abs().max().item()
        mu.zero_grad()
        _, loss_plain = mu(ids, tg)
        loss_plain.backward()
        gp = max((gq[n].grad - p.grad).abs().max().item() / p.grad.abs().max().item() for n, p in mu.named_parameters())
        check(f"quant {name}: codes in [-{imax}, {imax}], |c_q - c| <= scale/2 ({len(log)} producers)", in_range and within)
        check(f"quant {name}: straight-through gradient = unquantized gradient at the dequantized latent",
              ge < 1e-12 and le < 1e-14 and fe < 1e-13 and gp > 1e-4,
              f"weights rel {ge:.1e}, latent {le:.1e}, logits {fe:.1e}; vs the plain unquantized gradient rel {gp:.1e}")


def test_gqa_equals_mha():
    c_g = tiny_cfg("gqa", 4, 2, False)
    c_m = tiny_cfg("mha", 4, 4, False)
    g = make_model(c_g, seed=9)
    m = make_model(c_m, seed=1)
    W = {n: p.detach().clone() for n, p in g.named_parameters()}
    for l in range(2):
        for w in ("k_proj", "v_proj"):
            n = f"model.layers.{l}.self_attn.{w}.weight"
            D = 4
            heads = W[n].view(2, D, -1)
            W[n] = heads.repeat_interleave(2, dim=0).reshape(4 * D, -1)   # kv head j serves q heads 2j, 2j+1
    twin.load_weights(m, {k: v.numpy() for k, v in W.items()})
    ids = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(0))
    a, _ = g(ids)
    b, _ = m(ids)
    check("gqa equals mha with duplicated kv heads", torch.max(torch.abs(a - b)).item() < 1e-13)


def test_validation():
    """The config rules of model/config.c: what C rejects, the twin rejects (ValueError)."""
    L = dict(kv_lora_rank=8, qk_rope_head_dim=4)
    for bad, why in (({"num_key_value_heads": 3}, "must divide"), ({"attention": "nonsense"}, "unknown preset"),
                     ({"attention": "mla"}, "needs a latent model"),   # C's first failing rule: share=latent
                     ({"attention": "cla", **L}, "use preset mla or clla"),
                     ({"attention": "clla", "kv_lora_rank": 8}, "qk_rope_head_dim"),
                     ({"attention": "clla", "kv_lora_rank": 8, "qk_rope_head_dim": 3}, "qk_rope_head_dim"),
                     ({"attention": "clla", **L, "share": "kv"}, "share = kv"),
                     ({"attention": "cla", "share": "latent"}, "needs a latent model"),
                     ({"attention": "gqa", "latent_quant_bits": 4}, "latent_quant_bits needs"),
                     ({"attention": "clla_quant", **L, "latent_quant_group": 3}, "must divide kv_lora_rank"),
                     ({"attention": "clla_quant", **L, "latent_quant_bits": 9, "latent_quant_group": 4}, "2..8"),
                     ({"attention": "clla", **L, "share": "everything"}, "use one of"),
                     ({"attention": "cla", "share_factor": 0}, "share_factor"),
                     ({"attention": "mha", "num_key_value_heads": 2}, "use gqa")):
        att = bad.get("attention", "gqa")
        cfg = tiny_cfg(att, 4, 2 if att == "gqa" else 4)
        cfg.update({k: v for k, v in bad.items() if k != "attention"})
        try:
            twin.ModelConfig(cfg)
            check(f"rejects {bad}", False)
        except ValueError as e:
            check(f"rejects {bad} ({why})", why in str(e), str(e))
    # preset defaults as model/config.c applies them, explicit keys overriding
    m = twin.ModelConfig({k: v for k, v in tiny_cfg("clla_quant", kv_lora_rank=64, qk_rope_head_dim=4).items()})
    check("preset clla_quant: F=2, share=latent, 4 bits, group 32",
          (m.share_factor, m.share, m.latent_quant_bits, m.latent_quant_group) == (2, "latent", 4, 32))
    m = twin.ModelConfig(tiny_cfg("clla_share_kvproj", kv_lora_rank=8, qk_rope_head_dim=4, share_factor=3))
    check("preset clla_share_kvproj with share_factor 3: F=3, share=latent_kvproj",
          (m.share_factor, m.share, m.latent_quant_bits) == (3, "latent_kvproj", 0))
    d = tiny_cfg("mqa")
    del d["num_key_value_heads"], d["head_dim"], d["v_head_dim"]
    m = twin.ModelConfig(d)
    check("mqa defaults: one kv head, head_dim = hidden/heads, v_head_dim = head_dim",
          (m.num_key_value_heads, m.head_dim, m.v_head_dim) == (1, 2, 2))
    # zero-valued knobs of other families are accepted (dense configs written with every key)
    twin.ModelConfig(tiny_cfg(kv_lora_rank=0, q_lora_rank=0, share_factor=1, share="kv", n_routed_experts=0,
                              num_experts_per_tok=2, latent_quant_bits=0, latent_quant_group=32))
    check("accepts a dense config with every other knob at 0", True)


# ----------------------------------------------------------------------------- training

TRAIN = {"seq_len": 4, "micro_batch": 2, "global_batch_tokens": 16, "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 2,
         "max_steps": 6, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 0.0}


def test_schedule_and_cursor():
    tc = twin.TrainConfig(TRAIN)
    lrs = [tc.lr_at(s) for s in range(6)]
    exp = [5e-3, 1e-2, 1e-2, 1e-3 + 0.5 * 9e-3 * (1 + math.cos(math.pi / 4)), 1e-3 + 0.5 * 9e-3, 1e-3 + 0.5 * 9e-3 * (1 + math.cos(3 * math.pi / 4))]
    check("lr schedule: warmup then cosine", np.allclose(lrs, exp, rtol=1e-15, atol=0), f"{lrs}")
    toks = np.arange(20)
    cur = twin.TokenCursor(toks, 2, 4)
    starts = []
    for _ in range(4):
        x, y = cur.next()
        starts.append(int(x[0, 0]))
        assert torch.equal(y, x + 1) and int(x[1, 0]) == int(x[0, 0]) + 4
    check("data cursor: consecutive windows, wraps when fewer than B*T+1 remain", starts == [0, 8, 0, 8], f"{starts}")


def test_train_replay():
    c = tiny_cfg("gqa", 4, 2, False)
    toks = np.random.default_rng(5).integers(0, 13, 45)
    # 1) AdamW + clip replay against a numpy re-implementation driven by the same gradients
    for clip in (0.0, 0.05):
        tc = twin.TrainConfig(dict(TRAIN, grad_clip=clip))
        m = make_model(c, seed=11)
        W0 = {n: p.detach().numpy().copy() for n, p in m.named_parameters()}
        # gradients for the numpy optimizer come from a second model copy, whose weights numpy sets
        m2 = make_model(c, seed=11)
        recs = twin.train_replay(m, tc, toks)
        W = W0
        # a step's rows read at once, as clla train reads them (a wrap between steps only)
        cur = twin.TokenCursor(toks, tc.micro_batch * tc.n_micro, tc.seq_len)
        ok = True
        for s in range(tc.max_steps):
            twin.load_weights(m2, W)
            m2.zero_grad()
            loss_sum = 0.0
            xs, ys = cur.next()
            for k in range(tc.n_micro):
                x, y = xs[k * tc.micro_batch:(k + 1) * tc.micro_batch], ys[k * tc.micro_batch:(k + 1) * tc.micro_batch]
                _, loss = m2(x, y)
                (loss / tc.n_micro).backward()
                loss_sum += loss.item()
            g = {n: p.grad.numpy().copy() for n, p in m2.named_parameters()}
            norm = math.sqrt(sum(float((x ** 2).sum()) for x in g.values()))
            if clip > 0 and norm > clip:
                g = {k: x * clip / (norm + 1e-6) for k, x in g.items()}
            ok &= abs(recs[s]["loss"] - loss_sum / tc.n_micro) < 1e-12 and abs(recs[s]["grad_norm"] - norm) < 1e-12 * norm
            W = _np_adamw_continue(W, g, s, tc)
        Wt = {n: p.detach().numpy() for n, p in m.named_parameters()}
        err = max(np.max(np.abs(Wt[k] - W[k])) for k in W)
        nclip = sum(r["clipped"] for r in recs)
        check(f"train replay clip={clip}: loss, grad_norm and AdamW weights equal a numpy AdamW ({nclip} clipped)",
              ok and err < 1e-12 and (clip == 0 or nclip > 0), f"max weight diff {err:.1e}")
    # 2) two micro-batches of B=2 give the same step as one micro-batch of B=4 (equal sizes)
    m_a, m_b = make_model(c, seed=12), make_model(c, seed=12)
    ra = twin.train_replay(m_a, twin.TrainConfig(dict(TRAIN, micro_batch=2, global_batch_tokens=16, max_steps=1)), toks)
    rb = twin.train_replay(m_b, twin.TrainConfig(dict(TRAIN, micro_batch=4, global_batch_tokens=16, max_steps=1)), toks)
    diff = max(torch.max(torch.abs(p - q)).item() for p, q in zip(m_a.parameters(), m_b.parameters()))
    check("gradient accumulation: 2 x B=2 equals 1 x B=4", abs(ra[0]["loss"] - rb[0]["loss"]) < 1e-13 and diff < 1e-15,
          f"loss {ra[0]['loss']} vs {rb[0]['loss']}, weight diff {diff:.1e}")


_ADAM_STATE = {}


def _np_adamw_continue(W, g, s, tc):
    """One numpy AdamW step at 0-based step s, keeping moments in _ADAM_STATE between calls."""
    st_ = _ADAM_STATE
    if s == 0 or not st_:
        st_.clear()
        st_.update(m={k: np.zeros_like(x) for k, x in W.items()}, v={k: np.zeros_like(x) for k, x in W.items()})
    lr = tc.lr_at(s)
    t = s + 1
    W = {k: x.copy() for k, x in W.items()}
    for k in W:
        wd = tc.weight_decay if W[k].ndim >= 2 else 0.0
        W[k] *= 1 - lr * wd
        st_["m"][k] = tc.beta1 * st_["m"][k] + (1 - tc.beta1) * g[k]
        st_["v"][k] = tc.beta2 * st_["v"][k] + (1 - tc.beta2) * g[k] ** 2
        W[k] -= lr * (st_["m"][k] / (1 - tc.beta1 ** t)) / (np.sqrt(st_["v"][k] / (1 - tc.beta2 ** t)) + tc.eps)
    return W


# ----------------------------------------------------------------------------- CLI end to end

def run_twin(*args):
    buf = io.StringIO()
    with redirect_stdout(buf), redirect_stderr(buf):
        rc = twin.main(list(args))
    if VERBOSE:
        print(buf.getvalue())
    return rc, buf.getvalue()


def test_cli():
    with tempfile.TemporaryDirectory() as d:
        cfg = tiny_cfg("gqa", 4, 2, False)
        cfg["train"] = dict(TRAIN, max_steps=4, grad_clip=0.0, seed=3, global_batch_tokens=16)
        cp = os.path.join(d, "cfg.json")
        json.dump(cfg, open(cp, "w"))
        tok = os.path.join(d, "tokens.u32")
        np.random.default_rng(6).integers(0, 13, 40).astype("<u4").tofile(tok)
        md = os.path.join(d, "model")
        run_twin("init", "--config", cp, "--out", md)
        dump = os.path.join(d, "dump.safetensors")
        run_twin("debug-step", "--model", md, "--tokens", tok, "--batch", "2", "--seq", "4", "--out", dump)
        rc, out = run_twin("check-step", "--model", md, "--tokens", tok, "--batch", "2", "--seq", "4", "--dump", dump)
        check("cli: check-step passes on an F32 dump of the same model", rc == 0, out.strip().splitlines()[-1])
        D, meta = st.read(dump)
        for what, mutate in (
                ("a gradient off by 1e-3 (relative)", lambda t: t.__setitem__("grad.model.layers.1.mlp.up_proj.weight",
                    t["grad.model.layers.1.mlp.up_proj.weight"] * (1 + 1e-3))),
                ("one logit perturbed", lambda t: t["logits"].__setitem__((1, 2, 3), t["logits"][1, 2, 3] + 1e-3 * np.abs(t["logits"]).max())),
                ("the loss off by 1e-3", lambda t: t.__setitem__("loss", t["loss"] * 1.001)),
                ("a missing gradient", lambda t: t.pop("grad.model.norm.weight")),
                ("an extra gradient", lambda t: t.__setitem__("grad.model.layers.9.x.weight", np.zeros(3, np.float32))),
                ("a transposed gradient", lambda t: t.__setitem__("grad.lm_head.weight", np.ascontiguousarray(t["grad.lm_head.weight"].T))),
                ("a NaN in a gradient", lambda t: t["grad.model.embed_tokens.weight"].__setitem__((0, 0), np.nan))):
            T = {k: v.copy() for k, v in D.items()}
            mutate(T)
            bad = os.path.join(d, "bad.safetensors")
            st.write(bad, T)
            rc, out = run_twin("check-step", "--model", md, "--tokens", tok, "--batch", "2", "--seq", "4", "--dump", bad)
            check(f"cli: check-step fails on {what}", rc != 0)
        # train + check-train, with clipping that triggers
        rc, out = run_twin("suggest-clip", "--model", md, "--tokens", tok)
        sets = ["--set", f"train.grad_clip={float(out.strip().splitlines()[-1])}"]
        od = os.path.join(d, "run")
        run_twin("train", "--config", os.path.join(md, "config.json"), "--set", f"train.init_from={md}/model.safetensors",
                 "--set", f"train.data={tok}", "--set", f"train.out_dir={od}", *sets)
        met = os.path.join(od, "metrics.jsonl")
        rc, out = run_twin("check-train", "--model", md, "--tokens", tok, "--metrics", met, "--require-clip", *sets)
        check("cli: check-train passes on the same replay, clipping triggered", rc == 0, out.strip().splitlines()[-1])
        rc, out = run_twin("check-train", "--model", md, "--tokens", tok, "--metrics", met, "--require-clip")
        check("cli: check-train fails when the clip setting differs", rc != 0)
        lines = open(met).read().splitlines()
        for what, edit in (("loss", lambda r: r.update(loss=r["loss"] * (1 + 3e-4))),
                           ("grad_norm", lambda r: r.update(grad_norm=r["grad_norm"] * (1 - 3e-4))),
                           ("lr", lambda r: r.update(lr=r["lr"] * (1 + 1e-5)))):
            recs = [json.loads(x) for x in lines]
            edit(recs[2])
            open(met, "w").write("\n".join(json.dumps(r) for r in recs) + "\n")
            rc, _ = run_twin("check-train", "--model", md, "--tokens", tok, "--metrics", met, *sets)
            check(f"cli: check-train fails on a step-3 {what} off by more than its tolerance", rc != 0)
        open(met, "w").write("\n".join(lines[:3]) + "\n")
        rc, _ = run_twin("check-train", "--model", md, "--tokens", tok, "--metrics", met, *sets)
        check("cli: check-train fails when a step is missing", rc != 0)
        # a latent, shared, quantized preset through the same commands
        cfg = lat_cfg("clla_quant_share_kvproj", 3, 2, "latent_kvproj", Rq=6, bits=4)
        cfg["train"] = dict(TRAIN, max_steps=4, grad_clip=0.0, seed=3, global_batch_tokens=16)
        json.dump(cfg, open(cp, "w"))
        md = os.path.join(d, "model_latent")
        run_twin("init", "--config", cp, "--out", md)
        run_twin("debug-step", "--model", md, "--tokens", tok, "--batch", "2", "--seq", "4", "--out", dump)
        rc, out = run_twin("check-step", "--model", md, "--tokens", tok, "--batch", "2", "--seq", "4", "--dump", dump)
        check("cli: check-step passes on clla_quant_share_kvproj (F=2, L=3, query LoRA)",
              rc == 0 and "int_group layer 2" in out, out.strip().splitlines()[-1])
        D, _ = st.read(dump)
        D["grad.model.layers.0.self_attn.kv_b_proj.weight"] *= 1 + 1e-3
        st.write(os.path.join(d, "bad.safetensors"), D)
        rc, out = run_twin("check-step", "--model", md, "--tokens", tok, "--batch", "2", "--seq", "4", "--dump",
                           os.path.join(d, "bad.safetensors"))
        check("cli: check-step fails on the shared kv_b_proj gradient off by 1e-3", rc != 0)
        # the script runs as a program under /usr/bin/python3
        r = subprocess.run([sys.executable, os.path.join(HERE, "twin.py"), "--help"], capture_output=True, text=True)
        check("cli: twin.py --help", r.returncode == 0 and "check-step" in r.stdout)


def main():
    for t in (test_safetensors, test_rope, test_attention, test_model, test_gradcheck, test_gqa_equals_mha,
              test_space_model, test_space_gradcheck, test_kvproj_equals_clla, test_slot_gradient_sum, test_quantizer,
              test_ste, test_validation, test_schedule_and_cursor, test_train_replay, test_cli):
        t0 = time.time()
        print(t.__name__)
        t()
        if VERBOSE:
            print(f"  ({time.time() - t0:.1f} s)")
    failed = [n for n, ok in RESULTS if not ok]
    print(f"selftest: {len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
