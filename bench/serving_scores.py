#!/usr/bin/python3
"""Scoring a text through the server (GenerateRequest.prompt_logprobs, what
HTTP `echo` with `logprobs` runs on) against `switchserve score`, the offline
full pass, on the same text and model.

The text (default models/heldout.txt) is tokenized by the server and cut into
windows of context - 1 tokens overlapping by one (a request needs room for
one generated token), so that every token but the first is scored once. The
windows go to the server as unary Generate calls, --concurrency at a time,
each with max_new_tokens 1 and prompt_logprobs 0; the same calls without
prompt_logprobs (prefill only) alternate with them (--repeats rounds), which
gives what scoring costs over a plain prefill. `switchserve score --text`
scores the whole text once, in windows of the context length.

Prints tokens/s of each (scored tokens over wall time; the server's calls
include gRPC and the client, which share the machine's cores), the ratios,
and the perplexities: the served one sums the returned logprobs; score's
windows are one token longer, so the two agree closely but not exactly.

  /usr/bin/python3 bench/serving_scores.py [--build-dir build/release]
      [--model models/default] [--text models/heldout.txt] [--concurrency 4]
      [--repeats 3] [--threads 2] [--keep-openblas-coretype]
"""
import argparse
import concurrent.futures
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import ROOT, Server  # noqa: E402


def windows(ids, width):
    """Windows of `width` tokens overlapping by one: every token but the
    first is the last of exactly one window's scored tokens."""
    out, start = [], 0
    while start + 1 < len(ids):
        out.append(ids[start:start + width])
        start += width - 1
    return out


def served_round(stub, pb, chunks, concurrency, scored):
    """(seconds, sum of logprobs or None) for every chunk as one Generate call."""
    def call(chunk):
        request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=chunk),
                                     sampling=pb.SamplingParams(max_new_tokens=1,
                                                                temperature=0.0))
        if scored:
            request.prompt_logprobs = 0
        response = stub.Generate(request, timeout=600)
        if scored:
            assert len(response.prompt_tokens) == len(chunk) - 1
        return sum(t.logprob for t in response.prompt_tokens)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(call, chunks))
    return time.perf_counter() - start, total if scored else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    parser.add_argument("--text", default=os.path.join(ROOT, "models", "heldout.txt"))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep-openblas-coretype", action="store_true",
                        help="as compare_pytorch.py: keep the environment's OPENBLAS_CORETYPE")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.build_dir, "proto", "python"))
    import grpc
    import generation_pb2 as pb
    import generation_pb2_grpc as pb_grpc

    binary = os.path.join(args.build_dir, "server", "switchserve")
    with open(args.text, encoding="utf-8") as f:
        text = f.read()

    start = time.perf_counter()
    offline = subprocess.run([binary, "score", "--model", args.model, "--text", args.text],
                             capture_output=True, text=True, check=True)
    offline_s = time.perf_counter() - start
    printed = dict(line.split(": ", 1) for line in offline.stdout.strip().splitlines()
                   if ": " in line)
    offline_tokens = int(printed["predicted"])
    offline_nll = float(printed["mean_nll"])

    server = Server(binary, args.model, args.threads, "cpu")
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.GenerationStub(channel)
            context = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60).context_length
            ids = list(stub.Tokenize(pb.TokenizeRequest(text=text), timeout=60).token_ids)
            chunks = windows(ids, context - 1)
            tokens = sum(len(c) - 1 for c in chunks)
            served_round(stub, pb, chunks[:8], args.concurrency, True)  # warm-up
            scored_s, plain_s, totals = [], [], []
            for _ in range(args.repeats):
                seconds, total = served_round(stub, pb, chunks, args.concurrency, True)
                scored_s.append(seconds)
                totals.append(total)
                plain_s.append(served_round(stub, pb, chunks, args.concurrency, False)[0])
    finally:
        server.close()
    assert len(set(totals)) == 1, f"the same windows scored differently: {totals}"

    served_nll = -totals[0] / tokens
    scored = statistics.median(scored_s)
    plain = statistics.median(plain_s)
    print(f"text: {len(text)} characters, {len(ids)} tokens; {len(chunks)} windows of "
          f"{context - 1}, {tokens} scored tokens; concurrency {args.concurrency}, "
          f"--threads {args.threads}, {args.repeats} rounds (medians)")
    print(f"served, prompt_logprobs: {tokens / scored:,.0f} tokens/s "
          f"(rounds {', '.join(f'{tokens / s:,.0f}' for s in scored_s)})")
    print(f"served, prefill only:    {tokens / plain:,.0f} tokens/s "
          f"(rounds {', '.join(f'{tokens / s:,.0f}' for s in plain_s)})")
    print(f"switchserve score:       {offline_tokens / offline_s:,.0f} tokens/s "
          f"({offline_tokens} tokens, process start included)")
    print(f"scoring / prefill only: {plain / scored:.3f}; "
          f"served scoring / score: {(tokens / scored) / (offline_tokens / offline_s):.3f}")
    print(f"perplexity: served {math.exp(served_nll):.6f}, score {math.exp(offline_nll):.6f}")


if __name__ == "__main__":
    main()
