// A SentencePiece model served end to end by the real binaries: `switchserve
// serve` (Tokenize, Detokenize, Generate, GenerateStream, GetModelInfo) and `switchserve
// generate`. Both processes link gRPC's libprotobuf, which libsentencepiece's
// bundled protobuf copy must never meet (engine/text/sentencepiece_bridge.h);
// so does this test, which encodes in-process to check the server's ids.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model_loader.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"
#include "tests/util/random_model.h"
#include "tests/util/test_util.h"

namespace switchserve::testing {
namespace {

constexpr char kText[] = "The river runs past the old mill, and the baker opens the shop.";

std::string SpmTokenizerPath() { return SourcePath("tests/data/spm/tokenizer.model"); }

// A small random SwitchAll whose vocabulary is the test tokenizer's 300 pieces
// (bos 1; no eos, so every request runs to its length).
std::string WriteSentencePieceModel() {
  const std::string dir = MakeTempDir("spm_serving_model");
  ModelConfig config = TinySwitchAllConfig();
  config.name = "spm-test";
  config.tokenizer = TokenizerKind::kSentencePiece;
  config.vocab_size = 300;
  config.bos_token_id = 1;
  config.eos_token_id.reset();
  const absl::Status written =
      WriteModelDirectory(dir, config, RandomWeights(config, /*seed=*/300), DType::kF32);
  if (!written.ok()) return "";
  std::filesystem::copy_file(SpmTokenizerPath(), dir + "/tokenizer.model");
  return dir;
}

// What a shell command wrote (stdout and, redirected, stderr) and its exit
// code (-1 unless it exited).
struct CommandResult {
  std::string output;
  int exit_code = -1;
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) result.output += buffer;
  const int status = pclose(pipe);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

class SentencePieceServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(WriteSentencePieceModel());
    ASSERT_FALSE(model_dir_->empty());
    auto started = ServerProcess::Start({"--model", *model_dir_});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
    stub_ = v1::Generation::NewStub(server_->Channel()).release();
    auto tokenizer = LoadSentencePieceTokenizer(SpmTokenizerPath());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete server_;
    delete tokenizer_;
    delete model_dir_;
  }

  static std::string* model_dir_;
  static ServerProcess* server_;
  static v1::Generation::Stub* stub_;
  static Tokenizer* tokenizer_;
};
std::string* SentencePieceServingTest::model_dir_ = nullptr;
ServerProcess* SentencePieceServingTest::server_ = nullptr;
v1::Generation::Stub* SentencePieceServingTest::stub_ = nullptr;
Tokenizer* SentencePieceServingTest::tokenizer_ = nullptr;

TEST_F(SentencePieceServingTest, ModelInfoNamesTheTokenizer) {
  const v1::ModelInfo info = GetInfo(*stub_);
  EXPECT_EQ(info.tokenizer(), "sentencepiece");
  EXPECT_EQ(info.vocab_size(), 300);
}

