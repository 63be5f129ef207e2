#!/usr/bin/env bash
# Runs an archive of bench/gpu_bundle.sh on a GPU machine, from a checkout of
# the same commit: the GPU test binaries (each under a time limit), then
# engine_bench --device=cuda, compare_pytorch.py --device cuda (python3 with
# torch), compute-sanitizer on one backend test and bench/gpu_summary.py,
# within LIMIT seconds in all (default 540). Results under $OUT (default
# ./gpu-results): run.log, tests.log, engine_bench.json, engine_bench.txt,
# compare_pytorch.txt, sanitizer.log, summary.txt.
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

echo "== engine_bench ($(left) s left)"
timeout $(($(left) > 230 ? 200 : $(left) - 30)) stdbuf -oL "$ROOT/build/cuda/bench/engine_bench" \
  --device=cuda --benchmark_counters_tabular=true --benchmark_out="$OUT/engine_bench.json" \
  --benchmark_out_format=json >"$OUT/engine_bench.txt" 2>&1 || failed=1
tail -12 "$OUT/engine_bench.txt"

echo "== compare_pytorch ($(left) s left)"
if (($(left) > 100)); then
  PYTHONUNBUFFERED=1 timeout $(($(left) - 60 > 170 ? 170 : $(left) - 60)) python3 \
    bench/compare_pytorch.py --build-dir build/cuda --threads "$(nproc)" --device cuda --paper \
    --skip-model --concurrency 1,32 --ref-batches 1 >"$OUT/compare_pytorch.txt" 2>&1 || failed=1
  tail -6 "$OUT/compare_pytorch.txt"
fi

echo "== compute-sanitizer ($(left) s left)"
if (($(left) > 40)) && command -v compute-sanitizer >/dev/null; then
  timeout $(($(left) - 15)) compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$probe" >"$OUT/sanitizer.log" 2>&1 || failed=1
  tail -2 "$OUT/sanitizer.log"
fi

python3 bench/gpu_summary.py --engine-bench "$OUT/engine_bench.json" \
  --compare "$OUT/compare_pytorch.txt" >"$OUT/summary.txt" 2>&1 || failed=1
cat "$OUT/summary.txt"
echo "== done in $((SECONDS - start)) s$([[ $failed == 1 ]] && echo ', some steps FAILED')"
exit $failed
