#include "engine/model/cgroups.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace switchserve {
namespace {

// `base` + `path` and each ancestor of it up to `base` itself.
std::vector<std::string> WithAncestors(const std::string& base, absl::string_view path) {
  std::vector<std::string> directories;
  std::string relative(path);
  while (!relative.empty() && relative.back() == '/') relative.pop_back();
  // Only absolute paths without "..": anything else is not a cgroup's.
  if (!relative.empty() && (relative.front() != '/' || relative.find("/..") != std::string::npos)) {
    relative.clear();
  }
  while (!relative.empty()) {
    directories.push_back(base + relative);
    relative.erase(relative.rfind('/'));
  }
  directories.push_back(base);
  return directories;
}

}  // namespace

CgroupDirectories CgroupDirectoriesOf(std::string_view proc_self_cgroup, const std::string& root,
                                      std::string_view v1_controller) {
  absl::string_view v2_path, v1_path;
  const absl::string_view text(proc_self_cgroup.data(), proc_self_cgroup.size());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // hierarchy-ID:controller-list:path
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) {
      v2_path = fields[2];
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == absl::string_view(v1_controller.data(), v1_controller.size())) {
        v1_path = fields[2];
      }
    }
  }
  CgroupDirectories directories;
  directories.v2 = WithAncestors(root, v2_path);
  directories.v1 = WithAncestors(root + "/" + std::string(v1_controller), v1_path);
  return directories;
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace switchserve
