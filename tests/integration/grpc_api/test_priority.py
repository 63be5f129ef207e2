"""--scheduling-policy priority: a request's `priority` (lower first) orders
the queue, and a waiting request of a higher priority that finds no running
slot takes one from a running request of a lower priority, which is
preempted and recomputed: both give the tokens they give alone. A server
scheduling in arrival order (the default) refuses a priority."""

import threading

import grpc
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from grpc_harness import Server, access_lines, expect_good_request_works, metric, text_request
from server_process import free_port


def test_a_higher_priority_takes_the_running_slot_of_a_lower_one():
    # One running request at a time, steps of 20 ms: the low-priority request
    # would hold the slot for 40 steps.
    server = Server("--scheduling-policy", "priority", "--max-running-requests", "1",
                    "--debug-step-delay-ms", "20", "--log-format", "json",
                    metrics_port=free_port())
    try:
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)
            low = text_request("And God said", 40, ignore_eos=True)
            low.priority = 5
            high = text_request("unto Moses", 4, ignore_eos=True)
            high.priority = -1
            alone = {name: list(stub.Generate(r, timeout=60).token_ids)
                     for name, r in (("low", low), ("high", high))}

            low_tokens = []
            first_token = threading.Event()

            def read_low():
                for message in stub.GenerateStream(low, timeout=60,
                                                   metadata=[("x-request-id", "low")]):
                    low_tokens.extend(message.token_ids)
                    first_token.set()

            reader = threading.Thread(target=read_low)
            reader.start()
            assert first_token.wait(30)
            response = stub.Generate(high, timeout=60, metadata=[("x-request-id", "high")])
            reader.join(60)
            assert list(response.token_ids) == alone["high"]
            assert low_tokens == alone["low"]
        # The high-priority request finished first, and the low one was
        # preempted once for it.
        lines = [line for line in access_lines(server) if line["request_id"] in ("low", "high")]
        assert [line["request_id"] for line in lines] == ["high", "low"], lines
        # The log gives each its priority.
        assert [line["priority"] for line in lines] == [-1, 5], lines
        with server.channel() as channel:
            info = pb_grpc.GenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest(),
                                                                timeout=10)
        assert info.scheduling_policy == "priority"
        text = server.scrape_metrics()
        assert metric(text, "switchserve_priority_preemptions_total") == 1
        assert metric(text, "switchserve_preemptions_total") == 0  # those for KV blocks
    finally:
        server.close()


@pytest.mark.parametrize("priority", [1, -1])
def test_a_priority_is_refused_where_requests_are_served_in_arrival_order(server, stub,
                                                                          priority):
    request = text_request("hello", 4)
    request.priority = priority
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("priority: must be 0")
    expect_good_request_works(stub)
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).scheduling_policy == "fcfs"
