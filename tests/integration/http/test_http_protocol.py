"""The HTTP API's HTTP/1.1: malformed and misrouted requests, heads, Expect,
HTTP/1.0 clients, chunked bodies, pipelining, keep-alive ages, TLS, and the
errors the HTTP layer answers itself (test_openai_http.py has the API)."""

import json
import os
import socket
import ssl
import subprocess
import tempfile
import time

import httpx

from http_harness import (MODEL, SOURCE_DIR, Server, completion_request, curl, grpc_generate,
                          raw_exchange, raw_exchange_streamed, read_responses)


def test_malformed_and_misrouted_requests(server):
    result = curl("-i", server.url + "/v1/completions", "-d", "{not json")
    assert result.stdout.startswith("HTTP/1.1 400")
    assert json.loads(result.stdout.split("\n\n", 1)[1])["error"]["param"] == "body"
    result = curl("-i", server.url + "/v1/completions")  # GET
    assert result.stdout.startswith("HTTP/1.1 405") and "allow: post" in result.stdout.lower()
    result = curl("-i", server.url + "/v1/chat/completions", "-d", "{}")
    assert result.stdout.startswith("HTTP/1.1 404") and "chat template" in result.stdout
    result = curl("-i", server.url + "/v1/completions", "-d",
                  json.dumps({"model": "gpt-4", "prompt": "x"}))
    assert result.stdout.startswith("HTTP/1.1 404") and "model" in result.stdout
    assert curl("-i", server.url + "/nowhere").stdout.startswith("HTTP/1.1 404")
    # Over --max-request-bytes (4 MiB): 413, before the body is read.
    big = os.path.join(server.dir, "big.json")
    with open(big, "w") as f:
        f.write(json.dumps({"prompt": "x" * (5 << 20)}))
    result = curl("-i", server.url + "/v1/completions", "--data-binary", "@" + big)
    assert result.stdout.startswith("HTTP/1.1 413"), result.stdout[:200]


def test_request_id_header_and_access_log(server):
    result = curl("-i", server.url + "/v1/completions", "-H", "x-request-id: curl-77", "-d",
                  json.dumps({"prompt": "hello", "max_tokens": 3, "temperature": 0}))
    assert result.stdout.startswith("HTTP/1.1 200")
    assert "x-request-id: curl-77" in result.stdout.lower()
    record = server.access_line("curl-77")
    assert record["protocol"] == "http" and record["method"] == "POST /v1/completions"
    assert record["status"] == "OK" and record["http_status"] == 200
    assert record["prompt_tokens"] == 5 and record["completion_tokens"] == 3
    assert record["finish_reason"] == "length" and record["peer"].startswith("ipv4:127.0.0.1:")
    result = curl("-i", server.url + "/v1/completions", "-H", "x-request-id: curl-78", "-d",
                  json.dumps({"prompt": "hello", "top_p": 9}))
    assert "x-request-id: curl-78" in result.stdout.lower()
    record = server.access_line("curl-78")
    assert record["status"] == "INVALID_ARGUMENT" and record["http_status"] == 400


def test_curl_sends_expect_100_continue_for_larger_bodies(server):
    # curl asks `Expect: 100-continue` for bodies over 1 KiB and waits up to
    # a second for the go-ahead; the server must give it at once.
    body = json.dumps({"prompt": "hi", "max_tokens": 2, "user": "u" * 2000})
    started = time.monotonic()
    result = curl("-i", "-H", "Expect: 100-continue", server.url + "/v1/completions", "-d", body)
    assert "HTTP/1.1 100 Continue" in result.stdout
    assert "HTTP/1.1 200" in result.stdout
    assert time.monotonic() - started < 0.9


