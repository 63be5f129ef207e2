#!/usr/bin/env bash
# Installs every dependency, builds, and runs the whole test suite:
# the release build's tests, then the same tests under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/install-test-tools.sh
for preset in release asan; do
  echo "=== build ($preset)"
  scripts/build.sh "$preset"
  echo "=== test ($preset)"
  ctest --preset "$preset" -j"$(nproc)"
done
