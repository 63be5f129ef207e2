#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release) with all cores.
#   scripts/build.sh [release|asan] [extra ninja targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -- "$@"
