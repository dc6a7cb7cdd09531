#!/usr/bin/env python3
"""PyTorch baseline for bench/bench_gpu.c: the same model (bench/dense_1b.json, or a paper MoE
config such as configs/paper/clla.json), trained the same way, on the same GPU, so one session
can run both and compare tokens/s.

The model mirrors model/forward.c: token embedding, per layer RMSNorm -> attention -> residual,
RMSNorm -> FFN -> residual; final RMSNorm and the head; softmax cross-entropy. Attention: q/k/v
projections, RoPE (rotate-half, HF form), or the latent form (MLA, CLLA: q through q_lora_rank,
the kv latent and one shared RoPE key, up-projected per head; CLLA-quant's int4 latent with a
straight-through gradient); layers that share a cache slot (CLA, CLLA) reuse the producer's K and
V or latent, as model/forward.c does. The config's semantics (presets, sharing, the int_group
quantizer) come from the float64 twin (tests/reference/twin.py), not a copy. Causal attention
through torch.nn.functional.scaled_dot_product_attention (fused kernels). FFN: SwiGLU, or the
MoE layer: an fp32 router, softmax, top-k, each routed expert over its tokens (index_add, as
eager PyTorch MoE code does) plus the shared experts, the load-balancing and z losses; no
capacity drop (bench_gpu's random tokens route close to evenly, so clla drops few). Precision as
clla's CUDA backend: fp32 parameters (the masters) and AdamW state, bf16 matmuls and activations
through torch.autocast; the step is forward, backward, global-norm clipping, AdamW (fused when
this torch has it).

    python3 bench/bench_torch_gpu.py [--config bench/dense_1b.json] [--layers N] [--steps 10] [--batch B]
                                     [--seq T] [--compile] [--peak-tflops X] [--json]
    python3 bench/bench_torch_gpu.py --smoke [--config FILE]   # 2 steps of a tiny model of that
                                                               # config's structure, on the CPU

Prints one line: tokens/s, the model FLOP/s of bench/bench_gpu.c's convention (activated
parameters: K of the E routed experts) and, with --peak-tflops, its fraction of the peak.
Without torch, or without a CUDA device, it prints why and exits 0; out of GPU memory, it says
so and exits 0.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))


def flops_per_token(cfg, n_matmul_params, T):
    # bench/bench_gpu.c: 6 * (non-embedding params + head) + 6 L NH (Dqk + Dv) (T + 1) / 2
    L, NH = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    D = cfg.get("head_dim", cfg["hidden_size"] // NH)
    DV = cfg.get("v_head_dim", D)
    DQK = D + (cfg.get("qk_rope_head_dim", 0) if cfg.get("kv_lora_rank", 0) else 0)   # latent: + the rope key
    return 6.0 * n_matmul_params + 6.0 * L * NH * (DQK + DV) * (T + 1) / 2.0


def build(torch, cfg):
    """(model of config dict cfg, whether this torch has fused attention (SDPA), its activated
    matmul parameters in bench_gpu's FLOP convention, "dense" or "moe")."""
    import twin        # the config's semantics: presets, sharing, the int_group quantizer
    import twin_moe
    nn, F = torch.nn, torch.nn.functional
    mc = twin.ModelConfig(cfg)
    ms = twin_moe.moe_settings(cfg)
    C, V, L = mc.hidden_size, mc.vocab_size, mc.num_hidden_layers
    NH, NKV, D, DV = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, mc.v_head_dim
    R, DR, RQ = mc.kv_lora_rank, mc.qk_rope_head_dim, mc.q_lora_rank
    eps, theta = mc.rms_norm_eps, mc.rope_theta
    have_sdpa = hasattr(F, "scaled_dot_product_attention")

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight.to(x.dtype)

    def rope(x, tables):   # x (B, H, T, d), tables[d] = (cos, sin) (T, d / 2)
        cos, sin = tables[x.shape[-1]]
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def attend(q, k, v):   # (B, NH, T, d) each; scale 1/sqrt(q's width), as clla's
        if have_sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[2]     # torch < 2.0: unfused, for the smoke run only
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return s.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype) @ v

    class DenseAttention(nn.Module):   # MHA, GQA, MQA; CLA: consumers reuse the producer's K, V
        def __init__(self, layer):
            super().__init__()
            self.layer, self.producer = layer, mc.is_producer(layer)
            self.q_proj = nn.Linear(C, NH * D, bias=False)
            if self.producer:
                self.k_proj = nn.Linear(C, NKV * D, bias=False)
                self.v_proj = nn.Linear(C, NKV * DV, bias=False)
            self.o_proj = nn.Linear(NH * DV, C, bias=False)

        def forward(self, h, tables, slots):
            B, T, _ = h.shape
            q = rope(self.q_proj(h).view(B, T, NH, D).transpose(1, 2), tables)
            if self.producer:
                k = rope(self.k_proj(h).view(B, T, NKV, D).transpose(1, 2), tables)
                slots[mc.slot(self.layer)] = (k, self.v_proj(h).view(B, T, NKV, DV).transpose(1, 2))
            k, v = slots[mc.slot(self.layer)]
            if NKV != NH:
                k = k.repeat_interleave(NH // NKV, dim=1)
                v = v.repeat_interleave(NH // NKV, dim=1)
            return self.o_proj(attend(q, k, v).transpose(1, 2).reshape(B, T, NH * DV))

    class LatentAttention(nn.Module):   # MLA, CLLA and its share modes, CLLA-quant (twin.LatentAttention)
        def __init__(self, layer):
            super().__init__()
            self.layer, self.producer = layer, mc.is_producer(layer)
            if RQ > 0:
                self.q_a_proj = nn.Linear(C, RQ, bias=False)
                self.q_a_layernorm = RMSNorm(RQ)
                self.q_b_proj = nn.Linear(RQ, NH * (D + DR), bias=False)
            else:
                self.q_proj = nn.Linear(C, NH * (D + DR), bias=False)
            if self.producer:
                self.kv_a_proj_with_mqa = nn.Linear(C, R + DR, bias=False)
                self.kv_a_layernorm = RMSNorm(R)
            self.own_krope = not self.producer and mc.share in ("latent", "latent_kvproj")
            if self.own_krope:
                self.k_rope_proj = nn.Linear(C, DR, bias=False)
            self.own_kvb = self.producer or mc.share != "latent_kvproj"
            if self.own_kvb:
                self.kv_b_proj = nn.Linear(R, NH * (D + DV), bias=False)
            self.o_proj = nn.Linear(NH * DV, C, bias=False)

        def forward(self, h, tables, slots):
            B, T, _ = h.shape
            if self.producer:
                kv_a = self.kv_a_proj_with_mqa(h)
                c = self.kv_a_layernorm(kv_a[..., :R])
                if mc.latent_quant_bits:   # int4 round trip, straight-through gradient
                    codes, scales = twin.int_group_quantize(c.detach().float(), mc.latent_quant_bits,
                                                            mc.latent_quant_group)
                    c = c + (twin.int_group_dequantize(codes, scales).to(c.dtype) - c).detach()
                k_rope = rope(kv_a[..., R:].reshape(B, T, 1, DR).transpose(1, 2), tables)
                slots[mc.slot(self.layer)] = (c, k_rope, self.kv_b_proj.weight)
            c, k_rope, w_kvb = slots[mc.slot(self.layer)]
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h))) if RQ > 0 else self.q_proj(h)
            q = q.view(B, T, NH, D + DR).transpose(1, 2)
            q = torch.cat([q[..., :D], rope(q[..., D:], tables)], dim=-1)
            if self.own_krope:
                k_rope = rope(self.k_rope_proj(h).view(B, T, 1, DR).transpose(1, 2), tables)
            kv = F.linear(c, self.kv_b_proj.weight if self.own_kvb else w_kvb).view(B, T, NH, D + DV).transpose(1, 2)
            k = torch.cat([kv[..., :D], k_rope.expand(B, NH, T, DR).to(kv.dtype)], dim=-1)
            return self.o_proj(attend(q, k, kv[..., D:]).transpose(1, 2).reshape(B, T, NH * DV))

    class SwiGLU(nn.Module):
        def __init__(self, inter):
            super().__init__()
            self.gate_proj = nn.Linear(C, inter, bias=False)
            self.up_proj = nn.Linear(C, inter, bias=False)
            self.down_proj = nn.Linear(inter, C, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(C, ms["E"], bias=False)
            self.experts = nn.ModuleList([SwiGLU(ms["Ie"]) for _ in range(ms["E"])])
            self.shared_experts = SwiGLU(ms["Is"]) if ms["Is"] > 0 else None

        def forward(self, h, aux):
            B, T, _ = h.shape
            E, K, x = ms["E"], ms["K"], h.reshape(B * T, C)
            with torch.autocast(device_type=h.device.type, enabled=False):   # the router in fp32
                logits = F.linear(x.float(), self.gate.weight)
            probs = logits.softmax(-1)
            w, idx = probs.topk(K, dim=-1)
            if ms["norm_topk"]:
                w = w / w.sum(-1, keepdim=True)
            y = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)
            for e in range(E):
                tok, k = (idx == e).nonzero(as_tuple=True)
                if tok.numel():
                    y = y.index_add(0, tok, (w[tok, k].unsqueeze(1) * self.experts[e](x[tok])).to(y.dtype))
            f = torch.bincount(idx.reshape(-1), minlength=E).float() / (B * T * K)
            aux.append(ms["aux_coef"] * E * (f * probs.mean(0)).sum()
                       + ms["z_coef"] * torch.logsumexp(logits, -1).pow(2).mean())
            return y.reshape(B, T, C)

    class Layer(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.input_layernorm = RMSNorm(C)
            self.self_attn = LatentAttention(layer) if mc.latent else DenseAttention(layer)
            self.post_attention_layernorm = RMSNorm(C)
            self.moe = mc.ffn_kind(layer) == "moe"
            self.mlp = MoE() if self.moe else SwiGLU(mc.intermediate_size)

        def forward(self, x, tables, slots, aux):
            x = x + self.self_attn(self.input_layernorm(x), tables, slots)
            h = self.post_attention_layernorm(x)
            return x + (self.mlp(h, aux) if self.moe else self.mlp(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, C)
            self.layers = nn.ModuleList([Layer(l) for l in range(L)])
            self.norm = RMSNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            if mc.tie_word_embeddings:
                self.lm_head.weight = self.embed_tokens.weight

        def forward(self, idx, targets):
            T, tables = idx.shape[1], {}
            for d in {DR} if mc.latent else {D}:   # RoPE tables in double, as model/ builds them
                f = theta ** (-torch.arange(0, d // 2, device=idx.device, dtype=torch.float64) * 2.0 / d)
                ang = torch.arange(T, device=idx.device, dtype=torch.float64)[:, None] * f[None, :]
                tables[d] = (ang.cos().float(), ang.sin().float())
            x, slots, aux = self.embed_tokens(idx), {}, []
            for layer in self.layers:
                x = layer(x, tables, slots, aux)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1)) + sum(aux)

    model = Model()
    # activated matmul parameters (bench/bench_gpu.c): all but the embedding, the tied head counted
    # as a product, K of the E routed experts
    n = sum(p.numel() for p in model.parameters()) - V * C + (V * C if mc.tie_word_embeddings else 0)
    n_moe = sum(1 for l in model.layers if l.moe)
    n -= n_moe * (ms["E"] - ms["K"]) * 3 * C * ms["Ie"] if ms["E"] > 0 else 0
    return model, have_sdpa, n, ("moe" if n_moe else "dense")


SMOKE = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, head_dim=16, v_head_dim=16, intermediate_size=96)


def smoke_config(cfg):
    """A tiny config of cfg's structure (preset, sharing, latent, MoE): the smoke run's."""
    out = dict(cfg, **SMOKE)
    if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] != cfg["num_attention_heads"]:
        out["num_key_value_heads"] = 1 if cfg["num_key_value_heads"] == 1 else 2
    else:
        out["num_key_value_heads"] = 4
    out["num_hidden_layers"] = 4
    if cfg.get("kv_lora_rank", 0):
        out.update(kv_lora_rank=32, qk_rope_head_dim=8, q_lora_rank=24 if cfg.get("q_lora_rank", 0) else 0)
    if cfg.get("n_routed_experts", 0):
        out.update(n_routed_experts=4, moe_intermediate_size=48, num_experts_per_tok=min(2, cfg.get("num_experts_per_tok", 1)),
                   first_k_dense_layers=min(1, cfg.get("first_k_dense_layers", 0)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bench/dense_1b.json")
    ap.add_argument("--layers", type=int, default=0, help="num_hidden_layers instead of the config's")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=0, help="default: the config's train.micro_batch")
    ap.add_argument("--seq", type=int, default=0, help="default: the config's train.seq_len")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2.0)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="bf16 peak, to print the fraction")
    ap.add_argument("--smoke", action="store_true", help="2 steps of a tiny model of the config's structure on the CPU")
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    args = ap.parse_args()
    for name, v, least, hint in (("--steps", args.steps, 1, "a whole number >= 1"),
                                 ("--layers", args.layers, 0, "a whole number >= 1, or 0 for the config's"),
                                 ("--batch", args.batch, 0, "a whole number >= 1, or 0 for the config's"),
                                 ("--seq", args.seq, 0, "a whole number >= 1, or 0 for the config's"),
                                 ("--peak-tflops", args.peak_tflops, 0, "a number > 0, or 0 for none")):
        if not v >= least:   # also refuses nan
            sys.exit(f"bench_torch_gpu: {name} {v}: use {hint}")

    def say(key, text):
        print(json.dumps({"bench": "bench_torch_gpu", key: text}) if args.json else
              (f"{key}: {text}" if key in ("skipped", "warning") else text))

    try:
        import torch
    except ImportError as e:
        say("skipped", f"no PyTorch ({e}); Debian: apt-get install python3-torch, run with /usr/bin/python3")
        return 0

    try:
        with open(args.config) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"bench_torch_gpu: --config {args.config}: {e}")
    if not isinstance(cfg, dict):
        sys.exit(f"bench_torch_gpu: --config {args.config}: not a JSON object")
    if args.layers > 0:
        cfg["num_hidden_layers"] = args.layers
    train = cfg.get("train", {})
    B = args.batch or train.get("micro_batch", 4)
    T = args.seq or train.get("seq_len", 2048)
    steps = args.steps
    if args.smoke:
        cfg = smoke_config(cfg)
        B, T, steps, dev = 2, 32, 2, torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "torch finds no CUDA device"
            say("skipped", f"no CUDA device ({why}; torch {torch.__version__})")
            return 0
        dev = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False   # clla's fp32 matmuls are true fp32

    torch.manual_seed(train.get("seed", 1))
    try:
        model, have_sdpa, matmul_params, kind = build(torch, cfg)
    except (ValueError, KeyError, TypeError) as e:
        sys.exit(f"bench_torch_gpu: {args.config}: {e if not isinstance(e, KeyError) else 'no key ' + str(e)}")
    model.to(dev)
    std = cfg.get("initializer_range", 0.02)
    res_std = std / math.sqrt(2 * cfg["num_hidden_layers"])
    for name, p in model.named_parameters():   # the init of model/params.c
        if p.dim() == 2:
            torch.nn.init.normal_(p, 0.0, res_std if ("o_proj" in name or "down_proj" in name) else std)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kw = dict(lr=train.get("lr", 3e-4), betas=(train.get("beta1", 0.9), train.get("beta2", 0.95)),
                  eps=train.get("eps", 1e-8))
    groups = [{"params": decay, "weight_decay": train.get("weight_decay", 0.1)}, {"params": no_decay, "weight_decay": 0.0}]
    fused = dev.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
    opt = torch.optim.AdamW(groups, fused=True, **opt_kw) if fused else torch.optim.AdamW(groups, **opt_kw)
    fwd = torch.compile(model) if args.compile else model
    clip = train.get("grad_clip", 1.0)
    V = cfg["vocab_size"]

    def step():
        idx = torch.randint(0, V, (B, T), device=dev)
        tgt = torch.randint(0, V, (B, T), device=dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    try:
        for _ in range(2):
            step()
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step()
        sync()
    except RuntimeError as e:   # torch.cuda.OutOfMemoryError is one
        if "out of memory" not in str(e):
            raise
        say("skipped", f"out of GPU memory at {cfg['num_hidden_layers']} layers, B={B} T={T}")
        return 0
    dt = time.perf_counter() - t0
    tok_s = B * T * steps / dt
    fl = tok_s * flops_per_token(cfg, matmul_params, T)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)"
    frac = f" = {100.0 * fl / (args.peak_tflops * 1e12):.1f}% of bf16 peak" if args.peak_tflops > 0 else ""
    attn = "scaled_dot_product_attention" if have_sdpa else "UNFUSED attention (torch < 2.0 has no SDPA)"
    n_params = sum(p.numel() for p in model.parameters())
    if args.json:
        rec = {"bench": "bench_torch_gpu", "model": kind, "config": args.config, "layers": cfg["num_hidden_layers"], "torch": torch.__version__,
               "device": name, "params": n_params, "B": B, "T": T, "steps": steps, "s_per_step": dt / steps,
               "tokens_per_s": tok_s, "model_tflops": fl * 1e-12, "fused_attention": have_sdpa,
               "compiled": args.compile, "last_loss": loss.item()}
        if args.peak_tflops > 0:
            rec["fraction_of_peak"] = fl / (args.peak_tflops * 1e12)
        print(json.dumps(rec))
    else:
        print(f"torch {torch.__version__} on {name} | {n_params} params | B={B} T={T} | "
              f"{dt / steps:.3f} s/step | {tok_s:.0f} tokens/s | model {fl * 1e-12:.2f} TFLOP/s{frac} | {attn}"
              f"{' | compiled' if args.compile else ''} | last loss {loss.item():.3f}")
    if not have_sdpa and not args.smoke:
        say("warning", "this torch lacks scaled_dot_product_attention: not the fused-attention baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
