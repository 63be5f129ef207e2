"""The switchserve gRPC API from a Python grpcio client, against the real
server process on a free loopback port (the port is read from its log):
generation, stops, EOS, tokenize, model info, health, reflection, batch
invariance, and every bad input. How streams end is in test_grpc_streams.py,
the server's security, logs and connections in test_grpc_server.py."""

import json
import os
import shutil
import tempfile
import time

import grpc
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
import health_pb2
import health_pb2_grpc
import reflection_pb2
import reflection_pb2_grpc
from grpc_harness import (BINARY, CONTEXT, MODEL, SOURCE_DIR, Server, expect_good_request_works,
                          text_request)
from server_process import binary_version


def test_unary_and_streaming_agree(stub):
    request = text_request("The experts say", 30, temperature=0.9, seed=99, top_k=40, min_p=0.01)
    request.logprobs = 2
    request.return_routing = True
    unary = stub.Generate(request, timeout=60)
    assert unary.usage.prompt_tokens == 15
    assert unary.usage.completion_tokens == len(unary.token_ids) > 0
    assert unary.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert len(unary.tokens) == len(unary.token_ids)
    assert len(unary.tokens[0].top_logprobs) == 2
    messages = list(stub.GenerateStream(request, timeout=60))
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    # The detail too (a stream's messages carry it serialized apart).
    assert [t for m in messages for t in m.tokens] == list(unary.tokens)
    assert len(unary.tokens[0].routing.routers) > 0
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
    # stop_reason (vLLM's): the stop string, the stop id; nothing for a length.
    assert stopped.WhichOneof("stop_reason") == "stop_string" and stopped.stop_string == stop
    assert reference.WhichOneof("stop_reason") is None
    messages = list(stub.GenerateStream(text_request("stop test", 20, stop=["zzz", stop]),
                                        timeout=60))
    assert "".join(m.text for m in messages) == stopped.text
    assert messages[-1].stop_string == stop
    assert all(m.WhichOneof("stop_reason") is None for m in messages[:-1])
    by_id = stub.Generate(text_request("stop test", 20, stop_token_ids=[reference.token_ids[3]]),
                          timeout=60)
    assert by_id.finish_reason == pb.FINISH_REASON_STOP
    assert by_id.WhichOneof("stop_reason") == "stop_token_id"
    assert by_id.stop_token_id == reference.token_ids[3]
    assert list(by_id.token_ids) == list(reference.token_ids[:list(reference.token_ids).index(
        reference.token_ids[3]) + 1])
    # include_stop_str_in_output: the text ends after what ended it, the
    # stop string or the stop id's text (a byte a token here).
    included = stub.Generate(text_request("stop test", 20, stop=[stop],
                                          include_stop_str_in_output=True), timeout=60)
    assert included.text == stopped.text + stop
    streamed = "".join(m.text for m in stub.GenerateStream(
        text_request("stop test", 20, stop=[stop], include_stop_str_in_output=True), timeout=60))
    assert streamed == included.text
    by_id_included = stub.Generate(text_request(
        "stop test", 20, stop_token_ids=[reference.token_ids[3]], include_stop_str_in_output=True),
        timeout=60)
    assert list(by_id_included.token_ids) == list(by_id.token_ids)
    assert by_id_included.text == reference.text[:len(by_id.token_ids)]


def test_min_tokens_keeps_the_first_tokens_from_stopping(stub):
    """A stop id the model would pick first is not sampled for the first
    min_tokens tokens (nor a stop string ending in their text); without
    min_tokens the same request stops at once."""
    reference = stub.Generate(text_request("stop test", 20, ignore_eos=True), timeout=60)
    first = reference.token_ids[0]
    at_once = stub.Generate(text_request("stop test", 20, stop_token_ids=[first]), timeout=60)
    assert at_once.finish_reason == pb.FINISH_REASON_STOP
    assert list(at_once.token_ids) == [first]
    held = stub.Generate(text_request("stop test", 20, stop_token_ids=[first], min_tokens=6),
                         timeout=60)
    assert len(held.token_ids) > 6
    assert first not in held.token_ids[:6]
    assert held.finish_reason == (pb.FINISH_REASON_STOP if held.token_ids[-1] == first
                                  else pb.FINISH_REASON_LENGTH)
    assert held.usage.completion_tokens == len(held.token_ids)
    # A stop string in the first tokens' text: not counted.
    stop = reference.text[1:3]
    late = stub.Generate(text_request("stop test", 20, stop=[stop], ignore_eos=True,
                                      min_tokens=20), timeout=60)
    assert late.finish_reason == pb.FINISH_REASON_LENGTH
    assert late.text == reference.text
    streamed = "".join(m.text for m in stub.GenerateStream(
        text_request("stop test", 20, stop=[stop], ignore_eos=True, min_tokens=20), timeout=60))
    assert streamed == reference.text


