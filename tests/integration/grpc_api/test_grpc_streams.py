"""How the gRPC API's streams end: deadlines, client cancels, clients that
stop reading (the write timeout, the per-stream and server-wide output
budgets, which bound unary responses too), cancelled streams' KV blocks, and
the SIGTERM drain."""

import concurrent.futures
import json
import os
import re
import signal
import socket
import threading
import time

import grpc
import h2.exceptions
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from grpc_harness import (BINARY, MODEL, SOURCE_DIR, Server, expect_good_request_works_at,
                          metric, stall_request, stream_log_lines, text_request,
                          wait_for_idle_cache, wait_for_idle_engine, wait_for_output_given_back)
from raw_grpc import raw_grpc_call, stalled_streams
from server_process import ServerProcess, free_port


@pytest.mark.parametrize("timeout", ["10S", "2562000H", "2562047H", "99999999H"])
def test_a_deadline_centuries_away_is_as_good_as_none(server, timeout):
    """grpc-timeout 2562047H (about 2^63 ns, a client's "longest" timeout)
    and the header's largest value overflowed the steady clock into the
    past: the call ended DEADLINE_EXCEEDED at once, without a token."""
    request = text_request("hello", 4)
    for method in ("Generate", "GenerateStream"):
        result = raw_grpc_call(server.port, method, request, [("grpc-timeout", timeout)])
        assert result.get("grpc-status") == "0", (method, result)
        assert len(result["data"]) > 5, (method, result)


@pytest.mark.parametrize("timeout", ["30S", "2562047H", "99999999H"])
def test_a_client_cancel_is_cancelled_whatever_its_deadline(timeout):
    """A call the client resets is CANCELLED in the access log and the
    metrics, not DEADLINE_EXCEEDED: the server's check of "at its deadline"
    read gRPC's time_point, which wraps past the year 2262, so a deadline
    that far away looked already past."""
    server = Server("--debug-step-delay-ms", "20", "--log-format", "json")
    try:
        for method in ("Generate", "GenerateStream"):
            raw_grpc_call(server.port, method, text_request("hello", 40),
                          [("grpc-timeout", timeout)], cancel_after_s=0.3)
        deadline = time.monotonic() + 30
        while True:
            lines = [json.loads(line) for line in server.log().splitlines()
                     if line.startswith("{")]
            calls = [line for line in lines if line.get("method") in ("Generate", "GenerateStream")]
            if len(calls) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sorted((c["method"], c["status"]) for c in calls) == [
            ("Generate", "CANCELLED"), ("GenerateStream", "CANCELLED")], calls
    finally:
        server.close()


def test_a_stream_whose_client_stopped_reading_counts_as_its_client_saw_it():
    """The engine ends the request (OK, length) while its messages wait for a
    client that stopped reading; the client then cancels. The call is
    CANCELLED in switchserve_requests_total as in the access log: the
    engine's observer had counted it OK when the engine finished."""
    metrics_port = free_port()
    # Steps of 20 ms: the first message is written (and stuck behind the
    # 8-byte window) long before the engine ends the request, 200 ms in;
    # the client cancels at 1.5 s.
    server = ServerProcess(BINARY, MODEL, "--log-format", "json", "--debug-step-delay-ms", "20",
                           metrics_port=metrics_port, prefix="switchserve_py_")
    try:
        raw_grpc_call(server.port, "GenerateStream", text_request("slow", 10, ignore_eos=True),
                      [("grpc-timeout", "30S")], cancel_after_s=1.5, window=8)
        deadline = time.monotonic() + 30
        while True:
            calls = [json.loads(line) for line in server.log().splitlines()
                     if '"method":"GenerateStream"' in line]
            if calls or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [(c["status"], c["finish_reason"]) for c in calls] == [("CANCELLED", "length")]
        text = server.scrape_metrics()

        def value(series):
            match = re.search(re.escape(series) + r" (\S+)\n", text)
            return float(match.group(1)) if match else 0.0
        assert value('switchserve_requests_total{protocol="grpc",status="CANCELLED"}') == 1
        assert value('switchserve_requests_total{protocol="grpc",status="OK"}') == 0
        # The engine's own account: it ended the request at its length.
        assert value('switchserve_request_finish_reason_total{reason="length"}') == 1
    finally:
        server.close()


