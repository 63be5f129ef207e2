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

--choices N sends the requests to the HTTP API instead, each a /v1/completions
of N choices (`n`, sampled at temperature 1 with a seed of its own) of a whole
prompt of its own: what the cache shares is then a request's prompt among its
choices, which the engine receives together. Reported: completion tokens/s and
the latency p50 of a request (all its choices), and the share of prompt tokens
(each choice's) the cached server found in its cache (its metrics).
"""
import argparse
import json
import os
import re
import statistics
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import (PAPER_CONFIG, ROOT, Model, Server, free_port,  # noqa: E402
                             init_random, prompt_ids, save_model)

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


def http_port(server):
    server.log.seek(0)
    return int(re.search(r"HTTP API on http://127\.0\.0\.1:(\d+)", server.log.read()).group(1))


def run_choices(args, server, cfg, concurrency, seed):
    """--requests completions of --choices choices each, `concurrency` at a
    time, every one a prompt of its own: (completion tokens/s, latency p50 ms)."""
    url = f"http://127.0.0.1:{http_port(server)}/v1/completions"
    lo, hi = (32, 127) if cfg["vocab_size"] <= 256 else (0, cfg["vocab_size"])
    bodies = []
    for i in range(args.requests):
        rng = random.Random(seed + i)
        bodies.append(json.dumps({
            "prompt": [rng.randrange(lo, hi) for _ in range(args.prompt_len)],
            "n": args.choices, "max_tokens": args.new_tokens, "temperature": 1.0,
            "seed": seed + i, "ignore_eos": True}).encode())
    latencies, tokens, failures = [], [0], []
    lock = threading.Lock()
    next_body = iter(bodies)

    def client():
        while True:
            with lock:
                body = next(next_body, None)
            if body is None:
                return
            start = time.perf_counter()
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    usage = json.load(response)["usage"]
            except OSError as e:
                failures.append(e)
                return
            with lock:
                latencies.append((time.perf_counter() - start) * 1e3)
                tokens[0] += usage["completion_tokens"]

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failures or len(latencies) != args.requests:
        raise SystemExit(f"{url}: {len(failures)} requests failed: {failures[:1]}")
    return tokens[0] / elapsed, statistics.median(latencies)


def metrics_hit_share(server):
    query = server.metric_total("switchserve_prefix_cache_query_tokens_total")
    return server.metric_total("switchserve_prefix_cache_hit_tokens_total") / query if query else 0.0


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
    ap.add_argument("--choices", type=int, default=0)
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

    plain = Server(binary, model_dir, args.threads, args.device,
                   ["--http-port", str(free_port())] if args.choices else [])
    cached = Server(binary, model_dir, args.threads, args.device,
                    ["--enable-prefix-caching",
                     *(["--http-port", str(free_port())] if args.choices else [])],
                    metrics_port=free_port())
    try:
        shape = (f"{args.choices} choices of a prompt of its own a request" if args.choices
                 else f"the last {args.distinct_tail} each request's own")
        print(f"model {cfg.get('name', model_dir)}: prompt {args.prompt_len} tokens "
              f"({shape}), {args.new_tokens} new, "
              f"{args.requests} requests a run, {args.repeats} pairs")
        time_name = "latency" if args.choices else "TTFT"
        print(f"| clients | plain tokens/s | cached tokens/s | cached / plain (median of pairs) "
              f"| plain {time_name} p50 ms | cached {time_name} p50 ms "
              f"| {time_name} plain / cached (median) | prompt tokens found cached |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        runs_started = 0
        for concurrency in map(int, args.concurrency.split(",")):
            runs = {"plain": [], "cached": []}
            for _ in range(args.repeats):
                # A run's requests have seeds (and so tails) no other run's has.
                seed = 1 + runs_started * 1_000_000
                runs_started += 1
                if args.choices:
                    runs["plain"].append(run_choices(args, plain, cfg, concurrency, seed))
                    runs["cached"].append(run_choices(args, cached, cfg, concurrency, seed))
                else:
                    runs["plain"].append(run_bench(args, plain, prompt, concurrency, seed))
                    runs["cached"].append(run_bench(args, cached, prompt, concurrency, seed))
            pairs = list(zip(runs["plain"], runs["cached"]))
            tput = statistics.median(c[0] / p[0] for p, c in pairs)
            ttft = statistics.median(p[1] / c[1] for p, c in pairs)
            print(f"| {concurrency} | {statistics.median(r[0] for r in runs['plain']):,.0f} "
                  f"| {statistics.median(r[0] for r in runs['cached']):,.0f} | {tput:.2f} "
                  f"| {statistics.median(r[1] for r in runs['plain']):.2f} "
                  f"| {statistics.median(r[1] for r in runs['cached']):.2f} | {ttft:.2f} "
                  f"| {(metrics_hit_share if args.choices else hit_share)(cached):.2f} |",
                  flush=True)
    finally:
        plain.close()
        cached.close()


if __name__ == "__main__":
    main()
