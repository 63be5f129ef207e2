// The load generator's flags are documented with hyphens (--max-new-tokens);
// absl spells them with underscores.
#ifndef SWITCHSERVE_BENCH_LOAD_FLAG_SPELLING_H_
#define SWITCHSERVE_BENCH_LOAD_FLAG_SPELLING_H_

#include <string>
#include <vector>

namespace switchserve {

// Returns argv with every flag name's hyphens turned into underscores (values
// untouched, nothing after a bare "--"), for absl::ParseCommandLine. The
// strings live in `*storage`.
std::vector<char*> NormalizeFlagSpelling(int argc, char** argv, std::vector<std::string>* storage);

}  // namespace switchserve

#endif  // SWITCHSERVE_BENCH_LOAD_FLAG_SPELLING_H_
