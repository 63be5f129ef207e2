#include "tests/simt/simt_test_util.h"

#include <cstdlib>
#include <random>

#if defined(SWITCHSERVE_SIMT_EMULATION)
#include "kernels/cuda/simt_control.h"
#endif

namespace switchserve::simt_test {

bool DeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#if defined(SWITCHSERVE_SIMT_EMULATION)

std::vector<std::string> TestOrders() {
  std::string random = "random:20261123";
  simt::ThreadOrder from_env;
  if (const char* text = std::getenv("SWITCHSERVE_SIMT_ORDER");
      text != nullptr && simt::ParseThreadOrder(text, &from_env) &&
      from_env.order == simt::Order::kRandom) {
    random = simt::ToString(from_env);
  }
  return {"forward", "reverse", random};
}

ScopedOrder::ScopedOrder(const std::string& order)
    : previous_(simt::ToString(simt::GetThreadOrder())) {
  simt::ThreadOrder parsed;
  EXPECT_TRUE(simt::ParseThreadOrder(order, &parsed)) << order;
  simt::SetThreadOrder(parsed);
}

ScopedOrder::~ScopedOrder() {
  simt::ThreadOrder parsed;
  if (simt::ParseThreadOrder(previous_, &parsed)) simt::SetThreadOrder(parsed);
}

#else  // a GPU: one order, run twice

std::vector<std::string> TestOrders() { return {"device", "device"}; }
ScopedOrder::ScopedOrder(const std::string& order) : previous_(order) {}
ScopedOrder::~ScopedOrder() = default;

#endif

std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}

std::vector<__half> ToHalf(const std::vector<float>& v) {
  std::vector<__half> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2half_rn(v[i]);
  return out;
}

std::vector<float> Widen(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

std::vector<float> Widen(const std::vector<__half>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __half2float(v[i]);
  return out;
}

std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

}  // namespace switchserve::simt_test
