"""Trains the built-in byte-level models of switchserve on the King James Bible
(tools/corpus.py): the SwitchAll model (SwitchHead attention + sigma-MoE FFN)
that `switchserve serve` loads when no --model is given, and a dense baseline
with the same parameter count. PyTorch on the CPU.

The parameters are those of the reference model (tools/reference/
reference_model.py, names = tensor names of model.safetensors). Its forward is
one engine step with Python loops over tokens in the dispatcher and under
torch.no_grad, so training uses `train_forward` below: the same function,
vectorised and dropless (every expert is computed and masked by its gate, which
is exact: an expert outside a token's top-k gets weight 0 and no gradient from
that token). `check_against_reference` verifies that on a batch before
training. The config's `dispatch` section is for serving only.

Loss: next-byte cross-entropy + alpha * mean over routers of the Switch
load-balancing loss E * sum_e f_e * P_e (the `aux_loss` of docs/design.md: f_e the
fraction of top-k assignments to e, P_e the mean gate probability, sigmoid
gates divided by their sum over experts). f_e carries no gradient.

  /usr/bin/python3 tools/train.py --model switchall --out models/default
  /usr/bin/python3 tools/train.py --model dense --out models/dense-baseline
  /usr/bin/python3 tools/train.py --model switchall --check-only   # equivalence check
"""
import argparse
import copy
import json
import math
import os
import sys
import time

# The 2 cores are shared with compilers: spinning OpenMP workers then stall
# every small op (10-50x slower elementwise kernels measured); sleep instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "reference"))
sys.path.insert(0, HERE)
import corpus  # noqa: E402
from export import save_model  # noqa: E402
from reference_model import Model  # noqa: E402
from routing import DispatchConfig  # noqa: E402

# ---------------------------------------------------------------- configs --
# Both: byte vocabulary, d_model 128, 4 pre-LayerNorm blocks, tied embeddings,
# context 256, RoPE on half of each head. Parameter counts: see count_params.
_COMMON = {
    "format_version": 1, "vocab_size": 256, "d_model": 128, "n_layers": 4,
    "max_seq_len": 256, "norm": "layernorm", "norm_eps": 1e-5, "tie_embeddings": True,
    "tokenizer": "byte", "bos_token_id": None, "eos_token_id": None,
}
CONFIGS = {
    "switchall": dict(_COMMON, name="kjv-switchall", attention={
        "type": "switchhead", "n_heads": 2, "n_kv_heads": 2, "head_dim": 32, "n_experts": 4,
        "top_k": 2, "gate": "sigmoid", "shared_router": False, "value_routing": "source",
        "rotate_fraction": 0.5, "rope_base": 10000.0,
    }, ffn={
        "type": "moe", "d_ff": 28, "n_experts": 16, "top_k": 4, "gate": "sigmoid",
        "renormalize": False, "activation": "gelu", "bias": True, "router_bias": False,
    }, dispatch={"capacity_factor": 2.0, "min_capacity": 4, "overflow": "drop",
                 "capacity_scope": "sequence", "capacity_group": 128}),
    "dense": dict(_COMMON, name="kjv-dense-baseline", attention={
        "type": "dense", "n_heads": 4, "n_kv_heads": 4, "head_dim": 32,
        "rotate_fraction": 0.5, "rope_base": 10000.0,
    }, ffn={"type": "dense", "d_ff": 512, "activation": "gelu", "bias": True}),
}


def merge(base, over):
    out = copy.deepcopy(base)
    for key, val in over.items():
        out[key] = merge(out[key], val) if isinstance(val, dict) and isinstance(out.get(key), dict) else val
    return out


# ------------------------------------------------------ training forward --

def _layer_norm(norm, x):
    if norm.kind == "layernorm":
        return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + norm.eps) * norm.weight


def _gate(logits, k, kind, renormalize=False):
    """logits [N, R, E] (R routers) -> (weights [N, R, E], zero outside the
    top-k; aux loss averaged over the R routers)."""
    E = logits.shape[-1]
    top = logits.topk(k, dim=-1).indices
    chosen = torch.zeros_like(logits).scatter_(-1, top, 1.0)
    if kind == "sigmoid":
        s = torch.sigmoid(logits)
        prob = s / s.sum(-1, keepdim=True)
    elif kind == "softmax":
        s = prob = torch.softmax(logits, -1)
    else:
        raise ValueError(f"gate {kind} not supported by train_forward")
    w = s * chosen
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    f = chosen.mean(0) / k                       # [R, E], no gradient
    aux = E * (f * prob.mean(0)).sum(-1).mean()
    return w, aux


