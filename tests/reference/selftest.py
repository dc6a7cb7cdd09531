#!/usr/bin/python3
"""Self-tests of the PyTorch twin, independent of the C side.

  /usr/bin/python3 tests/reference/selftest.py [-v]

- safetensors_io: round trips (F32, F64, BF16, I32, metadata), BF16 rounding, header layout
- RoPE against the complex-number formulation, attention against a per-query numpy loop
- the whole model against a loop-based numpy implementation written from the spec text
- gradients against finite differences (torch.autograd.gradcheck) for mha/gqa/mqa, tied and untied
- GQA equals MHA with duplicated K/V heads
- refusal of configs the twin does not implement
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
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io as st  # noqa: E402
import twin  # noqa: E402

torch.set_default_dtype(torch.float64)
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

def np_model(W, c, ids, targets):
    """The spec, written out with loops and numpy, from the raw weight dict."""
    V, C, L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
    NH, NKV, D, DV = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["v_head_dim"]
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    B, T = ids.shape

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x):  # (B,T,H,D)
        y = np.empty_like(x)
        for t in range(T):
            for i in range(D // 2):
                f = theta ** (-2.0 * i / D)
                cs, sn = math.cos(t * f), math.sin(t * f)
                y[:, t, :, i] = x[:, t, :, i] * cs - x[:, t, :, i + D // 2] * sn
                y[:, t, :, i + D // 2] = x[:, t, :, i + D // 2] * cs + x[:, t, :, i] * sn
        return y

    x = W["model.embed_tokens.weight"][ids]
    for l in range(L):
        pre = f"model.layers.{l}."
        h = rms(x, W[pre + "input_layernorm.weight"])
        q = rope((h @ W[pre + "self_attn.q_proj.weight"].T).reshape(B, T, NH, D))
        k = rope((h @ W[pre + "self_attn.k_proj.weight"].T).reshape(B, T, NKV, D))
        v = (h @ W[pre + "self_attn.v_proj.weight"].T).reshape(B, T, NKV, DV)
        x = x + np_attention(q, k, v, 1 / math.sqrt(D)) @ W[pre + "self_attn.o_proj.weight"].T
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


def expected_names(c):
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for l in range(c["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        names += [pre + s + ".weight" for s in ("input_layernorm", "post_attention_layernorm",
                  "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    if not c["tie_word_embeddings"]:
        names.append("lm_head.weight")
    return sorted(names)


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


def test_refusals():
    for extra in ({"attention": "mla", "kv_lora_rank": 16, "qk_rope_head_dim": 4}, {"attention": "cla", "share_factor": 2},
                  {"n_routed_experts": 4, "num_experts_per_tok": 2}, {"q_lora_rank": 8},
                  {"attention": "clla_quant", "kv_lora_rank": 16, "latent_quant_bits": 4}):
        try:
            twin.ModelConfig(tiny_cfg(**{k: v for k, v in extra.items() if k == "attention"},
                                      **{k: v for k, v in extra.items() if k != "attention"}))
            check(f"refuses {extra}", False)
        except twin.Unsupported:
            check(f"refuses {extra}", True)
    for bad in ({"num_key_value_heads": 3}, {"attention": "nonsense"}):
        try:
            twin.ModelConfig(tiny_cfg(**bad))
            check(f"rejects {bad}", False)
        except ValueError:
            check(f"rejects {bad}", True)
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
        cur = twin.TokenCursor(toks, tc.micro_batch, tc.seq_len)
        ok = True
        for s in range(tc.max_steps):
            twin.load_weights(m2, W)
            m2.zero_grad()
            loss_sum = 0.0
            for _ in range(tc.n_micro):
                x, y = cur.next()
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
        # the script runs as a program under /usr/bin/python3
        r = subprocess.run([sys.executable, os.path.join(HERE, "twin.py"), "--help"], capture_output=True, text=True)
        check("cli: twin.py --help", r.returncode == 0 and "check-step" in r.stdout)


def main():
    for t in (test_safetensors, test_rope, test_attention, test_model, test_gradcheck, test_gqa_equals_mha,
              test_refusals, test_schedule_and_cursor, test_train_replay, test_cli):
        print(t.__name__)
        t()
    failed = [n for n, ok in RESULTS if not ok]
    print(f"selftest: {len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
