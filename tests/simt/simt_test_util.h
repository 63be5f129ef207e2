// Helpers of the kernel tests (tests/simt), for both builds: on the SIMT
// executor (SWITCHSERVE_SIMT_EMULATION) and with nvcc on a GPU.
//
// InEveryOrder runs a test body once per thread order of the executor
// (forward, reverse, random) and expects the results to be bitwise equal; on
// a GPU it runs the body twice (two runs must agree bitwise).
#ifndef SWITCHSERVE_TESTS_SIMT_SIMT_TEST_UTIL_H_
#define SWITCHSERVE_TESTS_SIMT_SIMT_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace switchserve::simt_test {

#define ASSERT_CUDA(expr)                                        \
  do {                                                           \
    const cudaError_t simt_test_error = (expr);                  \
    ASSERT_EQ(simt_test_error, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(simt_test_error); \
  } while (0)

// Skips the test when the build runs on a GPU and none is usable here.
#define SIMT_REQUIRE_DEVICE()                           \
  do {                                                  \
    if (!::switchserve::simt_test::DeviceAvailable()) { \
      GTEST_SKIP() << "no usable CUDA device";          \
    }                                                   \
  } while (0)
bool DeviceAvailable();

// A device allocation of n elements of T, filled with 0xff bytes (NaN as
// float, -1 as int), as the executor's cudaMalloc leaves fresh memory: a test
// can then check on a GPU too that a kernel left padding untouched.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : size_(n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, n * sizeof(T)), cudaSuccess);
    data_ = static_cast<T*>(p);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  size_t size() const { return size_; }
  void Upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), size_);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // Synchronous: waits for the work queued before.
  std::vector<T> Download() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

// The raw bytes of test results (vectors, or tuples of vectors).
template <typename T>
void AppendBytes(const std::vector<T>& v, std::string* out) {
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
template <typename... T>
void AppendBytes(const std::tuple<T...>& t, std::string* out) {
  std::apply([&](const auto&... part) { (AppendBytes(part, out), ...); }, t);
}

// The orders a test runs under: "forward", "reverse", "random:SEED" on the
// executor (SEED from SWITCHSERVE_SIMT_ORDER=random:SEED when given); "device"
// twice on a GPU.
std::vector<std::string> TestOrders();
// Sets the executor's thread order for its lifetime (nothing on a GPU).
class ScopedOrder {
 public:
  explicit ScopedOrder(const std::string& order);
  ~ScopedOrder();
  ScopedOrder(const ScopedOrder&) = delete;
  ScopedOrder& operator=(const ScopedOrder&) = delete;

 private:
  std::string previous_;
};

// Runs `body` under every order; expects bitwise-equal results; returns the
// first order's.
template <typename Body>
auto InEveryOrder(Body&& body) -> decltype(body()) {
  using Result = decltype(body());
  Result first{};
  std::string first_bytes;
  const std::vector<std::string> orders = TestOrders();
  for (size_t i = 0; i < orders.size(); ++i) {
    ScopedOrder scoped(orders[i]);
    Result result = body();
    std::string bytes;
    AppendBytes(result, &bytes);
    if (i == 0) {
      first = std::move(result);
      first_bytes = std::move(bytes);
    } else {
      EXPECT_TRUE(bytes == first_bytes)
          << "results under thread order " << orders[i] << " differ from " << orders[0];
    }
  }
  return first;
}

// bf16 / f16 host conversions (round to nearest even).
std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& v);
std::vector<__half> ToHalf(const std::vector<float>& v);
std::vector<float> Widen(const std::vector<__nv_bfloat16>& v);
std::vector<float> Widen(const std::vector<__half>& v);

// Deterministic test data: uniform in [lo, hi).
std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

}  // namespace switchserve::simt_test

#endif  // SWITCHSERVE_TESTS_SIMT_SIMT_TEST_UTIL_H_
