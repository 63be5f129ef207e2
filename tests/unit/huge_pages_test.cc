// Weight tensors and the CPU backend's KV cache of 2 MiB or more on huge pages
// (engine/model/huge_pages.h).
#include "engine/model/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model_weights.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/util/huge_pages_probe.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::HugePageBytesOfMapping;
using testing::ThpMode;

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(HugePages, LargeTensorsStartOnAHugePageBoundary) {
  const size_t count = 3 * kHugePageBytes / sizeof(float) + 5;
  const Tensor f32 = Tensor::F32({static_cast<int64_t>(count)}, std::vector<float>(count, 1.5f));
  EXPECT_EQ(Address(f32.raw()) % kHugePageBytes, 0u);
  EXPECT_EQ(f32.f32()[count - 1], 1.5f);
  const Tensor half = f32.ConvertedTo(DType::kBF16);
  EXPECT_EQ(Address(half.raw()) % kHugePageBytes, 0u);
  EXPECT_EQ(half.At(static_cast<int64_t>(count) - 1), 1.5f);
  const Tensor widened = half.ConvertedTo(DType::kF32);
  EXPECT_EQ(Address(widened.raw()) % kHugePageBytes, 0u);
  EXPECT_EQ(widened.size(), static_cast<int64_t>(count));
  EXPECT_EQ(widened.f32()[0], 1.5f);
  EXPECT_EQ(widened.f32()[count - 1], 1.5f);
}

TEST(HugePages, LargeTensorsAreOnHugePagesWhereTheKernelAllowsThem) {
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

TEST(HugePages, CopiesAndMovesKeepTheValues) {
  const size_t count = kHugePageBytes / sizeof(uint16_t) + 3;
  Tensor a = Tensor::Half({static_cast<int64_t>(count)}, DType::kF16,
                          std::vector<uint16_t>(count, 0x3C00));  // 1.0
  const Tensor b = a;
  const Tensor c = std::move(a);
  EXPECT_EQ(b.At(static_cast<int64_t>(count) - 1), 1.0f);
  EXPECT_EQ(c.At(0), 1.0f);
  EXPECT_NE(b.raw(), c.raw());
}

TEST(HugePages, CpuKvCacheIsOnHugePagesWhereTheKernelAllowsThem) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = testing::RandomWeights(config, 1);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateCpuBackend(config, weights, config.dispatch);
  ASSERT_TRUE(backend.ok()) << backend.status();
  // Enough blocks for each layer's keys (f32, its smallest array) to span
  // eight huge pages.
  const int block_size = 16;
  const int64_t key_bytes_per_token =
      static_cast<int64_t>(config.attention.n_kv_heads) * config.attention.head_dim * 4;
  const int64_t blocks =
      8 * static_cast<int64_t>(kHugePageBytes) / key_bytes_per_token / block_size + 1;
  const int64_t cache_bytes = (*backend)->KvBytesPerToken() * blocks * block_size;
  const int64_t before = testing::ProcessHugePageBytes();
  ASSERT_TRUE((*backend)->InitKvCache(blocks, block_size).ok());
  const int64_t gained = testing::ProcessHugePageBytes() - before;
  const std::string mode = ThpMode();
  if (mode == "never") {
    EXPECT_EQ(gained, 0);
  } else {
    // Where memory is too fragmented for a huge page, the kernel falls back
    // to small ones: most of the cache, not all of it.
    EXPECT_GE(gained, cache_bytes / 2) << mode << ", cache of " << cache_bytes << " bytes";
  }
}

}  // namespace
}  // namespace switchserve
