"""deploy/grafana/switchserve.json: the error-ratio panel counts every status
but OK and CANCELLED as an error, DEADLINE_EXCEEDED included, and leaves the
client's own cancellations out of both sides. Its query runs in promtool's
PromQL evaluator on synthetic request counters."""
import json
import subprocess

import pytest
import yaml

from deploy_helpers import REPO_ROOT, require_tool

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "switchserve.json"
# `status` label values of switchserve_requests_total (docs/metrics.md).
STATUSES = ["OK", "CANCELLED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "NOT_FOUND",
            "RESOURCE_EXHAUSTED", "UNAVAILABLE", "UNAUTHENTICATED", "FAILED_PRECONDITION", "INTERNAL",
            "UNKNOWN"]
NOT_COUNTED = {"CANCELLED"}  # the client's choice: neither success nor failure
SUCCESS = {"OK"}
# Grafana's variables with every value selected.
VARIABLES = {"$__rate_interval": "5m", "$job": ".*", "$instance": ".*"}


def _panels(panels):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _error_ratio_query():
    dashboard = json.loads(DASHBOARD.read_text())
    [panel] = [p for p in _panels(dashboard["panels"]) if p.get("title") == "Error ratio"]
    [target] = panel["targets"]
    expr = target["expr"]
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def _errors_and_counted(per_minute):
    errors = sum(n for s, n in per_minute.items() if s not in SUCCESS | NOT_COUNTED)
    counted = sum(n for s, n in per_minute.items() if s not in NOT_COUNTED)
    return errors, counted


def _expected_ratio(per_minute):
    errors, counted = _errors_and_counted(per_minute)
    return errors / counted


# Requests per minute by status, for 20 minutes.
TRAFFIC = {
    "every status": {s: 60 if s == "OK" else 30 if s == "CANCELLED" else 5 for s in STATUSES},
    "deadlines only": {"OK": 90, "DEADLINE_EXCEEDED": 10, "CANCELLED": 50},
    "many cancellations, no errors": {"OK": 40, "CANCELLED": 200},
    "one instance's errors": {"OK": 95, "INTERNAL": 5},
}


@pytest.mark.parametrize("traffic", TRAFFIC, ids=list(TRAFFIC))
def test_error_ratio_counts_every_failure_but_not_cancellations(traffic, tmp_path):
    promtool = require_tool("promtool")
    per_minute = TRAFFIC[traffic]
    series = []
    for status in STATUSES:  # the server exports every status from the start
        rate = per_minute.get(status, 0)
        series.append({"series": f'switchserve_requests_total{{job="s",instance="a",status="{status}"}}',
                       "values": f"0+{rate}x20"})
    # A second instance serving OK only: the ratio sums over instances.
    series.append({"series": 'switchserve_requests_total{job="s",instance="b",status="OK"}',
                   "values": "0+100x20"})
    errors, counted = _errors_and_counted(per_minute)
    # promtool compares exactly: compare in millionths.
    expected_millionths = round(1e6 * errors / (counted + 100))
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{
                "expr": f"round(1e6 * ({_error_ratio_query()}))",
                "eval_time": "15m",
                "exp_samples": [{"labels": "{}", "value": expected_millionths}],
            }],
        }],
    }
    path = tmp_path / "error_ratio_test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.returncode == 0, f"expected {expected_millionths}e-6:\n{result.stdout}{result.stderr}"


def test_deadline_exceeded_is_an_error_and_cancelled_is_not():
    """The policy the test above encodes, spelled out."""
    assert _expected_ratio({"OK": 9, "DEADLINE_EXCEEDED": 1}) == pytest.approx(0.1)
    assert _expected_ratio({"OK": 9, "CANCELLED": 1}) == 0
