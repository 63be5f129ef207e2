"""How many routing assignments the capacity-aware dispatch drops, measured
with the PyTorch reference on a model directory and a text:

  prefill  one engine step of B sequences x L tokens (T = B*L)
  decode   the next step: one new token for each of the B sequences (T = B)
  single   one sequence: prefill of L tokens, then one decode token (T = 1)

for the capacity factors given (overflow, min_capacity, capacity_scope and
capacity_group from config.json unless overridden). The sequences are B
consecutive L+1-byte chunks spread evenly over the text. The capacity column is
per step (scope "step") or per group of G positions of one sequence ("sequence").

  /usr/bin/python3 tools/capacity_report.py models/default models/heldout.txt \
      [--batch 32 --len 64 --factors 1.0,1.25,1.5,2.0] [--capacity-scope step]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see tools/train.py
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
from export import load_model  # noqa: E402
from routing import DROPPED, DispatchConfig  # noqa: E402


def tally(routes):
    """{module: [routed, dropped, tokens with every assignment dropped, token-routers]}."""
    out = {}
    for (_, module, _), r in routes:
        t = out.setdefault(module, [0, 0, 0, 0])
        t[0] += sum(r.stats["routed"])
        t[1] += sum(r.stats["dropped"])
        t[2] += int((r.fate == DROPPED).all(1).sum())
        t[3] += r.fate.shape[0]
    return out


def fmt(t):
    return {m: dict(dropped=f"{v[1]}/{v[0]}", dropped_pct=round(100.0 * v[1] / v[0], 2),
                    tokens_all_dropped_pct=round(100.0 * v[2] / v[3], 2)) for m, v in t.items()}


def capacities(model, T, dispatch):
    a, f = model.cfg["attention"], model.cfg["ffn"]
    out = {}
    if a["type"] == "switchhead" and a["n_experts"] > 1:
        out["attn"] = dispatch.slots_per_expert(T, a["top_k"], a["n_experts"])
    if f["type"] == "moe":
        out["ffn"] = dispatch.slots_per_expert(T, f["top_k"], f["n_experts"])
    return out


def run(model, seqs, dispatch):
    B, L1 = seqs.shape
    L = L1 - 1
    cache = model.new_cache()
    pre = model(seqs[:, :L], cache=cache, dispatch=dispatch)
    dec = model(seqs[:, L:], positions=torch.full((B, 1), L), cache=cache, dispatch=dispatch)
    cache1 = model.new_cache()
    model(seqs[:1, :L], cache=cache1, dispatch=dispatch)
    one = model(seqs[:1, L:], positions=torch.full((1, 1), L), cache=cache1, dispatch=dispatch)
    return {
        "prefill": dict(T=B * L, capacity=capacities(model, B * L, dispatch), **fmt(tally(pre["routes"]))),
        "decode": dict(T=B, capacity=capacities(model, B, dispatch), **fmt(tally(dec["routes"]))),
        "single": dict(T=1, capacity=capacities(model, 1, dispatch), **fmt(tally(one["routes"]))),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("text")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--len", type=int, default=64)
    ap.add_argument("--factors", default="", help="comma-separated capacity factors (default: config's)")
    ap.add_argument("--min-capacity", type=int)
    ap.add_argument("--overflow", choices=["drop", "reroute"])
    ap.add_argument("--capacity-scope", choices=["sequence", "step"])
    ap.add_argument("--capacity-group", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    model = load_model(args.model_dir, torch.float32)
    data = open(args.text, "rb").read()
    stride = (len(data) - args.len - 1) // args.batch
    seqs = torch.tensor([list(data[i * stride:i * stride + args.len + 1]) for i in range(args.batch)])
    base = model.cfg["dispatch"]
    factors = [float(x) for x in args.factors.split(",")] if args.factors else [base["capacity_factor"]]
    report = {}
    with torch.no_grad():
        for cf in factors:
            d = DispatchConfig(cf, base["min_capacity"] if args.min_capacity is None else args.min_capacity,
                               args.overflow or base["overflow"], args.capacity_scope or base["capacity_scope"],
                               args.capacity_group or base["capacity_group"])
            scope = "step" if d.capacity_scope == "step" else f"sequence G={d.capacity_group}"
            report[f"cf={cf} min_capacity={d.min_capacity} {d.overflow} {scope}"] = run(model, seqs, d)
    print("| dispatch | step | T | capacity (attn / ffn) | attn_v dropped | attn_o dropped | ffn dropped |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key, scen in report.items():
        for name, r in scen.items():
            cells = [f"{r[m]['dropped']} ({r[m]['dropped_pct']:.2f}%)" if m in r else "-"
                     for m in ("attn_v", "attn_o", "ffn")]
            cap = " / ".join(str(r["capacity"].get(m, "-")) for m in ("attn", "ffn"))
            print(f"| {key} | {name} | {r['T']} | {cap} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
