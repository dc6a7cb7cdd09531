#!/usr/bin/env python3
"""Writes configs/paper/*.json (the CLLA paper's models) and configs/tiny/*.json (CPU-sized twins).

The paper (CLLA, Appendix A): hidden 1536, 32 layers, 16 heads of dim 96, vocab 128256, an MoE FFN
of 1 shared + 16 routed experts with top-1 routing in every layer, MLA latent 512, query LoRA 768,
RoPE head dim 64. Table 8 gives the FFN intermediate sizes of the five main models; Table 9 the
training recipe. Tables 5 to 7 are ablations; the paper does not give their FFN sizes, only "the
same model size": for Table 5 we pick the intermediate size (a multiple of 64) whose activated
parameter count is closest to MHA's, the rule that turns MHA's 3840 into GQA's 4096 in Table 8
(docs/MOE.md). Tables 6 and 7 use CLLA's 4160 ("identical settings").

The tiny twins (configs/tiny) keep the structure at CPU size. Tables 2/3, 6 and 7: hidden 64, 4 heads
of 16; the FFN width of the five main models is the integer whose activated parameters (clla info)
are closest to tiny MHA's, as Table 8 matches them (Tables 6 and 7 take tiny CLLA's width, as the
paper takes CLLA's). Table 5 needs 16 query heads for its kv-head counts (8, 4, 2, 1 of 16) to stay
distinct, so its twins (t5_*) are hidden 128, 16 heads of 8 (the head-width variants 4 x 32 and
8 x 16), with their own MHA baseline t5_mha, each FFN width matched to t5_mha's activated
parameters the same way. The s2_* twins are the candidates of the search for a cache at or below 2%
of MHA's bytes per token (docs/REPRODUCTION.md): CLLA with the rope key shared too, longer
sharing, fewer bits, matched like the main models. Matching runs the clla binary (--clla, default build/clla).

Run from the repository root: python3 scripts/gen_paper_configs.py [--clla build/clla]
(re-running is idempotent).
"""
import argparse
import json
import os
import subprocess
import tempfile

V, C, L, NH, D = 128256, 1536, 32, 16, 96
KV_LORA, Q_LORA, ROPE = 512, 768, 64
E, K = 16, 1

MOE = {
    "n_routed_experts": E, "n_shared_experts": 1, "num_experts_per_tok": K, "first_k_dense_layers": 0,
    "moe_aux_loss_coef": 0.005, "moe_z_loss_coef": 0.0, "moe_capacity_factor": 1.5, "norm_topk_prob": False,
}

