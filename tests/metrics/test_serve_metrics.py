"""The metrics of `switchserve serve` itself, scraped by a real Prometheus.

Four servers of the SwitchAll golden model (tests/golden/switchall_capacity:
2 layers, 4 heads / 2 KV heads x 4 experts, an 8-expert FFN, capacity factor
1 with overflow=drop, step capacity scope):

  drop      as the model says: tokens are dropped
  sequence  --capacity-scope sequence --capacity-group 4: capacity per
            request, in groups of 4 positions; tokens are dropped
  dropless  --capacity-factor 0
  nomoe     --no-moe-metrics

Concurrent gRPC clients send one-token prompts with return_routing, so every
token any step computes is a sampled row whose routing (with each
assignment's fate) comes back to the client: the clients see everything the
engine counted, and the Prometheus counters must rise by exactly that.

Run: SWITCHSERVE_BINARY=build/.../server/switchserve \
     python3 -m pytest tests/metrics/test_serve_metrics.py
"""

import collections
import concurrent.futures
import importlib
import os
import subprocess
import sys

import pytest

from prom_harness import (
    SOURCE_DIR,
    alert_rules,
    check_every_dashboard_query,
    deploy_references,
    doc_references,
    documented_metrics,
    eventually,
    exposed_series,
    free_port,
    metric_families,
    reference_problems,
    running_prometheus,
    wait_for,
)

MODEL = os.path.join(SOURCE_DIR, "tests/golden/switchall_capacity")
CLIENTS = 16
ROUNDS = 3
NEW_TOKENS = 12
INVALID_REQUESTS = 2


def load_stubs(tmp):
    """switchserve.v1 Python stubs generated from proto/ with protoc."""
    out = tmp / "stubs"
    out.mkdir()
    subprocess.run(
        [
            "protoc",
            f"-I{SOURCE_DIR}/proto",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
            "switchserve/v1/generation.proto",
        ],
        check=True,
    )
    sys.path.insert(0, str(out))
    pb2 = importlib.import_module("switchserve.v1.generation_pb2")
    pb2_grpc = importlib.import_module("switchserve.v1.generation_pb2_grpc")
    return pb2, pb2_grpc


