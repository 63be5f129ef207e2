// Entry point of the `switchserve` binary: `switchserve [SUBCOMMAND] [FLAGS]`.
// Without a subcommand (or with only flags) it runs `serve`.
#include <cstdio>
#include <cstring>

#include "server/commands.h"

namespace {

// Flags are spelled with dashes on the command line (--max-new-tokens) and
// defined with underscores (max_new_tokens): rewrite each flag name in place,
// up to its '=' (values are left alone). A lone "--" ends the flags.
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

}  // namespace

int main(int argc, char** argv) {
  NormalizeFlagNames(argc, argv);
  const auto& commands = switchserve::AllCommands();
  if (argc >= 2 && (std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf("usage: switchserve [SUBCOMMAND] [--flags]\n\nsubcommands:\n");
    for (const auto& command : commands) std::printf("  %-10s %s\n", command.name, command.summary);
    std::printf("\n`switchserve SUBCOMMAND --help` lists its flags.\n");
    return 0;
  }
  if (argc >= 2 && argv[1][0] != '-') {
    for (const auto& command : commands) {
      if (std::strcmp(argv[1], command.name) == 0) return command.run(argc - 1, argv + 1);
    }
    std::fprintf(stderr, "switchserve: unknown subcommand \"%s\" (try `switchserve help`)\n",
                 argv[1]);
    return 2;
  }
  return commands.front().run(argc, argv);
}
