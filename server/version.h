// The release this binary is and the source revision it was built from, for
// `switchserve --version`, the startup log, GetModelInfo, the HTTP API's
// /version and the switchserve_build_info metric.
#ifndef SWITCHSERVE_SERVER_VERSION_H_
#define SWITCHSERVE_SERVER_VERSION_H_

namespace switchserve {

// The release, "MAJOR.MINOR.PATCH": the project version in CMakeLists.txt.
const char* Version();

// The git commit the binary was built from (12 hex digits), with "-dirty"
// when the checkout had uncommitted changes to tracked files; "unknown"
// when it was built outside a git checkout (e.g. from a source archive),
// unless the build's environment named one in SWITCHSERVE_REVISION (the
// container images' build argument).
const char* Revision();

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_VERSION_H_
