#include "engine/model/model_loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/random_model.h"
#include "tests/util/test_util.h"

namespace switchserve {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// SwitchAll, layernorm, tied, byte tokenizer. attn.v is [G*E, d, dh] = [16, 32, 8].
Json BaseConfig() {
  return Json::parse(R"({
    "format_version": 1, "name": "tiny", "vocab_size": 260, "d_model": 32, "n_layers": 2,
    "max_seq_len": 64, "norm": "layernorm", "tokenizer": "byte", "eos_token_id": 256,
    "attention": {"type": "switchhead", "n_heads": 4, "head_dim": 8, "n_experts": 4, "top_k": 2},
    "ffn": {"type": "moe", "d_ff": 16, "n_experts": 3, "top_k": 2, "activation": "gelu"}
  })");
}

ModelConfig ParseOrDie(const Json& json) {
  auto config = ParseModelConfig(json.dump(), "config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig();
}

// The config variants exercised by the round trip.
std::vector<std::pair<std::string, Json>> Variants() {
  std::vector<std::pair<std::string, Json>> variants;
  variants.emplace_back("switchall", BaseConfig());
  Json gqa = BaseConfig();
  gqa["norm"] = "rmsnorm";
  gqa["tie_embeddings"] = false;
  gqa["attention"]["n_kv_heads"] = 2;
  gqa["attention"]["shared_router"] = true;
  gqa["attention"]["value_routing"] = "destination";
  gqa["ffn"] = {{"type", "dense"}, {"d_ff", 24}, {"bias", false}};
  variants.emplace_back("gqa_shared_router_dense_ffn", gqa);
  Json dense = BaseConfig();
  dense["attention"] = {{"type", "dense"}, {"n_heads", 2}, {"n_kv_heads", 1}, {"head_dim", 16}};
  dense["ffn"]["router_bias"] = true;
  dense["ffn"]["bias"] = false;
  variants.emplace_back("dense_attention_moe_router_bias", dense);
  Json one_expert = BaseConfig();
  one_expert["attention"]["n_experts"] = 1;
  one_expert["attention"]["top_k"] = 1;
  one_expert["n_layers"] = 1;
  variants.emplace_back("switchhead_one_expert", one_expert);
  Json spm = BaseConfig();
  spm["tokenizer"] = "sentencepiece";
  spm["vocab_size"] = 320;
  spm["bos_token_id"] = 1;
  spm["eos_token_id"] = 2;
  variants.emplace_back("sentencepiece", spm);
  Json xl = BaseConfig();
  xl["attention"]["position"] = "xl";
  xl["attention"]["head_dim"] = 6;
  xl["output_bias"] = true;
  variants.emplace_back("xl_output_bias_tied", xl);
  Json xl_dense = dense;
  xl_dense["attention"]["position"] = "xl";
  xl_dense["tie_embeddings"] = false;
  xl_dense["output_bias"] = true;
  variants.emplace_back("xl_dense_output_bias_untied", xl_dense);
  return variants;
}

void CopySentencePieceModel(const std::string& dir) {
  std::filesystem::copy_file(testing::SourcePath("tests/data/spm/tokenizer.model"),
                             dir + "/tokenizer.model",
                             std::filesystem::copy_options::overwrite_existing);
}

float Narrowed(float x, DType dtype) {
  if (dtype == DType::kF16) return HalfToFloat(FloatToHalf(x));
  if (dtype == DType::kBF16) return BFloat16ToFloat(FloatToBFloat16(x));
  return x;
}

TEST(ModelLoaderTest, WrittenModelsLoadBackIdentical) {
  for (const auto& [variant, json] : Variants()) {
    SCOPED_TRACE(variant);
    const ModelConfig config = ParseOrDie(json);
    const ModelWeights weights = testing::RandomWeights(config, 7);
    ASSERT_TRUE(ValidateWeights(config, weights).ok()) << ValidateWeights(config, weights);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(ToString(dtype)));
      const std::string dir = testing::MakeTempDir("loader_" + variant);
      ASSERT_TRUE(WriteModelDirectory(dir, config, weights, dtype).ok());
      if (config.tokenizer == TokenizerKind::kSentencePiece) CopySentencePieceModel(dir);
      auto model = LoadModel(dir);
      ASSERT_TRUE(model.ok()) << model.status();
      EXPECT_EQ((*model)->directory, dir);
      EXPECT_EQ(ModelConfigToJson((*model)->config), ModelConfigToJson(config));
      EXPECT_EQ((*model)->config.eos_token_id, config.eos_token_id);
      EXPECT_TRUE(ValidateWeights(config, (*model)->weights).ok());
      EXPECT_EQ((*model)->weights.ParameterCount(), weights.ParameterCount());
      for (const ExpectedTensor& e : ExpectedTensors(config)) {
        const Tensor& original = e.In(weights);
        const Tensor& loaded = e.In((*model)->weights);
        ASSERT_EQ(loaded.shape(), original.shape()) << e.name;
        ASSERT_EQ(loaded.size(), original.size()) << e.name;
        // Held as stored, except norms, biases and routers: widened to f32.
        EXPECT_EQ(loaded.dtype(), e.held_in_f32 ? DType::kF32 : dtype) << e.name;
        for (int64_t i = 0; i < original.size(); ++i) {
          ASSERT_EQ(loaded.At(i), Narrowed(original.At(i), dtype)) << e.name << "[" << i << "]";
        }
      }
      ASSERT_NE((*model)->tokenizer, nullptr);
      EXPECT_EQ((*model)->tokenizer->kind(),
                config.tokenizer == TokenizerKind::kByte ? "byte" : "sentencepiece");
    }
  }
}

