// The cgroup directories whose limits apply to this process. Limits are
// hierarchical (the smallest of a cgroup's and its ancestors' applies), and
// /proc/self/cgroup names the process's own cgroup: a container with its own
// cgroup namespace sees "/" (the hierarchy's root, where its limits are), a
// systemd service with MemoryMax= or a process in a nested cgroup v1 group
// sees its path below the root, whose files hold its limits.
#ifndef SWITCHSERVE_ENGINE_MODEL_CGROUPS_H_
#define SWITCHSERVE_ENGINE_MODEL_CGROUPS_H_

#include <string>
#include <string_view>
#include <vector>

namespace switchserve {

struct CgroupDirectories {
  std::vector<std::string> v2;  // "<root>/<path>", its ancestors, "<root>"
  std::vector<std::string> v1;  // the same under "<root>/<v1_controller>"
};

// From the text of /proc/self/cgroup ("0::/a/b", "4:memory:/x"), the
// directories under `root` (the cgroup mount, /sys/fs/cgroup) of the
// process's cgroup and its ancestors: in the unified (v2) hierarchy, and in
// the v1 hierarchy of `v1_controller` ("memory", "cpu"). The roots are always
// there, whatever the text.
CgroupDirectories CgroupDirectoriesOf(std::string_view proc_self_cgroup, const std::string& root,
                                      std::string_view v1_controller);

// The text of the file at `path`; empty when it cannot be read.
std::string ReadSmallFile(const std::string& path);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_CGROUPS_H_
