#!/bin/sh
# Runs docs/reliability.md's "To repeat one" command as a reader would copy
# it, from the source tree, with two changes only: 2 s instead of an hour,
# and a scratch directory in place of /tmp. Fails when the block does.
#   doc_repeat_command.sh SOURCE_DIR FUZZ_BUILD_DIR
set -eu
source_dir=$(readlink -f "$1")
build_dir=$(readlink -f "$2")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/switchserve-fuzz-doc.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# The sh block that follows the line starting "To repeat one".
block=$(awk '/^To repeat one/ { found = 1 }
             found && /^```/ { if (inside) exit; inside = 1; next }
             inside { print }' "$source_dir/docs/reliability.md")
[ -n "$block" ] || { echo "no command after \"To repeat one\" in docs/reliability.md"; exit 1; }
command=$(printf '%s\n' "$block" |
  sed -e 's/-max_total_time=[0-9]*/-max_total_time=2/' \
      -e "s|/tmp/|$scratch/|g" \
      -e "s|build/fuzz/|$build_dir/|g")
printf '%s\n' "$command"
cd "$source_dir"
sh -ec "$command"
