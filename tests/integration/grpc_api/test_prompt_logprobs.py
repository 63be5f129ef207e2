"""A prompt's logprobs (GenerateRequest.prompt_logprobs): every prompt token
after the first, scored (logprob, rank) given the tokens before it, against the Python
reference's golden logits; the same in a unary response and in a stream's
first message, and the same whatever else the batch holds."""

import concurrent.futures
import os
import sys

import numpy as np

import generation_pb2 as pb
from grpc_harness import MODEL, SOURCE_DIR

sys.path.insert(0, os.path.join(SOURCE_DIR, "tools", "reference"))
import safetensors_io  # noqa: E402


def golden_sequence():
    """Sequence 0 of the served model's golden step: its tokens and the
    reference's logits at each of their positions (float64)."""
    golden = safetensors_io.load_file(os.path.join(MODEL, "golden.safetensors"))
    n = int(golden["seq_lens"][0])
    return golden["tokens"][:n].tolist(), golden["logits"][:n].numpy().astype(np.float64)


def scored_request(tokens, prompt_logprobs, max_new_tokens=1):
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=tokens),
                                 sampling=pb.SamplingParams(max_new_tokens=max_new_tokens,
                                                            temperature=0.0))
    request.prompt_logprobs = prompt_logprobs
    return request


def test_prompt_logprobs_match_the_reference(stub):
    """Tolerance: the golden test's for logits, 1e-4 of the largest logit,
    twice over (a logprob is a logit less the log-sum of all of them)."""
    tokens, logits = golden_sequence()
    top = 3
    response = stub.Generate(scored_request(tokens, top), timeout=60)
    assert [t.token_id for t in response.prompt_tokens] == tokens[1:]
    log_softmax = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(
        1, keepdims=True)) - logits.max(1, keepdims=True)
    tolerance = 2e-4 * np.abs(logits).max()
    for i, token in enumerate(response.prompt_tokens):
        want = log_softmax[i]
        assert abs(token.logprob - want[tokens[i + 1]]) <= tolerance, i
        assert len(token.top_logprobs) == top
        for alternative in token.top_logprobs:
            assert abs(alternative.logprob - want[alternative.token_id]) <= tolerance, i
        # The alternatives are the most likely tokens, most likely first.
        got = [a.logprob for a in token.top_logprobs]
        assert got == sorted(got, reverse=True), i
        assert got[-1] >= np.sort(want)[-top] - tolerance, i
        # The rank: 1 + the tokens the reference finds clearly more likely,
        # at most 1 + those within the tolerance or above.
        own = want[tokens[i + 1]]
        assert 1 + np.sum(want > own + tolerance) <= token.rank <= 1 + np.sum(
            want > own - tolerance), i
    assert len(response.token_ids) == 1
    assert response.usage.prompt_tokens == len(tokens)


def test_a_stream_carries_them_in_its_first_message_as_the_unary_response(stub):
    tokens, _ = golden_sequence()
    unary = stub.Generate(scored_request(tokens, 0, max_new_tokens=4), timeout=60)
    messages = list(stub.GenerateStream(scored_request(tokens, 0, max_new_tokens=4), timeout=60))
    # (Messages written while the client reads the first may be merged.)
    assert [i for m in messages for i in m.token_ids] == list(unary.token_ids)
    assert list(messages[0].prompt_tokens) == list(unary.prompt_tokens)
    assert all(len(m.prompt_tokens) == 0 for m in messages[1:])
    # 0 alternatives: each prompt token's own logprob only.
    assert all(len(t.top_logprobs) == 0 and t.logprob < 0 for t in unary.prompt_tokens)


def test_without_prompt_logprobs_there_are_none(stub):
    tokens, _ = golden_sequence()
    request = scored_request(tokens, 0)
    request.ClearField("prompt_logprobs")
    assert len(stub.Generate(request, timeout=60).prompt_tokens) == 0


def test_they_are_the_same_bits_among_other_requests(stub):
    """Isolation: the prompt's logprobs do not depend on the requests beside
    it, some of which ask for their own prompts' logprobs."""
    tokens, _ = golden_sequence()
    alone = stub.Generate(scored_request(tokens, 2), timeout=60).prompt_tokens
    others = [scored_request(tokens[i:] + tokens[:i], i % 3) for i in range(1, 16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(stub.Generate, r, timeout=60) for r in others]
        crowded = pool.submit(stub.Generate, scored_request(tokens, 2), timeout=60)
        for future in futures:
            future.result()
    assert list(crowded.result().prompt_tokens) == list(alone)
