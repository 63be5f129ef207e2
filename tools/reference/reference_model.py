"""PyTorch reference of the switchserve model (docs/design.md, docs/model-format.md).

Written for clarity, not speed. Every forward call is ONE engine step: the
valid tokens of all sequences of the batch, in sequence order then position
(batch row b is sequence b). With capacity scope "step" they share the expert
capacity of each router; with "sequence" each sequence has its own, per group
of positions, carried in the cache from step to step. Parameter names are
exactly the tensor names of model.safetensors.
"""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from routing import DEFAULT_CAPACITY_GROUP, SCOPES, DispatchConfig, SequenceSlots, route

# ----------------------------------------------------------------- config --

_TOP = {"format_version": None, "name": "", "vocab_size": None, "d_model": None,
        "n_layers": None, "max_seq_len": None, "norm": None, "norm_eps": 1e-5,
        "tie_embeddings": True, "output_bias": False, "tokenizer": None, "bos_token_id": None,
        "eos_token_id": None, "attention": None, "ffn": None, "dispatch": {}}
_ATTN = {"type": None, "n_heads": None, "n_kv_heads": None, "head_dim": None,
         "n_experts": 1, "top_k": 1, "gate": "sigmoid", "shared_router": False,
         "value_routing": "source", "position": "rope", "rotate_fraction": 0.5, "rope_base": 10000.0}
_FFN = {"type": None, "d_ff": None, "n_experts": 1, "top_k": 1, "gate": "softmax",
        "renormalize": False, "activation": "relu", "bias": True, "router_bias": False}
_DISPATCH = {"capacity_factor": 0.0, "min_capacity": 0, "overflow": "drop",
             "capacity_scope": "sequence", "capacity_group": DEFAULT_CAPACITY_GROUP}


def _fill(section, spec, where):
    out = {}
    for key in section:
        if key not in spec:
            raise ValueError(f"config.json: unknown key {where}{key}")
    for key, default in spec.items():
        if key in section:
            out[key] = section[key]
        elif default is None and key not in ("bos_token_id", "eos_token_id", "n_kv_heads"):
            raise ValueError(f"config.json: missing key {where}{key}")
        else:
            out[key] = copy.deepcopy(default)
    return out


def parse_config(raw):
    """Validates a config.json dict and returns it with every default filled."""
    cfg = _fill(raw, _TOP, "")
    if cfg["format_version"] != 1:
        raise ValueError("config.json: format_version must be 1")
    cfg["attention"] = a = _fill(raw["attention"], _ATTN, "attention.")
    cfg["ffn"] = f = _fill(raw["ffn"], _FFN, "ffn.")
    raw_dispatch = raw.get("dispatch", {})
    cfg["dispatch"] = d = _fill(raw_dispatch, _DISPATCH, "dispatch.")
    if a["n_kv_heads"] is None:
        a["n_kv_heads"] = a["n_heads"]
    if not isinstance(cfg["output_bias"], bool):
        raise ValueError(f"config.json: output_bias: expected true or false, found {cfg['output_bias']!r}")
    if a["position"] not in ("rope", "xl"):
        raise ValueError(f'config.json: attention.position: expected "rope" or "xl", found {a["position"]!r}')
    if a["position"] == "xl":
        for key in ("rotate_fraction", "rope_base"):
            if key in raw["attention"]:
                raise ValueError(f'config.json: attention.{key}: applies to position "rope" only, '
                                 f'not "xl" (no RoPE there)')
        if cfg["d_model"] % 2:
            raise ValueError(f'config.json: d_model: position "xl" needs an even d_model (sin/cos pairs '
                             f'of width d_model), found {cfg["d_model"]}')
    assert cfg["norm"] in ("layernorm", "rmsnorm")
    assert a["type"] in ("switchhead", "dense") and f["type"] in ("moe", "dense")
    assert a["n_heads"] % a["n_kv_heads"] == 0
    assert a["gate"] in ("sigmoid", "softmax_topk") and a["value_routing"] in ("source", "destination")
    assert f["gate"] in ("softmax", "sigmoid") and f["activation"] in ("relu", "gelu", "silu")
    assert d["overflow"] in ("drop", "reroute")
    if d["capacity_scope"] not in SCOPES:
        raise ValueError(f"config.json: dispatch.capacity_scope: expected one of {SCOPES}, "
                         f"found {d['capacity_scope']!r}")
    g = d["capacity_group"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"config.json: dispatch.capacity_group: expected an integer >= 1, found {g!r}")
    if d["capacity_scope"] == "step" and "capacity_group" in raw_dispatch:
        raise ValueError('config.json: dispatch.capacity_group: applies to capacity_scope "sequence" only')
    # As the loader (docs/model-format.md): a dense module takes n_experts and
    # top_k only as 1; 1 <= top_k <= n_experts.
    for name, m in (("attention", a), ("ffn", f)):
        if m["type"] == "dense" and (m.get("n_experts", 1) != 1 or m.get("top_k", 1) != 1):
            raise ValueError(f"config.json: {name}: a dense module has n_experts and top_k 1")
        if not 1 <= m["top_k"] <= m["n_experts"]:
            raise ValueError(f"config.json: {name}.top_k: must be in [1, n_experts = "
                             f"{m['n_experts']}], found {m['top_k']}")
    return cfg


