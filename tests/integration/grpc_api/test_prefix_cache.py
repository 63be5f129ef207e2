"""Prefix caching (--enable-prefix-caching): a server that keeps computed KV
blocks answers a conversation's turns, a repeated prompt and a streamed
request with the same tokens and logprobs, bit for bit, as a server without
it, while reporting the prompt tokens it did not compute in the response's
usage, the access log and the metrics. Both servers run capacity groups of
16 positions with a capacity limit, and blocks of 4 tokens, so cached
prefixes end inside groups."""

import struct

import grpc
import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from grpc_harness import Server, access_lines, metric, text_request, wait_for_idle_engine
from server_process import free_port

DISPATCH = ("--capacity-factor", "1", "--capacity-group", "16", "--min-capacity", "0",
            "--kv-block-size", "4", "--log-format", "json")


def bits(values):
    return [struct.pack("<f", v) for v in values]


def answer(stub, request):
    """The unary response's tokens, their logprobs' bits and its usage."""
    response = stub.Generate(request, timeout=60)
    return (list(response.token_ids), bits(t.logprob for t in response.tokens),
            response.usage)


def streamed(stub, request):
    tokens, logprobs, usage = [], [], None
    for message in stub.GenerateStream(request, timeout=60):
        tokens += list(message.token_ids)
        logprobs += bits(t.logprob for t in message.tokens)
        if message.HasField("usage"):
            usage = message.usage
    return tokens, logprobs, usage


def conversation(stub):
    """Each request's (tokens, logprob bits, usage): a first turn, the next
    turn (the first's prompt, its answer and more), the first again, and the
    next turn streamed."""
    text = "And God said unto Moses, Speak"
    first = text_request(text, 12, ignore_eos=True)
    first.logprobs = 2
    results = [answer(stub, first)]

    def ids(text):
        return list(stub.Tokenize(pb.TokenizeRequest(text=text), timeout=10).token_ids)

    following = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=ids(text) + results[0][0] + ids(" unto")),
        sampling=pb.SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True))
    following.logprobs = 2
    results.append(answer(stub, following))
    results.append(answer(stub, first))
    results.append(streamed(stub, following))
    return results


def test_cached_prefixes_give_the_same_bits_and_are_counted():
    plain = Server(*DISPATCH, metrics_port=free_port())
    cached = Server(*DISPATCH, "--enable-prefix-caching", metrics_port=free_port())
    try:
        with plain.channel() as channel:
            want = conversation(pb_grpc.GenerationStub(channel))
        with cached.channel() as channel:
            got = conversation(pb_grpc.GenerationStub(channel))
        for i, ((want_tokens, want_bits, want_usage), (tokens, logprobs, usage)) in enumerate(
                zip(want, got)):
            assert tokens == want_tokens, i
            assert logprobs == want_bits, i
            assert usage.prompt_tokens == want_usage.prompt_tokens, i
            assert want_usage.cached_prompt_tokens == 0, i
        prompt = [usage.prompt_tokens for _, _, usage in got]
        hits = [usage.cached_prompt_tokens for _, _, usage in got]
        assert hits[0] == 0
        # The next turn finds the first prompt and blocks of its answer.
        assert prompt[0] < hits[1] < prompt[1], hits
        # ... and ends inside a capacity group: it brings the group's loads.
        assert hits[1] % 16 != 0, hits
        # The first prompt again: all but its last token at most (a step
        # computes the token the answer starts from).
        assert 0 < hits[2] < prompt[2], hits
        assert hits[3] >= hits[1], hits

        text = wait_for_idle_engine(cached)
        assert metric(text, "switchserve_prefix_cache_query_tokens_total") == sum(prompt)
        assert metric(text, "switchserve_prefix_cache_hit_tokens_total") == sum(hits)
        assert metric(text, "switchserve_prompt_tokens_total") == sum(prompt) - sum(hits)
        text = wait_for_idle_engine(plain)
        assert "switchserve_prefix_cache_hit_tokens_total 0" in text
        assert metric(text, "switchserve_prefix_cache_query_tokens_total") == 0
        assert metric(text, "switchserve_prompt_tokens_total") == sum(prompt)

        logged = [line.get("cached_prompt_tokens", 0) for line in access_lines(cached)
                  if line["method"] in ("Generate", "GenerateStream")]
        assert logged == hits, logged
        assert "prefix caching on" in cached.log()
        assert "prefix caching off" in plain.log()
        # GetModelInfo: the flag, and the blocks the idle server keeps cached
        # (the conversation's whole blocks), which no request holds.
        for server, caching in ((cached, True), (plain, False)):
            with server.channel() as channel:
                cache = pb_grpc.GenerationStub(channel).GetModelInfo(
                    pb.GetModelInfoRequest(), timeout=10).cache
            assert cache.prefix_caching == caching
            assert cache.used_blocks == 0
            if caching:
                assert cache.cached_blocks >= (prompt[1] + 8) // 4 - 1, cache
            else:
                assert cache.cached_blocks == 0
    finally:
        plain.close()
        cached.close()


def test_a_salted_request_shares_cached_blocks_only_with_its_salt():
    """cache_salt: a prompt cached under one salt (or none) is computed again
    under another, and found again under the same; the answers are the same
    bits. An empty salt is refused, and the server goes on."""
    server = Server(*DISPATCH, "--enable-prefix-caching")
    try:
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)

            def ask(salt):
                request = text_request("And God said unto Moses, Speak", 6, ignore_eos=True)
                request.logprobs = 1
                if salt is not None:
                    request.cache_salt = salt
                return answer(stub, request)

            order = [None, "tenant-a", "tenant-a", "tenant-b", None, "tenant-b"]
            results = [ask(salt) for salt in order]
            hits = [usage.cached_prompt_tokens for _, _, usage in results]
            assert hits[0] == 0 and hits[1] == 0 and hits[3] == 0, hits
            assert hits[2] > 0 and hits[4] > 0 and hits[5] > 0, hits
            for tokens, logprobs, _ in results[1:]:
                assert (tokens, logprobs) == results[0][:2]

            bad = text_request("x", 2)
            bad.cache_salt = ""
            try:
                stub.Generate(bad, timeout=60)
                raise AssertionError("an empty cache_salt was served")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert error.details().startswith("cache_salt: "), error.details()
            assert ask("tenant-a")[2].cached_prompt_tokens > 0
    finally:
        server.close()
