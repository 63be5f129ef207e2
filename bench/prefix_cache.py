#!/usr/bin/python3
"""What prefix caching gives (--enable-prefix-caching): the same closed-loop
load against two servers of one model, one with the flag and one without,
alternated --repeats times so that a shared machine's drifts hit both. Every
request's prompt has --prompt-len tokens, of which the last --distinct-tail
are its own (switchserve-bench --distinct-tail-tokens) and the rest shared by
all, as behind one system prompt; --new-tokens are generated (greedy, EOS
ignored).

For each concurrency: tokens/s and TTFT p50 of each server (medians of the
repeats), the medians of the per-pair ratios (cached / plain), and the share
of prompt tokens the cached server found in its cache (its access log's
cached_prompt_tokens over prompt_tokens, timed requests and warm-up alike,
every run so far). Each run's requests have seeds, and so tails, of their
own: a run finds the shared part in the cache, never a whole earlier prompt.
Both servers give the same tokens (isolation); only the work differs.

  /usr/bin/python3 bench/prefix_cache.py [--model DIR | --paper] [--prompt-len 192]
      [--distinct-tail 32] [--new-tokens 16] [--concurrency 1,8] [--repeats 3]
      [--requests 64] [--threads N] [--device cpu|cuda]

--paper serves the paper-shaped random model compare_pytorch.py writes
(d 1024, 18 layers; bf16, to --paper-dir), where a prompt's prefill costs far
more than on the built-in model.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import (PAPER_CONFIG, ROOT, Model, Server, init_random,  # noqa: E402
                             prompt_ids, save_model)

THROUGHPUT = re.compile(r"throughput: ([\d.]+) requests/s, ([\d.]+) tokens/s")
TTFT = re.compile(r"TTFT\s+p50\s+([\d.]+) ms")
OKS = re.compile(r"requests: (\d+) ok, (\d+) failed")
PROMPT = re.compile(r" prompt_tokens=(\d+)")
CACHED = re.compile(r" cached_prompt_tokens=(\d+)")


def run_bench(args, server, prompt, concurrency, seed):
    cmd = [args.bench, "--address", server.address, "--mode", "closed", "--seed", str(seed),
           "--concurrency", str(concurrency), "--requests", str(args.requests),
           "--warmup-requests", str(concurrency), "--prompt-ids", ",".join(map(str, prompt)),
           "--distinct-tail-tokens", str(args.distinct_tail),
           "--max-new-tokens", str(args.new_tokens), "--temperature", "0", "--ignore-eos"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    ok, failed = map(int, OKS.search(out).groups())
    if failed or ok != args.requests:
        raise SystemExit(f"{' '.join(cmd)}: {failed} requests failed\n{out}")
    return float(THROUGHPUT.search(out).group(2)), float(TTFT.search(out).group(1))


def hit_share(server):
    server.log.seek(0)
    text = server.log.read()
    prompt = sum(map(int, PROMPT.findall(text)))
    cached = sum(map(int, CACHED.findall(text)))
    return cached / prompt if prompt else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--paper", action="store_true")
    ap.add_argument("--paper-dir",
                    default=os.path.join(tempfile.gettempdir(), "switchserve_paper_bf16"))
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--distinct-tail", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    args.bench = os.path.join(args.build_dir, "bench", "switchserve-bench")
    binary = os.path.join(args.build_dir, "server", "switchserve")
    model_dir = args.model
    if args.paper:
        model_dir = args.paper_dir
        if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
            print(f"writing the paper-shaped random model to {model_dir}", file=sys.stderr)
            save_model(init_random(Model(PAPER_CONFIG), seed=0), model_dir, "bf16")
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    assert args.prompt_len + args.new_tokens <= cfg["max_seq_len"], "past the context"
    prompt = prompt_ids(cfg, args.prompt_len)

    plain = Server(binary, model_dir, args.threads, args.device)
    cached = Server(binary, model_dir, args.threads, args.device, ["--enable-prefix-caching"])
    try:
        print(f"model {cfg.get('name', model_dir)}: prompt {args.prompt_len} tokens "
              f"(the last {args.distinct_tail} each request's own), {args.new_tokens} new, "
              f"{args.requests} requests a run, {args.repeats} pairs")
        print("| clients | plain tokens/s | cached tokens/s | cached / plain (median of pairs) "
              "| plain TTFT p50 ms | cached TTFT p50 ms | TTFT plain / cached (median) "
              "| prompt tokens found cached |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        runs_started = 0
        for concurrency in map(int, args.concurrency.split(",")):
            runs = {"plain": [], "cached": []}
            for _ in range(args.repeats):
                # A run's requests have seeds (and so tails) no other run's has.
                seed = 1 + runs_started * 1_000_000
                runs_started += 1
                runs["plain"].append(run_bench(args, plain, prompt, concurrency, seed))
                runs["cached"].append(run_bench(args, cached, prompt, concurrency, seed))
            pairs = list(zip(runs["plain"], runs["cached"]))
            tput = statistics.median(c[0] / p[0] for p, c in pairs)
            ttft = statistics.median(p[1] / c[1] for p, c in pairs)
            print(f"| {concurrency} | {statistics.median(r[0] for r in runs['plain']):,.0f} "
                  f"| {statistics.median(r[0] for r in runs['cached']):,.0f} | {tput:.2f} "
                  f"| {statistics.median(r[1] for r in runs['plain']):.2f} "
                  f"| {statistics.median(r[1] for r in runs['cached']):.2f} | {ttft:.2f} "
                  f"| {hit_share(cached):.2f} |", flush=True)
    finally:
        plain.close()
        cached.close()


if __name__ == "__main__":
    main()
