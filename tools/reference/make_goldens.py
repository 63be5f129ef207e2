"""Writes tests/golden/<variant>/{config.json, model.safetensors, golden.safetensors}.

Small random models, input = 3 sequences (lengths 7, 12, 5 unless the variant
says otherwise) run as ONE engine step, logits and routing computed in float64
from the stored (possibly bf16/f16-rounded) weights. A variant whose routing is
fragile (two sorted router logits of a token closer than 1e-3, or a capacity
variant that does not really drop/reroute) is re-drawn with the next seed.

A variant with a chunk schedule (`steps`) is also run step by step through the
KV cache; its results must equal the one-step run's (routing exactly, logits
to 1e-12), and the schedule is stored for the engine to replay.

Every variant's config.json is what the C++ engine parses (tests/golden/);
the --pending-out folder is for variants of format features the engine does
not parse yet (none now: it stays empty).

Usage: /usr/bin/python3 tools/reference/make_goldens.py [--out tests/golden]
           [--pending-out tests/golden-pending] [--only NAME]
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
# Every key of every variant is parsed by the C++ engine (capacity_scope /
# capacity_group, attention.position, output_bias), so every variant is
# written to tests/golden/ with its config.json as given. A future format
# feature the engine does not parse yet would be kept out of tests/golden/ by
# engine_config (returning None sends a variant to the pending folder).
BASE = {"format_version": 1, "vocab_size": 256, "d_model": 32, "n_layers": 2,
        "max_seq_len": 64, "norm": "layernorm", "norm_eps": 1e-5,
        "tie_embeddings": True, "tokenizer": "byte"}
SH = {"type": "switchhead", "n_heads": 4, "n_kv_heads": 4, "head_dim": 8,
      "n_experts": 4, "top_k": 2, "gate": "sigmoid"}
DENSE_ATTN = {"type": "dense", "n_heads": 4, "n_kv_heads": 4, "head_dim": 8}
DENSE_FFN = {"type": "dense", "d_ff": 32, "activation": "gelu", "bias": True}
MOE = {"type": "moe", "d_ff": 32, "n_experts": 8, "top_k": 1, "gate": "softmax",
       "activation": "relu", "bias": True}


def variant(name, attn=None, ffn=None, dispatch=None, dtype="f32", must=(), seq_lens=None, steps=None,
            **top):
    """steps: optional chunk schedule, [step][sequence] = tokens of that
    sequence computed in that step (0: not in the step)."""
    cfg = dict(copy.deepcopy(BASE), name=name, **top)
    attn = attn or {}
    base = {} if attn.get("type") == "dense" else copy.deepcopy(SH)  # no switchhead-only keys
    cfg["attention"] = dict(base, **attn)
    cfg["ffn"] = dict(copy.deepcopy(DENSE_FFN), **(ffn or {}))
    if dispatch is not None:
        cfg["dispatch"] = dispatch
    seq_lens = list(seq_lens or SEQ_LENS)
    if steps is not None:
        assert [sum(col) for col in zip(*steps)] == seq_lens, f"{name}: steps do not add up to seq_lens"
    return dict(name=name, cfg=cfg, dtype=dtype, must=must, seq_lens=seq_lens, steps=steps)


def step_scope(**d):
    """A finite-capacity dispatch with the step scope (the Switch training rule)."""
    return dict(d, capacity_scope="step")


def seq_scope(group, **d):
    return dict(d, capacity_scope="sequence", capacity_group=group)


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
            dispatch=step_scope(**{"capacity_factor": 0.25, "min_capacity": 3, "overflow": "drop"}),
            must=("ffn_dropped",)),
    variant("switch_ffn_top2_drop", attn=dense_attn(), ffn=moe(top_k=2, activation="gelu"),
            dispatch=step_scope(**{"capacity_factor": 1.0, "min_capacity": 0, "overflow": "drop"}),
            must=("ffn_dropped",), norm="rmsnorm"),
    variant("switch_ffn_top1_reroute", attn=dense_attn(), ffn=moe(top_k=1, activation="silu"),
            dispatch=step_scope(**{"capacity_factor": 0.5, "min_capacity": 2, "overflow": "reroute"}),
            must=("ffn_rerouted", "ffn_dropped")),
    variant("switch_ffn_top2_reroute", attn=dense_attn(n_kv_heads=2), ffn=moe(top_k=2),
            dispatch=step_scope(**{"capacity_factor": 1.0, "min_capacity": 0, "overflow": "reroute"}),
            must=("ffn_rerouted",)),
    variant("switch_ffn_dropless_renorm", attn=dense_attn(),
            ffn=moe(top_k=2, renormalize=True, activation="gelu"),
            dispatch={"capacity_factor": 0.0, "min_capacity": 0, "overflow": "drop"}),
    variant("sigma_moe", attn=dense_attn(), norm="rmsnorm",
            ffn=moe(top_k=2, gate="sigmoid", activation="silu", bias=False)),
    variant("switchall_capacity", attn={"n_kv_heads": 2},
            ffn=moe(top_k=2, activation="gelu", router_bias=True), tie_embeddings=False,
            dispatch=step_scope(**{"capacity_factor": 1.0, "min_capacity": 2, "overflow": "drop"}),
            must=("attn_dropped", "ffn_dropped")),
    variant("switchall_bf16", attn={"gate": "softmax_topk"},
            ffn=moe(top_k=1, activation="silu", router_bias=True), norm="rmsnorm", dtype="bf16",
            tie_embeddings=False,
            dispatch=step_scope(**{"capacity_factor": 1.0, "min_capacity": 0, "overflow": "reroute"}),
            must=("attn_rerouted", "ffn_rerouted")),
    variant("switchall_f16", attn={"n_kv_heads": 2}, ffn=moe(top_k=2, activation="relu"),
            dtype="f16", norm="rmsnorm"),
    # sequence-scope capacity: per sequence, groups of G positions
    variant("seq_ffn_top2_drop_g4", attn=dense_attn(), ffn=moe(top_k=2, activation="gelu"),
            dispatch=seq_scope(4, capacity_factor=1.0, min_capacity=0, overflow="drop"),
            must=("ffn_dropped",), norm="rmsnorm"),
    variant("seq_ffn_top1_reroute_g10", attn=dense_attn(), ffn=moe(top_k=1, activation="silu"),
            dispatch=seq_scope(10, capacity_factor=0.5, min_capacity=0, overflow="reroute"),
            must=("ffn_rerouted", "ffn_dropped")),
    variant("seq_switchall_drop_g8", attn={"n_kv_heads": 2},
            ffn=moe(top_k=2, activation="gelu", router_bias=True), tie_embeddings=False,
            dispatch=seq_scope(8, capacity_factor=1.0, min_capacity=0, overflow="drop"),
            must=("attn_dropped", "ffn_dropped")),
    variant("seq_switchall_reroute_g16", attn={"gate": "softmax_topk"}, ffn=moe(top_k=2, activation="relu"),
            norm="rmsnorm", dispatch=seq_scope(16, capacity_factor=0.5, min_capacity=0, overflow="reroute"),
            must=("attn_rerouted", "ffn_rerouted")),
    variant("seq_switchall_chunked_g5", attn={"n_kv_heads": 2}, ffn=moe(top_k=2, activation="silu"),
            dispatch=seq_scope(5, capacity_factor=0.5, min_capacity=0, overflow="reroute"),
            steps=[[3, 5, 2], [1, 1, 1], [1, 1, 1], [2, 5, 1]],
            must=("attn_rerouted", "ffn_rerouted", "attn_dropped")),
    # Transformer-XL relative positions (attention.position "xl", pos_to_pk); head_dim != d/H;
    # sequences past a KV block (16 tokens); a chunk schedule crossing blocks
    variant("xl_switchhead", attn={"position": "xl", "n_heads": 2, "n_kv_heads": 2, "head_dim": 12},
            seq_lens=[40, 23, 5], steps=[[24, 16, 5], [16, 7, 0]]),
    variant("xl_switchhead_e1", attn={"position": "xl", "n_experts": 1, "top_k": 1}, norm="rmsnorm",
            ffn={"activation": "silu"}, seq_lens=[33, 17, 2], steps=[[1, 17, 2], [16, 0, 0], [16, 0, 0]]),
    variant("xl_switchall_sigma", attn={"position": "xl", "n_heads": 3, "n_kv_heads": 3, "head_dim": 10, "n_experts": 5,
                                        "top_k": 3},
            ffn=moe(top_k=2, gate="sigmoid", activation="relu", bias=False), output_bias=True,
            seq_lens=[37, 18, 9], steps=[[20, 18, 0], [17, 0, 9]]),
    variant("xl_dense_gqa", attn=dense_attn(position="xl", n_kv_heads=2, head_dim=6), tie_embeddings=False,
            output_bias=True, seq_lens=[21, 17, 30], steps=[[5, 17, 16], [16, 0, 14]]),
    variant("xl_shared_dest", attn={"position": "xl", "shared_router": True, "value_routing": "destination",
                                    "n_kv_heads": 2, "gate": "softmax_topk"},
            ffn=moe(top_k=1, activation="gelu"), norm="rmsnorm", seq_lens=[19, 34, 6],
            steps=[[19, 3, 6], [0, 31, 0]]),
    variant("xl_seq_capacity_g16", attn={"position": "xl", "n_kv_heads": 2},
            ffn=moe(top_k=2, activation="silu"), seq_lens=[40, 23, 5], steps=[[24, 16, 5], [16, 7, 0]],
            dispatch=seq_scope(16, capacity_factor=0.5, min_capacity=0, overflow="reroute"),
            must=("attn_rerouted", "attn_dropped", "ffn_rerouted")),
    # one sequence past the engine's 512-token prefill chunk
    variant("xl_long", attn={"position": "xl", "n_experts": 1, "top_k": 1, "head_dim": 12, "n_heads": 2,
                                 "n_kv_heads": 2},
            seq_lens=[530], max_seq_len=1024, steps=[[512], [18]]),
    # output experts of 12 rows of 1 KiB (d_model 256, f32): the CPU kernels' in-order
    # streaming of long rows, 8 rows at a time, for a single row and for a few rows per expert
    variant("switchall_wide", attn={"head_dim": 12}, d_model=256, ffn=moe(top_k=2, activation="silu"),
            norm="rmsnorm"),
    # no capacity_scope / capacity_group: the defaults (sequence, G = 128)
    variant("seq_default_scope", attn={}, ffn=moe(top_k=2, activation="gelu"),
            dispatch={"capacity_factor": 0.05, "min_capacity": 0, "overflow": "drop"},
            must=("attn_dropped", "ffn_dropped")),
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


def run_steps(ref, seqs, steps):
    """Runs the sequences through the KV cache by the chunk schedule. Returns
    (logits [N, V], routes) in sequence-then-position order, as one step would,
    with the routing trace of each router re-assembled per token."""
    B = len(seqs)
    cache = ref.new_cache()
    done = [0] * B
    logits = [[] for _ in range(B)]
    trace = {}  # router id -> [per sequence list of (expert, fate, gate) chunks]
    for counts in steps:
        L = max(counts)
        tokens = torch.zeros(B, L, dtype=torch.int64)
        valid = torch.zeros(B, L, dtype=torch.bool)
        positions = torch.zeros(B, L, dtype=torch.int64)
        for b, n in enumerate(counts):
            tokens[b, :n] = seqs[b][done[b]:done[b] + n]
            valid[b, :n] = True
            positions[b] = done[b] + torch.arange(L)
        out = ref(tokens, valid, positions, cache)
        for b, n in enumerate(counts):
            logits[b].append(out["logits"][b, :n])
        offsets = torch.tensor([0] + list(counts)).cumsum(0).tolist()
        for rid, r in out["routes"]:
            per = trace.setdefault(rid, [[] for _ in range(B)])
            for b in range(B):
                a, z = offsets[b], offsets[b + 1]
                per[b].append((r.expert[a:z], r.fate[a:z], r.gate[a:z]))
        done = [d + n for d, n in zip(done, counts)]
    flat = torch.cat([torch.cat(parts) for parts in logits])
    routes = {rid: tuple(torch.cat([torch.cat([c[i] for c in per[b]]) for b in range(B)]) for i in range(3))
              for rid, per in trace.items()}
    return flat, routes


def build(v, seed, tmp):
    """Random model -> stored in its dtype -> reloaded in f64 -> one step."""
    from reference_model import Model
    model = init_random(Model(v["cfg"]), seed, router_std=3.0)
    save_model(model, tmp, v["dtype"])
    ref = load_model(tmp, torch.float64)
    g = torch.Generator().manual_seed(1000 + seed)
    seq_lens = v["seq_lens"]
    seqs = [torch.randint(0, 256, (n,), generator=g) for n in seq_lens]
    B, L = len(seqs), max(seq_lens)
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
    if v["steps"] is not None:
        chunked, croutes = run_steps(ref, seqs, v["steps"])
        rel = float((chunked - logits).abs().max() / logits.abs().max())
        same_routes = all(torch.equal(croutes[rid][0], r.expert) and torch.equal(croutes[rid][1], r.fate)
                          and (r.gate.numel() == 0 or float((croutes[rid][2] - r.gate).abs().max()) < 1e-12)
                          for rid, r in out["routes"])
        if rel > 1e-12 or not same_routes:
            raise SystemExit(f"{v['name']}: chunked run differs from one step (logits rel {rel:.1e}, "
                             f"routing same: {same_routes})")
    return ref, torch.cat(seqs), logits, out["routes"], same, diff32


def golden_tensors(v, flat_tokens, logits, routes):
    t = {"tokens": flat_tokens.to(torch.int32),
         "seq_lens": torch.tensor(v["seq_lens"], dtype=torch.int32),
         "logits": logits.to(torch.float32)}
    if v["steps"] is not None:
        t["steps"] = torch.tensor(v["steps"], dtype=torch.int32)
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


def engine_config(cfg):
    """(config.json for tests/golden/, or None: the pending folder)."""
    return cfg


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests", "golden"))
    ap.add_argument("--pending-out", default=os.path.join(root, "tests", "golden-pending"))
    ap.add_argument("--only")
    args = ap.parse_args()
    torch.set_num_threads(1)
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
                    cfg = engine_config(v["cfg"])
                    dst = os.path.join(args.out if cfg is not None else args.pending_out, v["name"])
                    shutil.rmtree(dst, ignore_errors=True)
                    os.makedirs(dst)
                    shutil.copy(os.path.join(tmp, "model.safetensors"), dst)
                    with open(os.path.join(dst, "config.json"), "w") as f:
                        json.dump(cfg if cfg is not None else v["cfg"], f, indent=2)
                        f.write("\n")
                    save_file(golden_tensors(v, flat, logits, routes),
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
