// Entry point of the `switchserve` binary: `switchserve [SUBCOMMAND] [FLAGS]`.
// Without a subcommand (or with only flags) it runs `serve`.
#include <cstdio>
#include <cstring>

#include "server/commands.h"
#include "server/flag_spelling.h"

int main(int argc, char** argv) {
  switchserve::NormalizeFlagNames(argc, argv);
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