# Table 9. 4M tokens per step = 1024 sequences of 4096 (the sequence length is not in the paper).
def recipe(tokens):
    gbt = 4 * 1024 * 1024
    return {
        "seq_len": 4096, "micro_batch": 1, "global_batch_tokens": gbt,
        "max_steps": -(-tokens // gbt), "warmup_steps": 2000,
        "lr": 4.2e-4, "min_lr": 4.2e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
        "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1234, "log_every": 10, "val_every": 1000,
    }


def base(attention, inter, comment):
    cfg = {
        "comment": comment,
        "attention": attention,
        "vocab_size": V, "hidden_size": C, "num_hidden_layers": L,
        "num_attention_heads": NH, "num_key_value_heads": NH, "head_dim": D, "v_head_dim": D,
        "intermediate_size": inter, "moe_intermediate_size": inter,
    }
    cfg.update(MOE)
    cfg.update({"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
                # one V x C matrix, as Table 8 counts it (docs/MOE.md)
                "tie_word_embeddings": True, "initializer_range": 0.02})
    return cfg


def latent(cfg):
    cfg.update({"kv_lora_rank": KV_LORA, "q_lora_rank": Q_LORA, "qk_rope_head_dim": ROPE})
    return cfg


def plain_activated(nh, nkv, d, share, inter):
    """Activated non-embedding parameters of a non-latent config (analytic; clla info agrees)."""
    total = 0
    for l in range(L):
        attn = C * nh * d * 2 + (2 * C * nkv * d if l % share == 0 else 0)
        ffn = 2 * 3 * C * inter + E * C     # shared + top-1 routed expert, router
        total += attn + ffn + 2 * C
    return total + C


def matched_inter(nh, nkv, d, share):
    target = plain_activated(NH, NH, D, 1, 3840)
    return min(range(64, 16384, 64), key=lambda i: abs(plain_activated(nh, nkv, d, share, i) - target))


def main_models(tokens=300 * 10**9):
    out = {}
    t8 = "CLLA paper Table 8 / Table 9 (300B tokens)"
    out["mha"] = base("mha", 3840, f"{t8}: MHA")
    g = base("gqa", 4096, f"{t8}: GQA, 8 kv heads")
    g["num_key_value_heads"] = 8
    out["gqa"] = g
    out["mla"] = latent(base("mla", 3840, f"{t8}: MLA"))
    out["clla"] = latent(base("clla", 4160, f"{t8}: CLLA (latent shared by 2 layers, own up-projections)"))
    out["clla_quant"] = latent(base("clla_quant", 4160, f"{t8}: CLLA-quant (int4 latent, group 32)"))
    for cfg in out.values():
        cfg["train"] = recipe(tokens)
    return out


def ablations():
    out = {}
    t5 = "CLLA paper Table 5 (50B tokens); FFN size matched to MHA's activated parameters (docs/MOE.md)"
    rows = [  # name, preset, heads, kv heads, head dim, share factor
        ("gqa_group8", "gqa", 16, 8, 96, 1), ("gqa_group4", "gqa", 16, 4, 96, 1),
        ("gqa_group2", "gqa", 16, 2, 96, 1), ("mqa", "mqa", 16, 1, 96, 1),
        ("cla_share2", "cla", 16, 16, 96, 2), ("cla_share4", "cla", 16, 16, 96, 4),
        ("cla_share8", "cla", 16, 16, 96, 8), ("gqa_group4_cla_share2", "gqa_cla", 16, 4, 96, 2),
        ("gqa_group2_cla_share2", "gqa_cla", 16, 2, 96, 2), ("mqa_dim384_cla_share2", "gqa_cla", 4, 1, 384, 2),
        ("mqa_dim192_cla_share2", "gqa_cla", 8, 1, 192, 2),
    ]
    for name, preset, nh, nkv, d, share in rows:
        inter = matched_inter(nh, nkv, d, share)
        cfg = base(preset, inter, f"{t5}: {name}")
        cfg.update({"num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": d, "v_head_dim": d,
                    "share_factor": share})
        cfg["train"] = recipe(50 * 10**9)
        out["t5_" + name] = cfg
    t67 = "CLLA paper Tables 6/7 (300B tokens, CLLA's FFN size)"
    for name in ("clla_share_krope", "clla_share_kvproj", "clla_quant_share_kvproj"):
        cfg = latent(base(name, 4160, f"{t67}: {name}"))
        cfg["train"] = recipe(300 * 10**9)
        out[("t7_" if "quant" in name else "t6_") + name] = cfg
    return out


QUICKSTART_VOCAB = 4096


def tiny(cfg, table5=False):
    """The same structure at CPU size, 8 layers (so every sharing factor stays distinct), 16 routed
    experts + 1 shared, top-1. Main models: hidden 64, heads / 4, head dim 16; Table 5: hidden 128,
    the paper's head counts, head dims / 12. Latent 32, query LoRA 48, RoPE 8. The FFN width is set
    by match_ffn."""
    t = json.loads(json.dumps(cfg))
    t["comment"] = "CPU-sized twin of configs/paper (same presets and MoE routing, small shapes): " + cfg["comment"]
    # vocab_size: the quickstart's tokenizer (scripts/quickstart.sh: 4096 ids), so a tiny model trains on the
    # shards the quickstart makes (docs/QUICKSTART.md); tests/test_tiny_configs.sh keeps the two equal.
    t.update({"vocab_size": QUICKSTART_VOCAB, "num_hidden_layers": 8, "max_position_embeddings": 256})
    if table5:
        t["hidden_size"] = 128
        t["head_dim"] = t["v_head_dim"] = cfg["head_dim"] // 12
    else:
        t["hidden_size"] = 64
        t["num_attention_heads"] = max(1, cfg["num_attention_heads"] // 4)
        t["num_key_value_heads"] = max(1, cfg["num_key_value_heads"] // 4)
        t["head_dim"] = t["v_head_dim"] = max(8, cfg["head_dim"] // 6)
    if "kv_lora_rank" in t:
        t.update({"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8})
    t["train"] = {"seq_len": 128, "micro_batch": 4, "global_batch_tokens": 1024, "max_steps": 200,
                  "warmup_steps": 20, "lr": 1e-3, "min_lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                  "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1234, "log_every": 10, "val_every": 50}
    return t


def activated(clla, cfg):
    """Activated parameters of cfg as `clla info --json` counts them (docs/MOE.md)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(cfg, f)
        f.flush()
        out = subprocess.run([clla, "info", "--config", f.name, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["params_activated"]


def with_ffn(cfg, inter):
    c = json.loads(json.dumps(cfg))
    c["intermediate_size"] = c["moe_intermediate_size"] = inter
    return c


def match_ffn(clla, cfg, target):
    """cfg with the FFN width whose activated parameters are closest to target (ties: the smaller
    width). The count is affine in the width, so two evaluations find it."""
    a0, a1 = activated(clla, with_ffn(cfg, 16)), activated(clla, with_ffn(cfg, 17))
    best = max(1, round(16 + (target - a0) / (a1 - a0)))
    best = min((best - 1, best, best + 1), key=lambda i: (abs(activated(clla, with_ffn(cfg, i)) - target), i))
    return with_ffn(cfg, best)


def write(path, cfg):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def tiny_models(clla, models):
    out = {name: tiny(cfg, table5=name.startswith("t5_")) for name, cfg in models.items()}
    # Table 5's own MHA baseline at its shape
    t5_mha = tiny(models["mha"], table5=True)
    t5_mha["comment"] = t5_mha["comment"].replace("Table 8 / Table 9 (300B tokens): MHA", "Table 5's shape: the MHA baseline of the t5_* twins")
    out["t5_mha"] = with_ffn(t5_mha, round(3840 * 128 / C))
    mha = with_ffn(out["mha"], round(3840 * 64 / C))
    out["mha"] = mha
    for name in ("gqa", "mla", "clla", "clla_quant"):
        out[name] = match_ffn(clla, out[name], activated(clla, mha))
    # the 2% search (docs/REPRODUCTION.md): bytes per token of tiny MHA 2048, 2% = 40.96
    for name, share, bits, rank, rope in (("s2_krope_f8_b4", 8, 4, 32, 8), ("s2_krope_f4_b2_rope4", 4, 2, 32, 4),
                                          ("s2_krope_f8_b2_r64", 8, 2, 64, 8)):
        c = json.loads(json.dumps(out["clla"]))
        c["comment"] = ("CPU-sized candidate of the search for a cache at or below 2% of MHA's bytes per token "
                        f"(docs/REPRODUCTION.md): CLLA sharing latent and rope key over {share} layers, "
                        f"{bits}-bit latent of width {rank}, rope key {rope}; FFN matched to tiny MHA's activated parameters")
        c.update({"attention": "clla_share_krope", "share_factor": share, "latent_quant_bits": bits, "latent_quant_group": 32,
                  "kv_lora_rank": rank, "qk_rope_head_dim": rope})
        out[name] = match_ffn(clla, c, activated(clla, mha))
    for name in out:
        if name.startswith("t5_") and name != "t5_mha":
            out[name] = match_ffn(clla, out[name], activated(clla, out["t5_mha"]))
        elif name.startswith(("t6_", "t7_")):
            out[name] = with_ffn(out[name], out["clla"]["intermediate_size"])
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clla", default="build/clla", help="the clla binary that counts activated parameters (default build/clla)")
    args = ap.parse_args()
    if not os.access(args.clla, os.X_OK):
        raise SystemExit(f"gen_paper_configs: {args.clla} is not an executable clla binary: build it (scripts/build.sh) or pass --clla")
    models = main_models()
    models.update(ablations())
    for name, cfg in models.items():
        write(f"configs/paper/{name}.json", cfg)
    tinies = tiny_models(args.clla, models)
    for name, cfg in tinies.items():
        write(f"configs/tiny/{name}.json", cfg)
    print(f"wrote {len(models)} configs to configs/paper and {len(tinies)} to configs/tiny")
