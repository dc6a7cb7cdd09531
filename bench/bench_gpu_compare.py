#!/usr/bin/env python3
"""clla's CUDA backend beside PyTorch, in one run on one GPU (the issue's and the brief's rule:
ratios taken in the same run, since machines are noisy).

    python3 bench/bench_gpu_compare.py [--build build-cuda] [--steps 10] [--moe mha,gqa,mla,clla,clla_quant]
                                       [--compile] [--python PY] [--json]

1. build/bench/bench_gpu --only dense: the dense ~1B model (bench/dense_1b.json);
2. bench/bench_torch_gpu.py on the same config at the batch and length bench_gpu used, with the
   peak bench_gpu found for this GPU; the ratio clla / PyTorch in tokens/s;
3. bench_gpu --only moe for each paper MoE config named (configs/paper/<name>.json), each at the
   most layers that fit, then bench_torch_gpu.py on that config at the same layers, batch and
   length: the ratio clla / PyTorch for each.
Then the issue's targets on the dense model: at least the PyTorch figure, and 45% of the bf16
peak. Run it from the repository root with the python that has a CUDA build of torch 2.x
(--python, default this interpreter). Without a GPU every part prints why it skipped and the
script exits 0. --json: one JSON object per line. The environment variables BENCH_GPU and
TORCH_BENCH replace the two commands (tests/test_bench_scripts.sh gives it fakes).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys


def records(cmd):
    """Runs cmd (a list) and returns its JSON lines; dies with the command's tail when it fails."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"bench_gpu_compare: {' '.join(cmd)} failed (exit {p.returncode}): {tail}")
    return out


