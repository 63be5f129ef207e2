// The device's limits a benchmark compares the backend with, measured in the
// benchmark's own process: device-to-device copy bandwidth (bytes read plus
// bytes written) and the bf16 GEMM rate of the GEMM wrapper (cuBLAS on a GPU,
// f32 accumulation), on random data, best of a few timed repetitions after a
// warm-up, timed with CUDA events.
#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"

namespace switchserve {
namespace {

// Milliseconds of the best of `reps` runs of `run` on `stream`.
template <typename Run>
absl::StatusOr<float> BestMs(cudaStream_t stream, int reps, Run run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  float best = 0;
  absl::Status status;
  for (int r = 0; r <= reps && status.ok(); ++r) {  // run 0 warms up
    status = cuda::CudaStatus(cudaEventRecord(start, stream), "cudaEventRecord");
    if (status.ok()) status = run();
    if (status.ok()) status = cuda::CudaStatus(cudaEventRecord(stop, stream), "cudaEventRecord");
    if (status.ok()) status = cuda::CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    if (status.ok()) status = cuda::CudaStatus(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (status.ok() && r > 0) best = r == 1 ? ms : std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  return best;
}

}  // namespace

absl::StatusOr<CudaDeviceLimits> MeasureCudaDeviceLimits(bool small) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(DescribeCudaDevices());
  }
  CudaDeviceLimits limits;
  cudaDeviceProp prop;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  limits.device = prop.name;
  cudaStream_t stream = nullptr;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream), "cudaStreamCreate");

  // Copy: 1 GiB (16 MiB when small) from one buffer to another.
  const size_t bytes = small ? (size_t{16} << 20) : (size_t{1} << 30);
  cuda::DeviceBuffer from, to;
  absl::Status s = from.Grow(bytes);
  if (s.ok()) s = to.Grow(bytes);
  if (s.ok()) s = cuda::CudaStatus(cudaMemsetAsync(from.get(), 1, bytes, stream), "memset");
  absl::StatusOr<float> ms = s.ok() ? absl::StatusOr<float>(0.0f) : absl::StatusOr<float>(s);
  if (s.ok()) {
    ms = BestMs(stream, 5, [&] {
      return cuda::CudaStatus(
          cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, stream),
          "device copy");
    });
  }
  if (!ms.ok()) {
    cudaStreamDestroy(stream);
    return ms.status();
  }
  limits.copy_gb_per_s = 2.0 * bytes / (*ms * 1e-3) / 1e9;
  from.Free();
  to.Free();

  // bf16 GEMM, n^3 (8192; 256 when small), random inputs, f32 output.
  const int n = small ? 256 : 8192;
  const size_t elements = static_cast<size_t>(n) * n;
  std::vector<__nv_bfloat16> host(elements);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (__nv_bfloat16& v : host) v = __float2bfloat16_rn(uniform(rng));
  cuda::DeviceBuffer a, b, c;
  s = a.Upload(host.data(), elements * 2);
  if (s.ok()) s = b.Upload(host.data(), elements * 2);
  if (s.ok()) s = c.Grow(elements * 4);
  cuda::GemmHandle* handle = nullptr;
  if (s.ok() && cuda::CreateGemmHandle(stream, &handle) != CUBLAS_STATUS_SUCCESS) {
    s = absl::FailedPreconditionError("cannot create a cuBLAS handle");
  }
  ms = s.ok() ? absl::StatusOr<float>(0.0f) : absl::StatusOr<float>(s);
  if (s.ok()) {
    ms = BestMs(stream, 5, [&]() -> absl::Status {
      const cublasStatus_t status =
          cuda::Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, 1.0f, a.get(), CUDA_R_16BF, n,
                     b.get(), CUDA_R_16BF, n, 0.0f, c.get(), CUDA_R_32F, n);
      if (status != CUBLAS_STATUS_SUCCESS) {
        return absl::InternalError(absl::StrCat("GEMM: cuBLAS status ", status));
      }
      return absl::OkStatus();
    });
  }
  cuda::DestroyGemmHandle(handle);
  cudaStreamDestroy(stream);
  if (!ms.ok()) return ms.status();
  limits.gemm_tflops = 2.0 * n * static_cast<double>(elements) / (*ms * 1e-3) / 1e12;
  limits.gemm_size = n;
  limits.copy_bytes = static_cast<int64_t>(bytes);
  return limits;
}

}  // namespace switchserve
