"""deploy/k8s: every overlay, alone and with every combination of the
components, renders with `kubectl kustomize`, every object is valid for
Kubernetes 1.30, and the Deployment agrees with the server's flags."""
import os
import re

import pytest
import yaml

import server_facts
from deploy_helpers import (K8S_DIR, OVERLAYS, REPO_ROOT, VARIANTS, container_flags, container_port,
                            expand_env, labels_match, mount_for, objects_of_kind, one, overlay_of,
                            render, render_overlay, server_container)

KUBERNETES_VERSION = "1.30"
# Variants whose probes must be the kubelet's native gRPC probes. The tls
# overlay runs `switchserve health` instead (kubelet gRPC probes cannot do TLS).
NATIVE_PROBE_VARIANTS = [v for v in VARIANTS if overlay_of(v) in ("cpu", "gpu")]
EXPECTED_KINDS = {"Namespace", "ServiceAccount", "Deployment", "Service",
                  "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"}
CRD_GROUPS = ("monitoring.coreos.com/",)


def _deployment(variant):
    return one(render_overlay(variant), "Deployment")


def _pod_spec(variant):
    return _deployment(variant)["spec"]["template"]["spec"]


def _pod_labels(variant):
    return _deployment(variant)["spec"]["template"]["metadata"]["labels"]


def test_there_are_cpu_and_gpu_overlays():
    assert {"cpu", "gpu"} <= set(OVERLAYS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_overlay_renders_every_kind(variant):
    kinds = {o["kind"] for o in render_overlay(variant)}
    assert EXPECTED_KINDS <= kinds, f"missing {EXPECTED_KINDS - kinds}"
    for obj in render_overlay(variant):
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "switchserve", obj["metadata"]["name"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_objects_are_valid_kubernetes_1_30(variant):
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate missing (run scripts/install-test-tools.sh)")
    checked = 0
    for obj in render_overlay(variant):
        if obj["apiVersion"].startswith(CRD_GROUPS):
            continue
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            used = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{variant}: {where} invalid for {KUBERNETES_VERSION}: {error.message} "
                        f"at {list(error.path)}")
        except kubernetes_validate.SchemaNotFoundError as error:
            pytest.fail(f"{variant}: {where}: {error.message}")
        assert used == KUBERNETES_VERSION
        checked += 1
    assert checked >= len(EXPECTED_KINDS) - 1


def test_strict_validation_rejects_a_misspelt_field():
    """The validator really checks fields (so the test above can fail)."""
    import kubernetes_validate
    deployment = _deployment("cpu")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_server_flags_and_ports_agree_with_the_server(variant):
    container = server_container(_deployment(variant))
    assert container.get("args", [None])[0] == "serve"
    flags = container_flags(container)
    unknown = set(flags) - server_facts.known_flag_names()
    assert not unknown, f"flags the server does not define: {unknown}"
    assert int(flags["port"]) == server_facts.grpc_port()
    assert int(flags["metrics_port"]) == server_facts.metrics_port()
    assert flags["host"] == "0.0.0.0"
    assert flags["device"] in server_facts.DEVICES
    assert int(flags["kv_cache_bytes"]) > 0
    assert container_port(container, "grpc") == server_facts.grpc_port()
    assert container_port(container, "metrics") == server_facts.metrics_port()
    assert int(flags["http_port"]) == container_port(container, "http")
    assert float(flags["max_connection_age_s"]) > 0  # new pods get traffic
    # Every $(VAR) in args names a variable the container defines.
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    assert not [a for a in container["args"] if "$(" in expand_env(a, env)]


def test_device_per_overlay():
    assert container_flags(server_container(_deployment("cpu")))["device"] == "cpu"
    assert container_flags(server_container(_deployment("gpu")))["device"] == "cuda"


@pytest.mark.parametrize("variant", NATIVE_PROBE_VARIANTS)
def test_probes_are_native_grpc_against_the_health_service(variant):
    container = server_container(_deployment(variant))
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(probe_name)
        assert probe is not None, f"{probe_name} missing"
        assert set(probe) & {"grpc", "exec", "httpGet", "tcpSocket"} == {"grpc"}, probe_name
        assert probe["grpc"]["port"] == server_facts.grpc_port(), probe_name
        assert probe["grpc"].get("service", "") in ("", server_facts.generation_service())
    # Readiness follows the Generation service, which goes NOT_SERVING on drain.
    assert container["readinessProbe"]["grpc"]["service"] == server_facts.generation_service()


def test_tls_overlay_probes_run_the_health_subcommand_at_the_grpc_port():
    container = server_container(_deployment("tls"))
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container[probe_name]["exec"]["command"]
        assert command[:2] == [server_facts.BINARY, "health"], probe_name
        address = server_facts.parse_cli_flags(command[2:])["address"]
        assert int(address.rsplit(":", 1)[1]) == server_facts.grpc_port(), probe_name


PROBE_TIMINGS = ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "successThreshold",
                 "failureThreshold")


