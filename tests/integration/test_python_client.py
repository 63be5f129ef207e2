"""The switchserve gRPC API from a Python grpcio client, against the real
server process on a free loopback port (the port is read from its log)."""

import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import grpc
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
import health_pb2
import health_pb2_grpc
import reflection_pb2
import reflection_pb2_grpc
from raw_grpc import open_raw_grpc_call, stalled_streams
from server_process import ServerProcess, free_port

BINARY = os.environ["SWITCHSERVE_BINARY"]
SOURCE_DIR = os.environ["SWITCHSERVE_SOURCE_DIR"]
MODEL = os.path.join(SOURCE_DIR, "tests/golden/switchall_f16")
CONTEXT = 64


class Server(ServerProcess):
    def __init__(self, *extra_args, model=MODEL, metrics_port=0):
        super().__init__(BINARY, model, *extra_args, metrics_port=metrics_port,
                         prefix="switchserve_py_")


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def stub(server):
    with server.channel() as channel:
        yield pb_grpc.GenerationStub(channel)


def text_request(text, max_new_tokens, temperature=0.0, **kwargs):
    return pb.GenerateRequest(
        text=text,
        sampling=pb.SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                   **kwargs))


def expect_good_request_works(stub):
    response = stub.Generate(text_request("still alive?", 5), timeout=60)
    assert len(response.token_ids) == 5


def test_unary_and_streaming_agree(stub):
    request = text_request("The experts say", 30, temperature=0.9, seed=99, top_k=40, min_p=0.01)
    request.logprobs = 2
    unary = stub.Generate(request, timeout=60)
    assert unary.usage.prompt_tokens == 15
    assert unary.usage.completion_tokens == len(unary.token_ids) > 0
    assert unary.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert len(unary.tokens) == len(unary.token_ids)
    assert len(unary.tokens[0].top_logprobs) == 2
    messages = list(stub.GenerateStream(request, timeout=60))
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    assert messages[-1].finished and messages[-1].finish_reason == unary.finish_reason
    assert not any(m.finished for m in messages[:-1])
    # Same seed, same tokens.
    assert stub.Generate(request, timeout=60).token_ids == unary.token_ids


def test_stop_string_and_stop_token(stub):
    reference = stub.Generate(text_request("stop test", 20, ignore_eos=True), timeout=60)
    stop = reference.text[6:8]
    stopped = stub.Generate(text_request("stop test", 20, stop=[stop]), timeout=60)
    assert stopped.finish_reason == pb.FINISH_REASON_STOP
    assert stopped.text == reference.text[:reference.text.find(stop)]
    streamed = "".join(m.text for m in
                       stub.GenerateStream(text_request("stop test", 20, stop=[stop]), timeout=60))
    assert streamed == stopped.text
    by_id = stub.Generate(text_request("stop test", 20, stop_token_ids=[reference.token_ids[3]]),
                          timeout=60)
    assert by_id.finish_reason == pb.FINISH_REASON_STOP
    assert list(by_id.token_ids) == list(reference.token_ids[:list(reference.token_ids).index(
        reference.token_ids[3]) + 1])


def model_with_eos(eos_token_id):
    """The test model with config.json declaring `eos_token_id` (same weights)."""
    model = tempfile.mkdtemp(prefix="switchserve_eos_")
    with open(os.path.join(MODEL, "config.json")) as f:
        config = json.load(f)
    config["eos_token_id"] = eos_token_id
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(config, f)
    os.symlink(os.path.join(MODEL, "model.safetensors"), os.path.join(model, "model.safetensors"))
    return model


