#!/usr/bin/env bash
# Packs the GPU suite for a GPU machine that has the NVIDIA driver and the
# CUDA 13 runtime (cuBLAS) but not switchserve's build dependencies (gRPC,
# protobuf, Abseil, OpenBLAS, ...): builds the `cuda` preset here (Debian 12,
# nvcc) for one GPU architecture, and writes one archive with the GPU test
# binaries, engine_bench, switchserve, switchserve-bench and the shared
# libraries they load from Debian (glibc kept apart, used only where the
# machine's own is older). bench/gpu_bundle_run.sh runs it there.
#
#   bench/gpu_bundle.sh [ARCH] [ARCHIVE]    default: 90a (H100, H200), gpu-bundle.tar.xz
#
# The binaries find the golden models through the source directory they were
# built in; the archive records it and the runner links it to its checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
arch=${1:-90a}
archive=$(realpath -m "${2:-gpu-bundle.tar.xz}")
build=$ROOT/build/cuda

cmake --preset cuda -DSWITCHSERVE_CUDA_ARCHITECTURES="$arch" -DSWITCHSERVE_BUILD_BENCH=ON >/dev/null
targets=(engine_bench switchserve switchserve-bench)
mapfile -t tests < <(ninja -C "$build" -t targets all | sed -n 's/^\(\(simt_gpu\|gpu\)_[a-z_]*_test\): .*/\1/p' | sort -u)
cmake --build "$build" -- "${targets[@]}" "${tests[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/.gpulib/lib" "$stage/.gpulib/glibc"
binaries=()
for target in "${targets[@]}" "${tests[@]}"; do
  file=$(find "$build" -type f -name "$target" -perm -u+x | head -1)
  rel=${file#"$ROOT"/}
  mkdir -p "$stage/$(dirname "$rel")"
  cp "$file" "$stage/$rel"
  strip "$stage/$rel"
  binaries+=("$file")
done
for file in "${binaries[@]}"; do ldd "$file"; done | awk '/=>/ {print $3}' | sort -u |
  while read -r lib; do
    case $(basename "$lib") in
      libcuda.so* | libcublas* | libnvidia*) ;;  # the machine's driver and CUDA runtime
      libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1)
        cp -L "$lib" "$stage/.gpulib/glibc/" ;;
      *) cp -L "$lib" "$stage/.gpulib/lib/" ;;
    esac
  done
cp -L /lib64/ld-linux-x86-64.so.2 "$stage/.gpulib/glibc/"
echo "$ROOT" >"$stage/.gpulib/source_dir"
tar -cJf "$archive" -C "$stage" .
echo "gpu_bundle: $archive ($(du -h "$archive" | cut -f1), sm_$arch, ${#tests[@]} test binaries)"
