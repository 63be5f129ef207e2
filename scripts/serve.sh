#!/usr/bin/env bash
# Installs every dependency, builds, and starts the server on the built-in
# model (extra arguments go to `switchserve serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release switchserve
exec build/release/server/switchserve serve "$@"
