#include "server/commands.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace switchserve {

int RunServeCommand(int argc, char** argv);
int RunHealthCommand(int argc, char** argv);
int RunGenerateCommand(int argc, char** argv);
int RunScoreCommand(int argc, char** argv);

const std::vector<Command>& AllCommands() {
  static const std::vector<Command> commands = {
      {"serve",
       "serve the model over gRPC and HTTP (the default)",
       "switchserve serve [--flags]: serve a model over gRPC (and the OpenAI HTTP API)",
       {"model",
        "device",
        "threads",
        "weights_dtype",
        "kv_cache_dtype",
        "max_model_len",
        "host",
        "port",
        "http_port",
        "http_max_connections",
        "allowed_origins",
        "http_body_buffer_bytes",
        "metrics_port",
        "metrics_host",
        "reflection",
        "no_moe_metrics",
        "kv_cache_bytes",
        "kv_block_size",
        "max_batch_tokens",
        "max_running_requests",
        "max_queue",
        "enable_prefix_caching",
        "scheduling_policy",
        "stream_interval",
        "stream_write_timeout_s",
        "max_stream_buffer_bytes",
        "output_buffer_bytes",
        "max_request_bytes",
        "max_metadata_bytes",
        "capacity_factor",
        "overflow",
        "min_capacity",
        "capacity_scope",
        "capacity_group",
        "drain_timeout_s",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "auth_token_file",
        "allow_non_finite_weights",
        "cpu_weight_copies",
        "cpu_kernels",
        "max_connection_age_s",
        "max_connection_age_grace_s",
        "keepalive_time_s",
        "keepalive_timeout_s",
        "keepalive_min_client_interval_s",
        "served_model_name",
        "log_format",
        "serving_threads_nice",
        "debug_step_delay_ms"},
       RunServeCommand},
      {"generate",
       "generate text from a prompt, offline",
       "switchserve generate [--model DIR] --prompt TEXT [--max-new-tokens N] "
       "[--temperature T --top-k K --top-p P --min-p P --repetition-penalty R "
       "--presence-penalty P --frequency-penalty F --seed S] [dispatch overrides]",
       {"model",
        "device",
        "threads",
        "weights_dtype",
        "kv_cache_dtype",
        "max_model_len",
        "kv_block_size",
        "allow_non_finite_weights",
        "cpu_weight_copies",
        "cpu_kernels",
        "prompt",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "capacity_factor",
        "overflow",
        "min_capacity",
        "capacity_scope",
        "capacity_group"},
       RunGenerateCommand},
      {"score",
       "token count, mean NLL and perplexity of a text; --dump-logits",
       "switchserve score [--model DIR] (--text FILE | --tokens 1,2,3) [--dump-logits OUT.npy] "
       "[dispatch overrides]",
       {"model", "device", "threads", "weights_dtype", "kv_cache_dtype", "max_model_len",
        "kv_block_size", "allow_non_finite_weights", "cpu_weight_copies", "cpu_kernels", "text",
        "tokens", "dump_logits", "capacity_factor", "overflow", "min_capacity", "capacity_scope",
        "capacity_group"},
       RunScoreCommand},
      {"health",
       "ask a server's grpc.health.v1 service; exit 0 iff SERVING",
       "switchserve health --address HOST:PORT [--tls --tls-ca FILE [--tls-cert FILE --tls-key "
       "FILE]]: exit 0 iff the server reports SERVING",
       {"address", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "service",
        "timeout_s"},
       RunHealthCommand},
  };
  return commands;
}

namespace {

// What `flag` holds, for a message about a value it cannot: "not <this>".
std::string ValueKind(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<int>()) return "a 32-bit integer";
  if (flag.IsOfType<int64_t>()) return "a 64-bit integer";
  if (flag.IsOfType<uint64_t>()) return "an unsigned 64-bit integer";
  if (flag.IsOfType<double>()) return "a number";
  if (flag.IsOfType<std::optional<int>>()) return "a 32-bit integer (or empty: the model's)";
  if (flag.IsOfType<std::optional<double>>()) return "a number (or empty: the model's)";
  return "a value of its type";
}

