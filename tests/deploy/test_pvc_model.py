"""deploy/k8s/components/pvc-model: the server loads its model from the claim
the example manifests create and fill, and without the component from the
built-in model the init container copies."""
import pytest
import yaml

import server_facts
from deploy_helpers import (K8S_DIR, VARIANTS, components_of, container_flags, mount_for, one,
                            render_overlay, server_container)

COMPONENT = K8S_DIR / "components" / "pvc-model"
WITH_PVC = [v for v in VARIANTS if "pvc-model" in components_of(v)]
WITHOUT_PVC = [v for v in VARIANTS if "pvc-model" not in components_of(v)]
KUBERNETES_VERSION = "1.30"


def _example(name):
    return yaml.safe_load((COMPONENT / name).read_text())


def _model_volume(variant):
    deployment = one(render_overlay(variant), "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = server_container(deployment)
    model = container_flags(container)["model"]
    mount, volume = mount_for(container, spec["volumes"], model)
    assert mount is not None, f"--model={model} is not on a volume"
    return spec, model, mount, volume


def test_the_pvc_model_component_exists():
    assert WITH_PVC and WITHOUT_PVC


@pytest.mark.parametrize("variant", WITH_PVC)
def test_model_is_served_read_only_from_the_example_claim(variant):
    spec, model, mount, volume = _model_volume(variant)
    claim = _example("pvc.example.yaml")
    assert set(volume) == {"name", "persistentVolumeClaim"}, "the emptyDir is still there"
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert volume["persistentVolumeClaim"]["readOnly"] is True
    assert mount["readOnly"] is True
    assert model != server_facts.IMAGE_MODEL_DIR and model.startswith(mount["mountPath"] + "/")
    # Nothing copies the built-in model over it.
    assert not spec.get("initContainers")


@pytest.mark.parametrize("variant", WITHOUT_PVC)
def test_without_the_component_the_built_in_model_is_copied_and_served(variant):
    spec, model, mount, volume = _model_volume(variant)
    assert "emptyDir" in volume
    [init] = spec["initContainers"]
    source, destination = init["command"][-2:]
    assert source == server_facts.IMAGE_MODEL_DIR
    # cp -R SRC DIR/ writes DIR/<basename of SRC>: the directory --model names.
    assert destination.rstrip("/") + "/" + source.rsplit("/", 1)[1] == model


def test_loader_pod_writes_where_the_server_reads():
    """`kubectl cp ./my-model LOADER:<model dir>` (docs/deploy.md) puts the
    model where --model points."""
    loader = _example("model-loader.example.yaml")
    claim = _example("pvc.example.yaml")
    _, model, server_mount, _ = _model_volume(WITH_PVC[0])
    [container] = loader["spec"]["containers"]
    mount, volume = mount_for(container, loader["spec"]["volumes"], model)
    assert mount is not None and not mount.get("readOnly", False)
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert mount["mountPath"] == server_mount["mountPath"]
    # Same uid as the server, so what it writes the server can read.
    deployment = one(render_overlay(WITH_PVC[0]), "Deployment")
    assert loader["spec"]["securityContext"]["runAsUser"] == \
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert claim["metadata"]["namespace"] == loader["metadata"]["namespace"] == \
        deployment["metadata"]["namespace"]


@pytest.mark.parametrize("name", ["pvc.example.yaml", "model-loader.example.yaml"])
def test_example_manifests_are_valid_kubernetes_1_30(name):
    import kubernetes_validate
    assert kubernetes_validate.validate(_example(name), KUBERNETES_VERSION, strict=True) == \
        KUBERNETES_VERSION


def test_example_claim_can_be_mounted_on_several_nodes():
    """Replicas spread over nodes (topologySpreadConstraints) all mount it."""
    modes = set(_example("pvc.example.yaml")["spec"]["accessModes"])
    assert modes & {"ReadWriteMany", "ReadOnlyMany"}