def test_bad_words_and_allowed_token_ids(stub):
    """bad_words: the greedy tokens never complete a bad word (a byte a token
    here), and go on as before up to where they first would have; a word of
    one token is never sampled. allowed_token_ids: every sampled token is
    one of them. Unary and streamed alike."""
    def printable(i):
        return 33 <= i <= 126

    for prompt in ("stop test", "bad words", "another prompt", "and one more"):
        reference = list(stub.Generate(text_request(prompt, 24, ignore_eos=True),
                                       timeout=60).token_ids)
        pairs = [k for k in range(1, 24) if printable(reference[k - 1]) and printable(reference[k])]
        if pairs:
            break
    assert pairs, "no prompt's greedy text has two printable bytes in a row"
    completed = pairs[0]  # where the word first completes
    word = bytes(reference[completed - 1:completed + 1]).decode()
    request = text_request(prompt, 24, ignore_eos=True, bad_words=[word])
    banned = list(stub.Generate(request, timeout=60).token_ids)
    assert banned[:completed] == reference[:completed]
    assert banned[completed] != reference[completed]
    assert not any(bytes(banned[k - 1:k + 1]).decode(errors="replace") == word
                   for k in range(1, 24))
    assert [t for m in stub.GenerateStream(request, timeout=60) for t in m.token_ids] == banned
    # A word of one token is never sampled.
    single = list(stub.Generate(text_request(prompt, 24, ignore_eos=True,
                                             bad_words=[chr(reference[completed])]),
                                timeout=60).token_ids)
    assert reference[completed] not in single and len(single) == 24

    allowed = sorted(set(b"aeiou st"))
    for temperature in (0.0, 1.5):
        response = stub.Generate(text_request("stop test", 24, temperature=temperature, seed=5,
                                              allowed_token_ids=allowed + allowed[:2]), timeout=60)
        assert set(response.token_ids) <= set(allowed), response.token_ids
        assert response.finish_reason == pb.FINISH_REASON_LENGTH  # EOS is not allowed
        assert len(response.token_ids) == 24


def test_truncate_prompt_tokens_keeps_the_prompts_end(stub):
    """truncate_prompt_tokens: the request runs on the prompt's last tokens,
    as a request with only those would; a prompt past the context fits."""
    truncated = text_request("a long prompt whose end counts", 8, ignore_eos=True)
    truncated.truncate_prompt_tokens = 6
    response = stub.Generate(truncated, timeout=60)
    alone = stub.Generate(text_request("counts", 8, ignore_eos=True), timeout=60)
    assert response.usage.prompt_tokens == 6
    assert list(response.token_ids) == list(alone.token_ids)
    too_long = text_request("x" * 100 + "counts", 8, ignore_eos=True)
    too_long.truncate_prompt_tokens = 6
    assert stub.Generate(too_long, timeout=60).text == alone.text


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


