"""Self-checks of the reference: safetensors round trip, dispatch semantics on
hand-made cases with known answers, the vectorised model against a naive
per-token implementation of docs/design.md, incremental decoding == full pass,
and generate() batch/padding consistency. Exits non-zero on any failure.

Usage: /usr/bin/python3 tools/reference/selfcheck.py
"""
import copy
import math
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import init_random, load_model, save_model  # noqa: E402
from reference_model import Model, apply_rope, rotary_dims  # noqa: E402
from routing import DROPPED, KEPT, REROUTED, DispatchConfig, dispatch, route  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def close(a, b, tol=1e-9):
    return a.shape == b.shape and float((a - b).abs().max()) <= tol


# ------------------------------------------------------------ safetensors --
def check_safetensors():
    g = torch.Generator().manual_seed(0)
    t = {"f32": torch.randn(3, 4, generator=g), "f16": torch.randn(5, generator=g).half(),
         "bf16": torch.randn(2, 3, generator=g).bfloat16(), "i32": torch.arange(6, dtype=torch.int32).view(2, 3),
         "i64": torch.tensor([-1, 2**40]), "scalar_shape": torch.zeros(0, 4)}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        save_file(t, p, metadata={"k": "v"})
        back = load_file(p)
        ok = set(back) == set(t) and all(back[k].dtype == t[k].dtype and torch.equal(back[k], t[k]) for k in t)
        check(ok, "safetensors round trip F32/F16/BF16/I32/I64 (+ empty tensor)")
        raw = open(p, "rb").read()
        n = int.from_bytes(raw[:8], "little")
        check((8 + n) % 8 == 0 and raw[8:9] == b"{", "safetensors header: u64 LE length, JSON, aligned data")
        open(p, "wb").write(raw[:-3])
        try:
            load_file(p)
            check(False, "truncated file rejected")
        except ValueError:
            check(True, "truncated file rejected")


# ------------------------------------------------------------- dispatch --
def orders(rows):
    return torch.tensor(rows)


