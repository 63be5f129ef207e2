#!/usr/bin/env bash
# Installs every dependency, builds, and runs the whole test suite:
# the release build's tests, then the same tests under ASan+UBSan, the
# engine's threads under ThreadSanitizer, and each fuzz target for a while.
# Both builds run the CUDA kernels on the SIMT executor (ctest label simt);
# the release build also compiles them with nvcc, wherever it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/install-test-tools.sh
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
for preset in release asan; do
  echo "=== build ($preset)"
  flags=(-DSWITCHSERVE_CUDA_EMULATION=ON)
  if [[ $preset == release && -x $nvcc ]]; then
    flags+=(-DSWITCHSERVE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
  elif [[ $preset == release ]]; then
    echo "test.sh: no nvcc: the CUDA kernels are not compiled for the GPU in this run"
  fi
  cmake --preset "$preset" "${flags[@]}" >/dev/null
  scripts/build.sh "$preset"
  echo "=== test ($preset)"
  ctest --preset "$preset" -j"$(nproc)"
done

# The engine's threads, and the server behind the HTTP and gRPC API tests,
# under ThreadSanitizer (ctest label tsan): only what those need is built.
# Debian's gRPC is not instrumented, so reports through gRPC are suppressed
# and the C++ gRPC tests are not run (docs/reliability.md).
echo "=== build (tsan)"
cmake --preset tsan >/dev/null
scripts/build.sh tsan generation_engine_test generation_engine_cancel_test \
  generation_engine_queue_test cpu_worker_pool_test cpu_paged_attention_test http_server_test \
  switchserve switchserve_integration_python
echo "=== test (tsan)"
ctest --preset tsan -j"$(nproc)"

# Each libFuzzer target for a bounded time from its seed corpus (clang).
echo "=== build (fuzz)"
cmake --preset fuzz >/dev/null
scripts/build.sh fuzz safetensors_fuzz model_config_fuzz generate_request_fuzz tokenizer_fuzz \
  stop_strings_fuzz completion_request_fuzz http_request_fuzz logprobs_fuzz model_directory_fuzz
echo "=== test (fuzz)"
ctest --preset fuzz -j"$(nproc)"