def expect_ended_exhausted_and_serving(server, count):
    """Once the engine is idle: `count` calls counted RESOURCE_EXHAUSTED, no
    request running, no KV block held, and a new call served."""
    exhausted = 'switchserve_requests_total{protocol="grpc",status="RESOURCE_EXHAUSTED"}'
    text = wait_for_idle_engine(server, counted=[(exhausted, count)])
    assert metric(text, exhausted) == count
    assert metric(text, "switchserve_requests_running") == 0
    assert metric(text, "switchserve_kv_cache_usage_ratio") == 0
    expect_good_request_works_at(server)


def test_a_stream_whose_client_reads_nothing_ends_at_the_write_timeout():
    """A client that stops reading (window 0) held its calls, their engine
    requests and everything merged for them, without end. A write that waits
    longer than --stream-write-timeout-s ends the call RESOURCE_EXHAUSTED
    (in the trailers, which flow control does not hold back, the access log
    and the metrics) and cancels its request, long before it would have
    ended (50 tokens at 100 ms a step)."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--debug-step-delay-ms", "100",
                    "--stream-write-timeout-s", "0.5", metrics_port=metrics_port)
    try:
        results = stalled_streams(
            server.port, [text_request("stall", 50, ignore_eos=True)] * 3, 30)
        for result in results:
            assert result["ended_s"] is not None and result["ended_s"] < 4, results
            assert result.get("grpc-status") == "8", results
            assert "had not finished reading a message for" in result.get(
                "grpc-message", ""), results
        calls = stream_log_lines(server, 3)
        assert [(c["status"], c["finish_reason"]) for c in calls] == [
            ("RESOURCE_EXHAUSTED", "cancelled")] * 3, calls
        expect_ended_exhausted_and_serving(server, 3)
    finally:
        server.close()


@pytest.mark.parametrize("step_delay_ms", [20, 0])
def test_a_stream_whose_unread_output_passes_the_buffer_limit_ends_there(step_delay_ms):
    """What is merged for a stream while its write waits was unbounded
    (logprobs and routing: megabytes a call). Past --max-stream-buffer-bytes
    the call ends RESOURCE_EXHAUSTED and its request is cancelled at once,
    whatever the write timeout (here 60 s): once its write has waited 100 ms,
    at the next step (20 ms apart here), or, for a request whose 50 tokens
    are generated sooner than that (no step delay), at the periodic check
    for stalled writes, which ended it only at the write timeout before."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--debug-step-delay-ms", str(step_delay_ms),
                    "--max-stream-buffer-bytes", "4096", metrics_port=metrics_port)
    try:
        results = stalled_streams(server.port, [stall_request(50)] * 2, 30)
        for result in results:
            assert result["ended_s"] is not None and result["ended_s"] < 10, results
            assert result.get("grpc-status") == "8", results
            assert "passed 4096 bytes" in result.get("grpc-message", ""), results
        calls = stream_log_lines(server, 2)
        if step_delay_ms:
            assert [c["status"] for c in calls] == ["RESOURCE_EXHAUSTED"] * 2, calls
            # Ended after a few tokens, not at the request's 50.
            assert all(c["finish_reason"] == "cancelled" and c["completion_tokens"] < 30
                       for c in calls), calls
            expect_ended_exhausted_and_serving(server, 2)
        else:
            # A finished request's last message, sent with its status, may be
            # the write that waits: the call was then logged with that status
            # as it was handed to gRPC (docs/serving.md).
            assert all(c["status"] in ("RESOURCE_EXHAUSTED", "OK") for c in calls), calls
            expect_good_request_works_at(server)
    finally:
        server.close()


def test_reading_clients_keep_streams_whose_output_waits_for_the_server():
    """A stream was ended past --max-stream-buffer-bytes whatever its client
    did: output waiting for the server's own write thread counted as unread,
    and so did a step's output while a write to a reading client completed.
    With logprobs and routing (about 1 KiB a token) the limit's least, 1024
    bytes, ended every stream of 16 reading clients, and 16 KiB did too. Now
    only a stream whose write has waited 100 ms is ended there."""
    server = Server("--log-format", "json", "--max-stream-buffer-bytes", "1024")
    try:
        request = stall_request(50)

        def read_stream(_):
            with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                responses = list(pb_grpc.GenerationStub(channel).GenerateStream(request,
                                                                                timeout=120))
            return (sum(len(r.token_ids) for r in responses), responses[-1].finished,
                    responses[-1].finish_reason)

        for _ in range(3):
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                outcomes = list(pool.map(read_stream, range(16)))
            assert outcomes == [(50, True, pb.FINISH_REASON_LENGTH)] * 16, outcomes
        calls = stream_log_lines(server, 48)
        assert [c["status"] for c in calls] == ["OK"] * 48, calls
    finally:
        server.close()


