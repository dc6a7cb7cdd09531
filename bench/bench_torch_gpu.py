#!/usr/bin/env python3
"""PyTorch baseline for bench/bench_gpu.c: the same dense model (bench/dense_1b.json), trained
the same way, on the same GPU, so one session can run both and compare tokens/s.

The model mirrors model/forward.c for a dense MHA/GQA config: token embedding, per layer
RMSNorm -> q/k/v projections -> RoPE (rotate-half, HF form) -> causal attention through
torch.nn.functional.scaled_dot_product_attention (fused: flash / memory-efficient kernels) ->
o_proj -> residual, RMSNorm -> SwiGLU MLP -> residual; final RMSNorm and an untied head;
softmax cross-entropy. Precision as clla's CUDA backend: fp32 parameters (the masters) and
AdamW state, bf16 matmuls and activations through torch.autocast; the step is forward,
backward, global-norm clipping, AdamW (fused when this torch has it).

    python3 bench/bench_torch_gpu.py [--config bench/dense_1b.json] [--steps 10] [--batch B] [--seq T]
                                     [--compile] [--peak-tflops X] [--json]
    python3 bench/bench_torch_gpu.py --smoke      # 2 steps of a tiny model on the CPU (checks the script)

Prints one line: tokens/s, the model FLOP/s of bench/bench_gpu.c's convention and, with
--peak-tflops, its fraction of the peak. Without torch, or without a CUDA device, it prints
why and exits 0.
"""
import argparse
import json
import math
import sys
import time


def flops_per_token(cfg, n_matmul_params, T):
    # bench/bench_gpu.c: 6 * (non-embedding params + head) + 6 L NH (Dqk + Dv) (T + 1) / 2
    L, NH = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    D = cfg.get("head_dim", cfg["hidden_size"] // NH)
    DV = cfg.get("v_head_dim", D)
    DQK = D + (cfg.get("qk_rope_head_dim", 0) if cfg.get("kv_lora_rank", 0) else 0)   # latent: + the rope key
    return 6.0 * n_matmul_params + 6.0 * L * NH * (DQK + DV) * (T + 1) / 2.0


def build(torch, cfg):
    nn, F = torch.nn, torch.nn.functional
    C, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads", NH)
    D = cfg.get("head_dim", C // NH)
    DV = cfg.get("v_head_dim", D)
    I = cfg["intermediate_size"]
    eps = cfg.get("rms_norm_eps", 1e-5)
    theta = cfg.get("rope_theta", 10000.0)
    have_sdpa = hasattr(F, "scaled_dot_product_attention")

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * self.weight.to(x.dtype)

    def rope(x, cos, sin):   # x (B, H, T, D)
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(C)
            self.q_proj = nn.Linear(C, NH * D, bias=False)
            self.k_proj = nn.Linear(C, NKV * D, bias=False)
            self.v_proj = nn.Linear(C, NKV * DV, bias=False)
            self.o_proj = nn.Linear(NH * DV, C, bias=False)
            self.post_attention_layernorm = RMSNorm(C)
            self.gate_proj = nn.Linear(C, I, bias=False)
            self.up_proj = nn.Linear(C, I, bias=False)
            self.down_proj = nn.Linear(I, C, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.input_layernorm(x)
            q = rope(self.q_proj(h).view(B, T, NH, D).transpose(1, 2), cos, sin)
            k = rope(self.k_proj(h).view(B, T, NKV, D).transpose(1, 2), cos, sin)
            v = self.v_proj(h).view(B, T, NKV, DV).transpose(1, 2)
            if NKV != NH:
                k = k.repeat_interleave(NH // NKV, dim=1)
                v = v.repeat_interleave(NH // NKV, dim=1)
            if have_sdpa:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:   # torch < 2.0: unfused, for the smoke run only
                s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                a = s.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype) @ v
            x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, NH * DV))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, C)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.norm = RMSNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            if cfg.get("tie_word_embeddings", False):
                self.lm_head.weight = self.embed_tokens.weight

        def forward(self, idx, targets):
            T = idx.shape[1]
            f = theta ** (-torch.arange(0, D // 2, device=idx.device, dtype=torch.float64) * 2.0 / D)
            ang = torch.arange(T, device=idx.device, dtype=torch.float64)[:, None] * f[None, :]
            cos, sin = ang.cos().float(), ang.sin().float()
            x = self.embed_tokens(idx)
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return Model(), have_sdpa


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bench/dense_1b.json")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=0, help="default: the config's train.micro_batch")
    ap.add_argument("--seq", type=int, default=0, help="default: the config's train.seq_len")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2.0)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="bf16 peak, to print the fraction")
    ap.add_argument("--smoke", action="store_true", help="2 steps of a tiny model on the CPU")
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    args = ap.parse_args()

    def say(key, text):
        print(json.dumps({"bench": "bench_torch_gpu", key: text}) if args.json else
              (f"{key}: {text}" if key in ("skipped", "warning") else text))

    try:
        import torch
    except ImportError as e:
        say("skipped", f"no PyTorch ({e}); Debian: apt-get install python3-torch, run with /usr/bin/python3")
        return 0

    with open(args.config) as f:
        cfg = json.load(f)
    train = cfg.get("train", {})
    B = args.batch or train.get("micro_batch", 4)
    T = args.seq or train.get("seq_len", 2048)
    steps = args.steps
    if args.smoke:
        cfg.update(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                   head_dim=16, v_head_dim=16, intermediate_size=96)
        B, T, steps, dev = 2, 32, 2, torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "torch finds no CUDA device"
            say("skipped", f"no CUDA device ({why}; torch {torch.__version__})")
            return 0
        dev = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False   # clla's fp32 matmuls are true fp32

    torch.manual_seed(train.get("seed", 1))
    model, have_sdpa = build(torch, cfg)
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
    embed = sum(p.numel() for n, p in model.named_parameters() if n == "embed_tokens.weight")
    matmul_params = sum(p.numel() for p in model.parameters()) - embed
    if cfg.get("tie_word_embeddings", False):
        matmul_params += V * cfg["hidden_size"]   # the tied head still multiplies

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
    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    dt = time.perf_counter() - t0
    tok_s = B * T * steps / dt
    fl = tok_s * flops_per_token(cfg, matmul_params, T)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)"
    frac = f" = {100.0 * fl / (args.peak_tflops * 1e12):.1f}% of bf16 peak" if args.peak_tflops > 0 else ""
    attn = "scaled_dot_product_attention" if have_sdpa else "UNFUSED attention (torch < 2.0 has no SDPA)"
    n_params = sum(p.numel() for p in model.parameters())
    if args.json:
        rec = {"bench": "bench_torch_gpu", "model": "dense", "config": args.config, "torch": torch.__version__,
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
