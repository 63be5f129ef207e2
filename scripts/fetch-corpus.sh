#!/usr/bin/env bash
# Writes the cleaned training corpus of the built-in model (the King James
# Bible, one verse per line; tools/corpus.py) to the path given.
# Installs Debian's bible-kjv + bible-kjv-text packages when `bible` is missing.
#   scripts/fetch-corpus.sh OUT.txt [all|train|heldout]     (default: all)
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 OUT.txt [all|train|heldout]" >&2
  exit 2
fi
out=$1
split=${2:-all}

if ! command -v bible >/dev/null 2>&1 || ! dpkg -s bible-kjv-text >/dev/null 2>&1; then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends bible-kjv bible-kjv-text
fi

here=$(cd "$(dirname "$0")/.." && pwd)
/usr/bin/python3 "$here/tools/corpus.py" "$out" --split "$split"
