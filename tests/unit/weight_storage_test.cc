// Weight tensors of 2 MiB or more on huge pages (engine/model/weight_storage.h).
#include "engine/model/weight_storage.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/model_weights.h"

namespace switchserve {
namespace {

// The kernel's THP mode: the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled ("never" where it is absent).
std::string ThpMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "never";
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos ? "never" : line.substr(open + 1, close - open - 1);
}

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(WeightStorage, LargeTensorsStartOnAHugePageBoundary) {
  const size_t count = 3 * kHugePageBytes / sizeof(float) + 5;
  const Tensor f32 = Tensor::F32({static_cast<int64_t>(count)}, std::vector<float>(count, 1.5f));
  EXPECT_EQ(Address(f32.raw()) % kHugePageBytes, 0u);
  EXPECT_EQ(f32.f32()[count - 1], 1.5f);
  const Tensor half = f32.ConvertedTo(DType::kBF16);
  EXPECT_EQ(Address(half.raw()) % kHugePageBytes, 0u);
  EXPECT_EQ(half.At(static_cast<int64_t>(count) - 1), 1.5f);
}

TEST(WeightStorage, LargeTensorsAreOnHugePagesWhereTheKernelAllowsThem) {
  const size_t count = 4 * kHugePageBytes / sizeof(float);
  const Tensor t = Tensor::F32({static_cast<int64_t>(count)}, std::vector<float>(count, 2.0f));
  const std::string mode = ThpMode();
  if (mode == "never") {
    EXPECT_EQ(HugePageBytesOfMapping(t.raw()), 0);
  } else {
    // madvise or always: the advice came before the first touch.
    EXPECT_GE(HugePageBytesOfMapping(t.raw()), static_cast<int64_t>(kHugePageBytes)) << mode;
  }
}

TEST(WeightStorage, CopiesAndMovesKeepTheValues) {
  const size_t count = kHugePageBytes / sizeof(uint16_t) + 3;
  Tensor a = Tensor::Half({static_cast<int64_t>(count)}, DType::kF16,
                          std::vector<uint16_t>(count, 0x3C00));  // 1.0
  const Tensor b = a;
  const Tensor c = std::move(a);
  EXPECT_EQ(b.At(static_cast<int64_t>(count) - 1), 1.0f);
  EXPECT_EQ(c.At(0), 1.0f);
  EXPECT_NE(b.raw(), c.raw());
}

}  // namespace
}  // namespace switchserve
