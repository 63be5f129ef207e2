"""The OpenAI-compatible HTTP API (--http-port) against the real server
process, driven by the official `openai` Python client and by curl, and
compared with the gRPC API (the same engine must give the same tokens):
completions, streams, stops, seeds, logprobs, bad fields, tokens, the
request metrics. HTTP/1.1 itself is in test_http_protocol.py, limits,
budgets and disconnects in test_http_limits.py, the load generator in
test_http_load_generator.py.

Runs on build/venv (scripts/install-test-tools.sh: Debian's python3 with
grpcio, plus the pinned `openai` client)."""

import json
import os
import re
import socket
import tempfile
import time

import httpx
import openai
import pytest

import generation_pb2 as pb
from http_harness import BINARY, MODEL, MODEL_DIR, Server, curl, grpc_generate
from server_process import binary_version


def test_models_health_and_ready(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert json.loads(curl(server.url + "/health").stdout) == {"status": "ok"}
    assert json.loads(curl(server.url + "/ready").stdout) == {"status": "ready"}


def post_json(server, path, body, token=None):
    """POST `body` to `path` (outside /v1/); (status, parsed body)."""
    args = ["-s", "-o", "-", "-w", "\n%{http_code}", "-X", "POST", server.url + path, "-H",
            "content-type: application/json", "-d", json.dumps(body)]
    if token is not None:
        args += ["-H", f"authorization: Bearer {token}"]
    out = curl(*args).stdout
    body_text, _, status = out.rpartition("\n")
    return int(status), json.loads(body_text)


def test_tokenize_and_detokenize(server, client):
    """vLLM's /tokenize and /detokenize: the ids /v1/completions encodes a
    prompt to (no special tokens added), and back; gRPC's Tokenize and
    Detokenize answer the same."""
    status, body = post_json(server, "/tokenize", {"model": MODEL, "prompt": "hé!"})
    assert status == 200, body
    assert body == {"count": 4, "max_model_len": 64, "tokens": [104, 0xC3, 0xA9, 33]}
    status, body = post_json(server, "/tokenize", {"prompt": "hé!", "return_token_strs": True,
                                                  "add_special_tokens": False})
    assert body["token_strs"] == ["h", "bytes:\\xc3", "bytes:\\xa9", "!"]
    status, body = post_json(server, "/tokenize", {"prompt": ""})
    assert (status, body["tokens"], body["count"]) == (200, [], 0)
    status, body = post_json(server, "/detokenize", {"tokens": [104, 0xC3, 0xA9, 33]})
    assert (status, body) == (200, {"prompt": "hé!"})
    # Bytes that form no character: U+FFFD, as an echoed prompt shows them.
    assert post_json(server, "/detokenize", {"tokens": [104, 0xC3]})[1] == {"prompt": "h\ufffd"}
    # The completion of those ids is the completion of the text.
    by_ids = client.completions.create(model=MODEL, prompt=[104, 0xC3, 0xA9, 33], max_tokens=4,
                                       temperature=0)
    by_text = client.completions.create(model=MODEL, prompt="hé!", max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    stub = server.grpc_stub()
    assert list(stub.Tokenize(pb.TokenizeRequest(text="hé!"), timeout=10).token_ids) == [
        104, 0xC3, 0xA9, 33]
    assert stub.Detokenize(pb.DetokenizeRequest(token_ids=[104, 0xC3]), timeout=10).text == \
        "h\ufffd"


BAD_TOKENIZE_BODIES = [
    ("/tokenize", {}, 400, "prompt", "prompt: is required"),
    ("/tokenize", {"prompt": [1, 2]}, 400, "prompt", "prompt: must be a string, found [1,2]"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": True}, 400, "add_special_tokens",
     "add_special_tokens: must be false: prompts are encoded with no special tokens added (as "
     "/v1/completions encodes them), found true"),
    ("/tokenize", {"prompt": "x", "messages": []}, 400, "messages", None),
    ("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, None,
     "model: `gpt-4` does not exist; this server serves `switchall_f16`"),
    ("/detokenize", {}, 400, "tokens", "tokens: is required"),
    ("/detokenize", {"tokens": [1, 256]}, 400, "tokens",
     "tokens: tokens[1] = 256 is outside the vocabulary [0, 256)"),
    ("/detokenize", {"tokens": [1, 2.5]}, 400, "tokens",
     "tokens: tokens[1] must be an integer, found 2.5"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens", None),
    ("/detokenize", {"tokens": [1], "model": "gpt-4"}, 404, None, None),
]


@pytest.mark.parametrize("path,body,status,param,message", BAD_TOKENIZE_BODIES,
                         ids=[f"{b[0]} {json.dumps(b[1])}" for b in BAD_TOKENIZE_BODIES])
def test_bad_tokenize_body_is_refused_naming_the_param(server, client, path, body, status,
                                                         param, message):
    got_status, got = post_json(server, path, body)
    assert got_status == status, got
    assert got["error"]["param"] == param, got
    if message is not None:
        assert got["error"]["message"] == message, got
    # The server keeps serving.
    assert post_json(server, "/tokenize", {"prompt": "ok"})[0] == 200
    result = curl("-i", server.url + path)  # GET
    assert result.stdout.startswith("HTTP/1.1 405"), result.stdout[:200]


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


def test_vllms_special_token_fields_at_their_defaults_change_nothing(client):
    ask = dict(model=MODEL, prompt="And God said", max_tokens=8, temperature=0)
    plain = client.completions.create(**ask)
    spelled = client.completions.create(**ask, extra_body={
        "skip_special_tokens": True, "spaces_between_special_tokens": False})
    assert spelled.choices[0].text == plain.choices[0].text


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


def test_continuous_usage_stats_count_each_choice_so_far(client):
    """vLLM's stream_options.continuous_usage_stats: every event carries its
    choice's usage so far (its prompt, its tokens streamed); the last event
    the request's. Without include_usage it is off, as in vLLM."""
    chunks = list(client.completions.create(
        model=MODEL, prompt=["abc", "hello"], max_tokens=6, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        usage = chunk.usage
        assert usage.prompt_tokens == (3, 5)[choice.index]
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        counts[choice.index].append(usage.completion_tokens)
    assert counts == {0: [1, 2, 3, 4, 5, 6], 1: [1, 2, 3, 4, 5, 6]}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 8
    plain = list(client.completions.create(
        model=MODEL, prompt="abc", max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": False, "continuous_usage_stats": True}))
    assert all(c.usage is None for c in plain)


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
    streamed = list(client.completions.create(model=MODEL, prompt="stop test", max_tokens=20,
                                              temperature=0, stop=["zzz", stop], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == stopped.choices[0].text
    # vLLM's stop_reason: the stop string or stop id that ended the choice;
    # null for a length, and on every event before the last.
    stop_reasons = [c.model_dump()["choices"][0]["stop_reason"] for c in streamed]
    assert stop_reasons == [None] * (len(streamed) - 1) + [stop]
    assert stopped.model_dump()["choices"][0]["stop_reason"] == stop
    assert reference.model_dump()["choices"][0]["stop_reason"] is None
    ids = grpc_generate(server, "stop test", max_new_tokens=20, temperature=0).token_ids
    by_id = client.completions.create(model=MODEL, prompt="stop test", max_tokens=20,
                                      temperature=0, extra_body={"stop_token_ids": [ids[3]]})
    assert by_id.choices[0].finish_reason == "stop"
    assert by_id.model_dump()["choices"][0]["stop_reason"] == ids[3]


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


def test_echo_starts_the_text_and_logprobs_with_the_prompt(server, client):
    """`echo` (what lm-evaluation-harness sends to score a text: echo,
    logprobs 1, max_tokens 1): the text starts with the prompt, and the
    logprobs object covers the prompt's tokens too, the first one's logprob
    and alternatives null, the others' those of gRPC's prompt_logprobs."""
    prompt = "Hello there"
    request = pb.GenerateRequest(text=prompt, logprobs=1, prompt_logprobs=1,
                                 sampling=pb.SamplingParams(max_new_tokens=4, temperature=0))
    expected = server.grpc_stub().Generate(request, timeout=60)
    assert len(expected.prompt_tokens) == len(prompt) - 1  # byte tokens
    scored = list(expected.prompt_tokens) + list(expected.tokens)
    for stream in (False, True):
        response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                             temperature=0, logprobs=1, echo=True, stream=stream)
        chunks = list(response) if stream else [response]
        text = "".join(c.choices[0].text for c in chunks)
        assert text == prompt + expected.text, stream
        tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
        logprobs = [t for c in chunks for t in c.choices[0].logprobs.token_logprobs]
        tops = [t for c in chunks for t in c.choices[0].logprobs.top_logprobs]
        offsets = [t for c in chunks for t in c.choices[0].logprobs.text_offset]
        assert tokens == list(prompt) + [chr(i) for i in expected.token_ids], stream
        assert logprobs[0] is None and tops[0] is None, stream
        assert logprobs[1:] == pytest.approx([t.logprob for t in scored], rel=1e-6), stream
        assert all(len(top) == 1 for top in tops[1:]), stream
        assert [v for top in tops[1:] for v in top.values()] == pytest.approx(
            [t.top_logprobs[0].logprob for t in scored], rel=1e-6), stream
        assert offsets == list(range(len(prompt) + 4)), stream
    # Without logprobs only the text; echo false changes nothing.
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                      echo=True)
    assert plain.choices[0].text == prompt + expected.text
    assert plain.choices[0].logprobs is None
    assert client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                     echo=False).choices[0].text == expected.text


def test_prompt_logprobs_as_vllm_returns_them(server, client):
    """vLLM's `prompt_logprobs`: each choice's list, null for the first
    prompt token, then per token an object keyed by id: the prompt token
    first (its logprob and rank as gRPC's prompt_tokens give them), then the
    n most likely, ranks 1..n. With echo and logprobs, it sets the prompt
    tokens' alternatives only where it is given; streamed, a 400."""
    prompt = "Hello there"
    request = pb.GenerateRequest(text=prompt, prompt_logprobs=3,
                                 sampling=pb.SamplingParams(max_new_tokens=2, temperature=0))
    expected = server.grpc_stub().Generate(request, timeout=60)
    assert all(t.rank >= 1 for t in expected.prompt_tokens)
    assert any(t.rank > 1 for t in expected.prompt_tokens)  # a random model: some unlikely
    response = client.post("/completions", cast_to=httpx.Response, body={
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "n": 2,
        "prompt_logprobs": 3}).json()
    for choice in response["choices"]:
        listed = choice["prompt_logprobs"]
        assert len(listed) == len(prompt) and listed[0] is None
        for entry, token, want in zip(listed[1:], prompt[1:], expected.prompt_tokens):
            ids = list(entry)
            assert ids[0] == str(ord(token)) == str(want.token_id)
            own = entry[ids[0]]
            assert own["logprob"] == pytest.approx(want.logprob, rel=1e-6)
            assert own["decoded_token"] == token
            top_ids = [str(t.token_id) for t in want.top_logprobs]
            assert set(ids) == {ids[0], *top_ids} and len(top_ids) == 3
            for rank, top in enumerate(want.top_logprobs, 1):
                assert entry[str(top.token_id)]["rank"] == rank
                assert entry[str(top.token_id)]["logprob"] == pytest.approx(top.logprob, rel=1e-6)
            if ids[0] not in top_ids:
                assert own["rank"] == want.rank > 3
        assert "prompt_logprobs" not in client.post("/completions", cast_to=httpx.Response, body={
            "model": MODEL, "prompt": prompt, "max_tokens": 2}).json()["choices"][0]
    # Echo with logprobs 1 shows one alternative per token; prompt_logprobs
    # 0 then sets the prompt tokens' to none (vLLM's precedence).
    echoed = client.post("/completions", cast_to=httpx.Response, body={
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "echo": True,
        "logprobs": 1, "prompt_logprobs": 0}).json()["choices"][0]
    tops = echoed["logprobs"]["top_logprobs"]
    assert tops[0] is None and all(top == {} for top in tops[1:len(prompt)])
    assert all(len(top) == 1 for top in tops[len(prompt):])
    assert [list(e) for e in echoed["prompt_logprobs"][1:]] == [[str(ord(c))] for c in prompt[1:]]
    for body, message in (
            ({"stream": True, "prompt_logprobs": 2},
             'prompt_logprobs: is not available with "stream": true (as in vLLM)'),
            ({"prompt_logprobs": -1}, "prompt_logprobs: must be in [0, 20], found -1"),
            ({"prompt_logprobs": 21}, "prompt_logprobs: must be in [0, 20], found 21")):
        with pytest.raises(openai.BadRequestError) as error:
            client.post("/completions", body={"model": MODEL, "prompt": prompt, **body},
                        cast_to=httpx.Response)
        assert error.value.body["message"] == message
        assert error.value.body["param"] == "prompt_logprobs"
    # Streamed with 0, as vLLM takes it: nothing added.
    events = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True,
                                            extra_body={"prompt_logprobs": 0}))
    assert all("prompt_logprobs" not in (e.choices[0].model_extra or {}) for e in events)


def test_echo_with_zero_max_tokens_is_the_prompt_alone(server, client):
    """`"max_tokens": 0` with `echo` (as vLLM answers it): the prompt's text
    and its tokens' logprobs, nothing generated: no completion tokens in the
    usage, finish_reason "length"; streamed the same. Without echo, a 400."""
    prompt = "Hello there"
    request = pb.GenerateRequest(text=prompt, logprobs=2, prompt_logprobs=2,
                                 sampling=pb.SamplingParams(max_new_tokens=1, temperature=0))
    expected = server.grpc_stub().Generate(request, timeout=60)
    for stream in (False, True):
        response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True,
                                             logprobs=2, stream=stream,
                                             **({"stream_options": {"include_usage": True}}
                                                if stream else {}))
        chunks = list(response) if stream else [response]
        choices = [c.choices[0] for c in chunks if c.choices]
        assert "".join(c.text for c in choices) == prompt, stream
        tokens = [t for c in choices for t in c.logprobs.tokens]
        logprobs = [t for c in choices for t in c.logprobs.token_logprobs]
        assert tokens == list(prompt), stream
        assert logprobs[0] is None
        assert logprobs[1:] == pytest.approx([t.logprob for t in expected.prompt_tokens],
                                             rel=1e-6), stream
        assert choices[-1].finish_reason == "length", stream
        usage = chunks[-1].usage
        assert usage.prompt_tokens == len(prompt) and usage.completion_tokens == 0, stream
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)
    assert error.value.body["param"] == "max_tokens"


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


def test_return_token_ids_gives_each_choices_prompt_and_generated_ids(server, client):
    """vLLM's return_token_ids: each choice's `prompt_token_ids` (the ids
    /tokenize gives) and `token_ids` (the generated ids, gRPC's; an echo's
    prompt not among them); a stream has the prompt's in each choice's first
    event only and each event's own ids. Without it, neither field."""
    prompt, ask = "Hello there", dict(model=MODEL, max_tokens=6, temperature=0)
    want = list(grpc_generate(server, prompt, max_new_tokens=6, temperature=0).token_ids)
    prompt_ids = post_json(server, "/tokenize", {"prompt": prompt})[1]["tokens"]
    plain = client.completions.create(prompt=prompt, **ask).model_dump()["choices"][0]
    assert plain.get("token_ids") is None and plain.get("prompt_token_ids") is None
    for echo in (False, True):
        choice = client.completions.create(
            prompt=prompt, echo=echo, logprobs=1, extra_body={"return_token_ids": True},
            **ask).model_dump()["choices"][0]
        assert choice["prompt_token_ids"] == prompt_ids, echo
        assert choice["token_ids"] == want, echo
    raw = curl("-N", server.url + "/v1/completions", "-H", "content-type: application/json",
               "-d", json.dumps({**ask, "prompt": prompt, "n": 2, "stream": True,
                                 "return_token_ids": True})).stdout
    events = [json.loads(e[6:]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    for index in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert len(mine) >= 2
        assert mine[0]["prompt_token_ids"] == prompt_ids
        assert all("prompt_token_ids" not in c for c in mine[1:])
        assert [t for c in mine for t in c["token_ids"]] == want


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


def test_prompt_tokens_found_in_the_prefix_cache_are_in_the_usage():
    """With --enable-prefix-caching, a prompt sent again is answered the same
    and its usage says how many of its tokens the cache held
    (`prompt_tokens_details.cached_tokens`, as OpenAI's API reports them),
    unary and streamed; a first prompt's usage has no details; a salted
    request shares the cache only with its salt."""
    cached = Server("--enable-prefix-caching")
    try:
        client = cached.client()
        prompt = "And God said unto Moses, Speak unto the children"
        first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                          temperature=0)
        assert first.usage.prompt_tokens_details is None
        again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                          temperature=0)
        assert again.choices[0].text == first.choices[0].text
        # Blocks of 16 tokens: all of the prompt's whole blocks but the one
        # holding its last token, which a step computes.
        assert again.usage.prompt_tokens_details.cached_tokens == 48 - 16
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
        # vLLM's cache_salt: the prompt cached unsalted is computed again
        # under a salt, and found again under the same salt only.
        salted = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                            temperature=0, extra_body={"cache_salt": salt})
                  for salt in ("tenant-a", "tenant-b", "tenant-a")]
        assert [c.choices[0].text for c in salted] == [first.choices[0].text] * 3
        assert salted[0].usage.prompt_tokens_details is None
        assert salted[1].usage.prompt_tokens_details is None
        assert salted[2].usage.prompt_tokens_details.cached_tokens == 32
    finally:
        cached.close()


