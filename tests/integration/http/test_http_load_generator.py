"""switchserve-bench (the load generator) against the HTTP API, over gRPC
and in-process (ctest bench_http_smoke runs these, `-m bench`), and the
server's threads' priorities under load."""

import collections
import json
import os
import re
import subprocess
import time

import pytest

from http_harness import MODEL, MODEL_DIR, Server, grpc_generate
from server_process import free_port


@pytest.mark.bench
def test_load_generator_sends_warmup_requests_and_leaves_them_out():
    """--warmup-requests: the server serves them, the report counts only the
    timed requests."""
    server = Server()
    try:
        result = subprocess.run(
            [os.environ["SWITCHSERVE_BENCH"], "--http-address", f"127.0.0.1:{server.http_port}",
             "--requests", "5", "--warmup-requests", "3", "--concurrency", "2",
             "--max-new-tokens", "4"],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "5 requests (after 3 warm-up)" in result.stdout, result.stdout
        assert "requests: 5 ok, 0 failed" in result.stdout, result.stdout
        records = [json.loads(l) for l in server.log().splitlines()]
        assert len([r for r in records if r["msg"] == "request"]) == 8
    finally:
        server.close()


def thread_stats(pid):
    """(thread id, name, the fields of proc(5)'s stat after the name) of
    each thread of a running process."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        yield int(tid), name, stat[stat.rindex(")") + 2:].split()


def thread_names(pid):
    """{thread id: name} of a running process."""
    return {tid: name for tid, name, _ in thread_stats(pid)}


def thread_nice_values(pid):
    """{thread name: set of nice values} of a running process."""
    values = collections.defaultdict(set)
    for _, name, fields in thread_stats(pid):
        values[name].add(int(fields[16]))  # field 19 of proc(5): nice
    return values


def compute_thread(name):
    return name == "engine" or name.startswith("cpu-worker-")


def test_serving_threads_run_below_the_engines_priority():
    """Every thread but the engine's compute threads (the engine thread and
    the CPU workers; not gRPC's, HTTP's, the stream writes' or the main
    thread) runs at --serving-threads-nice (10 by default) above the engine's
    nice value; 0 leaves them all alike."""
    server = Server("--threads", "2", "--metrics-port", str(free_port()))
    try:
        server.client().completions.create(model=MODEL, prompt="In the beginning", max_tokens=4)
        grpc_generate(server, "In the beginning", max_new_tokens=4)
        values = thread_nice_values(server.process.pid)
    finally:
        server.close()
    (engine,) = values["engine"]
    assert values["cpu-worker-1"] == {engine}
    assert {"stream-writes", "nexting_thread"} <= values.keys()
    for name, nices in values.items():
        expected = engine if compute_thread(name) else min(19, engine + 10)
        assert nices == {expected}, (name, nices, engine)

    plain = Server("--threads", "2", "--serving-threads-nice", "0")
    try:
        plain.client().completions.create(model=MODEL, prompt="In the beginning", max_tokens=4)
        values = thread_nice_values(plain.process.pid)
    finally:
        plain.close()
    assert set().union(*values.values()) == values["engine"], values


def blas_pool_threads_under_load(server, env):
    """Runs switchserve-bench against `server` under `env` and returns, once
    its gRPC client is running, how many of its threads carry the main
    thread's name beside the main thread (OpenBLAS's pool inherits that name;
    every other thread of the load generator is named), that name, and its
    environment."""
    process = subprocess.Popen(
        [os.environ["SWITCHSERVE_BENCH"], "--address", server.address, "--requests", "100000",
         "--concurrency", "2", "--max-new-tokens", "4"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "grpc-client" not in thread_names(process.pid).values():  # the client runs
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the load generator's gRPC client did not start"
            time.sleep(0.005)
        # A thread just started carries the main thread's name until it names
        # itself: take the fewest over a few looks.
        counts = []
        for _ in range(5):
            names = thread_names(process.pid)
            counts.append(sum(name == names[process.pid] for name in names.values()) - 1)
            time.sleep(0.02)
        with open(f"/proc/{process.pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        return min(counts), names[process.pid], environ
    finally:
        process.kill()
        process.wait()


@pytest.mark.bench
def test_load_generator_runs_without_blas_thread_pool():
    """switchserve-bench starts itself again with OPENBLAS_NUM_THREADS=1
    unless the caller set it: OpenBLAS's pool would otherwise spin on a core
    of the machine under test as the program starts."""
    server = Server()
    try:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        pool, name, environ = blas_pool_threads_under_load(server, env)
        assert pool == 0
        assert b"OPENBLAS_NUM_THREADS=1" in environ
        assert name == "switchserve-ben"  # the program's name, kept by the restart
        # The caller's choice stands, and then the pool is there to be seen
        # (OpenBLAS starts at most one thread per core beside the caller's).
        pool, _, environ = blas_pool_threads_under_load(server,
                                                        {**env, "OPENBLAS_NUM_THREADS": "2"})
        assert b"OPENBLAS_NUM_THREADS=2" in environ
        assert pool == min(os.cpu_count(), 2) - 1
    finally:
        server.close()


@pytest.mark.bench
def test_load_generator_in_process_counts_the_engines_steps():
    """switchserve-bench --engine-model reports the engine's steps over the
    timed requests and how many sequences each computed. Every request here is
    in exactly 5 steps (its 3-token prompt, then 4 decode steps), so the steps
    hold 8 x 5 sequences whatever the concurrency; one at a time, each step
    holds one. The warm-up's steps are left out."""
    def steps(concurrency):
        result = subprocess.run(
            [os.environ["SWITCHSERVE_BENCH"], "--engine-model", MODEL_DIR, "--threads", "1",
             "--requests", "8", "--warmup-requests", "3", "--concurrency", str(concurrency),
             "--prompt-ids", "81,85,37", "--max-new-tokens", "5", "--ignore-eos"],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "requests: 8 ok, 0 failed" in result.stdout, result.stdout
        found = re.search(r"engine steps: (\d+) during the load, ([\d.]+) sequences per step",
                          result.stdout)
        assert found, result.stdout
        return int(found.group(1)), float(found.group(2))

    assert steps(1) == (40, 1.0)
    count, per_step = steps(4)
    assert 10 <= count <= 40
    assert count * per_step == pytest.approx(40, abs=0.01 * count)


@pytest.mark.bench
def test_load_generator_sends_its_priority_over_grpc_and_http():
    """--priority reaches the server by either transport: a server that
    schedules in arrival order refuses every request (INVALID_ARGUMENT, 400),
    one started with --scheduling-policy priority serves them all and logs
    their priority."""
    for policy, expected in (("fcfs", "requests: 0 ok, 4 failed"),
                             ("priority", "requests: 4 ok, 0 failed")):
        server = Server("--scheduling-policy", policy)
        try:
            for address in (["--address", server.address],
                            ["--http-address", f"127.0.0.1:{server.http_port}"]):
                result = subprocess.run(
                    [os.environ["SWITCHSERVE_BENCH"], *address, "--requests", "4",
                     "--max-new-tokens", "3", "--priority", "2"],
                    capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, result.stderr
                assert expected in result.stdout, (policy, address, result.stdout)
            if policy == "priority":
                # The access log gives every request's priority, both protocols.
                records = [json.loads(l) for l in server.log().splitlines()]
                logged = [(r["protocol"], r["priority"]) for r in records if r["msg"] == "request"]
                assert sorted(logged) == [("grpc", 2)] * 4 + [("http", 2)] * 4, logged
        finally:
            server.close()


@pytest.mark.bench
def test_load_generator_over_grpc():
    """switchserve-bench --address completes every request and counts each
    streamed token; a request the server refuses counts as failed, with its
    status code, and the run still ends."""
    server = Server()
    try:
        def bench(*args):
            result = subprocess.run(
                [os.environ["SWITCHSERVE_BENCH"], "--address", server.address, "--requests", "8",
                 "--concurrency", "4", "--max-new-tokens", "5", "--ignore-eos", *args],
                capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            return result.stdout

        out = bench("--prompt-ids", "81,85,37")
        assert "requests: 8 ok, 0 failed" in out, out
        rates = re.search(r"throughput: ([\d.]+) requests/s, ([\d.]+) tokens/s", out)
        assert float(rates.group(2)) / float(rates.group(1)) == pytest.approx(5, rel=1e-3)
        records = [json.loads(l) for l in server.log().splitlines()]
        tokens = [r["completion_tokens"] for r in records if r["msg"] == "request"]
        assert tokens == [5] * 8
        # Token id 256 is outside the byte vocabulary: INVALID_ARGUMENT (3).
        out = bench("--prompt-ids", "81,256")
        assert "requests: 0 ok, 8 failed" in out, out
        assert re.search(r"^error 3 .*: 8$", out, re.M), out
    finally:
        server.close()


@pytest.mark.bench
def test_load_generator_in_process_fails_requests_past_their_deadline():
    """In-process, a request the engine cancels at its deadline is a failure,
    with the status a gRPC client reports for it: the two transports' figures
    and error breakdowns agree. (A deadline already past as the request
    starts: the engine drops it before its first step.)"""
    def bench(*transport):
        result = subprocess.run(
            [os.environ["SWITCHSERVE_BENCH"], *transport, "--requests", "8", "--concurrency",
             "4", "--max-new-tokens", "5", "--timeout-s", "0.0001"],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "requests: 0 ok, 8 failed" in result.stdout, result.stdout
        return re.findall(r"^error .*$", result.stdout, re.M)

    assert bench("--engine-model", MODEL_DIR, "--threads", "1") == [
        "error 4 Deadline Exceeded: 8"]
    server = Server()
    try:
        # Over gRPC the client's library ends a call at its deadline
        # ("Deadline Exceeded") unless the server's answer gets there first
        # ("deadline exceeded"): every failure is code 4 either way.
        breakdown = bench("--address", server.address)
        by_code = collections.Counter()
        for line in breakdown:
            code, count = re.fullmatch(r"error (\d+) .*: (\d+)", line).groups()
            by_code[int(code)] += int(count)
        assert by_code == {4: 8}, breakdown
    finally:
        server.close()


@pytest.mark.bench
def test_load_generator_over_http():
    """switchserve-bench --http-address (ctest bench_http_smoke, where the
    benchmarks are built) completes every request and counts its tokens."""
    server = Server()
    try:
        result = subprocess.run(
            [os.environ["SWITCHSERVE_BENCH"], "--http-address", f"127.0.0.1:{server.http_port}",
             "--requests", "8", "--concurrency", "4", "--max-new-tokens", "5"],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "requests: 8 ok, 0 failed" in result.stdout, result.stdout
        rates = re.search(r"throughput: ([\d.]+) requests/s, ([\d.]+) tokens/s", result.stdout)
        # The transport counted 5 tokens per request.
        assert float(rates.group(2)) / float(rates.group(1)) == pytest.approx(5, rel=1e-3)
        records = [json.loads(l) for l in server.log().splitlines()]
        tokens = [r["completion_tokens"] for r in records if r["msg"] == "request"]
        assert tokens == [5] * 8
    finally:
        server.close()


@pytest.mark.bench
def test_load_generator_over_http_counts_every_token_of_an_event():
    """With --stream-interval 4 an event carries the first token alone, then
    up to 4: switchserve-bench --http-address counts the tokens (10 a
    request here, in 4 events), not the events, as it does over gRPC."""
    server = Server("--stream-interval", "4")
    try:
        def tokens_per_request(*transport):
            result = subprocess.run(
                [os.environ["SWITCHSERVE_BENCH"], *transport, "--requests", "8",
                 "--concurrency", "4", "--prompt-ids", "81,85,37", "--max-new-tokens", "10",
                 "--ignore-eos"],
                capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            assert "requests: 8 ok, 0 failed" in result.stdout, result.stdout
            rates = re.search(r"throughput: ([\d.]+) requests/s, ([\d.]+) tokens/s",
                              result.stdout)
            return float(rates.group(2)) / float(rates.group(1))

        assert tokens_per_request("--http-address", f"127.0.0.1:{server.http_port}") == \
            pytest.approx(10, rel=1e-3)
        assert tokens_per_request("--address", server.address) == pytest.approx(10, rel=1e-3)
        records = [json.loads(l) for l in server.log().splitlines()]
        tokens = [r["completion_tokens"] for r in records if r["msg"] == "request"]
        assert tokens == [10] * 16
    finally:
        server.close()