def test_tokenize_and_model_info(stub):
    assert list(stub.Tokenize(pb.TokenizeRequest(text="hé!"), timeout=10).token_ids) == [
        104, 0xC3, 0xA9, 33]
    assert stub.Detokenize(pb.DetokenizeRequest(token_ids=[104, 0xC3, 0xA9, 33]),
                           timeout=10).text == "hé!"
    assert stub.Detokenize(pb.DetokenizeRequest(), timeout=10).text == ""
    for ids, index in (([1, 256], 1), ([-1], 0)):
        with pytest.raises(grpc.RpcError) as error:
            stub.Detokenize(pb.DetokenizeRequest(token_ids=ids), timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == (
            f"token_ids: ids[{index}] = {ids[index]} is outside the vocabulary [0, 256)")
    expect_good_request_works(stub)
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.name == "switchall_f16"  # the served model name, as HTTP's `model`
    assert info.context_length == CONTEXT and info.vocab_size == 256
    assert info.tokenizer == "byte" and info.device == "cpu"
    assert info.cache.total_blocks > 0 and info.cache.block_size == 16
    # The architecture as config.json gives it.
    assert (info.attention.position, info.attention.gate, info.attention.value_routing,
            info.attention.shared_router) == ("rope", "sigmoid", "source", False)
    assert (info.ffn.gate, info.ffn.activation) == ("softmax", "relu")
    # The build, as `switchserve --version` names it.
    assert (info.server_version, info.server_revision) == binary_version(BINARY)


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


@pytest.mark.parametrize("model", [None, "tests/golden/xl_dense_gqa"])
def test_max_model_len_caps_the_context(server, stub, model):
    """--max-model-len: GetModelInfo reports the cut context, a request past
    it is INVALID_ARGUMENT naming it, and a request within it gets the tokens
    and logprobs the model's whole context gives (a RoPE and an XL model)."""
    path = MODEL if model is None else os.path.join(SOURCE_DIR, model)
    full = server if model is None else Server(model=path)
    short = Server("--max-model-len", "24", model=path)
    try:
        with full.channel() as full_channel, short.channel() as short_channel:
            full_stub = pb_grpc.GenerationStub(full_channel)
            short_stub = pb_grpc.GenerationStub(short_channel)
            info = short_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            assert info.context_length == 24
            request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 9, 13, 2, 7]), logprobs=2,
                                         sampling=pb.SamplingParams(max_new_tokens=19,
                                                                    temperature=0,
                                                                    ignore_eos=True))
            want = full_stub.Generate(request, timeout=60)
            got = short_stub.Generate(request, timeout=60)
            assert list(got.token_ids) == list(want.token_ids)
            assert [t.logprob for t in got.tokens] == [t.logprob for t in want.tokens]
            request.sampling.max_new_tokens = 20
            with pytest.raises(grpc.RpcError) as error:
                short_stub.Generate(request, timeout=60)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details() == (
                "sampling.max_new_tokens: 20 with a prompt of 5 tokens exceeds the context "
                "length 24 (at most 19)")
            assert len(full_stub.Generate(request, timeout=60).token_ids) == 20
    finally:
        short.close()
        if model is not None:
            full.close()


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
    ("frequency penalty past -2", text_request("x", 4, frequency_penalty=-3.0),
     "sampling.frequency_penalty: must be in [-2, 2], found -3"),
    ("logit bias past 100", text_request("x", 4, logit_bias={5: 150.0}),
     "sampling.logit_bias[5]: must be in [-100, 100], found 150"),
    ("max_new_tokens zero", text_request("x", 0), "sampling.max_new_tokens"),
    ("max_new_tokens over context", text_request("x", 64), "sampling.max_new_tokens"),
    ("too many stop strings", text_request("x", 4, stop=[str(i) for i in range(17)]),
     "sampling.stop"),
    ("stop id outside vocabulary", text_request("x", 4, stop_token_ids=[1000]),
     "sampling.stop_token_ids"),
    ("negative min_tokens", text_request("x", 4, min_tokens=-1),
     "sampling.min_tokens: must be in [0, max_new_tokens = 4], found -1"),
    ("min_tokens past max_new_tokens", text_request("x", 4, min_tokens=5),
     "sampling.min_tokens: must be in [0, max_new_tokens = 4], found 5"),
    ("empty bad word", text_request("x", 4, bad_words=["a", ""]),
     "sampling.bad_words: bad_words[1] must be 1 to 256 bytes"),
    ("whitespace bad word", text_request("x", 4, bad_words=[" \t"]),
     "sampling.bad_words: bad_words[0] is only whitespace"),
    ("too many bad words", text_request("x", 4, bad_words=["a"] * 65),
     "sampling.bad_words: at most 64 words, found 65"),
    ("allowed id outside vocabulary", text_request("x", 4, allowed_token_ids=[3, 256]),
     "sampling.allowed_token_ids: allowed_token_ids[1] = 256 is outside the vocabulary [0, 256)"),
    ("truncate_prompt_tokens zero", pb.GenerateRequest(text="x", truncate_prompt_tokens=0),
     "truncate_prompt_tokens: must be >= 1, or -1 (as many as fit), found 0"),
    ("too many logprobs", pb.GenerateRequest(text="x", logprobs=50), "logprobs"),
    ("too many prompt logprobs", pb.GenerateRequest(text="x", prompt_logprobs=21),
     "prompt_logprobs: must be in [0, 20], found 21"),
    ("negative prompt logprobs", pb.GenerateRequest(text="x", prompt_logprobs=-1),
     "prompt_logprobs: must be in [0, 20], found -1"),
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


@pytest.mark.parametrize("method", ["Generate", "GenerateStream", "Tokenize", "Detokenize",
                                    "GetModelInfo"])
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
