"""deploy/k8s as kustomize sees it: no deprecated fields anywhere, and every
overlay, alone and with every combination of the components, renders without
a warning."""
import pytest
import yaml

from deploy_helpers import K8S_DIR, OVERLAYS, REPO_ROOT, VARIANTS, kustomize, variant_dir

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


def test_every_overlay_and_component_combination_is_rendered():
    components = {c for v in VARIANTS for c in v.split("+")[1:]}
    assert components == {p.name for p in (K8S_DIR / "components").iterdir() if p.is_dir()}
    assert {v.split("+")[0] for v in VARIANTS} == set(OVERLAYS)
    assert len(VARIANTS) == len(OVERLAYS) * 2 ** len(components)


@pytest.mark.parametrize("variant", VARIANTS)
def test_renders_without_warnings(variant):
    result = kustomize(variant_dir(variant))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert result.stderr == "", result.stderr
