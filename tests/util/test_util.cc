#include "tests/util/test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace switchserve::testing {

std::string SourcePath(const std::string& relative) {
  return std::string(SWITCHSERVE_SOURCE_DIR) + "/" + relative;
}

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base ? base : "/tmp") /
                              ("switchserve_test_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace switchserve::testing
