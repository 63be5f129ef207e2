"""bench/serving_overhead.py's CPU accounting: each figure per generated token
of the requests its CPU was spent on. switchserve-bench's `cpu:` line leaves
its warm-up requests out; the server's threads, read around the whole run,
served them too."""
import collections

import pytest
from bench_scripts import import_bench_script


@pytest.fixture(scope="module")
def overhead():
    return import_bench_script("serving_overhead")


def bench_output(requests, warmup, cpu_s, transport):
    return (f"switchserve-bench: closed loop, concurrency {warmup}, {requests} requests "
            f"(after {warmup} warm-up), prompt 16 tokens, 10 new tokens\n"
            f"requests: {requests} ok, 0 failed in 0.50 s\n"
            "throughput: 128.00 requests/s, 1280.0 tokens/s\n"
            f"cpu: {cpu_s:.4f} s user+system in this process during the load, 1.00 us per token\n"
            f"transport: {transport}\n")


def test_the_servers_threads_are_divided_by_the_warm_up_tokens_too(overhead):
    totals = collections.Counter()
    # 64 timed requests after 8 warm-up ones, 10 new tokens each: the bench
    # counts 640 tokens, the server generated 720.
    eng_out = bench_output(64, 8, 0.0064, "engine in-process (m, threads 2)")
    rpc_out = bench_output(64, 8, 0.0032, "gRPC 127.0.0.1:1")
    before = {"engine": 1.0, "cpu-worker-0": 2.0, "stream-writes": 0.5, "default-executor": 0.25}
    after = {"engine": 1.0048, "cpu-worker-0": 2.0024, "stream-writes": 0.5027,
             "default-executor": 0.2509, "grpcpp_sync_ser": 0.0}  # a thread that started
    overhead.add_pair(totals, eng_out, rpc_out, before, after, 10)
    us = overhead.cpu_per_token(totals)
    assert us["in-process"] == pytest.approx(10.0)  # 6.4 ms / 640 tokens
    assert us["client"] == pytest.approx(5.0)  # 3.2 ms / 640 tokens
    assert us["engine threads"] == pytest.approx(10.0)  # 7.2 ms / 720 tokens
    assert us["serving threads"] == pytest.approx(5.0)  # 3.6 ms / 720 tokens

    # A second repeat adds to the same totals.
    overhead.add_pair(totals, eng_out, rpc_out, before, after, 10)
    assert overhead.cpu_per_token(totals) == pytest.approx(us)