def check_dispatch():
    # 4 tokens, E=2, k=1, everyone prefers expert 0; C = ceil(1*4*1/2) = 2.
    o = orders([[0, 1]] * 4)
    cap = DispatchConfig(1.0, 0, "drop").capacity(4, 1, 2)
    check(cap == 2, "capacity ceil(cf*T*k/E)")
    e, f, c = dispatch(o, 1, 2, cap, "drop")
    check(f.flatten().tolist() == [KEPT, KEPT, DROPPED, DROPPED] and e.flatten().tolist() == [0, 0, 0, 0]
          and c == dict(routed=[4, 0], kept=[2, 0], rerouted=[0, 0], dropped=[2, 0]), "drop: step order fills first")
    e, f, c = dispatch(o, 1, 2, cap, "reroute")
    check(f.flatten().tolist() == [KEPT, KEPT, REROUTED, REROUTED] and e.flatten().tolist() == [0, 0, 1, 1]
          and c == dict(routed=[4, 0], kept=[2, 2], rerouted=[2, 0], dropped=[0, 0]), "reroute: next-best expert")
    # C = 1: the third token finds both experts full -> dropped, reported on its original expert.
    e, f, c = dispatch(o, 1, 2, 1, "reroute")
    check(f.flatten().tolist() == [KEPT, REROUTED, DROPPED, DROPPED] and e.flatten().tolist() == [0, 1, 0, 0]
          and c == dict(routed=[4, 0], kept=[1, 1], rerouted=[1, 0], dropped=[2, 0]), "reroute: none free -> drop")
    # rank-major, k=2, E=3, C=2: t2's first choice finds expert 0 full (t0, t1 took it);
    # its second choice (1) is NOT a reroute target, the next one (2) is.
    o = orders([[0, 1, 2], [0, 2, 1], [0, 1, 2]])
    e, f, c = dispatch(o, 2, 3, 2, "drop")
    check(e.tolist() == [[0, 1], [0, 2], [0, 1]] and f.tolist() == [[0, 0], [0, 0], [2, 0]]
          and c["kept"] == [2, 2, 1] and c["dropped"] == [1, 0, 0] and c["routed"] == [3, 2, 1], "rank-major drop, k=2")
    e, f, c = dispatch(o, 2, 3, 2, "reroute")
    check(e.tolist() == [[0, 1], [0, 2], [2, 1]] and f.tolist() == [[0, 0], [0, 0], [1, 0]]
          and c["kept"] == [2, 2, 2] and c["rerouted"] == [1, 0, 0], "rank-major reroute skips own choices")
    # rank-major: first choices of ALL tokens come before any second choice.
    o = orders([[1, 0], [0, 1], [0, 1]])
    e, f, c = dispatch(o, 2, 2, 2, "drop")
    check(f.tolist() == [[0, 2], [0, 0], [0, 2]], "rank-major: t0's 2nd choice after t2's 1st")
    # dropless fast path == the slot-filling loop with unlimited slots
    o = torch.sort(torch.randn(50, 6, generator=torch.Generator().manual_seed(3)), -1, descending=True).indices
    e1, f1, c1 = dispatch(o, 3, 6, None, "drop")
    e2, f2, c2 = dispatch(o, 3, 6, 10**9, "reroute")
    check(torch.equal(e1, e2) and torch.equal(f1, f2) and c1 == c2, "dropless == unlimited capacity")
    # min_capacity, dropless
    check(DispatchConfig(0.1, 3, "drop").capacity(10, 1, 4) == 3, "min_capacity floor")
    check(DispatchConfig(0.0, 3, "drop").capacity(10, 1, 4) is None, "cf <= 0 is dropless")
    # route(): ties to the lower index; rerouted assignment keeps its gate weight; stats.
    z = torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.5, 0.0], [2.0, 0.0, 1.0]], dtype=torch.float64)
    r = route(z, 1, "softmax", DispatchConfig(1.0, 1, "reroute"))  # C = ceil(3/3) = 1
    p = torch.softmax(z, -1)
    check(r.expert.flatten().tolist() == [0, 1, 2] and r.fate.flatten().tolist() == [0, 1, 1],
          "tie -> lower index; reroute to next-best by score")
    check(close(r.gate.flatten(), torch.stack([p[0, 0], p[1, 0], p[2, 0]])), "rerouted assignment keeps its gate")
    check(close(r.weights, torch.tensor([[p[0, 0], 0, 0], [0, p[1, 0], 0], [0, 0, p[2, 0]]], dtype=torch.float64)),
          "weights land on the processing expert")
    ps = p.sum(0)
    aux = 3 * float(((torch.tensor([3.0, 0, 0]) / 3) * (ps / 3)).sum())
    check(r.stats["routed"] == [3, 0, 0] and r.stats["kept"] == [1, 1, 1] and r.stats["rerouted"] == [2, 0, 0]
          and abs(r.stats["aux_loss"] - aux) < 1e-12 and close(torch.tensor(r.stats["prob_sum"], dtype=torch.float64), ps),
          "stats routed/kept/rerouted, prob_sum, aux_loss")
    # sigmoid probs normalised by their sum; softmax_topk gates; renormalisation
    z = torch.tensor([[0.3, -1.0, 2.0, 0.1]], dtype=torch.float64)
    r = route(z, 2, "sigmoid", DispatchConfig())
    s = torch.sigmoid(z)
    check(r.expert.tolist() == [[2, 0]] and close(r.gate, s[:, [2, 0]]) and
          close(torch.tensor(r.stats["prob_sum"], dtype=torch.float64), (s / s.sum())[0]), "sigmoid gate + stats prob")
    r = route(z, 2, "softmax_topk", DispatchConfig())
    check(close(r.gate, torch.softmax(z[:, [2, 0]], -1)) and
          close(torch.tensor(r.stats["prob_sum"], dtype=torch.float64), torch.softmax(z, -1)[0]), "softmax_topk gate + stats")
    r = route(z, 2, "softmax", DispatchConfig(), renormalize=True)
    pp = torch.softmax(z, -1)[:, [2, 0]]
    check(close(r.gate, pp / pp.sum()), "renormalised top-k gates")
    # balanced router -> aux loss 1
    z = torch.eye(4, dtype=torch.float64) * 50
    r = route(z, 1, "softmax", DispatchConfig())
    check(abs(r.stats["aux_loss"] - 1.0) < 1e-9, "aux loss 1.0 when balanced")


