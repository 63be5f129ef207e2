"""deploy/docker/Dockerfile{,.cuda}, read statically (no Docker engine here):
the build stages run the project's install and build scripts (so CI, which
runs those scripts, exercises the image build steps), and the final stage has
only runtime libraries, a non-root user, the built-in model and a health check
through `switchserve health`."""
import json
import re
import shlex

import pytest

import server_facts
from deploy_helpers import REPO_ROOT

DOCKER_DIR = REPO_ROOT / "deploy" / "docker"
DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]
INSTALL = "scripts/install-deps.sh"
BUILD = "scripts/build.sh"


def parse_dockerfile(text):
    """[(stage_name, from_image, [(INSTRUCTION, arguments)])], continuations joined."""
    text = re.sub(r"^\s*#.*\n", "", text, flags=re.M)
    text = re.sub(r"\\\n", " ", text)
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = arguments.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append((name, words[0], []))
        elif stages:
            stages[-1][2].append((instruction, arguments.strip()))
    return stages


def runs(stage):
    return [args for instruction, args in stage[2] if instruction == "RUN"]


def exec_form(arguments):
    """A JSON-array (exec form) instruction argument as a list."""
    return json.loads(arguments)


def _stages(name):
    return parse_dockerfile((DOCKER_DIR / name).read_text())


def _build_stage(stages):
    building = [s for s in stages if any(BUILD in r for r in runs(s))]
    assert len(building) == 1, "exactly one stage should run scripts/build.sh"
    return building[0]


def test_the_scripts_the_images_run_exist():
    for script in (INSTALL, BUILD):
        path = REPO_ROOT / script
        assert path.is_file() and path.stat().st_mode & 0o111, script
    assert "--runtime" in (REPO_ROOT / INSTALL).read_text()


def test_parser_sees_stages_and_continuations():
    stages = parse_dockerfile("FROM a AS one\n# c\nRUN x \\\n  && y\nFROM b\nUSER 1\n")
    assert stages == [("one", "a", [("RUN", "x    && y")]), (None, "b", [("USER", "1")])]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_stage_installs_and_builds_with_the_project_scripts(name):
    stage = _build_stage(_stages(name))
    commands = runs(stage)
    install = [i for i, r in enumerate(commands) if INSTALL in r and "--runtime" not in r]
    build = [i for i, r in enumerate(commands) if re.search(rf"{BUILD}\s+release\b", r)]
    assert install and build and install[0] < build[0]
    # The binary it copies out is where build.sh's release preset puts it.
    presets = json.loads((REPO_ROOT / "CMakePresets.json").read_text())
    [release] = [p for p in presets["configurePresets"] if p["name"] == "release"]
    binary_dir = release["binaryDir"].replace("${sourceDir}/", "")
    assert any(f"{binary_dir}/server/{server_facts.BINARY}" in r for r in commands)
    # The build context must not bring host build trees along.
    ignore = (DOCKER_DIR / f"{name}.dockerignore").read_text().split()
    assert f"{binary_dir.split('/')[0]}/" in ignore


def _copy_destination(args, source):
    """Where COPY puts `source`: the destination, or source's name inside it
    when the destination is a directory (ends with '/')."""
    destination = args.split()[-1]
    return destination + source.split("/")[-1] if destination.endswith("/") else destination


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_is_runtime_only(name):
    stages = _stages(name)
    final = stages[-1]
    assert final[1] == "debian:12-slim"
    commands = runs(final)
    # The install script as this stage calls it: copied from the context.
    copied = [_copy_destination(a, INSTALL) for i, a in final[2]
              if i == "COPY" and "--from=" not in a and a.split()[0] == INSTALL]
    assert len(copied) == 1, f"the final stage should COPY {INSTALL} once"
    script = copied[0]
    assert any(re.search(rf"{re.escape(script)}\s+--runtime\b", r) for r in commands)
    assert not any(script in r and "--runtime" not in r for r in commands)
    assert not any(BUILD in r or "apt-get" in r for r in commands)
    copies_from = {re.search(r"--from=(\S+)", a).group(1)
                   for i, a in final[2] if i == "COPY" and "--from=" in a}
    assert _build_stage(stages)[0] in copies_from


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_runs_as_a_non_root_user(name):
    final = _stages(name)[-1]
    users = [a for i, a in final[2] if i == "USER"]
    assert users, "no USER in the final stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    created = [r for r in runs(final) if "useradd" in r]
    assert created and re.search(rf"--uid\s+{uid}\b", created[0])


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stage_carries_the_built_in_model_and_serves_it(name):
    final = _stages(name)[-1]
    copies = [a for i, a in final[2] if i == "COPY"]
    assert any(a.split()[-1].rstrip("/") == server_facts.IMAGE_MODEL_DIR for a in copies)
    build_commands = " ".join(runs(_build_stage(_stages(name))))
    assert "models/default" in build_commands
    entrypoint = exec_form(next(a for i, a in final[2] if i == "ENTRYPOINT"))
    command = exec_form(next(a for i, a in final[2] if i == "CMD"))
    assert entrypoint == [server_facts.BINARY] and command[0] == "serve"
    flags = server_facts.parse_cli_flags(command[1:])
    assert set(flags) <= server_facts.known_flag_names()
    assert flags["model"] == server_facts.IMAGE_MODEL_DIR
    assert int(flags["port"]) == server_facts.grpc_port()
    assert int(flags["metrics_port"]) == server_facts.metrics_port()
    assert flags["device"] == ("cuda" if name.endswith(".cuda") else "cpu")
    exposed = {int(p) for i, a in final[2] if i == "EXPOSE" for p in a.split()}
    assert exposed == {server_facts.grpc_port(), int(flags["http_port"]),
                       server_facts.metrics_port()}


