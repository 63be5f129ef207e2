#!/usr/bin/python3
"""The cost of serving: the same closed-loop load through switchserve's engine
in-process (switchserve-bench --engine-model) and over gRPC (switchserve serve
+ switchserve-bench --address), same model, same requests, at each
concurrency (default 1, 8, 32, 128). gRPC / engine throughput is what the
server (gRPC, protobuf, validation, detokenized streaming, threads) costs.

Engine and gRPC runs alternate (--repeats times) so that slow drifts of a
shared machine's load hit both; the table gives the median of each and the
median of the per-pair ratios.

  /usr/bin/python3 bench/serving_overhead.py --model DIR [--concurrency 1,8,32,128]
      [--prompt-len 16] [--new-tokens 32] [--repeats 3] [--device cpu|cuda]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import ROOT, Server, prompt_ids, run_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--waves", type=int, default=4, help="requests per run: waves x concurrency")
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    args.bench = os.path.join(args.build_dir, "bench", "switchserve-bench")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    prompt = prompt_ids(cfg, args.prompt_len)
    server = Server(os.path.join(args.build_dir, "server", "switchserve"), args.model, args.threads,
                    args.device)
    engine_target = ["--engine-model", args.model, "--threads", str(args.threads),
                     "--device", args.device]
    results = {c: {"engine": [], "grpc": [], "ratio": []} for c in concurrency}
    load_start = os.getloadavg()[0]
    try:
        for c in concurrency:
            for r in range(args.repeats):
                print(f"concurrency {c}, repeat {r + 1}", file=sys.stderr, flush=True)
                eng, _ = run_bench(args, engine_target, prompt, args.new_tokens, c)
                rpc, _ = run_bench(args, ["--address", server.address], prompt, args.new_tokens, c)
                results[c]["engine"].append(eng)
                results[c]["grpc"].append(rpc)
                results[c]["ratio"].append(rpc / eng)
    finally:
        server.close()
    print(f"# serving overhead: {args.model} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, threads {args.threads}, load average {load_start:.1f} -> "
          f"{os.getloadavg()[0]:.1f})")
    print(f"prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, ignore_eos; "
          f"closed loop, max({args.min_requests}, {args.waves} x concurrency) requests per run; "
          f"median of {args.repeats} alternating engine/gRPC pairs\n")
    print("| concurrency | engine tokens/s | gRPC tokens/s | gRPC / engine (median of pairs) "
          "| range of pair ratios |")
    print("| --- | --- | --- | --- | --- |")
    for c in concurrency:
        res = results[c]
        print(f"| {c} | {statistics.median(res['engine']):.1f} | {statistics.median(res['grpc']):.1f} "
              f"| {statistics.median(res['ratio']):.3f} | {min(res['ratio']):.3f}–{max(res['ratio']):.3f} |")


if __name__ == "__main__":
    main()