// Whether `flag` can hold `value` (absl's parser exits 1 on one it cannot,
// which `health` gives for a server that answered). The flag keeps its value.
bool Holds(absl::CommandLineFlag& flag, absl::string_view value) {
  if (flag.IsOfType<std::string>()) return true;
  const std::string current = flag.CurrentValue();
  std::string error;
  if (!flag.ParseFrom(value, &error)) return false;
  flag.ParseFrom(current, &error);
  return true;
}

// Flagfiles in flagfiles, deeper than this, are refused: absl reads them
// without end when one includes itself.
constexpr int kMaxFlagfileDepth = 8;

// The arguments of the flagfile `path` as absl reads them (absl/flags/parse.cc,
// ArgsList::ReadFromFlagfile): one a line, its leading whitespace dropped;
// blank lines and those that start with '#' skipped; any other line starts
// with '-' and is not "--". "" when all is well, else the problem. Only a
// regular file is read here: a pipe (`--flagfile=<(...)`, /dev/stdin) can be
// read once, and that read is absl's; its contents go unchecked.
std::string ReadFlagfile(const std::string& path, std::vector<std::string>* args) {
  struct stat status {};
  if (stat(path.c_str(), &status) != 0) return absl::StrCat("cannot read: ", std::strerror(errno));
  if (S_ISDIR(status.st_mode)) return absl::StrCat("cannot read: ", std::strerror(EISDIR));
  if (!S_ISREG(status.st_mode)) return "";
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return absl::StrCat("cannot read: ", std::strerror(errno));
  std::string text;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  const int error = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (error != 0) return absl::StrCat("cannot read: ", std::strerror(error));
  int number = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view stripped = absl::StripLeadingAsciiWhitespace(line);
    if (stripped.empty() || stripped[0] == '#') continue;
    if (stripped[0] != '-' || stripped == "--") {
      return absl::StrCat("line ", number, ": \"", std::string(line),
                          "\" is not a flag (one a line: --name=value)");
    }
    args->emplace_back(stripped);
  }
  return "";
}

// The value of `--name=value` or `--name value` at args[*i] (moving *i past
// a value that follows), if args[*i] is the flag `name`.
std::optional<std::string> ValueOf(absl::string_view name, const std::vector<std::string>& args,
                                   size_t* i) {
  absl::string_view arg = args[*i];
  if (arg.size() < 2 || arg[0] != '-') return std::nullopt;
  arg.remove_prefix(arg[1] == '-' ? 2 : 1);
  if (arg == name) {
    if (*i + 1 >= args.size()) return std::nullopt;
    return args[++*i];
  }
  if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=') {
    return std::string(arg.substr(name.size() + 1));
  }
  return std::nullopt;
}

// The names --undefok lists, on the command line or in the regular
// flagfiles it names (to kMaxFlagfileDepth): absl takes an unknown flag
// named there, wherever it comes, without a word.
void CollectUndefok(const std::vector<std::string>& args, int depth,
                    std::vector<std::string>* names) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") return;
    if (auto listed = ValueOf("undefok", args, &i)) {
      for (absl::string_view name : absl::StrSplit(*listed, ',', absl::SkipEmpty())) {
        names->emplace_back(name);
      }
    } else if (auto files = ValueOf("flagfile", args, &i); files && depth < kMaxFlagfileDepth) {
      for (absl::string_view file : absl::StrSplit(*files, ',', absl::SkipEmpty())) {
        std::vector<std::string> held;
        if (ReadFlagfile(std::string(file), &held).empty()) {
          CollectUndefok(held, depth + 1, names);
        }
      }
    }
  }
}

// What ArgumentsProblem carries through the flagfiles it reads.
struct ArgumentWalk {
  // The flagfiles being read around the arguments (their paths made absolute).
  std::vector<std::filesystem::path> reading;
  std::vector<std::string> undefok;  // CollectUndefok's
};