def rotary_dims(cfg):
    a = cfg["attention"]
    if a.get("position", "rope") == "xl":
        return 0
    n = int(math.floor(a["rotate_fraction"] * a["head_dim"]))
    return n - n % 2


def router_ids(cfg):
    """Every router (layer, module, head, E, k): layer-major, attn_v, attn_o,
    ffn, then head (engine/moe/router_layout.h RouterLayout)."""
    a, f = cfg["attention"], cfg["ffn"]
    ids = []
    for layer in range(cfg["n_layers"]):
        if a["type"] == "switchhead" and a["n_experts"] > 1:
            hv = 1 if a["shared_router"] else a["n_kv_heads"]
            ho = 1 if a["shared_router"] else a["n_heads"]
            ids += [(layer, "attn_v", h, a["n_experts"], a["top_k"]) for h in range(hv)]
            ids += [(layer, "attn_o", h, a["n_experts"], a["top_k"]) for h in range(ho)]
        if f["type"] == "moe":
            ids.append((layer, "ffn", 0, f["n_experts"], f["top_k"]))
    return ids


# ----------------------------------------------------------------- layers --

class Norm(nn.Module):
    def __init__(self, d, kind, eps):
        super().__init__()
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(d))
        if kind == "layernorm":
            self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        if self.kind == "layernorm":
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x, pos, n_rot, base):
    """Rotate-half RoPE on the first n_rot channels. x [N, heads, dh], pos [N]."""
    if n_rot == 0:
        return x
    half = n_rot // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    inv_freq = base ** (-2.0 * i / n_rot)
    ang = (pos.to(torch.float64)[:, None] * inv_freq[None, :]).to(x.dtype)  # [N, half]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:n_rot]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., n_rot:]], -1)


def sinusoid(p, width):
    """Transformer-XL's fixed position encoding at (signed) positions p [n]:
    [n, width], pe[:, 2m] = sin(p w_m), pe[:, 2m+1] = cos(p w_m),
    w_m = 10000^(-2m/width) (= exp(2m * -ln(10000) / width)). In float64."""
    p = p.to(torch.float64)
    w = torch.exp(torch.arange(0, width, 2, dtype=torch.float64) * (-math.log(10000.0) / width))
    ang = p[:, None] * w[None, :]
    return torch.stack([torch.sin(ang), torch.cos(ang)], -1).reshape(len(p), width)


def router_logits(X, W):
    """X [N, d] @ W [R, d].T, each column its own matrix-vector product: two
    experts with identical rows get identical logits, a tie that goes to the
    lower index as DESIGN.md says (one GEMM may round two equal columns 1 ulp
    apart)."""
    return torch.stack([X @ w for w in W], -1)


