#!/usr/bin/python3
"""PyTorch baseline for bench/bench_train.c on the CPU: the same model, trained the same way
(forward, backward, AdamW) on random tokens, in fp32, so one run can time both.

The model is the PyTorch twin (tests/reference/twin.py: every attention preset, CLLA-quant's
straight-through int_group included), cast to float32. Its attention is the explicit form
(scores, mask, softmax, P V, the T x T matrix in memory): Debian's torch 1.13 has no
torch.nn.functional.scaled_dot_product_attention. The twin's MoE FFN is a per-token reference
loop, not a fair baseline: MoE configs are refused.

    /usr/bin/python3 bench/bench_torch_cpu.py --config FILE [--set key=value ...] [--steps N]
                                              [--threads N] [--json]

Prints the median step's tokens/s (steps after one warm-up), and the model FLOP/s of
bench/bench_train.c's convention.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="clla config JSON (model keys and train.seq_len, micro_batch)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key (repeatable)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: OMP_NUM_THREADS or all cores)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object")
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("bench_torch_cpu: --steps must be at least 1")
    try:
        import torch
        import twin
    except ImportError as e:
        sys.exit(f"bench_torch_cpu: {e}: run with Debian's /usr/bin/python3 (python3-torch)")
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count()
    torch.set_num_threads(threads)
    # a bad file or --set in one line, as clla says it (bench/bench_train_vs_torch.sh has bench_train
    # check the same config and --set keys first: a key clla does not know is refused there)
    try:
        raw = twin.read_config(args.config, args.set)
        mc = twin.ModelConfig(raw)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"bench_torch_cpu: --config {args.config}: {e}")
    if int(raw.get("n_routed_experts", 0) or 0) > 0:
        sys.exit("bench_torch_cpu: the twin's MoE FFN is a per-token reference loop, not a baseline: use a dense config")
    train = raw.get("train", {})
    B, T = int(train.get("micro_batch", 1)), int(train.get("seq_len", 0))
    if T < 1:
        sys.exit("bench_torch_cpu: the config needs train.seq_len")
    # the twin computes in float64 by default: the same modules in float32, RoPE tables too
    rope64 = twin.rope_tables
    twin.rope_tables = lambda n, dim, theta, dtype=torch.float32: rope64(n, dim, theta, dtype)
    torch.manual_seed(1)
    model = twin.build_model(mc)
    twin.init_random(model, 1)
    model = model.float()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    V = mc.vocab_size
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(args.steps + 1):
        ids = torch.randint(0, V, (B, T), generator=g)
        tg = torch.randint(0, V, (B, T), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(ids, tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {step}{' (warm-up, not counted)' if step == 0 else ''}: {dt:.3f} s loss {float(loss):.4f}", flush=True)
        if step:
            times.append(dt)
    times.sort()
    n = len(times)
    median = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    tok_s = B * T / median
    # bench/bench_train.c's FLOP convention (bench/bench_torch_gpu.py computes it for both scripts)
    from bench_torch_gpu import flops_per_token
    params = sum(p.numel() for name, p in model.named_parameters()
                 if name not in ("model.embed_tokens.weight", "lm_head.weight"))
    flops = flops_per_token(raw, params + V * mc.hidden_size, T)
    print(f"torch {torch.__version__}, {threads} threads, {mc.attention}, B={B} T={T}: {tok_s:.1f} tokens/s "
          f"(median of {n} steps), model {tok_s * flops / 1e9:.1f} GFLOP/s")
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": threads, "attention": mc.attention, "B": B, "T": T,
                          "tokens_per_s": tok_s, "flops_per_token": flops, "model_flops": tok_s * flops}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
