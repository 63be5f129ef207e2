#include "server/commands.h"

namespace switchserve {

int RunGenerateCommand(int argc, char** argv);
int RunScoreCommand(int argc, char** argv);

const std::vector<Command>& AllCommands() {
  static const std::vector<Command> commands = {
      {"generate", "generate text from a prompt, offline", RunGenerateCommand},
      {"score", "token count, mean NLL and perplexity of a text; --dump-logits", RunScoreCommand},
  };
  return commands;
}

std::string DefaultModelDirectory() { return SWITCHSERVE_DEFAULT_MODEL_DIR; }

}  // namespace switchserve