def test_streams_share_a_budget_of_unread_output():
    """Per call, stalled streams could still hold the limit times the calls
    (256 a connection). All streams together, gRPC's and HTTP's, hold at most
    --output-buffer-bytes: with it at one call's limit, two stalled
    calls growing step by step cannot both reach that limit, and the first
    whose output no longer fits is ended saying so."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--debug-step-delay-ms", "20",
                    "--max-stream-buffer-bytes", "16384", "--output-buffer-bytes", "16384",
                    metrics_port=metrics_port)
    try:
        request = stall_request(50)
        results = stalled_streams(server.port, [request] * 2, 30)
        assert [r.get("grpc-status") for r in results] == ["8", "8"], results
        messages = [r.get("grpc-message", "") for r in results]
        assert any("16384 bytes in all" in m for m in messages), messages
        exhausted = 'switchserve_requests_total{protocol="grpc",status="RESOURCE_EXHAUSTED"}'
        text = wait_for_idle_engine(server, counted=[(exhausted, 2)])
        assert metric(text, exhausted) == 2
        assert metric(text, "switchserve_kv_cache_usage_ratio") == 0
        expect_good_request_works_at(server)
    finally:
        server.close()


def resident_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.rss
@pytest.mark.parametrize("method", ["GenerateStream", "Generate"])
def test_stalled_calls_hold_about_their_budget_in_memory(method):
    """The budget counts serialized output, and the tokens' detail (20
    logprobs and the routing of every token) of stalled streams' unread
    output, and of unary responses while they waited, was held as protobuf
    objects too, several times those bytes: with the default budget, a
    quarter of a container's memory limit, four connections of stalled calls
    got the server OOM-killed (256 MiB to 1 GiB limits). Held serialized, a
    full budget costs about its figure (twice it at most, as a string
    grows)."""
    budget = 16 << 20
    server = Server("--output-buffer-bytes", str(budget),
                    model=os.path.join(SOURCE_DIR, "models/default"))
    try:
        pid = server.process.pid
        before = peak = resident_bytes(pid)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(stalled_streams, server.port, [stall_request(250)] * 128, 8,
                                 method) for _ in range(2)]
            while not all(call.done() for call in calls):
                peak = max(peak, resident_bytes(pid))
                time.sleep(0.05)
            results = [r for call in calls for r in call.result()]
        statuses = [r.get("grpc-status") for r in results]
        # The budget was full: about 55 calls' output fills it, the other
        # calls were ended for it.
        assert statuses.count("8") > 150, statuses
        # 256 calls cost about 6 MiB without any output; the budget's output
        # on top, held as protobuf objects, cost 60-150 MiB more.
        grown = peak - before
        assert grown < 6 * (1 << 20) + 3 * budget, (grown, before)
        expect_good_request_works_at(server)
    finally:
        server.close()


def test_a_stalled_grpc_stream_leaves_an_http_stream_only_the_rest_of_the_budget():
    """The budget is one for both protocols: a GenerateStream whose client
    reads nothing holds its whole (finished) output, under its own limit, and
    an HTTP stream whose client reads nothing is then ended at what the
    budget has left, not at its own limit."""
    http_port = free_port()
    server = Server("--log-format", "json", "--http-port", str(http_port),
                    "--max-stream-buffer-bytes", "65536", "--output-buffer-bytes", "65536")
    try:
        request = stall_request(10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            grpc_call = pool.submit(stalled_streams, server.port, [request], 5)
            time.sleep(1)  # 10 tokens take milliseconds: the output is all made, and held
            body = json.dumps({"prompt": ["stall"] * 64, "max_tokens": 55, "logprobs": 5,
                               "stream": True, "ignore_eos": True}).encode()
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", http_port))
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                          str(len(body)).encode() + b"\r\n\r\n" + body)
                deadline = time.monotonic() + 30
                while True:
                    lines = [json.loads(line) for line in server.log().splitlines()
                             if '"msg":"stream ended"' in line]
                    if lines or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            assert [line["why"] for line in lines] == [
                "RESOURCE_EXHAUSTED: the server holds as much output waiting for clients as it "
                "may (65536 bytes in all): this stream's client is not reading"], server.log()
            # The gRPC stream, under its own limit, still waits for its client.
            assert grpc_call.result()[0]["ended_s"] is None
    finally:
        server.close()


def test_the_output_streams_hold_is_in_the_metrics_and_given_back():
    """switchserve_output_buffer_bytes is what all responses hold of
    --output-buffer-bytes (switchserve_output_buffer_limit_bytes). Streams
    whose client reads nothing hold their finished output there while they
    wait; once their client goes, as after streams read to their end,
    cancelled while a write waits, or past their deadline, it is 0 again."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--max-stream-buffer-bytes", "65536",
                    "--output-buffer-bytes", "1000000", metrics_port=metrics_port)
    try:
        def held():
            return metric(server.scrape_metrics(), "switchserve_output_buffer_bytes")

        assert metric(server.scrape_metrics(), "switchserve_output_buffer_limit_bytes") == 1000000
        request = stall_request(10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            stalled = pool.submit(stalled_streams, server.port, [request] * 2, 3)
            deadline = time.monotonic() + 10
            while held() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert 0 < held() <= 1000000
            # Still waiting for their client, under every limit.
            assert [r["ended_s"] for r in stalled.result()] == [None, None]
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)
            for _ in range(3):
                assert len(list(stub.GenerateStream(request, timeout=60))) >= 1
        slow = text_request("slow", 50, ignore_eos=True)
        raw_grpc_call(server.port, "GenerateStream", slow, [("grpc-timeout", "30S")],
                      cancel_after_s=0.3, window=8)
        try:  # the server resets the stream at its deadline
            raw_grpc_call(server.port, "GenerateStream", slow, [("grpc-timeout", "300m")], window=8)
        except h2.exceptions.StreamClosedError:
            pass
        deadline = time.monotonic() + 10
        while held() != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held() == 0
        expect_good_request_works_at(server)
    finally:
        server.close()