def _tls_on(overlay, directory):
    """The tls overlay with its resource changed to `overlay`, as
    docs/deploy.md tells GPU users to do: a copy of the overlay's files in
    `directory` (kustomize loads patches only from below the kustomization)."""
    tls = K8S_DIR / "overlays" / "tls"
    for path in tls.iterdir():
        (directory / path.name).write_text(path.read_text())
    kustomization = yaml.safe_load((tls / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../cpu"], kustomization["resources"]
    kustomization["resources"] = [os.path.relpath(K8S_DIR / "overlays" / overlay, directory)]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return str(directory)


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_tls_probes_keep_the_timings_of_the_overlay_beneath(overlay, tmp_path):
    # The gpu overlay gives the startup probe 10 minutes to load the weights
    # onto the GPU; TLS on GPUs must not cut that back to the CPU's 5.
    beneath = server_container(_deployment(overlay))
    container = server_container(one(render(_tls_on(overlay, tmp_path)), "Deployment"))
    assert container_flags(container)["device"] == container_flags(beneath)["device"]
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[probe_name]
        assert set(probe) & {"grpc", "exec", "httpGet", "tcpSocket"} == {"exec"}, probe_name
        assert probe["exec"]["command"][:2] == [server_facts.BINARY, "health"], probe_name
        timings = {k: probe.get(k) for k in PROBE_TIMINGS}
        assert timings == {k: beneath[probe_name].get(k) for k in PROBE_TIMINGS}, probe_name


@pytest.mark.parametrize("variant", VARIANTS)
def test_termination_grace_outlasts_the_drain(variant):
    spec = _pod_spec(variant)
    container = server_container(_deployment(variant))
    drain_s = int(container_flags(container).get("drain_timeout_s", server_facts.drain_timeout_s()))
    pre_stop_s = 0
    pre_stop = container.get("lifecycle", {}).get("preStop")
    if pre_stop:
        if "sleep" in pre_stop:
            pre_stop_s = int(pre_stop["sleep"]["seconds"])
        else:
            command = pre_stop["exec"]["command"]
            assert command[0] == "sleep", "only a sleep preStop hook is accounted for"
            pre_stop_s = int(command[1])
    assert spec["terminationGracePeriodSeconds"] > drain_s + pre_stop_s


@pytest.mark.parametrize("variant", VARIANTS)
def test_pods_run_non_root_with_a_read_only_root_filesystem(variant):
    spec = _pod_spec(variant)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]


def test_pod_uid_is_the_images_user():
    dockerfile = (REPO_ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+)", dockerfile, re.M)
    assert users, "the Dockerfile sets no numeric USER"
    assert _pod_spec("cpu")["securityContext"]["runAsUser"] == int(users[-1].split(":")[0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_resources(variant):
    container = server_container(_deployment(variant))
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    gpus = resources["limits"].get("nvidia.com/gpu")
    if overlay_of(variant) == "gpu":
        assert int(gpus) >= 1
        assert resources["requests"]["nvidia.com/gpu"] == gpus
        assert "cuda" in container["image"]
    else:
        assert gpus is None
        assert "cuda" not in container["image"]
    for init in _pod_spec(variant).get("initContainers", []):
        assert init["image"] == container["image"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_is_read_from_a_mounted_volume(variant):
    spec = _pod_spec(variant)
    container = server_container(_deployment(variant))
    model = container_flags(container)["model"]
    mount, volume = mount_for(container, spec["volumes"], model)
    assert mount is not None, f"--model={model} is not on a volume"
    assert mount.get("readOnly") is True
    # Whatever fills the volume (the init container) writes where the server reads.
    for init in spec.get("initContainers", []):
        init_mount, _ = mount_for(init, spec["volumes"], model)
        assert init_mount is not None and init_mount["name"] == mount["name"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_auth_token_and_tls_secrets_are_wired(variant):
    spec = _pod_spec(variant)
    container = server_container(_deployment(variant))
    flags = container_flags(container)
    token = flags["auth_token_file"]
    mount, volume = mount_for(container, spec["volumes"], token)
    assert mount is not None and "secret" in volume, "--auth-token-file is not on a Secret"
    assert volume["secret"]["secretName"] == "switchserve-auth"
    assert volume["secret"].get("optional", False) is False
    items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])}
    relative = token[len(mount["mountPath"].rstrip("/")) + 1:]
    assert relative in items or not items

    tls_volumes = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "switchserve-tls"]
    assert len(tls_volumes) == 1
    if overlay_of(variant) == "tls":
        assert tls_volumes[0]["secret"]["optional"] is False
        for flag in ("tls_cert", "tls_key"):
            _, volume = mount_for(container, spec["volumes"], flags[flag])
            assert volume is tls_volumes[0], f"--{flag} is not in the TLS secret"
    else:
        assert tls_volumes[0]["secret"]["optional"] is True
        assert "tls_cert" not in flags and "tls_key" not in flags


@pytest.mark.parametrize("variant", VARIANTS)
def test_services_reach_the_server_ports(variant):
    objects = render_overlay(variant)
    container = server_container(_deployment(variant))
    services = {s["metadata"]["name"]: s for s in objects_of_kind(objects, "Service")}
    assert set(services) == {"switchserve", "switchserve-headless"}
    # The HTTP API is off by default; the Deployment turns it on.
    expected = {"grpc": server_facts.grpc_port(), "metrics": server_facts.metrics_port(),
                "http": int(container_flags(container)["http_port"])}
    for name, service in services.items():
        assert labels_match(service["spec"]["selector"], _pod_labels(variant)), name
        for port in service["spec"]["ports"]:
            assert port["port"] == expected[port["name"]], (name, port)
            assert container_port(container, port["targetPort"]) == expected[port["name"]]
    assert {p["name"] for p in services["switchserve"]["spec"]["ports"]} == {
        "grpc", "http", "metrics"}
    headless = services["switchserve-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    assert [p["name"] for p in headless["ports"]] == ["grpc", "http"]
    assert headless.get("publishNotReadyAddresses", False) is False


def _adapter_rules():
    values = yaml.safe_load((K8S_DIR / "prometheus-adapter" / "values.yaml").read_text())
    return values["rules"]["custom"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_hpa_scales_the_deployment_on_waiting_requests(variant):
    objects = render_overlay(variant)
    hpa = one(objects, "HorizontalPodAutoscaler")
    deployment = one(objects, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns replicas"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "switchserve_requests_waiting"
    # The adapter serves exactly that name, per pod.
    served = [r for r in _adapter_rules()
              if r["name"].get("as") == name and re.match(r["name"]["matches"], name)]
    assert len(served) == 1, "no Prometheus adapter rule serves the HPA's metric"
    rule = served[0]
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pdb_keeps_a_pod_serving(variant):
    objects = render_overlay(variant)
    pdb = one(objects, "PodDisruptionBudget")
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], _pod_labels(variant))
    if "maxUnavailable" in pdb["spec"]:
        assert hpa["spec"]["minReplicas"] - int(pdb["spec"]["maxUnavailable"]) >= 1
    else:
        assert int(pdb["spec"]["minAvailable"]) >= 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_network_policy_admits_clients_to_grpc_and_http_and_prometheus_to_metrics(variant):
    policy = one(render_overlay(variant), "NetworkPolicy")
    container = server_container(_deployment(variant))
    spec = policy["spec"]
    assert labels_match(spec["podSelector"]["matchLabels"], _pod_labels(variant))
    assert spec["policyTypes"] == ["Ingress"]
    by_port = {}
    for rule in spec["ingress"]:
        # A rule without `from` or `ports` would admit every source or port.
        assert rule.get("from") and rule.get("ports"), rule
        for port in rule["ports"]:
            number = port["port"] if isinstance(port["port"], int) else container_port(container, port["port"])
            by_port.setdefault(number, []).extend(rule["from"])
    http_port = int(container_flags(container)["http_port"])
    assert set(by_port) == {server_facts.grpc_port(), http_port, server_facts.metrics_port()}
    for api_port in (server_facts.grpc_port(), http_port):
        clients = by_port[api_port]
        assert clients and all(
            p.get("podSelector", {}).get("matchLabels") == {"switchserve.io/client": "true"}
            for p in clients)
    scrapers = by_port[server_facts.metrics_port()]
    assert scrapers and all(
        p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == "prometheus"
        and p.get("namespaceSelector", {}).get("matchLabels")
        for p in scrapers)


@pytest.mark.parametrize("variant", VARIANTS)
def test_pods_spread_over_nodes_without_blocking_scheduling(variant):
    spec = _pod_spec(variant)
    by_key = {c["topologyKey"]: c for c in spec.get("topologySpreadConstraints", [])}
    assert "kubernetes.io/hostname" in by_key, "no spread across nodes"
    for key, constraint in by_key.items():
        # DoNotSchedule would leave pods Pending on clusters with fewer nodes
        # (or zones) than replicas.
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway", key
        assert constraint["maxSkew"] == 1, key
        assert labels_match(constraint["labelSelector"]["matchLabels"], _pod_labels(variant)), key