// --weights-dtype: matrices converted at load (or kept as stored), norms,
// biases and routers always f32.
TEST(ModelLoaderTest, WeightsDtypeConvertsMatricesOnly) {
  const ModelConfig config = ParseOrDie(BaseConfig());
  const ModelWeights weights = testing::RandomWeights(config, 7);
  for (DType stored : {DType::kF32, DType::kBF16}) {
    const std::string dir = testing::MakeTempDir("loader_dtype");
    ASSERT_TRUE(WriteModelDirectory(dir, config, weights, stored).ok());
    for (WeightsDtype held :
         {WeightsDtype::kAsStored, WeightsDtype::kF32, WeightsDtype::kBF16, WeightsDtype::kF16}) {
      SCOPED_TRACE(std::string(ToString(stored)) + " file held as " + std::string(ToString(held)));
      ModelLoadOptions options;
      options.weights_dtype = held;
      auto model = LoadModel(dir, options);
      ASSERT_TRUE(model.ok()) << model.status();
      ASSERT_TRUE(ValidateWeights(config, (*model)->weights).ok());
      const DType matrix_dtype = held == WeightsDtype::kAsStored ? stored
                                 : held == WeightsDtype::kF32    ? DType::kF32
                                 : held == WeightsDtype::kBF16   ? DType::kBF16
                                                                 : DType::kF16;
      int matrices = 0;
      for (const ExpectedTensor& e : ExpectedTensors(config)) {
        const Tensor& loaded = e.In((*model)->weights);
        const DType want = e.held_in_f32 ? DType::kF32 : matrix_dtype;
        matrices += e.held_in_f32 ? 0 : 1;
        ASSERT_EQ(loaded.dtype(), want) << e.name;
        const Tensor& original = e.In(weights);
        for (int64_t i = 0; i < original.size(); i += 7) {
          const float in_file = Narrowed(original.At(i), stored);
          const float want_value = e.held_in_f32 ? in_file : Narrowed(in_file, want);
          ASSERT_EQ(loaded.At(i), want_value) << e.name << "[" << i << "]";
        }
      }
      EXPECT_GT(matrices, 0);
      EXPECT_EQ((*model)->weights.layers[0].ffn.router_w.dtype(), DType::kF32);
      EXPECT_EQ((*model)->weights.layers[0].attn.sel_v.dtype(), DType::kF32);
    }
  }
}

TEST(ModelLoaderTest, WeightsDtypeNamesParseBack) {
  for (WeightsDtype dtype :
       {WeightsDtype::kAsStored, WeightsDtype::kF32, WeightsDtype::kBF16, WeightsDtype::kF16}) {
    EXPECT_EQ(*ParseWeightsDtype(ToString(dtype)), dtype);
  }
  const absl::StatusOr<WeightsDtype> bad = ParseWeightsDtype("fp32");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("expected auto, f32, bf16 or f16"));
}

