// What only the CPU backend promises: its name, f32 cache storage, errors
// before and at cache setup, and which rows carry routing. The Backend
// contract every backend keeps is checked in backend_test.cc.
#include "kernels/cpu/cpu_backend.h"

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/host_memory.h"
#include "engine/model/model_loader.h"
#include "engine/moe/router_layout.h"
#include "engine/runtime/kv_cache.h"
#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/cpu/cpu_xl_positions.h"
#include "kernels/cpu/one_row_weights.h"
#include "tests/util/backend_harness.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::RandomWeights;
using Harness = testing::BackendHarness;

TEST(CpuBackendTest, CacheSetupAndRoutingRows) {
  const ModelConfig config = testing::SwitchHeadDestinationConfig();
  const ModelWeights weights = RandomWeights(config, 3);
  absl::StatusOr<std::unique_ptr<Backend>> created =
      CreateCpuBackend(config, weights, config.dispatch);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Backend> backend = *std::move(created);
  EXPECT_EQ(backend->name(), "cpu");
  EXPECT_EQ(backend->KvBytesPerToken(), KvBytesPerToken(config, 4));
  const std::vector<int32_t> table = {0};
  StepBatch batch;
  batch.Clear(4);
  batch.Add(std::vector<int32_t>{1}, 0, table);
  StepOutput out;
  EXPECT_EQ(backend->Forward(batch, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend->InitKvCache(0, 4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(backend->InitKvCache(4, 4).ok());
  batch.Clear(4);
  ASSERT_TRUE(backend->Forward(batch, &out).ok());
  EXPECT_TRUE(out.logits.empty());

  // Only chunks that collect routing get a trace; one choice per router rank.
  const testing::BackendUnderTest cpu = {
      "cpu", [](const ModelConfig& c, const ModelWeights& w, const DispatchConfig& d) {
        return *CreateCpuBackend(c, w, d);
      }};
  Harness h(cpu, config, weights, config.dispatch);
  ASSERT_TRUE(
      h.Step({{1, {1, 2, 3}, 0, LogitsMode::kLast, false}, {2, {4, 5}, 0, LogitsMode::kAll, true}},
             &out)
          .ok());
  ASSERT_EQ(out.routing.size(), 3u);
  EXPECT_TRUE(out.routing[0].choices.empty());
  size_t per_token = 0;
  const RouterLayout layout(config);
  for (const RouterId& id : layout.routers()) per_token += id.top_k;
  EXPECT_EQ(out.routing[1].choices.size(), per_token);
  EXPECT_EQ(out.routing[2].choices.size(), per_token);
  EXPECT_EQ(out.row_position, (std::vector<int32_t>{2, 0, 1}));
}

// A model's context length sizes nothing by itself: the backend's scratch
// follows the positions a step uses, the cache is sized by KvCache.
TEST(CpuBackendTest, ContextLengthAllocatesNothingAtCreation) {
  ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = RandomWeights(config, 5);
  config.max_seq_len = std::numeric_limits<int32_t>::max();
  absl::StatusOr<std::unique_ptr<Backend>> created =
      CreateCpuBackend(config, weights, config.dispatch);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Backend> backend = *std::move(created);
  ASSERT_TRUE(backend->InitKvCache(2, 4).ok());
  const std::vector<int32_t> table = {0, 1};
  StepBatch batch;
  batch.Clear(4);
  batch.Add(std::vector<int32_t>{1, 2, 3, 4, 5}, 0, table).logits = LogitsMode::kLast;
  StepOutput out;
  ASSERT_TRUE(backend->Forward(batch, &out).ok());
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(config.vocab_size));
}

TEST(CpuBackendTest, KvCacheLargerThanTheHostIsRefused) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = RandomWeights(config, 5);
  absl::StatusOr<std::unique_ptr<Backend>> created =
      CreateCpuBackend(config, weights, config.dispatch);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Backend> backend = *std::move(created);
  const int64_t rows = HostMemoryBytes() / backend->KvBytesPerToken() + 1;
  const absl::Status status = backend->InitKvCache(rows, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("host's memory"), std::string::npos) << status;
}

// The KV cache must fit beside the weights and the XL position tables the
// backend holds: checked alone against the host, a cache that fits by itself
// but not beside a large model was zero-filled into the OOM killer. And in
// 90% of the host: a cache that filled the whole of a container's limit
// beside the model ended in the OOM killer at start-up.
TEST(CpuBackendTest, KvCacheMustFitBesideTheWeightsAndTables) {
  for (const ModelConfig& config : {testing::TinySwitchAllConfig(), testing::XlSwitchAllConfig()}) {
    SCOPED_TRACE(config.attention.position == PositionKind::kXl ? "xl" : "rope");
    const ModelWeights weights = RandomWeights(config, 5);
    const int64_t blocks = 4, block_size = 16;
    const int64_t kv = KvBytesPerToken(config, sizeof(float)) * blocks * block_size;
    const int64_t tables =
        config.attention.position == PositionKind::kXl ? cpu::XlPositionTable::BytesFor(config) : 0;
    const int64_t needed = weights.Bytes() + tables + kv;
    // HostMemoryBudget(host) >= needed holds from this many bytes on.
    int64_t room = needed;
    while (HostMemoryBudget(room) < needed) ++room;
    ASSERT_GT(room - 1, needed);  // the whole host would hold it
    for (const int64_t host : {room, room - 1}) {
      CpuBackendOptions options;
      options.num_threads = 1;
      options.one_row_weights = false;
      options.host_memory_bytes = host;
      absl::StatusOr<std::unique_ptr<Backend>> backend =
          CreateCpuBackend(config, weights, config.dispatch, options);
      ASSERT_TRUE(backend.ok()) << backend.status();
      const absl::Status status = (*backend)->InitKvCache(blocks, block_size);
      if (host == room) {
        EXPECT_TRUE(status.ok()) << status;
        continue;
      }
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_NE(status.message().find(absl::StrCat("beside the ", weights.Bytes() + tables)),
                std::string::npos)
          << status;
    }
  }
}

// And beside what the process holds when that is more than the weights and
// tables (its libraries, the runtime's buffers): in a 256 MiB container, a
// cache that fitted beside the weights alone took the server into the OOM
// killer at start-up.
TEST(CpuBackendTest, KvCacheMustFitBesideWhatTheProcessHolds) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = RandomWeights(config, 5);
  const int64_t blocks = 4, block_size = 16;
  const int64_t kv = KvBytesPerToken(config, sizeof(float)) * blocks * block_size;
  const int64_t host = 10 * (weights.Bytes() + kv);  // room for both, many times over
  for (const int64_t resident :
       {int64_t{0}, HostMemoryBudget(host) - kv, HostMemoryBudget(host) - kv + 1}) {
    CpuBackendOptions options;
    options.num_threads = 1;
    options.one_row_weights = false;
    options.host_memory_bytes = host;
    options.resident_bytes = resident;
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        CreateCpuBackend(config, weights, config.dispatch, options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    const absl::Status status = (*backend)->InitKvCache(blocks, block_size);
    if (resident <= HostMemoryBudget(host) - kv) {
      EXPECT_TRUE(status.ok()) << resident << ": " << status;
      continue;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_NE(
        status.message().find(absl::StrCat("beside the ", resident, " bytes the process holds")),
        std::string::npos)
        << status;
  }
}

// The models whose weights the CPU backend reads differently: routed, dense
// and single-expert attention; XL positions; d = 512, whose routed output
// experts fill eight column panels each.
std::vector<ModelConfig> WeightLayoutConfigs() {
  ModelConfig wide = testing::TinySwitchAllConfig();
  wide.d_model = 512;
  return {testing::TinySwitchAllConfig(), testing::DenseMhaConfig(),
          testing::SwitchHeadSingleExpertConfig(), testing::XlSwitchAllConfig(), wide};
}

// The logits of `tokens` as one sequence: its first `prompt` tokens as a
// prompt (products of many rows), then decoded token by token (one-row
// products), all of them concatenated.
std::vector<float> PromptThenDecodeLogits(const ModelConfig& config, const ModelWeights& weights,
                                          CpuBackendOptions options,
                                          const std::vector<int32_t>& tokens, int prompt) {
  options.num_threads = 2;
  options.parallel_matmul_min_macs = 0;
  const testing::BackendUnderTest cpu = {
      "cpu", [options](const ModelConfig& c, const ModelWeights& w, const DispatchConfig& d) {
        return *CreateCpuBackend(c, w, d, options);
      }};
  Harness h(cpu, config, weights, config.dispatch);
  StepOutput out;
  std::vector<float> logits;
  if (!h.Step({{1, std::vector<int32_t>(tokens.begin(), tokens.begin() + prompt), 0}}, &out).ok()) {
    return logits;
  }
  logits = out.logits;
  for (int p = prompt; p < static_cast<int>(tokens.size()); ++p) {
    if (!h.Step({{1, {tokens[p] % config.vocab_size}, p}}, &out).ok()) return {};
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  }
  return logits;
}

// The logits of `tokens` (the first `prompt` of them as the prompt) under
// options `a` and under `b` are the same bits, for every model of
// WeightLayoutConfigs and every weight dtype.
void ExpectSameLogits(const CpuBackendOptions& a, const CpuBackendOptions& b,
                      const std::vector<int32_t>& tokens, int prompt, uint64_t seed) {
  for (const ModelConfig& config : WeightLayoutConfigs()) {
    for (WeightsDtype dtype : {WeightsDtype::kF32, WeightsDtype::kBF16, WeightsDtype::kF16}) {
      SCOPED_TRACE(::testing::Message() << config.attention.n_heads << " heads, d "
                                        << config.d_model << ", " << ToString(dtype));
      const ModelWeights weights = ConvertWeights(config, RandomWeights(config, seed), dtype);
      const std::vector<float> under_a = PromptThenDecodeLogits(config, weights, a, tokens, prompt);
      const std::vector<float> under_b = PromptThenDecodeLogits(config, weights, b, tokens, prompt);
      ASSERT_EQ(under_a.size(), tokens.size() * config.vocab_size);
      ASSERT_EQ(under_b.size(), under_a.size());
      EXPECT_EQ(0, std::memcmp(under_a.data(), under_b.data(), under_a.size() * sizeof(float)));
    }
  }
}

// Products of one row read tiled copies of the weights
// (CpuBackendOptions::one_row_weights), the rest the tensors as stored: the
// same bits. A sequence decoded token by token after its prompt gets the
// logits it gets without the copies, on the default build and the portable
// one, for every weight dtype and the architectures whose weights differ
// (routed, dense and single-expert attention; XL positions; d = 512, whose
// routed output experts fill eight column panels each).
TEST(CpuBackendTest, OneRowWeightsChangeNoBits) {
  const std::vector<int32_t> tokens = testing::RandomTokens(12, 64, 3);
  for (bool generic : {false, true}) {
    SCOPED_TRACE(generic ? "generic" : "default build");
    CpuBackendOptions without, with;
    without.one_row_weights = false;
    with.one_row_weights = true;
    if (generic) without.kernel_isa = with.kernel_isa = cpu::KernelIsa::kGeneric;
    ExpectSameLogits(without, with, tokens, 4, 9);
  }
}

// CpuBackendOptions::kernel_isa (the server's --cpu-kernels) picks the build
// of the kernels, which the backend reports; without it the fastest this CPU
// runs; a build this CPU cannot run is refused, by name. BackendOptions'
// cpu_kernels reaches it.
TEST(CpuBackendTest, KernelIsaOptionPicksTheBuildAndRefusesOneTheCpuLacks) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = RandomWeights(config, 3);
  absl::StatusOr<std::unique_ptr<Backend>> best =
      CreateCpuBackend(config, weights, config.dispatch);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ((*best)->kernels(), cpu::ToString(cpu::BestKernelIsa()));
  for (cpu::KernelIsa isa : cpu::kAllKernelIsas) {
    SCOPED_TRACE(cpu::ToString(isa));
    CpuBackendOptions options;
    options.kernel_isa = isa;
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        CreateCpuBackend(config, weights, config.dispatch, options);
    if (cpu::CpuSupports(isa)) {
      ASSERT_TRUE(backend.ok()) << backend.status();
      EXPECT_EQ((*backend)->kernels(), cpu::ToString(isa));
    } else {
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(backend.status().message().find(std::string(cpu::ToString(isa))), std::string::npos)
          << backend.status();
    }
  }
  absl::StatusOr<std::unique_ptr<Backend>> generic =
      CreateBackend(DeviceKind::kCpu, config, weights, config.dispatch,
                    BackendOptions{.num_threads = 1, .cpu_kernels = cpu::KernelIsa::kGeneric});
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_EQ((*generic)->kernels(), "generic");
}

// The AVX2 and AVX-512 builds compute the same operations in the same order
// (matmul.h), so a backend on either gives the same logits, bit for bit: a
// fleet whose CPUs differ serves the same tokens. A 40-token prompt takes
// the products of many rows through their register tiles. Needs a CPU that
// runs both builds.
TEST(CpuBackendTest, Avx2AndAvx512BuildsGiveTheSameLogits) {
  if (!cpu::CpuSupports(cpu::KernelIsa::kAvx512)) {
    GTEST_SKIP() << "this CPU has no AVX-512: nothing to compare the AVX2 build with";
  }
  const std::vector<int32_t> tokens = testing::RandomTokens(48, 64, 4);
  for (bool one_row : {false, true}) {
    SCOPED_TRACE(one_row ? "one-row copies" : "weights as stored");
    CpuBackendOptions avx2, avx512;
    avx2.one_row_weights = avx512.one_row_weights = one_row;
    avx2.kernel_isa = cpu::KernelIsa::kAvx2;
    avx512.kernel_isa = cpu::KernelIsa::kAvx512;
    ExpectSameLogits(avx2, avx512, tokens, 40, 11);
  }
}

// Rows-in matrices whose rows the kernels read whole at one row
// (MatmulKernels::one_row_whole_in_columns: the value experts' short rows)
// get no copy, whose column panels would only pad them; longer rows-in rows
// (the output experts' at d = 512, f32) still get one.
TEST(CpuBackendTest, OneRowWeightsLeaveOutRowsInMatricesTheKernelsReadWhole) {
  ModelConfig config = testing::TinySwitchAllConfig();
  config.d_model = 512;
  const ModelWeights weights = ConvertWeights(config, RandomWeights(config, 9), WeightsDtype::kF32);
  const int dh = config.attention.head_dim;
  int64_t value_copies = 0;
  for (const LayerWeights& layer : weights.layers) {
    value_copies += cpu::TiledWeights::BytesFor(layer.attn.v, cpu::Tiling::kColumnPanels);
  }
  ASSERT_GT(value_copies, 0);
  cpu::MatmulKernels kernels = cpu::KernelsFor(cpu::KernelIsa::kGeneric);
  kernels.one_row_whole_in_columns = dh - 1;
  const int64_t all = cpu::OneRowWeights::BytesFor(config, weights, kernels);
  kernels.one_row_whole_in_columns = dh;
  const int64_t without_values = cpu::OneRowWeights::BytesFor(config, weights, kernels);
  EXPECT_EQ(all - without_values, value_copies);
  const cpu::OneRowWeights copies(config, weights, kernels);
  EXPECT_EQ(copies.bytes(), without_values);
  const AttentionWeights& attn = weights.layers[0].attn;
  EXPECT_EQ(copies.Matrix(attn.v, dh, 0, 1).tiling, cpu::Tiling::kNone);
  EXPECT_EQ(copies.Matrix(attn.o, config.d_model, 0, 1).tiling, cpu::Tiling::kColumnPanels);
  kernels.one_row_whole_in_columns = config.d_model;
  EXPECT_EQ(cpu::OneRowWeights::BytesFor(config, weights, kernels), without_values);
}

// BackendOptions::cpu_weight_copies (the server's --cpu-weight-copies) reaches
// the CPU backend: with it, the backend holds the tiled copies once its KV
// cache is set up and reports their bytes, the figure its memory check
// counted beforehand (OneRowWeights::BytesFor), for every architecture;
// without, none.
TEST(CpuBackendTest, WeightCopiesFollowTheBackendOptionAndAreCounted) {
  for (const testing::NamedConfig& named : testing::AllVariantConfigs()) {
    SCOPED_TRACE(named.name);
    const ModelConfig& config = named.config;
    const ModelWeights weights =
        ConvertWeights(config, RandomWeights(config, 5), WeightsDtype::kBF16);
    const int64_t copies =
        cpu::OneRowWeights::BytesFor(config, weights, cpu::KernelsFor(cpu::BestKernelIsa()));
    ASSERT_GT(copies, 0);
    for (bool on : {true, false}) {
      auto backend = CreateBackend(DeviceKind::kCpu, config, weights, config.dispatch,
                                   BackendOptions{.num_threads = 1, .cpu_weight_copies = on});
      ASSERT_TRUE(backend.ok()) << backend.status();
      ASSERT_TRUE((*backend)->InitKvCache(4, 16).ok());
      EXPECT_EQ((*backend)->weight_copies().bytes, on ? copies : 0) << on;
      EXPECT_EQ((*backend)->weight_copies().skipped_bytes, 0) << on;
    }
  }
}

// The copies are made only where the weights, the KV cache, the position
// tables and the copies fit in 90% of the host's memory; a model that fits
// without them starts without them and says how much it left out.
TEST(CpuBackendTest, WeightCopiesAreLeftOutWhereTheHostHasNoRoom) {
  for (const ModelConfig& config : {testing::TinySwitchAllConfig(), testing::XlSwitchAllConfig()}) {
    SCOPED_TRACE(config.attention.position == PositionKind::kXl ? "xl" : "rope");
    const ModelWeights weights =
        ConvertWeights(config, RandomWeights(config, 5), WeightsDtype::kBF16);
    const int64_t copies =
        cpu::OneRowWeights::BytesFor(config, weights, cpu::KernelsFor(cpu::BestKernelIsa()));
    const int64_t blocks = 4, block_size = 16;
    const int64_t kv = KvBytesPerToken(config, sizeof(float)) * blocks * block_size;
    const int64_t tables =
        config.attention.position == PositionKind::kXl ? cpu::XlPositionTable::BytesFor(config) : 0;
    const int64_t needed = weights.Bytes() + kv + tables + copies;
    // HostMemoryBudget(host) >= needed holds from this many bytes on, and
    // not below.
    int64_t room = needed * 10 / 9;
    while (HostMemoryBudget(room) < needed) ++room;
    while (HostMemoryBudget(room - 1) >= needed) --room;
    EXPECT_EQ(HostMemoryBudget(room), room - room / 10);
    for (int64_t host : {room, room - 1}) {
      CpuBackendOptions options;
      options.num_threads = 1;
      options.host_memory_bytes = host;
      absl::StatusOr<std::unique_ptr<Backend>> backend =
          CreateCpuBackend(config, weights, config.dispatch, options);
      ASSERT_TRUE(backend.ok()) << backend.status();
      ASSERT_TRUE((*backend)->InitKvCache(blocks, block_size).ok());
      const WeightCopies held = (*backend)->weight_copies();
      EXPECT_EQ(held.bytes, host == room ? copies : 0) << host;
      EXPECT_EQ(held.skipped_bytes, host == room ? 0 : copies) << host;
      EXPECT_EQ(held.budget_bytes, HostMemoryBudget(host)) << host;
    }
  }
}

}  // namespace
}  // namespace switchserve
