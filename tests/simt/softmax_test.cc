// Row softmax kernel against a double-precision reference, on odd shapes with
// padded rows, in place and not, under every thread order.
#include "kernels/cuda/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

std::vector<double> Reference(const std::vector<float>& x, int rows, int n, int ld) {
  std::vector<double> y(x.size(), 0.0);
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + static_cast<size_t>(r) * ld;
    double max = row[0];
    for (int i = 1; i < n; ++i) max = std::max<double>(max, row[i]);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp(row[i] - max);
    for (int i = 0; i < n; ++i) y[static_cast<size_t>(r) * ld + i] = std::exp(row[i] - max) / sum;
  }
  return y;
}

bool IsPoison(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits == 0xffffffffu;
}

TEST(SimtSoftmax, MatchesADoubleReferenceOnOddPaddedShapes) {
  SIMT_REQUIRE_DEVICE();
  for (const int rows : {1, 7, 33, 257}) {
    for (const int n : {1, 7, 100, 257, 1000}) {
      for (const bool in_place : {false, true}) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                     (in_place ? " in place" : ""));
        const int ld = n + 3;
        std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * ld, rows * 131 + n, -8, 8);
        const std::vector<double> want = Reference(x, rows, n, ld);
        const std::vector<float> y = InEveryOrder([&] {
          DeviceArray<float> d_x(x), d_y(x.size());
          float* out = in_place ? d_x.get() : d_y.get();
          EXPECT_EQ(cuda::LaunchSoftmaxRows(d_x.get(), out, rows, n, ld, nullptr), cudaSuccess);
          return in_place ? d_x.Download() : d_y.Download();
        });
        for (int r = 0; r < rows; ++r) {
          for (int i = 0; i < ld; ++i) {
            const size_t at = static_cast<size_t>(r) * ld + i;
            if (i >= n) {  // padding: untouched
              if (in_place) {
                ASSERT_EQ(y[at], x[at]) << "row " << r << " column " << i;
              } else {
                ASSERT_TRUE(IsPoison(y[at])) << "row " << r << " column " << i;
              }
              continue;
            }
            ASSERT_NEAR(y[at], want[at], 1e-6 + 1e-5 * want[at]) << "row " << r << " column " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace switchserve::simt_test