class Server:
    def __init__(self, binary, name, args, log_dir):
        self.name = name
        self.port = free_port()
        self.metrics_port = free_port()
        self.log = open(log_dir / f"{name}.log", "w")
        self.process = subprocess.Popen(
            [
                binary,
                "serve",
                f"--model={MODEL}",
                "--host=127.0.0.1",
                f"--port={self.port}",
                f"--metrics-port={self.metrics_port}",
                "--threads=1",
                *args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    binary = os.environ.get("SWITCHSERVE_BINARY")
    assert binary and os.access(binary, os.X_OK), "set SWITCHSERVE_BINARY"
    import grpc

    tmp = tmp_path_factory.mktemp("serve")
    pb2, pb2_grpc = load_stubs(tmp)
    servers = {}
    try:
        servers["drop"] = Server(binary, "drop", [], tmp)
        servers["sequence"] = Server(
            binary, "sequence", ["--capacity-scope=sequence", "--capacity-group=4"], tmp
        )
        servers["dropless"] = Server(binary, "dropless", ["--capacity-factor=0"], tmp)
        servers["nomoe"] = Server(binary, "nomoe", ["--no-moe-metrics"], tmp)
        targets = {f"serve-{name}": s.metrics_port for name, s in servers.items()}
        with running_prometheus(tmp, targets) as prom:
            channels = {
                name: grpc.insecure_channel(f"127.0.0.1:{s.port}") for name, s in servers.items()
            }
            for name, channel in channels.items():
                grpc.channel_ready_future(channel).result(timeout=30)
            yield prom, servers, channels, pb2, pb2_grpc
            for channel in channels.values():
                channel.close()
    finally:
        for server in servers.values():
            server.stop()


def expert_key(labels):
    d = dict(labels)
    return (d["layer"], d["module"], d["head"], d["expert"])


def counters(prom, metric, job):
    return {expert_key(k): v for k, v in prom.vector(f'{metric}{{job="{job}"}}').items()}


def scalar(prom, expr):
    v = prom.vector(expr)
    assert len(v) == 1, (expr, v)
    return list(v.values())[0]


def quiescent_scrape(prom, job, metric="switchserve_step_tokens_sum"):
    """Waits until Prometheus has two equal scrapes of `metric` for `job` in a
    row after the last change, and returns that value."""
    def stable():
        v = prom.vector(f'changes({metric}{{job="{job}"}}[3s])')
        return v and list(v.values())[0] == 0
    wait_for(f"{job} quiescent", stable, timeout_s=30)
    return scalar(prom, f'{metric}{{job="{job}"}}')


@pytest.fixture(scope="module")
def traffic(served):
    """Runs the load on every server; returns, per server, the counters
    before and after and what the clients saw."""
    prom, servers, channels, pb2, pb2_grpc = served
    before = {}
    for name in servers:
        job = f"serve-{name}"
        before[name] = {
            "step_tokens": quiescent_scrape(prom, job),
            "assignments": counters(prom, "switchserve_moe_assignments_total", job),
            "dropped": counters(prom, "switchserve_moe_dropped_total", job),
            "ok": scalar(prom, f'switchserve_requests_total{{job="{job}",protocol="grpc",status="OK"}}'),
            "invalid": scalar(
                prom, f'switchserve_requests_total{{job="{job}",protocol="grpc",status="INVALID_ARGUMENT"}}'
            ),
            "generated": scalar(prom, f'switchserve_generation_tokens_total{{job="{job}"}}'),
        }

    def one_call(stub, i):
        request = pb2.GenerateRequest(
            token_ids=pb2.TokenIds(ids=[32 + (i * 7) % 90]),
            sampling=pb2.SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True),
            return_routing=True,
        )
        return stub.Generate(request, timeout=120)

    seen = {}
    for name, channel in channels.items():
        stub = pb2_grpc.GenerationStub(channel)
        responses = []
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            for r in range(ROUNDS):
                responses += list(pool.map(lambda i: one_call(stub, i), range(r * CLIENTS, (r + 1) * CLIENTS)))
        import grpc

        for _ in range(INVALID_REQUESTS):
            with pytest.raises(grpc.RpcError) as error:
                stub.Generate(pb2.GenerateRequest(text=""), timeout=10)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fates = collections.Counter()
        choices = collections.Counter()
        tokens = 0
        for response in responses:
            assert len(response.tokens) == NEW_TOKENS
            for token in response.tokens:
                tokens += 1
                for router in token.routing.routers:
                    for choice in router.experts:
                        key = (str(router.layer), router.module, str(router.head), str(choice.expert))
                        fates[(key, choice.fate)] += 1
                        choices[key] += 1
        seen[name] = {"fates": fates, "choices": choices, "tokens": tokens}

    after = {}
    for name in servers:
        job = f"serve-{name}"
        want = before[name]["step_tokens"] + seen[name]["tokens"]
        wait_for(
            f"{job} load scraped",
            lambda: scalar(prom, f'switchserve_step_tokens_sum{{job="{job}"}}') == want,
        )
        # Every counter the tests compare, waited for on its own: one scrape
        # can hold the step-token sum of the last step and not yet its
        # routing counters.
        fates = seen[name]["fates"]
        dropped_seen = sum(n for (_, fate), n in fates.items() if fate == "dropped")
        choices_seen = sum(seen[name]["choices"].values())
        if name != "nomoe":
            for metric, rise in [
                ("switchserve_moe_dropped_total", dropped_seen),
                ("switchserve_moe_assignments_total", choices_seen),
            ]:
                key = "dropped" if "dropped" in metric else "assignments"
                base = sum(before[name][key].values())
                eventually(lambda: sum(counters(prom, metric, job).values()), base + rise)
            router_tokens = f'switchserve_moe_router_tokens_total{{job="{job}"}}'
            eventually(lambda: set(prom.vector(router_tokens).values()), {want})
        after[name] = {
            "assignments": counters(prom, "switchserve_moe_assignments_total", job),
            "dropped": counters(prom, "switchserve_moe_dropped_total", job),
            "router_tokens": {
                k: v
                for k, v in prom.vector(f'switchserve_moe_router_tokens_total{{job="{job}"}}').items()
            },
        }
    return prom, before, after, seen


def delta(after, before):
    return {k: after[k] - before.get(k, 0.0) for k in after}


@pytest.mark.parametrize("name", ["drop", "sequence"])
def test_drops_rise_by_exactly_what_the_engine_reported(traffic, name):
    _, before, after, seen = traffic
    dropped = delta(after[name]["dropped"], before[name]["dropped"])
    engine = {k: 0.0 for k in dropped}
    for (key, fate), n in seen[name]["fates"].items():
        if fate == "dropped":
            engine[key] += n
    assert dropped == engine
    assert sum(dropped.values()) > 0, "capacity factor 1 should drop some assignments"
    # overflow=drop: every assignment is where the router sent it.
    assignments = delta(after[name]["assignments"], before[name]["assignments"])
    assert assignments == {k: float(seen[name]["choices"].get(k, 0)) for k in assignments}


def test_dropless_drops_nothing(traffic):
    _, before, after, seen = traffic
    assert set(after["dropless"]["dropped"].values()) == {0.0}
    assert not [f for (_, f) in seen["dropless"]["fates"] if f != "kept"]
    assignments = delta(after["dropless"]["assignments"], before["dropless"]["assignments"])
    assert assignments == {
        k: float(seen["dropless"]["choices"].get(k, 0)) for k in assignments
    }


def test_every_router_saw_every_token(traffic):
    prom, before, after, seen = traffic
    for name in ["drop", "sequence", "dropless"]:
        job = f"serve-{name}"
        step_tokens = scalar(prom, f'switchserve_step_tokens_sum{{job="{job}"}}')
        routers = after[name]["router_tokens"]
        assert len(routers) == 2 * (2 + 4 + 1)  # layers x (attn_v KV heads + attn_o heads + ffn)
        assert set(routers.values()) == {step_tokens}


def test_serving_counters(traffic):
    prom, before, _, seen = traffic
    requests = CLIENTS * ROUNDS
    for name in ["drop", "sequence", "dropless", "nomoe"]:
        job = f"serve-{name}"
        # Each value waited for on its own (see prom_harness.eventually): the
        # rejected requests, for one, change no step counter.
        def settled(expr, want):
            return eventually(lambda: scalar(prom, expr), want)

        ok = settled(
            f'switchserve_requests_total{{job="{job}",protocol="grpc",status="OK"}}',
            before[name]["ok"] + requests,
        )
        invalid = settled(
            f'switchserve_requests_total{{job="{job}",protocol="grpc",status="INVALID_ARGUMENT"}}',
            before[name]["invalid"] + INVALID_REQUESTS,
        )
        generated = settled(
            f'switchserve_generation_tokens_total{{job="{job}"}}',
            before[name]["generated"] + requests * NEW_TOKENS,
        )
        assert ok - before[name]["ok"] == requests
        assert invalid - before[name]["invalid"] == INVALID_REQUESTS
        assert generated - before[name]["generated"] == requests * NEW_TOKENS
        latency_count = f'switchserve_e2e_request_latency_seconds_count{{job="{job}"}}'
        wait_for(f"{job} latency count", lambda: scalar(prom, latency_count) >= requests)
        assert settled(f'switchserve_requests_running{{job="{job}"}}', 0) == 0
        assert settled(f'switchserve_requests_waiting{{job="{job}"}}', 0) == 0


def test_no_moe_metrics_flag(traffic):
    prom, _, _, _ = traffic
    assert prom.vector('count by (job) ({__name__=~"switchserve_moe_.*", job="serve-nomoe"})') == {}
    assert prom.vector('count by (job) ({__name__=~"switchserve_moe_.*", job="serve-drop"})')
    assert prom.vector('process_resident_memory_bytes{job="serve-nomoe"}')


def test_dashboard_and_alerts_against_the_server(traffic):
    prom, _, _, _ = traffic
    # The load has ended; a five-minute window (longer than this test's time
    # limit) still holds it, however slowly a loaded machine got here.
    check_every_dashboard_query(
        prom, overrides={"$__rate_interval": "5m", "$__range": "5m"}, timeout_s=20
    )
    for rule in alert_rules():
        assert prom.query(rule["expr"])["status"] == "success", rule["alert"]


def test_every_series_the_deployment_queries_is_exposed(traffic):
    """The dashboard, the alert rules and the autoscaler name series, labels
    and label values this server exports. A query of a renamed metric parses
    and returns nothing: an alert that never fires, a blank panel."""
    prom, _, _, _ = traffic
    series = exposed_series(prom, "serve-drop")
    refs = deploy_references()
    assert {r.where for r in refs} >= {
        "alert SwitchserveLatencySLOBurnFast",
        "HorizontalPodAutoscaler",
    }
    problems = [p for ref in refs for p in reference_problems(ref, series)]
    assert not problems, "\n".join(problems)


def test_metrics_doc_matches_the_exposition(traffic):
    """docs/metrics.md documents every metric family the server exports and
    no other; its PromQL examples ask for exposed series and labels."""
    prom, _, _, _ = traffic
    series = exposed_series(prom, "serve-drop")
    families = metric_families(series)
    documented = documented_metrics()
    assert sorted(families - documented) == [], "exported, not in docs/metrics.md"
    assert sorted(documented - families) == [], "in docs/metrics.md, not exported"
    problems = [p for ref in doc_references() for p in reference_problems(ref, series)]
    assert not problems, "\n".join(problems)
