#!/usr/bin/python3
"""What --scheduling-policy priority gives a latency-sensitive client on a
busy server: a background load (closed loop, --background-concurrency
clients, long generations) keeps every running slot taken and a queue
waiting, and a foreground client sends short requests one at a time. Two
servers of one model, alternated --repeats times: one scheduling in arrival
order (every request priority 0), one with --scheduling-policy priority (the
background at priority 1, the foreground at 0, which admits it first and
preempts a background request for its slot).

For each: the foreground's TTFT and latency (p50, p99; medians of the
repeats) and the tokens/s the server generated for everyone while the
foreground ran (its metrics), which says what the preemptions cost.

  /usr/bin/python3 bench/priority.py [--model DIR] [--max-running-requests 8]
      [--background-concurrency 32] [--background-new-tokens 128]
      [--foreground-requests 32] [--foreground-new-tokens 16] [--repeats 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import ROOT, Server, free_port, prompt_ids  # noqa: E402

TTFT = re.compile(r"TTFT\s+p50\s+([\d.]+) ms\s+p90\s+[\d.]+ ms\s+p99\s+([\d.]+) ms")
LATENCY = re.compile(r"latency\s+p50\s+([\d.]+) ms\s+p90\s+[\d.]+ ms\s+p99\s+([\d.]+) ms")
OKS = re.compile(r"requests: (\d+) ok, (\d+) failed")


def bench(args, server, prompt, concurrency, requests, new_tokens, priority, seed):
    return [args.bench, "--address", server.address, "--mode", "closed", "--seed", str(seed),
            "--concurrency", str(concurrency), "--requests", str(requests),
            "--prompt-ids", ",".join(map(str, prompt)), "--distinct-tail-tokens",
            str(len(prompt)), "--max-new-tokens", str(new_tokens), "--temperature", "0",
            "--ignore-eos", "--priority", str(priority)]


def run(args, server, prompt, prioritized, seed):
    """One foreground run beside the background load: (TTFT p50, p99,
    latency p50, p99 in ms, server tokens/s during it)."""
    background = subprocess.Popen(
        bench(args, server, prompt, args.background_concurrency, 10_000_000,
              args.background_new_tokens, 1 if prioritized else 0, seed),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(args.settle_s)  # every slot taken, a queue waiting
        before, start = server.metric_total("switchserve_generation_tokens_total"), time.perf_counter()
        out = subprocess.run(
            bench(args, server, prompt, 1, args.foreground_requests, args.foreground_new_tokens,
                  0, seed + 5_000_000),
            check=True, capture_output=True, text=True).stdout
        rate = (server.metric_total("switchserve_generation_tokens_total") - before) / (time.perf_counter() - start)
    finally:
        background.kill()
        background.wait()
    ok, failed = map(int, OKS.search(out).groups())
    if failed or ok != args.foreground_requests:
        raise SystemExit(f"foreground: {failed} requests failed\n{out}")
    ttft, latency = TTFT.search(out), LATENCY.search(out)
    return (float(ttft.group(1)), float(ttft.group(2)), float(latency.group(1)),
            float(latency.group(2)), rate)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--max-running-requests", type=int, default=8)
    ap.add_argument("--background-concurrency", type=int, default=32)
    ap.add_argument("--background-new-tokens", type=int, default=128)
    ap.add_argument("--foreground-requests", type=int, default=32)
    ap.add_argument("--foreground-new-tokens", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    args.bench = os.path.join(args.build_dir, "bench", "switchserve-bench")
    binary = os.path.join(args.build_dir, "server", "switchserve")
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    prompt = prompt_ids(cfg, args.prompt_len)
    servers = {}
    try:
        for name, policy in (("fcfs", "fcfs"), ("priority", "priority")):
            servers[name] = Server(binary, args.model, args.threads, args.device,
                                   ["--scheduling-policy", policy,
                                    "--max-running-requests", str(args.max_running_requests)],
                                   metrics_port=free_port())
        print(f"model {cfg.get('name', args.model)}: --max-running-requests "
              f"{args.max_running_requests}; background {args.background_concurrency} clients, "
              f"{args.background_new_tokens} new tokens; foreground 1 client, "
              f"{args.foreground_requests} requests of {args.foreground_new_tokens} new tokens; "
              f"prompts of {args.prompt_len} tokens; {args.repeats} repeats")
        runs = {name: [] for name in servers}
        for repeat in range(args.repeats):
            for name, server in servers.items():
                runs[name].append(run(args, server, prompt, name == "priority",
                                      1 + repeat * 100_000_000))
        print("| policy | foreground TTFT p50 / p99 ms | foreground latency p50 / p99 ms "
              "| server tokens/s during it |")
        print("| --- | --- | --- | --- |")
        for name, rows in runs.items():
            med = [statistics.median(r[i] for r in rows) for i in range(5)]
            print(f"| {name} | {med[0]:.2f} / {med[1]:.2f} | {med[2]:.2f} / {med[3]:.2f} "
                  f"| {med[4]:,.0f} |")
        ratio = statistics.median(f[0] / p[0] for f, p in zip(runs["fcfs"], runs["priority"]))
        print(f"foreground TTFT p50, fcfs / priority (median of pairs): {ratio:.1f}")
    finally:
        for server in servers.values():
            server.close()


if __name__ == "__main__":
    main()
