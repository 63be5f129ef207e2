#!/usr/bin/env bash
# Runs an archive of bench/gpu_bundle.sh on a GPU machine, from a checkout of
# the same commit: the GPU test binaries (each under a time limit),
# compute-sanitizer on one backend test, then the bench phase of
# bench/gpu_suite.sh (engine_bench --device=cuda, compare_pytorch.py --device
# cuda, gpu_summary.py), within LIMIT seconds in all (default 540). Results
# under $OUT (default ./gpu-results): run.log, tests.log, sanitizer.log and
# gpu_suite.sh's engine_bench.json, engine_bench.txt, compare_pytorch.txt,
# summary.txt.
#
#   OUT=... bench/gpu_bundle_run.sh gpu-bundle.tar.xz
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
archive=$(realpath "${1:?usage: bench/gpu_bundle_run.sh ARCHIVE}")
LIMIT=${LIMIT:-540}
OUT=${OUT:-$ROOT/gpu-results}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $((LIMIT - (SECONDS - start))); }
exec > >(tee -a "$OUT/run.log") 2>&1

tar -xJf "$archive" -C "$ROOT"
source_dir=$(cat "$ROOT/.gpulib/source_dir")
if [[ ! -e $source_dir ]]; then
  mkdir -p "$(dirname "$source_dir")"
  ln -s "$ROOT" "$source_dir"
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
lib=$ROOT/.gpulib/lib
glibc=$ROOT/.gpulib/glibc
cuda_dirs=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
  /usr/lib/x86_64-linux-gnu; do
  [[ -d $dir ]] && cuda_dirs+=":$dir"
done
cublas=$(find /usr/local /usr/lib /opt -name 'libcublas.so.13' 2>/dev/null | head -1)
[[ -n $cublas ]] && cuda_dirs="$(dirname "$cublas")$cuda_dirs"

# Each binary becomes a wrapper that loads the archive's libraries; with the
# archive's glibc and loader only where the machine's glibc is too old.
probe=$(find "$ROOT/build/cuda/tests" -type f -name 'gpu_cuda_backend_test' | head -1)
loader=""
if ! LD_LIBRARY_PATH=$lib:$cuda_dirs "$probe" --gtest_list_tests >/dev/null 2>&1; then
  loader="$glibc/ld-linux-x86-64.so.2 --library-path $lib:$glibc:$cuda_dirs"
fi
if [[ -n $loader ]]; then
  echo "gpu_bundle_run: the machine's glibc is too old: the archive's loader runs the binaries"
fi
find "$ROOT/build/cuda" -type f -perm -u+x ! -name '*.real' | while read -r bin; do
  mv "$bin" "$bin.real"
  if [[ -n $loader ]]; then
    printf '#!/bin/sh\nexec %s %s "$@"\n' "$loader" "$bin.real" >"$bin"
  else
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$lib:$cuda_dirs" "$bin.real" >"$bin"
  fi
  chmod +x "$bin"
done

echo "== tests ($(left) s left)"
failed=0
test_start=$SECONDS
for bin in $(find "$ROOT/build/cuda/tests" -type f -name '*_test' | sort); do
  limit=$((170 - (SECONDS - test_start)))
  ((limit > 60)) && limit=60
  if ((limit < 5)); then
    echo "$(basename "$bin"): not run (the tests' 170 s are used up)"
    failed=1
    continue
  fi
  timeout "$limit" "$bin" --gtest_brief=1 >/tmp/gpu_bundle_test.log 2>&1
  rc=$?
  { echo "--- $(basename "$bin")"; cat /tmp/gpu_bundle_test.log; } >>"$OUT/tests.log"
  # A test that skipped (no usable device) is a failure of a GPU run.
  skipped=$(grep -c -E 'Skipped|^\[  SKIPPED \]' /tmp/gpu_bundle_test.log)
  echo "$(basename "$bin"): exit $rc, skip messages $skipped," \
    "$(grep -E '^\[  (PASSED|FAILED) ' /tmp/gpu_bundle_test.log | tr '\n' ' ')"
  [[ $rc != 0 || $skipped != 0 ]] && failed=1
done

echo "== compute-sanitizer ($(left) s left)"
if (($(left) > 40)) && command -v compute-sanitizer >/dev/null; then
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$probe" \
    >"$OUT/sanitizer.log" 2>&1 || failed=1
  tail -2 "$OUT/sanitizer.log"
fi

# The benchmarks and the summary: gpu_suite.sh's bench phase, on the wrapped
# binaries in build/cuda.
echo "== bench ($(left) s left)"
OUT=$OUT timeout "$(left)" bench/gpu_suite.sh bench || failed=1
echo "== done in $((SECONDS - start)) s$([[ $failed == 1 ]] && echo ', some steps FAILED')"
exit $failed