# --------------------------------------------------- naive model (DESIGN) --
def naive_forward(m, toks):
    """Per-token loops straight from docs/design.md; one sequence, dropless."""
    c = m.cfg
    a, f = c["attention"], c["ffn"]
    H, G, dh, E, k = a["n_heads"], a["n_kv_heads"], a["head_dim"], a["n_experts"], a["top_k"]
    T = len(toks)
    n_rot = rotary_dims(c)
    x = [m.embedding.weight[t].clone() for t in toks]

    def topk(z, kk):
        idx = sorted(range(len(z)), key=lambda i: (-float(z[i]), i))[:kk]
        return idx

    def gates(z, kk, gate):
        idx = topk(z, kk)
        if gate == "sigmoid":
            return [(i, torch.sigmoid(z[i])) for i in idx]
        sm = torch.softmax(torch.stack([z[i] for i in idx]), 0)
        return list(zip(idx, sm))

    for blk in m.layers:
        at = blk.attn
        xn = [blk.attn_norm(xi) for xi in x]
        s = dh ** -0.25
        q = [apply_rope((at.q.weight @ xi * s).view(1, H, dh), torch.tensor([t]), n_rot, a["rope_base"])[0]
             for t, xi in enumerate(xn)]
        kk_ = [apply_rope((at.k.weight @ xi * s).view(1, G, dh), torch.tensor([t]), n_rot, a["rope_base"])[0]
               for t, xi in enumerate(xn)]
        routed = a["type"] == "switchhead" and E > 1
        shared = a["shared_router"]

        def sel(mat, xi, head):
            rows = mat[0:E] if shared else mat[head * E:(head + 1) * E]
            return rows @ xi

        def value(j, g, dest_token=None):
            xj = xn[j]
            if a["type"] == "dense":
                return (at.v.weight @ xj).view(G, dh)[g]
            if E == 1:
                return (at.v @ xj).view(G, dh)[g]
            chooser = xj if dest_token is None else xn[dest_token]
            out = torch.zeros(dh, dtype=xj.dtype)
            for e, gv in gates(sel(at.sel_v, chooser, g), k, a["gate"]):
                out = out + gv * (xj @ at.v[g * E + e])
            return out

        ys = []
        for t in range(T):
            y = torch.zeros_like(x[t])
            heads = []
            for h in range(H):
                g = h // (H // G)
                sc = torch.stack([q[t][h] @ kk_[j][g] for j in range(t + 1)])
                w = torch.softmax(sc, 0)
                dest = routed and a["value_routing"] == "destination"
                ah = sum(w[j] * value(j, g, t if dest else None) for j in range(t + 1))
                heads.append(ah)
                if routed:
                    for e, go in gates(sel(at.sel_o, xn[t], h), k, a["gate"]):
                        y = y + go * (ah @ at.o[h * E + e])
            if a["type"] == "dense":
                y = at.o.weight @ torch.cat(heads)
            elif E == 1:
                go = torch.sigmoid(at.sel_o @ xn[t])
                y = at.o @ torch.cat([go[h] * heads[h] for h in range(H)])
            ys.append(y)
        x = [x[t] + ys[t] for t in range(T)]
        ff = blk.ffn
        act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}[f["activation"]]
        for t in range(T):
            xi = blk.ffn_norm(x[t])
            if f["type"] == "dense":
                y = ff.w2(act(ff.w1(xi)))
            else:
                z = ff.router(xi)
                p = torch.softmax(z, 0) if f["gate"] == "softmax" else torch.sigmoid(z)
                idx = topk(z, f["top_k"])
                gs = [p[i] for i in idx]
                if f["renormalize"]:
                    tot = sum(gs)
                    gs = [gv / tot for gv in gs]
                y = torch.zeros_like(xi)
                for e, gv in zip(idx, gs):
                    hdn = ff.w1[e] @ xi + (ff.b1[e] if f["bias"] else 0)
                    y = y + gv * (ff.w2[e] @ act(hdn) + (ff.b2[e] if f["bias"] else 0))
            x[t] = x[t] + y
    head = m.embedding.weight if c["tie_embeddings"] else m.lm_head.weight
    return torch.stack([head @ m.final_norm(xi) for xi in x])


def configs():
    base = {"format_version": 1, "vocab_size": 64, "d_model": 16, "n_layers": 2, "max_seq_len": 32,
            "norm": "layernorm", "tokenizer": "byte"}
    sh = {"type": "switchhead", "n_heads": 4, "n_kv_heads": 4, "head_dim": 4, "n_experts": 3, "top_k": 2}
    moe = {"type": "moe", "d_ff": 8, "n_experts": 4, "top_k": 2, "activation": "gelu"}
    dense_ffn = {"type": "dense", "d_ff": 8, "activation": "silu"}
    out = []

    def add(name, attn, ffn, **top):
        cfg = dict(copy.deepcopy(base), name=name, attention=dict(sh, **attn), ffn=ffn, **top)
        if attn.get("type") == "dense":
            cfg["attention"] = {kk: v for kk, v in cfg["attention"].items() if kk not in ("n_experts", "top_k")}
        out.append(cfg)

    add("sh_sigmoid", {}, dense_ffn)
    add("sh_e1", {"n_experts": 1, "top_k": 1, "rotate_fraction": 1.0}, dense_ffn, norm="rmsnorm")
    add("sh_softmax_topk_gqa", {"gate": "softmax_topk", "n_kv_heads": 2}, moe)
    add("sh_shared_dest", {"shared_router": True, "value_routing": "destination", "n_kv_heads": 2}, moe)
    add("sh_dest", {"value_routing": "destination"}, dict(moe, gate="sigmoid", bias=False), tie_embeddings=False)
    add("dense_gqa", {"type": "dense", "n_kv_heads": 1}, dict(moe, renormalize=True, router_bias=True, top_k=1))
    return out


