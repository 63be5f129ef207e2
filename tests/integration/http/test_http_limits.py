"""The HTTP API at its limits: full queues, clients that disconnect or stop
reading, output and body budgets, the drain on SIGTERM, connections past
--http-max-connections and past the open-file limit, and the gauges and KV
blocks given back after all of them."""

import concurrent.futures
import contextlib
import json
import os
import re
import resource
import signal
import socket
import time

import httpx
import openai
import pytest

import generation_pb2 as pb
from http_harness import (MODEL, Server, cache, completion_request, curl, grpc_health, metric,
                          raw_exchange, raw_health, read_responses, read_to_end, wait_until)
from raw_grpc import stalled_streams


@contextlib.contextmanager
def one_running_one_waiting(server, client):
    """On a server of one running slot: a streamed request running (40
    tokens) and one of 3 tokens waiting; yields the stream and the waiting
    request's future."""
    running = client.completions.create(model=MODEL, prompt="long", max_tokens=40,
                                        stream=True, extra_body={"ignore_eos": True})
    next(running)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: client.completions.create(
            model=MODEL, prompt="wait", max_tokens=3))
        wait_until("a waiting request", lambda: cache(server).waiting_requests == 1)
        yield running, waiting


def test_full_queue_is_429():
    server = Server("--max-running-requests", "1", "--max-queue", "1",
                    "--debug-step-delay-ms", "20")
    try:
        client = server.client()
        with one_running_one_waiting(server, client) as (running, waiting):
            with pytest.raises(openai.RateLimitError) as error:
                client.completions.create(model=MODEL, prompt="too many", max_tokens=3)
            assert error.value.status_code == 429
            assert error.value.body["code"] == "resource_exhausted"
            assert waiting.result(timeout=60).usage.completion_tokens == 3
        # The running stream goes on to its length.
        rest = list(running)
        assert rest and rest[-1].choices[0].finish_reason == "length", rest
        # The server keeps serving.
        assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage
        # More prompts than --max-queue could never be queued together: not
        # a 429 to retry forever.
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2)
        assert error.value.body["param"] == "prompt"
        assert "at most 1 prompts in one request (--max-queue), found 2" in error.value.body["message"]
    finally:
        server.close()


def test_request_the_full_queue_refuses_leaves_no_trace():
    """A request of several prompts is queued whole or not at all: one that
    does not fit is a 429 that takes no room in the queue, and none of its
    prompts reaches the engine's metrics (no cancelled finish reason, no
    prompt length, no queue time)."""
    server = Server("--max-running-requests", "1", "--max-queue", "4",
                    "--debug-step-delay-ms", "20", metrics=True)
    try:
        client = server.client()
        with one_running_one_waiting(server, client) as (running, waiting):
            before = server.scrape_metrics()
            # Four prompts, room for three.
            with pytest.raises(openai.RateLimitError) as error:
                client.completions.create(model=MODEL, prompt=["a", "b", "c", "d"], max_tokens=3,
                                          extra_headers={"x-request-id": "four-prompts"})
            assert error.value.status_code == 429
            assert waiting.result(timeout=60).usage.completion_tokens == 3
        assert list(running)[-1].choices[0].finish_reason == "length"
        # The engine counts a request before its last answer goes out. Since
        # `before`: the two served requests ended and "wait" was scheduled;
        # the refused request's prompts add nothing.
        after = server.scrape_metrics()
        refused = 'switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"}'
        for name, added in (
                (refused, 1),
                ('switchserve_request_finish_reason_total{reason="length"}', 2),
                ('switchserve_request_finish_reason_total{reason="cancelled"}', 0),
                ("switchserve_request_prompt_tokens_count", 2),
                ("switchserve_request_queue_time_seconds_count", 1),
                ("switchserve_time_to_end_without_first_token_seconds_count", 0)):
            assert metric(after, name) - metric(before, name) == added, name
        assert server.access_line("four-prompts")["http_status"] == 429
        # Once the queue has room, the same request is served whole.
        done = client.completions.create(model=MODEL, prompt=["a", "b", "c", "d"], max_tokens=3)
        assert [c.finish_reason for c in done.choices] == ["length"] * 4
    finally:
        server.close()


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