TEST(ModelLoaderTest, ExpectedTensorsFollowTheFormatTable) {
  const ModelConfig config = ParseOrDie(BaseConfig());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ExpectedTensor& e : ExpectedTensors(config)) shapes[e.name] = e.shape;
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(shapes["embedding.weight"], (Shape{260, 32}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);
  EXPECT_EQ(shapes["final_norm.bias"], (Shape{32}));
  EXPECT_EQ(shapes["layers.1.attn.q.weight"], (Shape{32, 32}));
  EXPECT_EQ(shapes["layers.1.attn.v"], (Shape{16, 32, 8}));
  EXPECT_EQ(shapes["layers.1.attn.o"], (Shape{16, 8, 32}));
  EXPECT_EQ(shapes["layers.1.attn.sel_v"], (Shape{16, 32}));
  EXPECT_EQ(shapes["layers.0.ffn.router.weight"], (Shape{3, 32}));
  EXPECT_EQ(shapes["layers.0.ffn.w1"], (Shape{3, 16, 32}));
  EXPECT_EQ(shapes["layers.0.ffn.b2"], (Shape{3, 32}));
  EXPECT_EQ(shapes.count("layers.0.ffn.router.bias"), 0u);
  EXPECT_EQ(shapes.size(), 3u + 2 * 15u);  // no lm_head; 15 per layer

  Json gqa = BaseConfig();
  gqa["attention"]["n_kv_heads"] = 2;
  gqa["attention"]["shared_router"] = true;
  shapes.clear();
  for (const ExpectedTensor& e : ExpectedTensors(ParseOrDie(gqa))) shapes[e.name] = e.shape;
  EXPECT_EQ(shapes["layers.0.attn.k.weight"], (Shape{16, 32}));
  EXPECT_EQ(shapes["layers.0.attn.v"], (Shape{8, 32, 8}));
  EXPECT_EQ(shapes["layers.0.attn.sel_v"], (Shape{4, 32}));
  EXPECT_EQ(shapes["layers.0.attn.sel_o"], (Shape{4, 32}));

  Json one = BaseConfig();
  one["attention"]["n_experts"] = 1;
  one["attention"]["top_k"] = 1;
  shapes.clear();
  for (const ExpectedTensor& e : ExpectedTensors(ParseOrDie(one))) shapes[e.name] = e.shape;
  EXPECT_EQ(shapes["layers.0.attn.v"], (Shape{32, 32}));
  EXPECT_EQ(shapes["layers.0.attn.o"], (Shape{32, 32}));
  EXPECT_EQ(shapes["layers.0.attn.sel_o"], (Shape{4, 32}));
  EXPECT_EQ(shapes.count("layers.0.attn.sel_v"), 0u);
  EXPECT_EQ(shapes.count("layers.0.attn.pos_to_pk"), 0u);  // RoPE

  // XL: pos_to_pk per query head (GQA too); lm_head.bias with a tied head.
  Json xl = BaseConfig();
  xl["attention"]["position"] = "xl";
  xl["attention"]["n_kv_heads"] = 2;
  xl["attention"]["head_dim"] = 6;
  xl["output_bias"] = true;
  shapes.clear();
  for (const ExpectedTensor& e : ExpectedTensors(ParseOrDie(xl))) shapes[e.name] = e.shape;
  EXPECT_EQ(shapes["layers.0.attn.pos_to_pk"], (Shape{24, 32}));
  EXPECT_EQ(shapes["layers.1.attn.pos_to_pk"], (Shape{24, 32}));
  EXPECT_EQ(shapes["layers.1.attn.k.weight"], (Shape{12, 32}));
  EXPECT_EQ(shapes["lm_head.bias"], (Shape{260}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);
  EXPECT_EQ(shapes.size(), 4u + 2 * 16u);  // + lm_head.bias; + pos_to_pk per layer
}

// A valid model directory, plus helpers to rewrite its safetensors file.
class BrokenModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = ParseOrDie(BaseConfig());
    weights_ = testing::RandomWeights(config_, 3);
    dir_ = testing::MakeTempDir("loader_broken");
    ASSERT_TRUE(WriteModelDirectory(dir_, config_, weights_, DType::kF32).ok());
    ASSERT_TRUE(LoadModel(dir_).ok());
  }

  std::vector<TensorToWrite> Tensors() const {
    std::vector<TensorToWrite> tensors;
    for (const ExpectedTensor& e : ExpectedTensors(config_)) {
      tensors.push_back({e.name, e.shape, e.In(weights_).f32(), DType::kF32});
    }
    return tensors;
  }

  std::string Safetensors() const { return dir_ + "/model.safetensors"; }

  void Rewrite(const std::vector<TensorToWrite>& tensors) {
    ASSERT_TRUE(WriteSafetensors(Safetensors(), tensors).ok());
  }

  std::string LoadError() {
    auto model = LoadModel(dir_);
    EXPECT_FALSE(model.ok());
    return model.ok() ? "" : std::string(model.status().message());
  }

  ModelConfig config_;
  ModelWeights weights_;
  std::string dir_;
};

