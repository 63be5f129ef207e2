"""Shared by the metrics tests: a real Prometheus server on a temporary scrape
config, its HTTP API, and the dashboard / alert-rule expressions."""

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/util"))
from server_process import free_port  # noqa: E402  (the harness's users import it from here)
DASHBOARD = os.path.join(SOURCE_DIR, "deploy/grafana/switchserve.json")
ALERTS = os.path.join(SOURCE_DIR, "deploy/prometheus/alerts.yml")
METRICS_DOC = os.path.join(SOURCE_DIR, "docs/metrics.md")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# Grafana variables as the dashboard's queries see them with every value
# selected; $layer is one repeated row's value.
DASHBOARD_VARIABLES = {
    "$__rate_interval": "20s",
    "$__interval": "2s",
    "$__range": "1m",
    "$job": ".*",
    "$instance": ".*",
    "$layer": "0",
}


def wait_for(what, predicate, timeout_s=30.0, interval_s=0.25):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def eventually(read, want, timeout_s=30.0, interval_s=0.25):
    """Polls `read()` until it returns `want` or `timeout_s` passes, and returns
    its last value, for the caller to assert on. Prometheus scrapes each series
    when it scrapes, not when the engine step that changed it ended: a test
    waits on every value it asserts, not on one value standing for the rest."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = read()
        if last == want or time.monotonic() >= deadline:
            return last
        time.sleep(interval_s)


class Prometheus:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path, **params):
        url = f"{self.base}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:  # 400 for a bad query: keep the message
            return json.load(error)

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", **params)

    def vector(self, expr, at=None):
        """{frozenset(labels): value} of an instant query that must succeed."""
        reply = self.query(expr, at)
        assert reply["status"] == "success", (expr, reply)
        return {
            frozenset(item["metric"].items()): float(item["value"][1])
            for item in reply["data"]["result"]
        }

    def has_data(self, expr):
        """True when `expr` parses and returns at least one non-NaN sample."""
        reply = self.query(expr)
        assert reply["status"] == "success", (expr, reply.get("error"))
        return any(not math.isnan(float(r["value"][1])) for r in reply["data"]["result"])


@contextlib.contextmanager
def running_prometheus(tmp, targets):
    """Debian's prometheus scraping `targets` ({job: port or [ports]}) every
    second with the alert rules loaded; yields a Prometheus once every target
    is up."""
    assert os.access(PROMETHEUS, os.X_OK), "Debian's prometheus is needed (scripts/install-deps.sh)"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [ALERTS],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [
                f"127.0.0.1:{p}" for p in (port if isinstance(port, list) else [port])]}]}
            for job, port in targets.items()
        ],
    }
    config_path = tmp / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp / "prometheus.log", "w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        prom = Prometheus(port)

        def ready():
            try:
                with urllib.request.urlopen(f"{prom.base}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for("prometheus ready", ready)

        def targets_down():
            """[(job, health, last error)] of the targets not yet scraped
            successfully, or None once every target is up."""
            reply = prom.get("/api/v1/targets", state="active")
            active = reply.get("data", {}).get("activeTargets", [])
            seen = {t["labels"].get("job"): t for t in active}
            down = [
                (job, t["health"], t["lastError"]) if t else (job, "absent", "")
                for job, t in ((job, seen.get(job)) for job in targets)
                if not t or t["health"] != "up"
            ]
            return down or None

        # The servers scraped may still be loading their models, several at
        # once on a busy machine (sanitizer builds): their first successful
        # scrape can come well after Prometheus is ready.
        deadline = time.monotonic() + 120.0
        down = targets_down()
        while down and time.monotonic() < deadline:
            time.sleep(0.25)
            down = targets_down()
        assert not down, f"targets still down after 120 s (job, health, last error): {down}"
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def dashboard_expressions():
    """(dashboard, [(panel title, expr)]) for every target of every panel."""
    dashboard = json.load(open(DASHBOARD))
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                found.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return dashboard, found


def substitute(expr, overrides=None):
    variables = dict(DASHBOARD_VARIABLES, **(overrides or {}))
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(name, variables[name])
    assert "$" not in expr, f"unknown dashboard variable in {expr}"
    return expr


def check_every_dashboard_query(prom, overrides=None, timeout_s=45):
    for title, expr in dashboard_expressions()[1]:
        query = substitute(expr, overrides)
        wait_for(
            f"data for panel {title!r}: {query}", lambda: prom.has_data(query), timeout_s=timeout_s
        )


def alert_rules():
    rules = []
    for group in yaml.safe_load(open(ALERTS))["groups"]:
        rules.extend(group["rules"])
    return rules


def doc_block(marker):
    """The PromQL block of docs/metrics.md after `<!-- marker -->`."""
    text = open(METRICS_DOC).read()
    match = re.search(r"<!-- " + re.escape(marker) + r" -->\s*```promql\n(.*?)```", text, re.S)
    assert match, f"docs/metrics.md lost its {marker} block"
    return match.group(1)


def aux_loss_query():
    """The per-replica aux-loss PromQL of docs/metrics.md."""
    return doc_block("aux-loss-query")


def doc_queries(marker):
    """The queries of a block: expressions separated by blank lines, each
    after its `#` comment."""
    queries = []
    for chunk in doc_block(marker).split("\n\n"):
        lines = [line for line in chunk.splitlines() if not line.lstrip().startswith("#")]
        if any(line.strip() for line in lines):
            queries.append("\n".join(lines))
    return queries


# --- Which series the deployment files and docs/metrics.md ask for ---------

HPA = os.path.join(SOURCE_DIR, "deploy/k8s/base/hpa.yaml")
ADAPTER_VALUES = os.path.join(SOURCE_DIR, "deploy/k8s/prometheus-adapter/values.yaml")
# Labels Prometheus attaches to a scrape, not the server: the target's (job,
# instance) and, through the Operator's PodMonitor, the pod's.
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service"}
# Series Prometheus writes for every scrape, and for an alert rule pending or
# firing on the scraped series (ALERTS, ALERTS_FOR_STATE, with the target's
# job: the latency alerts can fire on a sanitizer build's slow load), not the
# server.
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                 "scrape_samples_post_metric_relabeling", "scrape_series_added",
                 "ALERTS", "ALERTS_FOR_STATE"}
# The server's own metric families, as opposed to Prometheus' (`up`, ...).
_OWN_METRIC = re.compile(r"\b((?:switchserve|process|exposer)_[A-Za-z0-9_:]*)")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*\"(\d+)\"")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


class Reference:
    """One PromQL expression (or template) of a deployment file or the docs:
    the metric names it selects, each with its label matchers, and the labels
    it groups, joins or labels legends by."""

    def __init__(self, where, expr, legend=""):
        self.where, self.expr = where, expr
        strings = []

        def keep(match):
            strings.append(re.sub(r"\\(.)", r"\1", match.group(1)))
            return f'"{len(strings) - 1}"'

        masked = _STRING.sub(keep, expr)
        self.selectors = []  # [(name, [(label, op, value)])]
        for match in _OWN_METRIC.finditer(masked):
            rest = masked[match.end():]
            braces = re.match(r"\s*\{([^}]*)\}", rest)
            matchers = [(label, op, strings[int(i)])
                        for label, op, i in _MATCHER.findall(braces.group(1) if braces else "")]
            self.selectors.append((match.group(1), matchers))
        self.labels = {label.strip() for group in _GROUPING.findall(masked)
                       for label in group.split(",") if label.strip()}
        template = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", masked, re.S)
        if template:
            self.labels.add(template.group(2))
        self.labels |= set(re.findall(r"\{\{\s*\.?(\w+)\s*\}\}", legend))


def deploy_references():
    """Every PromQL expression operators deploy: the dashboard's panels and
    variables, the alert rules, and the metric the autoscaler scales on."""
    refs = []
    dashboard, _ = dashboard_expressions()

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                refs.append(Reference(f"dashboard panel {panel['title']!r}", target["expr"],
                                      target.get("legendFormat", "")))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            refs.append(Reference(f"dashboard variable ${variable['name']}",
                                  variable["query"]["query"]))
    for rule in alert_rules():
        refs.append(Reference(f"alert {rule['alert']}", rule["expr"]))
    for metric in yaml.safe_load(open(HPA))["spec"]["metrics"]:
        refs.append(Reference("HorizontalPodAutoscaler", metric["pods"]["metric"]["name"]))
    for rule in yaml.safe_load(open(ADAPTER_VALUES))["rules"]["custom"]:
        refs.append(Reference("prometheus-adapter seriesQuery", rule["seriesQuery"]))
    return refs


def doc_references():
    """The PromQL blocks of docs/metrics.md."""
    text = open(METRICS_DOC).read()
    return [Reference(f"docs/metrics.md promql block {i}", block)
            for i, block in enumerate(re.findall(r"```promql\n(.*?)```", text, re.S))]


def exposed_series(prom, job):
    """{metric name: {label: {values}}} of every series Prometheus holds for
    `job`, scrape series and labels left out."""
    reply = prom.get("/api/v1/series", **{"match[]": f'{{job="{job}"}}'})
    assert reply["status"] == "success", reply
    series = {}
    for labels in reply["data"]:
        name = labels.pop("__name__")
        if name in SCRAPE_SERIES:
            continue
        found = series.setdefault(name, {})
        for label, value in labels.items():
            if label not in SCRAPE_LABELS:
                found.setdefault(label, set()).add(value)
    return series


def reference_problems(ref, series):
    """What `ref` asks for that the exposition lacks, as readable lines."""
    problems = []
    known_labels = set(SCRAPE_LABELS)
    for name, matchers in ref.selectors:
        if name not in series:
            problems.append(f"{ref.where}: no series {name}")
            continue
        labels = series[name]
        known_labels |= set(labels)
        for label, op, value in matchers:
            if label in SCRAPE_LABELS or "$" in value:
                continue  # the scrape's, or a dashboard variable's
            if label not in labels:
                problems.append(f"{ref.where}: {name} has no label {label!r}")
                continue
            if op in ("=", "!="):
                wanted = [value]
            elif re.fullmatch(r"[\w.-]+(\|[\w.-]+)*", value):
                wanted = value.split("|")  # a list of values: each must exist
            else:
                wanted = [value]
            for want in wanted:
                match = (lambda v: v == want) if op in ("=", "!=") else (
                    lambda v: re.fullmatch(want, v) is not None)
                if value and not any(match(v) for v in labels[label]):
                    problems.append(f"{ref.where}: no {name}{{{label}{op}{want!r}}}; "
                                    f"values: {sorted(labels[label])}")
    for label in sorted(ref.labels - known_labels - {"le", "quantile"}):
        problems.append(f"{ref.where}: groups or labels by {label!r}, which none of "
                        f"{sorted({n for n, _ in ref.selectors})} has")
    return problems


def metric_families(series):
    """Family names of the exposed series (histograms' and summaries'
    _bucket, _sum, _count folded into their family)."""
    families = set()
    for name in series:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        families.add(base if base != name and (base in series or f"{base}_bucket" in series)
                     else name)
    return families


def documented_metrics():
    """Metric names docs/metrics.md gives in its tables and its process
    metrics section."""
    text = open(METRICS_DOC).read()
    names = set(re.findall(r"^\| `((?:switchserve|process|exposer)_\w+)`", text, re.M))
    process = re.search(r"^## Process metrics\n(.*?)^## ", text, re.M | re.S)
    assert process, "docs/metrics.md lost its Process metrics section"
    names |= set(re.findall(r"`((?:process|exposer)_\w+)`", process.group(1)))
    return names
