// The command-line flags are documented with hyphens (--kv-cache-bytes); absl
// spells them with underscores. Shared by the `switchserve` subcommands and
// the load generator.
#ifndef SWITCHSERVE_SERVER_FLAG_SPELLING_H_
#define SWITCHSERVE_SERVER_FLAG_SPELLING_H_

#include <string>
#include <vector>

namespace switchserve {

// Returns argv with every flag name's hyphens turned into underscores (values
// untouched, nothing after a bare "--"), for absl::ParseCommandLine. The
// strings live in `*storage`.
std::vector<char*> NormalizeFlagSpelling(int argc, char** argv, std::vector<std::string>* storage);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_FLAG_SPELLING_H_