TEST_F(BrokenModelTest, MissingTensor) {
  std::vector<TensorToWrite> tensors = Tensors();
  std::erase_if(tensors, [](const TensorToWrite& t) { return t.name == "layers.1.ffn.b1"; });
  Rewrite(tensors);
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: missing tensor layers.1.ffn.b1 "
                                     "(expected shape [3, 16])"));
}

TEST_F(BrokenModelTest, MisspeltTensorIsNamedTwice) {
  std::vector<TensorToWrite> tensors = Tensors();
  for (TensorToWrite& t : tensors) {
    if (t.name == "layers.0.attn.sel_o") t.name = "layers.0.attn.sel_out";
  }
  Rewrite(tensors);
  const std::string message = LoadError();
  EXPECT_THAT(message, HasSubstr("missing tensor layers.0.attn.sel_o (expected shape [16, 32])"));
  EXPECT_THAT(message, HasSubstr("unexpected tensor layers.0.attn.sel_out [16, 32]"));
}

TEST_F(BrokenModelTest, ExtraTensor) {
  std::vector<TensorToWrite> tensors = Tensors();
  const float bias[260] = {};
  tensors.push_back({"lm_head.bias", {260}, bias, DType::kF32});
  Rewrite(tensors);
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: unexpected tensor lm_head.bias [260]"));
  // A tensor that only another config calls for is just as unexpected.
  tensors.pop_back();
  tensors.push_back({"lm_head.weight", {260, 32}, weights_.embedding.f32(), DType::kF32});
  Rewrite(tensors);
  EXPECT_THAT(LoadError(), HasSubstr("unexpected tensor lm_head.weight [260, 32]"));
}

TEST_F(BrokenModelTest, WrongShape) {
  std::vector<TensorToWrite> tensors = Tensors();
  for (TensorToWrite& t : tensors) {
    if (t.name == "layers.0.attn.v") t.shape = {16, 8, 32};  // same size, dims swapped
  }
  Rewrite(tensors);
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: tensor layers.0.attn.v: expected shape "
                                     "[16, 32, 8], found [16, 8, 32]"));
}

TEST_F(BrokenModelTest, WrongDtype) {
  // WriteSafetensors only writes floats, so build the file by hand, with
  // layers.0.ffn.router.weight stored as I32 (same byte size as F32).
  Json header = Json::object();
  std::vector<char> data;
  for (const TensorToWrite& t : Tensors()) {
    const bool make_int = t.name == "layers.0.ffn.router.weight";
    int64_t numel = 1;
    for (int64_t dim : t.shape) numel *= dim;
    header[t.name] = {{"dtype", make_int ? "I32" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + 4 * numel}}};
    const char* bytes = reinterpret_cast<const char*>(t.data);
    data.insert(data.end(), bytes, bytes + 4 * numel);
  }
  const std::string text = header.dump();
  std::ofstream out(Safetensors(), std::ios::binary | std::ios::trunc);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(uint64_t{text.size()} >> (8 * i)));
  out << text;
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: tensor layers.0.ffn.router.weight: "
                                     "expected dtype F32, F16 or BF16, found I32"));
}

TEST_F(BrokenModelTest, MixedDtypesAreFine) {
  std::vector<TensorToWrite> tensors = Tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].dtype = i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? DType::kF16 : DType::kBF16);
  }
  Rewrite(tensors);
  auto model = LoadModel(dir_);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weights.embedding.dtype(), DType::kF32);  // index 0: F32
  EXPECT_EQ((*model)->weights.embedding.ToF32(), weights_.embedding.ToF32());
}

