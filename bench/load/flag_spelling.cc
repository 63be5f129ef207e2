#include "bench/load/flag_spelling.h"

#include <algorithm>

namespace switchserve {

std::vector<char*> NormalizeFlagSpelling(int argc, char** argv, std::vector<std::string>* storage) {
  storage->assign(argv, argv + argc);
  bool flags_done = false;
  for (size_t i = 1; i < storage->size(); ++i) {
    std::string& arg = (*storage)[i];
    if (flags_done || arg.size() < 3 || arg[0] != '-') continue;
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    const size_t name_begin = arg[1] == '-' ? 2 : 1;
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t j = name_begin; j < name_end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  std::vector<char*> out;
  for (std::string& arg : *storage) out.push_back(arg.data());
  return out;
}

}  // namespace switchserve