def test_eos_ends_generation_unless_ignored(stub):
    # The test model declares no EOS token: its greedy continuation runs to
    # the length limit. Served again with one of those tokens as its EOS,
    # generation ends at that token's first occurrence, with reason EOS.
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).eos_token_id == -1
    reference = stub.Generate(text_request("eos test", 20), timeout=60)
    assert reference.finish_reason == pb.FINISH_REASON_LENGTH
    ids = list(reference.token_ids)
    eos = ids[5]
    ends_at = ids.index(eos) + 1
    model = model_with_eos(eos)
    server = Server(model=model)
    try:
        with server.channel() as channel:
            eos_stub = pb_grpc.GenerationStub(channel)
            assert eos_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).eos_token_id == eos
            ended = eos_stub.Generate(text_request("eos test", 20), timeout=60)
            assert ended.finish_reason == pb.FINISH_REASON_EOS
            assert list(ended.token_ids) == ids[:ends_at]
            assert ended.usage.completion_tokens == ends_at
            messages = list(eos_stub.GenerateStream(text_request("eos test", 20), timeout=60))
            assert messages[-1].finished
            assert messages[-1].finish_reason == pb.FINISH_REASON_EOS
            assert [t for m in messages for t in m.token_ids] == ids[:ends_at]
            # ignore_eos: generation goes on past it, to the length limit.
            ignoring = eos_stub.Generate(text_request("eos test", 20, ignore_eos=True), timeout=60)
            assert ignoring.finish_reason == pb.FINISH_REASON_LENGTH
            assert list(ignoring.token_ids) == ids
    finally:
        server.close()
        shutil.rmtree(model)


def raw_grpc_call(port, method, request, timeout_header, cancel_after_s=None, window=None):
    """One call over a hand-made HTTP/2 connection, with a `grpc-timeout`
    header the Python client would refuse to send: the response headers and
    trailers, and the response messages' bytes. With `cancel_after_s`, the
    client resets the stream (CANCEL) that long after sending the request.
    With `window`, the client offers a flow-control window of that many
    bytes and never reads more: a client that stops reading."""
    import socket
    import h2.config
    import h2.connection
    import h2.errors
    import h2.events
    import h2.settings
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    result = {"data": b""}
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        connection.initiate_connection()
        if window is not None:
            connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        open_raw_grpc_call(connection, 1, method, request, [("grpc-timeout", timeout_header)])
        s.sendall(connection.data_to_send())
        ended = False
        cancel_at = None if cancel_after_s is None else time.monotonic() + cancel_after_s
        while not ended:
            if cancel_at is not None and time.monotonic() >= cancel_at:
                connection.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
                s.sendall(connection.data_to_send())
                break
            if cancel_at is not None:
                s.settimeout(max(0.001, cancel_at - time.monotonic()))
            try:
                data = s.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    result.update((k.decode(), v.decode()) for k, v in event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    if window is None:
                        connection.acknowledge_received_data(event.flow_controlled_length, 1)
                    result["data"] += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            s.sendall(connection.data_to_send())
    return result


@pytest.mark.parametrize("timeout", ["10S", "2562000H", "2562047H", "99999999H"])
def test_a_deadline_centuries_away_is_as_good_as_none(server, timeout):
    """grpc-timeout 2562047H (about 2^63 ns, a client's "longest" timeout)
    and the header's largest value overflowed the steady clock into the
    past: the call ended DEADLINE_EXCEEDED at once, without a token."""
    request = text_request("hello", 4)
    for method in ("Generate", "GenerateStream"):
        result = raw_grpc_call(server.port, method, request, timeout)
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
            raw_grpc_call(server.port, method, text_request("hello", 40), timeout,
                          cancel_after_s=0.3)
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
                      "30S", cancel_after_s=1.5, window=8)
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