TEST_F(BrokenModelTest, TruncatedSafetensors) {
  std::filesystem::resize_file(Safetensors(), std::filesystem::file_size(Safetensors()) - 5);
  const std::string message = LoadError();
  EXPECT_THAT(message, HasSubstr("model.safetensors: tensor "));
  EXPECT_THAT(message, HasSubstr("run past the end of the data section"));
}

TEST_F(BrokenModelTest, MissingFiles) {
  std::filesystem::remove(Safetensors());
  auto model = LoadModel(dir_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(), HasSubstr("model.safetensors: not found"));

  std::filesystem::remove(dir_ + "/config.json");
  model = LoadModel(dir_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(), HasSubstr(dir_ + "/config.json: not found"));

  model = LoadModel(dir_ + "/nonexistent");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
}

// A path that cannot be looked at (a directory on the way this user may not
// search; as root, a symbolic link loop) is not a missing file: the message
// says why. Both were "not found" (or "not a model directory").
TEST_F(BrokenModelTest, PathsThatCannotBeLookedAtSayWhy) {
  const std::string config = dir_ + "/config.json";
  std::filesystem::remove(config);
  std::filesystem::create_symlink(config, config);
  auto model = LoadModel(dir_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr(config + ": cannot access: Too many levels of symbolic links"));

  const std::string loop = dir_ + "/loop";
  std::filesystem::create_symlink(loop, loop);
  model = LoadModel(loop);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr(loop + ": cannot access: Too many levels of symbolic links"));
}

TEST_F(BrokenModelTest, BadConfigNamesTheFile) {
  std::ofstream(dir_ + "/config.json", std::ios::trunc) << "{\"format_version\": 1,";
  EXPECT_THAT(LoadError(), HasSubstr("config.json: invalid JSON at byte"));
  Json json = BaseConfig();
  json["attention"]["top_k"] = 7;
  std::ofstream(dir_ + "/config.json", std::ios::trunc) << json.dump();
  EXPECT_THAT(LoadError(), HasSubstr("config.json: attention.top_k: expected an integer in [1, 4] "
                                     "(attention.n_experts), found 7"));
}

TEST_F(BrokenModelTest, ConfigWithANulByteOrOverAMebibyteIsRefused) {
  const std::string config = dir_ + "/config.json";
  const std::string valid = BaseConfig().dump();
  std::ofstream(config, std::ios::trunc | std::ios::binary)
      << valid << std::string(1, '\0') << "not json {{{";
  EXPECT_THAT(LoadError(), HasSubstr("config.json: invalid JSON at byte " +
                                     std::to_string(valid.size()) + ": a NUL byte"));
  // A valid document padded past 1 MiB with spaces: refused by its size,
  // before it is read.
  std::ofstream(config, std::ios::trunc) << valid << std::string((1 << 20) - valid.size() + 1, ' ');
  EXPECT_THAT(LoadError(), HasSubstr("config.json: 1048577 bytes, more than the 1048576"));
}

TEST_F(BrokenModelTest, ConfigThatDisagreesWithTheWeights) {
  Json json = BaseConfig();
  json["d_model"] = 40;
  std::ofstream(dir_ + "/config.json", std::ios::trunc) << json.dump();
  EXPECT_THAT(LoadError(), HasSubstr("tensor embedding.weight: expected shape [260, 40], "
                                     "found [260, 32]"));
}

TEST_F(BrokenModelTest, AbsurdLayerCountIsRefusedEarly) {
  Json json = BaseConfig();
  json["n_layers"] = 2000000000;
  std::ofstream(dir_ + "/config.json", std::ios::trunc) << json.dump();
  EXPECT_THAT(LoadError(), HasSubstr("too few for config.json n_layers 2000000000"));
}

