#!/usr/bin/env bash
# Installs the tools the tests need beyond the build dependencies: those of the
# deployment tests (tests/deploy, ctest label `deploy`) and the fuzz targets,
# on Debian 12. Idempotent; prints what it installs.
#   - kubectl >= 1.27 (for `kubectl kustomize`: the overlays use Kustomize
#     components) must be on PATH already: Debian 12's kubernetes-client is
#     1.20, whose kustomize predates components, so the script stops with a
#     message instead of installing it;
#   - promtool, from Debian's prometheus package;
#   - clang-14 and its runtime libraries (libFuzzer, sanitizers), for the fuzz
#     targets (tests/fuzz, the `fuzz` preset);
#   - python3 with pytest, PyYAML and torch (Debian; the CLI tests compare with
#     the PyTorch reference in tools/reference) and matplotlib (Debian; the
#     benchmarks' roofline chart, bench/roofline_chart.py), and a venv at build/venv
#     (--system-site-packages, from /usr/bin/python3) holding the PyPI package
#     kubernetes-validate, whose wheel carries the Kubernetes JSON schemas
#     (1.25 ... 1.37) so validation works offline, and the official `openai`
#     client, which the HTTP API tests (tests/integration/http/)
#     drive the server with;
#   - curl, for the same tests' curl checks.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."

KUBERNETES_VALIDATE_VERSION=1.37.0
OPENAI_VERSION=2.8.1
venv=build/venv

source "$here/apt-packages.sh"

packages=(python3 python3-venv python3-pip python3-pytest python3-yaml python3-torch
          python3-matplotlib prometheus curl clang-14 libclang-rt-14-dev)

# kubectl's client version as major * 1000 + minor (0 without kubectl).
kubectl_version() {
  kubectl version --client -o json 2>/dev/null | /usr/bin/python3 -c '
import json, re, sys
try:
    v = json.load(sys.stdin)["clientVersion"]
    print(int(v["major"]) * 1000 + int(re.match(r"\d+", v["minor"]).group()))
except Exception:
    print(0)'
}
if (($(kubectl_version) < 1027)); then
  echo "install-test-tools: the deployment tests need kubectl >= 1.27 on PATH (kubectl" \
    "kustomize with Kustomize components); found: $(command -v kubectl || echo none)." \
    "Debian 12's kubernetes-client (1.20) is too old: install kubectl from the Kubernetes" \
    "project (https://kubernetes.io/docs/tasks/tools/) and run this again." >&2
  exit 1
fi

had_prometheus=false
dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "install ok installed" &&
  had_prometheus=true
install_debian_packages install-test-tools "${packages[@]}"
# The package is here for promtool. On a systemd machine its postinst starts
# the Prometheus server on port 9090, switchserve's default metrics port: stop
# the service it just started (one that was here before is left alone).
if ! $had_prometheus && command -v systemctl >/dev/null &&
  systemctl is-active --quiet prometheus 2>/dev/null; then
  echo "install-test-tools: stopping and disabling prometheus.service (installed for promtool;" \
    "it holds port 9090, switchserve's metrics port)"
  if [[ $(id -u) -ne 0 ]]; then sudo systemctl disable --now prometheus; else
    systemctl disable --now prometheus
  fi
fi

if [[ ! -x $venv/bin/python3 ]]; then
  echo "install-test-tools: creating $venv (python venv, --system-site-packages)"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# pip_pin PACKAGE VERSION: installs PACKAGE==VERSION into the venv unless it
# is there already.
pip_pin() {
  local installed
  installed=$("$venv/bin/python3" -c \
    "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true)
  if [[ $installed != "$2" ]]; then
    echo "install-test-tools: pip installing $1==$2 into $venv"
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check "$1==$2"
  else
    echo "install-test-tools: $1 $installed present in $venv"
  fi
}
pip_pin kubernetes-validate "$KUBERNETES_VALIDATE_VERSION"
pip_pin openai "$OPENAI_VERSION"