def metric(text, series):
    match = re.search("^" + re.escape(series) + r" (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for_idle_engine(server):
    """The metrics once no request runs and no KV block is held (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        text = server.scrape_metrics()
        if (metric(text, "switchserve_requests_running") == 0
                and metric(text, "switchserve_kv_cache_usage_ratio") == 0) or \
                time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def stream_log_lines(server, count):
    deadline = time.monotonic() + 10
    while True:
        calls = [json.loads(line) for line in server.log().splitlines()
                 if '"method":"GenerateStream"' in line]
        if len(calls) >= count or time.monotonic() > deadline:
            return calls
        time.sleep(0.05)


def expect_ended_exhausted_and_serving(server, count):
    """Once the engine is idle: `count` calls counted RESOURCE_EXHAUSTED, no
    request running, no KV block held, and a new call served."""
    text = wait_for_idle_engine(server)
    assert metric(text, 'switchserve_requests_total{protocol="grpc",status="RESOURCE_EXHAUSTED"}') == count
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
            assert "read nothing for" in result.get("grpc-message", ""), results
        calls = stream_log_lines(server, 3)
        assert [(c["status"], c["finish_reason"]) for c in calls] == [
            ("RESOURCE_EXHAUSTED", "cancelled")] * 3, calls
        expect_ended_exhausted_and_serving(server, 3)
    finally:
        server.close()


def test_a_stream_whose_unread_output_passes_the_buffer_limit_ends_there():
    """What is merged for a stream while its write waits was unbounded
    (logprobs and routing: megabytes a call). Past --max-stream-buffer-bytes
    the call ends RESOURCE_EXHAUSTED and its request is cancelled at once,
    whatever the write timeout (here 60 s)."""
    metrics_port = free_port()
    server = Server("--log-format", "json", "--debug-step-delay-ms", "20",
                    "--max-stream-buffer-bytes", "4096", metrics_port=metrics_port)
    try:
        request = text_request("stall", 50, ignore_eos=True)
        request.logprobs = 20
        request.return_routing = True
        results = stalled_streams(server.port, [request] * 2, 30)
        for result in results:
            assert result["ended_s"] is not None and result["ended_s"] < 10, results
            assert result.get("grpc-status") == "8", results
            assert "passed 4096 bytes" in result.get("grpc-message", ""), results
        calls = stream_log_lines(server, 2)
        assert [c["status"] for c in calls] == ["RESOURCE_EXHAUSTED"] * 2, calls
        # Ended after a few tokens, not at the request's 50.
        assert all(c["finish_reason"] == "cancelled" and c["completion_tokens"] < 30
                   for c in calls), calls
        expect_ended_exhausted_and_serving(server, 2)
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
        request = text_request("stall", 50, ignore_eos=True)
        request.logprobs = 20
        request.return_routing = True
        results = stalled_streams(server.port, [request] * 2, 30)
        assert [r.get("grpc-status") for r in results] == ["8", "8"], results
        messages = [r.get("grpc-message", "") for r in results]
        assert any("16384 bytes in all" in m for m in messages), messages
        text = wait_for_idle_engine(server)
        assert metric(text, 'switchserve_requests_total{protocol="grpc",status="RESOURCE_EXHAUSTED"}') == 2
        assert metric(text, "switchserve_kv_cache_usage_ratio") == 0
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
        request = text_request("stall", 10, ignore_eos=True)
        request.logprobs = 20
        request.return_routing = True
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
        request = text_request("stall", 10, ignore_eos=True)
        request.logprobs = 20
        request.return_routing = True
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
        raw_grpc_call(server.port, "GenerateStream", slow, "30S", cancel_after_s=0.3, window=8)
        import h2.exceptions
        try:  # the server resets the stream at its deadline
            raw_grpc_call(server.port, "GenerateStream", slow, "300m", window=8)
        except h2.exceptions.StreamClosedError:
            pass
        deadline = time.monotonic() + 10
        while held() != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held() == 0
        expect_good_request_works_at(server)
    finally:
        server.close()


def expect_good_request_works_at(server):
    with server.channel() as channel:
        expect_good_request_works(pb_grpc.GenerationStub(channel))


def test_tokenize_and_model_info(stub):
    assert list(stub.Tokenize(pb.TokenizeRequest(text="hé!"), timeout=10).token_ids) == [
        104, 0xC3, 0xA9, 33]
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.name == "switchall_f16"  # the served model name, as HTTP's `model`
    assert info.context_length == CONTEXT and info.vocab_size == 256
    assert info.tokenizer == "byte" and info.device == "cpu"
    assert info.cache.total_blocks > 0 and info.cache.block_size == 16
    # The architecture as config.json gives it.
    assert (info.attention.position, info.attention.gate, info.attention.value_routing,
            info.attention.shared_router) == ("rope", "sigmoid", "source", False)
    assert (info.ffn.gate, info.ffn.activation) == ("softmax", "relu")


def test_model_info_names_the_served_model_and_xl_positions():
    """`name` follows --served-model-name; an XL model says so."""
    xl = Server("--served-model-name", "served-xl",
                model=os.path.join(SOURCE_DIR, "tests/golden/xl_dense_gqa"))
    try:
        with xl.channel() as channel:
            info = pb_grpc.GenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest(),
                                                                timeout=10)
        assert info.name == "served-xl"
        assert info.attention.position == "xl" and info.attention.type == "dense"
    finally:
        xl.close()


def test_health_and_reflection(server):
    with server.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "switchserve.v1.Generation"):
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        names = [s.name for r in responses for s in r.list_services_response.service]
        assert "switchserve.v1.Generation" in names
        assert "grpc.health.v1.Health" in names


def test_greedy_same_alone_and_among_32_concurrent():
    # Steps of at least 5 ms: the crowd stays in the batch long enough for
    # GetModelInfo to see it.
    server = Server("--debug-step-delay-ms", "5")
    try:
        with server.channel() as channel:
            greedy_same_alone_and_among_32_concurrent(pb_grpc.GenerationStub(channel))
    finally:
        server.close()


def greedy_same_alone_and_among_32_concurrent(stub):
    requests = [text_request(f"python {i * 13}:", 24, ignore_eos=True) for i in range(32)]
    alone = [stub.Generate(r, timeout=60).text for r in requests]
    futures = [stub.Generate.future(r, timeout=120) for r in requests]
    # While they run, the engine's snapshot shows how many requests share the
    # running batch (every running request gets a token in each step).
    most_running = 0
    while not all(f.done() for f in futures):
        cache = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).cache
        most_running = max(most_running, cache.running_requests)
        time.sleep(0.001)
    together = [f.result().text for f in futures]
    assert together == alone
    assert most_running >= 2, "the concurrent requests never shared the batch"


def wait_for_idle_cache(stub):
    for _ in range(1000):
        cache = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).cache
        if cache.used_blocks == 0 and cache.running_requests == 0 and cache.waiting_requests == 0:
            return cache
        time.sleep(0.01)
    raise AssertionError(f"KV blocks still in use: {cache}")


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


def raw_generate(channel, payload):
    """Sends hand-encoded GenerateRequest bytes (Python strings cannot hold
    invalid UTF-8)."""
    method = channel.unary_unary("/switchserve.v1.Generation/Generate",
                                 request_serializer=lambda b: b,
                                 response_deserializer=pb.GenerateResponse.FromString)
    return method(payload, timeout=30)


BAD_INPUTS = [
    ("empty text", pb.GenerateRequest(text=""), "text"),
    ("no prompt", pb.GenerateRequest(), "prompt"),
    ("empty token ids", pb.GenerateRequest(token_ids=pb.TokenIds()), "token_ids"),
    ("id outside vocabulary", pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 256])), "token_ids"),
    ("prompt longer than context", pb.GenerateRequest(text="a" * 80), "context length is 64"),
    ("negative temperature", text_request("x", 4, temperature=-1.0), "sampling.temperature"),
    ("top_p zero", text_request("x", 4, top_p=0.0), "sampling.top_p"),
    ("top_p above one", text_request("x", 4, top_p=1.01), "sampling.top_p"),
    ("negative top_k", text_request("x", 4, top_k=-3), "sampling.top_k"),
    ("min_p above one", text_request("x", 4, min_p=1.5), "sampling.min_p"),
    ("repetition penalty zero", text_request("x", 4, repetition_penalty=0.0),
     "sampling.repetition_penalty"),
    ("max_new_tokens zero", text_request("x", 0), "sampling.max_new_tokens"),
    ("max_new_tokens over context", text_request("x", 64), "sampling.max_new_tokens"),
    ("too many stop strings", text_request("x", 4, stop=[str(i) for i in range(17)]),
     "sampling.stop"),
    ("stop id outside vocabulary", text_request("x", 4, stop_token_ids=[1000]),
     "sampling.stop_token_ids"),
    ("too many logprobs", pb.GenerateRequest(text="x", logprobs=50), "logprobs"),
]


@pytest.mark.parametrize("name,request_message,field", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_invalid_argument(stub, name, request_message, field):
    for call in (stub.Generate, lambda r, timeout: list(stub.GenerateStream(r, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as error:
            call(request_message, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert field in error.value.details()
        expect_good_request_works(stub)


def test_invalid_utf8_prompt(server, stub):
    with server.channel() as channel:
        with pytest.raises(grpc.RpcError) as error:
            raw_generate(channel, b"\x0a\x03a\xff\xfe")  # field 1 (text), 3 bytes
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "text" in error.value.details()
    expect_good_request_works(stub)


@pytest.mark.parametrize("method", ["Generate", "GenerateStream", "Tokenize", "GetModelInfo"])
def test_malformed_request_bytes_are_invalid_argument(server, stub, method):
    """Bytes that are no protobuf message (a lone 0xFF tag, a truncated
    length) get INVALID_ARGUMENT on every method, not a status from inside
    gRPC, and the server goes on serving."""
    with server.channel() as channel:
        if method == "GenerateStream":
            call = channel.unary_stream(f"/switchserve.v1.Generation/{method}",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
            send = lambda payload: list(call(payload, timeout=30))
        else:
            call = channel.unary_unary(f"/switchserve.v1.Generation/{method}",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            send = lambda payload: call(payload, timeout=30)
        for payload in [b"\xff", b"\x0a\x05ab"]:
            with pytest.raises(grpc.RpcError) as error:
                send(payload)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, payload)
            assert "malformed switchserve.v1." in error.value.details()
    expect_good_request_works(stub)


def make_certs():
    directory = tempfile.mkdtemp(prefix="switchserve_certs_")
    subprocess.run([os.path.join(SOURCE_DIR, "tests/integration/make_test_certs.sh"), directory],
                   check=True)
    read = lambda name: open(os.path.join(directory, name), "rb").read()
    return directory, read


def tokenize(channel, metadata=None):
    return pb_grpc.GenerationStub(channel).Tokenize(pb.TokenizeRequest(text="hi"), timeout=10,
                                                    metadata=metadata)


def test_tls_and_mtls():
    directory, read = make_certs()
    path = lambda name: os.path.join(directory, name)
    server = Server("--tls-cert", path("server.pem"), "--tls-key", path("server.key"))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=read("ca.pem"))
        with grpc.secure_channel(server.address, credentials) as channel:
            assert list(tokenize(channel).token_ids) == [104, 105]
        with server.channel() as channel, pytest.raises(grpc.RpcError) as error:
            tokenize(channel)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()

    server = Server("--tls-cert", path("server.pem"), "--tls-key", path("server.key"),
                    "--tls-client-ca", path("ca.pem"))
    try:
        with_cert = grpc.ssl_channel_credentials(read("ca.pem"), read("client.key"),
                                                 read("client.pem"))
        with grpc.secure_channel(server.address, with_cert) as channel:
            assert list(tokenize(channel).token_ids) == [104, 105]
        without_cert = grpc.ssl_channel_credentials(root_certificates=read("ca.pem"))
        with grpc.secure_channel(server.address, without_cert) as channel:
            with pytest.raises(grpc.RpcError) as error:
                tokenize(channel)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()


def test_bearer_token():
    directory = tempfile.mkdtemp(prefix="switchserve_token_")
    token_file = os.path.join(directory, "token")
    with open(token_file, "w") as f:
        f.write("py-token\n")
    server = Server("--auth-token-file", token_file)
    try:
        with server.channel() as channel:
            for metadata in (None, [("authorization", "Bearer nope")]):
                with pytest.raises(grpc.RpcError) as error:
                    tokenize(channel, metadata)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert tokenize(channel, [("authorization", "Bearer py-token")]).token_ids
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
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
                assert [f.result() for f in futures] == [(40, True)] * 8
        assert server.process.wait(timeout=30) == 0
    finally:
        server.close()


def access_lines(server):
    """The access-log lines (JSON form) the server wrote so far."""
    lines = []
    for line in server.log().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record["msg"] == "request":
                lines.append(record)
    return lines


def wait_for_access_line(server, request_id, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in access_lines(server):
            if record["request_id"] == request_id:
                return record
        time.sleep(0.02)
    raise AssertionError(f"no access-log line for {request_id}:\n{server.log()}")


def test_request_id_is_returned_and_logged_in_text_form(server, stub):
    _, call = stub.Generate.with_call(text_request("trace me", 3), timeout=60,
                                      metadata=[("x-request-id", "trace-42")])
    assert ("x-request-id", "trace-42") in call.initial_metadata()
    _, call = stub.Generate.with_call(text_request("trace me", 2), timeout=60)
    made = dict(call.initial_metadata())["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    deadline = time.monotonic() + 30
    while "request_id=trace-42" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    line = next(l for l in server.log().splitlines() if "request_id=trace-42" in l)
    assert re.search(r"switchserve: request request_id=trace-42 protocol=grpc method=Generate "
                     r"peer=\S+ status=OK prompt_tokens=8 completion_tokens=3 queue_ms=[\d.]+ "
                     r"ttft_ms=[\d.]+ total_ms=[\d.]+ finish_reason=length$", line), line
    assert f"request_id={made} " in server.log()


def test_access_log_in_json_form_covers_every_ending():
    server = Server("--log-format", "json", "--debug-step-delay-ms", "5")
    try:
        # Every line, not only the access log, is one JSON object.
        for line in server.log().splitlines():
            assert set(json.loads(line)) >= {"time", "level", "msg"}, line
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)
            stub.Generate(text_request("json ok", 4), timeout=60, metadata=[("x-request-id", "ok-1")])
            with pytest.raises(grpc.RpcError):
                stub.Generate(pb.GenerateRequest(text=""), timeout=60,
                              metadata=[("x-request-id", "bad-1")])
            stream = stub.GenerateStream(text_request("json cancel", 40, ignore_eos=True),
                                         timeout=60, metadata=[("x-request-id", "gone-1")])
            next(stream)
            stream.cancel()
            messages = list(stub.GenerateStream(text_request("json stream", 5, stop=["@@"]),
                                                timeout=60, metadata=[("x-request-id", "s-1")]))
            # A text field that is not UTF-8: libprotobuf's complaint goes
            # through the server's log too, not as plain text on stderr.
            for method in ("Generate", "Tokenize"):
                raw = channel.unary_unary(f"/switchserve.v1.Generation/{method}",
                                          request_serializer=None, response_deserializer=None)
                with pytest.raises(grpc.RpcError) as error:
                    raw(b"\x0a\x02\xff\xfe", timeout=60, metadata=[("x-request-id", "utf-1")])
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ok = wait_for_access_line(server, "ok-1")
        assert ok["protocol"] == "grpc" and ok["method"] == "Generate" and ok["status"] == "OK"
        assert ok["prompt_tokens"] == 7 and ok["completion_tokens"] == 4
        assert ok["finish_reason"] == "length"
        assert ok["total_ms"] >= ok["ttft_ms"] >= ok["queue_ms"] >= 0
        assert ok["peer"].startswith("ipv4:127.0.0.1:")
        bad = wait_for_access_line(server, "bad-1")
        assert bad["status"] == "INVALID_ARGUMENT" and bad["completion_tokens"] == 0
        assert bad["finish_reason"] == "" and "ttft_ms" not in bad
        gone = wait_for_access_line(server, "gone-1")
        assert gone["method"] == "GenerateStream" and gone["status"] == "CANCELLED"
        assert gone["finish_reason"] == "cancelled" and gone["completion_tokens"] < 40
        streamed = wait_for_access_line(server, "s-1")
        assert streamed["status"] == "OK" and streamed["completion_tokens"] == sum(
            len(m.token_ids) for m in messages)
        # Exactly one line per request.
        ids = [r["request_id"] for r in access_lines(server)]
        for request_id in ("ok-1", "bad-1", "gone-1", "s-1", "utf-1"):
            assert ids.count(request_id) == 1, ids
        records = [json.loads(line) for line in server.log().splitlines()]
        assert sum(r["msg"].startswith("protobuf: ") and r["level"] == "warning"
                   for r in records) == 2, records
    finally:
        server.close()


def peers_seen(max_age_args, calls, interval_s):
    """Makes `calls` calls, `interval_s` apart, over one channel; returns the
    client address (ip:port) the server logged for each."""
    server = Server("--log-format", "json", *max_age_args)
    try:
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)
            for i in range(calls):
                stub.Generate(text_request("age", 1), timeout=30,
                              metadata=[("x-request-id", f"age-{i}")])
                time.sleep(interval_s)
        return [wait_for_access_line(server, f"age-{i}")["peer"] for i in range(calls)]
    finally:
        server.close()


def test_max_connection_age_moves_a_long_lived_channel_to_new_connections():
    # One channel, calls over 3 s: with a 0.5 s maximum age the server sends
    # GOAWAY and the channel reconnects (a new client port) several times.
    peers = peers_seen(["--max-connection-age-s", "0.5"], calls=30, interval_s=0.1)
    assert len(set(peers)) >= 3, peers
    # Without a maximum age the same channel keeps its one connection.
    peers = peers_seen(["--max-connection-age-s", "0"], calls=30, interval_s=0.1)
    assert len(set(peers)) == 1, peers


def test_an_ipv6_host_serves_grpc_there_and_metrics_on_its_ipv4_counterpart():
    """The exporter listens on IPv4 only (Debian's civetweb): `--host ::1`
    serves gRPC on [::1] and the metrics on 127.0.0.1, and says so."""
    import socket
    from server_process import free_port
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    metrics_port = free_port()
    log_path = os.path.join(tempfile.mkdtemp(prefix="switchserve_v6_"), "server.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [BINARY, "serve", "--model", MODEL, "--host", "::1", "--port", "0", "--metrics-port",
             str(metrics_port), "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while (match := re.search(r"listening on \[::1\]:(\d+)", open(log_path).read())) is None:
            assert process.poll() is None and time.monotonic() < deadline, open(log_path).read()
            time.sleep(0.05)
        assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in open(log_path).read()
        channel = grpc.insecure_channel(f"[::1]:{match.group(1)}")
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert b"switchserve_requests_total" in r.read()
    finally:
        process.kill()
        process.wait()


def test_a_second_server_on_a_port_in_use_fails_to_start(server):
    """gRPC sets SO_REUSEPORT by default: a second server on the same port
    used to start and share it unseen with the first."""
    result = subprocess.run(
        [BINARY, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", str(server.port),
         "--metrics-port", "0", "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{server.port}" in result.stderr, result.stderr


def test_the_server_raises_its_open_file_limit():
    """Each connection takes a descriptor: started with a soft limit of 256
    (a common service default is 1024), the server raises it to the hard
    limit rather than refuse connections once it is reached."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit here is {hard}")
    log_path = os.path.join(tempfile.mkdtemp(prefix="switchserve_nofile_"), "server.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [BINARY, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
             "--metrics-port", "0", "--threads", "1"], stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    try:
        deadline = time.monotonic() + 120
        while "listening on" not in open(log_path).read():
            assert process.poll() is None and time.monotonic() < deadline, open(log_path).read()
            time.sleep(0.05)
        soft = resource.prlimit(process.pid, resource.RLIMIT_NOFILE)[0]
        assert soft == hard
        assert f"open files up to {hard}" in open(log_path).read()
    finally:
        process.kill()
        process.wait()


def test_grpc_cores_own_lines_follow_the_log_format():
    """gRPC core writes lines of its own (`Failed accept4: Too many open
    files`, ...): under --log-format json they are JSON like the rest."""
    log_path = os.path.join(tempfile.mkdtemp(prefix="switchserve_grpclog_"), "server.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [BINARY, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
             "--metrics-port", "0", "--threads", "1", "--log-format", "json"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, GRPC_VERBOSITY="debug"))
    try:
        deadline = time.monotonic() + 120
        while "listening on" not in open(log_path).read():
            assert process.poll() is None and time.monotonic() < deadline, open(log_path).read()
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait()
    records = [json.loads(line) for line in open(log_path).read().splitlines()]
    assert any(r["msg"].startswith("grpc: ") and "source" in r for r in records)


