#!/usr/bin/env bash
# Installs the tools the tests need beyond the build dependencies: those of the
# deployment tests (tests/deploy, ctest label `deploy`) and the fuzz targets,
# on Debian 12. Idempotent; prints what it installs.
#   - kubectl (for `kubectl kustomize`), from Debian's kubernetes-client unless
#     a kubectl with kustomize is already on PATH;
#   - promtool, from Debian's prometheus package;
#   - clang-14 and its runtime libraries (libFuzzer, sanitizers), for the fuzz
#     targets (tests/fuzz, the `fuzz` preset);
#   - python3 with pytest, PyYAML and torch (Debian; the CLI tests compare with
#     the PyTorch reference in tools/reference) and matplotlib (Debian; the
#     benchmarks' roofline chart, bench/roofline_chart.py), and a venv at build/venv
#     (--system-site-packages, from /usr/bin/python3) holding the PyPI package
#     kubernetes-validate, whose wheel carries the Kubernetes JSON schemas
#     (1.25 ... 1.37) so validation works offline, and the official `openai`
#     client, which the HTTP API tests (tests/integration/test_openai_http.py)
#     drive the server with;
#   - curl, for the same tests' curl checks.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE_VERSION=1.37.0
OPENAI_VERSION=2.8.1
venv=build/venv

source "$(dirname "$0")/apt-packages.sh"

packages=(python3 python3-venv python3-pip python3-pytest python3-yaml python3-torch
          python3-matplotlib prometheus curl clang-14 libclang-rt-14-dev)
if ! { command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; }; then
  packages+=(kubernetes-client)
fi

install_debian_packages install-test-tools "${packages[@]}"

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
