#include "server/flag_spelling.h"

#include <cstring>

namespace switchserve {

void NormalizeFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) return;
    if (arg[0] != '-') continue;
    for (char* c = arg + (arg[1] == '-' ? 2 : 1); *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

}  // namespace switchserve
