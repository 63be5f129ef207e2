"""The official SwitchHead code's forward math, written out independently of
tools/reference (plain loops and einsums over the official parameter names),
for testing tools/convert_official.py without the official code (which CI
cannot fetch). Float64 throughout; self-attention, full causal pass, eval.

Sources read: switchhead/switchhead.py (SwitchHeadCore, SwitchHeadRope,
SwitchHeadXL) and the training code's layers/transformer/
full_moe_relative_attention.py, layers/moe_layer.py,
models/transformer_language_model.py.
"""
import math

import torch
import torch.nn.functional as F


def top_gates(x, sel, H, E, k, mode="sigmoid"):
    """Per head: the k experts with the largest selection values and their
    weights (sigmoid of the logit, or softmax over the k selected logits)."""
    z = (x @ sel.t()).view(x.shape[0], H, E)
    if mode == "sigmoid":
        val, idx = torch.sigmoid(z).topk(k, -1)
    else:
        raw, idx = z.topk(k, -1)
        val = torch.softmax(raw, -1)
    return val, idx


def sinusoid_at(p, width):
    """The training code's sinusoidal_pos_embedding at signed position p."""
    div = [math.exp(c * (-math.log(10000.0) / width)) for c in range(0, width, 2)]
    out = torch.zeros(width, dtype=torch.float64)
    out[0::2] = torch.tensor([math.sin(p * w) for w in div], dtype=torch.float64)
    out[1::2] = torch.tensor([math.cos(p * w) for w in div], dtype=torch.float64)
    return out


def rope_rotate(x, n_rotate, base):
    """RotaryPosEncoding on the first n_rotate channels. x [H, T, dh]."""
    if n_rotate == 0:
        return x
    T = x.shape[1]
    inv_freq = 1.0 / (base ** (torch.arange(0, n_rotate, 2, dtype=torch.float64) / n_rotate))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    r = x[..., :n_rotate]
    half = n_rotate // 2
    rotated = torch.cat([-r[..., half:], r[..., :half]], -1)
    return torch.cat([r * emb.cos() + rotated * emb.sin(), x[..., n_rotate:]], -1)


def attention(x, P, H, k, position, rotate_fraction=0.5, rope_base=10000.0, mode="sigmoid"):
    """SwitchHeadCore.forward (+ XL / RoPE attend) for self-attention on x
    [T, d]. P: the module's parameters by official name (q.weight, k.weight,
    v, o, sel_v, sel_o, pos_to_pk)."""
    T, d = x.shape
    dh = P["q.weight"].shape[0] // H
    scale = 1.0 / math.sqrt(dh)
    q = (x @ P["q.weight"].t() * math.sqrt(scale)).view(T, H, dh).transpose(0, 1)
    kk = (x @ P["k.weight"].t() * math.sqrt(scale)).view(T, H, dh).transpose(0, 1)
    routed = P["v"].dim() == 3
    if routed:
        E = P["v"].shape[0] // H
        gv, iv = top_gates(x, P["sel_v"], H, E, k, mode)
        v = torch.zeros(H, T, dh, dtype=x.dtype)
        for t in range(T):
            for h in range(H):
                for r in range(k):
                    v[h, t] += gv[t, h, r] * (x[t] @ P["v"][h * E + int(iv[t, h, r])])
    else:
        v = (x @ P["v"].t()).view(T, H, dh).transpose(0, 1)
    if position == "rope":
        n_rotate = int(rotate_fraction * dh)
        q, kk = rope_rotate(q, n_rotate, rope_base), rope_rotate(kk, n_rotate, rope_base)
        att = q @ kk.transpose(1, 2)
    else:
        att = q @ kk.transpose(1, 2)
        for i in range(T):
            for j in range(i + 1):
                pk = P["pos_to_pk"] @ (sinusoid_at(j - i, d) * math.sqrt(scale))  # [H*dh]
                for h in range(H):
                    att[h, i, j] += q[h, i] @ pk[h * dh:(h + 1) * dh]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
    res = att @ v  # [H, T, dh]
    y = torch.zeros(T, P["o"].shape[-1], dtype=x.dtype)
    if routed:
        go, io = top_gates(x, P["sel_o"], H, E, k, mode)
        for t in range(T):
            for h in range(H):
                for r in range(k):
                    y[t] += go[t, h, r] * (res[h, t] @ P["o"][h * E + int(io[t, h, r])])
    else:
        gate = torch.sigmoid(x @ P["sel_o"].t())  # [T, H]
        y = (res.transpose(0, 1) * gate[..., None]).reshape(T, H * dh) @ P["o"].t()
    return y


def sigma_moe(x, keys, values, expert_sel, k, activation=F.relu, mode="sigmoid"):
    """layers/moe_layer.py MoE.forward, eval: y = sum over the top-k experts of
    g * act(x keys[e]) values[e]."""
    z = x @ expert_sel.t()
    p = torch.sigmoid(z) if mode == "sigmoid" else torch.softmax(z, -1)
    val, idx = p.topk(k, -1)
    y = torch.zeros(x.shape[0], values.shape[-1], dtype=x.dtype)
    for t in range(x.shape[0]):
        for r in range(k):
            e = int(idx[t, r])
            y[t] += val[t, r] * (activation(x[t] @ keys[e]) @ values[e])
    return y


