"""The gRPC server itself: TLS and mTLS, bearer tokens, request ids and the
access log (text and JSON), connection ages, IPv6, ports in use, the
open-file limit, and what clients can and cannot put into its log."""

import json
import os
import re
import subprocess
import tempfile
import time

import grpc
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
import health_pb2
import health_pb2_grpc
from grpc_harness import (BINARY, MODEL, SOURCE_DIR, Server, access_lines, text_request, tokenize,
                          wait_for_access_line)
from raw_grpc import raw_grpc_call


def make_certs():
    directory = tempfile.mkdtemp(prefix="switchserve_certs_")
    subprocess.run([os.path.join(SOURCE_DIR, "tests/integration/make_test_certs.sh"), directory],
                   check=True)
    read = lambda name: open(os.path.join(directory, name), "rb").read()
    return directory, read


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
            raw_grpc_call(s.port, "Generate", text_request("x", 1),
                          [(b"grpc-encoding", b"x\n" + forged + b"\x1b[2K")],
                          validate_headers=False)
            raw_grpc_call(s.port, "Generate", text_request("x", 1),
                          [(b"grpc-timeout", b"12\nINJ\x1b[31m")], validate_headers=False)
        elapsed = time.monotonic() - start
        time.sleep(1.1)  # a new second: the next error line counts the dropped ones
        raw_grpc_call(s.port, "Generate", text_request("x", 1), [(b"grpc-timeout", b"12\nINJ")],
                      validate_headers=False)
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
