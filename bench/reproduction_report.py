#!/usr/bin/python3
"""The tables of docs/REPRODUCTION.md from the sweeps of bench/reproduction.sh.

Reads OUT/{main,t5,s2}/results.csv (launch/sweep's, docs/SWEEPS.md) and prints markdown: per
part, each config point's validation loss over its seeds (mean and sample standard deviation),
its cache bytes per token and activated parameters, and its difference to the part's baseline
paired by seed (the same seed means the same data order and the same draws of the initializer,
so the per-seed difference removes most of the seed-to-seed spread; its mean and standard
deviation over seeds are printed, and |mean| / (sd / sqrt(n)) as a rough t). Then the
comparisons the paper draws (Tables 2/3, 5, 6, 7) and the 2% search's verdict.

    bench/reproduction_report.py [OUT]        (default runs/repro)

Standard library only. Exit status 1 when a part has no results.csv.
"""
import csv
import math
import os
import statistics
import sys

# the paper's Table 5 (validation perplexity, 50B tokens) for the comparison column
PAPER_T5 = {
    "t5_gqa_group8": 8.93, "t5_gqa_group4": 8.95, "t5_gqa_group2": 9.05, "t5_mqa": 9.11,
    "t5_cla_share2": 8.97, "t5_cla_share4": 9.07, "t5_cla_share8": 9.47,
    "t5_gqa_group4_cla_share2": 9.12, "t5_gqa_group2_cla_share2": 9.19,
    "t5_mqa_dim384_cla_share2": 9.12, "t5_mqa_dim192_cla_share2": 9.16,
}
# the paper's Tables 2/3, 6, 7: average downstream score (English, Chinese averaged)
PAPER_AVG = {
    "mha": (56.73 + 61.66) / 2, "gqa": (56.83 + 61.53) / 2, "mla": (57.16 + 61.72) / 2,
    "clla": 60.77, "clla_quant": 60.62, "t6_clla_share_krope": 58.98, "t6_clla_share_kvproj": 60.44,
    "t7_clla_quant_share_kvproj": 59.95,
}


def load(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    points = {}
    for r in rows:
        p = points.setdefault(r["point"], {"runs": {}, "row": r})
        if r["status"] == "finished" and r["val_loss"]:
            p["runs"][int(r["seed"])] = float(r["val_loss"])
    return points


def mean_sd(xs):
    if not xs:
        return float("nan"), float("nan")
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else float("nan"))


def paired(points, a, b):
    """Per-seed differences b - a over the seeds both finished."""
    ra, rb = points[a]["runs"], points[b]["runs"]
    return [rb[s] - ra[s] for s in sorted(set(ra) & set(rb))]


def fmt(x, nd=4):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def t_of(ds):
    if len(ds) < 2:
        return float("nan")
    sd = statistics.stdev(ds)
    return abs(statistics.mean(ds)) / (sd / math.sqrt(len(ds))) if sd > 0 else float("inf")


def diff_cells(points, base, p):
    if p == base:
        return ["(baseline)", "", ""]
    if base not in points:
        return ["(no baseline)", "", ""]
    ds = paired(points, base, p)
    m, sd = mean_sd(ds)
    b = mean_sd(list(points[base]["runs"].values()))[0]
    return [f"{fmt(m)} ± {fmt(sd)}" if ds else "", fmt(100.0 * m / b, 2) if ds else "", fmt(t_of(ds), 1)]


