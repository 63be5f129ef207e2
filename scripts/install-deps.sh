#!/usr/bin/env bash
# Installs everything switchserve needs to build, test and run on Debian 12.
# Idempotent; used by the README commands, CI and the container images.
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --runtime  only the shared libraries the binary needs
set -euo pipefail

runtime_only=false
[[ "${1:-}" == "--runtime" ]] && runtime_only=true

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

runtime_packages=(
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libopenblas0-pthread
  libsentencepiece0 libgomp1 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 ca-certificates
)
build_packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev libopenblas-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-grpcio python3-protobuf python3-pytest python3-yaml openssl prometheus
)

if $runtime_only; then
  packages=("${runtime_packages[@]}")
else
  packages=("${runtime_packages[@]}" "${build_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi
