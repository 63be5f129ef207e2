// Entry point of the `switchserve` binary: `switchserve [SUBCOMMAND] [FLAGS]`.
// Without a subcommand (or with only flags) it runs `serve`.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "absl/flags/usage.h"
#include "kernels/backends.h"
#include "server/commands.h"
#include "server/flag_spelling.h"
#include "server/mutex_checks.h"
#include "server/version.h"

namespace {

// SIGTERM, SIGINT and SIGHUP: `serve` drains on them (serve_command.cc).
sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  return signals;
}

// Blocks the stop signals before any library's initialiser runs (an
// executable's preinit functions come first). Libraries start threads as
// they load (OpenBLAS's), and until `serve` blocked the signals itself, one
// that came in the process's first ~80 ms took its default action and
// ended it. Blocked from here, it waits for `serve`'s sigwait, which drains
// once the server is up; the other subcommands get back the mask the process
// was started with (main), a signal its parent blocked still blocked.
sigset_t g_started_mask;

void BlockStopSignals(int /*argc*/, char** /*argv*/, char** /*envp*/) {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, &g_started_mask);
}

[[gnu::section(".preinit_array"),
  gnu::used]] void (*const kBlockStopSignals)(int, char**, char**) = BlockStopSignals;

}  // namespace

int main(int argc, char** argv) {
  char** const program_argv = argv;
  switchserve::DisableMutexDeadlockDetection();
  switchserve::NormalizeFlagNames(argc, argv);
  const auto& commands = switchserve::AllCommands();
  if (argc >= 2 && (std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf("usage: switchserve [SUBCOMMAND] [--flags]\n\nsubcommands:\n");
    for (const auto& command : commands) std::printf("  %-10s %s\n", command.name, command.summary);
    std::printf(
        "\n`switchserve SUBCOMMAND --help` lists its flags; `switchserve --version` prints "
        "the release, the source revision and the backends built.\n");
    return 0;
  }
  if (argc >= 2 &&
      (std::strcmp(argv[1], "version") == 0 || std::strcmp(argv[1], "--version") == 0)) {
    std::printf("switchserve %s (revision %s)\nbackends:", switchserve::Version(),
                switchserve::Revision());
    const char* separator = " ";
    for (const switchserve::DeviceKind device : switchserve::BuiltDevices()) {
      std::printf("%s%s", separator, switchserve::BuiltDeviceName(device).c_str());
      separator = ", ";
    }
    std::printf("\n");
    return 0;
  }
  const switchserve::Command* command = &commands.front();
  if (argc >= 2 && argv[1][0] != '-') {
    command = nullptr;
    for (const auto& candidate : commands) {
      if (std::strcmp(argv[1], candidate.name) == 0) command = &candidate;
    }
    if (command == nullptr) {
      std::fprintf(stderr, "switchserve: unknown subcommand \"%s\" (try `switchserve help`)\n",
                   argv[1]);
      return 2;
    }
    --argc;
    ++argv;
  }
  const bool serve = std::strcmp(command->name, "serve") == 0;
  if (!serve) pthread_sigmask(SIG_SETMASK, &g_started_mask, nullptr);
  if (switchserve::WantsHelp(argc, argv)) {
    switchserve::PrintCommandHelp(*command, stdout);
    return 0;
  }
  if (const std::string problem = switchserve::ArgumentProblem(*command, argc, argv);
      !problem.empty()) {
    std::fprintf(stderr, "switchserve %s: %s\n", command->name, problem.c_str());
    return 2;
  }
  if (serve) {
    // A server is started again without OpenBLAS's threads (blas_threads.h).
    // The stop signals stay blocked through the exec: the new image drains
    // on one that comes meanwhile, as this one would.
    switchserve::cpu::RestartWithoutBlasThreads(program_argv);
  }
  absl::SetProgramUsageMessage(command->usage);
  // Sizes are checked before anything is allocated (engine/model/host_memory.h);
  // should an allocation still fail on this thread, report it and exit
  // instead of std::terminate's abort.
  try {
    return command->run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "switchserve %s: out of memory\n", command->name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "switchserve %s: %s\n", command->name, e.what());
  }
  return 1;
}
