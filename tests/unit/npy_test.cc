// The .npy writer behind `score --dump-logits`: a readable array, and never a
// truncated one left at the path when a write fails.
#include "engine/model/npy.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace switchserve {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// In a child process: 60 x 256 floats to `path` with files limited to 4 KiB;
// 3 when the writer reports the failure.
int WriteUnderASmallFileLimit(const fs::path& path) {
  signal(SIGXFSZ, SIG_IGN);
  const rlimit small = {4096, 4096};
  setrlimit(RLIMIT_FSIZE, &small);
  const std::vector<float> big(60 * 256, 1.0f);
  return WriteNpyF32(path.string(), {60, 256}, big).ok() ? 0 : 3;
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("switchserve_npy_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(NpyTest, WritesAVersionOneHeaderAndTheFloats) {
  const fs::path path = dir_ / "a.npy";
  ASSERT_TRUE(WriteNpyF32(path.string(), {2, 3}, {1, 2, 3, 4, 5, 6}).ok());
  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  const size_t header = static_cast<unsigned char>(bytes[8]) |
                        (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  EXPECT_EQ((10 + header) % 64, 0u);
  EXPECT_NE(bytes.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + header + 6 * sizeof(float));
  EXPECT_FALSE(WriteNpyF32(path.string(), {2, 2}, {1, 2, 3}).ok());  // shape and data disagree
  EXPECT_FALSE(fs::exists(dir_ / "a.npy.partial"));
}

// A write that fails (here at the file-size limit) leaves the file that was
// at the path as it was, and nothing beside it; the writer truncated the path
// at once and left a partial array there.
TEST_F(NpyTest, AFailedWriteLeavesThePathAsItWas) {
  const fs::path path = dir_ / "logits.npy";
  ASSERT_TRUE(WriteNpyF32(path.string(), {1, 2}, {7, 8}).ok());
  const std::string before = ReadAll(path);
  EXPECT_EXIT(std::_Exit(WriteUnderASmallFileLimit(path)), ::testing::ExitedWithCode(3), "");
  EXPECT_EQ(ReadAll(path), before);
  EXPECT_FALSE(fs::exists(dir_ / "logits.npy.partial"));
}

}  // namespace
}  // namespace switchserve