def xl_position_scores(Q, rel, pos_to_pk, d_model, dh):
    """q_i . r_h(j - i) for every query and key of a padded step.
    Q [B, L, H, dh] (already scaled by dh^-1/4); rel [B, L, S] = key position -
    query position; pos_to_pk [H*dh, d]. r_h(p) = P_h (dh^-1/4 pe(p)).
    Returns [B, H, L, S]. Computed for each distinct p once, then gathered."""
    B, L, H, _ = Q.shape
    lo, hi = int(rel.min()), int(rel.max())
    p = torch.arange(lo, hi + 1, device=Q.device)
    pe = (sinusoid(p, d_model) * dh ** -0.25).to(Q.dtype)
    R = (pe @ pos_to_pk.t()).view(len(p), H, dh)  # r_h(p)
    U = torch.einsum("blhc,phc->bhlp", Q, R)  # [B, H, L, n_p]
    idx = (rel - lo)[:, None].expand(B, H, L, rel.shape[-1])
    return U.gather(-1, idx)


class Attention(nn.Module):
    """SwitchHead (E > 1 or E = 1) or dense multi-head attention, with GQA."""

    def __init__(self, cfg):
        super().__init__()
        a = cfg["attention"]
        d = cfg["d_model"]
        self.kind, self.H, self.G, self.dh = a["type"], a["n_heads"], a["n_kv_heads"], a["head_dim"]
        self.E, self.top_k, self.gate = a["n_experts"], a["top_k"], a["gate"]
        self.shared, self.dest = a["shared_router"], a["value_routing"] == "destination"
        self.n_rot, self.base = rotary_dims(cfg), a["rope_base"]
        self.xl, self.d_model = a["position"] == "xl", d
        H, G, dh, E = self.H, self.G, self.dh, self.E
        self.q = nn.Linear(d, H * dh, bias=False)
        self.k = nn.Linear(d, G * dh, bias=False)
        if self.kind == "dense":
            self.v = nn.Linear(d, G * dh, bias=False)
            self.o = nn.Linear(H * dh, d, bias=False)
        elif E == 1:
            self.v = nn.Parameter(torch.zeros(G * dh, d))
            self.o = nn.Parameter(torch.zeros(d, H * dh))
            self.sel_o = nn.Parameter(torch.zeros(H, d))
        else:
            R = 1 if self.shared else None
            self.v = nn.Parameter(torch.zeros(G * E, d, dh))
            self.o = nn.Parameter(torch.zeros(H * E, dh, d))
            self.sel_v = nn.Parameter(torch.zeros((R or G) * E, d))
            self.sel_o = nn.Parameter(torch.zeros((R or H) * E, d))
        if self.dest and not self.routed:
            self.dest = False
        if self.xl:  # sinusoid (width d) -> position key of each query head
            self.pos_to_pk = nn.Parameter(torch.zeros(H * dh, d))

    @property
    def routed(self):
        return self.kind == "switchhead" and self.E > 1

    def _route(self, X, sel, heads, dispatch_cfg, rdtype, module, ctx):
        """Routes every router head; returns ([N, heads, E] weights, results)."""
        logits = router_logits(X.to(rdtype), sel.to(rdtype)).view(X.shape[0], -1, self.E)
        results = [route(logits[:, r], self.top_k, self.gate, dispatch_cfg, **ctx.router(module, r))
                   for r in range(logits.shape[1])]
        w = torch.stack([r.weights for r in results], 1).to(X.dtype)
        if w.shape[1] == 1:
            w = w.expand(-1, heads, -1)
        return w, results

    def forward(self, X, pos, layout, cache, dispatch_cfg, rdtype, ctx):
        """X: [N, d] normed valid tokens; pos: [N]; layout: (B, L, flat index).
        cache: dict holding K/V/valid/pos of earlier steps (updated).
        ctx: RoutingContext of this layer (sequence ids, positions, slots)."""
        B, L, idx = layout
        N = X.shape[0]
        H, G, dh, E = self.H, self.G, self.dh, self.E
        s = dh ** -0.25
        q = apply_rope((self.q(X) * s).view(N, H, dh), pos, self.n_rot, self.base)
        k = apply_rope((self.k(X) * s).view(N, G, dh), pos, self.n_rot, self.base)
        routes = []
        if self.kind == "dense":
            val = self.v(X).view(N, G, dh)
        elif E == 1:
            val = (X @ self.v.t()).view(N, G, dh)
        else:
            wv, rv = self._route(X, self.sel_v, G, dispatch_cfg, rdtype, "attn_v", ctx)
            routes += [("attn_v", r) for r in rv]
            allv = torch.einsum("nd,gedk->ngek", X, self.v.view(G, E, -1, dh))
            val = allv if self.dest else (allv * wv[..., None]).sum(2)
        # scatter the step's K/V into the padded [B, L] layout and append
        kp = X.new_zeros(B * L, G, dh)
        kp[idx] = k
        vp = X.new_zeros((B * L,) + tuple(val.shape[1:]))
        vp[idx] = val
        valid = torch.zeros(B * L, dtype=torch.bool, device=X.device)
        valid[idx] = True
        pp = torch.zeros(B * L, dtype=torch.int64, device=X.device)
        pp[idx] = pos
        new = dict(K=kp.view(B, L, G, dh), V=vp.view((B, L) + tuple(val.shape[1:])),
                   valid=valid.view(B, L), pos=pp.view(B, L))
        for key in new:
            cache[key] = new[key] if key not in cache else torch.cat([cache[key], new[key]], 1)
        K, V, kvalid, kpos = cache["K"], cache["V"], cache["valid"], cache["pos"]
        rep = H // G
        Qp = X.new_zeros(B * L, H, dh)
        Qp[idx] = q
        Qp = Qp.view(B, L, H, dh)
        scores = torch.einsum("blhc,bshc->bhls", Qp, K.repeat_interleave(rep, 2))
        if self.xl:  # relative position j - i, from absolute positions: chunking changes nothing
            rel = kpos[:, None, :] - pp.view(B, L)[:, :, None]
            scores = scores + xl_position_scores(Qp, rel, self.pos_to_pk, self.d_model, dh)
        allowed = kvalid[:, None, None, :] & (kpos[:, None, None, :] <= pp.view(B, L)[:, None, :, None])
        allowed = allowed | ~valid.view(B, 1, L, 1)  # padding queries: anything, discarded
        att = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        if self.dest:
            Ve = V.repeat_interleave(rep, 2)  # [B, S, H, E, dh]
            A = torch.einsum("bhls,bshec->blhec", att, Ve).reshape(B * L, H, E, dh)[idx]
            A = (A * wv.repeat_interleave(rep, 1)[..., None]).sum(2)
        else:
            A = torch.einsum("bhls,bshc->blhc", att, V.repeat_interleave(rep, 2)).reshape(B * L, H, dh)[idx]
        if self.kind == "dense":
            y = self.o(A.reshape(N, H * dh))
        elif E == 1:
            g = torch.sigmoid((X.to(rdtype) @ self.sel_o.to(rdtype).t())).to(X.dtype)
            y = (A * g[..., None]).reshape(N, H * dh) @ self.o.t()
        else:
            wo, ro = self._route(X, self.sel_o, H, dispatch_cfg, rdtype, "attn_o", ctx)
            routes += [("attn_o", r) for r in ro]
            allo = torch.einsum("nhc,hecd->nhed", A, self.o.view(H, E, dh, -1))
            y = (allo * wo[..., None]).sum((1, 2))
        return y, routes


