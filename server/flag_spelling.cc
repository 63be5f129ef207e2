#include "server/flag_spelling.h"

#include <cstring>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"

namespace switchserve {
namespace {

// The flag `spelled` (underscores) names, with "no" before a boolean's name
// for false; null for no flag.
const absl::CommandLineFlag* FlagNamed(const std::string& spelled, bool* negated) {
  *negated = false;
  if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(spelled)) return flag;
  if (spelled.rfind("no", 0) == 0) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(spelled.substr(2));
    if (flag != nullptr && flag->IsOfType<bool>()) {
      *negated = true;
      return flag;
    }
  }
  return nullptr;
}

}  // namespace

void NormalizeFlagNames(int argc, char** argv) {
  bool value_next = false;  // the argument before was a flag taking this one
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (value_next) {
      value_next = false;
      continue;
    }
    if (std::strcmp(arg, "--") == 0) return;
    if (arg[0] != '-' || arg[1] == '\0') continue;
    char* name = arg + (arg[1] == '-' ? 2 : 1);
    char* end = name;
    while (*end != '\0' && *end != '=') ++end;
    std::string spelled(name, end);
    for (char& c : spelled) c = c == '-' ? '_' : c;
    bool negated = false;
    const absl::CommandLineFlag* flag = FlagNamed(spelled, &negated);
    // Not a flag: a value that starts with '-' (--prompt -x), or a name absl
    // reports as unknown, as typed.
    if (flag == nullptr) continue;
    std::memcpy(name, spelled.data(), spelled.size());
    value_next = *end == '\0' && !negated && !flag->IsOfType<bool>();
  }
}

}  // namespace switchserve
