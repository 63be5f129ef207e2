"""What the gRPC API's tests share: the server process on a free loopback
port (`Server`; conftest.py makes the module-scoped `server` and `stub`
fixtures of it), requests, and waits for the server's state, its metrics
and its log."""

import json
import os
import re
import time

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from server_process import ServerProcess


BINARY = os.environ["SWITCHSERVE_BINARY"]
SOURCE_DIR = os.environ["SWITCHSERVE_SOURCE_DIR"]
MODEL = os.path.join(SOURCE_DIR, "tests/golden/switchall_f16")
CONTEXT = 64


class Server(ServerProcess):
    def __init__(self, *extra_args, model=MODEL, metrics_port=0):
        super().__init__(BINARY, model, *extra_args, metrics_port=metrics_port,
                         prefix="switchserve_py_")


def text_request(text, max_new_tokens, temperature=0.0, **kwargs):
    return pb.GenerateRequest(
        text=text,
        sampling=pb.SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                   **kwargs))


def stall_request(max_new_tokens):
    """A request whose answer is large (20 logprobs and the routing of every
    token), for a client that reads nothing; EOS ignored."""
    request = text_request("stall", max_new_tokens, ignore_eos=True)
    request.logprobs = 20
    request.return_routing = True
    return request


def expect_good_request_works(stub):
    response = stub.Generate(text_request("still alive?", 5), timeout=60)
    assert len(response.token_ids) == 5


def metric(text, series):
    match = re.search("^" + re.escape(series) + r" (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for_idle_engine(server, counted=()):
    """The metrics once no request runs, no KV block is held and every
    (series, value) of `counted` reads its value (or after 10 s). A call's
    status is counted when its reactor finishes it, which can come after its
    client has the status and after the engine let go of the request."""
    deadline = time.monotonic() + 10
    while True:
        text = server.scrape_metrics()
        if (metric(text, "switchserve_requests_running") == 0
                and metric(text, "switchserve_kv_cache_usage_ratio") == 0
                and all(metric(text, series) == value for series, value in counted)) or \
                time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def wait_for_output_given_back(server):
    """Waits until no output is held for clients (switchserve_output_buffer_bytes
    0; a call gives back its hold once gRPC is done with it), or 10 s: the
    value then."""
    deadline = time.monotonic() + 10
    while True:
        held = metric(server.scrape_metrics(), "switchserve_output_buffer_bytes")
        if held == 0 or time.monotonic() > deadline:
            return held
        time.sleep(0.01)


def stream_log_lines(server, count, method="GenerateStream"):
    """The access-log lines of `method` calls, once there are `count` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        calls = [json.loads(line) for line in server.log().splitlines()
                 if f'"method":"{method}"' in line]
        if len(calls) >= count or time.monotonic() > deadline:
            return calls
        time.sleep(0.05)


def expect_good_request_works_at(server):
    with server.channel() as channel:
        expect_good_request_works(pb_grpc.GenerationStub(channel))


def wait_for_idle_cache(stub):
    for _ in range(1000):
        cache = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).cache
        if cache.used_blocks == 0 and cache.running_requests == 0 and cache.waiting_requests == 0:
            return cache
        time.sleep(0.01)
    raise AssertionError(f"KV blocks still in use: {cache}")


def tokenize(channel, metadata=None):
    return pb_grpc.GenerationStub(channel).Tokenize(pb.TokenizeRequest(text="hi"), timeout=10,
                                                    metadata=metadata)


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
