"""The OpenAI-compatible HTTP API (--http-port) against the real server
process, driven by the official `openai` Python client and by curl, and
compared with the gRPC API (the same engine must give the same tokens).

Runs on build/venv (scripts/install-test-tools.sh: Debian's python3 with
grpcio, plus the pinned `openai` client)."""

import collections
import concurrent.futures
import contextlib
import json
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import tempfile
import time

import httpx
import openai
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from raw_grpc import stalled_streams
from server_process import ServerProcess, free_port

BINARY = os.environ["SWITCHSERVE_BINARY"]
SOURCE_DIR = os.environ["SWITCHSERVE_SOURCE_DIR"]
MODEL_DIR = os.path.join(SOURCE_DIR, "tests/golden/switchall_f16")
MODEL = "switchall_f16"  # its config's name: the served model name
CONTEXT = 64


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


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def curl(*args, check=True):
    result = subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def grpc_generate(server, text, **sampling):
    request = pb.GenerateRequest(text=text, sampling=pb.SamplingParams(**sampling))
    return server.grpc_stub().Generate(request, timeout=60)


def test_models_health_and_ready(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert json.loads(curl(server.url + "/health").stdout) == {"status": "ok"}
    assert json.loads(curl(server.url + "/ready").stdout) == {"status": "ready"}


def test_completion_is_the_grpc_completion(server, client):
    completion = client.completions.create(model=MODEL, prompt="And God said", max_tokens=12,
                                           temperature=0)
    expected = grpc_generate(server, "And God said", max_new_tokens=12, temperature=0)
    assert completion.object == "text_completion" and completion.model == MODEL
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.text == expected.text and choice.index == 0
    assert choice.finish_reason == "length"
    assert completion.usage.prompt_tokens == 12 and completion.usage.completion_tokens == 12
    assert completion.usage.total_tokens == 24
    assert completion.id.startswith("cmpl-")


def test_default_max_tokens_is_openais_16(client):
    completion = client.completions.create(model=MODEL, prompt="x", temperature=0,
                                           extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 16


def test_eos_finishes_with_stop_unless_ignored(server, tmp_path):
    # The test model declares no EOS token; served with one of the tokens of
    # its greedy continuation as its EOS, a completion ends at that token with
    # finish_reason "stop", as gRPC ends with FINISH_REASON_EOS.
    ids = list(grpc_generate(server, "eos test", max_new_tokens=20, temperature=0).token_ids)
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        config = dict(json.load(f), eos_token_id=ids[5])
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(os.path.join(MODEL_DIR, "model.safetensors"))
    eos_server = Server(model_dir=str(tmp_path))
    try:
        eos_client, ask = eos_server.client(), dict(model=MODEL, prompt="eos test", max_tokens=20,
                                                     temperature=0)
        want = grpc_generate(eos_server, "eos test", max_new_tokens=20, temperature=0)
        assert want.finish_reason == pb.FINISH_REASON_EOS
        assert list(want.token_ids) == ids[:ids.index(ids[5]) + 1]
        ended = eos_client.completions.create(**ask)
        assert ended.choices[0].finish_reason == "stop" and ended.choices[0].text == want.text
        assert ended.usage.completion_tokens == len(want.token_ids)
        chunks = [c for c in eos_client.completions.create(**ask, stream=True) if c.choices]
        assert chunks[-1].choices[0].finish_reason == "stop"
        ignoring = eos_client.completions.create(**ask, extra_body={"ignore_eos": True})
        assert ignoring.choices[0].finish_reason == "length"
        assert ignoring.usage.completion_tokens == 20
    finally:
        eos_server.close()


def test_stream_ends_with_done_and_equals_unary(server, client):
    kwargs = dict(model=MODEL, prompt="The experts say", max_tokens=20, temperature=0.9, seed=5)
    unary = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) >= 2
    assert "".join(c.choices[0].text for c in text_chunks) == unary.choices[0].text
    assert [c.choices[0].finish_reason for c in text_chunks[:-1]] == [None] * (len(text_chunks) - 1)
    assert text_chunks[-1].choices[0].finish_reason == unary.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        unary.usage.completion_tokens
    # The raw stream: server-sent events, the last one `data: [DONE]`.
    raw = curl("-N", server.url + "/v1/completions", "-H", "content-type: application/json",
               "-d", json.dumps({**kwargs, "stream": True})).stdout
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == \
        unary.choices[0].text


def test_stream_interval_groups_tokens_after_the_first():
    grouping = Server("--stream-interval", "4")
    try:
        client = grouping.client()
        kwargs = dict(model=MODEL, prompt="The experts say", max_tokens=30, temperature=0.9, seed=7,
                      logprobs=0, extra_body={"ignore_eos": True})
        unary = client.completions.create(**kwargs)
        chunks = [c for c in client.completions.create(stream=True, **kwargs) if c.choices]
        assert "".join(c.choices[0].text for c in chunks) == unary.choices[0].text
        sizes = [len(c.choices[0].logprobs.tokens) for c in chunks]
        # 1, then 4 at a time (7 events), the last token with the end.
        assert sizes == [1] + [4] * 7 + [1]
        assert chunks[-1].choices[0].finish_reason == "length"
        # Each event's logprobs continue the last one's: the same tokens and
        # text offsets as the unary answer.
        for field in ("token_logprobs", "tokens", "text_offset"):
            streamed = [v for c in chunks for v in getattr(c.choices[0].logprobs, field)]
            assert streamed == getattr(unary.choices[0].logprobs, field), field
    finally:
        grouping.close()


def test_stop_string(server, client):
    reference = client.completions.create(model=MODEL, prompt="stop test", max_tokens=20,
                                          temperature=0, extra_body={"ignore_eos": True})
    text = reference.choices[0].text
    stop = text[6:8]
    stopped = client.completions.create(model=MODEL, prompt="stop test", max_tokens=20,
                                        temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[:text.find(stop)]
    streamed = client.completions.create(model=MODEL, prompt="stop test", max_tokens=20,
                                         temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == stopped.choices[0].text


def test_seed_reproducibility(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="In the beginning", max_tokens=24,
                                         temperature=3.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text
    assert sample(1234) == sample(1234)
    assert len({sample(s) for s in range(5)}) > 1  # the seed matters


def test_logprobs_are_the_grpc_logprobs(server, client):
    completion = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=6,
                                           temperature=0, logprobs=3)
    logprobs = completion.choices[0].logprobs
    request = pb.GenerateRequest(text="Hello there", logprobs=3,
                                 sampling=pb.SamplingParams(max_new_tokens=6, temperature=0))
    expected = server.grpc_stub().Generate(request, timeout=60)
    assert len(logprobs.tokens) == len(expected.tokens) == 6
    assert logprobs.token_logprobs == pytest.approx([t.logprob for t in expected.tokens],
                                                    rel=1e-6)
    for top, token in zip(logprobs.top_logprobs, expected.tokens):
        assert len(top) <= 3
        assert sorted(top.values(), reverse=True) == pytest.approx(
            [t.logprob for t in token.top_logprobs][:len(top)], rel=1e-6)
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    no_logprobs = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=6,
                                            temperature=0)
    assert no_logprobs.choices[0].logprobs is None
    # "logprobs": 0: each token's own logprob, no alternatives.
    own = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=6,
                                    temperature=0, logprobs=0).choices[0].logprobs
    assert own.token_logprobs == pytest.approx(logprobs.token_logprobs, rel=1e-6)
    assert all(not top for top in own.top_logprobs or [])


def test_return_tokens_as_token_ids_names_every_token_by_its_id(server, client):
    request = pb.GenerateRequest(text="Hello there", logprobs=3,
                                 sampling=pb.SamplingParams(max_new_tokens=6, temperature=0))
    expected = server.grpc_stub().Generate(request, timeout=60)
    for stream in (False, True):
        response = client.completions.create(
            model=MODEL, prompt="Hello there", max_tokens=6, temperature=0, logprobs=3,
            stream=stream, extra_body={"return_tokens_as_token_ids": True})
        choices = list(response) if stream else [response]
        tokens = [t for c in choices for t in c.choices[0].logprobs.tokens]
        tops = [t for c in choices for t in c.choices[0].logprobs.top_logprobs]
        assert tokens == [f"token_id:{t.token_id}" for t in expected.tokens]
        assert [list(top) for top in tops] == [
            [f"token_id:{a.token_id}" for a in t.top_logprobs] for t in expected.tokens]


def test_token_prompt_and_batch_of_prompts(client):
    one = client.completions.create(model=MODEL, prompt="hi", max_tokens=5, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=5,
                                       temperature=0)
    assert by_ids.choices[0].text == one.choices[0].text
    # Whole floats are integers in lists too, as in max_tokens (pydantic's lax mode).
    by_ints, by_floats = (
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                  extra_body={"stop_token_ids": stop_ids})
        for prompt, stop_ids in (([104, 105], [101, 32]), ([104.0, 105], [101.0, 32])))
    assert by_floats.choices[0].text == by_ints.choices[0].text
    assert by_floats.choices[0].finish_reason == by_ints.choices[0].finish_reason
    assert by_floats.usage == by_ints.usage
    two = client.completions.create(model=MODEL, prompt="yo", max_tokens=5, temperature=0)
    batch = client.completions.create(model=MODEL, prompt=["hi", "yo"], max_tokens=5,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == [one.choices[0].text, two.choices[0].text]
    assert batch.usage.prompt_tokens == 4 and batch.usage.completion_tokens == 10
    streamed = {}
    for chunk in client.completions.create(model=MODEL, prompt=[[104, 105], "yo"], max_tokens=5,
                                           temperature=0, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {0: one.choices[0].text, 1: two.choices[0].text}


BAD_BODIES = [
    ("max_tokens over context", {"prompt": "x", "max_tokens": 64}, "max_tokens"),
    ("max_tokens zero", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("max_tokens not integer", {"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ("negative temperature", {"prompt": "x", "temperature": -1}, "temperature"),
    ("temperature string", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("top_p above one", {"prompt": "x", "top_p": 1.5}, "top_p"),
    ("n above one", {"prompt": "x", "n": 2}, "n"),
    ("best_of", {"prompt": "x", "best_of": 3}, "best_of"),
    ("echo", {"prompt": "x", "echo": True}, "echo"),
    ("presence penalty", {"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ("logit bias", {"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ("suffix", {"prompt": "x", "suffix": "end"}, "suffix"),
    ("too many logprobs", {"prompt": "x", "logprobs": 50}, "logprobs"),
    ("too many stops", {"prompt": "x", "stop": [str(i) for i in range(17)]}, "stop"),
    ("stop not string", {"prompt": "x", "stop": 5}, "stop"),
    ("no prompt", {"max_tokens": 3}, "prompt"),
    ("empty prompt", {"prompt": ""}, "prompt"),
    ("prompt longer than context", {"prompt": "a" * 80}, "prompt"),
    ("token outside vocabulary", {"prompt": [1, 256]}, "prompt"),
    ("token id not integer", {"prompt": [1, 2.5]}, "prompt"),
    ("stop token id not integer", {"prompt": "x", "stop_token_ids": [2.5]}, "stop_token_ids"),
    ("bad second prompt", {"prompt": ["ok", ""]}, "prompt[1]"),
    ("unknown field", {"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("stop token outside vocabulary", {"prompt": "x", "stop_token_ids": [999]},
     "stop_token_ids"),
]


@pytest.mark.parametrize("name,body,param", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_field_is_400_naming_the_param(server, client, name, body, param):
    # The client's raw post: some of these fields are not in its signature.
    with pytest.raises(openai.BadRequestError) as error:
        client.post("/completions", body={"model": MODEL, **body}, cast_to=httpx.Response)
    assert error.value.status_code == 400
    details = error.value.body
    assert details["param"] == param, details
    assert details["message"].startswith(param + ": "), details
    assert details["type"] == "invalid_request_error" and details["code"] == "invalid_argument"
    # The server keeps serving.
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage.total_tokens


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


def test_a_wrong_model_is_named_shortened(server):
    """A model name is shown at most 64 bytes long, as every other value a
    client sent (a 3 MB name came back whole)."""
    result = curl("-i", server.url + "/v1/completions", "-d",
                  json.dumps({"prompt": "x", "model": "m" * 100000}))
    assert result.stdout.startswith("HTTP/1.1 404") and len(result.stdout) < 2000, \
        result.stdout[:300]
    assert "m" * 64 + "..." in result.stdout
    result = curl("-i", server.url + "/v1/models/" + "m" * 4000)
    assert result.stdout.startswith("HTTP/1.1 404") and len(result.stdout) < 2000


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


def test_bearer_token():
    token_file = os.path.join(tempfile.mkdtemp(prefix="switchserve_token_"), "token")
    with open(token_file, "w") as f:
        f.write("http-token\n")
    server = Server("--auth-token-file", token_file, metrics=True)
    try:
        for key in ("nope", ""):
            with pytest.raises(openai.AuthenticationError) as error:
                server.client(api_key=key).completions.create(
                    model=MODEL, prompt="x", max_tokens=2,
                    extra_headers={"x-request-id": f"refused-{key}"})
            assert error.value.status_code == 401
            assert error.value.body["code"] == "unauthenticated"
            # Counted and logged as a request, as gRPC's refusals are.
            assert server.access_line(f"refused-{key}")["status"] == "UNAUTHENTICATED"
        text = server.scrape_metrics()
        assert re.search(r'switchserve_requests_total\{protocol="http",status="UNAUTHENTICATED"\} 2\n',
                         text), text
        result = curl("-i", server.url + "/v1/models")
        assert result.stdout.startswith("HTTP/1.1 401")
        # Refused at its head, before its body: no `100 Continue`, and a
        # body announced and never sent is not waited for.
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 4000000\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 401")
        good = server.client(api_key="http-token")
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).usage
        assert [m.id for m in good.models.list().data] == [MODEL]
        # Probes need no token.
        assert curl(server.url + "/health").stdout and curl(server.url + "/ready").stdout
    finally:
        server.close()


def wait_until(what, predicate, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def cache(server):
    return server.grpc_stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=10).cache


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


def metric(text, series):
    """The value of one series (name and labels as exposed) in a scrape."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {series} in the scrape:\n{text}")


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



def stalled_stream(server, request_id, prompts, max_tokens=55):
    """A socket that sends one streamed completion (`prompts` prompts with 20
    logprobs each: a few kilobytes an event, 64 prompts making more than the
    socket buffers could take) and then reads nothing, with a receive buffer
    of 4 KiB, so that the server's writes soon wait."""
    body = json.dumps({"prompt": ["stall"] * prompts, "max_tokens": max_tokens, "logprobs": 20,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.http_port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: " +
              request_id.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    return s


def read_to_end(s):
    s.settimeout(30)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def stream_ended_lines(server):
    return {r["request_id"]: r["why"] for r in map(json.loads, server.log().splitlines())
            if r["msg"] == "stream ended"}


def test_a_stream_whose_client_reads_nothing_ends_past_its_buffer_limit():
    """A streamed completion's events piled up, unbounded, for a client that
    read nothing (a kilobyte and more a token with logprobs, every one the
    engine made until the 60 s write timeout). Past --max-stream-buffer-bytes
    the server closes the connection (the stream ends without its last chunk),
    cancels the request, and logs and counts it RESOURCE_EXHAUSTED."""
    server = Server("--max-stream-buffer-bytes", "65536", metrics=True)
    try:
        with stalled_stream(server, "stalled", prompts=64) as s:
            record = server.access_line("stalled")
            assert (record["status"], record["http_status"]) == ("RESOURCE_EXHAUSTED", 429)
            # Ended early: 64 prompts of 55 tokens would have made 3520.
            assert record["finish_reason"] == "cancelled" and record["completion_tokens"] < 3520
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


def test_a_stream_whose_last_event_is_past_its_buffer_limit_is_counted_as_ended():
    """A stream's last events were rendered after the request had been
    logged and counted: when they did not fit in --max-stream-buffer-bytes
    the client got neither them nor [DONE], while the access log and
    switchserve_requests_total said OK, 200. The request is now logged when
    its last events reach its connection: RESOURCE_EXHAUSTED, 429, after
    the `stream ended` warning."""
    server = Server("--max-stream-buffer-bytes", "1024", "--stream-interval", "1000",
                    metrics=True)
    try:
        # One event of 40 tokens with 20 logprobs each (after the first
        # token's own): tens of kilobytes, past 1024 bytes at once.
        body = json.dumps({"prompt": "last", "max_tokens": 40, "logprobs": 20, "stream": True,
                           "ignore_eos": True}).encode()
        with socket.create_connection(("127.0.0.1", server.http_port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-request-id: last\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            data = read_to_end(s)
        assert data.startswith(b"HTTP/1.1 200") and b"[DONE]" not in data
        assert not data.endswith(b"\r\n0\r\n\r\n")
        record = server.access_line("last")
        assert (record["status"], record["http_status"]) == ("RESOURCE_EXHAUSTED", 429)
        assert record["completion_tokens"] == 40
        assert "passed 1024 bytes" in stream_ended_lines(server)["last"]
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="RESOURCE_EXHAUSTED"} 1\n' in text
        assert 'switchserve_requests_total{protocol="http",status="OK"} 0\n' in text
        # A stream that fits is logged OK once, and its client gets [DONE].
        chunks = list(server.client().completions.create(model=MODEL, prompt="ok", max_tokens=3,
                                                         stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        text = server.scrape_metrics()
        assert 'switchserve_requests_total{protocol="http",status="OK"} 1\n' in text
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
                    "--log-format", "json", metrics=True)
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
        with stalled_stream(server, "stalled", prompts=64) as s:
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


def test_http_requests_in_the_metrics():
    server = Server(metrics=True)
    try:
        client = server.client()
        for _ in range(2):
            client.completions.create(model=MODEL, prompt="count me", max_tokens=4,
                                      extra_body={"ignore_eos": True})
        first = grpc_generate(server, "stop", max_new_tokens=1, temperature=0).token_ids[0]
        stopped = client.completions.create(model=MODEL, prompt="stop", max_tokens=30,
                                            temperature=0, extra_body={"stop_token_ids": [first]})
        assert stopped.choices[0].finish_reason == "stop"
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="x", top_p=7)
        with pytest.raises(openai.NotFoundError):  # another model's name
            client.completions.create(model="gpt-4", prompt="x")
        # One request of three prompts: one request, three generations.
        assert len(client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=2,
                                             extra_body={"ignore_eos": True}).choices) == 3
        grpc_generate(server, "grpc", max_new_tokens=2)
        text = server.scrape_metrics()
        value = lambda series: float(re.search(re.escape(series) + r" (\S+)", text).group(1))
        assert value('switchserve_requests_total{protocol="http",status="OK"}') == 4
        assert value('switchserve_requests_total{protocol="http",status="INVALID_ARGUMENT"}') == 1
        assert value('switchserve_requests_total{protocol="http",status="NOT_FOUND"}') == 1
        assert value('switchserve_requests_total{protocol="http",status="UNKNOWN"}') == 0
        assert value('switchserve_requests_total{protocol="grpc",status="OK"}') == 2
        assert value('switchserve_request_finish_reason_total{reason="length"}') == 4 + 3
        assert value('switchserve_request_finish_reason_total{reason="stop"}') == 1
        assert value("switchserve_request_generation_tokens_sum") == 4 + 4 + 1 + 1 + 2 + 3 * 2
        assert value("switchserve_request_prompt_tokens_count") == 5 + 3
        assert re.search(r'switchserve_model_info\{.*model="switchall_f16".*\} 1', text)
        assert 'device="cpu"' in re.search(r"switchserve_model_info\{.*\}", text).group(0)
        assert 'kv_cache_dtype="f32"' in re.search(r"switchserve_model_info\{.*\}", text).group(0)
    finally:
        server.close()


def test_metrics_start_from_zero_after_the_warm_up():
    """The server's own warm-up request runs before it reports SERVING and is
    in no metric: a fresh server's step, token and MoE counters read zero, and
    after one request they hold that request's tokens exactly."""
    server = Server(metrics=True)
    try:
        def series(text, name):
            return [float(v) for v in re.findall(r"^" + name + r"(?:\{[^}]*\})? (\S+)$", text, re.M)]

        text = server.scrape_metrics()
        for name in ["switchserve_step_duration_seconds_count", "switchserve_step_tokens_sum",
                     "switchserve_prompt_tokens_total", "switchserve_generation_tokens_total"]:
            assert series(text, name) == [0.0], name
        routers = series(text, "switchserve_moe_router_tokens_total")
        assert routers and set(routers) == {0.0}
        assert set(series(text, "switchserve_moe_assignments_total")) == {0.0}
        assert set(series(text, "switchserve_moe_aux_loss")) == {0.0}

        response = grpc_generate(server, "abc", max_new_tokens=3, temperature=0, ignore_eos=True)
        assert response.usage.prompt_tokens == 3
        # The engine records a step after handing out its tokens: the last
        # step may reach the metrics just after the response.
        deadline = time.monotonic() + 5
        text = server.scrape_metrics()
        while series(text, "switchserve_step_tokens_sum") != [5.0] and time.monotonic() < deadline:
            time.sleep(0.05)
            text = server.scrape_metrics()
        assert series(text, "switchserve_prompt_tokens_total") == [3.0]
        assert series(text, "switchserve_generation_tokens_total") == [3.0]
        # The 3-token prompt and two decode steps (the third token ends it).
        assert series(text, "switchserve_step_tokens_sum") == [5.0]
        assert set(series(text, "switchserve_moe_router_tokens_total")) == {5.0}
    finally:
        server.close()


def test_idle_connections_to_the_metrics_port_do_not_hold_up_a_scrape():
    """Each connection holds an exporter thread until its request comes: with
    2 threads and civetweb's 30 s wait, two idle connections delayed every
    scrape by 30 s (a 10 s Prometheus scrape timed out)."""
    server = Server(metrics=True)
    idle = []
    try:
        idle = [socket.create_connection(("127.0.0.1", server.metrics_port)) for _ in range(4)]
        time.sleep(0.2)
        started = time.monotonic()
        assert "switchserve_requests_running" in server.scrape_metrics()
        assert time.monotonic() - started < 1.5
    finally:
        for connection in idle:
            connection.close()
        server.close()


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


@pytest.mark.parametrize("args, held", [
    (["--kv-cache-dtype", "bf16"], "bf16"),
    # auto follows the weight matrices: the f16 golden model keeps an f32
    # cache (asserted with the metrics above); held in bf16, a bf16 cache.
    (["--weights-dtype", "bf16"], "bf16"),
])
def test_model_info_reports_the_kv_cache_type_the_backend_holds(args, held):
    server = Server(*args, metrics=True)
    try:
        info = re.search(r"switchserve_model_info\{.*\}", server.scrape_metrics()).group(0)
        assert f'kv_cache_dtype="{held}"' in info
        asked = args[1] if args[0] == "--kv-cache-dtype" else "auto"
        assert f"bytes per token, {held}; --kv-cache-dtype {asked})" in server.log()
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