def test_n_choices_compute_their_prompt_once_with_the_prefix_cache(client):
    """With --enable-prefix-caching, a request's n choices reach the engine
    together: the first computes the prompt's whole blocks and the others
    wait for them and start after them (the metrics count what they found),
    with the choices of a server without the flag; the usage counts the
    prompt once, with its first choice's cached tokens (none)."""
    cached = Server("--enable-prefix-caching", metrics=True)
    try:
        prompt = "And God said unto Moses, Speak unto the "
        length = len(prompt.encode())  # the built-in model's tokens are bytes
        kwargs = dict(model=MODEL, prompt=prompt, n=4, seed=5, max_tokens=6, temperature=0.9,
                      extra_body={"ignore_eos": True})
        completion = cached.client().completions.create(**kwargs)
        plain = client.completions.create(**kwargs)
        assert [c.text for c in completion.choices] == [c.text for c in plain.choices]
        assert completion.usage.prompt_tokens == length
        assert completion.usage.prompt_tokens_details is None
        # Blocks of 16: the three other choices take every whole block before
        # the one holding the prompt's last token.
        whole = (length - 1) // 16 * 16
        computed = 4 * length - 3 * whole
        text = cached.scrape_metrics_after_steps(computed + 4 * 5)  # and 5 decode steps each

        def total(name):
            return sum(float(v) for v in re.findall(r"^" + name + r"(?:\{[^}]*\})? (\S+)$", text,
                                                    re.M))

        assert total("switchserve_prefix_cache_query_tokens_total") == 4 * length
        assert total("switchserve_prefix_cache_hit_tokens_total") == 3 * whole
        assert total("switchserve_prompt_tokens_total") == computed
    finally:
        cached.close()


