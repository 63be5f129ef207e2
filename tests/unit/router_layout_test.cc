#include "engine/moe/router_layout.h"

#include "gtest/gtest.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

// Layer-major; per layer the value routers (one per KV head), the output
// routers (one per query head), then the FFN router.
TEST(RouterLayoutTest, OrderAndIndicesWithGroupedHeads) {
  const RouterLayout layout(testing::SwitchHeadGqaConfig());  // 2 layers, G = 2, H = 4, MoE FFN
  ASSERT_EQ(layout.size(), 2u * (2 + 4 + 1));
  EXPECT_EQ(layout.AttentionBase(0), 0);
  EXPECT_EQ(layout.FfnRouter(0), 6);
  EXPECT_EQ(layout.AttentionBase(1), 7);
  EXPECT_EQ(layout.FfnRouter(1), 13);
  EXPECT_EQ(layout.Find(1, MoeModule::kAttnV, 1), 8);
  EXPECT_EQ(layout.Find(1, MoeModule::kAttnO, 3), 12);
  EXPECT_EQ(layout.Find(0, MoeModule::kAttnV, 2), -1);  // only 2 KV heads
  for (size_t i = 0; i < layout.size(); ++i) {
    const RouterId& id = layout[i];
    EXPECT_EQ(layout.Find(id.layer, id.module, id.head), static_cast<int>(i));
  }
  EXPECT_EQ(layout[12].module, MoeModule::kAttnO);
  EXPECT_EQ(layout[12].head, 3);
  EXPECT_EQ(layout[13].module, MoeModule::kFfn);
}

TEST(RouterLayoutTest, ChoiceOffsetsFollowEachRoutersTopK) {
  // Attention k = 2 on 4 + 4 routers per layer, FFN k = 1.
  const RouterLayout layout(testing::SwitchHeadSoftmaxTopKConfig());
  ASSERT_EQ(layout.size(), 18u);
  EXPECT_EQ(layout.ChoiceOffset(0), 0);
  EXPECT_EQ(layout.ChoiceOffset(8), 16);  // layer 0's FFN router
  EXPECT_EQ(layout.ChoiceOffset(9), 17);  // layer 1's first value router
  EXPECT_EQ(layout.ChoiceOffset(17), 33);
  EXPECT_EQ(layout.choices_per_token(), 34);
}

TEST(RouterLayoutTest, SharedDenseAndUnroutedModels) {
  const RouterLayout shared(testing::SwitchHeadSharedRouterConfig());
  EXPECT_EQ(shared.size(), 2u * 3);
  EXPECT_EQ(shared.Find(0, MoeModule::kAttnO, 0), 1);
  EXPECT_EQ(shared.Find(0, MoeModule::kAttnO, 1), -1);

  const RouterLayout ffn_only(testing::DenseGqaConfig());  // dense attention, MoE FFN
  ASSERT_EQ(ffn_only.size(), 2u);
  EXPECT_EQ(ffn_only.FfnRouter(0), 0);
  EXPECT_EQ(ffn_only.FfnRouter(1), 1);
  EXPECT_EQ(ffn_only[1].layer, 1);

  const RouterLayout none(testing::SwitchHeadSingleExpertConfig());  // E = 1, dense FFN
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.choices_per_token(), 0);
}

}  // namespace
}  // namespace switchserve