// The arguments the flagfile `item` holds, read `depth` deep inside
// `walk`'s flagfiles, into *held; "" or the problem. *path: the file's path
// made absolute, as `walk` holds those being read.
std::string FlagfileArguments(const std::string& item, int depth, const ArgumentWalk& walk,
                              std::filesystem::path* path, std::vector<std::string>* held) {
  std::error_code error;
  *path = std::filesystem::weakly_canonical(item, error);
  if (error) *path = item;
  if (std::find(walk.reading.begin(), walk.reading.end(), *path) != walk.reading.end()) {
    return "is read again inside itself (flagfiles that include each other)";
  }
  if (depth >= kMaxFlagfileDepth) {
    return absl::StrCat("flagfiles nested more than ", kMaxFlagfileDepth, " deep");
  }
  return ReadFlagfile(item, held);
}

// The argument --fromenv or --tryfromenv (`name`) takes from the
// environment for the flag `item`, into *held; "" or the problem.
std::string EnvironmentArguments(absl::string_view name, const std::string& item,
                                 std::vector<std::string>* held) {
  if (item == "fromenv" || item == "tryfromenv") return absl::StrCat("cannot name ", item);
  const std::string variable = absl::StrCat("FLAGS_", item);
  if (const char* set = std::getenv(variable.c_str()); set != nullptr) {
    held->push_back(absl::StrCat("--", item, "=", set));
  } else if (name == "fromenv") {
    return absl::StrCat(variable, " is not set");
  }
  return "";
}

// ArgumentProblem for `args` (those after the subcommand name), which came
// from the command line (depth 0) or from a flagfile `depth` deep.
std::string ArgumentsProblem(const Command& command, const std::vector<std::string>& args,
                             int depth, ArgumentWalk* walk) {
  // A name as the user spells it: on the command line with hyphens (main
  // turned them into underscores), in a flagfile as written.
  const auto spelled = [depth](absl::string_view name) {
    return depth > 0 ? std::string(name) : absl::StrReplaceAll(name, {{"_", "-"}});
  };
  const auto listed = [&](absl::string_view name) {
    for (const char* flag : command.flags) {
      if (name == flag) return true;
    }
    return false;
  };
  // absl's own flags, handled by absl::ParseCommandLine for every command.
  static constexpr absl::string_view kAbslFlags[] = {
      "flagfile", "fromenv",   "tryfromenv",  "undefok", "helpfull",       "helpshort",
      "helpon",   "helpmatch", "helppackage", "version", "only_check_args"};
  const int argc = static_cast<int>(args.size());
  std::string last_bool;  // the flag before, when a boolean without "=value"
  for (int i = 0; i < argc; ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      if (i + 1 < argc) return absl::StrCat("unexpected argument \"", args[i + 1], "\"");
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      std::string problem = absl::StrCat("unexpected argument \"", arg, "\"");
      if (!last_bool.empty()) {
        absl::StrAppend(&problem, " (a boolean flag takes its value after \"=\": --",
                        spelled(last_bool), "=", arg, ")");
      }
      return problem;
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    last_bool.clear();
    absl::CommandLineFlag* flag = nullptr;
    if (listed(name)) {
      flag = absl::FindCommandLineFlag(name);
    } else if (name.substr(0, 2) == "no" && listed(name.substr(2))) {
      // --noflag: a boolean's false.
      const absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        if (equals == absl::string_view::npos) continue;
        return absl::StrCat("--", spelled(name), " takes no value (--", spelled(name.substr(2)),
                            "=false)");
      }
    } else if (std::find(std::begin(kAbslFlags), std::end(kAbslFlags), name) !=
               std::end(kAbslFlags)) {
      // absl reports a flagfile or an environment variable it cannot use
      // with its own line and exit code 1: they are checked here, and what
      // they hold as the command line is.
      const absl::CommandLineFlag* own = absl::FindCommandLineFlag(name);
      if (own == nullptr || own->IsOfType<bool>()) continue;
      std::string value;
      if (equals != absl::string_view::npos) {
        value = std::string(arg.substr(equals + 1));
      } else if (++i < argc) {
        value = args[i];
      } else {
        return absl::StrCat("--", name, " needs a value");
      }
      // Only these hold arguments; the others' values are names.
      const bool flagfile = name == "flagfile";
      if (!flagfile && name != "fromenv" && name != "tryfromenv") continue;
      // A comma-separated list (absl's std::vector<std::string> flags).
      const std::vector<std::string> items =
          value.empty() ? std::vector<std::string>() : absl::StrSplit(value, ',');
      for (const std::string& item : items) {
        std::vector<std::string> held;
        std::filesystem::path path;
        std::string problem = flagfile ? FlagfileArguments(item, depth, *walk, &path, &held)
                                       : EnvironmentArguments(name, item, &held);
        if (problem.empty()) {
          if (flagfile) walk->reading.push_back(path);
          problem = ArgumentsProblem(command, held, depth + 1, walk);
          if (flagfile) walk->reading.pop_back();
        }
        if (!problem.empty()) {
          return absl::StrCat("--", name, flagfile ? absl::StrCat(" \"", item, "\"") : "", ": ",
                              problem);
        }
      }
      continue;
    }
    if (flag == nullptr) {
      const absl::string_view positive = name.substr(0, 2) == "no" ? name.substr(2) : name;
      if (std::find(walk->undefok.begin(), walk->undefok.end(), name) != walk->undefok.end() ||
          std::find(walk->undefok.begin(), walk->undefok.end(), positive) != walk->undefok.end()) {
        continue;  // absl drops it
      }
      const bool elsewhere = absl::FindCommandLineFlag(name) != nullptr;
      std::string problem = absl::StrCat(elsewhere ? "" : "unknown flag ", "--", spelled(name),
                                         elsewhere ? " is not a flag of this subcommand" : "",
                                         " (`switchserve ", command.name, " --help` lists them)");
      // The command line's hyphens become underscores (main); absl reads
      // a flagfile's names as they are.
      const std::string underscored = absl::StrReplaceAll(name, {{"-", "_"}});
      if (depth > 0 && underscored != name && listed(underscored)) {
        problem = absl::StrCat("--", name, ": a flagfile spells its flags with underscores (--",
                               underscored, ")");
      }
      // A line of a flagfile written with Windows' line ending.
      const absl::string_view trimmed = absl::StripTrailingAsciiWhitespace(name);
      if (trimmed != name && listed(trimmed)) {
        problem =
            absl::StrCat("--", trimmed, ": whitespace after the name (",
                         absl::CEscape(name.substr(trimmed.size())), "; a Windows line ending?)");
      }
      return problem;
    }
    // "--flag value": the next argument is the value, except after a
    // boolean, which takes none.
    absl::string_view value;
    if (equals != absl::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (flag->IsOfType<bool>()) {
      last_bool = std::string(name);
      continue;
    } else if (++i < argc) {
      value = args[i];
    } else {
      return absl::StrCat("--", spelled(name), " needs a value");
    }
    if (!Holds(*flag, value)) {
      return absl::StrCat("--", spelled(name), ": not ", ValueKind(*flag), ": \"", value, "\"");
    }
  }
  return "";
}

}  // namespace

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) return false;
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-help") == 0) return true;
  }
  return false;
}