def _act(name, x):
    return {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[name](x)


class FeedForward(nn.Module):
    """Dense FFN or MoE FFN (Switch softmax / sigma-MoE sigmoid gates)."""

    def __init__(self, cfg):
        super().__init__()
        f, d = cfg["ffn"], cfg["d_model"]
        self.kind, self.act, self.bias_on = f["type"], f["activation"], f["bias"]
        Fd, X = f["d_ff"], f["n_experts"]
        self.X, self.k, self.gate, self.renorm = X, f["top_k"], f["gate"], f["renormalize"]
        if self.kind == "dense":
            self.w1 = nn.Linear(d, Fd, bias=f["bias"])
            self.w2 = nn.Linear(Fd, d, bias=f["bias"])
        else:
            self.router = nn.Linear(d, X, bias=f["router_bias"])
            self.w1 = nn.Parameter(torch.zeros(X, Fd, d))
            self.w2 = nn.Parameter(torch.zeros(X, d, Fd))
            if f["bias"]:
                self.b1 = nn.Parameter(torch.zeros(X, Fd))
                self.b2 = nn.Parameter(torch.zeros(X, d))

    def forward(self, X, dispatch_cfg, rdtype, ctx):
        if self.kind == "dense":
            return self.w2(_act(self.act, self.w1(X))), []
        W = self.router.weight.to(rdtype)
        z = router_logits(X.to(rdtype), W)
        if self.router.bias is not None:
            z = z + self.router.bias.to(rdtype)
        r = route(z, self.k, self.gate, dispatch_cfg, self.renorm, **ctx.router("ffn", 0))
        y = torch.zeros_like(X)
        w = r.weights.to(X.dtype)
        for e in range(self.X):
            rows = r.kept_mask[:, e].nonzero().flatten()
            if rows.numel() == 0:
                continue
            h = X[rows] @ self.w1[e].t()
            if self.bias_on:
                h = h + self.b1[e]
            out = _act(self.act, h) @ self.w2[e].t()
            if self.bias_on:
                out = out + self.b2[e]
            y[rows] += w[rows, e, None] * out
        return y, [("ffn", r)]


class RoutingContext:
    """What sequence-scope dispatch needs besides the logits: each token's
    sequence (batch row) and position, and the per-router slot state that the
    layer's cache carries across steps."""

    def __init__(self, seq, pos, layer_cache):
        self.seq, self.pos = seq, pos
        self.slots = layer_cache.setdefault("slots", {})

    def router(self, module, head):
        return dict(seq=self.seq, pos=self.pos, slots=self.slots.setdefault((module, head), SequenceSlots()))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = Norm(cfg["d_model"], cfg["norm"], cfg["norm_eps"])
        self.attn = Attention(cfg)
        self.ffn_norm = Norm(cfg["d_model"], cfg["norm"], cfg["norm_eps"])
        self.ffn = FeedForward(cfg)


class Model(nn.Module):
    def __init__(self, cfg, dtype=torch.float32):
        super().__init__()
        self.raw_cfg = copy.deepcopy(cfg)
        self.cfg = parse_config(cfg)
        c = self.cfg
        self.embedding = nn.Embedding(c["vocab_size"], c["d_model"])
        self.layers = nn.ModuleList([Block(c) for _ in range(c["n_layers"])])
        self.final_norm = Norm(c["d_model"], c["norm"], c["norm_eps"])
        if not c["tie_embeddings"]:
            self.lm_head = nn.Linear(c["d_model"], c["vocab_size"], bias=c["output_bias"])
        elif c["output_bias"]:  # tied weight, own bias: lm_head.bias only
            self.lm_head = nn.Module()
            self.lm_head.bias = nn.Parameter(torch.zeros(c["vocab_size"]))
        self.to(dtype)

    @property
    def dtype(self):
        return self.embedding.weight.dtype

    def new_cache(self):
        return [dict() for _ in self.layers]

    @torch.no_grad()
    def forward(self, tokens, valid=None, positions=None, cache=None, dispatch=None):
        """One engine step over a padded batch.

        tokens [B, L] int; valid [B, L] bool (default all); positions [B, L]
        absolute positions (default: cache length + arange). `cache` from
        new_cache() is extended in place (K/V and, for sequence-scope
        capacity, each sequence's current group loads). `dispatch`
        (DispatchConfig) overrides config.json's. Returns dict: logits [B, L, V] (padding rows
        are garbage), routes: list of (router_id, RouteResult) over the valid
        tokens in step order, ordered as router_ids(cfg).
        """
        dev = self.embedding.weight.device
        tokens = torch.as_tensor(tokens, dtype=torch.int64).to(dev)
        B, L = tokens.shape
        valid = torch.ones(B, L, dtype=torch.bool) if valid is None else torch.as_tensor(valid)
        valid = valid.to(dev)
        if positions is None:
            past = 0 if not cache or "pos" not in cache[0] else cache[0]["pos"].shape[1]
            positions = past + torch.arange(L).expand(B, L)
        positions = torch.as_tensor(positions).to(dev)
        if cache is None:
            cache = self.new_cache()
        if dispatch is None:
            dispatch = DispatchConfig(**self.cfg["dispatch"])
        rdtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        idx = valid.reshape(-1).nonzero().flatten()
        pos = positions.reshape(-1)[idx]
        seq = torch.arange(B, device=dev).repeat_interleave(L)[idx]
        x = self.embedding(tokens.reshape(-1)[idx])
        routes = []
        for i, blk in enumerate(self.layers):
            ctx = RoutingContext(seq.tolist(), pos.tolist(), cache[i])
            y, r_attn = blk.attn(blk.attn_norm(x), pos, (B, L, idx), cache[i], dispatch, rdtype, ctx)
            x = x + y
            y, r_ffn = blk.ffn(blk.ffn_norm(x), dispatch, rdtype, ctx)
            x = x + y
            heads = {}
            for module, r in r_attn + r_ffn:
                heads[module] = heads.get(module, -1) + 1
                routes.append(((i, module, heads[module]), r))
        x = self.final_norm(x)
        head = self.embedding.weight if self.cfg["tie_embeddings"] else self.lm_head.weight
        logits = x.new_zeros(B * L, self.cfg["vocab_size"])
        logits[idx] = x @ head.t() + (self.lm_head.bias if self.cfg["output_bias"] else 0)
        return dict(logits=logits.view(B, L, -1), routes=routes)

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, padding="left", eos_token_id=None, dispatch=None):
        """Eager greedy decoding of a static batch (lists of token ids) with a
        KV cache: one prefill step on the padded batch, then one step per new
        token for all sequences. Returns the generated ids per prompt."""
        B = len(prompts)
        Lp = max(len(p) for p in prompts)
        tokens = torch.zeros(B, Lp, dtype=torch.int64)
        valid = torch.zeros(B, Lp, dtype=torch.bool)
        for b, p in enumerate(prompts):
            sl = slice(Lp - len(p), Lp) if padding == "left" else slice(0, len(p))
            tokens[b, sl] = torch.tensor(p)
            valid[b, sl] = True
        dev = self.embedding.weight.device
        tokens, valid = tokens.to(dev), valid.to(dev)
        positions = (valid.cumsum(1) - 1).clamp(min=0)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        cache = self.new_cache()
        out = self.forward(tokens, valid, positions, cache, dispatch)
        last = torch.full((B,), Lp - 1, device=dev) if padding == "left" else lens - 1
        logits = out["logits"][torch.arange(B, device=dev), last]
        generated = [[] for _ in range(B)]
        alive = [True] * B
        for step in range(max_new_tokens):
            nxt = logits.argmax(-1)
            for b, tok in enumerate(nxt.tolist()):
                if alive[b]:
                    generated[b].append(tok)
                    if eos_token_id is not None and tok == eos_token_id:
                        alive[b] = False
            if not any(alive) or step == max_new_tokens - 1:
                break
            pos = (lens + step)[:, None]
            live = torch.tensor(alive, device=dev)[:, None]
            out = self.forward(nxt[:, None], live, pos, cache, dispatch)
            logits = out["logits"][:, 0]
        return generated
