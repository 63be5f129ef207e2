"""deploy/k8s as kustomize sees it: no deprecated fields anywhere, and every
overlay renders without a warning."""
import pytest
import yaml

from deploy_helpers import K8S_DIR, OVERLAYS, REPO_ROOT, kustomize

# Fields kustomize v5 still reads but warns about (`kustomize edit fix`
# rewrites them): `resources` replaces `bases`, `patches` the other two.
DEPRECATED_FIELDS = {"bases", "patchesStrategicMerge", "patchesJson6902", "commonLabels", "vars",
                     "imageTags"}


def _kustomization_files():
    return sorted((REPO_ROOT / "deploy").rglob("kustomization.yaml"))


def test_kustomization_files_are_found():
    assert K8S_DIR / "base" / "kustomization.yaml" in _kustomization_files()


@pytest.mark.parametrize("path", _kustomization_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_deprecated_kustomize_fields(path):
    fields = set(yaml.safe_load(path.read_text()))
    assert not fields & DEPRECATED_FIELDS, f"deprecated: {sorted(fields & DEPRECATED_FIELDS)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_without_warnings(overlay):
    result = kustomize(str(K8S_DIR / "overlays" / overlay))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert result.stderr == "", result.stderr
