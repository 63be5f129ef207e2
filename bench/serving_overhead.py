#!/usr/bin/python3
"""The cost of serving: the same closed-loop load through switchserve's engine
in-process (switchserve-bench --engine-model) and over gRPC (switchserve serve
+ switchserve-bench --address), same model, same requests, at each
concurrency (default 1, 8, 32, 128). gRPC / engine throughput is what the
server (gRPC, protobuf, validation, detokenized streaming, threads) costs.
With --protocol http the served runs go to the OpenAI-compatible HTTP API
instead (streamed /v1/completions, one connection a request: the load
generator's HTTP client).

Engine and served runs alternate (--repeats times) so that slow drifts of a
shared machine's load hit both; the table gives the median of each and the
median of the per-pair ratios.

A second table says where the CPU goes, per generated token (summed over the
repeats): the in-process run's whole process; the server's engine threads
(`engine`, `cpu-worker-N`) and its serving threads (gRPC's, `stream-writes`,
the HTTP API's)
from /proc/PID/task; and the load generator's client, which shares the
machine's cores. On a machine whose cores the load fills, throughput is
about cores / CPU per token, so these shares explain the ratio and are far
steadier than it on a shared machine. The load generator's and the
in-process engine's CPU covers their timed requests; the server's threads are
read before and after the whole served run, so their CPU is divided by the
tokens of its warm-up requests and timed requests together.

Each run is sized to last about --min-seconds (default 1) at the engine's
rate, measured by one uncounted in-process run per concurrency: on a model
whose steps are cheap, a few waves of requests are over in hundredths of a
second, shorter than a shared machine's swings.

  /usr/bin/python3 bench/serving_overhead.py --model DIR [--concurrency 1,8,32,128]
      [--prompt-len 16] [--new-tokens 32] [--repeats 3] [--min-seconds 1] [--device cpu|cuda]
      [--serving-threads-nice N]   (the server's flag; default: the server's default)
      [--stream-interval N]        (the server's flag, given to both; default: the server's, 1)
      [--protocol grpc|http]
"""
import argparse
import collections
import json
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import (ROOT, Server, free_port, prompt_ids, requests_per_run,  # noqa: E402
                             run_bench)

CPU = re.compile(r"cpu: ([\d.]+) s user\+system")
TOKENS = re.compile(r"requests: (\d+) ok")
WARMUP = re.compile(r"\(after (\d+) warm-up\)")
ENGINE_THREADS = re.compile(r"^(engine|cpu-worker-\d+)$")
TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid):
    """CPU seconds (user + system) of each of `pid`'s threads, summed by name."""
    seconds = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds[name] += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return seconds


def cpu_seconds(out):
    return float(CPU.search(out).group(1))


def add_pair(totals, eng_out, rpc_out, before, after, new_tokens):
    """Adds one engine / served pair to `totals`: CPU seconds by group, and
    the tokens each group's CPU was spent on. switchserve-bench's `cpu:` line
    leaves its warm-up requests out; the server's threads, read before and
    after the whole served run (`before`, `after`: thread_cpu()), served them
    too."""
    timed = int(TOKENS.search(rpc_out).group(1)) * new_tokens
    warmup = int(WARMUP.search(rpc_out).group(1)) * new_tokens
    totals["in-process"] += cpu_seconds(eng_out)
    totals["client"] += cpu_seconds(rpc_out)
    totals["tokens"] += timed
    totals["server tokens"] += timed + warmup
    for name in after:
        group = "engine threads" if ENGINE_THREADS.match(name) else "serving threads"
        totals[group] += after[name] - before.get(name, 0)


def cpu_per_token(totals):
    """µs of CPU per generated token of each group in add_pair()'s `totals`."""
    us = collections.Counter()
    for group in ("in-process", "client"):
        us[group] = totals[group] * 1e6 / totals["tokens"]
    for group in ("engine threads", "serving threads"):
        us[group] = totals[group] * 1e6 / totals["server tokens"]
    return us


