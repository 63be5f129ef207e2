#!/usr/bin/env bash
# Breaks the code on purpose and checks that the named tests catch it:
# applies PATCH to the working tree, builds the given targets, runs the ctest
# subset REGEX, expects it to FAIL, and restores the tree (also on Ctrl-C or
# a failed build). Exits 0 when the tests caught the breakage, 1 when they
# passed with it (a test that cannot see the rule it claims to guard).
#
#   scripts/break-check.sh PATCH CTEST_REGEX [TARGET...]
#   e.g. scripts/break-check.sh /tmp/no-reroute-record.patch 'RerouteNever' \
#          expert_dispatch_test sequence_dispatch_test
#
# Uses the release build (build/release, configured). The patch must apply
# cleanly to the working tree and the broken tree must build (exit 2
# otherwise, never 1); the tree is restored with
# `git apply -R`; rebuild afterwards. Patches for the rules docs/testing.md
# lists are in tests/breakages/.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
# The patch's path as given, from the caller's directory.
if ! patch=$(realpath -e "$1"); then
  echo "break-check: no patch $1" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
regex=$2
shift 2
targets=("$@")

if ! git apply --check "$patch"; then
  echo "break-check: $patch does not apply to this tree" >&2
  exit 2
fi
git apply "$patch"
trap 'git apply -R "$patch"; echo "break-check: restored the tree"' EXIT
echo "break-check: applied $patch"

built=true
if [[ ${#targets[@]} -gt 0 ]]; then
  cmake --build build/release --target "${targets[@]}" || built=false
else
  cmake --build build/release || built=false
fi
if ! $built; then
  echo "break-check: the tree does not build with $patch applied" >&2
  exit 2
fi
if ctest --test-dir build/release -R "$regex" --output-on-failure; then
  echo "break-check: NOT CAUGHT: '$regex' passed with the breakage applied"
  exit 1
fi
echo "break-check: caught: '$regex' failed with the breakage applied"
