"""docker-compose.yml: services, ports, healthchecks, and the Prometheus and
Grafana files it mounts. Docker cannot run here, so this reads the file the
way compose would and checks that every path it mounts exists and agrees with
the server's flags. The alert rules (deploy/prometheus/alerts.yml) and the
dashboard (deploy/grafana/switchserve.json) come from the metrics work: their
contents are checked only when they exist."""
import json
import re
import shutil
import subprocess

import pytest
import yaml

import server_facts
from deploy_helpers import REPO_ROOT, require_tool

COMPOSE = REPO_ROOT / "docker-compose.yml"
SERVER_SERVICES = {"switchserve": ("deploy/docker/Dockerfile", "cpu", None),
                   "switchserve-gpu": ("deploy/docker/Dockerfile.cuda", "cuda", "gpu")}
ALERTS = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "switchserve.json"


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def _ports(service):
    """[(host_port, container_port)] from short-syntax "HOST:CONTAINER" entries."""
    pairs = []
    for entry in service.get("ports", []):
        host, container = str(entry).rsplit(":", 1)
        pairs.append((int(host.rsplit(":", 1)[-1]), int(container.split("/")[0])))
    return pairs


def _bind_mounts(service):
    """{container_path: host_path} of the service's bind mounts."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        if source.startswith("."):
            mounts[target.rstrip("/")] = (REPO_ROOT / source).resolve()
    return mounts


def _host_path(service, container_path):
    """The host file a container path of `service` resolves to, through its bind mounts."""
    for target, source in sorted(_bind_mounts(service).items(), key=lambda m: -len(m[0])):
        if container_path == target or container_path.startswith(target + "/"):
            return source / container_path[len(target):].lstrip("/")
    return None


def test_services(compose):
    assert set(compose["services"]) == set(SERVER_SERVICES) | {"prometheus", "grafana"}
    assert "profiles" not in compose["services"]["switchserve"]
    assert compose["services"]["switchserve-gpu"]["profiles"] == ["gpu"]


@pytest.mark.parametrize("name", sorted(SERVER_SERVICES))
def test_server_service_flags_ports_and_image(compose, name):
    service = compose["services"][name]
    dockerfile, device, _ = SERVER_SERVICES[name]
    assert service["build"]["context"] == "."
    assert service["build"]["dockerfile"] == dockerfile
    assert (REPO_ROOT / dockerfile).is_file()
    command = service["command"]
    assert command[0] == "serve"
    flags = server_facts.parse_cli_flags(command[1:])
    assert set(flags) <= server_facts.known_flag_names()
    assert int(flags["port"]) == server_facts.grpc_port()
    assert int(flags["metrics_port"]) == server_facts.metrics_port()
    assert flags["device"] == device
    assert flags["model"] == server_facts.IMAGE_MODEL_DIR
    container_ports = {c for _, c in _ports(service)}
    assert container_ports == {server_facts.grpc_port(), int(flags["http_port"]),
                               server_facts.metrics_port()}


def test_gpu_service_reserves_an_nvidia_gpu(compose):
    devices = compose["services"]["switchserve-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "deploy" not in compose["services"]["switchserve"]


def test_host_ports_do_not_collide(compose):
    host_ports = [h for s in compose["services"].values() for h, _ in _ports(s)]
    assert len(host_ports) == len(set(host_ports)), sorted(host_ports)


@pytest.mark.parametrize("name", sorted(SERVER_SERVICES))
def test_server_healthcheck_and_drain(compose, name):
    service = compose["services"][name]
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:3] == [server_facts.BINARY, "health"]
    address = server_facts.parse_cli_flags(test[3:])["address"]
    assert int(address.rsplit(":", 1)[1]) == server_facts.grpc_port()
    grace = service["stop_grace_period"]
    assert grace.endswith("s")
    drain_s = int(server_facts.parse_cli_flags(service["command"][1:]).get(
        "drain_timeout_s", server_facts.drain_timeout_s()))
    assert int(grace[:-1]) > drain_s
    assert service["read_only"] is True
    # The start period the service's image gives itself (a compose
    # healthcheck replaces the image's): the GPU image's covers loading the
    # weights onto the GPU.
    dockerfile = (REPO_ROOT / service["build"]["dockerfile"]).read_text()
    image_start = re.search(r"^HEALTHCHECK .*--start-period=(\d+s)", dockerfile, re.M).group(1)
    assert service["healthcheck"]["start_period"] == image_start


def _prometheus_config(compose):
    service = compose["services"]["prometheus"]
    config_flag = next(a for a in service["command"] if a.startswith("--config.file="))
    path = _host_path(service, config_flag.split("=", 1)[1])
    assert path is not None and path.is_file(), "Prometheus' --config.file is not a mounted file"
    assert path == REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
    return yaml.safe_load(path.read_text()), path


def test_prometheus_scrapes_every_server_container(compose):
    config, _ = _prometheus_config(compose)
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "switchserve"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    [dns] = job["dns_sd_configs"]
    assert set(dns["names"]) == set(SERVER_SERVICES)
    assert dns["type"] == "A"
    assert dns["port"] == server_facts.metrics_port()
    # Prometheus listens on its default port, which the datasource URL uses.
    assert compose["services"]["prometheus"]["ports"][0].split(":")[1] == "9090"


def test_prometheus_loads_the_alert_rules(compose, tmp_path):
    config, path = _prometheus_config(compose)
    rule_paths = [path.parent / r for r in config["rule_files"]]
    assert ALERTS in rule_paths
    promtool = require_tool("promtool")
    if ALERTS.exists():
        target = path
    else:
        # The rules are not written yet: check the config beside an empty rule file.
        shutil.copy(path, tmp_path / "prometheus.yml")
        (tmp_path / "alerts.yml").write_text("groups: []\n")
        target = tmp_path / "prometheus.yml"
    result = subprocess.run([promtool, "check", "config", str(target)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _grafana(compose):
    return compose["services"]["grafana"]


def _provisioning_dir(compose):
    path = _host_path(_grafana(compose), "/etc/grafana/provisioning")
    assert path is not None and path.is_dir(), "Grafana's provisioning directory is not mounted"
    return path


def test_grafana_datasource_is_the_compose_prometheus(compose):
    files = sorted((_provisioning_dir(compose) / "datasources").glob("*.yml"))
    assert files, "no datasource provisioning file"
    datasources = [d for f in files for d in yaml.safe_load(f.read_text())["datasources"]]
    [prometheus] = [d for d in datasources if d["type"] == "prometheus"]
    container_port = int(compose["services"]["prometheus"]["ports"][0].split(":")[1])
    assert prometheus["url"] == f"http://prometheus:{container_port}"
    assert prometheus["uid"] == "prometheus"
    assert prometheus["isDefault"] is True


def test_grafana_dashboard_provider_points_at_the_mounted_dashboard_dir(compose):
    grafana = _grafana(compose)
    files = sorted((_provisioning_dir(compose) / "dashboards").glob("*.yml"))
    assert files, "no dashboard provider file"
    providers = [p for f in files for p in yaml.safe_load(f.read_text())["providers"]]
    [provider] = [p for p in providers if p["name"] == "switchserve"]
    assert provider["type"] == "file"
    host_dir = _host_path(grafana, provider["options"]["path"])
    assert host_dir == DASHBOARD.parent, "the provider does not read deploy/grafana/"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path(grafana, home) == DASHBOARD


@pytest.mark.skipif(not DASHBOARD.exists(), reason="deploy/grafana/switchserve.json not written yet")
def test_dashboard_uses_the_provisioned_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard.get("panels"), "the dashboard has no panels"

    def datasource_uids(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and "uid" in ds:
                yield ds["uid"]
            for value in node.values():
                yield from datasource_uids(value)
        elif isinstance(node, list):
            for value in node:
                yield from datasource_uids(value)

    uids = set(datasource_uids(dashboard))
    assert uids, "no panel names a datasource"
    assert uids <= {"prometheus", "${datasource}", "$datasource", "-- Grafana --"}


@pytest.mark.skipif(not ALERTS.exists(), reason="deploy/prometheus/alerts.yml not written yet")
def test_alert_rules_exist_and_parse():
    rules = yaml.safe_load(ALERTS.read_text())
    assert any(g.get("rules") for g in rules["groups"])
