"""Self-checks of the reference: safetensors round trip, dispatch semantics on
hand-made cases with known answers (both capacity scopes), sequence-scope
dispatch against independent formulations (a vectorised prefix count, a
causal-prefix recomputation, chunked calls), the vectorised model against a
naive per-token implementation of docs/design.md, incremental decoding == full
pass, isolation under sequence-scope capacity, and generate() batch/padding
consistency. Exits non-zero on any failure.

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
from reference_model import (Model, apply_rope, parse_config, rotary_dims, router_logits,  # noqa: E402
                             sinusoid)
from routing import (DROPPED, KEPT, REROUTED, DispatchConfig, SequenceSlots, dispatch,  # noqa: E402
                     dispatch_sequence, ranking, route)
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
    cap = DispatchConfig(1.0, 0, "drop", "step").capacity(4, 1, 2)
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
    r = route(z, 1, "softmax", DispatchConfig(1.0, 1, "reroute", "step"))  # C = ceil(3/3) = 1
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


# ------------------------------------------------ sequence-scope dispatch --
def seq_dispatch(rows, k, E, C, overflow, G, seq=None, pos=None, slots=None):
    o = orders(rows)
    n = len(rows)
    seq = [0] * n if seq is None else seq
    pos = list(range(n)) if pos is None else pos
    return dispatch_sequence(o, k, E, C, overflow, seq, pos, G, slots)


def check_sequence_dispatch_cases():
    # one sequence, E=2, k=1, G=4, C=1, everyone prefers expert 0:
    # each group of 4 positions keeps one assignment on 0 (and one on 1 by reroute).
    rows = [[0, 1]] * 6
    e, f, c = seq_dispatch(rows, 1, 2, 1, "drop", 4)
    check(f.flatten().tolist() == [KEPT, DROPPED, DROPPED, DROPPED, KEPT, DROPPED]
          and c == dict(routed=[6, 0], kept=[2, 0], rerouted=[0, 0], dropped=[4, 0]),
          "sequence scope: capacity per aligned group of G positions (drop)")
    e, f, c = seq_dispatch(rows, 1, 2, 1, "reroute", 4)
    check(f.flatten().tolist() == [KEPT, REROUTED, DROPPED, DROPPED, KEPT, REROUTED]
          and e.flatten().tolist() == [0, 1, 0, 0, 0, 1] and c["kept"] == [2, 2] and c["rerouted"] == [2, 0],
          "sequence scope: reroute within the group, group boundary resets the loads")
    # position-major: t0's 2nd choice is placed before t1's 1st (step scope does the opposite)
    rows = [[1, 0], [0, 1], [0, 1]]
    e, f, c = seq_dispatch(rows, 2, 2, 2, "drop", 8)
    check(f.tolist() == [[0, 0], [0, 0], [2, 2]], "sequence scope: position order, then rank")
    e, f, c = dispatch(orders(rows), 2, 2, 2, "drop")
    check(f.tolist() == [[0, 2], [0, 0], [0, 2]], "step scope on the same tokens: rank-major")
    # two sequences (interleaved in step order) do not share slots; positions need not start at 0
    rows = [[0, 1]] * 6
    e, f, c = seq_dispatch(rows, 1, 2, 1, "drop", 4, seq=[0, 1, 0, 1, 0, 1], pos=[5, 5, 6, 6, 8, 8])
    check(f.flatten().tolist() == [KEPT, KEPT, DROPPED, DROPPED, KEPT, KEPT],
          "sequence scope: sequences independent; group = position // G")
    e, f, c = seq_dispatch([[0, 1]] * 4, 1, 2, 1, "drop", 4, seq=[0, 0, 1, 1], pos=[0, 1, 0, 1])
    check(f.flatten().tolist() == [KEPT, DROPPED, KEPT, DROPPED],
          "sequence scope: two sequences in the same group index have their own slots")
    # carried slots: the same group continued in a later call
    slots = SequenceSlots()
    f1 = seq_dispatch(rows[:2], 1, 2, 1, "drop", 4, pos=[0, 1], slots=slots)[1]
    f2 = seq_dispatch(rows[:3], 1, 2, 1, "drop", 4, pos=[2, 3, 4], slots=slots)[1]
    check(f1.flatten().tolist() == [KEPT, DROPPED] and f2.flatten().tolist() == [DROPPED, DROPPED, KEPT],
          "sequence scope: group loads carried across steps, reset at the next group")
    # capacity from G, not from the step's T; the token count stays T
    z = torch.zeros(5, 4, dtype=torch.float64)
    r = route(z, 2, "sigmoid", DispatchConfig(1.0, 0, "drop", "sequence", 6))
    check(r.stats["capacity"] == 3 and r.stats["tokens"] == 5 and r.stats["capacity_scope"] == "sequence",
          "sequence scope: C = ceil(cf*G*k/E) whatever T")
    r = route(z, 2, "sigmoid", DispatchConfig(0.1, 5, "drop", "sequence", 6))
    check(r.stats["capacity"] == 5, "sequence scope: min_capacity floor")
    r = route(z, 2, "sigmoid", DispatchConfig(0.0, 5, "drop", "sequence", 6))
    check(r.stats["capacity"] is None and sum(r.stats["dropped"]) == 0, "sequence scope: cf <= 0 is dropless")
    for bad in (dict(capacity_scope="batch"), dict(capacity_group=0), dict(capacity_group=2.5),
                dict(overflow="spill")):
        try:
            DispatchConfig(1.0, **bad)
            check(False, f"DispatchConfig rejects {bad}")
        except ValueError:
            check(True, f"DispatchConfig rejects {bad}")


def prefix_count_drops(order, k, E, C, seq, pos, G):
    """Independent, vectorised drop-only formulation: an assignment is kept
    iff fewer than C earlier assignments of its (sequence, group) went to the
    same expert, in fill order (position, then rank). Returns fate [N, k]."""
    n = order.shape[0]
    t = torch.arange(n).repeat_interleave(k)
    r = torch.arange(k).repeat(n)
    e = order[:, :k].reshape(-1)
    seq, pos = torch.as_tensor(seq)[t], torch.as_tensor(pos)[t]
    key = torch.stack([seq, pos // G, pos, r], 1)
    perm = sorted(range(len(t)), key=lambda a: tuple(key[a].tolist()))
    perm = torch.tensor(perm, dtype=torch.int64)
    onehot = torch.nn.functional.one_hot(e[perm], E)
    seg = torch.stack([seq[perm], pos[perm] // G], 1)
    new_seg = torch.ones(len(perm), dtype=torch.bool)
    new_seg[1:] = (seg[1:] != seg[:-1]).any(1)
    incl = onehot.cumsum(0)
    start = torch.zeros_like(incl)
    seg_id = new_seg.cumsum(0) - 1
    firsts = new_seg.nonzero().flatten()
    before = torch.cat([torch.zeros(1, E, dtype=incl.dtype), incl[:-1]])[firsts]  # counts before each segment
    start = before[seg_id]
    excl = incl - onehot - start
    kept_sorted = excl.gather(1, e[perm][:, None]).flatten() < C
    fate = torch.empty(len(perm), dtype=torch.int64)
    fate[perm] = torch.where(kept_sorted, torch.tensor(KEPT), torch.tensor(DROPPED))
    return fate.view(n, k)


def check_sequence_dispatch_formulations():
    g = torch.Generator().manual_seed(11)
    for case, (n, E, k, C, G) in enumerate([(40, 4, 1, 3, 8), (40, 4, 2, 4, 7), (57, 6, 3, 5, 16),
                                            (30, 8, 2, 1, 5), (33, 3, 2, 2, 64)]):
        logits = torch.randn(n, E, generator=g, dtype=torch.float64)
        logits[:, 0] += 1.0  # skew towards expert 0 so that groups overflow
        order = ranking(logits)
        n_seq = 3
        seq = torch.randint(0, n_seq, (n,), generator=g).tolist()
        pos, nxt = [], {}
        for s_ in seq:  # positions increase within each sequence, starting anywhere
            nxt.setdefault(s_, int(torch.randint(0, 20, (1,), generator=g)))
            pos.append(nxt[s_])
            nxt[s_] += 1
        _, f_loop, c_loop = dispatch_sequence(order, k, E, C, "drop", seq, pos, G)
        f_vec = prefix_count_drops(order, k, E, C, seq, pos, G)
        check(torch.equal(f_loop, f_vec) and sum(c_loop["dropped"]) > 0,
              f"sequence scope drop == vectorised prefix count (case {case}, G={G}, k={k}, "
              f"{sum(c_loop['dropped'])} dropped)")
        for policy in ("drop", "reroute"):
            e_all, f_all, _ = dispatch_sequence(order, k, E, C, policy, seq, pos, G)
            # causal prefix: a token's fate from its group's earlier positions only
            ok = True
            for t in range(n):
                same = [u for u in range(n) if seq[u] == seq[t] and pos[u] // G == pos[t] // G
                        and pos[u] <= pos[t]]
                sub = dispatch_sequence(order[same], k, E, C, policy, [seq[u] for u in same],
                                        [pos[u] for u in same], G)
                j = same.index(t)
                ok &= torch.equal(sub[0][j], e_all[t]) and torch.equal(sub[1][j], f_all[t])
            check(ok, f"sequence scope {policy}: fate == recomputed from the token's group prefix (case {case})")
            # chunked calls with carried slots == one call
            slots, parts_e, parts_f = SequenceSlots(), [], []
            cuts = [0, n // 3, n // 3 + 1, (2 * n) // 3, n]
            for a, b in zip(cuts[:-1], cuts[1:]):
                ee, ff, _ = dispatch_sequence(order[a:b], k, E, C, policy, seq[a:b], pos[a:b], G, slots)
                parts_e.append(ee)
                parts_f.append(ff)
            check(torch.equal(torch.cat(parts_e), e_all) and torch.equal(torch.cat(parts_f), f_all),
                  f"sequence scope {policy}: chunked calls carrying slots == one call (case {case})")
    # k = 1, one sequence of exactly G tokens: position order == rank-major step order
    logits = torch.randn(24, 4, generator=g, dtype=torch.float64)
    logits[:, 1] += 1.0
    order = ranking(logits)
    for policy in ("drop", "reroute"):
        a = dispatch_sequence(order, 1, 4, 5, policy, [0] * 24, list(range(24)), 24)
        b = dispatch(order, 1, 4, 5, policy)
        check(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] and sum(b[2]["dropped"]) +
              sum(b[2]["rerouted"]) > 0, f"k=1, T=G, one sequence: sequence scope == step scope ({policy})")


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

    xl = a["position"] == "xl"
    D = c["d_model"]

    def pe(p):  # the XL sinusoid at signed position p, from math.sin/cos
        out = []
        for m2 in range(0, D, 2):
            w = 10000.0 ** (-m2 / D)
            out += [math.sin(p * w), math.cos(p * w)]
        return torch.tensor(out, dtype=torch.float64)

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
                if xl:  # + q . P_h (dh^-1/4 pe(j - t))
                    Ph = at.pos_to_pk[h * dh:(h + 1) * dh]
                    sc = sc + torch.stack([q[t][h] @ (Ph @ (s * pe(j - t))) for j in range(t + 1)])
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
    bias = m.lm_head.bias if c["output_bias"] else 0
    return torch.stack([head @ m.final_norm(xi) + bias for xi in x])


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
    # Transformer-XL relative positions (no RoPE); head_dim need not be d/H
    xl = {"position": "xl"}
    add("xl_sigmoid", dict(xl, head_dim=6), dict(moe, gate="sigmoid", bias=False, activation="relu"),
        output_bias=True)
    add("xl_e1_gqa", dict(xl, n_experts=1, top_k=1, n_kv_heads=2), dense_ffn, norm="rmsnorm",
        tie_embeddings=False, output_bias=True)
    add("xl_shared_dest", dict(xl, shared_router=True, value_routing="destination", n_kv_heads=2,
                               gate="softmax_topk", head_dim=3), moe)
    add("xl_dense_gqa", {"type": "dense", "n_kv_heads": 2, "position": "xl", "head_dim": 5}, dense_ffn)
    return out


def check_config_refusals():
    base = configs()[0]
    cases = [
        ("attention.position", {"attention": {"position": "alibi"}}),
        ("attention.rotate_fraction", {"attention": {"position": "xl", "rotate_fraction": 0.5}}),
        ("attention.rope_base", {"attention": {"position": "xl", "rope_base": 500.0}}),
        ("d_model", {"attention": {"position": "xl"}, "d_model": 15}),
        ("dispatch.capacity_scope", {"dispatch": {"capacity_factor": 1.0, "capacity_scope": "batch"}}),
        ("dispatch.capacity_group", {"dispatch": {"capacity_factor": 1.0, "capacity_scope": "step",
                                                  "capacity_group": 64}}),
        ("dispatch.capacity_group", {"dispatch": {"capacity_factor": 1.0, "capacity_group": 0}}),
        ("dispatch.capacity_group", {"dispatch": {"capacity_factor": 1.0, "capacity_group": 8.0}}),
        ("output_bias", {"output_bias": "yes"}),
        ("attention.top_k", {"attention": {"type": "switchhead", "n_experts": 1, "top_k": 2}}),
        ("ffn", {"ffn": {"type": "dense", "n_experts": 8}}),
    ]
    for key, change in cases:
        cfg = copy.deepcopy(base)
        for k2, v in change.items():
            if isinstance(v, dict):
                cfg.setdefault(k2, {}).update(v)
            else:
                cfg[k2] = v
        try:
            parse_config(cfg)
            check(False, f"config refused: {change}")
        except ValueError as e:
            check(key in str(e), f"config refused naming {key}: {change}")
    ok = parse_config(dict(copy.deepcopy(base), dispatch={"capacity_factor": 1.0}))["dispatch"]
    check(ok["capacity_scope"] == "sequence" and ok["capacity_group"] == 128,
          "dispatch defaults: capacity_scope sequence, capacity_group 128")


def check_router_ties():
    # 18 experts, rows 1 and 2 identical, 3 and 4, ..., 15 and 16: their
    # logits tie exactly (one f64 GEMM of this shape rounds 15 and 16 apart)
    # and top-1 goes to the lower index (DESIGN.md).
    g = torch.Generator().manual_seed(3)
    for n in (2, 10, 50, 55):
        X = torch.randn(n, 32, dtype=torch.float64, generator=g)
        W = torch.randn(18, 32, dtype=torch.float64, generator=g)
        for a in range(1, 17, 2):
            W[a + 1] = W[a]
        z = router_logits(X, W)
        check(all(torch.equal(z[:, a], z[:, a + 1]) for a in range(1, 17, 2)),
              f"router logits of identical rows are equal ({n} tokens)")
        chosen = set(route(z, 1, "softmax", DispatchConfig(0.0, 0, "drop", "step")).expert.flatten().tolist())
        check(not chosen & set(range(2, 18, 2)), f"top-1 of tied experts is the lower index ({n} tokens)")


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
    # XL sinusoid: interleaved sin/cos, w_m = 10000^(-2m/D), signed positions
    pe = sinusoid(torch.tensor([-3, 0, 5]), 6)
    want = torch.tensor([[f(p * 10000.0 ** (-m2 / 6)) for m2 in (0, 2, 4) for f in (math.sin, math.cos)]
                         for p in (-3, 0, 5)], dtype=torch.float64)
    check(close(pe, want, 1e-12), "XL sinusoid: [sin, cos] pairs, w_m = 10000^(-2m/D), signed p")


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
    d = DispatchConfig(0.5, 0, "drop", "step")
    out = m(torch.randint(0, 64, (3, 8), generator=g), dispatch=d)
    r = [rr for rid, rr in out["routes"] if rid == (0, "ffn", 0)][0]
    check(r.stats["tokens"] == 24 and r.stats["capacity"] == math.ceil(0.5 * 24 * 2 / 4)
          and sum(r.stats["dropped"]) > 0, "capacity per step over all sequences")
    # sequence scope: with drops/reroutes, a sequence's logits and routing do not
    # depend on its batch neighbours or on how it was chunked
    for ci, policy, G in ((2, "drop", 3), (3, "reroute", 4), (4, "drop", 5)):
        cfg = configs()[ci]
        m = init_random(Model(cfg, torch.float64), 40 + ci, router_std=3.0)
        d = DispatchConfig(0.5, 0, policy, "sequence", G)
        lens = [9, 4, 7]
        seqs = [torch.randint(0, 64, (n,), generator=g) for n in lens]
        tokens = torch.zeros(3, 9, dtype=torch.int64)
        valid = torch.zeros(3, 9, dtype=torch.bool)
        for b, sq in enumerate(seqs):
            tokens[b, :len(sq)] = sq
            valid[b, :len(sq)] = True
        ob = m(tokens, valid, dispatch=d)
        lost = sum(sum(r.stats["dropped"]) + sum(r.stats["rerouted"]) for _, r in ob["routes"])
        alone = [m(sq[None], dispatch=d) for sq in seqs]
        same = all(close(ob["logits"][b, :lens[b]], alone[b]["logits"][0], 1e-10) for b in range(3))
        # routing trace of each sequence inside the batch == alone
        off, trace_ok = 0, True
        for b in range(3):
            for (rid, rb), (_, ra) in zip(ob["routes"], alone[b]["routes"]):
                trace_ok &= torch.equal(rb.expert[off:off + lens[b]], ra.expert) and \
                    torch.equal(rb.fate[off:off + lens[b]], ra.fate)
            off += lens[b]
        check(same and trace_ok and lost > 0,
              f"{cfg['name']}: sequence scope {policy} G={G}: batched == alone ({lost} dropped/rerouted)")
        cache = m.new_cache()
        sq = seqs[0]
        parts = [m(sq[None, :2], cache=cache, dispatch=d)["logits"][0],
                 m(sq[None, 2:6], cache=cache, dispatch=d)["logits"][0]]
        for t in range(6, 9):
            parts.append(m(sq[None, t:t + 1], cache=cache, dispatch=d)["logits"][0])
        check(close(torch.cat(parts), alone[0]["logits"][0], 1e-10),
              f"{cfg['name']}: sequence scope {policy}: chunked prefill + decode == full pass")
        prompts = [seqs[0][:6].tolist(), seqs[1][:3].tolist()]
        single = [m.generate([p], 4, dispatch=d)[0] for p in prompts]
        check(m.generate(prompts, 4, padding="left", dispatch=d) == single and
              m.generate(prompts, 4, padding="right", dispatch=d) == single,
              f"{cfg['name']}: sequence scope {policy}: generate batch (left/right pad) == batch 1")
        # the same batch under step scope does depend on the neighbours
        d_step = DispatchConfig(0.5, 0, policy, "step")
        st = m(tokens, valid, dispatch=d_step)["logits"]
        differs = any(not close(st[b, :lens[b]], m(sq_[None], dispatch=d_step)["logits"][0], 1e-10)
                      for b, sq_ in enumerate(seqs))
        check(differs, f"{cfg['name']}: step scope {policy}: batched != alone (the scope matters)")
    ids = [rid for rid, _ in out["routes"]]
    check(ids[:4] == [(0, "attn_v", 0), (0, "attn_v", 1), (0, "attn_o", 0), (0, "attn_o", 1)],
          "router order: layer, attn_v heads, attn_o heads, ffn")


def main():
    torch.set_num_threads(1)
    check_safetensors()
    check_dispatch()
    check_sequence_dispatch_cases()
    check_sequence_dispatch_formulations()
    check_config_refusals()
    check_router_ties()
    check_rope()
    check_model()
    if FAILURES:
        print(f"{len(FAILURES)} FAILED")
        sys.exit(1)
    print("all self-checks passed")


if __name__ == "__main__":
    main()