def test_64_streams_then_32_cancelled_free_their_blocks():
    server = Server("--debug-step-delay-ms", "2")
    try:
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)

            def consume(i):
                messages = list(stub.GenerateStream(
                    text_request(f"py stream {i}", 40, 0.8, seed=i, ignore_eos=True),
                    timeout=120))
                return sum(len(m.token_ids) for m in messages), messages[-1]

            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                results = list(pool.map(consume, range(64)))
            assert all(n == 40 and last.finished for n, last in results)

            def maybe_cancel(i):
                call = stub.GenerateStream(text_request(f"py again {i}", 50, 0.8, ignore_eos=True),
                                           timeout=120)
                seen = 0
                try:
                    for _ in call:
                        seen += 1
                        if i % 2 == 0 and seen == 3:
                            call.cancel()
                except grpc.RpcError as error:
                    return error.code()
                return grpc.StatusCode.OK

            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                codes = list(pool.map(maybe_cancel, range(64)))
            assert codes[0::2] == [grpc.StatusCode.CANCELLED] * 32
            assert codes[1::2] == [grpc.StatusCode.OK] * 32
            wait_for_idle_cache(stub)
    finally:
        server.close()


def test_sigterm_drains_running_streams():
    server = Server("--debug-step-delay-ms", "25")
    try:
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)
            started = threading.Barrier(9)

            def stream(i):
                tokens, first, last = 0, True, None
                for message in stub.GenerateStream(
                        text_request(f"drain {i}", 40, ignore_eos=True), timeout=60):
                    tokens += len(message.token_ids)
                    last = message
                    if first:
                        first = False
                        started.wait(timeout=30)
                return tokens, last.finished

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(stream, i) for i in range(8)]
                started.wait(timeout=30)
                server.process.send_signal(signal.SIGTERM)
                with pytest.raises(grpc.RpcError) as error:
                    for _ in range(100):
                        stub.Generate(text_request("late", 2), timeout=5)
                        time.sleep(0.005)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE
                # Every new call is refused while the streams drain, not
                # only Generate: a stream, Tokenize and GetModelInfo too.
                for name, call in [
                        ("GenerateStream",
                         lambda: list(stub.GenerateStream(text_request("late", 2), timeout=5))),
                        ("Tokenize",
                         lambda: stub.Tokenize(pb.TokenizeRequest(text="late"), timeout=5)),
                        ("GetModelInfo",
                         lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5))]:
                    with pytest.raises(grpc.RpcError) as error:
                        call()
                    assert error.value.code() == grpc.StatusCode.UNAVAILABLE, name
                    assert "shutting down" in error.value.details(), name
                assert [f.result() for f in futures] == [(40, True)] * 8
        assert server.process.wait(timeout=30) == 0
    finally:
        server.close()