def check_rope():
    # dh 6, n_rot 4: pairs (0,2) at angle pos*1 and (1,3) at pos*base^(-1/2); channels 4,5 untouched.
    x = torch.arange(1.0, 7.0, dtype=torch.float64).view(1, 1, 6)
    y = apply_rope(x, torch.tensor([3]), 4, 100.0)[0, 0]
    a0, a1 = 3.0, 3.0 * 100.0 ** -0.5
    want = torch.tensor([1 * math.cos(a0) - 3 * math.sin(a0), 2 * math.cos(a1) - 4 * math.sin(a1),
                         3 * math.cos(a0) + 1 * math.sin(a0), 4 * math.cos(a1) + 2 * math.sin(a1), 5, 6],
                        dtype=torch.float64)
    check(close(y, want, 1e-12), "RoPE rotate-half on the first n_rot channels")
    cfg = {"attention": {"rotate_fraction": 0.7, "head_dim": 7}}
    check(rotary_dims(cfg) == 4, "n_rot = floor(f*dh) rounded down to even")


def check_model():
    g = torch.Generator().manual_seed(7)
    for i, cfg in enumerate(configs()):
        m = init_random(Model(cfg, torch.float64), 100 + i, router_std=3.0)
        toks = torch.randint(0, 64, (9,), generator=g)
        full = m(toks[None])["logits"][0]
        check(close(full, naive_forward(m, toks.tolist()), 1e-10), f"{cfg['name']}: vectorised == naive per-token")
        # incremental: prefill 4, then one token per step
        cache = m.new_cache()
        parts = [m(toks[None, :4], cache=cache)["logits"][0]]
        for t in range(4, 9):
            parts.append(m(toks[None, t:t + 1], cache=cache)["logits"][0])
        check(close(torch.cat(parts), full, 1e-10), f"{cfg['name']}: incremental == full causal pass")
        # ragged batch (dropless) == each sequence alone
        t2 = torch.randint(0, 64, (5,), generator=g)
        tokens = torch.zeros(2, 9, dtype=torch.int64)
        tokens[0], tokens[1, :5] = toks, t2
        valid = torch.zeros(2, 9, dtype=torch.bool)
        valid[0], valid[1, :5] = True, True
        out = m(tokens, valid)["logits"]
        alone = m(t2[None])["logits"][0]
        check(close(out[0], full, 1e-10) and close(out[1, :5], alone, 1e-10), f"{cfg['name']}: ragged batch == alone")
        # generate(): batch 1 == left-padded == right-padded batch (dropless)
        prompts = [toks[:6].tolist(), t2[:3].tolist()]
        single = [m.generate([p], 4)[0] for p in prompts]
        check(m.generate(prompts, 4, padding="left") == single and m.generate(prompts, 4, padding="right") == single,
              f"{cfg['name']}: generate batch (left/right pad) == batch 1")
        # greedy continuation == argmax of the full pass over prompt + generated
        seq = prompts[0] + single[0]
        lg = m(torch.tensor([seq]))["logits"][0]
        check(lg[len(prompts[0]) - 1:-1].argmax(-1).tolist() == single[0], f"{cfg['name']}: generate == full-pass argmax")
        # export round trip (f32 storage)
        with tempfile.TemporaryDirectory() as d:
            save_model(m, d, "f32")
            back = load_model(d, torch.float64)
            check(close(back(toks[None])["logits"][0], full, 1e-4), f"{cfg['name']}: export/load round trip")
    # capacity applies to the whole step: a second sequence can cause drops for the first
    cfg = configs()[2]
    m = init_random(Model(cfg, torch.float64), 5, router_std=3.0)
    d = DispatchConfig(0.5, 0, "drop")
    out = m(torch.randint(0, 64, (3, 8), generator=g), dispatch=d)
    r = [rr for rid, rr in out["routes"] if rid == (0, "ffn", 0)][0]
    check(r.stats["tokens"] == 24 and r.stats["capacity"] == math.ceil(0.5 * 24 * 2 / 4)
          and sum(r.stats["dropped"]) > 0, "capacity per step over all sequences")
    ids = [rid for rid, _ in out["routes"]]
    check(ids[:4] == [(0, "attn_v", 0), (0, "attn_v", 1), (0, "attn_o", 0), (0, "attn_o", 1)],
          "router order: layer, attn_v heads, attn_o heads, ffn")


def main():
    torch.set_num_threads(1)
    check_safetensors()
    check_dispatch()
    check_rope()
    check_model()
    if FAILURES:
        print(f"{len(FAILURES)} FAILED")
        sys.exit(1)
    print("all self-checks passed")


if __name__ == "__main__":
    main()