TEST_F(BrokenModelTest, WeightsLargerThanTheHostAreRefusedBeforeReading) {
  Json json = BaseConfig();
  json["vocab_size"] = 2000000000;
  json["d_model"] = 2000000000;
  std::ofstream(dir_ + "/config.json", std::ios::trunc) << json.dump();
  auto model = LoadModel(dir_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(model.status().message(), HasSubstr("more than this host's memory"));
}

TEST_F(BrokenModelTest, NonFiniteWeightsAreRefusedUnlessAllowed) {
  weights_.layers[1].ffn.w1.mutable_f32()[5] = std::numeric_limits<float>::quiet_NaN();
  weights_.final_norm_w.mutable_f32()[0] = -std::numeric_limits<float>::infinity();
  Rewrite(Tensors());
  EXPECT_THAT(LoadError(), HasSubstr("holds non-finite values (element "));
  EXPECT_THAT(LoadError(), HasSubstr("--allow-non-finite-weights"));
  auto model = LoadModel(dir_, ModelLoadOptions{.allow_non_finite_weights = true});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->warnings.size(), 2u);
  EXPECT_THAT((*model)->warnings[0] + (*model)->warnings[1],
              HasSubstr("layers.1.ffn.w1 holds non-finite values (element 5 of"));
  EXPECT_TRUE(std::isnan((*model)->weights.layers[1].ffn.w1.At(5)));
}

// Weights stored as bf16 or f16 are checked as stored, whatever dtype they
// are held in, and naming the tensor.
TEST_F(BrokenModelTest, NonFiniteHalfPrecisionWeightsAreRefused) {
  weights_.layers[1].ffn.w1.mutable_f32()[5] = std::numeric_limits<float>::quiet_NaN();
  for (DType stored : {DType::kBF16, DType::kF16}) {
    std::vector<TensorToWrite> tensors = Tensors();
    for (TensorToWrite& t : tensors) t.dtype = stored;
    Rewrite(tensors);
    for (WeightsDtype held : {WeightsDtype::kAsStored, WeightsDtype::kF32, WeightsDtype::kBF16}) {
      SCOPED_TRACE(std::string(ToString(stored)) + " held as " + std::string(ToString(held)));
      auto model = LoadModel(dir_, ModelLoadOptions{.weights_dtype = held});
      ASSERT_FALSE(model.ok());
      EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(model.status().message(),
                  HasSubstr("tensor layers.1.ffn.w1 holds non-finite values (element 5 of"));
    }
  }
}

// Narrowing to f16 turns finite f32 values beyond 65504 into infinities:
// refused once held, not as stored.
TEST_F(BrokenModelTest, WeightsOverflowingF16AreRefusedWhenHeldAsF16) {
  weights_.layers[0].attn.q.mutable_f32()[2] = 1e6f;
  Rewrite(Tensors());
  ASSERT_TRUE(LoadModel(dir_).ok());
  ASSERT_TRUE(LoadModel(dir_, ModelLoadOptions{.weights_dtype = WeightsDtype::kBF16}).ok());
  auto model = LoadModel(dir_, ModelLoadOptions{.weights_dtype = WeightsDtype::kF16});
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("tensor layers.0.attn.q.weight holds non-finite values (element 2 of"));
  EXPECT_THAT(model.status().message(), HasSubstr("once held as F16"));
}

// A FIFO in place of model.safetensors used to block startup in open(),
// waiting for a writer.
TEST_F(BrokenModelTest, FifoIsRefusedWithoutWaiting) {
  std::filesystem::remove(Safetensors());
  ASSERT_EQ(mkfifo(Safetensors().c_str(), 0600), 0);
  auto loaded = std::async(std::launch::async, [&] { return LoadModel(dir_); });
  if (loaded.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // Let the blocked open() return so the test can end, then fail.
    const int fd = open(Safetensors().c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
    FAIL() << "LoadModel waited on the FIFO";
  }
  const auto model = loaded.get();
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("model.safetensors: not a regular file"));
}

TEST(SentencePieceModelTest, MissingOrOversizedTokenizer) {
  Json json = BaseConfig();
  json["tokenizer"] = "sentencepiece";
  const ModelConfig config = ParseOrDie(json);
  const std::string dir = testing::MakeTempDir("loader_spm");
  ASSERT_TRUE(
      WriteModelDirectory(dir, config, testing::RandomWeights(config, 1), DType::kBF16).ok());
  auto model = LoadModel(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(), HasSubstr(dir + "/tokenizer.model: not found"));

  // The committed tokenizer has 300 pieces: more than this vocab_size of 260.
  CopySentencePieceModel(dir);
  model = LoadModel(dir);
  EXPECT_THAT(model.status().message(),
              HasSubstr("tokenizer.model: SentencePiece vocabulary has 300 pieces, more than "
                        "config.json vocab_size 260"));

  std::ofstream(dir + "/tokenizer.model", std::ios::trunc) << "garbage";
  EXPECT_THAT(LoadModel(dir).status().message(),
              HasSubstr("tokenizer.model: not a valid SentencePiece model"));

  // libsentencepiece aborts on 2 GiB or more: refused by size before it reads
  // (a sparse file: nothing is written).
  std::filesystem::resize_file(dir + "/tokenizer.model", (uintmax_t{1} << 31) + 1);
  EXPECT_THAT(LoadModel(dir).status().message(),
              HasSubstr("tokenizer.model: 2147483649 bytes, more than the 1 GiB a SentencePiece "
                        "model may have"));
  std::filesystem::remove(dir + "/tokenizer.model");
}