def at_least(args, requests):
    """`args` with --min-requests raised to at least `requests`."""
    return argparse.Namespace(**{**vars(args), "min_requests": max(args.min_requests, requests)})


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
    ap.add_argument("--min-seconds", type=float, default=1.0,
                    help="size each run to last about this long at the engine's rate (0: "
                         "--waves and --min-requests alone)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--serving-threads-nice", type=int,
                    help="the server's --serving-threads-nice (default: the server's default)")
    ap.add_argument("--stream-interval", type=int,
                    help="the server's --stream-interval, for the server and the in-process "
                         "engine alike (default: the server's default)")
    ap.add_argument("--protocol", default="grpc", choices=["grpc", "http"],
                    help="what the served runs use: gRPC GenerateStream, or the HTTP API's "
                         "streamed completions")
    args = ap.parse_args()
    args.bench = os.path.join(args.build_dir, "bench", "switchserve-bench")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    prompt = prompt_ids(cfg, args.prompt_len)
    server_args = ([] if args.serving_threads_nice is None
                   else ["--serving-threads-nice", str(args.serving_threads_nice)])
    streaming = ([] if args.stream_interval is None
                 else ["--stream-interval", str(args.stream_interval)])
    server_args += streaming
    if args.protocol == "http":
        http_port = free_port()
        server_args += ["--http-port", str(http_port)]
    server = Server(os.path.join(args.build_dir, "server", "switchserve"), args.model, args.threads,
                    args.device, server_args)
    engine_target = ["--engine-model", args.model, "--threads", str(args.threads),
                     "--device", args.device, *streaming]
    served_target = (["--address", server.address] if args.protocol == "grpc"
                     else ["--http-address", f"127.0.0.1:{http_port}"])
    served = "gRPC" if args.protocol == "grpc" else "HTTP"
    results = {c: {"engine": [], "served": [], "ratio": []} for c in concurrency}
    # Per concurrency: CPU seconds and generated tokens, summed over the
    # repeats (add_pair).
    cpu = {c: collections.Counter() for c in concurrency}
    load_start = os.getloadavg()[0]
    requests = {}
    try:
        for c in concurrency:
            run_args = args
            if args.min_seconds > 0:
                # The engine's rate at this concurrency, from a run of its own
                # (at least 64 requests: a few are over too soon to say).
                rate, _ = run_bench(at_least(args, 64), engine_target, prompt, args.new_tokens, c)
                wanted = math.ceil(rate * args.min_seconds / args.new_tokens / c) * c
                run_args = at_least(args, wanted)
            requests[c] = requests_per_run(run_args, c)
            for r in range(args.repeats):
                print(f"concurrency {c}, repeat {r + 1}", file=sys.stderr, flush=True)
                eng, eng_out = run_bench(run_args, engine_target, prompt, args.new_tokens, c)
                before = thread_cpu(server.proc.pid)
                rpc, rpc_out = run_bench(run_args, served_target, prompt, args.new_tokens, c)
                after = thread_cpu(server.proc.pid)
                add_pair(cpu[c], eng_out, rpc_out, before, after, args.new_tokens)
                results[c]["engine"].append(eng)
                results[c]["served"].append(rpc)
                results[c]["ratio"].append(rpc / eng)
    finally:
        server.close()
    print(f"# serving overhead: {args.model} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, threads {args.threads}"
          f"{'' if args.serving_threads_nice is None else f', serving threads nice +{args.serving_threads_nice}'}"
          f"{'' if args.stream_interval is None else f', stream interval {args.stream_interval}'}"
          f", load average {load_start:.1f} -> "
          f"{os.getloadavg()[0]:.1f})")
    sizing = (f"sized to about {args.min_seconds:g} s at the engine's rate, "
              if args.min_seconds > 0 else "")
    print(f"prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, ignore_eos; "
          f"closed loop, requests per run {sizing}at least max({args.min_requests}, "
          f"{args.waves} x concurrency), after one wave of warm-up; "
          f"median of {args.repeats} alternating engine/{served} pairs\n")
    print(f"| concurrency | engine tokens/s | {served} tokens/s | {served} / engine (median of pairs) "
          "| range of pair ratios | requests per run |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c in concurrency:
        res = results[c]
        print(f"| {c} | {statistics.median(res['engine']):.1f} | {statistics.median(res['served']):.1f} "
              f"| {statistics.median(res['ratio']):.3f} | {min(res['ratio']):.3f}–{max(res['ratio']):.3f} "
              f"| {requests[c]} |")
    print("\nCPU per generated token (µs, user + system, summed over the repeats). Where the load "
          f"fills the cores, {served} / engine ≈ in-process ÷ (server + client); without a client on "
          "the same cores, ≈ in-process ÷ server.\n")
    print("| concurrency | in-process | server: engine threads | server: serving threads "
          "| client | serving / engine threads | in-process ÷ (server + client) "
          "| in-process ÷ server |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    def share(numerator, denominator):  # "–" where a short run used under a clock tick
        return f"{numerator / denominator:.3f}" if denominator > 0 else "–"

    for c in concurrency:
        us = cpu_per_token(cpu[c])
        server = us["engine threads"] + us["serving threads"]
        print(f"| {c} | {us['in-process']:.1f} | {us['engine threads']:.1f} "
              f"| {us['serving threads']:.1f} | {us['client']:.1f} "
              f"| {share(us['serving threads'], us['engine threads'])} "
              f"| {share(us['in-process'], server + us['client'])} "
              f"| {share(us['in-process'], server)} |")


if __name__ == "__main__":
    main()
