"""What the HTTP API's tests share: the server process with the HTTP API on
a free port (`Server`; conftest.py makes the module-scoped `server` and
`client` fixtures of it), and helpers that speak HTTP/1.1 over raw sockets,
read the metrics and wait for the server's state."""

import json
import os
import socket
import subprocess
import time

import openai

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from server_process import ServerProcess, free_port


BINARY = os.environ["SWITCHSERVE_BINARY"]
SOURCE_DIR = os.environ["SWITCHSERVE_SOURCE_DIR"]
MODEL_DIR = os.path.join(SOURCE_DIR, "tests/golden/switchall_f16")
MODEL = "switchall_f16"  # its config's name: the served model name


class Server(ServerProcess):
    """`switchserve serve` with the HTTP API on a free port and JSON logs."""

    def __init__(self, *extra_args, scheme="http", metrics=False, model_dir=MODEL_DIR):
        self.http_port = free_port()
        super().__init__(BINARY, model_dir, "--http-port", str(self.http_port), "--log-format",
                         "json", *extra_args, metrics_port=free_port() if metrics else 0,
                         prefix="switchserve_http_")
        self.url = f"{scheme}://127.0.0.1:{self.http_port}"

    def client(self, **kwargs):
        kwargs.setdefault("api_key", "unused")
        # No retries: the tests look at every status the server answers.
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=60, **kwargs)

    def grpc_stub(self):
        return pb_grpc.GenerationStub(self.channel())

    def access_line(self, request_id, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log().splitlines():
                record = json.loads(line)
                if record["msg"] == "request" and record["request_id"] == request_id:
                    return record
            time.sleep(0.02)
        raise AssertionError(f"no access-log line for {request_id}:\n{self.log()}")


def curl(*args, check=True):
    result = subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def grpc_generate(server, text, **sampling):
    request = pb.GenerateRequest(text=text, sampling=pb.SamplingParams(**sampling))
    return server.grpc_stub().Generate(request, timeout=60)


def raw_exchange(port, data):
    """Sends `data` on one connection and returns everything the server
    answers until it closes the connection (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
        except socket.timeout:
            pass
        return received


def raw_exchange_streamed(port, pieces):
    """Sends `pieces` one after another on one connection, and returns what
    the server answers until it closes the connection (or 5 s pass); the
    server may answer and close before every piece is sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            for piece in pieces:
                s.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return received


def wait_until(what, predicate, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def cache(server):
    return server.grpc_stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=10).cache


def metric(text, series):
    """The value of one series (name and labels as exposed) in a scrape."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {series} in the scrape:\n{text}")


def read_to_end(s):
    s.settimeout(30)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def completion_request(request_id, max_tokens=4, extra_head=b"", pad=0, **fields):
    """A raw POST /v1/completions for the prompt `request_id`, its JSON body
    padded with `pad` spaces."""
    body = json.dumps({"prompt": request_id, "max_tokens": max_tokens, "temperature": 0,
                       **fields}).encode()
    body = body[:-1] + b" " * pad + b"}"
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: " + request_id.encode() +
            b"\r\n" + extra_head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" +
            body)


def read_responses(s, count):
    """Reads `count` responses from `s`, each (status, headers with lower-case
    names, body): framed by Content-Length, or chunked (the body then as it
    was sent, chunk lines and all)."""
    data, responses = b"", []
    while len(responses) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            headers = {name.strip().lower(): value.strip()
                       for name, value in (line.split(":", 1) for line in lines[1:])}
            if headers.get("transfer-encoding") == "chunked":
                body_end = data.find(b"\r\n0\r\n\r\n", end) + 7 if b"\r\n0\r\n\r\n" in data[end:] \
                    else -1
            else:
                body_end = end + 4 + int(headers.get("content-length", 0))
                body_end = body_end if len(data) >= body_end else -1
            if body_end >= 0:
                responses.append((int(lines[0].split()[1]), headers, data[end + 4:body_end]))
                data = data[body_end:]
                continue
        chunk = s.recv(65536)
        assert chunk, f"the connection ended after {len(responses)} responses: {data[:200]!r}"
        data += chunk
    return responses


def raw_health(connection):
    """GET /health on an open socket (keep-alive): the status line, or b""
    when the server closed the connection without answering."""
    connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    try:
        while b'"ok"}' not in data:
            chunk = connection.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    return data.split(b"\r\n", 1)[0]


def grpc_health(server):
    """`switchserve health` against `server`: its exit code and output."""
    result = subprocess.run([BINARY, "health", "--address", server.address, "--timeout-s", "5"],
                            capture_output=True, text=True, timeout=30)
    return result.returncode, (result.stdout + result.stderr).strip()
