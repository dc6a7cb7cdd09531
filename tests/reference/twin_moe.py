"""The mixture-of-experts FFN of the PyTorch twin (imported by twin.py's make_ffn), in float64.

What the C side computes (model/moe.h, docs/MOE.md), written independently and plainly:

  logits = h W_router^T                      (N, E)
  probs = softmax(logits)                    over all E experts
  top-K by probability, ties to the lower expert index (a stable sort on (-p, e))
  w = probs at the top-K, divided by their sum when norm_topk_prob
  capacity = ceil(N K / E * cf) when cf > 0: per expert, the assignments with the highest
             probability are kept (ties: the earlier token), the rest dropped
  y = shared(h) + sum over kept (t, k) of w[t, k] * expert_{e}(h_t)
  aux = aux_coef * E * sum_e f_e P_e, f_e = (assignments to e before dropping) / (N K),
        P_e = mean_t probs[t, e];   z = z_coef * mean_t logsumexp(logits_t)^2

The routing decisions (which expert, which assignment dropped) are discrete and taken from the
detached probabilities; gradients flow through w, the experts, P and the logsumexp, as in the C
backward. `python3 twin_moe.py` runs a self-check of the vectorized layer against a per-token
loop written from the text above.
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float64


def _linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False, dtype=DTYPE)


class SwiGLU(nn.Module):
    """down(silu(gate(h)) * up(h)); the HF names gate_proj / up_proj / down_proj."""

    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = _linear(hidden, inter)
        self.up_proj = _linear(hidden, inter)
        self.down_proj = _linear(inter, hidden)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def moe_settings(raw):
    """The MoE knobs from a config dict (HF names and the C side's aliases and defaults)."""
    def num(key, default=0, alias=None):
        v = raw.get(key, raw.get(alias, default) if alias else default)
        return default if v is None else v
    E = int(num("n_routed_experts"))
    Ie = int(num("moe_intermediate_size"))
    n_shared = int(num("n_shared_experts"))
    Is = int(num("shared_expert_intermediate_size"))
    if n_shared <= 0:
        Is = 0
    elif Is <= 0:
        Is = n_shared * Ie
    return {
        "E": E, "K": int(num("num_experts_per_tok", 1)), "Ie": Ie, "Is": Is,
        "aux_coef": float(num("moe_aux_loss_coef", 0.0, "aux_loss_alpha")),
        "z_coef": float(num("moe_z_loss_coef", 0.0)),
        # a double on the C side too (model/config.h): 1.2 is 1.2, not its float rounding
        "cf": float(num("moe_capacity_factor", 0.0)),
        "norm_topk": bool(num("norm_topk_prob", False)),
        "first_k_dense": int(num("first_k_dense_layers", 0, "first_k_dense_replace")),
    }


def capacity(N, K, E, cf):
    if cf <= 0:
        return 0
    return max(1, math.ceil(N * K / E * cf))


def route(probs, K, cap):
    """Discrete routing from detached probs (N, E) as numpy float64.
    Returns topk_idx (N, K) int64, keep (N, K) bool, counts (E,) before dropping."""
    N, E = probs.shape
    idx = np.zeros((N, K), dtype=np.int64)
    for t in range(N):
        # stable sort by descending probability: equal probabilities keep the lower index first
        order = sorted(range(E), key=lambda e: (-probs[t, e], e))
        idx[t] = order[:K]
    counts = np.bincount(idx.reshape(-1), minlength=E)
    keep = np.ones((N, K), dtype=bool)
    if cap > 0:
        for e in range(E):
            assigned = [(t, k) for t in range(N) for k in range(K) if idx[t, k] == e]
            if len(assigned) <= cap:
                continue
            ranked = sorted(assigned, key=lambda tk: (-probs[tk[0], e], tk[0]))
            for t, k in ranked[cap:]:
                keep[t, k] = False
    return idx, keep, counts


class MoEFFN(nn.Module):
    """One MoE layer: mlp.gate (router), mlp.experts.{e}, mlp.shared_experts."""

    def __init__(self, cfg, layer):
        super().__init__()
        s = moe_settings(cfg.raw)
        self.s = s
        C = cfg.hidden_size
        self.gate = _linear(C, s["E"])
        self.experts = nn.ModuleList([SwiGLU(C, s["Ie"]) for _ in range(s["E"])])
        if s["Is"] > 0:
            self.shared_experts = SwiGLU(C, s["Is"])
        self.last = None   # routing statistics of the last forward (tests)

    def forward(self, h, ctx):
        s = self.s
        B, T, C = h.shape
        N, E, K = B * T, s["E"], s["K"]
        x = h.reshape(N, C)
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1)
        cap = capacity(N, K, E, s["cf"])
        idx, keep, counts = route(probs.detach().numpy(), K, cap)
        idx_t = torch.from_numpy(idx)
        w = probs.gather(1, idx_t)
        if s["norm_topk"]:
            w = w / w.sum(dim=-1, keepdim=True)
        y = self.shared_experts(x) if s["Is"] > 0 else torch.zeros_like(x)
        for e in range(E):
            sel = np.nonzero((idx == e) & keep)
            if len(sel[0]) == 0:
                # an idle expert stays in the graph with an exact zero gradient, as the C side
                # writes it, so that the AdamW replay still updates (decays) it like clla train
                y = y + 0.0 * sum(prm.sum() for prm in self.experts[e].parameters())
                continue
            tok = torch.from_numpy(sel[0])
            wk = w[tok, torch.from_numpy(sel[1])].unsqueeze(1)
            y = y.index_add(0, tok, wk * self.experts[e](x[tok]))
        f = torch.from_numpy(counts.astype(np.float64)) / (N * K)
        aux = s["aux_coef"] * E * (f * probs.mean(dim=0)).sum()
        z = s["z_coef"] * torch.logsumexp(logits, dim=-1).pow(2).mean()
        ctx.aux_losses.append(aux + z)
        self.last = {"idx": idx, "keep": keep, "counts": counts, "cap": cap, "aux": float(aux), "z": float(z)}
        return y.reshape(B, T, C)


