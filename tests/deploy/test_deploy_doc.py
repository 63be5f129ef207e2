"""docs/deploy.md's kustomize snippets work as written: the operator's own
kustomization (an overlay plus components) and the patches the page shows
(the `release` label for kube-prometheus-stack, another model directory on
the claim), rendered together by `kubectl kustomize`."""
import os
import re

import yaml

from deploy_helpers import (REPO_ROOT, container_flags, kustomize, objects_of_kind, one,
                            server_container)

DOC = REPO_ROOT / "docs" / "deploy.md"
OWN_KUSTOMIZATION = "# my-switchserve/kustomization.yaml"
# The page writes paths as seen from a directory beside a checkout named
# `switchserve`.
CHECKOUT_PREFIX = "../switchserve/"


def _yaml_blocks():
    text = DOC.read_text()
    return [re.sub(r"^ {0,4}", "", block, flags=re.M)  # blocks sit in indented list items
            for block in re.findall(r"^ *```yaml\n(.*?)^ *```", text, re.S | re.M)]


def _own_kustomization(directory):
    [block] = [b for b in _yaml_blocks() if b.startswith(OWN_KUSTOMIZATION)]
    kustomization = yaml.safe_load(block)
    to_repo = os.path.relpath(REPO_ROOT, directory) + "/"
    for field in ("resources", "components"):
        paths = kustomization[field]
        assert all(p.startswith(CHECKOUT_PREFIX) for p in paths), paths
        kustomization[field] = [to_repo + p[len(CHECKOUT_PREFIX):] for p in paths]
    return kustomization


def _documented_patches():
    patches = []
    for block in _yaml_blocks():
        parsed = yaml.safe_load(block)
        if isinstance(parsed, dict) and set(parsed) == {"patches"}:
            patches += parsed["patches"]
    return patches


def test_the_page_shows_an_own_kustomization_and_patches():
    assert len(_documented_patches()) >= 2


def test_own_kustomization_with_the_documented_patches_renders(tmp_path):
    kustomization = _own_kustomization(tmp_path)
    assert kustomization["components"], "the example adds no component"
    kustomization["patches"] = _documented_patches()
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    result = kustomize(str(tmp_path))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]

    # kube-prometheus-stack's default selectors match `release: <release name>`.
    for kind in ("PodMonitor", "PrometheusRule"):
        assert one(objects, kind)["metadata"]["labels"].get("release"), kind
    assert not [o for o in objects_of_kind(objects, "Service") if "release" in o["metadata"]["labels"]]

    # The model patch points --model at another directory on the claim.
    flags = container_flags(server_container(one(objects, "Deployment")))
    assert flags["model"] == "/models/v2"
