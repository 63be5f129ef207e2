// The cgroup limits of the process's own cgroup and its ancestors, read from
// a made-up cgroup mount: a systemd service's MemoryMax= or a nested cgroup
// v1 group (only the hierarchy's root files were read before, so such limits
// were missed).
#include "engine/model/cgroups.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "engine/model/host_cpus.h"
#include "engine/model/host_memory.h"
#include "gtest/gtest.h"

namespace switchserve {
namespace {

namespace fs = std::filesystem;

class CgroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        (fs::temp_directory_path() / ("switchserve_cgroups_" + std::to_string(getpid()))).string();
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    const fs::path path = fs::path(root_) / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::string root_;
};

TEST_F(CgroupsTest, DirectoriesAreTheProcesssCgroupItsAncestorsAndTheRoot) {
  const CgroupDirectories d =
      CgroupDirectoriesOf("4:cpu,cpuacct:/x/y/\n1:memory:/m\n0::/a/b\n", "/r", "cpu");
  EXPECT_EQ(d.v2, (std::vector<std::string>{"/r/a/b", "/r/a", "/r"}));
  EXPECT_EQ(d.v1, (std::vector<std::string>{"/r/cpu/x/y", "/r/cpu/x", "/r/cpu"}));
  // A namespaced container, no such file, a path that climbs: the roots only.
  for (const char* text : {"0::/\n4:cpu:/\n", "", "0::/../etc\n4:cpu:relative\n"}) {
    const CgroupDirectories roots = CgroupDirectoriesOf(text, "/r", "cpu");
    EXPECT_EQ(roots.v2, std::vector<std::string>{"/r"}) << text;
    EXPECT_EQ(roots.v1, std::vector<std::string>{"/r/cpu"}) << text;
  }
}

TEST_F(CgroupsTest, TheSmallestMemoryLimitOnThePathApplies) {
  Write("memory.max", "max\n");
  Write("system.slice/memory.max", "8589934592\n");
  Write("system.slice/switchserve.service/memory.max", "1048576\n");
  EXPECT_EQ(CgroupMemoryLimit("0::/system.slice/switchserve.service\n", root_), 1048576);
  EXPECT_EQ(CgroupMemoryLimit("0::/system.slice\n", root_), 8589934592);
  EXPECT_EQ(CgroupMemoryLimit("0::/\n", root_), std::numeric_limits<int64_t>::max());
  // cgroup v1: "unlimited" is a huge number; the process's group holds 2 MiB.
  Write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("memory/process_api/7f/memory.limit_in_bytes", "2097152\n");
  EXPECT_EQ(CgroupMemoryLimit("4:memory:/process_api/7f\n0::/\n", root_), 2097152);
}

TEST_F(CgroupsTest, TheFewestCoresOnThePathApply) {
  Write("cpu.max", "max 100000\n");
  Write("kubepods/cpu.max", "400000 100000\n");
  Write("kubepods/pod1/cpu.max", "150000 100000\n");
  EXPECT_EQ(CgroupCpuCores("0::/kubepods/pod1\n", root_), 2);
  EXPECT_EQ(CgroupCpuCores("0::/kubepods\n", root_), 4);
  EXPECT_EQ(CgroupCpuCores("0::/\n", root_), 0);
  Write("cpu/batch/cpu.cfs_quota_us", "300000\n");
  Write("cpu/batch/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuCores("3:cpu,cpuacct:/batch\n0::/\n", root_), 3);
}

}  // namespace
}  // namespace switchserve