# ----------------------------------------------------------------------------- self-check

class _Ctx:
    def __init__(self):
        self.aux_losses = []


class _Cfg:
    def __init__(self, raw):
        self.raw = raw
        self.hidden_size = raw["hidden_size"]


def _loop_reference(layer, h):
    """Per-token, per-expert loop from the module docstring (independent of MoEFFN.forward)."""
    s = layer.s
    B, T, C = h.shape
    N, E, K = B * T, s["E"], s["K"]
    x = h.reshape(N, C)
    Wr = layer.gate.weight
    rows, lses, probs_rows = [], [], []
    for t in range(N):
        lg = [float(x[t] @ Wr[e]) for e in range(E)]
        m = max(lg)
        ex = [math.exp(v - m) for v in lg]
        z = sum(ex)
        probs_rows.append([v / z for v in ex])
        lses.append(m + math.log(z))
    p = np.array(probs_rows)
    chosen = []
    for t in range(N):
        best = []
        for _ in range(K):
            b = None
            for e in range(E):
                if e in best:
                    continue
                if b is None or p[t, e] > p[t, b]:
                    b = e
            best.append(b)
        chosen.append(best)
    cap = capacity(N, K, E, s["cf"])
    dropped = set()
    counts = [0] * E
    for t in range(N):
        for e in chosen[t]:
            counts[e] += 1
    if cap > 0:
        for e in range(E):
            mine = [t for t in range(N) if e in chosen[t]]
            mine.sort(key=lambda t: (-p[t, e], t))
            for t in mine[cap:]:
                dropped.add((t, e))

    def mlp(mod, v):
        g = mod.gate_proj.weight @ v
        u = mod.up_proj.weight @ v
        return mod.down_proj.weight @ (g / (1 + torch.exp(-g)) * u)

    out = []
    for t in range(N):
        y = mlp(layer.shared_experts, x[t]) if s["Is"] > 0 else torch.zeros(C, dtype=DTYPE)
        ws = [p[t, e] for e in chosen[t]]
        if s["norm_topk"]:
            tot = sum(ws)
            ws = [v / tot for v in ws]
        for e, wv in zip(chosen[t], ws):
            if (t, e) not in dropped:
                y = y + wv * mlp(layer.experts[e], x[t])
        out.append(y)
    aux = s["aux_coef"] * E * sum(counts[e] / (N * K) * p[:, e].mean() for e in range(E))
    zl = s["z_coef"] * float(np.mean(np.array(lses) ** 2))
    return torch.stack(out).reshape(B, T, C), aux + zl, len(dropped)