TEST(ValidateWeightsTest, ReportsEveryKindOfMismatch) {
  const ModelConfig config = ParseOrDie(BaseConfig());
  const ModelWeights good = testing::RandomWeights(config, 5);
  ASSERT_TRUE(ValidateWeights(config, good).ok());

  ModelWeights w = good;
  w.layers.pop_back();
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("expected 2 layers (n_layers), found 1"));

  w = good;
  w.layers[1].attn.q.Clear();
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("missing tensor layers.1.attn.q.weight (expected shape [32, 32])"));

  w = good;
  w.layers[0].attn.v.mutable_shape() = {16, 8, 32};
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("tensor layers.0.attn.v: expected shape [16, 32, 8], found [16, 8, 32]"));

  w = good;
  w.final_norm_b = Tensor::F32({32}, std::vector<float>(31, 0.0f));
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("tensor final_norm.bias: shape [32] needs 32 values, found 31"));

  w = good;
  w.layers[1].ffn.router_b = Tensor::F32({3}, {0.0f, 0.0f, 0.0f});
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("unexpected tensor layers.1.ffn.router_b (shape [3])"));

  w = good;
  w.layers[0].ffn.router_w = w.layers[0].ffn.router_w.ConvertedTo(DType::kBF16);
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("tensor layers.0.ffn.router.weight: expected F32"));

  w = good;
  w.lm_head = w.embedding;
  EXPECT_THAT(ValidateWeights(config, w).message(), HasSubstr("unexpected tensor lm_head"));

  // XL position keys and the output bias only where the config calls for them.
  w = good;
  w.layers[1].attn.pos_to_pk = w.layers[1].attn.q;
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("unexpected tensor layers.1.attn.pos_to_pk (shape [32, 32])"));
  w = good;
  w.lm_head_bias = Tensor::F32({260}, std::vector<float>(260, 0.0f));
  EXPECT_THAT(ValidateWeights(config, w).message(),
              HasSubstr("unexpected tensor lm_head_bias (shape [260])"));
  Json xl_json = BaseConfig();
  xl_json["attention"]["position"] = "xl";
  xl_json["output_bias"] = true;
  const ModelConfig xl = ParseOrDie(xl_json);
  const ModelWeights xl_good = testing::RandomWeights(xl, 5);
  ASSERT_TRUE(ValidateWeights(xl, xl_good).ok()) << ValidateWeights(xl, xl_good);
  w = xl_good;
  w.layers[0].attn.pos_to_pk.Clear();
  EXPECT_THAT(ValidateWeights(xl, w).message(),
              HasSubstr("missing tensor layers.0.attn.pos_to_pk (expected shape [32, 32])"));
  w = xl_good;
  w.layers[1].attn.pos_to_pk = Tensor::F32({16, 64}, w.layers[1].attn.pos_to_pk.ToF32());
  EXPECT_THAT(ValidateWeights(xl, w).message(),
              HasSubstr("tensor layers.1.attn.pos_to_pk: expected shape [32, 32], found [16, 64]"));
  w = xl_good;
  w.lm_head_bias.Clear();
  EXPECT_THAT(ValidateWeights(xl, w).message(),
              HasSubstr("missing tensor lm_head.bias (expected shape [260])"));

  // WriteModelDirectory refuses invalid weights and non-float dtypes.
  const std::string dir = testing::MakeTempDir("validate_write");
  EXPECT_FALSE(WriteModelDirectory(dir, config, w, DType::kF32).ok());
  EXPECT_FALSE(WriteModelDirectory(dir, config, good, DType::kI32).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
}

}  // namespace
}  // namespace switchserve
