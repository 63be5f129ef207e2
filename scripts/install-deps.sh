#!/usr/bin/env bash
# Installs everything switchserve needs to build, test and run on Debian 12.
# Idempotent; used by the README commands, CI and the container images.
# The CUDA toolkit (nvcc, cuBLAS, the cuda_bf16.h headers the SIMT executor
# builds against) is not a Debian package: it is expected at /usr/local/cuda
# (or wherever nvcc on PATH lives). Without it the server builds without the
# CUDA backend (scripts/serve.sh); the test command needs it, since every run
# tests the CUDA backend on the SIMT executor.
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --runtime  only the shared libraries the binary needs
set -euo pipefail

runtime_only=false
[[ "${1:-}" == "--runtime" ]] && runtime_only=true

source "$(dirname "$0")/apt-packages.sh"

runtime_packages=(
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libopenblas0-pthread
  libsentencepiece0 libgomp1 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libssl3
  ca-certificates
)
build_packages=(
  build-essential cmake ninja-build ccache pkg-config git clang-format
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev libopenblas-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece libgtest-dev libgmock-dev libbenchmark-dev
  libboost-context-dev libboost-dev libssl-dev
  python3 python3-numpy python3-grpcio python3-protobuf python3-pytest python3-yaml python3-h2
  openssl
)

if $runtime_only; then
  packages=("${runtime_packages[@]}")
else
  packages=("${runtime_packages[@]}" "${build_packages[@]}")
fi

install_debian_packages install-deps "${packages[@]}"
