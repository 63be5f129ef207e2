"""Scores a text file with a model directory using the PyTorch reference
(tools/reference/): token count, mean NLL, perplexity, bits per byte.

Windowing is that of `switchserve score`: windows of max_seq_len tokens, each
starting at the previous window's last token (overlap of one token), so every
token but the first is predicted exactly once; each window is a fresh sequence
(positions from 0, empty KV cache) and one engine step of its own (so with
step-scope capacity, T = the window's tokens; with sequence scope, groups of
G positions from the window's start).

  /usr/bin/python3 tools/score_reference.py models/default models/heldout.txt
      [--dispatch config|dropless] [--capacity-factor CF] [--capacity-scope sequence|step]
      [--capacity-group G] [--overflow drop|reroute] [--dtype f32|f64] [--json OUT.json]
  /usr/bin/python3 tools/score_reference.py --unigram TRAIN.txt models/heldout.txt
      (add-one smoothed byte unigram estimated on TRAIN.txt, same tokens predicted)
  /usr/bin/python3 tools/score_reference.py models/default --generate "And God said" [--max-new-tokens 200]
      (greedy, as `switchserve generate`: the config's BOS first; ends at EOS or where the context
      does, max_seq_len + 1 tokens in all)
"""
import argparse
import json
import math
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see tools/train.py
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
from export import load_model  # noqa: E402
from routing import DispatchConfig  # noqa: E402

DTYPES = {"f32": torch.float32, "f64": torch.float64}


def encode(model, data):
    """Byte tokenizer: token id = byte value (BOS prepended when the config has one)."""
    cfg = model.cfg
    if cfg["tokenizer"] != "byte":
        raise SystemExit("score_reference.py handles byte-level models only")
    ids = list(data)
    if cfg["bos_token_id"] is not None:
        ids = [cfg["bos_token_id"]] + ids
    return torch.tensor(ids, dtype=torch.int64)


def need_two_tokens(ids, text):
    """As `switchserve score`: a text of fewer than 2 tokens predicts nothing."""
    if len(ids) < 2:
        raise SystemExit(f"score_reference.py: {text}: need at least 2 tokens, found {len(ids)}")


def window_starts(n_tokens, window):
    """Windows [s, s + window) overlapping by one token; the last may be short."""
    if n_tokens < 2:
        return []
    return list(range(0, n_tokens - 1, window - 1))


def score_model(model, ids, dispatch=None, progress=False):
    """Returns dict(tokens, predicted, nll_sum, routed, dropped) over the windows."""
    L = model.cfg["max_seq_len"]
    nll_sum, predicted = 0.0, 0
    routed, dropped = {}, {}
    starts = window_starts(len(ids), L)
    for i, s in enumerate(starts):
        win = ids[s:s + L]
        out = model(win[None], dispatch=dispatch)
        logp = torch.log_softmax(out["logits"][0, :-1].to(torch.float64), -1)
        nll_sum -= float(logp.gather(1, win[1:, None]).sum())
        predicted += len(win) - 1
        for (layer, module, head), r in out["routes"]:
            routed[module] = routed.get(module, 0) + sum(r.stats["routed"])
            dropped[module] = dropped.get(module, 0) + sum(r.stats["dropped"])
        if progress and (i + 1) % 50 == 0:
            print(f"  window {i + 1}/{len(starts)}: {nll_sum / predicted / math.log(2):.4f} bpb so far",
                  file=sys.stderr, flush=True)
    return dict(tokens=len(ids), predicted=predicted, nll_sum=nll_sum, routed=routed, dropped=dropped)


def score_unigram(train_bytes, ids):
    counts = torch.bincount(torch.tensor(list(train_bytes), dtype=torch.int64), minlength=256).double() + 1.0
    logp = torch.log(counts / counts.sum())
    nll_sum = -float(logp[ids[1:]].sum())
    return dict(tokens=len(ids), predicted=len(ids) - 1, nll_sum=nll_sum, routed={}, dropped={})


def summarise(res, n_bytes_predicted):
    mean = res["nll_sum"] / res["predicted"]
    out = dict(tokens=res["tokens"], predicted_tokens=res["predicted"], mean_nll=round(mean, 6),
               perplexity=round(math.exp(mean), 4),
               bits_per_byte=round(res["nll_sum"] / math.log(2) / n_bytes_predicted, 4))
    if res["routed"]:
        out["dropped_assignments"] = {m: f"{res['dropped'][m]}/{res['routed'][m]} "
                                         f"({100.0 * res['dropped'][m] / res['routed'][m]:.2f}%)"
                                      for m in res["routed"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("text", nargs="?")
    ap.add_argument("--dispatch", default="config", choices=["config", "dropless"],
                    help="capacity as in config.json (default) or dropless")
    ap.add_argument("--capacity-factor", type=float,
                    help="override config.json's dispatch.capacity_factor (min_capacity, overflow kept)")
    ap.add_argument("--capacity-scope", choices=["sequence", "step"],
                    help="override config.json's dispatch.capacity_scope")
    ap.add_argument("--capacity-group", type=int, help="override config.json's dispatch.capacity_group")
    ap.add_argument("--overflow", choices=["drop", "reroute"], help="override config.json's dispatch.overflow")
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="compute dtype")
    ap.add_argument("--unigram", metavar="TRAIN_TXT", help="score a byte unigram model instead")
    ap.add_argument("--generate", metavar="PROMPT", help="print a greedy continuation instead")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.unigram:
        if not args.text and args.model_dir:
            args.text = args.model_dir
        data = open(args.text, "rb").read()
        ids = torch.tensor(list(data), dtype=torch.int64)
        need_two_tokens(ids, args.text)
        res = summarise(score_unigram(open(args.unigram, "rb").read(), ids), len(ids) - 1)
        res.update(model=f"unigram({args.unigram})", text=args.text)
    else:
        model = load_model(args.model_dir, DTYPES[args.dtype])
        dispatch = DispatchConfig() if args.dispatch == "dropless" else None
        overrides = (args.capacity_factor, args.capacity_scope, args.capacity_group, args.overflow)
        if args.dispatch == "config" and any(v is not None for v in overrides):
            d = dict(model.cfg["dispatch"])
            for key, v in zip(("capacity_factor", "capacity_scope", "capacity_group", "overflow"), overrides):
                if v is not None:
                    d[key] = v
            dispatch = DispatchConfig(**d)
        if args.dispatch == "config":
            d = dispatch or DispatchConfig(**model.cfg["dispatch"])
            scope = "step" if d.capacity_scope == "step" else f"sequence G={d.capacity_group}"
            args.dispatch = (f"capacity_factor={d.capacity_factor} min_capacity={d.min_capacity} "
                             f"{d.overflow} {scope}")
        if args.generate is not None:
            # As `switchserve generate`: BOS prepended when the config has one,
            # the token predicted from the context's last position generated
            # too (max_seq_len + 1 tokens in all), stopping at EOS.
            prompt = encode(model, args.generate.encode("utf-8")).tolist()
            L = model.cfg["max_seq_len"]
            if len(prompt) > L:
                raise SystemExit(f"score_reference.py: --generate is {len(prompt)} tokens, "
                                 f"more than the context ({L})")
            room = L + 1 - len(prompt)
            max_new = min(args.max_new_tokens, room)
            if max_new < args.max_new_tokens:
                print(f"score_reference.py: the context ({L} tokens) leaves room for {room} of the "
                      f"{args.max_new_tokens} new tokens --max-new-tokens asks after the "
                      f"{len(prompt)}-token prompt", file=sys.stderr)
            eos = model.cfg["eos_token_id"]
            out = model.generate([prompt], max_new, eos_token_id=eos, dispatch=dispatch)[0]
            text = bytes(t for t in out if t < 256 and t != eos).decode("utf-8", errors="replace")
            print(json.dumps(dict(model=args.model_dir, dispatch=args.dispatch, prompt=args.generate,
                                  max_new_tokens=args.max_new_tokens, continuation=text), indent=2))
            return
        ids = encode(model, open(args.text, "rb").read())
        need_two_tokens(ids, args.text)
        # Every id after the first is a predicted byte (with a BOS first, every byte).
        n_bytes = len(ids) - 1
        with torch.no_grad():
            res = summarise(score_model(model, ids, dispatch, args.progress), n_bytes)
        res.update(model=args.model_dir, text=args.text, dispatch=args.dispatch, dtype=args.dtype,
                   window=model.cfg["max_seq_len"])
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