def selftest():
    torch.manual_seed(0)
    failed = 0
    cases = [
        dict(K=1, Is=1, cf=0.0, norm=False, zero_router=False),
        dict(K=1, Is=1, cf=1.0, norm=False, zero_router=False),
        dict(K=2, Is=0, cf=1.25, norm=True, zero_router=False),
        dict(K=2, Is=1, cf=0.0, norm=False, zero_router=False),
        dict(K=1, Is=0, cf=1.0, norm=False, zero_router=True),   # all ties: every token to expert 0
        dict(K=2, Is=1, cf=0.0, norm=True, zero_router=True),
    ]
    for i, c in enumerate(cases):
        raw = {"hidden_size": 8, "n_routed_experts": 4, "num_experts_per_tok": c["K"], "moe_intermediate_size": 6,
               "n_shared_experts": c["Is"], "moe_aux_loss_coef": 0.3, "moe_z_loss_coef": 0.01,
               "moe_capacity_factor": c["cf"], "norm_topk_prob": c["norm"]}
        layer = MoEFFN(_Cfg(raw), 0)
        with torch.no_grad():
            for prm in layer.parameters():
                prm.copy_(torch.randn(prm.shape, dtype=DTYPE) * 0.5)
            if c["zero_router"]:
                layer.gate.weight.zero_()
        h = torch.randn(2, 5, 8, dtype=DTYPE)
        ctx = _Ctx()
        y = layer(h, ctx)
        y_ref, aux_ref, n_drop = _loop_reference(layer, h)
        ey = float((y - y_ref).abs().max())
        ea = abs(float(ctx.aux_losses[0]) - aux_ref)
        ok = ey < 1e-12 and ea < 1e-12 and n_drop == int((~layer.last["keep"]).sum())
        if c["zero_router"] and c["K"] == 1:
            ok = ok and layer.last["counts"].tolist() == [10, 0, 0, 0] and n_drop == 10 - layer.last["cap"]
        # gradients through the router (aux + combine weights) by gradcheck on a linear functional
        hh = h.clone().requires_grad_(True)
        wr = torch.randn_like(y)

        def fn(inp):
            cx = _Ctx()
            return (layer(inp, cx) * wr).sum() + cx.aux_losses[0]
        ok_g = torch.autograd.gradcheck(fn, (hh,), eps=1e-6, atol=1e-7) if not c["zero_router"] else True
        failed += not (ok and ok_g)
        print(f"  {'ok  ' if ok and ok_g else 'FAIL'} moe case {i} {c}: |y-loop| {ey:.1e} |aux-loop| {ea:.1e} "
              f"dropped {n_drop} counts {layer.last['counts'].tolist()}")
    print(f"twin_moe selftest: {len(cases)} cases, {failed} failed")
    return 1 if failed else 0


def cmd_routing(argv):
    """routing --model DIR --tokens FILE --batch B --seq T [--expect drop|nodrop|collapse]:
    the twin's routing of the check-step batch, one line per MoE layer; with --expect, fails
    unless some layer drops (drop), no layer drops (nodrop), or every token of every layer went
    to experts 0..K-1 with the others empty (collapse: a zero router, all probabilities tied)."""
    import argparse
    import twin
    p = argparse.ArgumentParser(prog="twin_moe.py routing")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--expect", choices=["drop", "nodrop", "collapse"])
    a = p.parse_args(argv)
    model, _ = twin.load_model_dir(a.model)
    x, y = twin.batch_at(twin.read_tokens(a.tokens, model.cfg.vocab_size), 0, a.batch, a.seq)
    with torch.no_grad():
        model(x, y)
    total_drop, collapsed, layers = 0, True, 0
    for l, layer in enumerate(model.model.layers):
        if type(layer.mlp).__name__ != "MoEFFN":   # (this file may run as __main__)
            continue
        r = layer.mlp.last
        K = layer.mlp.s["K"]
        nd = int((~r["keep"]).sum())
        total_drop += nd
        layers += 1
        counts = r["counts"].tolist()
        collapsed = collapsed and all(c == a.batch * a.seq for c in counts[:K]) and not any(counts[K:])
        print(f"  layer {l}: counts {counts} capacity {r['cap'] or 'none'} dropped {nd} aux {r['aux']:.6f} z {r['z']:.6f}")
    ok = layers > 0
    if a.expect == "drop":
        ok = ok and total_drop > 0
    elif a.expect == "nodrop":
        ok = ok and total_drop == 0
    elif a.expect == "collapse":
        ok = ok and collapsed
    print(f"routing: {layers} MoE layers, {total_drop} dropped" + (f", expect {a.expect}: {'ok' if ok else 'FAIL'}" if a.expect else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    torch.set_default_dtype(DTYPE)
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    if len(sys.argv) > 1 and sys.argv[1] == "routing":
        sys.exit(cmd_routing(sys.argv[2:]))
    sys.exit(selftest())
