"""deploy/k8s/components/monitoring: the Prometheus Operator objects and the
Grafana dashboard ConfigMap, added only with the component, and the same
alert rules and dashboard as the files docker compose uses."""
import json
import subprocess

import jsonschema
import pytest
import yaml

import server_facts
from deploy_helpers import (K8S_DIR, OVERLAYS, REPO_ROOT, VARIANTS, components_of, container_port,
                            kustomize, labels_match, one, render, render_overlay, require_tool,
                            server_container)

OPERATOR_GROUP = "monitoring.coreos.com/"
MONITORED = [v for v in VARIANTS if "monitoring" in components_of(v)]
ALERTS = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "switchserve.json"
RULE_FILE = K8S_DIR / "components" / "monitoring" / "prometheusrule.yaml"
GENERATOR = REPO_ROOT / "scripts" / "gen-prometheus-rule"
# `kubectl apply` (client-side) keeps the whole object in the
# last-applied-configuration annotation; annotations are limited to 256 KiB.
ANNOTATION_LIMIT_BYTES = 256 * 1024

# The parts of the Prometheus Operator's CRDs (monitoring.coreos.com/v1) these
# manifests use, closed against typos (additionalProperties: false).
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                   "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
PODMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "selector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchLabels": _STRING_MAP,
                    "matchExpressions": {"type": "array"}}},
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                        "honorLabels": {"type": "boolean"},
                        "relabelings": {"type": "array"},
                        "metricRelabelings": {"type": "array"},
                    }}},
            },
        },
    },
}
PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": _DURATION,
                    "limit": {"type": "integer"},
                    "partial_response_strategy": {"type": "string"},
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object",
                        "required": ["expr"],
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "additionalProperties": False,
                        "properties": {
                            "alert": {"type": "string"},
                            "record": {"type": "string"},
                            "expr": {"type": ["string", "integer"]},
                            "for": _DURATION,
                            "keep_firing_for": _DURATION,
                            "labels": _STRING_MAP,
                            "annotations": _STRING_MAP,
                        }}},
                }}}},
        },
    },
}
SCHEMAS = {"PodMonitor": PODMONITOR_SCHEMA, "PrometheusRule": PROMETHEUSRULE_SCHEMA}


def _operator_objects(objects):
    return [o for o in objects if o["apiVersion"].startswith(OPERATOR_GROUP)]


def test_the_monitoring_component_exists():
    assert MONITORED, "no variant uses components/monitoring"


def test_base_renders_without_warnings_and_without_prometheus_operator_kinds():
    result = kustomize(str(K8S_DIR / "base"))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    objects = render(str(K8S_DIR / "base"))
    assert one(objects, "Deployment")
    assert not _operator_objects(objects), [o["kind"] for o in _operator_objects(objects)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_apply_without_the_prometheus_operator(overlay):
    """Without the monitoring component nothing needs the Operator's CRDs."""
    objects = render_overlay(overlay)
    assert not _operator_objects(objects), [o["kind"] for o in _operator_objects(objects)]
    assert not [o for o in objects if o["kind"] == "ConfigMap"]


@pytest.mark.parametrize("variant", MONITORED)
def test_monitoring_adds_podmonitor_rule_and_dashboard(variant):
    kinds = sorted(o["kind"] for o in render_overlay(variant) if o["kind"] in
                   ("PodMonitor", "PrometheusRule", "ConfigMap"))
    assert kinds == ["ConfigMap", "PodMonitor", "PrometheusRule"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_prometheus_operator_object_matches_its_schema(variant):
    for obj in _operator_objects(render_overlay(variant)):
        assert obj["kind"] in SCHEMAS, f"no schema for {obj['kind']}: add one"
        jsonschema.validate(obj, SCHEMAS[obj["kind"]])


@pytest.mark.parametrize("kind, misspell", [
    ("PodMonitor", lambda o: o["spec"].__setitem__("podMetricEndpoints",
                                                   o["spec"].pop("podMetricsEndpoints"))),
    ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].__setitem__(
        "annotation", o["spec"]["groups"][0]["rules"][0].pop("annotations"))),
    ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].__setitem__("for", "10 minutes")),
])
def test_schemas_reject_a_misspelt_field(kind, misspell):
    obj = yaml.safe_load(yaml.safe_dump(one(render_overlay(MONITORED[0]), kind)))
    misspell(obj)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, SCHEMAS[kind])


@pytest.mark.parametrize("variant", MONITORED)
def test_podmonitor_scrapes_the_metrics_port_of_the_pods(variant):
    objects = render_overlay(variant)
    podmonitor = one(objects, "PodMonitor")
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(podmonitor["spec"]["selector"]["matchLabels"], pod_labels)
    container = server_container(deployment)
    for endpoint in podmonitor["spec"]["podMetricsEndpoints"]:
        assert container_port(container, endpoint["port"]) == server_facts.metrics_port()
        assert endpoint.get("path", "/metrics") == "/metrics"


@pytest.mark.parametrize("variant", MONITORED)
def test_prometheus_rule_has_the_alert_rules_of_alerts_yml(variant):
    rule = one(render_overlay(variant), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_prometheus_rule_file_is_what_the_generator_writes():
    """The committed file is up to date (else: run scripts/gen-prometheus-rule)."""
    check = subprocess.run([str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_prometheus_rule_passes_promtool(tmp_path):
    promtool = require_tool("promtool")
    spec = yaml.safe_load(RULE_FILE.read_text())["spec"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(spec))
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("variant", MONITORED)
def test_dashboard_configmap_is_the_dashboard_for_the_grafana_sidecar(variant):
    [configmap] = [o for o in render_overlay(variant) if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    # A fixed name: a hash-suffixed one would leave old copies for the sidecar.
    assert configmap["metadata"]["name"] == "switchserve-dashboard"
    assert configmap["data"] == {"switchserve.json": DASHBOARD.read_text()}
    dashboard = json.loads(configmap["data"]["switchserve.json"])
    assert dashboard["uid"] and dashboard["panels"]
    assert len(json.dumps(configmap)) < ANNOTATION_LIMIT_BYTES