def test_penalties_and_logit_bias_are_grpcs(server, client):
    """presence_penalty, frequency_penalty and logit_bias reach the engine as
    gRPC's fields do: the same tokens, greedy and seeded; and they act (a
    bias of 100 all but forces its token, penalties change a greedy text)."""
    prompt = "And God said"
    fields = dict(presence_penalty=0.7, frequency_penalty=0.9, logit_bias={101: 1.5, 32: -2.0})
    for temperature, seed in ((0.0, None), (0.9, 17)):
        completion = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, temperature=temperature, seed=seed,
            presence_penalty=fields["presence_penalty"],
            frequency_penalty=fields["frequency_penalty"],
            logit_bias={str(k): v for k, v in fields["logit_bias"].items()},
            extra_body={"ignore_eos": True})
        expected = grpc_generate(server, prompt, max_new_tokens=16, temperature=temperature,
                                 ignore_eos=True, **({"seed": seed} if seed else {}), **fields)
        assert completion.choices[0].text == expected.text, temperature
    plain = grpc_generate(server, prompt, max_new_tokens=16, temperature=0, ignore_eos=True)
    penalised = grpc_generate(server, prompt, max_new_tokens=16, temperature=0, ignore_eos=True,
                              frequency_penalty=2.0)
    assert penalised.text != plain.text
    forced = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                       logit_bias={"122": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == "z" * 6


def test_n_choices_are_samples_of_their_prompt(client):
    """`n`: each prompt's n choices, one after another (choice i * n + j is
    prompt i's j-th), each its own sample: with a seed, choice j is what the
    prompt alone gives with seed + j (as vLLM seeds them); the usage counts
    each prompt once. Streamed, each event names its choice."""
    kwargs = dict(model=MODEL, max_tokens=8, temperature=3.0, extra_body={"ignore_eos": True})

    def alone(prompt, seed):
        return client.completions.create(prompt=prompt, seed=seed, **kwargs).choices[0].text

    prompts = ["hi", [121, 111]]  # "yo" as ids
    batch = client.completions.create(prompt=prompts, n=3, seed=11, **kwargs)
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [alone(p, 11 + j) for p in prompts for j in range(3)]
    assert len({c.text for c in batch.choices[:3]}) > 1  # samples, not copies
    assert batch.usage.prompt_tokens == 4 and batch.usage.completion_tokens == 48
    # The same seed, the same choices; best_of equal to n changes nothing.
    again = client.completions.create(prompt=prompts, n=3, best_of=3, seed=11, **kwargs)
    assert [c.text for c in again.choices] == [c.text for c in batch.choices]
    streamed = {}
    for chunk in client.completions.create(prompt=prompts, n=3, seed=11, stream=True, **kwargs):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {c.index: c.text for c in batch.choices}
    # Without a seed the choices still differ; with echo each starts with its prompt.
    unseeded = client.completions.create(prompt="hi", n=4, echo=True, **kwargs)
    assert len(unseeded.choices) == 4
    assert all(c.text.startswith("hi") for c in unseeded.choices)
    assert len({c.text for c in unseeded.choices}) > 1
    assert unseeded.usage.prompt_tokens == 2 and unseeded.usage.completion_tokens == 32


def test_min_tokens_holds_back_the_stop_ids(server, client):
    """vLLM's min_tokens: a stop id the model picks first is not sampled for
    the first min_tokens tokens; the gRPC request with the same field gives
    the same text."""
    first = grpc_generate(server, "stop", max_new_tokens=1, temperature=0).token_ids[0]
    body = {"stop_token_ids": [first], "min_tokens": 5}
    at_once = client.completions.create(model=MODEL, prompt="stop", max_tokens=12, temperature=0,
                                        extra_body={"stop_token_ids": [first]})
    assert at_once.usage.completion_tokens == 1 and at_once.choices[0].finish_reason == "stop"
    held = client.completions.create(model=MODEL, prompt="stop", max_tokens=12, temperature=0,
                                     extra_body=body)
    assert held.usage.completion_tokens > 5
    same = grpc_generate(server, "stop", max_new_tokens=12, temperature=0, stop_token_ids=[first],
                         min_tokens=5)
    assert held.choices[0].text == same.text
    assert held.usage.completion_tokens == same.usage.completion_tokens
    assert first not in same.token_ids[:5]


def test_bad_words_and_allowed_token_ids(server, client):
    """vLLM's bad_words and allowed_token_ids: the tokens never complete a
    bad word, and every token is an allowed one; the gRPC request with the
    same fields gives the same tokens."""
    def token_ids(completion):
        return [int(t.removeprefix("token_id:")) for t in completion.choices[0].logprobs.tokens]

    reference = list(grpc_generate(server, "stop", max_new_tokens=16, temperature=0,
                                   ignore_eos=True).token_ids)
    printable = [i for i in reference if 33 <= i <= 126]
    assert printable, reference
    word = chr(printable[0])  # one byte, one token: never sampled
    ids_please = {"return_tokens_as_token_ids": True, "ignore_eos": True}
    banned = client.completions.create(model=MODEL, prompt="stop", max_tokens=16, temperature=0,
                                       logprobs=0, extra_body={"bad_words": [word], **ids_please})
    assert printable[0] not in token_ids(banned)
    same = grpc_generate(server, "stop", max_new_tokens=16, temperature=0, ignore_eos=True,
                         bad_words=[word])
    assert token_ids(banned) == list(same.token_ids)
    allowed = sorted(set(b"aeiou "))
    restricted = client.completions.create(
        model=MODEL, prompt="stop", max_tokens=16, temperature=1.0, seed=3, logprobs=0,
        extra_body={"allowed_token_ids": allowed, **ids_please})
    assert len(token_ids(restricted)) == 16
    assert set(token_ids(restricted)) <= set(allowed), token_ids(restricted)


def test_include_stop_str_in_output(server, client):
    """vLLM's include_stop_str_in_output: the text ends after the stop
    string, or after the stop token's text, which the logprobs' tokens then
    spell too."""
    reference = grpc_generate(server, "stop", max_new_tokens=12, temperature=0, ignore_eos=True)
    stop = reference.text[4:6]
    cut = reference.text[:reference.text.find(stop)]
    without = client.completions.create(model=MODEL, prompt="stop", max_tokens=12, temperature=0,
                                        stop=[stop])
    assert without.choices[0].text == cut
    included = client.completions.create(model=MODEL, prompt="stop", max_tokens=12,
                                         temperature=0, stop=[stop],
                                         extra_body={"include_stop_str_in_output": True})
    assert included.choices[0].text == cut + stop
    assert included.choices[0].finish_reason == "stop"
    stop_id = reference.token_ids[2]
    by_id = client.completions.create(model=MODEL, prompt="stop", max_tokens=12, temperature=0,
                                      logprobs=1,
                                      extra_body={"stop_token_ids": [stop_id],
                                                  "include_stop_str_in_output": True})
    choice = by_id.choices[0]
    count = list(reference.token_ids).index(stop_id) + 1
    assert choice.text == reference.text[:count]
    assert "".join(choice.logprobs.tokens) == choice.text
    assert choice.logprobs.text_offset == list(range(count))


def test_truncate_prompt_tokens(client):
    """vLLM's truncate_prompt_tokens: each prompt's last tokens, echoed and
    counted as the prompt; one past the context fits; -1 keeps what fits."""
    alone = client.completions.create(model=MODEL, prompt="counts", max_tokens=4, temperature=0)
    for prompt in ("a long prompt whose end counts", "x" * 100 + "counts"):
        truncated = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                              temperature=0, echo=True,
                                              extra_body={"truncate_prompt_tokens": 6})
        assert truncated.choices[0].text == "counts" + alone.choices[0].text
        assert truncated.usage.prompt_tokens == 6
    # -1: as many of the last tokens as the context (64) holds beside max_tokens.
    kept = "x" * 54 + "counts"
    fitted = client.completions.create(model=MODEL, prompt="x" * 100 + "counts", max_tokens=4,
                                       temperature=0, echo=True,
                                       extra_body={"truncate_prompt_tokens": -1})
    whole = client.completions.create(model=MODEL, prompt=kept, max_tokens=4, temperature=0)
    assert fitted.usage.prompt_tokens == 60
    assert fitted.choices[0].text == kept + whole.choices[0].text


