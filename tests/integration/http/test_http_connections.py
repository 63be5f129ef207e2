"""The HTTP API's connections at their limits: clients that disconnect
mid-request, connections past --http-max-connections and past the open-file
limit (and what gRPC's listener needs of it), and the gauges and KV blocks
given back when clients leave."""

import concurrent.futures
import json
import os
import re
import resource
import socket
import time

import httpx
import pytest

import generation_pb2 as pb
from http_harness import Server, cache, curl, grpc_health, raw_health, wait_until


def test_disconnect_cancels_the_request():
    server = Server("--debug-step-delay-ms", "50")
    try:
        body = json.dumps({"prompt": "gone", "max_tokens": 60, "ignore_eos": True,
                           "stream": True}).encode()
        for stream in (True, False):
            request_id = f"gone-{stream}"
            payload = json.loads(body)
            payload["stream"] = stream
            data = json.dumps(payload).encode()
            with socket.create_connection(("127.0.0.1", server.http_port)) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nx-request-id: " +
                          request_id.encode() + b"\r\nContent-Length: " +
                          str(len(data)).encode() + b"\r\n\r\n" + data)
                if stream:
                    assert s.recv(4096).startswith(b"HTTP/1.1 200")
                wait_until("the request running", lambda: cache(server).running_requests == 1)
            started = time.monotonic()
            # 60 tokens take 3 s at 50 ms a step; the disconnect ends it at once.
            wait_until("the request cancelled",
                       lambda: cache(server).running_requests == 0 and
                       cache(server).used_blocks == 0, timeout_s=1.5)
            assert time.monotonic() - started < 1.5
            record = server.access_line(request_id)
            assert record["status"] == "CANCELLED" and record["finish_reason"] == "cancelled"
            assert record["completion_tokens"] < 60
    finally:
        server.close()


def test_connections_past_http_max_connections_are_closed_and_counted():
    """With --http-max-connections 3, three keep-alive connections are
    served and a fourth is closed unanswered, counted and logged; once one
    of the three closes, a new connection is served."""
    server = Server("--http-max-connections", "3", metrics=True)
    held = []
    try:
        held = [socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
                for _ in range(3)]
        for connection in held:
            assert raw_health(connection) == b"HTTP/1.1 200 OK"
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as extra:
            assert raw_health(extra) == b""
        assert "switchserve_http_connections_refused_total 1" in server.scrape_metrics()
        warnings = [json.loads(line) for line in server.log().splitlines()
                    if "closed as accepted" in line]
        assert [w["level"] for w in warnings] == ["warning"], server.log()
        assert "3 were open (--http-max-connections" in warnings[0]["msg"]
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # the server sees the close a moment later
            again = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
            if raw_health(again) == b"HTTP/1.1 200 OK":
                held.append(again)
                break
            again.close()
            assert time.monotonic() < deadline, "no connection served after one closed"
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as extra:
            assert raw_health(extra) == b""  # three open again
        for connection in held:
            assert raw_health(connection) == b"HTTP/1.1 200 OK"
    finally:
        for connection in held:
            connection.close()
        server.close()


@pytest.mark.fd_exhaustion
def test_http_connections_leave_the_descriptors_grpc_needs():
    """By default HTTP takes at most half the open-file limit: 200 idle HTTP
    connections under a limit of 128 once took every descriptor, and gRPC's
    listener, meeting EMFILE, stopped accepting for good (CVE-2023-4785)."""
    server = Server()
    connections = []
    try:
        resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (128, 128))
        for _ in range(200):
            connections.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=5))
        time.sleep(0.5)
        assert grpc_health(server) == (0, "SERVING")
        assert raw_health(connections[0]) == b"HTTP/1.1 200 OK"
        assert raw_health(connections[-1]) == b""  # past 64: closed as accepted
        assert server.process.poll() is None
    finally:
        for connection in connections:
            connection.close()
        server.close()


@pytest.mark.fd_exhaustion
def test_a_grpc_listener_that_failed_an_accept_drains_and_exits_1():
    """gRPC 1.51 closes its listener for good after a failed accept (here
    EMFILE from idle gRPC connections past a limit of 128): the server then
    takes no new calls, so it drains and exits with status 1 for its
    supervisor to restart it, instead of serving on half-alive."""
    server = Server()
    connections = []
    try:
        resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (128, 128))
        for _ in range(200):
            try:
                connections.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
            except OSError:
                break
        assert server.process.wait(timeout=60) == 1, server.log()
        log = [json.loads(line) for line in server.log().splitlines()]
        lost = [r for r in log if r["msg"].startswith("the gRPC port accepts no more connections")]
        assert [r["level"] for r in lost] == ["error"], server.log()
        assert log[-1]["msg"] == "stopped"
    finally:
        for connection in connections:
            connection.close()
        server.close()


