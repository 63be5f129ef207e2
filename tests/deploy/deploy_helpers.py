"""Shared helpers for the deployment tests: rendering kustomize overlays and
reading the rendered objects. (Not conftest.py: test modules import these by a
name no other test directory uses.)"""
import functools
import re
import shutil
import subprocess

import pytest
import yaml

import server_facts

REPO_ROOT = server_facts.REPO_ROOT
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S_DIR / "overlays").iterdir() if p.is_dir())
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


def render_overlay(overlay: str):
    return render(str(K8S_DIR / "overlays" / overlay))


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