def test_built_in_model_is_in_the_source_tree_when_present():
    model = REPO_ROOT / "models" / "default"
    if not model.exists():
        pytest.skip("models/default is not in this tree yet")
    assert (model / "config.json").is_file()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_healthcheck_is_the_health_subcommand_at_the_grpc_port(name):
    final = _stages(name)[-1]
    [healthcheck] = [a for i, a in final[2] if i == "HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD ")
    assert "--start-period=" in options
    argv = exec_form(command)
    assert argv[:2] == [server_facts.BINARY, "health"]
    address = server_facts.parse_cli_flags(argv[2:])["address"]
    assert int(address.rsplit(":", 1)[1]) == server_facts.grpc_port()
    assert [a for i, a in final[2] if i == "STOPSIGNAL"] == ["SIGTERM"]


def test_cuda_image_takes_the_cuda_runtime_from_nvidia():
    stages = _stages("Dockerfile.cuda")
    images = {name: image for name, image, _ in stages}
    assert re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu[\d.]+", images["cuda-runtime"])
    assert re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-devel-ubuntu[\d.]+", images["cuda-devel"])
    final = stages[-1]
    copies = " ".join(a for i, a in final[2] if i == "COPY")
    assert "--from=cuda-runtime" in copies
    env = " ".join(a for i, a in final[2] if i == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env and "compute" in env
    build = _build_stage(stages)
    assert any(i == "COPY" and "--from=cuda-devel" in a for i, a in build[2])
    assert any(shlex.split(a)[0].startswith("PATH=/usr/local/cuda/bin") for i, a in build[2] if i == "ENV")


def test_cuda_image_builds_the_cuda_backend_with_a_toolkit_that_has_what_it_calls():
    """CUDA >= 12.5 (the backend calls cuBLAS's grouped GEMM); nvcc on the
    build stage's PATH and CUDACXX, so the release preset compiles the CUDA
    backend into `switchserve`; the runtime stage carries cudart and cuBLAS."""
    text = (DOCKER_DIR / "Dockerfile.cuda").read_text()
    version = re.search(r"^ARG CUDA_VERSION=(\d+)\.(\d+)\.\d+$", text, re.M)
    major_minor = re.search(r"^ARG CUDA_MAJOR_MINOR=(\d+\.\d+)$", text, re.M)
    assert version and major_minor
    assert (int(version.group(1)), int(version.group(2))) >= (12, 5)
    assert major_minor.group(1) == f"{version.group(1)}.{version.group(2)}"
    stages = _stages("Dockerfile.cuda")
    build = _build_stage(stages)
    env = " ".join(a for i, a in build[2] if i == "ENV")
    assert "CUDACXX=/usr/local/cuda/bin/nvcc" in env
    assert any("build.sh release switchserve" in r for r in runs(build))
    cuda_runtime = dict((name, stage) for name, _, stage in stages)["cuda-runtime"]
    copied = " ".join(runs(("cuda-runtime", None, cuda_runtime)))
    for library in ("libcudart.so", "libcublas.so", "libcublasLt.so"):
        assert library in copied
    # The driver requirement follows the toolkit (a CUDA 12 build for
    # pre-R580 drivers asks for CUDA 12): the runtime stage reads the ARG.
    final = stages[-1][2]
    assert ("ARG", "CUDA_MAJOR_MINOR") in final
    final_env = " ".join(a for i, a in final if i == "ENV")
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=${CUDA_MAJOR_MINOR}"' in final_env