std::string ArgumentProblem(const Command& command, int argc, char** argv) {
  const std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  ArgumentWalk walk;
  CollectUndefok(args, 0, &walk.undefok);
  return ArgumentsProblem(command, args, 0, &walk);
}

void PrintCommandHelp(const Command& command, std::FILE* out) {
  std::fprintf(out, "usage: %s\n\nflags:\n", command.usage);
  for (const char* name : command.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const std::string spelled = absl::StrReplaceAll(name, {{"_", "-"}});
    if (flag == nullptr) {  // a listed flag this binary does not define
      std::fprintf(out, "  --%s\n", spelled.c_str());
      continue;
    }
    std::string value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) {
      value = "\"" + value + "\"";
    } else if (value.empty()) {
      value = "unset";
    }
    std::fprintf(out, "  --%s (default: %s)\n      %s\n", spelled.c_str(), value.c_str(),
                 flag->Help().c_str());
  }
}

std::string DefaultModelDirectory() {
  // An installed binary's: share/switchserve/models/default under its prefix
  // (bin/.., as in the container images), where the source tree is absent.
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path installed =
        (exe.parent_path().parent_path() / "share" / "switchserve" / "models" / "default")
            .lexically_normal();
    if (std::filesystem::is_directory(installed, error)) return installed.string();
  }
  return SWITCHSERVE_DEFAULT_MODEL_DIR;
}

}  // namespace switchserve
