"""Isolation over gRPC, as a client sees it: the real server with the built-in
model, a greedy request (logprobs, routing) sent alone and then among 31
concurrent requests from other clients, several times. Under the sequence
capacity scope (the default) its token ids and logprobs are the same every
time, bit for bit, with drop, reroute and dropless dispatch; the server's
metrics show that requests were preempted and assignments dropped. Under
--capacity-scope step the same traffic changes it, and the server warns at
startup.

Steps of at most 4 tokens (--max-batch-tokens 4): many steps, many
preemptions (tests/unit/isolation_test.cc also runs longer prompt chunks)."""

import concurrent.futures
import os
import re
import time

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
import pytest
from server_process import ServerProcess, free_port

BINARY = os.environ["SWITCHSERVE_BINARY"]
SOURCE_DIR = os.environ["SWITCHSERVE_SOURCE_DIR"]
MODEL = os.path.join(SOURCE_DIR, "models/default")
# One full context (256 tokens) of the built-in model: 4 layers x 128 K/V
# values x 4 bytes per token.
KV_CACHE_BYTES = 256 * 4 * 128 * 4


class Server(ServerProcess):
    """`switchserve serve` with the built-in model and a small token budget
    and cache, metrics on a free port."""

    def __init__(self, *extra_args):
        super().__init__(BINARY, MODEL, "--max-batch-tokens", "4", "--max-running-requests", "32",
                         "--kv-block-size", "4", "--kv-cache-bytes", str(KV_CACHE_BYTES),
                         *extra_args, metrics_port=free_port(), prefix="switchserve_isolation_")

    def metric_total(self, name):
        """Sum of every series of counter `name` on /metrics."""
        text = self.scrape_metrics()
        return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def victim_request():
    return pb.GenerateRequest(
        text="And God said unto Moses, Speak unto the children of Israel",
        sampling=pb.SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True),
        logprobs=1, return_routing=True)


NEIGHBOUR_TEXTS = ["In the beginning", "Blessed are the meek: for they shall inherit the earth.",
                   "abc", "And it came to pass in those days, that there went out a decree",
                   "The LORD is my shepherd; I shall not want.", "zzzzzzzzzzzzzzzzzzzz",
                   "1234567890 1234567890", "For God so loved the world,"]


def neighbour_request(i):
    text = NEIGHBOUR_TEXTS[i % len(NEIGHBOUR_TEXTS)] + ("" if i < 8 else f" {i * 7919}")
    sampling = pb.SamplingParams(max_new_tokens=40 + (i * 7) % 41, ignore_eos=True)
    if i % 3 == 0:
        sampling.temperature = 0.0
    else:
        sampling.temperature = 0.8
        sampling.top_p = 0.95
        sampling.seed = 1000 + i
    return pb.GenerateRequest(text=text, sampling=sampling, logprobs=i % 4)


def outcome(response):
    """What must not change: ids, logprob bits, alternatives, routing."""
    return [(t.token_id, t.logprob, [(a.token_id, a.logprob) for a in t.top_logprobs],
             [(r.layer, r.module, r.head, [(e.expert, e.gate, e.fate) for e in r.experts])
              for r in t.routing.routers])
            for t in response.tokens]


def dropped(response):
    return sum(e.fate == "dropped" for t in response.tokens for r in t.routing.routers
               for e in r.experts)


def run_crowded(server, victim_index):
    """The victim among 31 neighbours, all sent at once from their own
    threads (victim_index None: the victim is sent once the server holds all
    31, so that it runs with the last of them); the victim's response."""
    with server.channel() as channel:
        stub = pb_grpc.GenerationStub(channel)
        neighbours = [neighbour_request(i) for i in range(31)]
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            if victim_index is None:
                futures = [pool.submit(stub.Generate, r, timeout=300) for r in neighbours]
                deadline = time.monotonic() + 60
                while True:
                    cache = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).cache
                    done = sum(f.done() for f in futures)
                    if cache.running_requests + cache.waiting_requests + done >= 31:
                        break
                    assert time.monotonic() < deadline, "the neighbours never all arrived"
                victim = pool.submit(stub.Generate, victim_request(), timeout=300)
            else:
                requests = list(neighbours)
                requests.insert(victim_index, victim_request())
                futures = [pool.submit(stub.Generate, r, timeout=300) for r in requests]
                victim = futures.pop(victim_index)
            responses = [f.result() for f in futures] + [victim.result()]
    for r in responses:
        assert r.finish_reason == pb.FINISH_REASON_LENGTH
    return responses[-1]


def run_alone(server):
    with server.channel() as channel:
        return pb_grpc.GenerationStub(channel).Generate(victim_request(), timeout=120)


SEQUENCE_DISPATCHES = {
    "drop": ["--capacity-factor", "1.0", "--capacity-group", "16", "--min-capacity", "0",
             "--overflow", "drop"],
    "reroute": ["--capacity-factor", "1.0", "--capacity-group", "16", "--min-capacity", "0",
                "--overflow", "reroute"],
    "dropless": ["--capacity-factor", "0"],
}


@pytest.mark.parametrize("policy", sorted(SEQUENCE_DISPATCHES))
def test_sequence_scope_request_does_not_feel_its_neighbours(policy):
    server = Server(*SEQUENCE_DISPATCHES[policy])
    try:
        assert "capacity_scope \"step\"" not in server.log()
        alone = run_alone(server)
        assert len(alone.tokens) == 16
        if policy != "dropless":
            assert dropped(alone) > 0, "the victim's own assignments are dropped"
        for victim_index in (0, 13, 31, None):
            crowded = run_crowded(server, victim_index)
            assert list(crowded.token_ids) == list(alone.token_ids), victim_index
            assert outcome(crowded) == outcome(alone), victim_index
        assert server.metric_total("switchserve_preemptions_total") > 0
        if policy != "dropless":
            assert server.metric_total("switchserve_moe_dropped_total") > 0
        if policy == "reroute":
            assert server.metric_total("switchserve_moe_rerouted_total") > 0
    finally:
        server.close()


def test_step_scope_request_feels_its_neighbours_and_the_server_warns():
    # Steps of at least 1 ms: the 31 neighbours are all in the server long
    # before they finish.
    server = Server("--capacity-scope", "step", "--capacity-factor", "1.0", "--min-capacity", "0",
                    "--overflow", "drop", "--debug-step-delay-ms", "1")
    try:
        assert "warning: capacity_scope \"step\"" in server.log()
        assert "arXiv:2402.05526" in server.log()
        alone = outcome(run_alone(server))
        # Sent once the 31 others are in the server, the victim shares steps
        # with them whatever the timing of the clients.
        changed = [outcome(run_crowded(server, None)) != alone for _ in range(2)]
        assert all(changed), changed
    finally:
        server.close()