def part_table(points, base, extra=None):
    head = ["point", "seeds", "val loss (mean ± sd)", "Δ vs " + base + " (paired, mean ± sd)", "Δ %", "|t|",
            "cache B/token", "% of MHA", "activated params"]
    if extra:
        head.append(extra[0])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, p in points.items():
        xs = list(p["runs"].values())
        m, sd = mean_sd(xs)
        r = p["row"]
        cells = [name, str(len(xs)), (f"{fmt(m)} ± {fmt(sd)}" if len(xs) > 1 else fmt(m)) if xs else "(not finished)"] + diff_cells(points, base, name) + [
            r["cache_bytes_per_token"], fmt(100.0 * float(r["cache_fraction_of_mha"]), 2), r["params_activated"]]
        if extra:
            v = extra[1].get(name)
            cells.append("" if v is None else f"{v:.2f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def versus(points, a, b, label):
    """One line: b against a, paired."""
    if a not in points or b not in points:
        return f"- {label}: missing"
    ds = paired(points, a, b)
    if not ds:
        return f"- {label}: no seed finished for both yet"
    m, sd = mean_sd(ds)
    word = "lower" if m < 0 else "higher"
    return (f"- {label}: {b} − {a} = {fmt(m)} ± {fmt(sd)} (paired over {len(ds)} seeds, |t| {fmt(t_of(ds), 1)}): "
            f"{b} {word}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/repro"
    parts = {}
    for part in ("main", "t5", "s2"):
        path = os.path.join(out, part, "results.csv")
        if not os.path.exists(path):
            print(f"reproduction_report: no {path}: run bench/reproduction.sh {part} (or launch/sweep --collect-only)",
                  file=sys.stderr)
            return 1
        parts[part] = load(path)
    for part, base in (("main", "mha"), ("t5", "t5_mha"), ("s2", "mha")):
        if base not in parts[part]:
            print(f"reproduction_report: {out}/{part}/results.csv has no '{base}' rows, the part's baseline: run "
                  f"bench/reproduction.sh {part} to the end (or launch/sweep --collect-only)", file=sys.stderr)
            return 1

    main_p, t5, s2 = parts["main"], parts["t5"], parts["s2"]
    print("## Tables 2/3, 6 and 7 (part main)\n")
    print(part_table(main_p, "mha", ("paper avg score", PAPER_AVG)))
    print()
    for a, b, label in [("mha", "gqa", "Table 2/3: GQA against MHA"), ("mha", "mla", "Table 2/3: MLA against MHA"),
                        ("gqa", "mla", "Table 2/3: MLA against GQA"), ("mha", "clla", "Table 2/3: CLLA against MHA"),
                        ("mla", "clla", "Table 2/3: CLLA against MLA"),
                        ("clla", "clla_quant", "Table 2/3: CLLA-quant against CLLA"),
                        ("mha", "clla_quant", "Table 2/3: CLLA-quant against MHA"),
                        ("clla", "t6_clla_share_krope", "Table 6: share-krope against CLLA"),
                        ("clla", "t6_clla_share_kvproj", "Table 6: share-kvproj against CLLA"),
                        ("clla_quant", "t7_clla_quant_share_kvproj", "Table 7: CLLA-quant+share-kvproj against CLLA-quant")]:
        print(versus(main_p, a, b, label))
    print("\n## Table 5 (part t5)\n")
    print(part_table(t5, "t5_mha", ("paper val PPL", PAPER_T5)))
    print()
    for a, b, label in [("t5_gqa_group8", "t5_cla_share2", "equal cache (1/2 of MHA): CLA-Share2 against GQA-Group8"),
                        ("t5_gqa_group4", "t5_cla_share4", "equal cache (1/4): CLA-Share4 against GQA-Group4"),
                        ("t5_gqa_group2", "t5_cla_share8", "equal cache (1/8): CLA-Share8 against GQA-Group2"),
                        ("t5_gqa_group2", "t5_gqa_group4_cla_share2", "equal cache (1/8): GQA-Group4+CLA-Share2 against GQA-Group2"),
                        ("t5_gqa_group2", "t5_mqa_dim384_cla_share2", "equal cache (1/8): MQA-Dim384-CLA-Share2 against GQA-Group2"),
                        ("t5_mqa", "t5_gqa_group2_cla_share2", "equal cache (1/16): GQA-Group2+CLA-Share2 against MQA"),
                        ("t5_mqa", "t5_mqa_dim192_cla_share2", "equal cache (1/16): MQA-Dim192-CLA-Share2 against MQA")]:
        print(versus(t5, a, b, label))
    print("\n## The 2% search (part s2)\n")
    print(part_table(s2, "mha"))
    print()
    for name, p in s2.items():
        if name == "mha":
            continue
        frac = float(p["row"]["cache_fraction_of_mha"])
        ds = paired(s2, "mha", name)
        if not ds:
            print(f"- {name}: {100 * frac:.2f}% of MHA's bytes; no seed finished for both yet")
            continue
        # paired, as the table's Δ: the seeds both finished, against MHA's mean over those seeds
        seeds = sorted(set(s2["mha"]["runs"]) & set(p["runs"]))
        base = statistics.mean(s2["mha"]["runs"][s] for s in seeds)
        m, worst = statistics.mean(ds), max(ds)
        ok_bytes, ok_loss = frac <= 0.02, m <= 0.01 * base
        print(f"- {name}: {100 * frac:.2f}% of MHA's bytes ({'meets' if ok_bytes else 'misses'} the 2% bar); mean "
              f"validation loss {fmt(base + m)} against MHA's {fmt(base)}: {100 * m / base:+.2f}% "
              f"({'within' if ok_loss else 'outside'} 1%); worst seed {100 * worst / base:+.2f}% ({len(ds)} seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
