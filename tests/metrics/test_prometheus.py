"""Real-Prometheus test of the metrics, the dashboard and the alert rules.

Starts Debian's `prometheus` with a temporary scrape config (1 s interval) and
the rule file, and four copies of the test exporter (the real MoeMetrics /
ServingMetrics / MetricsExposer code on synthetic engine steps, see
metrics_exporter.cc):

  load      paper-shaped model under simulated request load, layer 0 skewed,
            capacity factor 1 (drops)
  known     idle until told to run a fixed batch; capacity 1, overflow drop
  reroute   the same with overflow reroute
  dropless  the same, dropless

Then checks, through Prometheus's HTTP API, that the counters equal the
engine's own totals (drops rising by exactly the engine's count, zero when
dropless), that the aux-loss PromQL of docs/metrics.md equals the engine's
value, that every dashboard query parses and returns data, and that every
alert expression parses (and the ones the load should trip do).

Run: SWITCHSERVE_METRICS_EXPORTER=build/.../switchserve_metrics_exporter \
     python3 -m pytest tests/metrics/test_prometheus.py
"""

import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from prom_harness import (
    ALERTS,
    PROMTOOL,
    alert_rules,
    aux_loss_query,
    check_every_dashboard_query,
    dashboard_expressions,
    doc_block,
    doc_queries,
    eventually,
    free_port,
    running_prometheus,
    substitute,
    wait_for,
)

BATCH_STEPS = 20
BATCH_TOKENS = 48
POOLED = ["pooled-a", "pooled-b"]


