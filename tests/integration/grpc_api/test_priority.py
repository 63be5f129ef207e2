"""--scheduling-policy priority: a request's `priority` (lower first) orders
the queue, and a waiting request of a higher priority that finds no running
slot takes one from a running request of a lower priority, which is
preempted and recomputed: both give the tokens they give alone. A server
scheduling in arrival order (the default) refuses a priority."""

import threading
import time

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


def test_a_full_queue_gives_way_to_a_higher_priority():
    """--max-queue full of low-priority requests that have not started: a
    higher-priority request is queued in place of the latest of them, which
    ends RESOURCE_EXHAUSTED ("displaced"), counted and logged; one of the
    same priority is refused; the server goes on serving."""
    # Steps of 40 ms: the running request holds the only slot for 2 s.
    server = Server("--scheduling-policy", "priority", "--max-running-requests", "1",
                    "--max-queue", "2", "--debug-step-delay-ms", "40", "--log-format", "json",
                    metrics_port=free_port())
    try:
        with server.channel() as channel:
            stub = pb_grpc.GenerationStub(channel)

            def request(priority, tokens):
                r = text_request("And God said", tokens, ignore_eos=True)
                r.priority = priority
                return r

            running = stub.Generate.future(request(0, 50), timeout=60,
                                           metadata=[("x-request-id", "running")])
            waiting = []
            for name in ("old-low", "new-low"):
                # One at a time, each queued before the next is sent.
                waiting.append(stub.Generate.future(request(5, 2), timeout=60,
                                                    metadata=[("x-request-id", name)]))
                deadline = time.monotonic() + 30
                while stub.GetModelInfo(pb.GetModelInfoRequest(),
                                        timeout=10).cache.waiting_requests < len(waiting):
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Generate(request(5, 2), timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            high = stub.Generate(request(1, 2), timeout=60, metadata=[("x-request-id", "high")])
            assert len(high.token_ids) == 2
            with pytest.raises(grpc.RpcError) as displaced:
                waiting[1].result()
            assert displaced.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "displaced" in displaced.value.details()
            assert len(waiting[0].result().token_ids) == 2
            assert len(running.result().token_ids) == 50
            expect_good_request_works(stub)
        logged = {line["request_id"]: line["status"] for line in access_lines(server)}
        assert logged["new-low"] == "RESOURCE_EXHAUSTED" and logged["old-low"] == "OK"
        assert logged["high"] == "OK"
        assert metric(server.scrape_metrics(),
                      'switchserve_requests_total{protocol="grpc",status="RESOURCE_EXHAUSTED"}') == 2
    finally:
        server.close()
