#!/bin/sh
# Runs one libFuzzer target for SECONDS from its committed seed corpus, adding
# what it finds to a scratch corpus (the committed one is not modified).
# Fails when the target crashes, leaks, times out on an input or breaks a
# property it checks; the failing input is then kept in the scratch directory
# (removed after a clean run).
#   run_fuzzer.sh TARGET SEED_DIR SECONDS [extra libFuzzer flags]
set -eu
target=$(readlink -f "$1")
seeds=$(readlink -f "$2")
seconds=$3
shift 3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/switchserve-fuzz.XXXXXX")
mkdir "$scratch/corpus"
echo "fuzzing $(basename "$target") for ${seconds}s in $scratch"
cd "$scratch"
status=0
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 "$@" "$scratch/corpus" "$seeds" || status=$?
if [ "$status" -eq 0 ]; then
  rm -rf "$scratch"
else
  echo "$(basename "$target") failed (exit $status); the input is in $scratch"
fi
exit "$status"