def _rope_tables(L, n_rot, base, dtype):
    """cos, sin [L, 1, n_rot/2] exactly as reference_model.apply_rope computes
    them (angles in f64, rounded to the model dtype, then cos/sin)."""
    half = n_rot // 2
    i = torch.arange(half, dtype=torch.float64)
    inv_freq = base ** (-2.0 * i / n_rot)
    ang = (torch.arange(L, dtype=torch.float64)[:, None] * inv_freq[None, :]).to(dtype)
    return torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]


def _rope(x, tables, n_rot):
    """x [B, L, heads, dh]: rotate-half RoPE on the first n_rot channels."""
    if n_rot == 0:
        return x
    cos, sin = tables
    half = n_rot // 2
    x1, x2 = x[..., :half], x[..., half:n_rot]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., n_rot:]], -1)


def _attention(att, x, rope_tables):
    """x [B, L, d] normed, full causal sequences starting at position 0."""
    B, L, d = x.shape
    H, dh, E = att.H, att.dh, att.E
    s = dh ** -0.25
    q = _rope((x @ att.q.weight.t() * s).view(B, L, H, dh), rope_tables, att.n_rot)
    k = _rope((x @ att.k.weight.t() * s).view(B, L, H, dh), rope_tables, att.n_rot)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    aux = []
    if att.kind == "dense":
        v = (x @ att.v.weight.t()).view(B, L, H, dh)
    else:
        xf = x.reshape(B * L, d)
        wv, a = _gate((xf @ att.sel_v.t()).view(B * L, H, E), att.top_k, att.gate)
        aux.append(a)
        allv = xf @ att.v.view(H, E, d, dh).permute(2, 0, 1, 3).reshape(d, H * E * dh)
        v = (allv.view(B * L, H, E, dh) * wv[..., None]).sum(2).view(B, L, H, dh)
    scores = q @ k.transpose(-1, -2)                                   # [B, H, L, L]
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    p = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
    A = (p @ v.transpose(1, 2)).transpose(1, 2)                         # [B, L, H, dh]
    if att.kind == "dense":
        return A.reshape(B, L, H * dh) @ att.o.weight.t(), aux
    xf = x.reshape(B * L, d)
    wo, a = _gate((xf @ att.sel_o.t()).view(B * L, H, E), att.top_k, att.gate)
    aux.append(a)
    gated = A.reshape(B * L, H, 1, dh) * wo[..., None]                  # [N, H, E, dh]
    y = gated.reshape(B * L, H * E * dh) @ att.o.reshape(H * E * dh, d)
    return y.view(B, L, d), aux


_ACT = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def _ffn(ff, x):
    """x [N, d] normed."""
    act = _ACT[ff.act]
    if ff.kind == "dense":
        return ff.w2(act(ff.w1(x))), []
    N, d = x.shape
    X, Fd = ff.X, ff.w1.shape[1]
    z = x @ ff.router.weight.t()
    if ff.router.bias is not None:
        z = z + ff.router.bias
    w, aux = _gate(z[:, None, :], ff.k, ff.gate, ff.renorm)
    w = w[:, 0]
    h = x @ ff.w1.reshape(X * Fd, d).t()
    if ff.bias_on:
        h = h + ff.b1.reshape(X * Fd)
    h = act(h).view(N, X, Fd) * w[..., None]
    y = h.reshape(N, X * Fd) @ ff.w2.transpose(1, 2).reshape(X * Fd, d)
    if ff.bias_on:
        y = y + w @ ff.b2
    return y, [aux]


def train_forward(model, tokens):
    """tokens [B, L] (each row a fresh sequence from position 0) -> (logits
    [B, L, V], mean aux loss over all routers, or None without routers)."""
    B, L = tokens.shape
    x = model.embedding.weight[tokens]
    att0 = model.layers[0].attn
    tables = _rope_tables(L, att0.n_rot, att0.base, x.dtype)
    auxes = []
    for blk in model.layers:
        y, a = _attention(blk.attn, _layer_norm(blk.attn_norm, x), tables)
        x = x + y
        y, b = _ffn(blk.ffn, _layer_norm(blk.ffn_norm, x).reshape(B * L, -1))
        x = x + y.view(B, L, -1)
        auxes += a + b
    x = _layer_norm(model.final_norm, x)
    head = model.embedding.weight if model.cfg["tie_embeddings"] else model.lm_head.weight
    aux = torch.stack(auxes).mean() if auxes else None
    return x @ head.t(), aux


def check_against_reference(model, tokens, tol=1e-5, tol_f32=1e-4):
    """Max |logit difference| of train_forward vs the reference Model.forward
    (one engine step, dropless) on `tokens`, in float64 (must be <= tol: same
    function, same routing) and in float32 (<= tol_f32: summation order)."""
    out = {}
    for dtype in (torch.float64, torch.float32):
        m = copy.deepcopy(model).to(dtype)
        with torch.no_grad():
            ours, _ = train_forward(m, tokens)
            ref = m(tokens, dispatch=DispatchConfig())["logits"]
        out[str(dtype).replace("torch.", "")] = float((ours - ref).abs().max())
    ok = out["float64"] <= tol and out["float32"] <= tol_f32
    return ok, out


