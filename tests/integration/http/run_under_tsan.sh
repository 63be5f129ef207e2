#!/bin/sh
# Runs the HTTP API's tests against the tsan build's server and fails when
# ThreadSanitizer reported anything in a server the tests started, whatever
# the tests said: each report is written to a file (TSAN_OPTIONS log_path),
# not to the server's log, and a report does not stop the server.
#   run_under_tsan.sh PYTHON SUPPRESSIONS TESTS_DIR [pytest args...]
set -u
python=$1 suppressions=$2 tests=$3
shift 3
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 log_path=$reports/report suppressions=$suppressions" \
  "$python" -m pytest -q -p no:cacheprovider "$@" "$tests"
status=$?
if [ -n "$(ls "$reports")" ]; then
  cat "$reports"/*
  echo "ThreadSanitizer: $(ls "$reports" | wc -l) server process(es) reported races (above)"
  exit 1
fi
exit "$status"