def first(recs, key, value=None):
    for r in recs:
        if key in r and (value is None or r[key] == value):
            return r
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build-cuda", help="the CUDA build directory (default build-cuda)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per model (default 10)")
    ap.add_argument("--moe", default="mha,gqa,mla,clla,clla_quant",
                    help="paper MoE configs to run, comma-separated names under configs/paper/ ('' for none)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the PyTorch model")
    ap.add_argument("--python", default=sys.executable, help="interpreter with a CUDA build of torch")
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("bench_gpu_compare: --steps must be a positive integer")
    # BENCH_GPU is a command line (split as a shell would); the default is one path, kept whole
    bench = shlex.split(os.environ["BENCH_GPU"]) if os.environ.get("BENCH_GPU") else [os.path.join(args.build, "bench", "bench_gpu")]
    torch_bench = shlex.split(os.environ.get("TORCH_BENCH", f"{shlex.quote(args.python)} bench/bench_torch_gpu.py"))
    if not os.environ.get("BENCH_GPU") and not os.path.exists(bench[0]):
        sys.exit(f"bench_gpu_compare: {bench[0]} not found: build it with "
                 f"cmake -S . -B {args.build} -DCLLA_CUDA=ON && cmake --build {args.build} -j")

    def emit(rec, text):
        print(json.dumps(dict(bench="bench_gpu_compare", **rec)) if args.json else text)

    steps = ["--steps", str(args.steps)]
    clla = records(bench + ["--only", "dense", "--json"] + steps)
    skip = first(clla, "skipped")
    if skip:
        emit({"skipped": skip["skipped"]}, f"skipped: {skip['skipped']}")
        return 0
    dev = first(clla, "device")
    dense = first(clla, "model", "dense")
    if dev:
        emit({"device": dev["device"]}, f"device: {dev['device']}")
    if not dense:
        emit({"skipped": "bench_gpu printed no dense result"}, "skipped: bench_gpu printed no dense result")
        return 0
    peak = dense["model_tflops"] / dense["fraction_of_peak"] if dense.get("fraction_of_peak") else 0.0

    def torch_run(config, kind, r, layers=None):
        """PyTorch on config at bench_gpu's batch and length (and layers): its result, or why not."""
        cmd = torch_bench + ["--config", config, "--batch", str(r["B"]), "--seq", str(r["T"]), "--json"] + steps
        if layers:
            cmd += ["--layers", str(layers)]
        if peak > 0:
            cmd += ["--peak-tflops", f"{peak:.6g}"]
        if args.compile:
            cmd.append("--compile")
        out = records(cmd)
        res, skip = first(out, "model", kind), first(out, "skipped")
        return res, (skip["skipped"] if skip else "bench_torch_gpu printed no result")

    t_res, t_why = torch_run(dense["config"], "dense", dense)

    frac = dense.get("fraction_of_peak")
    rec = {"model": "dense", "config": dense["config"], "B": dense["B"], "T": dense["T"],
           "clla_tokens_per_s": dense["tokens_per_s"], "clla_fraction_of_peak": frac,
           "clla_op_ms_per_step": dense.get("op_ms_per_step")}
    text = (f"dense  {dense['params'] / 1e9:.2f}B params, B={dense['B']} T={dense['T']}: clla {dense['tokens_per_s']:.0f} tok/s"
            + (f" ({100 * frac:.1f}% of bf16 peak)" if frac else ""))
    if t_res:
        ratio = dense["tokens_per_s"] / t_res["tokens_per_s"]
        rec.update(torch_tokens_per_s=t_res["tokens_per_s"], torch_version=t_res["torch"],
                   torch_fused_attention=t_res["fused_attention"], ratio_clla_over_torch=ratio)
        text += (f" | PyTorch {t_res['torch']} {t_res['tokens_per_s']:.0f} tok/s"
                 + ("" if t_res["fused_attention"] else " (UNFUSED attention: not the baseline the issue names)")
                 + f" | clla / PyTorch = {ratio:.3f}")
    else:
        rec["torch_skipped"] = t_why
        text += f" | PyTorch skipped: {t_why}"
    emit(rec, text)

    targets = {"clla_at_least_torch": (rec["ratio_clla_over_torch"] >= 1.0) if t_res else None,
               "dense_45pct_of_peak": (frac >= 0.45) if frac else None}
    word = {True: "met", False: "NOT met", None: "not measured"}
    emit({"targets": targets}, f"targets: clla >= PyTorch: {word[targets['clla_at_least_torch']]} | "
                               f"dense >= 45% of bf16 peak: {word[targets['dense_45pct_of_peak']]}")

    for name in [n for n in args.moe.split(",") if n]:
        path = f"configs/paper/{name}.json"
        if not os.path.exists(path):
            sys.exit(f"bench_gpu_compare: --moe {name}: {path} does not exist")
        moe = records(bench + ["--only", "moe", "--moe", path, "--json"] + steps)
        r, s = first(moe, "model", "moe"), first(moe, "skipped")
        m_res, m_why = (torch_run(path, "moe", r, r["layers"]) if r else (None, None))
        # PyTorch keeps more per parameter than clla (autocast's bf16 weight copies beside the
        # fp32 masters): where it runs out of memory at bench_gpu's layers, both run again at half
        # as many (whole share groups of 2), so that the ratio stays one of the same model
        while r and not m_res and "out of GPU memory" in m_why and r["layers"] >= 4:
            fewer = r["layers"] // 2 // 2 * 2
            moe = records(bench + ["--only", "moe", "--moe", path, "--json", "--set", f"num_hidden_layers={fewer}"] + steps)
            r, s = first(moe, "model", "moe"), first(moe, "skipped")
            m_res, m_why = (torch_run(path, "moe", r, r["layers"]) if r else (None, None))
        if r:
            f = r.get("fraction_of_peak")
            rec = {"model": "moe", "config": path, "layers": r["layers"], "T": r["T"], "tokens_per_s": r["tokens_per_s"],
                   "fraction_of_peak": f}
            text = (f"moe    {path} ({r['layers']} layers, T={r['T']}): {r['tokens_per_s']:.0f} tok/s"
                    + (f" ({100 * f:.1f}% of bf16 peak)" if f else ""))
            if m_res:
                ratio = r["tokens_per_s"] / m_res["tokens_per_s"]
                rec.update(torch_tokens_per_s=m_res["tokens_per_s"], ratio_clla_over_torch=ratio)
                text += f" | PyTorch {m_res['tokens_per_s']:.0f} tok/s | clla / PyTorch = {ratio:.3f}"
            else:
                rec["torch_skipped"] = m_why
                text += f" | PyTorch skipped: {m_why}"
            emit(rec, text)
        else:
            why = s["skipped"] if s else "bench_gpu printed no result"
            emit({"model": "moe", "config": path, "skipped": why}, f"moe    {path}: skipped: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