BAD_BODIES = [
    ("max_tokens over context", {"prompt": "x", "max_tokens": 64}, "max_tokens"),
    ("max_tokens zero", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("max_tokens not integer", {"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ("negative temperature", {"prompt": "x", "temperature": -1}, "temperature"),
    ("temperature string", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("top_p above one", {"prompt": "x", "top_p": 1.5}, "top_p"),
    ("n zero", {"prompt": "x", "n": 0}, "n"),
    ("n past 128", {"prompt": "x", "n": 129}, "n"),
    ("best_of above n", {"prompt": "x", "n": 2, "best_of": 3}, "best_of"),
    ("echo not boolean", {"prompt": "x", "echo": "yes"}, "echo"),
    ("presence penalty past 2", {"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ("logit bias past 100", {"prompt": "x", "logit_bias": {"1": 500}}, "logit_bias[1]"),
    ("logit bias outside vocabulary", {"prompt": "x", "logit_bias": {"256": 1}}, "logit_bias"),
    ("suffix", {"prompt": "x", "suffix": "end"}, "suffix"),
    ("special tokens kept", {"prompt": "x", "skip_special_tokens": False}, "skip_special_tokens"),
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
    ("continuous usage without stream",
     {"prompt": "x", "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ("continuous usage not boolean",
     {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": 1}},
     "stream_options.continuous_usage_stats"),
    ("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("stop token outside vocabulary", {"prompt": "x", "stop_token_ids": [999]},
     "stop_token_ids"),
    ("token past int32", {"prompt": [1, 4294967296]}, "prompt"),
    ("stop token past int32", {"prompt": "x", "stop_token_ids": [-3000000000]},
     "stop_token_ids"),
    ("stop entry not string", {"prompt": "x", "stop": ["a", 1]}, "stop"),
    ("max_tokens past int64", {"prompt": "x", "max_tokens": 1e20}, "max_tokens"),
    ("priority without the priority policy", {"prompt": "x", "priority": 2}, "priority"),
    ("priority not integer", {"prompt": "x", "priority": "high"}, "priority"),
    ("min_tokens past max_tokens", {"prompt": "x", "max_tokens": 3, "min_tokens": 4},
     "min_tokens"),
    ("negative min_tokens", {"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ("truncate_prompt_tokens zero", {"prompt": "x", "truncate_prompt_tokens": 0},
     "truncate_prompt_tokens"),
    ("truncate_prompt_tokens below -1", {"prompt": "x", "truncate_prompt_tokens": -2},
     "truncate_prompt_tokens"),
    ("return_token_ids not a boolean", {"prompt": "x", "return_token_ids": 1},
     "return_token_ids"),
    ("cache_salt empty", {"prompt": "x", "cache_salt": ""}, "cache_salt"),
    ("cache_salt not a string", {"prompt": "x", "cache_salt": 7}, "cache_salt"),
    ("include_stop_str_in_output not boolean",
     {"prompt": "x", "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ("min_tokens not integer", {"prompt": "x", "min_tokens": 1.5}, "min_tokens"),
    ("bad_words not a list", {"prompt": "x", "bad_words": "word"}, "bad_words"),
    ("bad word not string", {"prompt": "x", "bad_words": ["a", 3]}, "bad_words"),
    ("bad word only whitespace", {"prompt": "x", "bad_words": ["  "]}, "bad_words"),
    ("allowed_token_ids empty", {"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids"),
    ("allowed token outside vocabulary", {"prompt": "x", "allowed_token_ids": [1, 256]},
     "allowed_token_ids"),
    ("allowed token not integer", {"prompt": "x", "allowed_token_ids": ["a"]},
     "allowed_token_ids"),
]
# The whole message where it names an entry or a range: an id past int32 as
# one past the vocabulary, a number past int64 as one past int32.
BAD_BODY_MESSAGES = {
    "logit bias outside vocabulary": "logit_bias: id 256 is outside the vocabulary [0, 256)",
    "n past 128": "n: must be in [1, 128], found 129",
    "best_of above n":
        "best_of: must equal n (2): returning the best of more samples is not supported, found 3",
    "token outside vocabulary": "prompt: ids[1] = 256 is outside the vocabulary [0, 256)",
    "token past int32": "prompt: ids[1] = 4294967296 is outside the vocabulary [0, 256)",
    "stop token outside vocabulary":
        "stop_token_ids: stop_token_ids[0] = 999 is outside the vocabulary [0, 256)",
    "stop token past int32":
        "stop_token_ids: stop_token_ids[0] = -3000000000 is outside the vocabulary [0, 256)",
    "stop entry not string": "stop: stop[1] must be a string, found 1",
    "max_tokens past int64": "max_tokens: must be in [1, 2147483647], found 1e+20",
    "min_tokens past max_tokens": "min_tokens: must be in [0, max_tokens = 3], found 4",
    "negative min_tokens": "min_tokens: must be in [0, 2147483647], found -1",
    "bad_words not a list": "bad_words: must be a list of strings, found \"word\"",
    "bad word not string": "bad_words: bad_words[1] must be a string, found 3",
    "bad word only whitespace": "bad_words: bad_words[0] is only whitespace",
    "allowed_token_ids empty": "allowed_token_ids: the list is empty (null: every id)",
    "allowed token outside vocabulary":
        "allowed_token_ids: allowed_token_ids[1] = 256 is outside the vocabulary [0, 256)",
    "priority without the priority policy":
        "priority: must be 0: this server schedules in arrival order (start it with "
        "--scheduling-policy priority), found 2",
}


@pytest.mark.parametrize("name,body,param", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_field_is_400_naming_the_param(server, client, name, body, param):
    # The client's raw post: some of these fields are not in its signature.
    with pytest.raises(openai.BadRequestError) as error:
        client.post("/completions", body={"model": MODEL, **body}, cast_to=httpx.Response)
    assert error.value.status_code == 400
    details = error.value.body
    assert details["param"] == param, details
    assert details["message"].startswith(param + ": "), details
    assert details["message"] == BAD_BODY_MESSAGES.get(name, details["message"]), details
    assert details["type"] == "invalid_request_error" and details["code"] == "invalid_argument"
    # The server keeps serving.
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage.total_tokens


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


def test_version_names_the_build_as_the_binary_does(server):
    """vLLM's GET /version: the release, and the source revision beside it,
    as `switchserve --version` prints them, and as the log's first line
    names them."""
    build = dict(zip(("version", "revision"), binary_version(BINARY)))
    answer = httpx.get(server.url + "/version", timeout=30)
    assert answer.status_code == 200
    assert answer.json() == build
    # The startup log's first line says it too.
    first = json.loads(server.log().splitlines()[0])
    assert first["msg"] == "starting switchserve"
    assert {key: first[key] for key in build} == build
    answer = httpx.post(server.url + "/version", timeout=30)
    assert answer.status_code == 405 and answer.headers["allow"] == "GET"


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
        assert curl("-i", server.url + "/metrics").stdout.startswith("HTTP/1.1 401")
        assert curl("-i", "-H", "authorization: Bearer http-token",
                    server.url + "/metrics").stdout.startswith("HTTP/1.1 200")
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            assert post_json(server, path, body)[0] == 401
            assert post_json(server, path, body, token="nope")[0] == 401
            assert post_json(server, path, body, token="http-token")[0] == 200
        good = server.client(api_key="http-token")
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).usage
        assert [m.id for m in good.models.list().data] == [MODEL]
        # Probes need no token, nor does the build's version.
        assert curl(server.url + "/health").stdout and curl(server.url + "/ready").stdout
        assert curl("-i", server.url + "/version").stdout.startswith("HTTP/1.1 200")
    finally:
        server.close()


def metric_names(text):
    """The series names of a Prometheus text (comments left out)."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_metrics_on_the_http_port(server):
    """GET /metrics on the HTTP port (where vLLM serves them): the metrics
    port's series, less prometheus-cpp's own exposer_*; 404 when metrics
    are off; 405 for another method."""
    with_metrics = Server(metrics=True)
    try:
        with_metrics.client().completions.create(model=MODEL, prompt="x", max_tokens=2)
        result = curl("-i", with_metrics.url + "/metrics")
        assert result.stdout.startswith("HTTP/1.1 200"), result.stdout[:300]
        assert "content-type: text/plain; version=0.0.4" in result.stdout.lower()
        here = metric_names(re.split(r"\r?\n\r?\n", result.stdout, maxsplit=1)[1])
        scraped = metric_names(with_metrics.scrape_metrics())
        assert here == {name for name in scraped if not name.startswith("exposer_")}
        assert "switchserve_requests_total" in here and "process_cpu_seconds_total" in here
        assert curl("-i", "-X", "POST", with_metrics.url + "/metrics").stdout.startswith(
            "HTTP/1.1 405")
    finally:
        with_metrics.close()
    result = curl("-i", server.url + "/metrics")
    assert result.stdout.startswith("HTTP/1.1 404"), result.stdout[:300]
    assert "--metrics-port 0" in result.stdout


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
        # The last step may reach the metrics just after the response.
        text = server.scrape_metrics_after_steps(5)
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