# For stalled_stream's 256 prompts: all running at once, in engine steps slow
# enough for the connection's thread to keep up with them.
UNHURRIED_STREAMS = ("--max-running-requests", "256", "--debug-step-delay-ms", "20")


def stalled_stream(server, request_id, prompts, max_tokens=55):
    """A socket that sends one streamed completion (`prompts` prompts with 20
    logprobs each: about a kilobyte an event, 256 prompts making 12 MB, more
    than the socket buffers could take: Linux lets a send buffer grow to
    4 MiB) and then reads nothing, with a receive buffer of 4 KiB, so that
    the server's writes soon wait."""
    body = json.dumps({"prompt": ["stall"] * prompts, "max_tokens": max_tokens, "logprobs": 20,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.http_port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: " +
              request_id.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    return s


def stream_ended_lines(server):
    return {r["request_id"]: r["why"] for r in map(json.loads, server.log().splitlines())
            if r["msg"] == "stream ended"}


def test_a_stream_whose_client_reads_nothing_ends_past_its_buffer_limit():
    """A streamed completion's events piled up, unbounded, for a client that
    read nothing (a kilobyte and more a token with logprobs, every one the
    engine made until the 60 s write timeout). Past --max-stream-buffer-bytes
    the server closes the connection (the stream ends without its last chunk),
    cancels the request, and logs and counts it RESOURCE_EXHAUSTED. (Every
    prompt runs at once, in steps of 20 ms: the tiny model would otherwise
    make the whole stream before the socket's buffers fill, outpacing the
    connection's thread rather than the client.)"""
    server = Server("--max-stream-buffer-bytes", "65536", *UNHURRIED_STREAMS, metrics=True)
    try:
        with stalled_stream(server, "stalled", prompts=256) as s:
            record = server.access_line("stalled")
            assert (record["status"], record["http_status"]) == ("RESOURCE_EXHAUSTED", 429)
            # Ended early: 256 prompts of 55 tokens would have made 14080.
            assert record["finish_reason"] == "cancelled" and record["completion_tokens"] < 14080
            assert "passed 65536 bytes" in stream_ended_lines(server)["stalled"]
            # What reaches the client ends without the stream's last chunk.
            data = read_to_end(s)
            assert data.startswith(b"HTTP/1.1 200") and not data.endswith(b"\r\n0\r\n\r\n")
            assert b"[DONE]" not in data
        wait_until("the request's blocks freed", lambda: cache(server).used_blocks == 0)
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 1\n' in text
        # The server keeps serving streams.
        done = server.client().completions.create(model=MODEL, prompt=["ok"] * 4, max_tokens=8,
                                                  logprobs=5, stream=True,
                                                  extra_body={"ignore_eos": True})
        finished = [choice.finish_reason for chunk in done for choice in chunk.choices
                    if choice.finish_reason]
        assert finished == ["length"] * 4
    finally:
        server.close()


def test_a_stream_whose_last_events_are_past_its_buffer_limit_is_counted_as_ended():
    """A stream was logged and counted when its last tokens were generated,
    and its last events written afterwards: when the connection was closed
    for them (its client not reading) the client got neither them nor
    [DONE], while the access log and switchserve_requests_total said OK,
    200. The request is now logged once its last events are written:
    RESOURCE_EXHAUSTED, 429, after the `stream ended` warning. (With
    --stream-interval past max_tokens every prompt's tokens come in its
    final event, so the stream's output is all in its last events.)"""
    server = Server("--max-stream-buffer-bytes", "65536", "--stream-interval", "1000",
                    *UNHURRIED_STREAMS, metrics=True)
    try:
        with stalled_stream(server, "last", prompts=256) as s:
            record = server.access_line("last")
            assert (record["status"], record["http_status"]) == ("RESOURCE_EXHAUSTED", 429)
            assert record["finish_reason"] == "length" and record["completion_tokens"] == 256 * 55
            assert "passed 65536 bytes" in stream_ended_lines(server)["last"]
            data = read_to_end(s)
            assert data.startswith(b"HTTP/1.1 200") and b"[DONE]" not in data
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 1\n' in text
        assert 'switchserve_requests_total{protocol="http",status="OK"} 0\n' in text
        # A stream its client reads is logged OK once, and its client gets [DONE].
        chunks = list(server.client().completions.create(model=MODEL, prompt="ok", max_tokens=3,
                                                         stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="OK"} 1\n' in text
    finally:
        server.close()


def test_a_stream_whose_last_events_are_unwritten_at_the_drain_timeout_is_logged_unavailable():
    """A stream whose prompts had all finished, its last events waiting for a
    client that reads nothing (under --max-stream-buffer-bytes), was closed
    by the stopping server at the end of the drain and then logged OK, 200,
    though its client never got those events nor [DONE]. It is logged
    UNAVAILABLE, 503, with a `stream ended` warning: still running when the
    drain timeout ended it."""
    server = Server("--max-stream-buffer-bytes", "67108864", "--drain-timeout-s", "1",
                    *UNHURRIED_STREAMS, metrics=True)
    try:
        with stalled_stream(server, "unwritten", prompts=256) as s:
            def finished_unwritten():
                text = server.scrape_metrics()
                return (metric(text, "switchserve_requests_running") == 0 and
                        metric(text, "switchserve_output_buffer_bytes") > 4 << 20)
            wait_until("every prompt finished, its output unwritten", finished_unwritten)
            assert '"request_id":"unwritten"' not in server.log()  # not logged yet
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
            record = server.access_line("unwritten")
            assert (record["status"], record["http_status"]) == ("UNAVAILABLE", 503)
            assert record["finish_reason"] == "length" and record["completion_tokens"] == 256 * 55
            assert "UNAVAILABLE" in stream_ended_lines(server)["unwritten"]
            assert b"[DONE]" not in read_to_end(s)
    finally:
        server.close()


def test_a_reading_client_keeps_a_stream_whose_events_wait_for_the_server():
    """A streamed completion of several prompts makes an event for each of
    them at every engine step, handed to the connection's I/O thread
    together, and they wait in the server while it writes the ones before,
    however fast the client reads. They counted against
    --max-stream-buffer-bytes as if the client had stopped reading: at the
    limit's least (1024 bytes) every such stream ended RESOURCE_EXHAUSTED
    ("its client is not reading"), and at the default 4 MiB a stream of 1000
    prompts did on a 2-core machine, where the I/O thread runs below the
    engine's priority and falls behind it. Only output waiting for a client
    whose socket takes no more counts against the limit."""
    server = Server("--max-stream-buffer-bytes", "1024", metrics=True)
    try:
        for attempt in range(3):
            request_id = f"reading-{attempt}"
            stream = server.client().completions.create(
                model=MODEL, prompt=["ok"] * 16, max_tokens=20, logprobs=5, stream=True,
                extra_body={"ignore_eos": True}, extra_headers={"x-request-id": request_id})
            finished = [choice.finish_reason for chunk in stream for choice in chunk.choices
                        if choice.finish_reason]
            assert finished == ["length"] * 16
            record = server.access_line(request_id)
            assert (record["status"], record["http_status"]) == ("OK", 200)
            assert record["completion_tokens"] == 16 * 20
        assert stream_ended_lines(server) == {}
        assert 'switchserve_requests_total{protocol="http",status="OK"} 3\n' in (
            server.scrape_metrics())
    finally:
        server.close()


def test_a_unary_response_past_the_output_budget_is_429():
    """A non-streamed response waits whole for its client, and one request of
    many prompts with logprobs can make tens of megabytes: its body holds its
    bytes of --output-buffer-bytes until written, and one that does not fit
    beside what others hold is answered 429 (the work is lost, the server's
    memory is not). One larger than the whole budget would never fit: it was
    answered 429 too, and clients that retry 429 (the openai client, twice)
    generated it again each time; it is a 400 saying so. Responses that fit
    are answered and give their bytes back."""
    server = Server("--max-stream-buffer-bytes", "16384", "--output-buffer-bytes", "16384",
                    "--log-format", "json", metrics=True)
    try:
        client = server.client()
        for _ in range(40):  # each gives its bytes back once written (40 x ~300 > 16384)
            assert client.completions.create(model=MODEL, prompt="ok", max_tokens=4).usage
        retrying = server.client().with_options(max_retries=2)
        with pytest.raises(openai.BadRequestError) as error:
            retrying.completions.create(model=MODEL, prompt=["big"] * 8, max_tokens=40,
                                        logprobs=5, extra_headers={"x-request-id": "too-big"})
        message = error.value.body["message"]
        assert re.fullmatch(
            r"the response is \d+ bytes, more than the server may hold for its clients in all "
            r"\(16384 bytes, --output-buffer-bytes\): ask for fewer prompts, tokens or "
            r"logprobs, or stream it", message), message
        record = server.access_line("too-big")
        assert (record["status"], record["http_status"]) == ("INVALID_ARGUMENT", 400)
        assert server.log().count('"request_id":"too-big"') == 1  # generated once
        assert record["completion_tokens"] == 320  # generated, then refused
        # A GenerateStream whose client reads nothing holds its output (about
        # 8.6 kB): a response of 12 kB no longer fits beside it.
        request = pb.GenerateRequest(text="stall", sampling=pb.SamplingParams(
            max_new_tokens=10, ignore_eos=True), logprobs=20, return_routing=True)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            stalled = pool.submit(stalled_streams, server.port, [request], 5)
            wait_until("the stalled stream's output held", lambda: metric(
                server.scrape_metrics(), "switchserve_output_buffer_bytes") > 4000)
            with pytest.raises(openai.RateLimitError) as error:
                client.completions.create(model=MODEL, prompt=["a"] * 4, max_tokens=16,
                                          logprobs=5, extra_headers={"x-request-id": "no-room"})
            stalled.result()
        assert error.value.status_code == 429
        assert error.value.body["message"] == (
            "the server holds as much output waiting for clients as it may (16384 bytes in all); "
            "retry later")
        record = server.access_line("no-room")
        assert (record["status"], record["http_status"]) == ("RESOURCE_EXHAUSTED", 429)
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 1\n' in text
        assert 'switchserve_requests_total{protocol="http",status="INVALID_ARGUMENT"} 1\n' in text
        assert 'switchserve_requests_total{protocol="http",status="OK"} 40\n' in text
        assert client.completions.create(model=MODEL, prompt="ok", max_tokens=4).usage
    finally:
        server.close()


def test_responses_give_back_what_they_held_of_the_output_budget():
    """switchserve_output_buffer_bytes (of switchserve_output_buffer_limit_bytes,
    --output-buffer-bytes) is what responses waiting for their clients hold:
    0 again once they are written, or their connection closed, whichever way
    they ended, though keep-alive connections stay open."""
    server = Server("--max-stream-buffer-bytes", "65536", "--output-buffer-bytes", "1000000",
                    *UNHURRIED_STREAMS, "--log-format", "json", metrics=True)
    try:
        def held():
            return metric(server.scrape_metrics(), "switchserve_output_buffer_bytes")

        def given_back():
            wait_until("the output budget given back", lambda: held() == 0, timeout_s=10)

        assert metric(server.scrape_metrics(), "switchserve_output_buffer_limit_bytes") == 1000000
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
            for stream in (False, True, False):
                s.sendall(completion_request("kept", 8, logprobs=5, stream=stream))
                [(status, _, _)] = read_responses(s, 1)
                assert status == 200
                given_back()  # the keep-alive connection still open
        with stalled_stream(server, "stalled", prompts=256) as s:
            assert server.access_line("stalled")["status"] == "RESOURCE_EXHAUSTED"
            given_back()
        with stalled_stream(server, "gone", prompts=4) as s:  # then it disconnects
            time.sleep(0.3)
        server.access_line("gone")
        given_back()
        body = json.dumps({"prompt": ["x"] * 4, "max_tokens": 8, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body)
            assert read_to_end(s).endswith(b"data: [DONE]\n\n")
        given_back()
    finally:
        server.close()


def test_request_bodies_share_a_budget_past_which_they_are_429():
    """--http-body-buffer-bytes bounds the request bodies all connections hold
    together: a body that does not fit is answered 429 with Retry-After,
    counted and logged, and fits once the others are done. 300 connections
    each parking an unfinished 4 MiB body took the server from 0.2 to 1.45 GB."""
    server = Server("--http-body-buffer-bytes", "100000", "--max-request-bytes", "60000",
                    metrics=True)

    def padded(request_id, size, connection=b"keep-alive"):
        # A valid completion request whose body is `size` bytes long.
        start, end = b'{"prompt": "x", "max_tokens": 1', b"}"
        body = start + b" " * (size - len(start) - len(end)) + end
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: " +
                request_id.encode() + b"\r\nConnection: " + connection +
                b"\r\nContent-Length: " + str(size).encode() + b"\r\n\r\n")
        return head, body

    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as parked:
            head, body = padded("parked", 60000)
            parked.sendall(head + body[:-10])
            time.sleep(0.2)
            # 60,000 + 50,000 bytes do not fit in 100,000: refused at the head.
            answer = raw_exchange(server.http_port, padded("budget-1", 50000)[0])
            assert answer.startswith(b"HTTP/1.1 429"), answer[:300]
            lower = answer.lower()
            assert b"retry-after: 1\r\n" in lower and b"x-request-id: budget-1" in lower
            error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "resource_exhausted"
            record = server.access_line("budget-1")
            assert record["status"] == "RESOURCE_EXHAUSTED" and record["http_status"] == 429
            # A body that fits beside the parked one is served.
            small_head, small_body = padded("budget-small", 30000, b"close")
            assert raw_exchange(server.http_port, small_head + small_body).startswith(
                b"HTTP/1.1 200")
            # A chunked body counts as it grows: refused before its 50,000 bytes.
            chunks = b"".join(b"2710\r\n" + b" " * 10000 + b"\r\n" for _ in range(5))
            answer = raw_exchange(server.http_port,
                                  b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"x-request-id: budget-chunked\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:300]
            assert server.access_line("budget-chunked")["http_status"] == 429
            # The parked request, completed, is served.
            parked.sendall(body[-10:])
            [(status, headers, _)] = read_responses(parked, 1)
            assert status == 200 and headers["x-request-id"] == "parked"
        text = server.scrape_metrics()
        assert ('switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 2'
                in text), text
        # Its share given back, 50,000 bytes fit.
        head, body = padded("budget-2", 50000, b"close")
        wait_until("the parked body's share given back",
                   lambda: raw_exchange(server.http_port, head + body).startswith(b"HTTP/1.1 200"),
                   timeout_s=5)
    finally:
        server.close()


def test_sigterm_drain_finishes_running_streams_and_answers_503():
    server = Server("--debug-step-delay-ms", "25")
    try:
        client = server.client()
        stream = client.completions.create(model=MODEL, prompt="drain", max_tokens=40,
                                           stream=True, extra_body={"ignore_eos": True})
        first = next(stream)
        server.process.send_signal(signal.SIGTERM)
        wait_until("not ready", lambda: curl(server.url + "/ready", check=False).stdout ==
                   '{"status":"draining"}')
        with pytest.raises(openai.APIStatusError) as error:
            client.completions.create(model=MODEL, prompt="late", max_tokens=2)
        assert error.value.status_code == 503
        assert error.value.body["code"] == "unavailable"
        rest = list(stream)
        text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
        assert rest[-1].choices[0].finish_reason == "length"
        assert len(text) > 0
        assert server.process.wait(timeout=30) == 0
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