class Exporter:
    def __init__(self, binary, name, args):
        self.name = name
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, f"--port={self.port}", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        assert line.startswith("listening"), f"{name}: {line!r}"

    def run_batch(self, steps, tokens):
        self.process.stdin.write(f"run {steps} {tokens}\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    binary = os.environ.get("SWITCHSERVE_METRICS_EXPORTER")
    assert binary and os.access(binary, os.X_OK), "set SWITCHSERVE_METRICS_EXPORTER"
    common = ["--model=small", "--skew=1.5", "--mode=commanded"]
    exporters = {}
    try:
        exporters["load"] = Exporter(
            binary, "load", ["--mode=load", "--model=paper", "--capacity_factor=1", "--skew=3"]
        )
        exporters["known"] = Exporter(binary, "known", [*common, "--capacity_factor=1"])
        exporters["reroute"] = Exporter(
            binary, "reroute", [*common, "--capacity_factor=1", "--overflow=reroute"]
        )
        exporters["dropless"] = Exporter(binary, "dropless", [*common, "--capacity_factor=0"])
        # Two replicas of one job, for the pooled queries.
        for name in POOLED:
            exporters[name] = Exporter(binary, name, [*common, "--capacity_factor=1"])
        targets = {f"switchserve-{name}": e.port for name, e in exporters.items()
                   if name not in POOLED}
        targets["switchserve-pooled"] = [exporters[name].port for name in POOLED]
        with running_prometheus(tmp_path_factory.mktemp("prometheus"), targets) as prom:
            yield prom, exporters
    finally:
        for exporter in exporters.values():
            exporter.stop()


def by_expert(vector, job):
    out = {}
    for labels, value in vector.items():
        d = dict(labels)
        if d.get("job") == f"switchserve-{job}":
            out[(d["layer"], d["module"], d["head"], d["expert"])] = value
    return out


def engine_by_expert(totals, field):
    return {
        (r["layer"], r["module"], r["head"], str(e)): float(v)
        for r in totals["routers"]
        for e, v in enumerate(r[field])
    }


@pytest.fixture(scope="module")
def batches(stack):
    """Runs the known batch on every commanded exporter once Prometheus has
    scraped their zero counters; waits until it has scraped the totals."""
    prom, exporters = stack
    commanded = ["known", "reroute", "dropless"]

    def zeros_scraped():
        v = prom.vector(
            'sum by (job) (switchserve_moe_router_tokens_total{job!~"switchserve-(load|pooled)"})')
        return len(v) == len(commanded) and all(x == 0 for x in v.values())

    wait_for("zero counters scraped", zeros_scraped)
    before = time.time()
    time.sleep(1.5)  # a second scrape at zero, strictly before the batch
    totals = {name: exporters[name].run_batch(BATCH_STEPS, BATCH_TOKENS) for name in commanded}
    for name in commanded:
        want = sum(r["tokens"] for r in totals[name]["routers"])
        assert want == BATCH_STEPS * BATCH_TOKENS * len(totals[name]["routers"])

        def scraped(name=name, want=want):
            v = prom.vector(f'sum(switchserve_moe_router_tokens_total{{job="switchserve-{name}"}})')
            return v and list(v.values())[0] == want

        wait_for(f"{name} batch scraped", scraped)
    return prom, totals, before


def test_counters_equal_engine_totals(batches):
    prom, totals, before = batches
    for name in ["known", "reroute", "dropless"]:
        for metric, field in [
            ("switchserve_moe_assignments_total", "routed"),
            ("switchserve_moe_dropped_total", "dropped"),
            ("switchserve_moe_rerouted_total", "rerouted"),
        ]:
            want = engine_by_expert(totals[name], field)
            # Waited for on its own: the scrape that held the router-token
            # total may predate the last step's other counters.
            got = eventually(lambda: by_expert(prom.vector(metric), name), want)
            assert got == want, (name, metric)
            # Scraped at zero before the batch: the rise is exactly the engine's count.
            assert set(by_expert(prom.vector(metric, at=before), name).values()) == {0.0}
        prob_sums = engine_by_expert(totals[name], "prob_sum")

        def probs_settled():
            probs = by_expert(prom.vector("switchserve_moe_gate_probability_sum_total"), name)
            return all(probs.get(k) == pytest.approx(v, rel=1e-12, abs=1e-9) for k, v in prob_sums.items())

        eventually(probs_settled, True)
        probs = by_expert(prom.vector("switchserve_moe_gate_probability_sum_total"), name)
        for key, want in prob_sums.items():
            assert probs[key] == pytest.approx(want, rel=1e-12, abs=1e-9)


def test_drops_and_dropless(batches):
    _, totals, _ = batches
    dropped = lambda name: sum(engine_by_expert(totals[name], "dropped").values())
    rerouted = lambda name: sum(engine_by_expert(totals[name], "rerouted").values())
    assert dropped("known") > 0 and rerouted("known") == 0
    assert rerouted("reroute") > 0
    assert dropped("dropless") == 0 and rerouted("dropless") == 0
    # ...and Prometheus shows the same: test_counters_equal_engine_totals.


def by_router(vector):
    out = {}
    for labels, value in vector.items():
        d = dict(labels)
        out[(d["job"], d["layer"], d["module"], d["head"])] = value
    return out


def test_aux_loss_promql_equals_engine(batches):
    prom, totals, _ = batches

    def read():
        return (by_router(prom.vector(aux_loss_query().replace("$window", "2m"))),
                by_router(prom.vector("switchserve_moe_aux_loss")))

    def settled():
        from_counters, gauges = read()
        for name in ["known", "reroute", "dropless"]:
            for router in totals[name]["routers"]:
                key = (f"switchserve-{name}", router["layer"], router["module"], router["head"])
                for got in (from_counters.get(key), gauges.get(key)):
                    if got is None or got != pytest.approx(router["aux_loss"], rel=1e-9):
                        return False
        return True

    # Waited for on its own, as the counters are.
    eventually(settled, True)
    from_counters, gauges = read()
    for name in ["known", "reroute", "dropless"]:
        for router in totals[name]["routers"]:
            key = (f"switchserve-{name}", router["layer"], router["module"], router["head"])
            assert from_counters[key] == pytest.approx(router["aux_loss"], rel=1e-9), key
            # The gauge's window (64 steps) holds the whole batch.
            assert gauges[key] == pytest.approx(router["aux_loss"], rel=1e-9), key


def test_pooled_aux_loss_promql_equals_engine(stack):
    """The pooled query of docs/metrics.md over two replicas that ran the same
    batch: their pooled f_e and P_e are each one's, so is the aux loss."""
    prom, exporters = stack

    def zeros_scraped():
        v = prom.vector('switchserve_moe_router_tokens_total{job="switchserve-pooled"}')
        replicas = {dict(labels)["instance"] for labels in v}
        return len(replicas) == len(POOLED) and all(x == 0 for x in v.values())

    wait_for("pooled zero counters scraped", zeros_scraped)
    time.sleep(1.5)  # a second scrape at zero, strictly before the batch
    totals = [exporters[name].run_batch(BATCH_STEPS, BATCH_TOKENS) for name in POOLED]
    assert totals[0] == totals[1]
    want = 2 * sum(r["tokens"] for r in totals[0]["routers"])
    wait_for("pooled batches scraped", lambda: list(prom.vector(
        'sum(switchserve_moe_router_tokens_total{job="switchserve-pooled"})').values()) == [want])
    query = doc_block("aux-loss-query-pooled").replace("$window", "2m")

    def pooled():
        return {key: value for key, value in by_router(prom.vector(query)).items()
                if key[0] == "switchserve-pooled"}

    def settled():
        got = pooled()
        return len(got) == len(totals[0]["routers"]) and all(
            got[("switchserve-pooled", r["layer"], r["module"], r["head"])]
            == pytest.approx(r["aux_loss"], rel=1e-9) for r in totals[0]["routers"])

    eventually(settled, True)
    got = pooled()
    for router in totals[0]["routers"]:
        key = ("switchserve-pooled", router["layer"], router["module"], router["head"])
        assert got[key] == pytest.approx(router["aux_loss"], rel=1e-9), key


def test_window_queries_of_the_docs(batches):
    """Every query under "Other windows" parses and returns data; a router's
    expert utilisations add up to its number of experts."""
    prom, _, _ = batches
    queries = doc_queries("window-queries")
    assert len(queries) == 3
    for query in queries:
        assert prom.vector(query), query
    utilisation = prom.vector(queries[2])
    experts = prom.vector("count by (layer, module, head) (count by (layer, module, head, expert) "
                          "(switchserve_moe_assignments_total))")
    sums = {}
    for labels, value in utilisation.items():
        d = dict(labels)
        key = frozenset({"layer": d["layer"], "module": d["module"], "head": d["head"]}.items())
        sums[key] = sums.get(key, 0.0) + value
    assert sums.keys() == experts.keys()
    for key, count in experts.items():
        assert sums[key] == pytest.approx(count, rel=1e-9), dict(key)


def test_exposition_passes_promtool_lint(stack):
    _, exporters = stack
    with urllib.request.urlopen(f"http://127.0.0.1:{exporters['load'].port}/metrics") as r:
        text = r.read()
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    for family in [b"switchserve_requests_total", b"process_cpu_seconds_total",
                   b"switchserve_time_to_first_token_seconds_bucket"]:
        assert family in text


def test_dashboard_is_provisionable(stack):
    dashboard, expressions = dashboard_expressions()
    assert dashboard["uid"] == "switchserve"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    def walk(panels):
        for panel in panels:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                for target in panel["targets"]:
                    assert target["datasource"]["uid"] == "${datasource}"
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    titles = [p["title"] for p in dashboard["panels"]]
    for module in ["attn_v", "attn_o", "ffn"]:
        assert any(t.startswith(f"{module} expert load") for t in titles)
    assert len(expressions) >= 30


def test_dashboard_variables_return_values(stack):
    prom, _ = stack
    dashboard, _ = dashboard_expressions()
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        selector, label = substitute(match.group(1)), match.group(2)
        values = prom.vector(f"group by ({label}) ({selector})")
        assert values, variable["name"]


def test_every_dashboard_query_returns_data(stack):
    prom, _ = stack
    # The load exporter needs a few seconds of scrapes for every rate window
    # and histogram to fill. Its job alone: the commanded exporters go idle
    # after their batch, and once it leaves the rate window their 0/0 ratios
    # (NaN) would make the panels that average over jobs return no number,
    # however long the test waits.
    check_every_dashboard_query(prom, overrides={"$job": "switchserve-load"})


def test_every_alert_expression_parses(stack):
    prom, _ = stack
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "SwitchserveExpertCollapse",
        "SwitchserveTokensDropped",
        "SwitchserveLatencySLOBurnFast",
        "SwitchserveKvCacheSaturated",
    }
    for rule in rules:
        reply = prom.query(rule["expr"])
        assert reply["status"] == "success", (rule["alert"], reply.get("error"))


def test_alerts_evaluate_and_trip_on_the_skewed_load(stack):
    prom, _ = stack

    def healthy_and_pending():
        rules = prom.get("/api/v1/rules")["data"]["groups"]
        evaluated = [r for g in rules for r in g["rules"]]
        if len(evaluated) != len(alert_rules()):
            return False
        if any(r["health"] != "ok" or r.get("lastEvaluation", "").startswith("0001") for r in evaluated):
            return False
        alerts = prom.get("/api/v1/alerts")["data"]["alerts"]
        # Layer 0 of the load exporter is skewed onto expert 0 at capacity
        # factor 1: collapse and dropping are pending (their `for` is minutes).
        pending = {
            (a["labels"]["alertname"], a["labels"].get("layer"))
            for a in alerts
            if a["labels"].get("job") == "switchserve-load" and a["state"] == "pending"
        }
        return {("SwitchserveExpertCollapse", "0"), ("SwitchserveTokensDropped", "0")} <= pending

    wait_for("rules healthy and the skewed layer's alerts pending", healthy_and_pending, timeout_s=30)


def test_promtool_check_rules():
    check = subprocess.run([PROMTOOL, "check", "rules", ALERTS], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
