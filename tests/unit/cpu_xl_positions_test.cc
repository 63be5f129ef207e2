// The CPU backend's XL position tables (kernels/cpu/cpu_xl_positions.h): the
// tabulated position keys against the formula of docs/model-format.md
// evaluated here in float64, and the size check before anything is allocated.
#include "kernels/cpu/cpu_xl_positions.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using ::testing::HasSubstr;

// R_h[delta] = pos_to_pk_h . (dh^-1/4 pe(-delta)), written out in float64.
std::vector<double> PositionKey(const ModelConfig& config, const Tensor& pos_to_pk, int h,
                                int delta) {
  const int d = config.d_model, dh = config.attention.head_dim;
  std::vector<double> key(dh, 0.0);
  for (int c = 0; c < dh; ++c) {
    for (int m = 0; m < d / 2; ++m) {
      const double w = std::pow(10000.0, -2.0 * m / d);
      const float* row = pos_to_pk.f32() + static_cast<int64_t>(h * dh + c) * d;
      key[c] += std::pow(dh, -0.25) *
                (row[2 * m] * std::sin(-delta * w) + row[2 * m + 1] * std::cos(-delta * w));
    }
  }
  return key;
}

TEST(XlPositionTableTest, TabulatesThePositionKeys) {
  ModelConfig config = testing::XlSwitchAllConfig();  // H 3, dh 12, d 32
  config.max_seq_len = 300;                           // more than one tabulated block of 256
  const ModelWeights weights = testing::RandomWeights(config, 3);
  const int H = config.attention.n_heads, dh = config.attention.head_dim;
  absl::StatusOr<cpu::XlPositionTable> table =
      cpu::XlPositionTable::Create(config, weights, int64_t{1} << 30);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->max_positions(), 300);
  EXPECT_EQ(cpu::XlPositionTable::BytesFor(config), int64_t{2} * H * 300 * dh * 4);
  double max_error = 0, max_value = 0;
  for (int l = 0; l < config.n_layers; ++l) {
    for (int h = 0; h < H; ++h) {
      for (int delta : {0, 1, 2, 17, 255, 256, 257, 299}) {
        const std::vector<double> want =
            PositionKey(config, weights.layers[l].attn.pos_to_pk, h, delta);
        const float* got = table->Layer(l).At(h, delta);
        for (int c = 0; c < dh; ++c) {
          max_error = std::max(max_error, std::abs(got[c] - want[c]));
          max_value = std::max(max_value, std::abs(want[c]));
        }
      }
    }
  }
  EXPECT_LE(max_error / max_value, 1e-6);  // f32 rounding of float64 values
}

TEST(XlPositionTableTest, RopeModelsHaveNoTable) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  EXPECT_EQ(cpu::XlPositionTable::BytesFor(config), 0);
  absl::StatusOr<cpu::XlPositionTable> table =
      cpu::XlPositionTable::Create(config, testing::RandomWeights(config, 1), 0);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(table->empty());
  EXPECT_FALSE(table->Layer(0));
}

TEST(XlPositionTableTest, RefusesTablesOverTheLimit) {
  const ModelConfig config = testing::XlSingleExpertConfig();  // 2 layers, H 2, dh 20, 128
  const ModelWeights weights = testing::RandomWeights(config, 5);
  const int64_t bytes = cpu::XlPositionTable::BytesFor(config);
  ASSERT_EQ(bytes, int64_t{2} * 2 * 128 * 20 * 4);
  EXPECT_TRUE(cpu::XlPositionTable::Create(config, weights, bytes).ok());
  absl::StatusOr<cpu::XlPositionTable> table =
      cpu::XlPositionTable::Create(config, weights, bytes - 1);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(table.status().message(),
              HasSubstr("XL position table: n_layers 2 x n_heads 2 x max_seq_len 128 x head_dim "
                        "20 x 4 bytes = 40960 bytes, more than the 40959 bytes allowed"));

  // Through the backend options, and through CreateBackend with the default
  // limit (this host's memory) for a table no machine holds: refused before
  // anything is allocated.
  CpuBackendOptions options;
  options.max_position_table_bytes = bytes - 1;
  EXPECT_EQ(CreateCpuBackend(config, weights, config.dispatch, options).status().code(),
            absl::StatusCode::kResourceExhausted);
  ModelConfig huge = config;
  huge.max_seq_len = std::numeric_limits<int32_t>::max();
  huge.attention.n_heads = huge.attention.n_kv_heads = 64;
  huge.attention.head_dim = 64;  // 2 x 64 x (2^31 - 1) x 64 x 4 bytes: 64 TiB
  const ModelWeights huge_weights = testing::RandomWeights(huge, 5);
  auto backend = CreateBackend(DeviceKind::kCpu, huge, huge_weights, huge.dispatch);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(backend.status().message(), HasSubstr("max_seq_len 2147483647"));
  EXPECT_THAT(backend.status().message(), HasSubstr("host's memory"));

  // Factors whose product overflows int64.
  huge.n_layers = std::numeric_limits<int32_t>::max();
  huge.attention.head_dim = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(cpu::XlPositionTable::BytesFor(huge), -1);
  ModelWeights no_layers;
  EXPECT_THAT(cpu::XlPositionTable::Create(huge, no_layers, std::numeric_limits<int64_t>::max())
                  .status()
                  .message(),
              HasSubstr("more than 2^63 bytes"));
}

}  // namespace
}  // namespace switchserve