def call_with_header(port, name, value):
    """A Generate call over a hand-made HTTP/2 connection carrying a header
    the Python client would refuse to send (a newline, an ESC byte); the
    response's headers and trailers."""
    import socket
    import h2.config
    import h2.connection
    import h2.events
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                       normalize_outbound_headers=False)
    connection = h2.connection.H2Connection(config)
    headers = {}
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        connection.initiate_connection()
        open_raw_grpc_call(connection, 1, "Generate", text_request("x", 1), [(name, value)])
        s.sendall(connection.data_to_send())
        ended = False
        while not ended:
            data = s.recv(65536)
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers.update((k.decode(), v.decode()) for k, v in event.headers)
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            s.sendall(connection.data_to_send())
    return headers


def test_a_client_cannot_write_lines_or_control_characters_into_the_text_log():
    """gRPC core quotes a malformed grpc-encoding or grpc-timeout header in
    its error line: a newline there started a forged line of the client's
    making (an access-log line, say) and an ESC reached the terminal. Control
    characters are escaped, and gRPC's error lines are limited to 10 a
    second (the next one written says how many were dropped)."""
    forged = (b"2026-12-05T22:50:00.000Z switchserve: request request_id=forged-by-client "
              b"status=OK")
    s = Server()
    try:
        start = time.monotonic()
        calls = 20
        for _ in range(calls):
            call_with_header(s.port, b"grpc-encoding", b"x\n" + forged + b"\x1b[2K")
            call_with_header(s.port, b"grpc-timeout", b"12\nINJ\x1b[31m")
        elapsed = time.monotonic() - start
        time.sleep(1.1)  # a new second: the next error line counts the dropped ones
        call_with_header(s.port, b"grpc-timeout", b"12\nINJ")
        log = s.log()
    finally:
        s.close()
    lines = log.splitlines()
    errors = [line for line in lines if "grpc: Error parsing metadata" in line]
    assert errors, log
    assert "\x1b" not in log
    assert all(re.match(r"\d{4}-\d\d-\d\dT", line) for line in lines), log
    assert not any(line.startswith(("2026-12-05T22:50:00.000Z", "INJ")) for line in lines)
    assert any("value=x\\n2026-12-05T22:50:00.000Z switchserve: request "
               "request_id=forged-by-client status=OK\\u001b[2K" in line for line in errors), log
    # At most 10 a second: with 40 calls in under 3 s, fewer lines than calls.
    assert len(errors) <= 10 * (int(elapsed) + 2), (elapsed, len(errors))
    if elapsed < 1:
        assert len(errors) <= 11 and re.search(r" suppressed=\d+$", errors[-1]), errors
