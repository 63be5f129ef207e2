// main() of the GPU suite (label cuda_gpu): the per-backend suites and the
// CUDA backend's own tests built against the GPU flavour. Without a usable
// device every test is skipped (ctest reports them SKIPPED, with the reason),
// never passed.
#include <cuda_runtime_api.h>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"

namespace {

class RequireDevice : public ::testing::Environment {
 public:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "the GPU suite needs a CUDA device: " << switchserve::DescribeCudaDevices();
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new RequireDevice);
  return RUN_ALL_TESTS();
}