TEST_F(SentencePieceServingTest, TokenizeGivesTheLibrarysPiecesAndDetokenizeTheText) {
  v1::TokenizeRequest request;
  request.set_text(kText);
  v1::TokenizeResponse response;
  auto context = ContextWithDeadline();
  const grpc::Status status = stub_->Tokenize(context.get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto expected = tokenizer_->Encode(kText);
  ASSERT_TRUE(expected.ok());
  const std::vector<int32_t> ids(response.token_ids().begin(), response.token_ids().end());
  EXPECT_EQ(ids, *expected);
  // Subword pieces, not bytes.
  EXPECT_LT(ids.size(), std::string(kText).size() / 2);
  EXPECT_EQ(tokenizer_->Decode(ids), kText);

  // Detokenize gives the text back, the first piece's leading space dropped
  // as the library's Decode drops it.
  v1::DetokenizeRequest back;
  back.mutable_token_ids()->Add(ids.begin(), ids.end());
  v1::DetokenizeResponse text;
  auto back_context = ContextWithDeadline();
  const grpc::Status decoded = stub_->Detokenize(back_context.get(), back, &text);
  ASSERT_TRUE(decoded.ok()) << decoded.error_message();
  EXPECT_EQ(text.text(), kText);
}

TEST_F(SentencePieceServingTest, GenerateAndStreamDecodeThePieces) {
  v1::GenerateRequest request = TextRequest(kText, 24, 0.8f);
  request.mutable_sampling()->set_seed(7);
  v1::GenerateResponse unary;
  auto context = ContextWithDeadline();
  const grpc::Status status = stub_->Generate(context.get(), request, &unary);
  ASSERT_TRUE(status.ok()) << status.error_message();
  // The prompt is the text's pieces (the API adds no BOS to a text prompt).
  EXPECT_EQ(unary.usage().prompt_tokens(), tokenizer_->Encode(kText)->size());
  ASSERT_EQ(unary.token_ids_size(), 24);
  EXPECT_EQ(unary.finish_reason(), v1::FINISH_REASON_LENGTH);
  const std::vector<int32_t> ids(unary.token_ids().begin(), unary.token_ids().end());
  // The text the generated pieces add to the prompt's, leading space and all.
  const std::vector<int32_t> prompt = *tokenizer_->Encode(kText);
  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), ids.begin(), ids.end());
  EXPECT_EQ(tokenizer_->Decode(prompt) + unary.text(), tokenizer_->Decode(whole));

  auto stream_context = ContextWithDeadline();
  const StreamResult stream = ReadStream(*stub_, request, stream_context.get());
  ASSERT_TRUE(stream.status.ok()) << stream.status.error_message();
  EXPECT_EQ(stream.token_ids, ids);
  EXPECT_EQ(stream.text, unary.text());
}

TEST_F(SentencePieceServingTest, GenerateSubcommandRuns) {
  const std::string command = std::string(SWITCHSERVE_BINARY) + " generate --model " + *model_dir_ +
                              " --prompt 'the river' --max-new-tokens 8 --seed 3" +
                              " --threads 1 2>&1";
  const CommandResult result = RunCommand(command);
  const std::string& output = result.output;
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_EQ(output.rfind("the river", 0), 0u) << output;
}

// `score`'s bits per byte divide by the file's bytes, not by those of the
// decoded pieces: SentencePiece normalises whitespace (runs of spaces) and
// decodes a character its vocabulary lacks (a newline) as " ⁇ ", so a
// decode of the ids is not the text it came from.
TEST_F(SentencePieceServingTest, ScoreBitsPerByteCountTheFilesBytes) {
  const std::string text = "the  river\n\nruns   past the mill.  \n";
  ASSERT_NE(tokenizer_->Decode(*tokenizer_->Encode(text)).size(), text.size());
  const std::string path = MakeTempDir("spm_score") + "/text.txt";
  {
    std::FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(std::fwrite(text.data(), 1, text.size(), file), text.size());
    ASSERT_EQ(std::fclose(file), 0);
  }
  const std::string command = std::string(SWITCHSERVE_BINARY) + " score --model " + *model_dir_ +
                              " --text " + path + " --threads 1 2>&1";
  const CommandResult result = RunCommand(command);
  const std::string& output = result.output;
  ASSERT_EQ(result.exit_code, 0) << output;
  long long predicted = 0;
  double mean_nll = 0, bits_per_byte = 0;
  const size_t at_predicted = output.find("predicted: ");
  const size_t at_nll = output.find("mean_nll: ");
  const size_t at_bpb = output.find("bits_per_byte: ");
  ASSERT_NE(at_predicted, std::string::npos) << output;
  ASSERT_NE(at_nll, std::string::npos) << output;
  ASSERT_NE(at_bpb, std::string::npos) << output;
  ASSERT_EQ(std::sscanf(output.c_str() + at_predicted, "predicted: %lld", &predicted), 1);
  ASSERT_EQ(std::sscanf(output.c_str() + at_nll, "mean_nll: %lf", &mean_nll), 1);
  ASSERT_EQ(std::sscanf(output.c_str() + at_bpb, "bits_per_byte: %lf", &bits_per_byte), 1);
  // The model has a BOS, so every byte of the file is predicted.
  EXPECT_EQ(predicted, static_cast<long long>(tokenizer_->Encode(text)->size()));
  const double expected = mean_nll * predicted / std::log(2.0) / static_cast<double>(text.size());
  EXPECT_NEAR(bits_per_byte, expected, 1e-5 * expected) << output;
}

}  // namespace
}  // namespace switchserve::testing
