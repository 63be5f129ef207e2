"""Writes tests/golden/<variant>/{config.json, model.safetensors, golden.safetensors}.

Small random models, input = 3 sequences (lengths 7, 12, 5) run as ONE engine
step, logits and routing computed in float64 from the stored (possibly
bf16/f16-rounded) weights. A variant whose routing is fragile (two sorted
router logits of a token closer than 1e-3, or a capacity variant that does
not really drop/reroute) is re-drawn with the next seed.

Usage: /usr/bin/python3 tools/reference/make_goldens.py [--out tests/golden] [--only NAME]
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import init_random, load_model, save_model  # noqa: E402
from routing import DispatchConfig  # noqa: E402
from safetensors_io import save_file  # noqa: E402

SEQ_LENS = [7, 12, 5]
MIN_LOGIT_GAP = 1e-3
BASE = {"format_version": 1, "vocab_size": 256, "d_model": 32, "n_layers": 2,
        "max_seq_len": 64, "norm": "layernorm", "norm_eps": 1e-5,
        "tie_embeddings": True, "tokenizer": "byte"}
SH = {"type": "switchhead", "n_heads": 4, "n_kv_heads": 4, "head_dim": 8,
      "n_experts": 4, "top_k": 2, "gate": "sigmoid"}
DENSE_ATTN = {"type": "dense", "n_heads": 4, "n_kv_heads": 4, "head_dim": 8}
DENSE_FFN = {"type": "dense", "d_ff": 32, "activation": "gelu", "bias": True}
MOE = {"type": "moe", "d_ff": 32, "n_experts": 8, "top_k": 1, "gate": "softmax",
       "activation": "relu", "bias": True}


def variant(name, attn=None, ffn=None, dispatch=None, dtype="f32", must=(), **top):
    cfg = dict(copy.deepcopy(BASE), name=name, **top)
    attn = attn or {}
    base = {} if attn.get("type") == "dense" else copy.deepcopy(SH)  # no switchhead-only keys
    cfg["attention"] = dict(base, **attn)
    cfg["ffn"] = dict(copy.deepcopy(DENSE_FFN), **(ffn or {}))
    if dispatch is not None:
        cfg["dispatch"] = dispatch
    return dict(name=name, cfg=cfg, dtype=dtype, must=must)


def dense_attn(**kw):
    return dict(DENSE_ATTN, **kw)


def moe(**kw):
    return dict(MOE, **kw)


def _replace(d, **kw):
    out = dict(d)
    out.update(kw)
    return out


VARIANTS = [
    variant("switchhead_sigmoid", attn={"rotate_fraction": 0.5}),
    variant("switchhead_e1", attn={"n_experts": 1, "top_k": 1, "rotate_fraction": 1.0},
            ffn={"activation": "silu"}, norm="rmsnorm"),
    variant("switchhead_softmax_topk", attn={"gate": "softmax_topk", "rotate_fraction": 0.25},
            ffn={"activation": "relu"}),
    variant("switchhead_shared_router", attn={"shared_router": True}, norm="rmsnorm"),
    variant("switchhead_gqa", attn={"n_kv_heads": 2, "rope_base": 500.0}, ffn={"activation": "silu"}),
    variant("switchhead_dest_values", attn={"value_routing": "destination", "n_kv_heads": 2},
            norm="rmsnorm"),
    variant("dense_mha", attn=dense_attn(), ffn={"activation": "relu", "bias": False}),
    variant("dense_gqa", attn=dense_attn(n_kv_heads=2, rotate_fraction=0.75), norm="rmsnorm"),
    variant("switch_ffn_top1_drop", attn=dense_attn(), ffn=moe(top_k=1),
            dispatch={"capacity_factor": 0.25, "min_capacity": 3, "overflow": "drop"},
            must=("ffn_dropped",)),
    variant("switch_ffn_top2_drop", attn=dense_attn(), ffn=moe(top_k=2, activation="gelu"),
            dispatch={"capacity_factor": 1.0, "min_capacity": 0, "overflow": "drop"},
            must=("ffn_dropped",), norm="rmsnorm"),
    variant("switch_ffn_top1_reroute", attn=dense_attn(), ffn=moe(top_k=1, activation="silu"),
            dispatch={"capacity_factor": 0.5, "min_capacity": 2, "overflow": "reroute"},
            must=("ffn_rerouted", "ffn_dropped")),
    variant("switch_ffn_top2_reroute", attn=dense_attn(n_kv_heads=2), ffn=moe(top_k=2),
            dispatch={"capacity_factor": 1.0, "min_capacity": 0, "overflow": "reroute"},
            must=("ffn_rerouted",)),
    variant("switch_ffn_dropless_renorm", attn=dense_attn(),
            ffn=moe(top_k=2, renormalize=True, activation="gelu"),
            dispatch={"capacity_factor": 0.0, "min_capacity": 0, "overflow": "drop"}),
    variant("sigma_moe", attn=dense_attn(), norm="rmsnorm",
            ffn=moe(top_k=2, gate="sigmoid", activation="silu", bias=False)),
    variant("switchall_capacity", attn={"n_kv_heads": 2},
            ffn=moe(top_k=2, activation="gelu", router_bias=True), tie_embeddings=False,
            dispatch={"capacity_factor": 1.0, "min_capacity": 2, "overflow": "drop"},
            must=("attn_dropped", "ffn_dropped")),
    variant("switchall_bf16", attn={"gate": "softmax_topk"},
            ffn=moe(top_k=1, activation="silu", router_bias=True), norm="rmsnorm", dtype="bf16",
            tie_embeddings=False,
            dispatch={"capacity_factor": 1.0, "min_capacity": 0, "overflow": "reroute"},
            must=("attn_rerouted", "ffn_rerouted")),
    variant("switchall_f16", attn={"n_kv_heads": 2}, ffn=moe(top_k=2, activation="relu"),
            dtype="f16", norm="rmsnorm"),
]


def check_fragile(routes):
    """Smallest gap between consecutive sorted logits over all routers/tokens."""
    worst = float("inf")
    for _, r in routes:
        z = torch.sort(r.logits, -1, descending=True).values
        if z.shape[1] > 1 and z.shape[0]:
            worst = min(worst, float((z[:, :-1] - z[:, 1:]).min()))
    return worst


def totals(routes):
    t = {}
    for (layer, module, head), r in routes:
        kind = "attn" if module.startswith("attn") else "ffn"
        for key in ("dropped", "rerouted"):
            t[f"{kind}_{key}"] = t.get(f"{kind}_{key}", 0) + sum(r.stats[key])
    return t


def build(v, seed, tmp):
    """Random model -> stored in its dtype -> reloaded in f64 -> one step."""
    from reference_model import Model
    model = init_random(Model(v["cfg"]), seed, router_std=3.0)
    save_model(model, tmp, v["dtype"])
    ref = load_model(tmp, torch.float64)
    g = torch.Generator().manual_seed(1000 + seed)
    seqs = [torch.randint(0, 256, (n,), generator=g) for n in SEQ_LENS]
    B, L = len(seqs), max(SEQ_LENS)
    tokens = torch.zeros(B, L, dtype=torch.int64)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, s in enumerate(seqs):
        tokens[b, :len(s)] = s
        valid[b, :len(s)] = True
    out = ref(tokens, valid)
    logits = out["logits"][valid]  # [N, V], sequence order then position
    # What an f32 engine would see: same routing decisions, close logits.
    out32 = load_model(tmp, torch.float32)(tokens, valid)
    same = all(torch.equal(a.expert, b.expert) and torch.equal(a.fate, b.fate)
               for (_, a), (_, b) in zip(out["routes"], out32["routes"]))
    diff32 = float((out32["logits"][valid].double() - logits).abs().max())
    return ref, torch.cat(seqs), logits, out["routes"], same, diff32


def golden_tensors(flat_tokens, logits, routes):
    t = {"tokens": flat_tokens.to(torch.int32),
         "seq_lens": torch.tensor(SEQ_LENS, dtype=torch.int32),
         "logits": logits.to(torch.float32)}
    for (layer, module, head), r in routes:
        p = f"stats.{layer}.{module}.{head}."
        for key in ("routed", "kept", "rerouted", "dropped"):
            t[p + key] = torch.tensor(r.stats[key], dtype=torch.int32)
        t[p + "prob_sum"] = torch.tensor(r.stats["prob_sum"], dtype=torch.float32)
        t[p + "tokens"] = torch.tensor([r.stats["tokens"]], dtype=torch.int32)
        t[p + "aux_loss"] = torch.tensor([r.stats["aux_loss"]], dtype=torch.float32)
        p = f"route.{layer}.{module}.{head}."
        t[p + "expert"] = r.expert.to(torch.int32)
        t[p + "fate"] = r.fate.to(torch.int32)
        t[p + "gate"] = r.gate.to(torch.float32)
    return t


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests", "golden"))
    ap.add_argument("--only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for v in VARIANTS:
        if args.only and v["name"] != args.only:
            continue
        for seed in range(100):
            tmp = tempfile.mkdtemp()
            try:
                ref, flat, logits, routes, same32, diff32 = build(v, seed, tmp)
                gap = check_fragile(routes)
                tot = totals(routes)
                ok = gap > MIN_LOGIT_GAP and all(tot.get(m, 0) > 0 for m in v["must"])
                if ok and not same32:
                    raise SystemExit(f"{v['name']}: f32 routing differs from f64 despite gap {gap}")
                if ok:
                    dst = os.path.join(args.out, v["name"])
                    shutil.rmtree(dst, ignore_errors=True)
                    os.makedirs(dst)
                    for f in ("config.json", "model.safetensors"):
                        shutil.copy(os.path.join(tmp, f), dst)
                    save_file(golden_tensors(flat, logits, routes),
                              os.path.join(dst, "golden.safetensors"),
                              metadata={"seed": seed, "generator": "tools/reference/make_goldens.py"})
                    break
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise SystemExit(f"{v['name']}: no robust seed found")
        aux = " ".join(f"{m[0]}.{m[1]}.{m[2]}={r.stats['aux_loss']:.3f}" for m, r in routes)
        caps = sorted({f"{m[1]}:C={r.stats['capacity']}" for m, r in routes})
        print(f"{v['name']}: seed {seed}, dtype {v['dtype']}, {len(routes)} routers, "
              f"min logit gap {gap:.4f}, drops attn/ffn {tot.get('attn_dropped', 0)}/"
              f"{tot.get('ffn_dropped', 0)}, reroutes attn/ffn {tot.get('attn_rerouted', 0)}/"
              f"{tot.get('ffn_rerouted', 0)} {' '.join(caps)}, |f32-f64| logits {diff32:.1e}")
        if aux:
            print(f"  aux: {aux}")


if __name__ == "__main__":
    main()
