// recall: the command line. Subcommands:
//   serve             a coordinator + one worker on this machine
//   chat              a multi-turn chat against a coordinator
//   sessions          list, show, delete sessions
//   generate          run a model in-process and print generated text
//   calibrate-window  print LazyEviction's window W for a model
//   calibrate         write a model's layer sensitivity profile (EpiCache budgets)
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/calibrate_command.h"
#include "cli/calibrate_layers_command.h"
#include "cli/chat_command.h"
#include "cli/generate_command.h"
#include "cli/serve_command.h"
#include "cli/sessions_command.h"

namespace {

constexpr char kUsage[] = R"(usage: recall <command> [options]

commands:
  serve             a coordinator and one worker on this machine (recall serve --help)
  chat              a multi-turn chat with a coordinator (recall chat --help)
  sessions          list (ls) | show ID [--json] | delete ID (recall sessions --help)
  generate          load a model locally and generate text (recall generate --help)
  calibrate-window  LazyEviction's window W for a model (recall calibrate-window --help)
  calibrate         a model's layer sensitivity profile for --layer-budgets
                    (recall calibrate --help)
  --version         print the version
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 &&
      (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0)) {
    std::cout << "recall " << RECALL_VERSION << "\n";
    return 0;
  }
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "serve") return recall::cli::RunServe(rest);
  if (command == "chat") return recall::cli::RunChat(rest);
  if (command == "sessions") return recall::cli::RunSessions(rest);
  if (command == "generate") return recall::cli::RunGenerate(rest);
  if (command == "calibrate-window") return recall::cli::RunCalibrateWindow(rest);
  if (command == "calibrate") return recall::cli::RunCalibrateLayers(rest);
  std::cerr << "recall: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
