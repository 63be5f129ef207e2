"""Shared helpers for the deployment tests: rendering kustomize overlays and
reading the rendered objects. (Not conftest.py: test modules import these by a
name no other test directory uses.)

A *variant* is what an operator applies: an overlay, alone ("cpu") or with
components added ("cpu+monitoring+pvc-model"), rendered through a
kustomization like the one docs/deploy.md tells them to write."""
import atexit
import functools
import itertools
import os
import re
import shutil
import subprocess
import tempfile

import pytest
import yaml

import server_facts

REPO_ROOT = server_facts.REPO_ROOT
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S_DIR / "overlays").iterdir() if p.is_dir())
COMPONENTS = sorted(p.name for p in (K8S_DIR / "components").iterdir() if p.is_dir())
# Every overlay with every subset of the components.
VARIANTS = ["+".join((overlay, *subset)) for overlay in OVERLAYS
            for n in range(len(COMPONENTS) + 1) for subset in itertools.combinations(COMPONENTS, n)]
INSTALL_HINT = "run scripts/install-test-tools.sh"


def require_tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH ({INSTALL_HINT})")
    return path


def kustomize(directory: str) -> subprocess.CompletedProcess:
    """`kubectl kustomize DIR`, its stdout and stderr captured."""
    kubectl = require_tool("kubectl")
    return subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True,
                          timeout=120)


@functools.lru_cache(maxsize=None)
def render(directory: str):
    """Objects `kubectl kustomize DIR` renders, as dicts (cached per directory).
    Fails on anything printed to stderr: kustomize's deprecation warnings go
    there, and `kubectl apply -k` would print them to the operator."""
    result = kustomize(directory)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    if result.stderr.strip():
        pytest.fail(f"kubectl kustomize {directory} printed warnings:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def overlay_of(variant: str) -> str:
    return variant.split("+")[0]


def components_of(variant: str) -> list:
    return variant.split("+")[1:]


@functools.lru_cache(maxsize=None)
def _scratch_dir() -> str:
    path = tempfile.mkdtemp(prefix="switchserve-kustomize-")
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.lru_cache(maxsize=None)
def variant_dir(variant: str) -> str:
    """A directory whose kustomization applies `variant`: the overlay itself,
    or a new kustomization listing the overlay and the components (by
    relative paths: kustomize refuses absolute ones)."""
    overlay = K8S_DIR / "overlays" / overlay_of(variant)
    if not components_of(variant):
        return str(overlay)
    directory = os.path.join(_scratch_dir(), variant)
    os.makedirs(directory)
    relative = lambda path: os.path.relpath(path, directory)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative(overlay)],
        "components": [relative(K8S_DIR / "components" / c) for c in components_of(variant)],
    }
    with open(os.path.join(directory, "kustomization.yaml"), "w") as f:
        yaml.safe_dump(kustomization, f)
    return directory


def render_overlay(variant: str):
    """Objects of an overlay, or of an overlay with components ("cpu+monitoring")."""
    return render(variant_dir(variant))


def objects_of_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def one(objects, kind):
    found = objects_of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    named = [c for c in containers if c["name"] == "switchserve"]
    assert len(named) == 1, "the Deployment has no container named switchserve"
    return named[0]


def container_port(container, name):
    ports = [p for p in container.get("ports", []) if p.get("name") == name]
    assert len(ports) == 1, f"container port {name!r} missing"
    return ports[0]["containerPort"]


def expand_env(value: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in command/args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_flags(container) -> dict:
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    args = [expand_env(a, env) for a in container.get("args", [])]
    return server_facts.parse_cli_flags(args)


def mount_for(container, volumes, path: str):
    """(volumeMount, volume) whose mountPath contains `path`, or (None, None)."""
    best = None
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            if best is None or len(root) > len(best["mountPath"].rstrip("/")):
                best = mount
    if best is None:
        return None, None
    volume = next(v for v in volumes if v["name"] == best["name"])
    return best, volume


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