def test_a_stream_whose_write_fails_at_the_drain_timeout_is_unavailable():
    """A stream whose client reads nothing, its request finished and its
    first message still waiting when the drain's timeout ends it: the failed
    write was taken for its client's cancel, and the call logged and counted
    CANCELLED. The server ended it: UNAVAILABLE, as the metrics reference
    defines a call the drain's timeout ended."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--drain-timeout-s", "2",
                    "--debug-step-delay-ms", "20", metrics_port=metrics_port)
    try:
        def stall():
            try:
                stalled_streams(server.port, [text_request("stall", 20, ignore_eos=True)] * 2, 10)
            except h2.exceptions.ProtocolError:
                pass  # a PING after the server's GOAWAY, as it stops

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            client = pool.submit(stall)
            time.sleep(1)  # 20 tokens at 20 ms a step: the requests are done
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
            client.result()
        calls = stream_log_lines(server, 2)
        assert [(c["status"], c["finish_reason"]) for c in calls] == [
            ("UNAVAILABLE", "length")] * 2, calls
    finally:
        server.close()


def test_a_unary_response_whose_client_reads_nothing_ends_at_the_write_timeout():
    """A Generate whose client reads nothing kept its response in the server
    until the drain: 400 such calls (logprobs and routing) took it from 212 MB
    to 1.1 GB. A response that waits longer than --stream-write-timeout-s
    ends the call RESOURCE_EXHAUSTED, giving back what it held. (It was
    logged and counted as its response went out: OK, docs/reliability.md.)"""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--stream-write-timeout-s", "0.5",
                    metrics_port=metrics_port)
    try:
        request = stall_request(50)
        results = stalled_streams(server.port, [request] * 3, 30, method="Generate")
        for result in results:
            assert result["ended_s"] is not None and result["ended_s"] < 5, results
            assert result.get("grpc-status") == "8", results
            assert "had not finished reading its response (" in result.get("grpc-message", ""), \
                results
        assert wait_for_output_given_back(server) == 0
        expect_good_request_works_at(server)
    finally:
        server.close()


def test_a_unary_response_read_slowly_past_the_write_timeout_does_not_say_nothing_was_read():
    """gRPC does not tell the server how much of a response its client has
    taken, so a client still reading a response that takes longer than
    --stream-write-timeout-s to reach it is ended RESOURCE_EXHAUSTED too. It
    was told its client "read nothing of its response", having read part of
    it; the message says only what the server knows."""
    server = Server("--stream-write-timeout-s", "0.5")
    try:
        # About 40 KB at 4 KiB a 0.2 s: two seconds to read it.
        result = raw_grpc_call(server.port, "Generate", stall_request(50), window=4096,
                               pause_s=0.2)
        assert result.get("grpc-status") == "8", result
        assert len(result["data"]) >= 4096, len(result["data"])  # it was reading
        message = result.get("grpc-message", "")
        assert "read nothing" not in message, message
        assert re.search(r"had not finished reading its response \(\d+ bytes\) after "
                         r"0\.\d+ s$", message), message
        expect_good_request_works_at(server)
    finally:
        server.close()


def test_unary_responses_share_the_output_budget():
    """A Generate's response waiting for its client is held against
    --output-buffer-bytes with every stream's output: with the budget at
    about one response, of two stalled calls one waits, holding it, and the
    other is refused RESOURCE_EXHAUSTED saying so; a response larger than the
    whole budget is INVALID_ARGUMENT, as it never would fit."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--max-stream-buffer-bytes", "32768",
                    "--output-buffer-bytes", "32768", metrics_port=metrics_port)
    try:
        request = stall_request(30)
        with server.channel() as channel:  # one response alone fits, read at once
            response = pb_grpc.GenerationStub(channel).Generate(request, timeout=60)
        size = response.ByteSize()
        assert 32768 // 2 < size <= 32768, size
        assert wait_for_output_given_back(server) == 0
        results = stalled_streams(server.port, [request] * 2, 3, method="Generate")
        assert sorted(str(r.get("grpc-status")) for r in results) == ["8", "None"], results
        refused = next(r for r in results if r.get("grpc-status") == "8")
        assert "32768 bytes in all" in refused["grpc-message"], results
        calls = stream_log_lines(server, 3, method="Generate")
        assert sorted(c["status"] for c in calls) == ["OK", "OK", "RESOURCE_EXHAUSTED"], calls
        request.sampling.max_new_tokens = 59
        with server.channel() as channel, pytest.raises(grpc.RpcError) as refusal:
            pb_grpc.GenerationStub(channel).Generate(request, timeout=60)
        assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than the server may hold for its clients in all" in refusal.value.details()
        assert wait_for_output_given_back(server) == 0
        expect_good_request_works_at(server)
    finally:
        server.close()