def layer_norm(x, sd, name, d):
    w = sd.get(name + ".weight", torch.ones(d, dtype=x.dtype))
    b = sd.get(name + ".bias", torch.zeros(d, dtype=x.dtype))
    return F.layer_norm(x, (d,), w, b, 1e-5)


def training_lm(sd, args, tokens):
    """TransformerLanguageModel (pre-LN) of the training code, no memory:
    logits [T, V] for one sequence."""
    emb = sd["embedding.weight"]
    d = emb.shape[1]
    H = args["transformer.n_heads"]
    act = {"relu": F.relu, "gelu": F.gelu}[args.get("transformer.activation", "relu")]
    x = emb[tokens]
    for i in range(args["transformer.encoder_n_layers"]):
        p = f"unique_layers.{i}."
        a = p + "self_attn."
        xn = layer_norm(x, sd, p + "norm1", d)
        P = {"q.weight": sd[a + "projections.q"], "k.weight": sd[a + "projections.k"]}
        if a + "pos_to_pk" in sd:
            P["pos_to_pk"] = sd[a + "pos_to_pk"]
        E = args.get("moe.att.n_experts")
        if sd[a + "projections.v"].dim() == 3:
            shared = args.get("moe.att.shared_experts", False)
            P["v"] = sd[a + "projections.v"].repeat(H, 1, 1) if shared else sd[a + "projections.v"]
            P["o"] = sd[a + "projections.o"].repeat(H, 1, 1) if shared else sd[a + "projections.o"]
            P["sel_o"] = sd[a + "selections.o"]
            P["sel_v"] = sd[a + ("selections.o" if shares_selections(args) else "selections.v")]
            y = attention(xn, P, H, args["moe.att.k"], _position(args), args.get("rope.rotate_fraction", 0.5),
                          args.get("rope.base", 10000.0), args.get("moe.att.selection_mode", "sigmoid"))
        else:
            assert E is not None
            y = dense_attention(xn, sd, a, H, _position(args), args)
        x = x + y
        xn = layer_norm(x, sd, p + "norm2", d)
        if args["transformer.variant"] == "preln_moe":
            x = x + sigma_moe(xn, sd[p + "pkm.keys"], sd[p + "pkm.values"], sd[p + "pkm.expert_sel"],
                              args["pkm.n_heads"], act, args.get("moe.selection_mode", "sigmoid"))
        else:
            h = act(xn @ sd[p + "linear1.weight"].t() + sd[p + "linear1.bias"])
            x = x + h @ sd[p + "linear2.weight"].t() + sd[p + "linear2.bias"]
    x = layer_norm(x, sd, "out_norm", d)
    return x @ sd["output.weight"].t() + sd["output.bias"]


def shares_selections(args):
    """Whether V takes O's selections: moe.att.same_sel reaches the attention
    in preln_moeatt layers and preln_moe's XL ("full") attention only; a
    preln_moe layer's full_rope attention is made without it (its own
    selections.v)."""
    return bool(args.get("moe.att.same_sel")) and not (
        args["transformer.variant"] == "preln_moe" and args["moe.att.variant"] == "full_rope")


def _position(args):
    return "xl" if args["moe.att.variant"] == "full" else "rope"


def dense_attention(x, sd, a, H, position, args):
    """FullMoeRelativeAttention with neither v nor o experts."""
    T, d = x.shape
    dh = sd[a + "projections.q"].shape[0] // H
    scale = 1.0 / math.sqrt(dh)
    q = (x @ sd[a + "projections.q"].t() * math.sqrt(scale)).view(T, H, dh).transpose(0, 1)
    kk = (x @ sd[a + "projections.k"].t() * math.sqrt(scale)).view(T, H, dh).transpose(0, 1)
    v = (x @ sd[a + "projections.v"].t()).view(T, H, dh).transpose(0, 1)
    if position == "rope":
        n = int(args.get("rope.rotate_fraction", 0.5) * dh)
        q, kk = rope_rotate(q, n, args.get("rope.base", 10000.0)), rope_rotate(kk, n, args.get("rope.base", 10000.0))
    att = q @ kk.transpose(1, 2)
    if position == "xl":
        for i in range(T):
            for j in range(i + 1):
                pk = sd[a + "pos_to_pk"] @ (sinusoid_at(j - i, d) * math.sqrt(scale))
                for h in range(H):
                    att[h, i, j] += q[h, i] @ pk[h * dh:(h + 1) * dh]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    res = torch.softmax(att.masked_fill(mask, float("-inf")), -1) @ v
    return res.transpose(0, 1).reshape(T, H * dh) @ sd[a + "projections.o"].t()
