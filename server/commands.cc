#include "server/commands.h"

namespace switchserve {

int RunServeCommand(int argc, char** argv);
int RunHealthCommand(int argc, char** argv);
int RunGenerateCommand(int argc, char** argv);
int RunScoreCommand(int argc, char** argv);

const std::vector<Command>& AllCommands() {
  static const std::vector<Command> commands = {
      {"serve", "serve the model over gRPC (the default)", RunServeCommand},
      {"generate", "generate text from a prompt, offline", RunGenerateCommand},
      {"score", "token count, mean NLL and perplexity of a text; --dump-logits", RunScoreCommand},
      {"health", "ask a server's grpc.health.v1 service; exit 0 iff SERVING", RunHealthCommand},
  };
  return commands;
}

std::string DefaultModelDirectory() { return SWITCHSERVE_DEFAULT_MODEL_DIR; }

}  // namespace switchserve
