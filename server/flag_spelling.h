// Command-line flags are documented and typed with hyphens (--max-new-tokens);
// absl defines them with underscores (max_new_tokens).
#ifndef SWITCHSERVE_SERVER_FLAG_SPELLING_H_
#define SWITCHSERVE_SERVER_FLAG_SPELLING_H_

namespace switchserve {

// Rewrites, in place, the hyphens of every argument that names a defined
// flag (up to its '=') into underscores. Values are untouched: the argument
// after a flag that takes one (--prompt -well-known) and any argument that
// names no flag; a lone "--" ends the flags. Call before
// absl::ParseCommandLine, after every flag is defined.
void NormalizeFlagNames(int argc, char** argv);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_FLAG_SPELLING_H_
