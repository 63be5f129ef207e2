// The naive float64 reference (tests/util/naive_reference.h), which the
// backends are checked against on random models, is itself checked against
// the Python reference's goldens: every sequence of every dropless golden
// variant (RoPE and XL positions, output bias), computed alone, float64
// against float64 with the logits stored as f32 (measured: the same f32
// values, relative error 0).
#include "tests/util/naive_reference.h"

#include <string>
#include <vector>

#include "engine/model/model_loader.h"
#include "gtest/gtest.h"
#include "tests/util/backend_harness.h"
#include "tests/util/golden.h"

namespace switchserve {
namespace {

class NaiveReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NaiveReferenceTest, MatchesGoldenLogits) {
  absl::StatusOr<testing::GoldenCase> golden = testing::LoadGolden(GetParam());
  ASSERT_TRUE(golden.ok()) << golden.status();
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(golden->model_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& config = (*model)->config;
  ASSERT_TRUE(config.dispatch.Dropless());
  size_t row = 0;
  for (const std::vector<int32_t>& tokens : golden->sequences) {
    const std::vector<float> want(
        golden->logits.begin() + row * config.vocab_size,
        golden->logits.begin() + (row + tokens.size()) * config.vocab_size);
    const double error =
        testing::RelError(testing::NaiveLogits(config, (*model)->weights, tokens), want);
    EXPECT_LE(error, 1e-6) << "sequence at row " << row;
    row += tokens.size();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Goldens, NaiveReferenceTest,
    ::testing::ValuesIn(testing::ListGoldenVariants(testing::GoldenFilter::kDropless)),
    [](const ::testing::TestParamInfo<std::string>& variant) { return variant.param; });

}  // namespace
}  // namespace switchserve
