#!/bin/sh
# Runs integration tests (pytest) against the tsan build's server and fails
# when ThreadSanitizer reported anything in a server the tests started,
# whatever the tests said: each report is written to a file (TSAN_OPTIONS
# log_path), not to the server's log, and a report does not stop the server.
#   run_under_tsan.sh PYTHON SUPPRESSIONS [pytest args and paths...]
set -u
python=$1 suppressions=$2
shift 2
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 log_path=$reports/report suppressions=$suppressions" \
  "$python" -m pytest -q -p no:cacheprovider "$@"
status=$?
if [ -n "$(ls "$reports")" ]; then
  cat "$reports"/*
  echo "ThreadSanitizer: $(ls "$reports" | wc -l) server process(es) reported races (above)"
  exit 1
fi
exit "$status"