def test_head_answers_no_body_and_odd_transfer_encodings_are_refused(server):
    """HEAD gets GET's headers and no body (a body would be read as the next
    response); a Transfer-Encoding other than chunked is 501, not framed by
    Content-Length instead (RFC 9112)."""
    answer = raw_exchange(server.http_port, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                          b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, rest = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: 15" in head
    assert rest.startswith(b"HTTP/1.1 200"), answer
    assert rest.endswith(b'{"status":"ready"}')
    for encoding in (b"xchunked", b"chunked, identity", b"gzip"):
        answer = raw_exchange(server.http_port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Transfer-Encoding: " + encoding + b"\r\nContent-Length: 0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 501"), (encoding, answer)


def test_lines_between_head_and_body_are_bounded(server):
    """A chunk's size line with its extensions, a chunk size of many zeros or
    the trailer fields: the parser buffered them until their end, without a
    limit (a client sent gigabytes to /health until the server ran out of
    memory). Past 64 KiB they are a malformed request."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    for start in (b"1;a=", b"000", b"0\r\nX-Trailer: "):
        filler = (b"a" if start != b"000" else b"0") * 8192
        answer = raw_exchange_streamed(server.http_port, [head, start] + [filler] * 16)
        assert answer.startswith(b"HTTP/1.1 400"), (start, answer[:200])
        assert b"buffer overflow" in answer, answer[:300]
    # Short extensions and trailers are still read.
    answer = raw_exchange(server.http_port, head + b"0;ext=1\r\nX-Trailer: t\r\n\r\n"
                          b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"status":"ready"}'), answer


def test_http_1_1_rules_for_host_expect_targets_and_heads(server):
    """RFC 9112 and 9110: an HTTP/1.1 request without Host is a 400; an
    expectation other than 100-continue a 417; a target in absolute form is
    served as its path; a head over 8 KiB a 431 (it was a 400), however long
    its request line."""
    answer = raw_exchange(server.http_port, b"GET /health HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"Host" in answer, answer
    answer = raw_exchange(server.http_port, b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 417"), answer
    target = f"http://127.0.0.1:{server.http_port}/v1/models".encode()
    answer = raw_exchange(server.http_port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and MODEL.encode() in answer, answer
    answer = raw_exchange(server.http_port, b"GET HTTP://x HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404"), answer  # "/": no such endpoint
    answer = raw_exchange(server.http_port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                          b"X-Big: " + b"b" * 9000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    # The request line and the fields count together, however they arrive: a
    # short request line and 8 KiB of fields sent at once were served (up to
    # 8,697 bytes), as Beast limits each of the two to 8 KiB.
    start = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
    for total, status in ((8192, b"200"), (8193, b"431"), (8243, b"431")):
        head = start + b"b" * (total - len(start) - 4) + b"\r\n\r\n"
        answer = raw_exchange(server.http_port, head)
        assert answer.startswith(b"HTTP/1.1 " + status), (total, answer[:200])


def test_an_http_1_0_client_gets_no_chunks_and_no_100_continue(server):
    """RFC 9112 6.1 and RFC 9110 10.1.1: a stream to an HTTP/1.0 client is
    its body until the connection closes, not chunks it cannot read; and it
    gets no 100 (Continue)."""
    body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    answer = raw_exchange(server.http_port, b"POST /v1/completions HTTP/1.0\r\nHost: x\r\n"
                          b"Expect: 100-continue\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    head, rest = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), answer
    assert b"100 Continue" not in answer and b"chunked" not in head.lower(), answer
    events = [line[len(b"data: "):] for line in rest.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]", rest
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == grpc_generate(server, "hello", max_new_tokens=4, temperature=0).text


def test_errors_the_http_server_answers_itself_are_counted_and_logged():
    """A completion refused by the HTTP layer (413 for a body over
    --max-request-bytes, 501 for a Transfer-Encoding it does not decode) gets
    its request id, an access-log line and its count, as the service's own
    refusals do; they once got none of the three."""
    server = Server("--max-request-bytes", "2000", metrics=True)
    try:
        body = json.dumps({"prompt": "x" * 3000}).encode()
        answer = raw_exchange(server.http_port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"x-request-id: big-1\r\nContent-Length: " + str(len(body)).encode()
                              + b"\r\n\r\n" + body)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"x-request-id: big-1" in answer.lower()
        record = server.access_line("big-1")
        assert record["status"] == "RESOURCE_EXHAUSTED" and record["http_status"] == 413
        answer = raw_exchange(server.http_port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"x-request-id: gzip-1\r\nTransfer-Encoding: gzip\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 501") and b"x-request-id: gzip-1" in answer.lower()
        record = server.access_line("gzip-1")
        assert record["status"] == "INVALID_ARGUMENT" and record["http_status"] == 501
        text = server.scrape_metrics()
        assert ('switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 1'
                in text)
        assert 'switchserve_requests_total{protocol="http",status="INVALID_ARGUMENT"} 1' in text
    finally:
        server.close()


def test_pipelined_requests_are_answered_in_order():
    """RFC 9112 9.3.2: requests sent before the previous response arrived are
    answered in order on the same connection. A request arriving while a
    response was pending closed the connection (a reset, no response), and the
    pending request ran on, logged 200."""
    server = Server("--debug-step-delay-ms", "10")
    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
            # Two in one write (read together), then more while the first runs
            # (20 tokens: 200 ms), one of them sent in two pieces, one larger
            # than the connection's 64 KiB buffer.
            s.sendall(completion_request("pipe-0", 20, ignore_eos=True) +
                      completion_request("pipe-1"))
            time.sleep(0.05)
            s.sendall(completion_request("pipe-2", stream=True))
            time.sleep(0.03)
            third = completion_request("pipe-3", pad=100000)
            s.sendall(third[:10])
            time.sleep(0.03)
            s.sendall(third[10:] + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            responses = read_responses(s, 5)
        assert [status for status, _, _ in responses] == [200] * 5
        assert [headers.get("x-request-id") for _, headers, _ in responses[:4]] == [
            "pipe-0", "pipe-1", "pipe-2", "pipe-3"]
        assert json.loads(responses[0][2])["usage"]["completion_tokens"] == 20
        assert b"data: [DONE]" in responses[2][2]
        assert json.loads(responses[4][2]) == {"status": "ok"}
        client = server.client()
        for index in (1, 3):
            alone = client.completions.create(model=MODEL, prompt=f"pipe-{index}", max_tokens=4,
                                              temperature=0)
            assert json.loads(responses[index][2])["choices"][0]["text"] == alone.choices[0].text
        for index in range(4):
            assert server.access_line(f"pipe-{index}")["status"] == "OK"
    finally:
        server.close()


def test_a_crlf_after_a_request_neither_ends_it_nor_hides_a_disconnect():
    """RFC 9112 2.2: an empty line before a request line is ignored. A CRLF
    sent after a request's body, while its response was pending, reset the
    connection at once; the request ran on uncancelled and was logged 200. A
    client that closes after sending such bytes still cancels its request."""
    server = Server("--debug-step-delay-ms", "40")
    try:
        for stream in (False, True):
            request_id = f"crlf-{stream}"
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
                s.sendall(completion_request(request_id, 15, ignore_eos=True, stream=stream))
                time.sleep(0.1)  # the first tokens are out
                s.sendall(b"\r\n")
                [(status, headers, body)] = read_responses(s, 1)
                assert status == 200 and headers["x-request-id"] == request_id
                if stream:
                    assert body.count(b"data: ") == 16 and b"data: [DONE]" in body
                else:
                    assert json.loads(body)["usage"]["completion_tokens"] == 15
                # The connection takes its next request, after another empty line.
                s.sendall(b"\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                [(status, _, body)] = read_responses(s, 1)
                assert status == 200 and json.loads(body) == {"status": "ok"}
            assert server.access_line(request_id)["status"] == "OK"
        for extra in (b"\r\n", b"\r\nGET /he"):
            request_id = f"crlf-gone-{len(extra)}"
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
                # 40 tokens take 1.6 s at 40 ms a step.
                s.sendall(completion_request(request_id, 40, ignore_eos=True))
                time.sleep(0.1)
                s.sendall(extra)
                time.sleep(0.1)
            record = server.access_line(request_id)
            assert record["status"] == "CANCELLED" and record["http_status"] == 499
            assert record["completion_tokens"] < 20
    finally:
        server.close()


def test_tls_with_the_grpc_certificate():
    directory = tempfile.mkdtemp(prefix="switchserve_certs_")
    subprocess.run([os.path.join(SOURCE_DIR, "tests/integration/make_test_certs.sh"), directory],
                   check=True)
    path = lambda name: os.path.join(directory, name)
    server = Server("--tls-cert", path("server.pem"), "--tls-key", path("server.key"),
                    scheme="https")
    try:
        client = server.client(
            http_client=httpx.Client(verify=ssl.create_default_context(cafile=path("ca.pem"))))
        assert client.completions.create(model=MODEL, prompt="tls", max_tokens=3).usage
        # TLS 1.2 with ECDHE and AEAD suites only, as the gRPC port: no CBC
        # or SHA-1 suites.
        def handshake(*cipher):
            return subprocess.run(
                ["openssl", "s_client", "-connect", f"127.0.0.1:{server.http_port}", "-tls1_2",
                 *cipher], input="", capture_output=True, text=True, timeout=30)
        assert handshake().returncode == 0
        for weak in ("ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA",
                     "ECDHE-ECDSA-AES128-SHA256:ECDHE-RSA-AES128-SHA256"):
            assert handshake("-cipher", weak).returncode != 0, weak
        raw = curl("--cacert", path("ca.pem"), "-N", server.url + "/v1/completions", "-d",
                   json.dumps({"prompt": "tls", "max_tokens": 3, "stream": True})).stdout
        assert raw.endswith("data: [DONE]\n\n")
        # Plain HTTP to the TLS port does not get through.
        assert curl(f"http://127.0.0.1:{server.http_port}/health", check=False).returncode != 0
    finally:
        server.close()


def test_keep_alive_connections_close_after_the_maximum_age():
    def peers(max_age):
        server = Server("--max-connection-age-s", max_age)
        try:
            closes = 0
            with httpx.Client(base_url=server.url) as http:  # one keep-alive pool
                for i in range(12):
                    response = http.post("/v1/completions", headers={"x-request-id": f"ka-{i}"},
                                         json={"prompt": "ka", "max_tokens": 1})
                    assert response.status_code == 200
                    closes += response.headers.get("connection") == "close"
                    time.sleep(0.1)
            return [server.access_line(f"ka-{i}")["peer"] for i in range(12)], closes
        finally:
            server.close()

    seen, closes = peers("0.3")
    assert len(set(seen)) >= 2 and closes >= 1, seen
    seen, closes = peers("0")
    assert len(set(seen)) == 1 and closes == 0, seen


def headers_of(curl_output):
    """The status line's code and the lower-cased headers of `curl -i`'s
    output (the last response's head, after any 100 Continue)."""
    head = curl_output.replace("\r\n", "\n").split("\n\n")
    head = [h for h in head if h.startswith("HTTP/")][-1].split("\n")
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(head[0].split()[1]), fields


def test_cors_for_the_allowed_origins_only():
    """--allowed-origins: a page from an allowed origin gets
    Access-Control-Allow-Origin on every answer (a refusal of its token
    too), and its preflight a 204 from the server, without a token; another
    origin gets no CORS headers, and its OPTIONS goes to the API (which
    refuses it). Without the flag, no CORS headers at all."""
    token_file = os.path.join(tempfile.mkdtemp(prefix="switchserve_token_"), "token")
    with open(token_file, "w") as f:
        f.write("cors-token\n")
    allowed, other = "https://app.example.com", "https://evil.example"
    body = json.dumps({"prompt": "hello", "max_tokens": 2, "temperature": 0})
    server = Server("--auth-token-file", token_file, "--allowed-origins",
                    f"{allowed}, http://localhost:3000")
    plain = Server("--allowed-origins", "*")
    try:
        def ask(srv, *args):
            return headers_of(curl("-i", *args).stdout)

        preflight = ("-X", "OPTIONS", server.url + "/v1/completions", "-H",
                     "access-control-request-method: POST", "-H",
                     "access-control-request-headers: authorization, content-type")
        status, head = ask(server, *preflight, "-H", f"origin: {allowed}")
        assert status == 204, head
        assert head["access-control-allow-origin"] == allowed
        assert "POST" in head["access-control-allow-methods"]
        assert head["access-control-allow-headers"] == "authorization, content-type"
        assert head["vary"] == "Origin"
        assert "content-length" not in head  # a 204 has none (RFC 9110 8.6)
        status, head = ask(server, *preflight, "-H", f"origin: {other}")
        assert status == 401 and "access-control-allow-origin" not in head

        post = ("-X", "POST", server.url + "/v1/completions", "-H",
                "content-type: application/json", "-d", body)
        status, head = ask(server, *post, "-H", "authorization: Bearer cors-token", "-H",
                           f"origin: {allowed}")
        assert status == 200 and head["access-control-allow-origin"] == allowed
        assert head["access-control-expose-headers"] == "x-request-id"
        status, head = ask(server, *post, "-H", f"origin: {allowed}")
        assert status == 401 and head["access-control-allow-origin"] == allowed
        status, head = ask(server, *post, "-H", "authorization: Bearer cors-token", "-H",
                           f"origin: {other}")
        assert status == 200 and "access-control-allow-origin" not in head
        status, head = ask(server, *post, "-H", "authorization: Bearer cors-token")
        assert status == 200 and "access-control-allow-origin" not in head
        # A stream's head, and "*" for every origin.
        status, head = ask(plain, "-N", "-X", "POST", plain.url + "/v1/completions", "-H",
                           f"origin: {other}", "-d",
                           json.dumps({"prompt": "hello", "max_tokens": 2, "stream": True}))
        assert status == 200 and head["access-control-allow-origin"] == "*"
        assert "vary" not in head
    finally:
        server.close()
        plain.close()


def test_no_cors_headers_without_allowed_origins(server):
    status, head = headers_of(curl("-i", server.url + "/v1/models", "-H",
                                   "origin: https://app.example.com").stdout)
    assert status == 200 and "access-control-allow-origin" not in head
    status, head = headers_of(curl("-i", "-X", "OPTIONS", server.url + "/v1/models", "-H",
                                   "origin: https://app.example.com", "-H",
                                   "access-control-request-method: GET").stdout)
    assert status == 405 and "access-control-allow-origin" not in head
