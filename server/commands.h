// The subcommands of the `switchserve` binary. Each takes the arguments after
// the subcommand name (argv[0] is the subcommand) and returns the exit code.
#ifndef SWITCHSERVE_SERVER_COMMANDS_H_
#define SWITCHSERVE_SERVER_COMMANDS_H_

#include <string>
#include <vector>

namespace switchserve {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

// Every subcommand, in the order `switchserve --help` lists them. The first is
// the default when none is named.
const std::vector<Command>& AllCommands();

// The model directory used when --model is not given: the built-in model.
std::string DefaultModelDirectory();

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_COMMANDS_H_