# ---------------------------------------------------------- init, counts --

def init_weights(model, seed):
    """Deterministic init: fan-in scaled normals; output-side matrices (attn o,
    FFN w2) also scaled by 1/sqrt(2 n_layers) and by the active fan-in
    (H k dh for SwitchHead o, k d_ff for MoE w2); embedding std 0.02."""
    c = model.cfg
    a, f = c["attention"], c["ffn"]
    depth = (2 * c["n_layers"]) ** -0.5
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
                continue
            if name.endswith(("bias", ".b1", ".b2")):
                p.zero_()
                continue
            if name == "embedding.weight" or name == "lm_head.weight":
                std = 0.02
            elif name.endswith("attn.o"):        # switchhead [H*E, dh, d]
                std = (a["n_heads"] * a["top_k"] * a["head_dim"]) ** -0.5 * depth
            elif name.endswith("attn.o.weight"):  # dense [d, H*dh]
                std = p.shape[1] ** -0.5 * depth
            elif name.endswith("ffn.w2"):        # moe [X, d, F]
                std = (f["top_k"] * f["d_ff"]) ** -0.5 * depth
            elif name.endswith("ffn.w2.weight"):  # dense [d, F]
                std = p.shape[1] ** -0.5 * depth
            else:                                # maps d -> something
                std = c["d_model"] ** -0.5
            p.copy_(std * torch.randn(p.shape, generator=g))
    return model


def count_params(model):
    """(total, active per token): active counts only the top-k experts."""
    c = model.cfg
    a, f, d = c["attention"], c["ffn"], c["d_model"]
    total = sum(p.numel() for p in model.parameters())
    active = total
    if a["type"] == "switchhead" and a["n_experts"] > 1:
        per_expert = 2 * d * a["head_dim"]                    # v and o
        active -= c["n_layers"] * a["n_heads"] * (a["n_experts"] - a["top_k"]) * per_expert
    if f["type"] == "moe":
        per_expert = 2 * d * f["d_ff"] + (f["d_ff"] + d if f["bias"] else 0)
        active -= c["n_layers"] * (f["n_experts"] - f["top_k"]) * per_expert
    return total, active


# ------------------------------------------------------------------ data --

def load_text(raw_path=None):
    """(train bytes, held-out bytes) as uint8 tensors; the held-out text must
    equal the committed models/heldout.txt."""
    raw = open(raw_path).read() if raw_path else corpus.read_bible()
    train, held = corpus.clean(raw, "train"), corpus.clean(raw, "heldout")
    committed = os.path.join(ROOT, "models", "heldout.txt")
    if os.path.exists(committed) and open(committed).read() != held:
        raise SystemExit(f"{committed} differs from the cleaner's held-out split")
    as_t = lambda s: torch.frombuffer(bytearray(s.encode("ascii")), dtype=torch.uint8).long()  # noqa: E731
    return as_t(train), as_t(held)


def windows(n_tokens, L):
    """Start offsets of windows of up to L tokens overlapping by one token,
    so every token but the first is predicted exactly once."""
    return list(range(0, max(n_tokens - 1, 1), L - 1))


@torch.no_grad()
def evaluate(model, data, L, batch=16):
    """(mean NLL in nats per predicted token, tokens predicted) with
    train_forward (dropless) over the windows of `data`."""
    model.eval()
    starts = windows(len(data), L)
    full = [s for s in starts if s + L <= len(data)]
    tail = [s for s in starts if s + L > len(data)]
    nll, count = 0.0, 0
    for i in range(0, len(full), batch):
        seq = torch.stack([data[s:s + L] for s in full[i:i + batch]])
        logits, _ = train_forward(model, seq)
        nll += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                     seq[:, 1:].reshape(-1), reduction="sum"))
        count += seq[:, 1:].numel()
    for s in tail:
        seq = data[s:][None]
        logits, _ = train_forward(model, seq)
        nll += float(F.cross_entropy(logits[0, :-1], seq[0, 1:], reduction="sum"))
        count += seq.shape[1] - 1
    model.train()
    return nll / count, count


# ----------------------------------------------------------------- train --

