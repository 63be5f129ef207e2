#!/usr/bin/env bash
# The whole GPU check of switchserve in one command, for a machine with an
# NVIDIA GPU (sm_80 or newer): build the CUDA backend (nvcc), run the GPU test
# suite, run the benchmarks against the limits measured in the same run, and
# write everything under $OUT (default ./gpu-results).
#
#   bench/gpu_suite.sh [--smoke] [PHASE...]      PHASE: build test bench (default: all three)
#
# Phases, each well under 10 minutes on a 16-core machine with an H100:
#   build  cmake --preset cuda (+ benchmarks), for the GPU found (nvidia-smi)
#   test   ctest labels simt_gpu and cuda_gpu (kernels against their CPU
#          references, the per-backend suites, routing replay, decode-graph
#          replay against eager), then compute-sanitizer on one test binary
#   bench  engine_bench --device=cuda (SwitchAll and the dense baseline:
#          decode at batch 1, 8, 32, 64, 256 (context 128) and 1, 8
#          (context 2000), a step of 30 decoding beside 2 prompts of 32, a
#          2048-token prefill, the copy
#          bandwidth and bf16 GEMM rate), then compare_pytorch.py --device cuda
#          (the PyTorch reference on the same GPU, the in-process engine and
#          gRPC at 1 and 32 clients); bench/gpu_summary.py checks the goals
# Files: build.log, tests.log, tests.xml, sanitizer.log, engine_bench.json,
# engine_bench.txt, compare_pytorch.txt, summary.txt (printed last).
#
# --smoke: the same steps end to end on a machine without a GPU: a build
# with the CUDA backend on the SIMT executor, the `cuda` ctest label, and the
# benchmarks on tiny models (engine_bench --smoke, a golden model for the
# comparison). Nothing it prints is a GPU figure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

smoke=0
phases=()
for arg in "$@"; do
  case $arg in
    --smoke) smoke=1 ;;
    build | test | bench) phases+=("$arg") ;;
    *)
      echo "usage: bench/gpu_suite.sh [--smoke] [build] [test] [bench]" >&2
      exit 2
      ;;
  esac
done
[[ ${#phases[@]} -eq 0 ]] && phases=(build test bench)
OUT=${OUT:-$ROOT/gpu-results}
mkdir -p "$OUT"
jobs=$(nproc)
failed=0

note() { echo "gpu_suite: $*" | tee -a "$OUT/suite.log"; }
run() {  # run LOG CMD...: appends to $OUT/LOG, records a failure
  local log=$1
  shift
  note "$*"
  "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  if [[ $rc != 0 ]]; then
    note "FAILED (exit $rc): $* (see $log)"
    failed=1
    return 1
  fi
}

if [[ $smoke == 1 ]]; then
  BUILD=$ROOT/build/gpu-suite-smoke
else
  BUILD=$ROOT/build/cuda
fi

phase_build() {
  if [[ $smoke == 1 ]]; then
    run build.log cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSWITCHSERVE_CUDA=OFF -DSWITCHSERVE_CUDA_EMULATION=ON -DSWITCHSERVE_BUILD_BENCH=ON || return
    run build.log cmake --build "$BUILD" -j"$jobs" --target switchserve switchserve-bench \
      engine_bench engine_bench_emulated switchserve_emulated switchserve_integration_python \
      cuda_backend_test cuda_consistency_test cuda_routing_test cuda_numerics_test
    return
  fi
  nvidia-smi >"$OUT/device.txt" 2>&1 || note "nvidia-smi failed (no driver?)"
  # The GPU's architecture: 9.0 -> 90a (wgmma-capable), 8.x -> 8x.
  local cap arch
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  arch=${cap:-80}
  [[ $arch == 90 ]] && arch=90a
  note "building for sm_$arch"
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  run build.log cmake --preset cuda -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DSWITCHSERVE_CUDA_ARCHITECTURES="$arch" -DSWITCHSERVE_BUILD_BENCH=ON || return
  run build.log cmake --build "$BUILD" -j"$jobs"
}

phase_test() {
  if [[ $smoke == 1 ]]; then
    run tests.log ctest --test-dir "$BUILD" -L cuda -j"$jobs" --output-on-failure \
      --output-junit "$OUT/tests.xml"
    return
  fi
  run tests.log ctest --test-dir "$BUILD" -L "simt_gpu|cuda_gpu" -j4 --output-on-failure \
    --output-junit "$OUT/tests.xml"
  if command -v compute-sanitizer >/dev/null; then
    run sanitizer.log compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$BUILD/tests/cuda/gpu_cuda_backend_test"
  else
    note "no compute-sanitizer on this machine"
  fi
}

phase_bench() {
  local device_args=(--device=cuda)
  # 16 waves of requests per switchserve run: a GPU finishes 2 waves of 32 in
  # a fraction of a second, too short for a stable gRPC / engine ratio (on an
  # H200, 8 waves gave 0.80x where three runs of 16 gave 0.89-0.93x).
  local compare_args=(--device cuda --paper --skip-model --concurrency 1,32 --ref-batches 1
    --waves 16)
  local engine_bench=$BUILD/bench/engine_bench
  if [[ $smoke == 1 ]]; then
    device_args+=(--smoke --benchmark_min_time=0.01)
    compare_args=(--device cuda --ref-device cpu --model "$ROOT/tests/golden/switchall_f16"
      --concurrency 1,2
      --ref-batches 1 --new-tokens 4 --prompt-len 4 --min-requests 2 --min-seconds 0.2
      --heldout /nonexistent)
  fi
  run engine_bench.txt "$engine_bench" "${device_args[@]}" --benchmark_counters_tabular=true \
    --benchmark_out="$OUT/engine_bench.json" --benchmark_out_format=json
  local python=python3
  [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c "import torch" 2>/dev/null && python=/usr/bin/python3
  run compare_pytorch.txt "$python" bench/compare_pytorch.py --build-dir "$BUILD" \
    --threads "$jobs" "${compare_args[@]}"
  "$python" bench/gpu_summary.py --engine-bench "$OUT/engine_bench.json" \
    --compare "$OUT/compare_pytorch.txt" $([[ $smoke == 1 ]] && echo --smoke) \
    >"$OUT/summary.txt" 2>&1 || failed=1
}

for phase in "${phases[@]}"; do
  note "=== $phase$([[ $smoke == 1 ]] && echo ' (smoke)')"
  "phase_$phase"
done
[[ -f $OUT/summary.txt ]] && cat "$OUT/summary.txt"
note "results in $OUT$([[ $failed == 1 ]] && echo ' (some steps FAILED, see suite.log)')"
exit $failed
