#!/usr/bin/env python3
"""Writes configs/paper/*.json (the CLLA paper's models) and configs/tiny/*.json (CPU-sized twins).

The paper (CLLA, Appendix A): hidden 1536, 32 layers, 16 heads of dim 96, vocab 128256, an MoE FFN
of 1 shared + 16 routed experts with top-1 routing in every layer, MLA latent 512, query LoRA 768,
RoPE head dim 64. Table 8 gives the FFN intermediate sizes of the five main models; Table 9 the
training recipe. Tables 5 to 7 are ablations; the paper does not give their FFN sizes, only "the
same model size": for Table 5 we pick the intermediate size (a multiple of 64) whose activated
parameter count is closest to MHA's, the rule that turns MHA's 3840 into GQA's 4096 in Table 8
(docs/MOE.md). Tables 6 and 7 use CLLA's 4160 ("identical settings").

Run from the repository root: python3 scripts/gen_paper_configs.py (re-running is idempotent).
"""
import json
import os

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


def tiny(cfg):
    """The same structure at CPU size: hidden 64, 8 layers (so every sharing factor stays distinct), 4 heads of 16, 16 routed experts + 1 shared,
    FFN sizes scaled by 64/1536 (rounded to 16), latent 32, query LoRA 48, RoPE 8."""
    t = json.loads(json.dumps(cfg))
    s = 64 / C
    t["comment"] = "CPU-sized twin of configs/paper (same presets and MoE routing, small shapes): " + cfg["comment"]
    # vocab_size: the quickstart's tokenizer (scripts/quickstart.sh: 4096 ids), so a tiny model trains on the
    # shards the quickstart makes (docs/QUICKSTART.md); tests/test_tiny_configs.sh keeps the two equal.
    t.update({"vocab_size": QUICKSTART_VOCAB, "hidden_size": 64, "num_hidden_layers": 8, "max_position_embeddings": 256})
    t["num_attention_heads"] = max(1, cfg["num_attention_heads"] // 4)
    t["num_key_value_heads"] = max(1, cfg["num_key_value_heads"] // 4)
    t["head_dim"] = t["v_head_dim"] = max(8, cfg["head_dim"] // 6)
    inter = max(16, int(round(cfg["moe_intermediate_size"] * s / 16)) * 16)
    t["intermediate_size"] = t["moe_intermediate_size"] = inter
    if "kv_lora_rank" in t:
        t.update({"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8})
    t["train"] = {"seq_len": 128, "micro_batch": 4, "global_batch_tokens": 1024, "max_steps": 200,
                  "warmup_steps": 20, "lr": 1e-3, "min_lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                  "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1234, "log_every": 10, "val_every": 50}
    return t


def write(path, cfg):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    models = main_models()
    models.update(ablations())
    for name, cfg in models.items():
        write(f"configs/paper/{name}.json", cfg)
        write(f"configs/tiny/{name}.json", tiny(cfg))
    print(f"wrote {len(models)} configs to configs/paper and configs/tiny")