def lr_at(step, steps, peak, warmup, final_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--override", default="{}", help="JSON merged into the config (pilots)")
    ap.add_argument("--out", help="model directory to export to")
    ap.add_argument("--dtype", default="f16", choices=["f32", "f16", "bf16"], help="export dtype")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, help="training sequence length (default max_seq_len)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--final-lr-frac", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--time-budget-minutes", type=float, default=0,
                    help="time-aware schedule: the LR schedule advances by the larger of steps done and "
                         "the fraction of this budget used, and training ends when either is complete "
                         "(so a slow machine still anneals; the summary records the steps done)")
    ap.add_argument("--raw-bible", help="saved `bible 'Gen1:1-Rev22:21'` output (default: run bible)")
    ap.add_argument("--checkpoint", help="also save the f32 state_dict here")
    ap.add_argument("--summary", help="write a JSON summary of the run here")
    ap.add_argument("--check-only", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = merge(CONFIGS[args.model], json.loads(args.override))
    model = init_weights(Model(cfg), args.seed)
    total, active = count_params(model)
    L = args.seq_len or model.cfg["max_seq_len"]
    print(f"model {args.model}: {total} parameters, {active} active per token", flush=True)
    print(json.dumps(cfg), flush=True)

    train, held = load_text(args.raw_bible)
    print(f"corpus: {len(train)} training bytes, {len(held)} held-out bytes", flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(train) - 64, (4,), generator=gen)
    probe = torch.stack([train[s:s + 64] for s in starts])
    ok, diffs = check_against_reference(model, probe)
    print(f"train_forward vs reference Model.forward on 4x64 tokens: max |dlogit| {diffs} "
          f"-> {'ok' if ok else 'MISMATCH'}", flush=True)
    if not ok:
        raise SystemExit("train_forward does not match the reference")
    if args.check_only:
        return

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "embedding.weight"]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n != "embedding.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = f"{os.getloadavg()[0]:.1f}"
    t0 = time.time()
    run_loss, run_aux, n_run = 0.0, 0.0, 0
    history = []
    stopped_early = time_bound = False
    step = 0
    for step in range(args.steps):
        sched = step
        if args.time_budget_minutes:
            sched = max(step, int(args.steps * (time.time() - t0) / (60 * args.time_budget_minutes)))
            if sched >= args.steps:
                print(f"TIME BUDGET: stopping after {step} of {args.steps} steps "
                      f"({args.time_budget_minutes} min used; the schedule followed the clock)", flush=True)
                stopped_early = True
                step -= 1
                break
            if sched > step and not time_bound:
                print(f"step {step + 1}: the schedule now follows the clock (time budget)", flush=True)
                time_bound = True
        lr = lr_at(sched, args.steps, args.lr, args.warmup, args.final_lr_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(train) - L - 1, (args.batch,), generator=gen)
        seq = torch.stack([train[s:s + L + 1] for s in idx])
        logits, aux = train_forward(model, seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
        total_loss = loss + (args.aux_coef * aux if aux is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        run_loss += float(loss)
        run_aux += float(aux) if aux is not None else 0.0
        n_run += 1
        if (step + 1) % args.log_every == 0 or step == 0:
            el = time.time() - t0
            print(f"step {step + 1:5d}  loss {run_loss / n_run:.4f} ({run_loss / n_run / math.log(2):.3f} bpb)  "
                  f"aux {run_aux / n_run:.4f}  lr {lr:.2e}  {el:7.1f}s  "
                  f"{(step + 1) * args.batch * L / el:.0f} tok/s", flush=True)
            run_loss, run_aux, n_run = 0.0, 0.0, 0
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            nll, _ = evaluate(model, held, model.cfg["max_seq_len"])
            history.append((step + 1, nll / math.log(2)))
            print(f"eval step {step + 1}: held-out {nll / math.log(2):.4f} bpb", flush=True)
    train_s = time.time() - t0
    ok, diffs = check_against_reference(model, probe)
    print(f"trained model: train_forward vs reference max |dlogit| {diffs} -> {'ok' if ok else 'MISMATCH'}",
          flush=True)
    nll, count = evaluate(model, held, model.cfg["max_seq_len"])
    bpb = nll / math.log(2)
    print(f"done: {step + 1} steps in {train_s:.0f}s; held-out (train_forward, f32, dropless): "
          f"{count} tokens, NLL {nll:.4f}, {bpb:.4f} bpb", flush=True)
    if args.checkpoint:
        os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
        torch.save(model.state_dict(), args.checkpoint)
    if args.out:
        save_model(model, args.out, args.dtype)
        print(f"exported {args.out} ({args.dtype})", flush=True)
    if args.summary:
        with open(args.summary, "w") as f:
            finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            json.dump(dict(model=args.model, started_utc=started, finished_utc=finished,
                           machine=f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s), "
                                   f"load average at start {load0}, at end {os.getloadavg()[0]:.1f}",
                           params=total, active_params=active, steps=step + 1,
                           planned_steps=args.steps, stopped_early=stopped_early, time_bound=time_bound, batch=args.batch,
                           seq_len=L, train_seconds=round(train_s, 1), heldout_bpb_f32=round(bpb, 4),
                           eval_history=history, args=vars(args)), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
