// The subcommands of the `switchserve` binary. Each takes the arguments after
// the subcommand name (argv[0] is the subcommand) and returns the exit code.
#ifndef SWITCHSERVE_SERVER_COMMANDS_H_
#define SWITCHSERVE_SERVER_COMMANDS_H_

#include <cstdio>
#include <string>
#include <vector>

namespace switchserve {

struct Command {
  const char* name;
  const char* summary;
  const char* usage;  // first line of `switchserve NAME --help`
  // The flags it reads (absl names, with underscores), in the order --help
  // lists them.
  std::vector<const char*> flags;
  int (*run)(int argc, char** argv);
};

// Every subcommand, in the order `switchserve --help` lists them. The first is
// the default when none is named.
const std::vector<Command>& AllCommands();

// True when the arguments (after the subcommand name) ask for help: --help or
// -help before a lone "--".
bool WantsHelp(int argc, char** argv);
// Checks the arguments after the subcommand name (flag names already with
// underscores: NormalizeFlagNames) before absl parses them: every flag is one
// of the command's (or absl's own, such as --flagfile) and nothing else is
// there, and every value is one its flag can hold. absl's flags are
// process-wide, so it would take another subcommand's flag without a word, and
// it drops stray words: with `--allow-non-finite-weights false` the flag was
// on and "false" gone; on a value its flag cannot hold (`--port abc`) it exits
// 1, which `health` means for a server that is not SERVING. What a --flagfile
// or --fromenv holds is checked alike (absl too exited 1 on a flagfile it
// could not read). The message names the argument (with hyphens), and the
// flagfile it came from; "" when all is well.
std::string ArgumentProblem(const Command& command, int argc, char** argv);
// `switchserve NAME --help`: the usage line, then every flag of the command
// as typed on the command line (--max-new-tokens), with its default and help.
void PrintCommandHelp(const Command& command, std::FILE* out);

// The model directory used when --model is not given: the built-in model,
// share/switchserve/models/default under an installed binary's prefix, else
// the source tree's models/default.
std::string DefaultModelDirectory();

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_COMMANDS_H_