@pytest.mark.fd_exhaustion
def test_running_out_of_file_descriptors_does_not_spin_the_io_threads():
    """With every file descriptor taken by idle HTTP connections, the next
    accept fails at once (EMFILE) and the connection stays in the backlog:
    accepting again without a pause ran the two I/O threads at 100%. Once the
    connections close, the API answers again."""
    # A connection limit above the descriptors: HTTP's accepts meet EMFILE.
    server = Server("--http-max-connections", "1000")
    connections = []
    try:
        resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (128, 128))
        for _ in range(200):  # past the limit: the rest wait in the backlog
            connections.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=5))
        time.sleep(0.5)

        def cpu_ticks():
            with open(f"/proc/{server.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime

        before = cpu_ticks()
        time.sleep(2)
        spent_s = (cpu_ticks() - before) / os.sysconf("SC_CLK_TCK")
        assert spent_s < 0.2, f"{spent_s:.2f} s of CPU in 2 s while idle"
        for connection in connections:
            connection.close()
        connections = []
        # The server closes its side as it sees each connection end (slower
        # under ASan); meanwhile a new one may still be refused.
        deadline = time.monotonic() + 20
        while True:
            health = curl(server.url + "/health", check=False)
            if health.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert json.loads(health.stdout) == {"status": "ok"}, health.stderr
    finally:
        for connection in connections:
            connection.close()
        server.close()


def test_gauges_follow_requests_cancelled_while_the_engine_idles():
    """Requests cancelled (or running, then cancelled) leave the running and
    waiting gauges and the KV usage at zero once the engine has dropped them,
    though no step runs after: they were only set by steps, and stayed at 2
    running and 4 waiting (the HPA scales on waiting)."""
    server = Server("--debug-step-delay-ms", "20", "--max-running-requests", "2", metrics=True)
    try:
        def gauge(text, name):
            return float(re.search(r"^" + name + r" (\S+)$", text, re.M).group(1))

        stub = server.grpc_stub()
        request = pb.GenerateRequest(text="cancel me", sampling=pb.SamplingParams(
            max_new_tokens=50, ignore_eos=True))
        calls = [stub.GenerateStream(request, timeout=60) for _ in range(6)]
        for call in calls[:2]:
            next(call)  # two running (streaming), four waiting
        text = server.scrape_metrics()
        assert gauge(text, "switchserve_requests_running") == 2
        assert gauge(text, "switchserve_kv_cache_usage_ratio") > 0
        for call in calls:
            call.cancel()
        deadline = time.monotonic() + 10
        while True:
            text = server.scrape_metrics()
            state = [gauge(text, "switchserve_requests_running"),
                     gauge(text, "switchserve_requests_waiting"),
                     gauge(text, "switchserve_kv_cache_usage_ratio")]
            if state == [0, 0, 0] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert state == [0, 0, 0]
        assert server.grpc_stub().GetModelInfo(pb.GetModelInfoRequest()).cache.running_requests == 0
    finally:
        server.close()


def test_32_concurrent_streams_half_disconnecting_free_their_blocks():
    # 10 ms steps: the 53 tokens a disconnected stream leaves take over half
    # a second, far longer than the client takes to close.
    server = Server("--debug-step-delay-ms", "10")
    try:
        def one(i):
            body = {"prompt": f"m{i}", "max_tokens": 56, "temperature": 0.8, "seed": i,
                    "ignore_eos": True, "stream": True}
            events = 0
            with httpx.Client(base_url=server.url, timeout=120) as http:
                with http.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    for line in response.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        if line == "data: [DONE]":
                            return events, True
                        events += 1
                        if i % 2 == 0 and events == 3:
                            return events, False  # leaves the stream: disconnects
            return events, False

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            results = list(pool.map(one, range(32)))
        assert results[1::2] == [(56, True)] * 16  # one event per token, then [DONE]
        assert results[0::2] == [(3, False)] * 16
        wait_until("every block free", lambda: cache(server).used_blocks == 0 and
                   cache(server).running_requests == 0 and cache(server).waiting_requests == 0)

        def access_records():
            records = [json.loads(l) for l in server.log().splitlines()]
            return [r for r in records if r["msg"] == "request"]
        wait_until("32 access-log lines", lambda: len(access_records()) == 32)
        cancelled = [r for r in access_records() if r["status"] == "CANCELLED"]
        assert len(cancelled) == 16
        assert all(r["completion_tokens"] < 56 for r in cancelled)
    finally:
        server.close()
