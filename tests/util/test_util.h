// Helpers shared by the tests.
#ifndef SWITCHSERVE_TESTS_UTIL_TEST_UTIL_H_
#define SWITCHSERVE_TESTS_UTIL_TEST_UTIL_H_

#include <string>

namespace switchserve::testing {

// Absolute path of `relative` inside the source tree (e.g. "tests/golden").
std::string SourcePath(const std::string& relative);

// A fresh empty directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_TEST_UTIL_H_
