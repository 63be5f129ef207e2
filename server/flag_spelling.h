// Command-line flags are documented and typed with hyphens (--max-new-tokens);
// absl defines them with underscores (max_new_tokens).
#ifndef SWITCHSERVE_SERVER_FLAG_SPELLING_H_
#define SWITCHSERVE_SERVER_FLAG_SPELLING_H_

namespace switchserve {

// Rewrites, in place, every flag name's hyphens into underscores, up to its
// '=' (values are untouched); a lone "--" ends the flags. Call before
// absl::ParseCommandLine.
void NormalizeFlagNames(int argc, char** argv);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_FLAG_SPELLING_H_
