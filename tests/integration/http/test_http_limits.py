"""The HTTP API at its limits: full queues, clients that stop reading, output
and body budgets, and the drain on SIGTERM (test_http_connections.py has
disconnects and the limits on connections and file descriptors)."""

import concurrent.futures
import contextlib
import datetime
import json
import re
import signal
import socket
import threading
import time

import openai
import pytest

import generation_pb2 as pb
from http_harness import (MODEL, Server, cache, completion_request, curl, metric, raw_exchange,
                          read_responses, read_to_end, wait_until)
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
        # So could more choices (n) than it holds, of one prompt too.
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL, prompt="a", n=2, max_tokens=2)
        assert error.value.body["message"] == \
            "n: at most 1 choices in one request (--max-queue), found 2 (1 prompts, n = 2)"
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


# For stalled_stream's 256 prompts: all running at once, in engine steps slow
# enough for the connection's thread to keep up with them.
UNHURRIED_STREAMS = ("--max-running-requests", "256", "--debug-step-delay-ms", "20")
# Slower still, for a test whose stream must still be running when its
# socket's buffers fill (about 16 steps in): under ThreadSanitizer the
# connection's thread took longer than 20 ms to render a step's 256 events,
# fell behind, and the stream ended by length first.
UNHURRIED_STREAMS_SLOW = ("--max-running-requests", "256", "--debug-step-delay-ms", "80")


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
    prompt runs at once, in steps of 80 ms: the tiny model would otherwise
    make the whole stream before the socket's buffers fill, outpacing the
    connection's thread rather than the client.)"""
    server = Server("--max-stream-buffer-bytes", "65536", *UNHURRIED_STREAMS_SLOW, metrics=True)
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


def test_a_stream_whose_client_reads_nothing_does_not_hold_the_stop_past_the_drain_timeout():
    """At the drain's timeout the server ends what is still running. A
    streamed response whose client read nothing then still held the stop for
    4 s more: 2 s waiting for the calls to end, 2 s for the HTTP connections
    to finish writing. Past the timeout they are ended at once."""
    server = Server("--max-stream-buffer-bytes", "67108864", "--drain-timeout-s", "1",
                    *UNHURRIED_STREAMS, metrics=True)
    try:
        with stalled_stream(server, "held-0", prompts=256), \
                stalled_stream(server, "held-1", prompts=256):
            def finished_unwritten():
                text = server.scrape_metrics()
                return (metric(text, "switchserve_requests_running") == 0 and
                        metric(text, "switchserve_requests_waiting") == 0 and
                        metric(text, "switchserve_output_buffer_bytes") > 8 << 20)
            wait_until("both streams generated, their output unwritten", finished_unwritten)
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
            times = {r["msg"]: datetime.datetime.fromisoformat(r["time"])
                     for r in map(json.loads, server.log().splitlines())}
            seconds = (times["stopped"] -
                       times["drain timeout: cancelling 2 calls"]).total_seconds()
            assert seconds < 1.5, f"stopped {seconds:.2f} s after the drain timeout"
            for request_id in ("held-0", "held-1"):
                record = server.access_line(request_id)
                assert (record["status"], record["http_status"]) == ("UNAVAILABLE", 503)
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
            # One larger than the whole budget is a 400 beside it too, not a
            # 429 to retry: its first part that no longer fits does not make
            # it one.
            with pytest.raises(openai.BadRequestError) as too_big:
                client.completions.create(model=MODEL, prompt=["big"] * 8, max_tokens=40,
                                          logprobs=5)
            assert re.fullmatch(r"the response is \d+ bytes, more than the server may hold for "
                                r"its clients in all \(16384 bytes, --output-buffer-bytes\): .*",
                                too_big.value.body["message"]), too_big.value.body["message"]
            stalled.result()
        assert error.value.status_code == 429
        assert error.value.body["message"] == (
            "the server holds as much output waiting for clients as it may (16384 bytes in all); "
            "retry later")
        record = server.access_line("no-room")
        assert (record["status"], record["http_status"]) == ("RESOURCE_EXHAUSTED", 429)
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 1\n' in text
        assert 'switchserve_requests_total{protocol="http",status="INVALID_ARGUMENT"} 2\n' in text
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
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            result = curl("-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                          server.url + path, "-d", json.dumps(body))
            assert result.stdout == "503", path
        assert curl("-s", "-o", "/dev/null", "-w", "%{http_code}",
                    server.url + "/v1/models").stdout == "200"
        rest = list(stream)
        text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
        assert rest[-1].choices[0].finish_reason == "length"
        assert len(text) > 0
        assert server.process.wait(timeout=30) == 0
    finally:
        server.close()


@pytest.mark.rss
def test_a_large_unary_response_takes_about_its_size_to_render():
    """A non-streamed response was built as one JSON tree and then dumped,
    about five times its body before its size was known: one request of
    1000 prompts with 20 logprobs (a 119 MB body) ended a 512 MiB container
    in the OOM killer instead of its 429 or 400. Rendered a choice at a time,
    the server grows by a few times the body at most (the body, the string's
    growth, the tokens' detail the engine handed over)."""
    server = Server("--output-buffer-bytes", str(256 << 20))
    try:
        pid = server.process.pid

        def resident():
            with open(f"/proc/{pid}/status") as status:
                return next(int(line.split()[1]) * 1024 for line in status
                            if line.startswith("VmRSS:"))

        before = resident()
        peak = [before]
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], resident())
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            body = json.dumps({"prompt": ["x"] * 1000, "max_tokens": 40, "logprobs": 20,
                               "ignore_eos": True})
            response = curl("-H", "content-type: application/json", "-d", body,
                            server.url + "/v1/completions").stdout
        finally:
            done.set()
            watcher.join()
        choices = json.loads(response)["choices"]
        assert len(choices) == 1000 and all(len(c["logprobs"]["tokens"]) == 40 for c in choices)
        size = len(response)
        assert size > 20 << 20, size
        # As one tree: 5.1 and 5.9 times the body in two runs.
        assert peak[0] - before < 3.5 * size, (peak[0] - before, size)
    finally:
        server.close()
