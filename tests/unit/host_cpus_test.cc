#include "engine/model/host_cpus.h"

#include <sched.h>

#include "gtest/gtest.h"

namespace switchserve {
namespace {

// A container's `cpu` limit is a quota: cores = quota / period, rounded up.
TEST(HostCpusTest, CgroupQuotasBecomeCores) {
  EXPECT_EQ(CoresOfCpuMax("400000 100000\n"), 4);
  EXPECT_EQ(CoresOfCpuMax("150000 100000"), 2);  // 1.5 CPUs: two threads
  EXPECT_EQ(CoresOfCpuMax("50000 100000"), 1);
  EXPECT_EQ(CoresOfCpuMax("max 100000\n"), 0);  // no quota
  EXPECT_EQ(CoresOfCpuMax(""), 0);              // no such file
  EXPECT_EQ(CoresOfCpuMax("0 100000"), 0);
  EXPECT_EQ(CoresOfCpuMax("garbage"), 0);
  EXPECT_EQ(CoresOfCfsQuota("200000\n", "100000\n"), 2);
  EXPECT_EQ(CoresOfCfsQuota("-1\n", "100000\n"), 0);  // v1: no quota
  EXPECT_EQ(CoresOfCfsQuota("", ""), 0);
}

TEST(HostCpusTest, AtMostTheAffinityMask) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  const HostCpus cpus = AvailableCpus();
  EXPECT_GE(cpus.count, 1);
  EXPECT_LE(cpus.count, CPU_COUNT(&mask));
  if (!cpus.quota_limited) {
    EXPECT_EQ(cpus.count, CPU_COUNT(&mask));
  }
}

}  // namespace
}  // namespace switchserve
